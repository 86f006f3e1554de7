"""Plain CPython frame evaluation for an op's host code when a compiled graph calls it.

Dynamo installs a frame-evaluation function (PEP 523) while a compiled function runs.
It enters the cached compiled code with its callback set to None, not through
``set_eval_frame``, so its count of active threads stays above zero and the function stays
installed while the graph runs, doing nothing but calling CPython's own. CPython (3.11 and
later) inlines a Python-to-Python call into the caller's evaluation loop only when no such
function is installed; with one, each call goes through the C stack. So an op called from
Inductor's output code runs its Python host code slower than the same call in eager mode:
2,000 calls of a one-line function inside a custom op took 73 us eager and 105 us called
from a compiled graph, 73 us there under ``plain_frames`` (CPU, Python 3.11, torch 2.13 and
2.11 alike; Python 3.12: 74, 122 and 74 us). The CUDA op's host code
(validation, Phase 1's launches through Triton's launchers, the walks' bookkeeping) is
thousands of such calls, on the critical path of a call followed by a sync.

``plain_frames()`` puts CPython's default back for the body of an op and Dynamo's function
after it, only when that function is the one installed and this thread's callback is None (a
compiled graph running: the function would only call the default). Frames a body starts then
run as they would under Dynamo's function with no callback. Frames another thread starts
while the body has released the GIL are not intercepted by Dynamo either: a function such a
thread calls inside a ``torch.compile`` region runs eagerly that once (the same results).
Outside CPython, or where the private C functions are missing, it does nothing.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools

import torch


@functools.cache
def _api():
    """(get, set, default, interpreter) from CPython's C API, or None."""
    try:
        api = ctypes.pythonapi
        get = api._PyInterpreterState_GetEvalFrameFunc
        put = api._PyInterpreterState_SetEvalFrameFunc
        default = ctypes.cast(api._PyEval_EvalFrameDefault, ctypes.c_void_p).value
        interp = api.PyInterpreterState_Get
    except (AttributeError, ValueError):
        return None
    interp.restype = ctypes.c_void_p
    interp.argtypes = []
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    put.restype, put.argtypes = None, [ctypes.c_void_p, ctypes.c_void_p]
    return get, put, default, interp


def _no_callback() -> bool:
    get = getattr(torch._C._dynamo.eval_frame, "get_eval_frame_callback", None)
    return get is not None and get() is None


@functools.cache
def _dynamo_function() -> int:
    """The address of Dynamo's frame-evaluation function: read while a run-only callback
    has it installed, then the callback put back (called with no callback set: Dynamo's
    count of active threads goes up and back down, so whatever was installed before is
    installed again)."""
    get, _put, _default, interp = _api()
    set_eval_frame = torch._C._dynamo.eval_frame.set_eval_frame
    prior = set_eval_frame(False)
    try:
        return get(interp())
    finally:
        set_eval_frame(prior)


@contextlib.contextmanager
def plain_frames():
    """Run the body under CPython's default frame evaluation (see the module docstring).
    Only Dynamo's function, with no callback, is taken out: another tool's (a debugger's
    PEP 523 hook) stays."""
    api = _api()
    if api is None:
        yield
        return
    get, put, default, interp = api
    state = interp()
    installed = get(state)
    if installed == default or not _no_callback() or installed != _dynamo_function():
        yield
        return
    put(state, default)
    try:
        yield
    finally:
        put(state, installed)


def installed_function() -> int | None:
    """The address of the installed frame-evaluation function (None outside CPython)."""
    api = _api()
    if api is None:
        return None
    get, _put, _default, interp = api
    return get(interp())


def installed() -> bool:
    """Whether a frame-evaluation function other than CPython's default is installed."""
    api = _api()
    return api is not None and installed_function() != api[2]
