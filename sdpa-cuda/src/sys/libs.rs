//! Finding the CUDA libraries and headers at run time.
//!
//! cudarc loads `libcuda`, `libnvrtc` and `libcublas` lazily by name and panics when a library is missing.
//! This module looks first and turns absence into an error value: the driver library by name (it lives in
//! the system's library path wherever a driver is installed); NVRTC and cuBLAS by name and then from the
//! toolkit and pip locations below, opened by full path so that cudarc's later open by name finds the
//! already loaded copy (the dynamic loader matches a loaded library's soname).
//!
//! Search order for toolkit roots (each may hold `include/`, `lib64/` or `lib/`): `CUDA_HOME`, `CUDA_PATH`,
//! `/usr/local/cuda`, then the pip `nvidia` packages (`site-packages/nvidia/cu13`, `.../cuda_nvrtc`,
//! `.../cuda_runtime`, `.../cublas`) of the active virtual environment, of every `python3*` on `PATH` and of
//! the user site.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Candidate toolkit roots, most specific first, existing directories only.
pub fn cuda_roots() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDA_TOOLKIT_ROOT_DIR"] {
        if let Some(v) = std::env::var_os(var) {
            roots.push(PathBuf::from(v));
        }
    }
    roots.push(PathBuf::from("/usr/local/cuda"));
    for site in python_site_dirs() {
        for sub in ["nvidia/cu13", "nvidia/cuda_nvrtc", "nvidia/cuda_runtime", "nvidia/cublas", "nvidia/cu12"] {
            roots.push(site.join(sub));
        }
    }
    let mut seen = Vec::new();
    roots.retain(|r| {
        let keep = r.is_dir() && !seen.contains(r);
        if keep {
            seen.push(r.clone());
        }
        keep
    });
    roots
}

/// `site-packages` directories that may hold pip's `nvidia` packages.
pub(crate) fn python_site_dirs() -> Vec<PathBuf> {
    let mut prefixes: Vec<PathBuf> = Vec::new();
    if let Some(v) = std::env::var_os("VIRTUAL_ENV") {
        prefixes.push(PathBuf::from(v));
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("python3").exists() {
                if let Some(prefix) = dir.parent() {
                    prefixes.push(prefix.to_path_buf());
                }
            }
        }
    }
    if let Some(home) = std::env::var_os("HOME") {
        prefixes.push(PathBuf::from(home).join(".local"));
    }
    for fixed in ["/usr", "/usr/local", "/opt/torch/.venv", "/opt/conda"] {
        prefixes.push(PathBuf::from(fixed));
    }
    let mut sites = Vec::new();
    if let Some(extra) = std::env::var_os("PYTHONPATH") {
        sites.extend(std::env::split_paths(&extra));
    }
    for prefix in prefixes {
        for lib in ["lib", "lib64"] {
            let Ok(entries) = std::fs::read_dir(prefix.join(lib)) else { continue };
            for e in entries.flatten() {
                let name = e.file_name();
                if name.to_string_lossy().starts_with("python3") {
                    for sub in ["site-packages", "dist-packages"] {
                        let p = e.path().join(sub);
                        if p.is_dir() {
                            sites.push(p);
                        }
                    }
                }
            }
        }
    }
    sites
}

/// The first toolkit include directory holding `cuda_fp16.h` and `cuda_bf16.h` (what the kernels include).
pub fn include_dir() -> Option<PathBuf> {
    if let Some(v) = std::env::var_os("SDPA_CUDA_INCLUDE") {
        return Some(PathBuf::from(v));
    }
    cuda_roots().into_iter().map(|r| r.join("include")).find(|inc| has_cuda_headers(inc))
}

fn lib_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for r in cuda_roots() {
        for sub in ["lib64", "lib", "targets/x86_64-linux/lib"] {
            let d = r.join(sub);
            if d.is_dir() {
                dirs.push(d);
            }
        }
    }
    dirs
}

/// True when the CUDA driver library can be opened (without it every driver call would panic).
pub fn driver_library_present() -> bool {
    ["libcuda.so.1", "libcuda.so"].iter().any(|name| {
        // SAFETY: opening the NVIDIA driver library runs only its own initialisers; the handle is closed
        // again at once (cudarc opens its own).
        unsafe { libloading::Library::new(*name) }.is_ok()
    })
}

/// Opens a library by name, or else by full path from the toolkit and pip locations, and keeps it loaded
/// for the life of the process. `names` are file names, `deps` are libraries to open first from the same
/// directory (cuBLAS needs cuBLASLt). Returns the path (or name) that was opened.
fn preload(names: &[&str], deps: &[&str]) -> Result<String, String> {
    for name in names {
        // SAFETY: loading a CUDA library runs its initialisers only; we never unload it.
        if let Ok(lib) = unsafe { libloading::Library::new(*name) } {
            std::mem::forget(lib);
            return Ok((*name).to_string());
        }
    }
    let dirs = lib_dirs();
    for dir in &dirs {
        for name in names {
            let path = dir.join(name);
            if !path.is_file() {
                continue;
            }
            for dep in deps {
                let dp = dir.join(dep);
                if dp.is_file() {
                    // SAFETY: as above; a failure here surfaces when the main library is opened.
                    if let Ok(lib) = unsafe { libloading::Library::new(&dp) } {
                        std::mem::forget(lib);
                    }
                }
            }
            // SAFETY: as above.
            match unsafe { libloading::Library::new(&path) } {
                Ok(lib) => {
                    std::mem::forget(lib);
                    return Ok(path.display().to_string());
                }
                Err(e) => return Err(format!("{} exists but could not be loaded: {e}", path.display())),
            }
        }
    }
    Err(format!(
        "{} not found in the library path nor in {} (set CUDA_HOME to a CUDA 13 toolkit, or pip install the \
         matching nvidia-* wheel)",
        names[0],
        if dirs.is_empty() { "any CUDA toolkit or pip location".to_string() } else { show_dirs(&dirs) }
    ))
}

fn show_dirs(dirs: &[PathBuf]) -> String {
    dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
}

/// Makes sure NVRTC is loadable; cached for the process.
pub fn ensure_nvrtc() -> Result<&'static str, String> {
    static NVRTC: OnceLock<Result<String, String>> = OnceLock::new();
    NVRTC
        .get_or_init(|| preload(&["libnvrtc.so.13", "libnvrtc.so", "libnvrtc.so.12"], &["libnvrtc-builtins.so.13.0"]))
        .as_deref()
        .map_err(Clone::clone)
}

/// Makes sure cuBLAS is loadable; cached for the process.
pub fn ensure_cublas() -> Result<&'static str, String> {
    static CUBLAS: OnceLock<Result<String, String>> = OnceLock::new();
    CUBLAS
        .get_or_init(|| preload(&["libcublas.so.13", "libcublas.so"], &["libcublasLt.so.13"]))
        .as_deref()
        .map_err(Clone::clone)
}

/// Whether `path` holds the CUDA headers the kernels include.
pub fn has_cuda_headers(path: &Path) -> bool {
    path.join("cuda_fp16.h").is_file() && path.join("cuda_bf16.h").is_file()
}
