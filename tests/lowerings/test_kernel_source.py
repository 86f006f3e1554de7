"""Inductor's source for a user-defined kernel keeps the kernel's ``noinline`` helpers and
register caps, and a capped kernel compiles with the ptxas an eager launch takes
(``lowerings/kernel_source.py``). CPU only: the source is made and loaded without
compiling."""
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


def _load_output_code(monkeypatch, tmp_path, src, precompile=None):
    """The module Inductor writes for ``src``, loaded twice as a compile worker loads it
    (over ``precompile`` as ``CachingAutotuner._precompile_config`` when given); the
    compile-step functions it installed (once), and those it wrapped."""
    from torch._inductor.runtime import triton_heuristics as th

    tuner = th.CachingAutotuner
    create, compile_ = tuner._create_compile_options, tuner._precompile_config
    if getattr(compile_, "compiles_capped_as_launched", False):   # loaded in this process
        create, compile_ = create.__wrapped__, compile_.__wrapped__
    monkeypatch.setattr(tuner, "_create_compile_options", create)
    monkeypatch.setattr(tuner, "_precompile_config", precompile or compile_)
    path = tmp_path / "output_code.py"
    path.write_text(f"import triton\nimport triton.language as tl\n\n\n@triton.jit\n{src}")
    installed = []
    for _ in range(2):
        spec = importlib.util.spec_from_file_location("output_code", path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        installed.append((tuner._create_compile_options, tuner._precompile_config))
    assert installed[1] == installed[0]
    return installed[0], (create, precompile or compile_)


def _capped_config():
    from sdm_inductor.kernels.runtime import launch
    return launch.capped(_queue_walk_kernel, 4, 168).configs[0]


_STUB = types.SimpleNamespace(device_props=types.SimpleNamespace(type="cuda", cc=90))
_META = {"num_warps": 4, "num_stages": 1, "debug": False}


def test_register_caps_reach_inductors_source(monkeypatch, tmp_path):
    """A launch's cap (``launch.capped``) reaches the kernel's Config dict in the output
    code, and the source that Inductor compiles (in a worker that never imports
    sdm_inductor) carries the code that passes it to ``triton.compile``; other Configs and
    kernels are written as Inductor writes them."""
    import triton
    from torch._inductor.runtime import triton_heuristics as th
    from triton import knobs
    from triton.backends.nvidia.compiler import ptx_get_version

    cfg = _capped_config()
    assert kernel_source.capped(cfg) and kernel_source.capped(_queue_walk_kernel)
    assert th.config_to_dict(cfg) == {"num_warps": 4, "num_stages": 1, "maxnreg": 168}
    assert th.config_from_dict(th.config_to_dict(cfg)).maxnreg == 168
    other = triton.Config({}, num_warps=4, num_stages=1, maxnreg=168)
    assert "maxnreg" not in th.config_to_dict(other)

    src = wrapper.user_defined_triton_kernel_transitive_closure_source_code(_queue_walk_kernel)
    assert src.rstrip().endswith("_compile_capped_as_launched()")
    from sdm_inductor.kernels.forward.step_walk import _step_gather_kernel
    plain = wrapper.user_defined_triton_kernel_transitive_closure_source_code(
        _step_gather_kernel)
    assert "_compile_capped_as_launched" not in plain

    (patched, _), (create, _) = _load_output_code(monkeypatch, tmp_path, src)
    assert patched.passes_maxnreg and patched.__wrapped__ is create
    # a capped Config's options: its cap, and the PTX version of the ptxas in effect
    ptx = ptx_get_version(knobs.nvidia.ptxas.version)
    for config, want in ((th.config_from_dict(th.config_to_dict(cfg)), (168, ptx)),
                         (triton.Config({}, num_warps=4, num_stages=1), (None, None))):
        options = patched(_STUB, config, dict(_META))
        assert (options.get("maxnreg"), options.get("ptx_version")) == want
        assert {k: v for k, v in options.items() if k not in ("maxnreg", "ptx_version")} == \
            create(_STUB, config, dict(_META))


def test_capped_kernels_assemble_with_the_eager_launchs_ptxas(monkeypatch, tmp_path):
    """Where TRITON_PTXAS_PATH names the ptxas torch ships (Inductor sets it), a capped
    Config compiles with Triton's own ptxas, the one an eager launch takes, and a PTX
    version that puts it apart in Triton's cache; every other Config, and every Config
    where the variable is unset or names another ptxas (the user's choice), compiles as
    Inductor compiles it."""
    import os

    import torch
    import triton
    from torch._inductor.runtime import triton_heuristics as th
    from triton import knobs
    from triton.backends.nvidia import compiler as nv

    own = vars(type(knobs.nvidia))["ptxas"].default_path
    fakes = {}
    for name in ("torch", "user"):   # a CUDA 13.0 ptxas, as far as `--version` tells
        exe = tmp_path / name / "bin" / "ptxas"
        exe.parent.mkdir(parents=True)
        exe.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.48'\n")
        exe.chmod(0o755)
        fakes[name] = str(exe)
    monkeypatch.setattr(torch, "__file__", str(tmp_path / "torch" / "__init__.py"))
    seen = []

    def precompile(self, cfg):   # Inductor's compile step: what it would compile with
        options = th.CachingAutotuner._create_compile_options(self, cfg, dict(_META))
        seen.append((knobs.nvidia.ptxas.path, os.environ.get("TRITON_PTXAS_PATH"),
                     options.get("ptx_version")))

    src = wrapper.user_defined_triton_kernel_transitive_closure_source_code(_queue_walk_kernel)
    (_, patched), _ = _load_output_code(monkeypatch, tmp_path, src, precompile)
    cfg, plain = _capped_config(), triton.Config({}, num_warps=4, num_stages=1)
    own_ptx = nv.ptx_get_version(knobs.NvidiaTool.from_path(own).version)
    try:
        for env, config, want in ((fakes["torch"], cfg, (own, own, own_ptx)),
                                  (fakes["torch"], plain, (fakes["torch"],) * 2 + (None,)),
                                  (fakes["user"], cfg, (fakes["user"],) * 2 + (90,)),
                                  (None, cfg, (own, None, own_ptx))):
            if env is None:
                monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
            else:
                monkeypatch.setenv("TRITON_PTXAS_PATH", env)
            seen.clear()
            patched(_STUB, config)
            assert seen == [want]
            assert os.environ.get("TRITON_PTXAS_PATH") == env   # restored
    finally:
        nv.get_ptxas_version.cache_clear()   # it ran a fake ptxas: forget its version
