"""Every example runs at its CI size (``--small``) in a fresh interpreter and shows what it
claims. The examples check themselves and exit non-zero on a mismatch; these
tests also read the figures they print."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, *args: str, timeout: int = 240, device: str = "cpu") -> str:
    # One thread: these are many tiny ops, where OpenMP threads only add overhead (and on
    # a loaded 2-core machine make a run many times slower).
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), "--small", "--device", device, *args],
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc.stdout


def run_aoti_example(device: str) -> str:
    """export_aoti.py on ``device``; xfails (naming why) only when its fresh-process load
    dies by a signal and a plain control package dies too (a toolchain defect)."""
    try:
        return run_example("export_aoti.py", device=device, timeout=400)
    except AssertionError as e:
        from sdm_inductor.testing import aoti_runtime_failure
        if "died with <Signals." in str(e) and aoti_runtime_failure(device):
            pytest.xfail(aoti_runtime_failure(device))
        raise


def number(pattern: str, text: str) -> float:
    m = re.search(pattern, text)
    assert m, f"no match for {pattern!r} in:\n{text}"
    return float(m.group(1))


def test_quickstart():
    out = run_example("quickstart.py")
    assert "OK: the op matches the token loop" in out
    assert number(r"readings rel err ([\d.e+-]+)", out) < 1e-5
    assert number(r"\|d loss/d bank\| = ([\d.e+-]+)", out) > 0


def test_decode():
    out = run_example("decode.py")
    assert "same greedy tokens: True" in out
    assert number(r"logits rel err ([\d.e+-]+)", out) < 1e-5


def test_train_recall_learns():
    check_learned(run_example("train_recall.py"))


def check_learned(out: str) -> None:
    first = number(r"loss: first step ([\d.]+)", out)
    final = number(r"-> held-out ([\d.]+)", out)
    acc = number(r"recall accuracy \(held-out[^)]*\): ([\d.]+)", out)
    chance = number(r"\(chance ([\d.]+)\)", out)
    assert final < 0.5 * first, (first, final)
    assert acc > 8 * chance, (acc, chance)


@pytest.mark.compile
def test_compile_rewrite():
    out = run_example("compile_rewrite.py")
    assert re.search(r"1 chain\(s\) rewritten, 0 candidate\(s\) left alone", out), out
    assert "OK: the compiled, rewritten step equals the eager token loop" in out


@pytest.mark.compile
def test_export_aoti():
    out = run_aoti_example("cpu")
    lengths = re.findall(r"T=\s*(\d+): output \[2, (\d+), 32\], (.*)", out)
    assert len(lengths) == 3, out
    for t, t_out, rest in lengths:
        assert t == t_out, (t, t_out)
        if "slot choices differ" not in rest:   # a near tie: the example judged it
            assert float(number(r"rel err vs eager ([\d.e+-]+)", rest)) < 1e-5, (t, rest)
    assert "OK: the AOTInductor package reloaded" in out


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name,expect", [
    ("quickstart.py", "OK: the op matches the token loop"),
    ("decode.py", "OK: decoding with the cache equals the full forward"),
    ("train_recall.py", "recall accuracy"),
    ("compile_rewrite.py", "OK: the compiled, rewritten step equals the eager token loop"),
    ("export_aoti.py", "OK: the AOTInductor package reloaded"),
])
def test_examples_on_cuda(name, expect):
    out = (run_aoti_example("cuda") if name == "export_aoti.py"
           else run_example(name, device="cuda", timeout=400))
    assert expect in out
    if name != "export_aoti.py":
        assert "device cuda" in out
    if name == "train_recall.py":
        check_learned(out)
