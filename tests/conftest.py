"""Session plumbing of the suite (CI runs it on a fresh 2-core machine).

* One Inductor / FX / AOTAutograd cache for the run, in a fresh temporary folder
  (``TORCHINDUCTOR_CACHE_DIR``, unless set): the run starts as cold as a fresh machine,
  and a later compile of code already compiled in the run (the same C++ kernel, the same
  graph) reuses it; subprocesses inherit it. Tests whose point is a cold build make their
  own fresh cache (``torch._inductor.utils.fresh_cache``).

* Subprocess checks (``@pytest.mark.background(job=job)``: the kernels under
  ``TRITON_INTERPRET=1``, the examples, ...) start when the session does and run on one
  core beside the rest of the suite; their tests run last, each waiting for its own
  subprocess's result (``background`` fixture) and, while it waits, running the queued
  ones itself (so both cores work at the end). ``job(item)`` gives the subprocess of one
  test: ``dict(argv=[...], env={...}, timeout=s, cost=s)``, ``cost`` a rough run time that
  orders the queue (longest first, so that the last ones to finish are short); the result
  is its
  ``subprocess.CompletedProcess`` (text output). ``SDM_TEST_BACKGROUND=0`` runs each one in
  its test instead. A job with ``warm=True`` (``argv``: the interpreter, a script, its
  arguments) runs as a fork of a warm interpreter that imported ``WARM_MODULES`` once
  under the job's environment (``tests/forkserver.py``): the kernel tests' ~30 scripts
  then skip ~5 s of imports each.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "background(job=job): the test's subprocess (job(item) -> dict(argv, env, "
        "timeout)) runs beside the suite; the test takes its result from the background fixture")
    if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        folder = tempfile.mkdtemp(prefix="sdm-tests-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


def _job_of(item):
    marker = item.get_closest_marker("background")
    return marker.kwargs["job"](item) if marker is not None else None


@pytest.hookimpl(trylast=True)   # after -k / -m deselection
def pytest_collection_modifyitems(session, config, items):
    """The background tests last (in their order): the rest of the suite runs meanwhile."""
    if os.environ.get("SDM_TEST_BACKGROUND", "1") == "0":
        return
    front = [i for i in items if i.get_closest_marker("background") is None]
    items[:] = front + [i for i in items if i.get_closest_marker("background") is not None]


class _Server:
    """A ``tests/forkserver.py`` process: ``modules`` imported once under ``env``, then one
    forked child per script."""

    def __init__(self, env, modules):
        self.folder = tempfile.mkdtemp(prefix="sdm-tests-forks-")
        self.err = open(os.path.join(self.folder, "server.log"), "w+")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                          "forkserver.py"), *modules],
            env=env, stdin=subprocess.PIPE, stdout=self.err, stderr=self.err)
        self.lock = threading.Lock()
        self.count = 0

    def submit(self, argv) -> str:
        """Start ``argv`` (a script and its arguments) in a child; its files' prefix."""
        with self.lock:
            self.count += 1
            out = os.path.join(self.folder, str(self.count))
            self.proc.stdin.write((json.dumps(dict(argv=argv, out=out)) + "\n").encode())
            self.proc.stdin.flush()
        return out

    def ended(self) -> str | None:
        """The server's log if it has exited (it never should before the session ends)."""
        if self.proc.poll() is None:
            return None
        self.err.seek(0)
        return f"rc {self.proc.returncode}:\n{self.err.read()[-4000:]}"

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        self.err.close()
        shutil.rmtree(self.folder, ignore_errors=True)


# what a warm job's interpreter imports before it forks (torch and Triton come with them)
WARM_MODULES = ("sdm_inductor.kernels", "sdm_inductor.testing")
_SERVERS: dict = {}
_SERVERS_LOCK = threading.Lock()


def _server(env) -> _Server:
    """The warm interpreter of ``env`` (one per environment: its imports read it)."""
    key = tuple(sorted((env or os.environ).items()))
    with _SERVERS_LOCK:
        if key not in _SERVERS:
            _SERVERS[key] = _Server(env, WARM_MODULES)
        return _SERVERS[key]


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


class _Job:
    def __init__(self, argv, env=None, timeout=900, cost=0.0, warm=False):
        self.argv, self.env, self.timeout, self.cost = argv, env, timeout, cost
        self.warm = warm
        self.started = False
        self.done = threading.Event()
        self.proc = self.pid = self.result = self.error = None
        self.seconds = None

    def run(self):
        start = time.monotonic()
        try:
            self.result = self._forked() if self.warm else self._spawned()
        except BaseException as e:   # noqa: BLE001 - raised again in the test
            self.error = e
        finally:
            self.seconds = time.monotonic() - start
            self.done.set()

    def _spawned(self):
        with subprocess.Popen(self.argv, env=self.env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) as self.proc:
            try:
                out, err = self.proc.communicate(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                out, err = self.proc.communicate()
                raise subprocess.TimeoutExpired(self.argv, self.timeout, out, err) from None
        return subprocess.CompletedProcess(self.argv, self.proc.returncode, out, err)

    def _forked(self):
        server = _server(self.env)
        out = server.submit(self.argv[1:])
        deadline = time.monotonic() + self.timeout
        while not os.path.exists(out + ".rc"):
            if self.pid is None and os.path.exists(out + ".pid"):
                self.pid = int(_read(out + ".pid"))
            if (log := server.ended()) is not None and not os.path.exists(out + ".rc"):
                raise RuntimeError(f"the fork server of {self.argv[1:]} ended, {log}")
            if time.monotonic() > deadline:
                self.kill()
                raise subprocess.TimeoutExpired(self.argv, self.timeout,
                                                _read(out + ".stdout"), _read(out + ".stderr"))
            time.sleep(0.05)
        return subprocess.CompletedProcess(self.argv, int(_read(out + ".rc")),
                                           _read(out + ".stdout"), _read(out + ".stderr"))

    def kill(self):
        if self.done.is_set():
            return
        if self.proc is not None:
            self.proc.kill()
        elif self.pid is not None:
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass


class _Jobs:
    """The session's background subprocesses: a queue in the tests' order, one worker
    thread, and the waiting test as a second worker."""

    def __init__(self, items):
        self.lock = threading.Lock()
        self.jobs = {}
        for item in items:
            spec = _job_of(item)
            if spec is not None:
                self.jobs[item.nodeid] = _Job(**spec)
        self.queue = sorted(self.jobs.values(), key=lambda j: -j.cost)
        self.closed = False
        self.thread = threading.Thread(target=self._work, name="sdm-background-jobs", daemon=True)
        self.thread.start()

    def _next(self):
        with self.lock:
            while self.queue and not self.closed:
                job = self.queue.pop(0)
                if not job.started:
                    job.started = True
                    return job
            return None

    def _work(self):
        while (job := self._next()) is not None:
            job.run()

    def result(self, nodeid):
        job = self.jobs[nodeid]
        while not job.done.is_set():
            with self.lock:
                mine = not job.started
                job.started = True
            if mine:
                job.run()
            elif (other := self._next()) is not None:
                other.run()   # help with the queue while this one runs
            else:
                job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def close(self):
        """The session ended (maybe early): nothing more starts, and what runs is stopped."""
        with self.lock:
            self.closed = True
        for job in self.jobs.values():
            job.kill()


_JOBS: list[_Jobs] = []


_TIMES: list[tuple[float, str]] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtestloop(session):
    if (not session.config.option.collectonly
            and os.environ.get("SDM_TEST_BACKGROUND", "1") != "0"):
        _JOBS.append(_Jobs(session.items))
    try:
        yield
    finally:
        for jobs in _JOBS:
            jobs.close()
            _TIMES.extend((j.seconds, k) for k, j in jobs.jobs.items() if j.seconds is not None)
        _JOBS.clear()
        for server in _SERVERS.values():
            server.close()
        _SERVERS.clear()


def pytest_terminal_summary(terminalreporter):
    """The background subprocesses' own run times (their tests' durations are waits; the
    ``cost`` of a job should stay near its time here)."""
    if _TIMES:
        terminalreporter.write_sep("=", f"background subprocesses ({len(_TIMES)}), own run times")
        for seconds, nodeid in sorted(_TIMES, reverse=True):
            terminalreporter.write_line(f"{seconds:8.2f}s  {nodeid}")


@pytest.fixture
def background(request):
    """``background()``: the ``subprocess.CompletedProcess`` of this test's job."""
    def result():
        if _JOBS and request.node.nodeid in _JOBS[0].jobs:
            return _JOBS[0].result(request.node.nodeid)
        job = _Job(**_job_of(request.node))   # not scheduled (SDM_TEST_BACKGROUND=0)
        job.run()
        if job.error is not None:
            raise job.error
        return job.result
    return result
