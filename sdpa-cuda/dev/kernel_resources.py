#!/usr/bin/env python3
"""Registers, stack and spills of two versions of one kernel module, without a GPU.

Compiles OLD.cu and NEW.cu (every .cuh header beside each is handed to NVRTC) with NVRTC for sm_90, the options of
src/nvrtc.rs, and prints per entry point: registers, stack bytes, instructions, local-memory loads/stores
(spills), and the spills between the first and the last tensor-core instruction (the main loop of the
mma kernels). A change that leaves the main loop's spills and length alone cannot slow the loop down; one
that does not needs a timing run on the device.

    CUDA_HOME=target/cuda-pip/nvidia/cu13 NVDISASM=/path/to/nvdisasm \\
        python3 sdpa-cuda/dev/kernel_resources.py old/tf32.cu sdpa-cuda/kernels/tf32.cu 'tf32x3_f32_64'

SDPA_ARCH=sm_90a compiles for the arch-specific target (the wgmma module, whose code exists only there; its
main loop is not found by the HMMA-based loop detection, so read the whole-entry columns).

The kernel families define no entry points of their own (each is one NVRTC program in the crate): set
SDPA_INSTANTIATE to a file of the instantiation lines to append to both sources, as the launchers write them
(`cargo run -q -p sdpa-cuda --example programs | grep '^tf32x3_f32_64' | cut -f3 > lines.cu`).

NVRTC and the headers: the pip packages CI installs (`.ci/run`); cuobjdump and nvdisasm: the pip packages
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm (13.2 or newer read sm_90 code from NVRTC 13.0).
"""
import ctypes, os, re, shutil, subprocess, sys, tempfile

HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")
# sm_90a for the wgmma module (tf32_wgmma.cu), whose code exists only there.
ARCH = os.environ.get("SDPA_ARCH", "sm_90")


def nvrtc():
    for d in ("lib", "lib64"):
        p = os.path.join(HOME, d, "libnvrtc.so.13")
        if os.path.exists(p):
            return ctypes.CDLL(p)
    sys.exit(f"no libnvrtc.so.13 under {HOME} (set CUDA_HOME; LD_LIBRARY_PATH must reach its builtins)")


def cubin(src_path, out_path):
    lib = nvrtc()
    kdir = os.path.dirname(src_path)
    hdrs = sorted(h for h in os.listdir(kdir or ".") if h.endswith(".cuh"))
    prog = ctypes.c_void_p()
    H = (ctypes.c_char_p * len(hdrs))(*[open(os.path.join(kdir, h), "rb").read() for h in hdrs])
    N = (ctypes.c_char_p * len(hdrs))(*[h.encode() for h in hdrs])
    src = open(src_path, "rb").read()
    if os.environ.get("SDPA_INSTANTIATE"):
        src += b"\n" + open(os.environ["SDPA_INSTANTIATE"], "rb").read()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"m.cu", len(hdrs), H, N):
        sys.exit("nvrtcCreateProgram failed")
    opts = [b"--std=c++17", b"-default-device", b"--gpu-architecture=" + ARCH.encode(),
            b"--include-path=" + os.path.join(HOME, "include").encode()]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    if rc:
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, log)
        sys.exit(f"{src_path}: NVRTC failed\n{log.value.decode()[:4000]}")
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetCUBIN(prog, buf)
    open(out_path, "wb").write(buf.raw)


def cuobjdump(args, path):
    tool = shutil.which("cuobjdump") or sys.exit("cuobjdump not on PATH")
    env = dict(os.environ)
    if "NVDISASM" in os.environ:
        env["NVDISASM_PATH"] = os.path.dirname(os.environ["NVDISASM"])
    return subprocess.run([tool, *args, path], capture_output=True, text=True, env=env, check=True).stdout


def sections(text, header):
    """(function, line) for each line after a line matching `header` (whose group 1 names the function), and
    (function, None) at the header itself."""
    fn = None
    for line in text.splitlines():
        m = re.search(header, line)
        if m:
            fn = m.group(1)
            yield fn, None
        elif fn:
            yield fn, line


def resources(path):
    out = {}
    for fn, line in sections(cuobjdump(["-res-usage"], path), r"Function (\S+):"):
        if line and "REG:" in line and fn not in out:
            out[fn] = dict((k, int(v)) for k, v in re.findall(r"(REG|STACK):(\d+)", line))
    return out


def opcodes(path):
    out = {}
    for fn, line in sections(cuobjdump(["-sass"], path), r"Function : (\S+)"):
        ops = out.setdefault(fn, [])
        m = line and re.search(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            ops.append(m.group(1))
    return out


def spills(ops):
    return sum(1 for x in ops if x.startswith(("LDL", "STL")))


def loop_spills(ops):
    idx = [i for i, x in enumerate(ops) if x.startswith("HMMA")]
    return spills(ops[idx[0]:idx[-1]]) if idx else None


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    pat = sys.argv[3] if len(sys.argv) > 3 else ""
    with tempfile.TemporaryDirectory() as tmp:
        paths = [os.path.join(tmp, "old.cubin"), os.path.join(tmp, "new.cubin")]
        for src, dst in zip(sys.argv[1:3], paths):
            cubin(src, dst)
        (ro, rn), (so, sn) = [resources(p) for p in paths], [opcodes(p) for p in paths]
    print(f"{'entry':34} {'regs':>9} {'stack':>9} {'instructions':>13} {'spill ops':>10} {'in the loop':>12}")
    for fn in sorted(set(ro) & set(rn)):
        if not re.search(pat, fn) or fn.startswith("$"):
            continue
        a, b = so.get(fn, []), sn.get(fn, [])
        print(f"{fn:34} {ro[fn]['REG']:>4}->{rn[fn]['REG']:<4} {ro[fn]['STACK']:>4}->{rn[fn]['STACK']:<4} "
              f"{len(a):>6}->{len(b):<6} {spills(a):>4}->{spills(b):<5} {str(loop_spills(a)):>5}->{loop_spills(b)}")


if __name__ == "__main__":
    main()
