//! The compiled image (CUBIN) of a [`Program`] for one device: read from the disk cache ([`cache`]) or
//! compiled by NVRTC and stored there; [`images`] does many at once on parallel threads (NVRTC programs are
//! independent, and a warm-up or a benchmark plan needs tens of them).

use crate::error::CudaError;
use crate::sys::program::Program;
use crate::sys::{cache, libs, nvrtc};
use sdpa_core::{Result, SdpaError};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Where an image came from: read from the disk cache, or compiled by NVRTC in this process (and stored).
pub use sdpa_core::ImageOrigin as Origin;

/// What an image is built for: the device's real architecture ("sm_90") and its driver version (part of
/// the cache key, since a new driver may load images differently).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Real architecture of the device.
    pub arch: String,
    /// Driver version as CUDA encodes it (13000 = 13.0).
    pub driver_version: i32,
}

/// One program's image.
#[derive(Debug, Clone)]
pub struct Image {
    /// The CUBIN bytes.
    pub cubin: Vec<u8>,
    /// Where it came from.
    pub origin: Origin,
    /// Seconds spent reading or compiling it.
    pub seconds: f64,
    /// Its disk-cache key (for [`discard`]).
    pub key: String,
}

/// The image of `program` for `target`, from the cache or compiled.
pub fn image(program: &Program, target: &Target) -> Result<Image> {
    build(program, target, true)
}

/// Deletes the cached image of `program` under `key` (one the driver refused to load) and compiles it
/// again, storing the new image.
pub fn discard(program: &Program, target: &Target, key: &str) -> Result<Image> {
    cache::remove(&program.name, key);
    build(program, target, false)
}

fn build(program: &Program, target: &Target, read_cache: bool) -> Result<Image> {
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
    if read_cache {
        if let Some(cubin) = cache::load(&program.name, &key) {
            return Ok(Image { cubin, origin: Origin::DiskCache, seconds: t.elapsed().as_secs_f64(), key });
        }
    }
    let compiled = nvrtc::compile(program, &arch, &opts).map_err(|e| e.into_sdpa(context()))?;
    cache::store(&program.name, &key, &compiled.cubin);
    Ok(Image { cubin: compiled.cubin, origin: Origin::Compiled, seconds: t.elapsed().as_secs_f64(), key })
}

/// The cache key: the program's source and every header it may include (its family's `.cu` among them),
/// the architecture, the full option list, and the NVRTC and driver versions.
fn cache_key(program: &Program, arch: &str, opts: &[String], nvrtc: (i32, i32), driver: i32) -> String {
    let headers: String = nvrtc::headers(program).iter().map(|(n, s)| format!("{n}\n{s}")).collect();
    cache::key(&[
        program.source().as_bytes(),
        headers.as_bytes(),
        arch.as_bytes(),
        opts.join(" ").as_bytes(),
        format!("nvrtc {nvrtc:?} driver {driver}").as_bytes(),
    ])
}

/// Threads for [`images`]: `SDPA_CUDA_COMPILE_THREADS` when set (a positive count), else every CPU the
/// process may use. A value that is not a positive count is an error, not a silent default.
pub fn compile_threads() -> Result<usize> {
    match std::env::var("SDPA_CUDA_COMPILE_THREADS") {
        Err(_) => Ok(std::thread::available_parallelism().map_or(1, |n| n.get())),
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(SdpaError::InvalidSpec(format!("SDPA_CUDA_COMPILE_THREADS must be a positive count, got {v:?}"))),
        },
    }
}

/// `f` over `items` on up to `threads` threads, results in order: each thread takes the next item not yet
/// started, so one slow item does not hold back the others. An item whose thread panicked gets
/// `on_panic`'s error.
pub fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> R + Sync,
    on_panic: impl Fn(&T) -> R,
) -> Vec<R> {
    let threads = threads.min(items.len()).max(1);
    if threads == 1 {
        return items.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let mut slots: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        mine.push((i, f(item)));
                    }
                    mine
                })
            })
            .collect();
        // A worker that panicked loses its results; their slots stay empty and get `on_panic` below.
        for (i, r) in workers.into_iter().filter_map(|w| w.join().ok()).flatten() {
            slots[i] = Some(r);
        }
    });
    slots.into_iter().zip(items).map(|(slot, item)| slot.unwrap_or_else(|| on_panic(item))).collect()
}

/// The images of `programs`, in order, built on up to [`compile_threads`] threads.
pub fn images(programs: &[&Program], target: &Target) -> Result<Vec<Result<Image>>> {
    let panicked = |p: &&Program| {
        Err(CudaError::Library(format!("the thread compiling `{}` panicked", p.name)).into_sdpa("compiling"))
    };
    Ok(parallel_map(programs, compile_threads()?, |p| image(p, target), panicked))
}

#[cfg(test)]
mod tests {
    use super::parallel_map;

    #[test]
    fn parallel_map_keeps_the_order_and_reports_a_panicked_item() {
        let items: Vec<u32> = (0..50).collect();
        let out = parallel_map(&items, 4, |&x| x * 2, |_| u32::MAX);
        assert_eq!(out, items.iter().map(|x| x * 2).collect::<Vec<_>>());
        let out = parallel_map(&items, 3, |&x| if x == 7 { panic!("boom") } else { x }, |_| u32::MAX);
        // The panicking worker loses the items it held; every other item keeps its result, in order.
        assert!(out.contains(&u32::MAX) && out[7] == u32::MAX, "{out:?}");
        assert!(out.iter().enumerate().all(|(i, &v)| v == i as u32 || v == u32::MAX));
    }
}
