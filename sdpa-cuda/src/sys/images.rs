//! The compiled image (CUBIN) of a [`Program`] for one device: read from the disk cache ([`cache`]) or
//! compiled by NVRTC and stored there; [`images`] does many at once on parallel threads (NVRTC programs are
//! independent, and a warm-up or a benchmark plan needs tens of them).

use crate::error::CudaError;
use crate::sys::program::Program;
use crate::sys::{cache, libs, modules::HEADERS, nvrtc};
use sdpa_core::Result;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// What an image is built for: the device's real architecture ("sm_90") and its driver version (part of
/// the cache key, since a new driver may load images differently).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Real architecture of the device.
    pub arch: String,
    /// Driver version as CUDA encodes it (13000 = 13.0).
    pub driver_version: i32,
}

/// Where an image came from: read from the disk cache, or compiled by NVRTC in this process (and stored).
pub use sdpa_core::ImageOrigin as Origin;

/// One program's image.
#[derive(Debug, Clone)]
pub struct Image {
    /// The CUBIN bytes.
    pub cubin: Vec<u8>,
    /// Where it came from.
    pub origin: Origin,
    /// Seconds spent reading or compiling it.
    pub seconds: f64,
}

/// The image of `program` for `target`, from the cache or compiled.
pub fn image(program: &Program, target: &Target) -> Result<Image> {
    let t = Instant::now();
    let context = || format!("compiling kernel `{}`", program.name);
    let arch = program.module.arch_for(&target.arch);
    let include = libs::include_dir().map(|p| p.display().to_string()).ok_or_else(|| {
        CudaError::Library(
            "CUDA headers (cuda_fp16.h, cuda_bf16.h) not found: set CUDA_HOME to a CUDA 13 toolkit or \
             SDPA_CUDA_INCLUDE to its include directory"
                .into(),
        )
        .into_sdpa(context())
    })?;
    let opts = nvrtc::options(&arch, Some(&include), program.module);
    let nvrtc_version = nvrtc::version().map_err(|e| e.into_sdpa(context()))?;
    let key = cache_key(program, &arch, &opts, nvrtc_version, target.driver_version);
    if let Some(cubin) = cache::load(&program.name, &key) {
        return Ok(Image { cubin, origin: Origin::DiskCache, seconds: t.elapsed().as_secs_f64() });
    }
    let compiled = nvrtc::compile(program, &arch, &opts).map_err(|e| e.into_sdpa(context()))?;
    cache::store(&program.name, &key, &compiled.cubin);
    Ok(Image { cubin: compiled.cubin, origin: Origin::Compiled, seconds: t.elapsed().as_secs_f64() })
}

/// The cache key: the program's source and every header it may include (its family's `.cu` among them),
/// the architecture, the full option list, and the NVRTC and driver versions.
fn cache_key(program: &Program, arch: &str, opts: &[String], nvrtc: (i32, i32), driver: i32) -> String {
    let headers: String = nvrtc::headers(program).iter().map(|(n, s)| format!("{n}\n{s}")).collect();
    debug_assert!(headers.len() >= HEADERS.len());
    cache::key(&[
        program.source().as_bytes(),
        headers.as_bytes(),
        arch.as_bytes(),
        opts.join(" ").as_bytes(),
        format!("nvrtc {nvrtc:?} driver {driver}").as_bytes(),
    ])
}

/// Threads for [`images`]: `SDPA_CUDA_COMPILE_THREADS` when set to a positive count, else every CPU the
/// process may use.
pub fn compile_threads() -> usize {
    std::env::var("SDPA_CUDA_COMPILE_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The images of `programs`, in order, built on up to [`compile_threads`] threads (each thread takes the
/// next program not yet started, so one slow compile does not hold back the others).
pub fn images(programs: &[&Program], target: &Target) -> Vec<Result<Image>> {
    let threads = compile_threads().min(programs.len()).max(1);
    if threads == 1 {
        return programs.iter().map(|p| image(p, target)).collect();
    }
    let next = AtomicUsize::new(0);
    let mut slots: Vec<Option<Result<Image>>> = (0..programs.len()).map(|_| None).collect();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(p) = programs.get(i) else { break };
                        mine.push((i, image(p, target)));
                    }
                    mine
                })
            })
            .collect();
        // A worker that panicked loses its results; their slots stay empty and report it below.
        for (i, r) in workers.into_iter().filter_map(|w| w.join().ok()).flatten() {
            slots[i] = Some(r);
        }
    });
    slots
        .into_iter()
        .zip(programs)
        .map(|(slot, p)| {
            slot.unwrap_or_else(|| {
                Err(CudaError::Library(format!("the thread compiling `{}` panicked", p.name)).into_sdpa("compiling"))
            })
        })
        .collect()
}
