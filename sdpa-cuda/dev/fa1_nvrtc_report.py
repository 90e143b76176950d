"""Compiles kernels/fa1.cu with NVRTC (no GPU needed) and prints ptxas's resource report per entry point:
registers, spills, stack frame, shared memory. Used to choose tile shapes before spending device time.

    CUDA_HOME=<dir with lib/libnvrtc.so.13 and include/> python3 sdpa-cuda/dev/fa1_nvrtc_report.py [sm_90] [-DX=Y ...]

fa1.cu defines no entry points of its own (each is one NVRTC program in the crate): the SIMT instantiations
the launcher writes are appended here (`cargo run -q -p sdpa-cuda --example programs` prints them); set
SDPA_INSTANTIATE to a file of other lines to report those instead.
"""
import ctypes
import os
import re
import sys

home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
lib = None
for cand in ("lib/libnvrtc.so.13", "lib64/libnvrtc.so.13", "lib/libnvrtc.so", "lib64/libnvrtc.so"):
    path = os.path.join(home, cand)
    if os.path.exists(path):
        lib = ctypes.CDLL(path)
        break
if lib is None:
    sys.exit(f"no libnvrtc under {home}")
here = os.path.dirname(os.path.abspath(__file__))
kdir = os.path.join(here, "..", "kernels")
src = open(os.path.join(kdir, "fa1.cu")).read()
if os.environ.get("SDPA_INSTANTIATE"):
    src += "\n" + open(os.environ["SDPA_INSTANTIATE"]).read()
else:
    for dt, t in (("f32", "float"), ("f16", "__half"), ("bf16", "__nv_bfloat16")):
        for d in (32, 64, 80, 96, 128, 256):
            src += f"\nFA1_FIXED(fa1_{dt}_{d}, {t}, {d})\nFA1_TILED(fa1t_{dt}_{d}, {t}, {d})"
        src += f"\nFA1_GENERIC(fa1_{dt}, {t})"
src = src.encode()
common = open(os.path.join(kdir, "common.cuh")).read().encode()
arch = next((a for a in sys.argv[1:] if a.startswith("sm_")), "sm_90")
defs = [a for a in sys.argv[1:] if a.startswith("-D")]

prog = ctypes.c_void_p()
hdrs = (ctypes.c_char_p * 1)(common)
names = (ctypes.c_char_p * 1)(b"common.cuh")
assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"fa1.cu", 1, hdrs, names) == 0
opts = ["--std=c++17", "-default-device", "-lineinfo", f"--gpu-architecture={arch}",
        f"-I{os.path.join(home, 'include')}", "--ptxas-options=-v"] + defs
copts = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
rc = lib.nvrtcCompileProgram(prog, len(opts), copts)
n = ctypes.c_size_t()
lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
buf = ctypes.create_string_buffer(n.value)
lib.nvrtcGetProgramLog(prog, buf)
log = buf.value.decode(errors="replace")
if rc != 0:
    print(log)
    sys.exit(f"nvrtc failed rc={rc}")
fn = None
for line in log.splitlines():
    m = re.search(r"Compiling entry function '(\w+)'", line)
    if m:
        fn = m.group(1)
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and fn:
        stack, st, ld = m.groups()
    m = re.search(r"Used (\d+) registers", line)
    if m and fn:
        print(f"{fn:24} regs {m.group(1):>4}  stack {stack:>5}  spill st/ld {st}/{ld}")
        fn = None
