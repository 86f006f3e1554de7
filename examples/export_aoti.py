"""torch.export with a dynamic sequence length -> AOTInductor package -> reload in a
fresh process -> the same outputs.

    python examples/export_aoti.py            # a 2-layer SDM model
    python examples/export_aoti.py --small    # CI size

    python examples/export_aoti.py --seed 3   # other weights, inputs and lengths
    python examples/export_aoti.py --keep-failed DIR   # on a mismatch, keep the package

On a mismatch the example also prints what the package holds (its files and sizes) and its
error when rerun with the model's parameters loaded as its constants (whether the constants
it baked in differ), and with ``--keep-failed`` (default: ``$SDM_AOTI_KEEP_FAILED``) copies
the package and its inputs there, so that a failing build can be taken apart and diffed
against a passing one.

The package calls the op through AOTInductor's proxy executor, which finds
``torch.ops.sdm.*`` through the dispatcher: the op is implemented in Python, so the
process that loads the package must ``import sdm_inductor`` first (``--without-import``
shows the error otherwise). The loading process here is a fresh interpreter that knows
nothing of the model but the package file.

The comparison is routing-aware. The layer picks its slots by top-k over scores; the
package computes those scores with Inductor's kernels, which round differently from
eager's (~1e-7 relative), so where two candidates are that close the two can pick
different slots, and the readings of that token and of every later token that reads
the slot differ by far more than rounding. The exported model therefore also returns
every layer's chosen slots. Where the package chose eager's slots everywhere, its
outputs must equal eager's to 1e-5; a differing choice passes only where eager's own
scores are a near tie there (the chosen and the first unchosen candidate within
``TIE`` of each other), and is reported as such; anything else is a MISMATCH.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn


# a differing slot choice is a near tie when eager's scores of the chosen and the first
# unchosen candidate differ by less than this (scores are O(1); the package's rounding
# moves them by ~1e-7)
TIE = 1e-5


def routed_layer_class():
    """``SparseDeltaMemory`` that also keeps the slots its addressing chose in this
    forward (``routes``) and, when ``margins`` is set, how close each choice was."""
    from sdm_inductor.nn import SparseDeltaMemory

    class RoutedSDM(SparseDeltaMemory):
        routes: list
        margins: list | None = None

        def _address(self, z):
            slot, weights = super()._address(z)
            self.routes.append(slot)
            if self.margins is not None:
                self.margins.append(self._margin(z))
            return slot, weights

        def _margin(self, z):
            """Per token and head: the smallest gap between a chosen and the first
            unchosen candidate, over the two sub-key top-k and the pair top-k of the
            scores ``_address`` ranks."""
            kk, k = self.sub_top_k, self.top_k
            s = self._sub_scores(z).sort(dim=-1, descending=True).values
            gaps = []
            if kk < s.shape[-1]:
                gaps.append((s[..., kk - 1] - s[..., kk]).amin(-1))
            s1, s2 = s[..., 0, :kk], s[..., 1, :kk]
            pair = (s1[..., :, None] + s2[..., None, :]).flatten(-2).sort(-1, descending=True).values
            if k < pair.shape[-1]:
                gaps.append(pair[..., k - 1] - pair[..., k])
            return torch.stack(gaps).amin(0) if gaps else torch.full(s.shape[:3], float("inf"))

    return RoutedSDM


class SDMModel(nn.Module):
    """Residual SDM layers on a ``[B, T, d_model]`` input; returns the output and every
    layer's chosen write and read slots (``[B, T, H, top_k]`` each, in call order)."""

    def __init__(self, d_model: int, layers: int, **sdm_kwargs):
        super().__init__()
        layer = routed_layer_class()
        self.blocks = nn.ModuleList(layer(d_model, **sdm_kwargs) for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(layers))

    def forward(self, x):
        routes = []
        for norm, block in zip(self.norms, self.blocks):
            block.routes = routes
            x = x + block(norm(x))
        return (x, *routes)

    def margins(self, x):
        """Eager's routing margins for ``x``, in the order of the routes."""
        out = []
        for block in self.blocks:
            block.margins = out
        try:
            with torch.no_grad():
                self(x)
        finally:
            for block in self.blocks:
                block.margins = None
        return out


def load_and_run(package: str, data: str, out: str, import_sdm: bool,
                 constants: str | None = None) -> None:
    """The fresh process: load the package, run it on every saved input, save outputs.
    ``constants``: a saved state dict whose tensors replace the package's own constants."""
    if import_sdm:
        import sdm_inductor  # noqa: F401  registers torch.ops.sdm.* for the proxy executor
    t0 = time.perf_counter()
    runner = torch._inductor.aoti_load_package(package)
    t_load = time.perf_counter() - t0
    if constants:
        state = torch.load(constants)
        runner.load_constants({k: state[k] for k in runner.get_constant_fqns() if k in state},
                              check_full_update=False)
    inputs = torch.load(data)
    t0 = time.perf_counter()
    with torch.no_grad():
        outputs = [runner(x) for x in inputs]
    torch.save({"outputs": outputs, "load_s": t_load, "run_s": time.perf_counter() - t0}, out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="CI size")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0,
                    help="seeds the weights and inputs, and moves the lengths")
    ap.add_argument("--keep-failed", metavar="DIR", default=os.environ.get("SDM_AOTI_KEEP_FAILED"),
                    help="on a mismatch, copy the package and its inputs into DIR")
    ap.add_argument("--without-import", action="store_true",
                    help="also try loading in a process that does not import sdm_inductor")
    ap.add_argument("--load", nargs=3, metavar=("PACKAGE", "INPUTS", "OUTPUTS"), help=argparse.SUPPRESS)
    ap.add_argument("--no-import", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--constants", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.load:
        return load_and_run(*args.load, import_sdm=not args.no_import, constants=args.constants)

    import sdm_inductor  # noqa: F401
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    if args.small:
        d, layers, sdm = 32, 1, dict(num_heads=2, slots_per_head=16, top_k=4, key_dim=8, chunk_size=16)
        lengths = (20, 3, 45)
    else:
        d, layers, sdm = 64, 2, dict(num_heads=4, slots_per_head=256, top_k=8, output_gate=True)
        lengths = (100, 1, 37, 300)
    lengths = tuple(t + (7 * args.seed) % 23 for t in lengths)
    model = SDMModel(d, layers, **sdm).to(dev).eval()
    example = torch.randn(2, lengths[0], d, device=dev)

    # Dim.DYNAMIC: torch 2.11 cannot prove min(a*T, b*T) guards for a named Dim
    T = torch.export.Dim.DYNAMIC
    t0 = time.perf_counter()
    with torch.no_grad():
        ep = torch.export.export(model, (example,), dynamic_shapes={"x": {1: T}})
    t_export = time.perf_counter() - t0
    sdm_calls = sorted({str(n.target) for n in ep.graph.nodes if "sdm" in str(n.target)})
    print(f"exported with dynamic T; sdm ops in the graph: {sdm_calls}")

    with tempfile.TemporaryDirectory() as tmp:
        package = os.path.join(tmp, "sdm_model.pt2")
        t0 = time.perf_counter()
        with torch.no_grad():
            torch._inductor.aoti_compile_and_package(ep, package_path=package)
        t_compile = time.perf_counter() - t0
        print(f"torch.export {t_export:.1f}s, AOTInductor compile+package {t_compile:.1f}s "
              f"({os.path.getsize(package) / 1e6:.2f} MB)")

        inputs = [torch.randn(2, t, d, device=dev) for t in lengths]
        with torch.no_grad():
            expected = [model(x) for x in inputs]
        data, out = os.path.join(tmp, "inputs.pt"), os.path.join(tmp, "outputs.pt")
        torch.save(inputs, data)
        subprocess.run([sys.executable, os.path.abspath(__file__), "--load", package, data, out],
                       check=True)
        got = torch.load(out)
        print(f"fresh process: load {got['load_s']:.1f}s, ran T = {list(lengths)} in {got['run_s']:.2f}s")
        worst, flips = 0.0, 0
        for x, y, y0 in zip(inputs, got["outputs"], expected):
            err, n_flips = compare(model, x, y, y0)
            worst, flips = max(worst, err), flips + n_flips

        if args.without_import:
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--load", package, data,
                                out, "--no-import"], capture_output=True, text=True)
            last = (r.stderr.strip().splitlines() or ["(no error)"])[-1]
            print(f"loading without `import sdm_inductor`: exit {r.returncode}: {last[:300]}")
        if worst > 1e-5:
            describe(package)
            with_constants(model, package, data, expected, tmp)
            if args.keep_failed:
                keep(args.keep_failed, package, data, args.seed)

    if worst > 1e-5:
        if dev.type != "cpu":
            blame(model, inputs, expected, got["outputs"])
        raise SystemExit(f"MISMATCH: the reloaded package differs from eager (worst rel err {worst:.2e})")
    if flips:
        print(f"OK: the AOTInductor package reloaded in a fresh process gives the eager outputs "
              f"wherever eager's routing is not a near tie ({flips} near-tie slot choices "
              f"differ, each within {TIE:g} of the next candidate)")
        return worst
    print("OK: the AOTInductor package reloaded in a fresh process gives the eager outputs")
    return worst


def rel_err(a, b) -> float:
    """``sdm_inductor.testing.rel_err`` (a NaN never passes) with ``a`` moved to ``b``'s
    device (imported here: the ``--no-import`` loading process must not import it)."""
    from sdm_inductor.testing import rel_err as rel
    return rel(a.to(b.device), b)


def describe(package: str) -> None:
    """The package's files and sizes, largest first (kernels, wrapper, constants)."""
    import zipfile
    with zipfile.ZipFile(package) as z:
        files = sorted(z.infolist(), key=lambda i: -i.file_size)
    print(f"package: {len(files)} files, {sum(i.file_size for i in files) / 1e6:.2f} MB")
    for i in files:
        print(f"  {i.file_size:>9d}  {i.filename}")


def with_constants(model, package, data, expected, tmp) -> None:
    """The package rerun in a fresh process with the model's parameters loaded as its
    constants: whether the constants it baked in are what differs."""
    state, out = os.path.join(tmp, "state.pt"), os.path.join(tmp, "outputs_constants.pt")
    torch.save(model.state_dict(), state)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--load", package, data, out,
                        "--constants", state], capture_output=True, text=True)
    if r.returncode:
        print(f"rerun with the model's parameters as constants failed: {r.stderr[-300:]}")
        return
    got = torch.load(out)["outputs"]
    errs = ", ".join(f"{rel_err(y[0], y0[0]):.2e}" for y, y0 in zip(got, expected))
    print(f"the package rerun with the model's parameters as its constants: rel err vs eager {errs}")


def keep(folder: str, package: str, data: str, seed: int) -> None:
    import shutil
    os.makedirs(folder, exist_ok=True)
    for src, name in ((package, f"failed_seed{seed}.pt2"), (data, f"failed_seed{seed}_inputs.pt")):
        shutil.copy(src, os.path.join(folder, name))
    print(f"kept the package and its inputs in {folder}")


def compare(model, x, got, want) -> tuple[float, int]:
    """(relative error that counts, near-tie slot choices that differ) of the package's
    outputs ``got`` against eager's ``want`` (``(y, *routes)``) for input ``x``.

    Where every route agrees, the whole output counts. Otherwise the first layer whose
    routes differ must differ only at near ties of eager's scores (a layer's routing
    reads only its own input token, so that layer's differences are where the rounding
    decided; later layers see inputs changed by it), and the output counts for the tokens
    before the first differing choice (a slot choice changes its token and later ones
    only). Anything else is reported as an infinite error."""
    y, y0 = got[0].to(want[0].device), want[0]
    t = x.shape[1]
    if y.shape != y0.shape:  # a package that baked in the traced length
        print(f"  T={t:4d}: output {list(y.shape)}, expected {list(y0.shape)}")
        return float("inf"), 0
    err = rel_err(y, y0)
    # the chosen slots as sets: candidates that swap places inside the top-k change only
    # the order of a token's sum
    differ = [(a.to(b.device).sort(-1).values != b.sort(-1).values).any(-1)   # [B, T, H]
              for a, b in zip(got[1:], want[1:])]
    n = int(sum(d.sum() for d in differ))
    if n == 0:
        print(f"  T={t:4d}: output {list(y.shape)}, rel err vs eager {err:.2e}")
        return err, 0
    first = next(i for i, d in enumerate(differ) if d.any()) // 2 * 2   # k and q of a layer
    margins = model.margins(x)
    gap = max(float(margins[i][differ[i]].max()) for i in (first, first + 1) if differ[i].any())
    t_first = min(int(d.any(-1).any(0).nonzero()[0]) for d in differ if d.any())
    prefix = rel_err(y[:, :t_first], y0[:, :t_first]) if t_first else 0.0
    print(f"  T={t:4d}: output {list(y.shape)}, {n} (token, head) slot choices differ from "
          f"eager's, first in layer {first // 2} at token {t_first}; eager's largest score gap "
          f"there {gap:.1e} (near tie below {TIE:g}); rel err vs eager before it {prefix:.2e}, "
          f"whole output {err:.2e}")
    return (prefix, n) if gap < TIE else (float("inf"), n)


def blame(model, inputs, eager, package):
    """On a mismatch off the CPU: both sides against the same model run on the CPU (the CPU
    implementation), so the report says which side computed differently."""
    import copy
    cpu = copy.deepcopy(model).cpu()
    with torch.no_grad():
        for x, y_eager, y_pkg in zip(inputs, eager, package):
            ref = cpu(x.cpu())[0]
            if y_pkg[0].shape != ref.shape:
                continue
            print(f"  T={x.shape[1]:4d}: against the CPU: eager {rel_err(y_eager[0], ref):.2e}, "
                  f"package {rel_err(y_pkg[0], ref):.2e}")


if __name__ == "__main__":
    main()
