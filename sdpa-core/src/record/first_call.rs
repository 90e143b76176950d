//! What a configuration's first call in a process cost, and why: a GPU backend compiles (or reads from its
//! disk cache) and loads the kernel programs the call needs before it can run, so the first call of a
//! fresh process can take seconds where later calls take microseconds. Records of `sdpa run --json` and
//! `sdpa bench` carry it, per kernel family that ran, cold (compiled) or warm (disk cache).

use serde::{Deserialize, Serialize};

/// Where a kernel program's compiled image came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ImageOrigin {
    /// Compiled in this process (run-time compilation, e.g. NVRTC).
    Compiled,
    /// Read from the on-disk cache of an earlier process.
    DiskCache,
}

/// One kernel program made ready for a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgramLoad {
    /// The program: an instantiation's entry point (`fa2_bf16_128_causal`) or a whole module's name.
    pub program: String,
    /// Its kernel family (source file stem: `fa2`, `splitkv`, ...).
    pub family: String,
    /// Compiled now or read from the disk cache.
    pub origin: ImageOrigin,
    /// Seconds to compile or read the image.
    pub image_s: f64,
    /// Seconds for the driver to load it.
    pub load_s: f64,
}

/// How the first call found the kernels it needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelCache {
    /// At least one program was compiled (an empty or stale disk cache).
    Cold,
    /// Every program came from the disk cache.
    Warm,
    /// Nothing was loaded: the programs were loaded earlier in the process, or the backend compiles nothing.
    Loaded,
}

impl KernelCache {
    /// The name records use: "cold", "warm" or "loaded".
    pub fn name(self) -> &'static str {
        match self {
            KernelCache::Cold => "cold",
            KernelCache::Warm => "warm",
            KernelCache::Loaded => "loaded",
        }
    }
}

/// The first call of one configuration in a process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FirstCall {
    /// Wall seconds of the first call end to end (upload, kernel compile or load, the call, download).
    pub seconds: f64,
    /// Wall seconds from the start of the process to the end of that call, where the call is the process's
    /// first result (`sdpa run`): what a user waits for it. Absent in sweeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_process_start_s: Option<f64>,
    /// Cold, warm or already loaded.
    pub cache: KernelCache,
    /// The programs the call loaded, in load order.
    #[serde(default)]
    pub programs: Vec<ProgramLoad>,
}

impl FirstCall {
    /// A first call of `seconds` that loaded `programs`.
    pub fn new(seconds: f64, programs: Vec<ProgramLoad>) -> Self {
        let cache = if programs.is_empty() {
            KernelCache::Loaded
        } else if programs.iter().any(|p| p.origin == ImageOrigin::Compiled) {
            KernelCache::Cold
        } else {
            KernelCache::Warm
        };
        FirstCall { seconds, since_process_start_s: None, cache, programs }
    }

    /// Seconds spent compiling or reading images and loading them.
    pub fn kernel_setup_s(&self) -> f64 {
        self.programs.iter().map(|p| p.image_s + p.load_s).sum()
    }
}

/// A backend's kernel warm-up before a sweep: every program the sweep's configurations need, compiled or
/// read on parallel threads at once, instead of one by one on each configuration's first call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WarmUp {
    /// The backend ("cuda").
    pub backend: String,
    /// Wall seconds of the whole warm-up.
    pub seconds: f64,
    /// What it loaded.
    pub programs: Vec<ProgramLoad>,
}

impl WarmUp {
    /// How many programs were compiled (the rest came from the disk cache).
    pub fn compiled(&self) -> usize {
        self.programs.iter().filter(|p| p.origin == ImageOrigin::Compiled).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(origin: ImageOrigin) -> ProgramLoad {
        ProgramLoad { program: "fa2_bf16_128_none".into(), family: "fa2".into(), origin, image_s: 1.5, load_s: 0.25 }
    }

    #[test]
    fn one_compile_makes_the_call_cold_and_setup_sums_every_program() {
        assert_eq!(FirstCall::new(0.1, vec![]).cache, KernelCache::Loaded);
        assert_eq!(FirstCall::new(0.1, vec![load(ImageOrigin::DiskCache)]).cache, KernelCache::Warm);
        let cold = FirstCall::new(2.0, vec![load(ImageOrigin::DiskCache), load(ImageOrigin::Compiled)]);
        assert_eq!((cold.cache, cold.cache.name()), (KernelCache::Cold, "cold"));
        assert_eq!(cold.kernel_setup_s(), 3.5);
        let text = serde_json::to_string(&cold).expect("serialises");
        assert!(text.contains("\"cache\":\"cold\"") && text.contains("\"origin\":\"disk_cache\""), "{text}");
        assert_eq!(serde_json::from_str::<FirstCall>(&text).expect("reads back"), cold);
    }
}
