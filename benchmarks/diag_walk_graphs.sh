python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda.py -k "walk_graph" 2>&1 | grep -E "^E |passed|failed" | cut -c1-3000 | head -20
