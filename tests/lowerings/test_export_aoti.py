"""AOTInductor: torch.export -> aoti_compile_and_package -> aoti_load_package of a
model using the sdm op, outputs equal eager for lengths other than the traced one.

On CPU the op is a Python custom op: AOTInductor emits a call through its proxy executor
(``aoti_torch_proxy_executor_call_function``), which finds ``sdm::...`` in the dispatcher
when the package is loaded, so the loading process must have imported ``sdm_inductor``
(a C++-only deployment would need the op registered with TORCH_LIBRARY). On CUDA the
op is traced into its Triton kernels, which the package carries compiled (with
``EMIT_KERNELS="never"`` it is called through the proxy executor there too).

One CPU package costs about a minute on two cores: built once per module.
"""
from __future__ import annotations

import json
import zipfile

import pytest
import torch

import sdm_inductor
from sdm_inductor.lowerings import write_read as lowering
from sdm_inductor.nn import SparseDeltaMemory
from sdm_inductor.testing import FunctionalWriteRead, aoti_runtime_failure, make_inputs, rel_err

CUDA = torch.cuda.is_available() and lowering.triton_op("write_read", torch.device("cuda"))


def make_layer(device):
    torch.manual_seed(0)
    return SparseDeltaMemory(32, num_heads=2, slots_per_head=16, top_k=4, key_dim=8,
                             output_gate=True, chunk_size=16, device=device).eval()


def package(layer, device, path):
    x = torch.randn(2, 24, 32, device=device)
    # Dim.DYNAMIC: T must stay symbolic (export fails if it specializes), while guards
    # that hold for every T are accepted (torch 2.11 cannot prove some min(a*T, b*T) ones)
    with torch.no_grad():
        ep = torch.export.export(layer, (x,), dynamic_shapes=({1: torch.export.Dim.DYNAMIC},))
        with torch._inductor.config.patch(force_disable_caches=True):
            return ep, torch._inductor.aoti_compile_and_package(ep, package_path=str(path))


def extern_targets(path) -> list[str]:
    """The ops the package's wrapper calls through the proxy executor."""
    targets = []
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            if name.endswith(".json") and "metadata" not in name:
                nodes = json.loads(z.read(name)).get("nodes", [])
                targets += [n["node"]["target"] for n in nodes]
    return targets


def check_lengths(layer, loaded, device, tol):
    for T in (24, 37, 70):
        x = torch.randn(2, T, 32, device=device)
        with torch.no_grad():
            got, want = loaded(x), layer(x)
        assert got.shape == want.shape == (2, T, 32)
        assert rel_err(got, want) < tol, (T, rel_err(got, want))


@pytest.mark.compile
def test_aoti_cpu_dynamic_length(tmp_path):
    layer = make_layer("cpu")
    ep, path = package(layer, "cpu", tmp_path / "sdm_cpu.pt2")
    # export keeps the op itself (high level, serializable), like triton_op: the layer's
    # per-token gates take the gated op
    exported = [str(n.target) for n in ep.graph.nodes if "sdm" in str(n.target)]
    assert "sdm.write_read_gated.default" in exported, exported
    # on CPU the gates become graph ops and the package calls the chunked CPU path once,
    # through the proxy executor
    assert extern_targets(path) == ["sdm::write_read_"], extern_targets(path)
    check_lengths(layer, torch._inductor.aoti_load_package(path), "cpu", 1e-5)


LOAD_AND_RUN = """
import sys, torch, sdm_inductor
loaded = torch._inductor.aoti_load_package(sys.argv[1])
for T in (24, 37, 70):
    x = torch.load(sys.argv[2] + f"/x{T}.pt")
    torch.save(loaded(x).cpu(), sys.argv[2] + f"/y{T}.pt")
"""


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and the sdm Triton kernels")
@pytest.mark.cuda
@pytest.mark.compile
@pytest.mark.parametrize("emit", ["aot", "never"])
def test_aoti_cuda_dynamic_length(tmp_path, monkeypatch, emit):
    """Loaded in a fresh process (as a deployment would, after ``import sdm_inductor``).
    By default (``EMIT_KERNELS="aot"``) the package carries the SDM kernels and calls no
    sdm op; with ``"never"`` it calls the eager gated op (whose prep kernel computes the
    gates) through the proxy executor."""
    import subprocess
    import sys
    monkeypatch.setattr(lowering, "EMIT_KERNELS", emit)
    layer = make_layer("cuda")
    _, path = package(layer, "cuda", tmp_path / "sdm_cuda.pt2")
    with zipfile.ZipFile(path) as z:
        cubins = [n for n in z.namelist() if n.endswith((".cubin", ".hsaco", ".spv"))]
    sdm_calls = [t for t in extern_targets(path) if t.startswith("sdm::")]
    if emit == "aot":
        assert not sdm_calls and cubins, (sdm_calls, cubins)
    else:
        assert sdm_calls == ["sdm::write_read_gated"], sdm_calls
    # seeded: a failure reproduces with the same inputs
    xs = {T: torch.randn(2, T, 32, generator=torch.Generator().manual_seed(T)).cuda()
          for T in (24, 37, 70)}
    for T, x in xs.items():
        torch.save(x, tmp_path / f"x{T}.pt")
    res = subprocess.run([sys.executable, "-c", LOAD_AND_RUN, str(path), str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    if res.returncode < 0 and aoti_runtime_failure("cuda"):
        pytest.xfail(aoti_runtime_failure("cuda"))   # the control package dies too
    assert res.returncode == 0, f"rc {res.returncode}\n{res.stdout}\n{res.stderr[-3000:]}"
    for T, x in xs.items():
        with torch.no_grad():
            want = layer(x).cpu()
        got = torch.load(tmp_path / f"y{T}.pt")
        assert got.shape == want.shape == (2, T, 32)
        assert rel_err(got, want) < 1e-4, (T, rel_err(got, want))


def test_aoti_runs_the_kernels_ahead_on_the_example_inputs():
    """AOTInductor runs each kernel once before writing its C++ wrapper, by default on
    made-up buffers (random floats, zero integers, never-computed sort outputs); the SDM
    kernels index rows through such buffers and fault there (8 of 20 CUDA builds). The
    lowerings switch that run to the arguments the example inputs give each kernel."""
    assert torch._inductor.config.triton.autotune_with_sample_inputs is True


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and the sdm Triton kernels")
@pytest.mark.cuda
@pytest.mark.compile
def test_aoti_cuda_single_stream_serves_both_sides_of_a_chunk(tmp_path):
    """One stream (P = 1): the traced Phase 1's per-chunk tensors then have the chunk count
    as a dimension, and tracing asks whether it is 1 (a contiguity check), which an
    AOTInductor package cannot re-ask at run time. Built at 3 chunks, the package must
    still compute right at one chunk, at a chunk's exact length and beyond."""
    def inputs(T):
        return tuple(x.cuda() for x in make_inputs(P=1, T=T, W=4, R=4, hd=16,
                                                   slots_per_stream=64, seed=T))
    mod = FunctionalWriteRead(chunk_size=16, slots_per_stream=64)
    with torch.no_grad():
        ep = torch.export.export(mod, inputs(40),
                                 dynamic_shapes=(None,) + ({1: torch.export.Dim.DYNAMIC},) * 7)
        with torch._inductor.config.patch(force_disable_caches=True):
            path = torch._inductor.aoti_compile_and_package(
                ep, package_path=str(tmp_path / "single.pt2"))
    loaded = torch._inductor.aoti_load_package(path)
    for T in (5, 16, 17, 40, 70):
        ins = inputs(T)
        with torch.no_grad():
            got = loaded(*ins)
            want = mod(*ins)
        for a, b, what in zip(got, want, ("readings", "final bank")):
            assert a.shape == b.shape, (T, what, a.shape, b.shape)
            assert rel_err(a, b) < 1e-5, (T, what, rel_err(a, b))
