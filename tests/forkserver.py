"""A warm interpreter for the suite's background scripts (``tests/conftest.py``).

    python tests/forkserver.py MODULE...

imports the modules, then reads one request a line on stdin (JSON: ``argv`` = the script
and its arguments, ``out`` = a path prefix) and answers each by forking a child that runs
the script as ``__main__`` with its output in ``<out>.stdout`` / ``<out>.stderr``. The
child's pid goes to ``<out>.pid`` when it starts and its return code (negative: the
signal, as ``subprocess`` reports it) to ``<out>.rc`` when it ends. Every child starts
from the same imported state, and none pays the imports (torch, Triton, sdm_inductor:
~5 s a process on the CI machine). End of input: the server waits for its children.
"""
from __future__ import annotations

import importlib
import json
import os
import runpy
import select
import sys
import traceback


def _child(argv: list[str], out: str) -> None:
    for fd, suffix in ((1, "stdout"), (2, "stderr")):
        f = os.open(f"{out}.{suffix}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.stdin = open(os.devnull)
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))   # as `python script` sets it
    code = 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:   # noqa: BLE001 - reported as the script's failure
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _write(path: str, text: str) -> None:
    """Write then rename: a reader never sees a partial file."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def main() -> None:
    for name in sys.argv[1:]:
        importlib.import_module(name)
    children: dict[int, str] = {}

    def reap(block: bool) -> None:
        while children:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
            _write(children.pop(pid) + ".rc", str(code))

    stdin = sys.stdin.fileno()
    buf = b""
    while True:
        ready, _, _ = select.select([stdin], [], [], 0.05)
        reap(False)
        if not ready:
            continue
        chunk = os.read(stdin, 65536)
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            req = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(req["argv"], req["out"])
            children[pid] = req["out"]
            _write(req["out"] + ".pid", str(pid))
    reap(True)


if __name__ == "__main__":
    main()
