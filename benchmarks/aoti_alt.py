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


def one(dev, cxx):
    """Build a plain Linear package on ``dev`` with compiler ``cxx`` and load it every way;
    the in-process load last, as a crash there ends the script."""
    from torch._inductor import config as icfg
    tmp = tempfile.mkdtemp()
    model = torch.nn.Linear(8, 8).to(dev).eval()
    x = torch.randn(4, 8, device=dev)
    pkg = os.path.join(tmp, "p.pt2")
    with torch.no_grad(), icfg.patch({"cpp.cxx": (None, cxx), "force_disable_caches": True}):
        ep = torch.export.export(model, (x,))
        torch._inductor.aoti_compile_and_package(ep, package_path=pkg)
    print(f"[{dev}, {cxx}] fresh process, aoti_load_package:", flush=True)
    fresh(LOAD_PKG, pkg, dev)
    with zipfile.ZipFile(pkg) as z:
        names = z.namelist()
        z.extractall(tmp)
    for so in [os.path.join(tmp, n) for n in names if n.endswith(".so")]:
        sh(f"ldd {so} | grep -i 'std\\|gcc\\|not found'")
        print(f"[{dev}, {cxx}] fresh process, bare container runner:", flush=True)
        fresh(LOAD_SO, so, dev)
    if shutil.which("gdb") and cxx == DEFAULT:
        script = os.path.join(tmp, "load_pkg.py")
        open(script, "w").write(LOAD_PKG)
        sh(f"gdb -batch -ex run -ex bt --args {sys.executable} {script} {pkg} {dev} 2>&1 "
           "| grep -v Detaching | tail -25")
    return pkg


def main():
    """``aoti_alt.py [CXX [DEVICE ...]]``: only that compiler and those devices (default:
    the image's compiler and /usr/bin/g++, CPU and CUDA)."""
    print("torch", torch.__version__, "cxx11abi", torch._C._GLIBCXX_USE_CXX11_ABI,
          "cpp.cxx", DEFAULT, "CXX", os.environ.get("CXX"))
    sh(f"which g++ gdb; g++ --version | head -1; {DEFAULT} --version | head -1; cat {DEFAULT} | head -12")
    cxxs = [sys.argv[1]] if len(sys.argv) > 1 else list(dict.fromkeys([DEFAULT, "/usr/bin/g++"]))
    devs = sys.argv[2:] or (["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    pkgs = [one(dev, cxx) for cxx in cxxs for dev in devs]
    print("same process, aoti_load_package (last pkg):", flush=True)
    torch._inductor.aoti_load_package(pkgs[-1])
    print("  ok")


from torch._inductor import config as _icfg  # noqa: E402
DEFAULT = _icfg.cpp.cxx[1]
main()
