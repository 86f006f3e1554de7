"""Inductor compiles the kernels as eager launches compile them: ``noinline`` helpers stay
non-inlined, register caps stay caps.

Inductor writes a user-defined Triton kernel into its output code together with every
``@triton.jit`` function the kernel calls
(``torch._inductor.codegen.wrapper.user_defined_triton_kernel_transitive_closure_source_code``),
each under a plain ``@triton.jit``: a helper declared ``@triton.jit(noinline=True)`` loses
that and is inlined. The queue walks rely on it: each kind of work item is a non-inlined
function, so a launch needs the registers of its largest item, not of their union (inlined:
244-255 registers at 4 warps, which under the launches' register caps spill). Emitted at
config A (H100), the reverse queue walk took 9.1 ms of a training call's GPU time inlined,
against ~6.6 ms for the same launch from the eager op. ``install`` wraps that function so
that its source writes ``@triton.jit(noinline=True)`` above each helper declared so.

A launch's register cap is the ``maxnreg`` of its one-config ``triton.autotune``
(``runtime.launch.capped``). Inductor writes each ``Config`` into its output code as a dict
(``triton_heuristics.config_to_dict``) without ``maxnreg``, and compiles a ``Config``
(``CachingAutotuner._create_compile_options``) without it either, so the emitted queue walks
compiled uncapped: the forward with 252 registers (2 programs per SM instead of 3), the
reverse with 160 (3 instead of 4). ``install`` makes the dict keep ``maxnreg``; the compile
step runs where the kernel's module loads, often in Inductor's compile workers, which never
import this package, so the source of a capped kernel ends with the code that makes that
step pass ``maxnreg`` to ``triton.compile`` as Triton's own autotuner does
(``_compile_capped_as_launched``, written out whole: it needs nothing of this package).

A cap holds for the ptxas it was set under. Inductor's compile workers, and a process once
Inductor has compiled a kernel in it, assemble with the ptxas that torch ships (it puts
``torch/bin/ptxas`` on ``TRITON_PTXAS_PATH`` where the variable is unset), an eager launch
with Triton's own; at the no-grad queue walk's cap of 168 registers CUDA 13.0's ptxas
spills 240 bytes where Triton's 12.8 spills 12, and the emitted walk ran ~1.25x slower
(docs/performance.md, "Traced walks"). The same code therefore compiles a capped ``Config``
with the ptxas an eager launch takes: Triton's own where the variable names torch's, the
user's where the user named another.

Every caller (the wrapper codegen, the FX graph and AOTAutograd caches' keys) looks these
functions up on their modules when it runs, so all of them see the same source. A torch
without them is left alone.
"""
from __future__ import annotations

import functools
import inspect
import re

__all__ = ["capped", "install", "noinline_helpers"]


def noinline_helpers(kernel) -> set[str]:
    """The function names of the ``noinline`` Triton functions that ``kernel`` (a
    ``JITFunction``) calls, directly or through other Triton functions (found as Inductor
    finds them: the global names each function's code loads)."""
    from triton.runtime.jit import JITFunction

    names: set[str] = set()
    seen, todo = {id(kernel)}, [kernel]
    while todo:
        fn = todo.pop().fn
        for name in fn.__code__.co_names:
            sym = fn.__globals__.get(name)
            if isinstance(sym, JITFunction) and id(sym) not in seen:
                seen.add(id(sym))
                todo.append(sym)
                if sym.noinline:
                    names.add(sym.fn.__name__)
    return names


def capped(obj) -> bool:
    """Whether ``obj`` (a ``JITFunction`` or a ``triton.Config``) is one that
    ``kernels.runtime.launch.capped`` made (a launch under a register cap)."""
    try:
        from ..kernels.runtime.launch import CAPPED
    except ImportError:     # no triton: nothing was capped
        return False
    return CAPPED.get(id(obj)) is obj


def _compile_capped_as_launched():
    # Inductor compiles a Config without its maxnreg: pass it on, as triton.autotune does.
    # Its compile workers (and a process once Inductor has compiled a kernel in it) assemble
    # with the ptxas that torch ships, under which a cap set for the ptxas of an eager
    # launch can spill (the no-grad queue walk at 168 registers: 240 bytes under CUDA
    # 13.0's, 12 under Triton's 12.8, the kernel ~1.25x slower): a capped Config is
    # assembled by the ptxas an eager launch takes, and its PTX version, part of Triton's
    # cache key, names that ptxas. This function's source is written whole into the output
    # code of every capped kernel (kernel_source.py), so it imports what it needs and
    # nothing of sdm_inductor.
    import contextlib
    import functools
    import os

    import torch
    from torch._inductor.runtime import triton_heuristics
    tuner = triton_heuristics.CachingAutotuner
    if getattr(tuner._precompile_config, "compiles_capped_as_launched", False):
        return
    create, precompile = tuner._create_compile_options, tuner._precompile_config

    def on_cuda(self, cfg):
        return getattr(cfg, "maxnreg", None) and self.device_props.type == "cuda"

    @functools.wraps(create)
    def create_compile_options(self, cfg, *args, **kwargs):
        options = create(self, cfg, *args, **kwargs)
        if getattr(cfg, "maxnreg", None) and options.get("maxnreg") is None:
            options["maxnreg"] = cfg.maxnreg
        if on_cuda(self, cfg) and options.get("ptx_version") is None:
            with contextlib.suppress(Exception):   # another Triton: as Inductor compiles
                from triton import knobs
                from triton.backends.nvidia.compiler import ptx_get_version
                options["ptx_version"] = ptx_get_version(knobs.nvidia.ptxas.version)
        return options

    def launch_ptxas():
        # Triton's own ptxas where TRITON_PTXAS_PATH names torch's (Inductor set it); None
        # where it is unset or the user chose another (eager launches take that one too)
        try:
            from triton import knobs
            tool = vars(type(knobs.nvidia))["ptxas"]
            env = os.environ.get(tool.key)
            torch_ptxas = os.path.join(os.path.dirname(torch.__file__), "bin", "ptxas")
            if env is None or not os.path.samefile(env, torch_ptxas):
                return None
            return tool.default_path
        except Exception:   # noqa: BLE001  (another Triton, a missing file: as Inductor does)
            return None

    @functools.wraps(precompile)
    def precompile_config(self, cfg, *args, **kwargs):
        path = launch_ptxas() if on_cuda(self, cfg) else None
        if path is None:
            return precompile(self, cfg, *args, **kwargs)
        from triton import knobs
        from triton.backends.nvidia.compiler import get_ptxas_version
        # the version in the keys of the process's other compiles stays its own (cached)
        get_ptxas_version(self.device_props.cc)
        # (the scope sets os.environ: a process's Inductor compiles one kernel at a time)
        with knobs.nvidia.scope():
            knobs.nvidia.ptxas = path
            return precompile(self, cfg, *args, **kwargs)
    create_compile_options.passes_maxnreg = True
    precompile_config.compiles_capped_as_launched = True
    tuner._create_compile_options = create_compile_options
    tuner._precompile_config = precompile_config


def _keep_launch_options(source_code):
    @functools.wraps(source_code)
    def closure_source(kernel, *args, **kwargs):
        from triton.runtime.jit import JITFunction

        src = source_code(kernel, *args, **kwargs)
        jit = kernel
        while not isinstance(jit, JITFunction) and hasattr(jit, "fn"):   # autotuners
            jit = jit.fn
        if not isinstance(jit, JITFunction):
            return src
        for name in noinline_helpers(jit):
            src = re.sub(rf"^@triton\.jit\n(def {re.escape(name)}\()",
                         r"@triton.jit(noinline=True)\n\1", src, flags=re.MULTILINE)
        if capped(jit):
            name = _compile_capped_as_launched.__name__
            src += f"\n\n\n{inspect.getsource(_compile_capped_as_launched)}\n\n{name}()\n"
        return src
    closure_source.keeps_launch_options = True
    return closure_source


def _keep_maxnreg(config_to_dict):
    @functools.wraps(config_to_dict)
    def to_dict(config):
        out = config_to_dict(config)
        if capped(config):
            out["maxnreg"] = config.maxnreg
        return out
    to_dict.keeps_maxnreg = True
    return to_dict


def _reads_maxnreg(heuristics) -> bool:
    """Whether Inductor's dict-to-Config step makes ``maxnreg`` a Config option (not a
    kernel argument)."""
    try:
        cfg = heuristics.config_from_dict({"maxnreg": 8, "num_warps": 4, "num_stages": 1})
    except Exception:   # noqa: BLE001  (another torch: leave it alone)
        return False
    return getattr(cfg, "maxnreg", None) == 8 and "maxnreg" not in cfg.kwargs


def install() -> None:
    """Wrap Inductor's kernel-source and config-writing functions once (idempotent)."""
    try:
        from torch._inductor.codegen import wrapper
        from torch._inductor.runtime import triton_heuristics
    except ImportError:      # no Inductor: nothing emits kernels
        return
    name = "user_defined_triton_kernel_transitive_closure_source_code"
    fn = getattr(wrapper, name, None)
    if fn is not None and not getattr(fn, "keeps_launch_options", False):
        setattr(wrapper, name, _keep_launch_options(fn))
    to_dict = getattr(triton_heuristics, "config_to_dict", None)
    if (to_dict is not None and not getattr(to_dict, "keeps_maxnreg", False)
            and _reads_maxnreg(triton_heuristics)):
        triton_heuristics.config_to_dict = _keep_maxnreg(to_dict)
