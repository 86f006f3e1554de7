"""Device diagnostics, AOTI load crash (issue 4): which loading routes survive on the
device image? A plain nn.Linear CPU package: loaded in the compiling process, in a fresh
process through the package loader, and in a fresh process through the bare model-container
runner on the extracted .so; plus the toolchain facts (compiler, ABI, linked libraries)."""
import os, subprocess, sys, tempfile, zipfile, shutil
import torch

OUT = os.environ.get("OUT", "/tmp/out")
LOAD_PKG = r"""
import faulthandler, sys, torch
faulthandler.enable()
if sys.argv[2] == "cuda": torch.zeros(1, device="cuda")
m = torch._inductor.aoti_load_package(sys.argv[1])
print("ok", m(torch.randn(4, 8, device=sys.argv[2])).sum().item())
"""
LOAD_SO = r"""
import faulthandler, sys, torch
faulthandler.enable()
dev = sys.argv[2]
cls = torch._C._aoti.AOTIModelContainerRunnerCpu if dev == "cpu" else torch._C._aoti.AOTIModelContainerRunnerCuda
r = cls(sys.argv[1], 1)
print("ok", r.run([torch.randn(4, 8, device=dev)])[0].sum().item())
"""


def sh(cmd):
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=120)
    print(f"$ {cmd}\n{(r.stdout + r.stderr).strip()[-1500:]}")


def fresh(code, *args):
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                       timeout=180)
    tail = (r.stdout + r.stderr).strip().splitlines()
    print("  rc", r.returncode, *tail[-8:], sep="\n  ")


def main():
    print("torch", torch.__version__, "cxx11abi", torch._C._GLIBCXX_USE_CXX11_ABI)
    sh("which g++ gcc c++ gdb; g++ --version | head -1; ldd --version | head -1")
    from torch._inductor import config as icfg
    print("cpp.cxx", icfg.cpp.cxx)
    for dev in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
        tmp = tempfile.mkdtemp()
        model = torch.nn.Linear(8, 8).to(dev).eval()
        x = torch.randn(4, 8, device=dev)
        with torch.no_grad():
            ep = torch.export.export(model, (x,))
            pkg = os.path.join(tmp, "p.pt2")
            torch._inductor.aoti_compile_and_package(ep, package_path=pkg)
            print(f"[{dev}] same process, aoti_load_package:", flush=True)
            try:
                m = torch._inductor.aoti_load_package(pkg)
                print("  ok", (m(x) - model(x)).abs().max().item())
            except Exception as e:  # noqa: BLE001
                print("  raised", type(e).__name__, str(e)[:300])
        print(f"[{dev}] fresh process, aoti_load_package:", flush=True)
        fresh(LOAD_PKG, pkg, dev)
        with zipfile.ZipFile(pkg) as z:
            names = z.namelist()
            print("  package:", [n for n in names if n.endswith((".so", ".json", ".wrapper.cpp"))])
            z.extractall(tmp)
        sos = [os.path.join(tmp, n) for n in names if n.endswith(".so")]
        for so in sos:
            sh(f"ldd {so} | head -20")
            print(f"[{dev}] fresh process, bare container runner on {os.path.basename(so)}:", flush=True)
            fresh(LOAD_SO, so, dev)
        if shutil.which("gdb"):
            print(f"[{dev}] gdb backtrace of the fresh-process package load:")
            script = os.path.join(tmp, "load_pkg.py")
            open(script, "w").write(LOAD_PKG)
            sh(f"gdb -batch -ex run -ex bt --args {sys.executable} {script} {pkg} {dev} 2>&1 | tail -40")


main()
