"""Inductor's output code keeps the kernels' non-inlined helpers non-inlined.

Inductor writes a user-defined Triton kernel into its output code together with every
``@triton.jit`` function the kernel calls
(``torch._inductor.codegen.wrapper.user_defined_triton_kernel_transitive_closure_source_code``),
each under a plain ``@triton.jit``: a helper declared ``@triton.jit(noinline=True)`` loses
that and is inlined. The queue walks rely on it: each kind of work item is a non-inlined
function, so a launch needs the registers of its largest item, not of their union (inlined:
244-255 registers at 4 warps, which under the launches' register caps spill). Emitted at
config A (H100), the reverse queue walk took 9.1 ms of a training call's GPU time inlined,
against ~6.6 ms for the same launch from the eager op.

``install`` wraps that function so that its source writes ``@triton.jit(noinline=True)``
above each helper declared so. Every caller (the wrapper codegen, the FX graph and
AOTAutograd caches' keys) looks the function up on the module when it runs, so all of them
see the same source. A torch without the function is left alone.
"""
from __future__ import annotations

import functools
import re

__all__ = ["install", "noinline_helpers"]


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


def _keep_noinline(source_code):
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
        return src
    closure_source.keeps_noinline = True
    return closure_source


def install() -> None:
    """Wrap Inductor's kernel-source function once (idempotent)."""
    try:
        from torch._inductor.codegen import wrapper
    except ImportError:      # no Inductor: nothing emits kernels
        return
    name = "user_defined_triton_kernel_transitive_closure_source_code"
    fn = getattr(wrapper, name, None)
    if fn is None or getattr(fn, "keeps_noinline", False):
        return
    setattr(wrapper, name, _keep_noinline(fn))
