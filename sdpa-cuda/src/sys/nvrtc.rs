//! Run-time compilation of kernel programs ([`Program`]: one instantiation, or a whole small module) with
//! NVRTC, straight to a CUBIN for one real architecture.
//!
//! The registered headers ([`crate::sys::modules::HEADERS`], `common.cuh` first) and, for an instantiation, its
//! family's `.cu` are handed to NVRTC in memory, so `#include "common.cuh"` works without files;
//! the CUDA headers (`cuda_fp16.h`, `cuda_bf16.h`) come from [`crate::sys::libs::include_dir`]. The compiler log
//! is kept whole in [`CudaError::Compile`]. Needs no GPU: CI compiles every instantiation for sm_80 and sm_90.

use crate::error::CudaError;
use crate::sys::libs;
use crate::sys::modules::{ModuleSource, HEADERS};
use crate::sys::program::Program;
use cudarc::nvrtc::sys;
use std::ffi::{CStr, CString};

/// Options every program is compiled with (besides the architecture and include path). Part of the cache
/// key.
pub const BASE_OPTIONS: &[&str] = &["--std=c++17", "-default-device"];

/// Whether `SDPA_CUDA_LINEINFO=1` asks for `-lineinfo` (source lines for compute-sanitizer and ncu, no
/// run-time cost). Off by default: it made an `fa2` instantiation's compile about 10 % slower and its image
/// 3.8x larger (0.91 s / 274 KB against 0.79 s / 73 KB, NVRTC 13.0 on the 2-core build machine).
pub fn lineinfo_requested() -> bool {
    std::env::var_os("SDPA_CUDA_LINEINFO").is_some_and(|v| v == "1")
}

/// A compiled module image and what produced it.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The CUBIN bytes.
    pub cubin: Vec<u8>,
    /// The compiler log (warnings), possibly empty.
    pub log: String,
}

fn status(r: sys::nvrtcResult) -> String {
    // SAFETY: nvrtcGetErrorString returns a pointer to a static NUL-terminated string for any status.
    let p = unsafe { sys::nvrtcGetErrorString(r) };
    if p.is_null() {
        format!("{r:?}")
    } else {
        // SAFETY: non-null, static, NUL-terminated (see above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// NVRTC's version `(major, minor)`.
pub fn version() -> Result<(i32, i32), CudaError> {
    libs::ensure_nvrtc().map_err(|e| CudaError::Library(format!("NVRTC unavailable: {e}")))?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-pointers.
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(CudaError::Library(format!("nvrtcVersion failed: {}", status(r))));
    }
    Ok((major, minor))
}

/// The full option list for `arch` ("sm_90"), `include` dir and the module's extra options.
pub fn options(arch: &str, include: Option<&str>, module: &ModuleSource) -> Vec<String> {
    let mut opts: Vec<String> = BASE_OPTIONS.iter().map(|s| s.to_string()).collect();
    if lineinfo_requested() {
        opts.push("-lineinfo".to_string());
    }
    opts.push(format!("--gpu-architecture={arch}"));
    if let Some(inc) = include {
        opts.push(format!("--include-path={inc}"));
    }
    opts.extend(module.extra_options.iter().map(|s| s.to_string()));
    opts
}

/// The headers a program sees: the registered ones, then its family's source for an instantiation.
pub fn headers(program: &Program) -> Vec<(String, &'static str)> {
    let mut all: Vec<(String, &'static str)> = HEADERS.iter().map(|(n, s)| (n.to_string(), *s)).collect();
    if !program.is_whole() {
        all.push((program.header_name(), program.module.source));
    }
    all
}

/// Compiles `program` for `arch` (e.g. "sm_90") with `opts` (from [`options`]).
pub fn compile(program: &Program, arch: &str, opts: &[String]) -> Result<Compiled, CudaError> {
    libs::ensure_nvrtc().map_err(|e| CudaError::Library(format!("NVRTC unavailable: {e}")))?;
    let fail = |message: String, log: String| CudaError::Compile {
        module: program.name.clone(),
        arch: arch.to_string(),
        message,
        log,
    };
    let c = |s: &str| CString::new(s).map_err(|_| fail("interior NUL in source or option".into(), String::new()));
    let src = c(&program.source())?;
    let name = c(&program.file_name())?;
    let all_headers = headers(program);
    let header_src: Vec<CString> = all_headers.iter().map(|(_, s)| c(s)).collect::<Result<_, _>>()?;
    let header_names: Vec<CString> = all_headers.iter().map(|(n, _)| c(n)).collect::<Result<_, _>>()?;
    let headers: Vec<*const std::ffi::c_char> = header_src.iter().map(|h| h.as_ptr()).collect();
    let header_names: Vec<*const std::ffi::c_char> = header_names.iter().map(|h| h.as_ptr()).collect();
    let c_opts: Vec<CString> = opts.iter().map(|o| c(o)).collect::<Result<_, _>>()?;
    let opt_ptrs: Vec<*const std::ffi::c_char> = c_opts.iter().map(|o| o.as_ptr()).collect();

    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: all strings are valid NUL-terminated C strings alive for the call; the two header arrays
    // have the same length, passed as the count.
    let r = unsafe {
        sys::nvrtcCreateProgram(
            &mut prog,
            src.as_ptr(),
            name.as_ptr(),
            headers.len() as i32,
            headers.as_ptr(),
            header_names.as_ptr(),
        )
    };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(fail(format!("nvrtcCreateProgram: {}", status(r)), String::new()));
    }
    // SAFETY: `prog` was created above; options are valid C strings alive for the call.
    let compiled = unsafe { sys::nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
    let log = program_log(prog);
    let result = if compiled != sys::nvrtcResult::NVRTC_SUCCESS {
        Err(fail(status(compiled), log))
    } else {
        cubin(prog).map(|cubin| Compiled { cubin, log }).map_err(|m| fail(m, String::new()))
    };
    // SAFETY: `prog` is a live program, destroyed exactly once.
    unsafe { sys::nvrtcDestroyProgram(&mut prog) };
    result
}

fn program_log(prog: sys::nvrtcProgram) -> String {
    let mut size = 0usize;
    // SAFETY: live program and a valid out-pointer.
    if unsafe { sys::nvrtcGetProgramLogSize(prog, &mut size) } != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return String::new();
    }
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` holds `size` bytes, as NVRTC asked for.
    if unsafe { sys::nvrtcGetProgramLog(prog, buf.as_mut_ptr().cast()) } != sys::nvrtcResult::NVRTC_SUCCESS {
        return String::new();
    }
    String::from_utf8_lossy(&buf).trim_end_matches('\0').trim().to_string()
}

fn cubin(prog: sys::nvrtcProgram) -> Result<Vec<u8>, String> {
    let mut size = 0usize;
    // SAFETY: live, compiled program and a valid out-pointer.
    let r = unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return Err(format!("nvrtcGetCUBINSize: {} (was a virtual compute_XX arch given?)", status(r)));
    }
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` holds `size` bytes.
    let r = unsafe { sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast()) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("nvrtcGetCUBIN: {}", status(r)));
    }
    Ok(buf)
}
