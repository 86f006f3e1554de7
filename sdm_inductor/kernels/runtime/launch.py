"""How the kernels are launched: through ``torch.library.wrap_triton`` so that a
``triton_op`` body that calls them is traced into Inductor's generated code."""
from __future__ import annotations

import functools
import os

import torch
import triton
from torch._library.triton import is_wrap_triton_enabled as _wrap_triton_enabled
from torch._library.triton import set_wrap_triton_enabled
from torch._subclasses.fake_tensor import is_fake as _is_fake
from torch.fx.experimental.symbolic_shapes import guard_bool, statically_known_true
from torch.library import wrap_triton
from triton import knobs
from triton.runtime import driver
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction


def dense(x: torch.Tensor) -> torch.Tensor:
    """``x`` laid out contiguously, for a kernel that addresses it through its sizes.

    A traced call (fake ``x``) always copies, and strides handed to a kernel are computed
    from sizes, never read from a traced tensor: Inductor's graph passes run after tracing
    and may change how an input is laid out (``pad_mm`` pads a small projection, e.g. a
    gate's N = heads, when its benchmark says padded is faster, and the output becomes a
    strided slice of the padded result). A traced ``.contiguous()`` of an input that was
    contiguous then leaves no node, so the kernel would get the strided slice, and a
    traced ``x.stride(0)`` is a ``sym_stride`` node that Inductor evaluates on the
    updated layout while the kernel gets another: without the copy, AOTInductor packages
    of ``examples/export_aoti.py`` read wrong gates (3 of 20 CUDA builds, relative error
    ~1e-2). Where the input stays contiguous, ``remove_noop_ops`` drops the copy."""
    if _is_fake(x):
        return x.clone(memory_format=torch.contiguous_format)
    return x.contiguous()


def pow2(n: int) -> int:
    """Smallest power of two >= n (Triton block sizes)."""
    return triton.next_power_of_2(max(1, int(n)))


def column_suits(P: int, W: int, R: int, C: int, hd: int) -> bool:
    """``WALK="auto"``'s choice of the column walks for an eager call: few slots per token
    (W, R <= 16), at most 4096 columns over all streams (P * hd), chunks of at most 64.
    There each column walk program's chain is short and the step walks' ~10 launches per
    chunk cost more than their gathers. Fitted on ``bench_walks.py --grid`` (27 shapes,
    C = 64, H200): the rule's column walks were faster in all
    7 of its grid shapes (no-grad 0.59-0.98 of the step walks' time, forward + backward
    0.67-0.97); of the 20 it leaves to the step walks, the column walks were faster in
    three, by at most 14 % (0.86 no-grad, 0.91 forward + backward). Of 6 shapes left out
    of the fit, one (W = 24, 8 x 96 columns) ran 15 % faster on the column walks than
    the rule's choice. Traced calls ask too (the queue walk otherwise): a symbolic ``P``
    is judged by its example value, as Inductor's heuristics use size hints, so the choice
    adds no guard (either walk is correct for every ``P``; an unbacked one counts as too
    many columns)."""
    return max(W, R) <= 16 and C <= 64 and _hint(P * hd, 4097) <= 4096


def _hint(n, fallback: int) -> int:
    """``n``, or a symbolic ``n``'s example value (``fallback`` if it has none), read
    without adding a guard."""
    if isinstance(n, torch.SymInt):
        hint = n.node.hint
        return fallback if hint is None else int(hint)
    return int(n)


def step_walks(config: dict, t, shape: tuple) -> bool:
    """Whether a call on tensor ``t`` (the bank, ``[S, hd]``) takes the step walks
    (launches per chunk): ``WALK`` "step", or "auto" (the default) unless ``column_suits``
    the call's ``shape = (P, W, R, C)``; and eager. A traced call (fake, or functional
    over fake, tensors) must launch one kernel per walk, whose compilation serves every
    ``T`` (``walk_kind``)."""
    if _is_fake(t) or config["WALK"] not in ("step", "auto"):
        return False
    return config["WALK"] == "step" or not column_suits(*shape, t.shape[1])


def walk_kind(config: dict, t, shape: tuple) -> str:
    """The walk of a call on tensor ``t`` (the bank or its gradient, ``[S, hd]``) of
    ``shape = (P, W, R, C)``, forward and backward alike. Eager calls (and CUDA graphs of
    them) loop over the chunks on the host: the step walk. A traced call (Inductor's
    generated code, AOTInductor) needs one launch whose compilation serves every ``T``: the
    queue walk (the step walk's items in one launch). Both leave the small shapes where the
    column walk measured faster (``column_suits``) to the column walk; ``WALK`` forces one."""
    if config["WALK"] == "queue":
        return "queue"
    if step_walks(config, t, shape):
        return "step"
    if config["WALK"] == "column" or column_suits(*shape, t.shape[1]):
        return "column"
    return "queue"


def pdl(config: dict, t) -> dict:
    """Launch options of the step walks' kernels for a call on tensor ``t``: programmatic
    dependent launch (``PDL``, ``launch_pdl``) where the device has it (sm_90+) and
    ``config["PDL"]`` asks for it. Each such launch may start while the kernel before it
    still runs; the kernel's first statement waits for it (``tiles._grid_dependency``),
    so only the launch latency overlaps, never data (``PDL=2``: also the loads of what no
    launch of the walk writes)."""
    on = (bool(config["PDL"]) and t.device.type == "cuda"
          and os.environ.get("TRITON_INTERPRET") != "1"
          and torch.cuda.get_device_capability(t.device) >= (9, 0))
    return dict(PDL=int(config["PDL"]), launch_pdl=True) if on else dict(PDL=False)


def holds(cond) -> bool:
    """Whether a condition on sizes holds. A traced call guards on a symbolic one, so its
    graph serves the sizes that agree; an AOTInductor package, which has no guards, takes
    what its shapes prove."""
    if isinstance(cond, bool):
        return cond
    from torch._inductor.virtualized import V

    if V.aot_compilation:
        return statically_known_true(cond)
    return guard_bool(cond)


def multiple_of_16(n) -> bool:
    """Whether a row length is a multiple of 16: a kernel's ``HD16`` / ``WIDTH16``
    (``tiles.row_length``), by ``holds``."""
    return holds(n % 16 == 0)


def launch(kernel, grid, *args, **meta):
    """``kernel[grid](*args, **meta)``, traceable inside a ``triton_op``."""
    if isinstance(kernel, (JITFunction, Autotuner)):
        wrap_triton(kernel)[grid](*args, **meta)
    else:
        # TRITON_INTERPRET=1 makes kernels InterpretedFunctions, which torch 2.11's
        # wrap_triton refuses; the interpreter only runs eagerly, so launch directly
        kernel[grid](*args, **meta)


# What ``capped`` made (its kernels and Configs, by id): Inductor's output code and
# AOTInductor packages keep their caps only with help (lowerings/kernel_source.py)
CAPPED: dict[int, object] = {}


@functools.cache
def capped(kernel: JITFunction, num_warps: int, maxnreg: int) -> Autotuner:
    """``kernel`` launched in ``num_warps`` warps under a cap of ``maxnreg`` registers per
    thread: a one-config ``triton.autotune`` (nothing to tune). A ``maxnreg`` launch
    argument would not pass through ``wrap_triton``; a ``Config`` reaches Inductor's output
    code (``CAPPED``)."""
    cfg = triton.Config({}, num_warps=num_warps, num_stages=1, maxnreg=maxnreg)
    CAPPED.update({id(kernel): kernel, id(cfg): cfg})
    return triton.autotune([cfg], key=[])(kernel)


def launch_capped(kernel, grid, num_warps: int, maxnreg: int, *args, **meta):
    """``launch`` in ``num_warps`` warps, under ``maxnreg`` registers (0: no cap)."""
    if maxnreg and isinstance(kernel, JITFunction):
        launch(capped(kernel, num_warps, maxnreg), grid, *args, **meta)
    else:
        launch(kernel, grid, *args, num_warps=num_warps, num_stages=1, **meta)


def direct_launches(fn):
    """Run ``fn`` (an eager implementation, called with real tensors) with
    ``wrap_triton`` switched off, as ``triton_op`` does for its own eager calls: every
    launch then goes straight to the kernel instead of through the higher-order op's
    dispatch, which costs ~100 us per launch on the host (the step walk makes hundreds)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        if any(isinstance(a, torch.Tensor) and _is_fake(a) for a in args):
            return fn(*args, **kwargs)   # traced (e.g. make_fx of the host code): keep the HOP
        with set_wrap_triton_enabled(False):
            return fn(*args, **kwargs)
    return run


def _idle(hook) -> bool:
    """A launch hook that does nothing: unset, or an empty ``knobs.HookChain``."""
    return hook is None or not getattr(hook, "calls", True)


class Relaunch:
    """Launches of one kernel, one grid and one argument list in which only ``var`` (a
    scalar the kernel does not specialize on) changes: the step walk's hundreds of
    launches per call. The first launch goes through ``kernel[grid]`` (compiling if
    needed); later ones call the compiled kernel's launcher with the bound arguments of
    the first, as ``JITFunction.run`` itself does after its cache lookup, skipping the
    ~20-30 us of argument binding and specialization per launch on the host. Every
    other case (the interpreter, traced calls) takes ``launch``."""

    def __init__(self, kernel, grid, var: str, *args, **meta):
        self.kernel, self.grid, self.args, self.meta = kernel, tuple(grid), list(args), meta
        self.grid3 = self.grid + (1,) * (3 - len(self.grid))
        self.fast = isinstance(kernel, JITFunction) and not _wrap_triton_enabled()
        self.var = list(kernel.arg_names).index(var)
        self.compiled = None
        # everything the launches depend on but ``var`` (``graphs.run``'s keys)
        self.key = (id(kernel), self.grid, self.var, tuple(arg_key(a) for a in args),
                    tuple(sorted(meta.items())))

    def __call__(self, value):
        if self.compiled is not None:
            rt = knobs.runtime
            enter, leave = rt.launch_enter_hook, rt.launch_exit_hook
            if _idle(enter) and _idle(leave):   # no profiler hooks: no metadata to build
                self.fast_run(*self.head, value, *self.tail)
            else:
                vals, ptrs = list(self.vals), list(self.ptrs)
                vals[self.var] = ptrs[self.var] = value
                meta = self.compiled.launch_metadata(self.grid, self.stream, *vals)
                self.run(*self.grid3, self.stream, self.function, self.packed, meta, enter,
                         leave, *ptrs)
            return
        args = list(self.args)
        args[self.var] = value
        if not self.fast:
            launch(self.kernel, self.grid, *args, **self.meta)
            return
        ck = self.kernel[self.grid](*args, **self.meta)
        device = driver.active.get_current_device()
        binder = self.kernel.device_caches[device][4]
        bound = binder(*args, **self.meta)[0]
        self.vals = list(bound.values())
        # device pointers as ints: the launcher then skips a data_ptr() call and a
        # cuPointerGetAttribute per tensor argument on every launch (~1 us each; the
        # step walk's kernels take up to 25 tensors). The tensors stay referenced by
        # self.args for as long as the launches can happen.
        self.ptrs = [v.data_ptr() if isinstance(v, torch.Tensor) else v for v in self.vals]
        self.stream = driver.active.get_current_stream(device)
        self.run, self.function, self.packed = ck.run, ck.function, ck.packed_metadata
        lead = (*self.grid3, self.stream, self.function)
        rest = (self.packed, None, None, None, *self.ptrs[:self.var])
        runner = self.run
        if _direct_ok(runner):
            # the launcher's C entry point itself: its Python wrapper (CudaLauncher.__call__)
            # only allocates the scratch buffers, which this kernel does not have, and
            # repacks ~35 arguments, a few us per launch on the host
            self.fast_run = runner.launch
            self.head = (*lead, runner.launch_cooperative_grid, runner.launch_pdl, None, None,
                         *rest)
        else:
            self.fast_run, self.head = runner, (*lead, *rest)
        self.tail = tuple(self.ptrs[self.var + 1:])
        self.compiled = ck


def arg_key(a):
    """A launch argument as a kernel sees it: a tensor is its device pointer (and dtype,
    which the compiled kernel's signature holds)."""
    if isinstance(a, torch.Tensor):
        return ("tensor", a.data_ptr(), a.dtype, a.device)
    return a


def _direct_ok(runner) -> bool:
    """Whether ``runner`` (a compiled kernel's launcher) is Triton's CUDA launcher for a
    kernel without global or profile scratch memory: its C ``launch`` then takes the
    arguments ``CudaLauncher.__call__`` would pass, with None for both scratch buffers.
    Only Triton 3.6's, whose argument order this was written against (other versions take
    the wrapper)."""
    return (triton.__version__.startswith("3.6.")
            and type(runner).__name__ == "CudaLauncher" and hasattr(runner, "launch")
            and getattr(runner, "global_scratch_size", 1) == 0
            and getattr(runner, "profile_scratch_size", 1) == 0
            and hasattr(runner, "launch_cooperative_grid") and hasattr(runner, "launch_pdl"))
