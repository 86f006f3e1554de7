"""Inductor's source for a user-defined kernel keeps the kernel's ``noinline`` helpers
(``lowerings/kernel_source.py``). CPU only: the source is made without compiling."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("triton")

import sdm_inductor  # noqa: E402,F401  (installs the wrapper)
from torch._inductor.codegen import wrapper  # noqa: E402

from sdm_inductor.kernels.backward.queue_walk import _queue_reverse_kernel  # noqa: E402
from sdm_inductor.kernels.forward.queue_walk import _queue_walk_kernel  # noqa: E402
from sdm_inductor.lowerings import kernel_source  # noqa: E402


def _decorators(src: str) -> dict:
    """function name -> the decorator line above its ``def`` in ``src``."""
    return {m.group(2): m.group(1)
            for m in re.finditer(r"^(@triton\.jit\S*)\n(?:@.*\n)*def (\w+)\(", src, re.M)}


@pytest.mark.parametrize("kernel, items", [
    (_queue_walk_kernel, {"_gather_item", "_mix_item", "_write_item"}),
    (_queue_reverse_kernel, {"_gather_item", "_mix1_item", "_dw_item", "_mix2_item",
                             "_dev_item"}),
])
def test_queue_walk_items_stay_noinline_in_inductors_source(kernel, items):
    assert kernel_source.noinline_helpers(kernel) == items
    kernel_source.install()   # a second install wraps nothing twice
    src = wrapper.user_defined_triton_kernel_transitive_closure_source_code(kernel)
    decorators = _decorators(src)
    assert {n for n, d in decorators.items() if d == "@triton.jit(noinline=True)"} == items
    # every other helper Inductor wrote keeps its plain decorator
    assert {n for n, d in decorators.items() if d == "@triton.jit"} == set(decorators) - items
    assert len(decorators) > len(items)
    assert src.count("@triton.jit(noinline=True)") == len(items)
