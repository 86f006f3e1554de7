"""Inductor's source for a user-defined kernel keeps the kernel's ``noinline`` helpers
(``lowerings/kernel_source.py``). CPU only: the source is made without compiling."""
from __future__ import annotations

import importlib.util
import re
import types

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


def test_register_caps_reach_inductors_source(monkeypatch, tmp_path):
    """A launch's cap (``launch.capped``) reaches the kernel's Config dict in the output
    code, and the source that Inductor compiles (in a worker that never imports
    sdm_inductor) carries the code that passes it to ``triton.compile``; other Configs and
    kernels are written as Inductor writes them."""
    import triton
    from torch._inductor.runtime import triton_heuristics as th

    from sdm_inductor.kernels.runtime import launch

    cfg = launch.capped(_queue_walk_kernel, 4, 168).configs[0]
    assert kernel_source.capped(cfg) and kernel_source.capped(_queue_walk_kernel)
    assert th.config_to_dict(cfg) == {"num_warps": 4, "num_stages": 1, "maxnreg": 168}
    assert th.config_from_dict(th.config_to_dict(cfg)).maxnreg == 168
    other = triton.Config({}, num_warps=4, num_stages=1, maxnreg=168)
    assert "maxnreg" not in th.config_to_dict(other)

    src = wrapper.user_defined_triton_kernel_transitive_closure_source_code(_queue_walk_kernel)
    assert src.rstrip().endswith("_pass_register_caps()")
    from sdm_inductor.kernels.forward.step_walk import _step_gather_kernel
    plain = wrapper.user_defined_triton_kernel_transitive_closure_source_code(
        _step_gather_kernel)
    assert "_pass_register_caps" not in plain

    # the module Inductor writes, loaded as a compile worker loads it: it defines the kernel
    # and makes the compile step pass a Config's maxnreg (installed once)
    create = th.CachingAutotuner._create_compile_options
    if getattr(create, "passes_maxnreg", False):   # a capped kernel loaded in this process
        create = create.__wrapped__
    monkeypatch.setattr(th.CachingAutotuner, "_create_compile_options", create)
    path = tmp_path / "output_code.py"
    path.write_text(f"import triton\nimport triton.language as tl\n\n\n@triton.jit\n{src}")
    installed = []
    for _ in range(2):
        spec = importlib.util.spec_from_file_location("output_code", path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        installed.append(th.CachingAutotuner._create_compile_options)
    patched = installed[0]
    assert patched.passes_maxnreg and patched.__wrapped__ is create and installed[1] is patched

    stub = types.SimpleNamespace(device_props=types.SimpleNamespace(type="cuda"))
    meta = {"num_warps": 4, "num_stages": 1, "debug": False}
    for config, want in ((th.config_from_dict(th.config_to_dict(cfg)), 168),
                         (triton.Config({}, num_warps=4, num_stages=1), None)):
        options = patched(stub, config, dict(meta))
        assert options.get("maxnreg") == want
        assert {k: v for k, v in options.items() if k != "maxnreg"} == create(
            stub, config, dict(meta))
