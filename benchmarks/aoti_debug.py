"""Device diagnostics for the AOTInductor CUDA package (issue 4): build the test's package,
keep its sources under $OUT, then load and run it in a fresh process with faulthandler,
step by step, so a crash names where it happens."""
import faulthandler, os, subprocess, sys, zipfile
faulthandler.enable()
import torch
import sdm_inductor  # noqa: F401
from sdm_inductor.nn import SparseDeltaMemory

OUT = os.environ.get("OUT", "/tmp/out")
STEP = r"""
import faulthandler, sys, torch
faulthandler.enable()
import sdm_inductor
print("loading", flush=True)
loaded = torch._inductor.aoti_load_package(sys.argv[1])
print("loaded", flush=True)
for T in (24, 37, 70):
    x = torch.randn(2, T, 32, device="cuda")
    print("run T", T, flush=True)
    y = loaded(x); torch.cuda.synchronize()
    print("ok T", T, tuple(y.shape), flush=True)
"""

def main():
    torch.manual_seed(0)
    layer = SparseDeltaMemory(32, num_heads=2, slots_per_head=16, top_k=4, key_dim=8,
                              output_gate=True, chunk_size=16, device="cuda").eval()
    x = torch.randn(2, 24, 32, device="cuda")
    static = len(sys.argv) > 1 and sys.argv[1] == "static"
    dyn = None if static else ({1: torch.export.Dim.DYNAMIC},)
    with torch.no_grad():
        ep = torch.export.export(layer, (x,), dynamic_shapes=dyn)
        path = os.path.join(OUT, "static.pt2" if static else "dyn.pt2")
        with torch._inductor.config.patch(force_disable_caches=True):
            torch._inductor.aoti_compile_and_package(ep, package_path=path)
    with zipfile.ZipFile(path) as z:
        for n in z.namelist():
            print(n, z.getinfo(n).file_size)
            if n.endswith((".cpp", ".h", ".json")) or "wrapper" in n:
                dst = os.path.join(OUT, "src", os.path.basename(n))
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                open(dst, "wb").write(z.read(n))
    r = subprocess.run([sys.executable, "-c", STEP, path], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, AOTI_RUNTIME_CHECK_INPUTS="1"))
    print("fresh process rc", r.returncode)
    print(r.stdout[-3000:]); print(r.stderr[-6000:])

CONTROL_LOAD = r"""
import faulthandler, sys, torch
faulthandler.enable()
if sys.argv[2] == "import": import sdm_inductor
print("loading", sys.argv[1], sys.argv[2], flush=True)
loaded = torch._inductor.aoti_load_package(sys.argv[1])
print("loaded", flush=True)
"""


def control(sdm_package=None):
    """Is the load-time crash ours? A package of a plain Linear model through the same
    toolchain, loaded in a fresh process; and the sdm package loaded without the import."""
    m = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU()).cuda().eval()
    x = torch.randn(4, 32, device="cuda")
    with torch.no_grad():
        ep = torch.export.export(m, (x,))
        path = os.path.join(OUT, "plain.pt2")
        with torch._inductor.config.patch(force_disable_caches=True):
            torch._inductor.aoti_compile_and_package(ep, package_path=path)
    runs = [(path, "noimport"), (path, "import")]
    if sdm_package:
        runs += [(sdm_package, "noimport")]
    for pkg, imp in runs:
        r = subprocess.run([sys.executable, "-c", CONTROL_LOAD, pkg, imp], capture_output=True,
                           text=True, timeout=120)
        print(f"{os.path.basename(pkg)} {imp}: rc {r.returncode}", r.stdout.strip().splitlines()[-1:],
              r.stderr.strip().splitlines()[-3:])


if len(sys.argv) > 1 and sys.argv[1] == "control":
    control(sys.argv[2] if len(sys.argv) > 2 else None)
else:
    main()
