//! One GPU: its context, the backend's stream, the device limits launches are checked against, and the
//! loaded kernel programs (one per instantiation, compiled on first use or read from the disk cache; many
//! at once on parallel threads through [`Device::prepare`]).

use crate::error::{drv, unavailable, CudaError};
use crate::sys::images::{self, Target};
use crate::sys::libs;
use crate::sys::program::Program;
use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream};
use cudarc::nvrtc::Ptx;
use sdpa_core::{ProgramLoad, Result, SdpaError};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Limits and facts read once from the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device ordinal.
    pub ordinal: usize,
    /// Marketing name, e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Multiprocessors.
    pub sm_count: i32,
    /// Threads per block, at most.
    pub max_threads_per_block: i32,
    /// Grid dims, at most (x, y, z).
    pub max_grid: (i32, i32, i32),
    /// Shared memory per block without opt-in (48 KB).
    pub smem_per_block: i32,
    /// Shared memory per block with opt-in (227 KB on H100).
    pub smem_per_block_optin: i32,
    /// Driver version as CUDA encodes it (13000 = 13.0).
    pub driver_version: i32,
    /// Total device memory, bytes.
    pub total_mem: usize,
}

impl DeviceInfo {
    /// The NVRTC real architecture, e.g. "sm_90".
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.compute_capability.0, self.compute_capability.1)
    }
}

/// The loaded programs, and the ones some thread is building now (so that no program is built twice and
/// the lock is not held while NVRTC runs).
#[derive(Debug, Default)]
struct Programs {
    loaded: HashMap<String, Arc<CudaModule>>,
    building: HashSet<String>,
}

/// A GPU ready to run kernels: context, stream, limits and loaded modules.
#[derive(Debug)]
pub struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    programs: Mutex<Programs>,
    /// Signalled when programs some thread was building are loaded (or failed).
    built: Condvar,
    functions: Mutex<HashMap<String, CudaFunction>>,
    loads: Mutex<Vec<ProgramLoad>>,
    blas: Mutex<Option<CudaBlas>>,
    kept_scratch: Mutex<KeptScratch>,
    /// One u32 kept zero between calls on the device's stream ([`Device::kept_counter`]).
    kept_counter: Mutex<Option<CudaSlice<u32>>>,
    /// ALiBi slopes uploaded once per distinct set (by bit pattern): a model's layers share one.
    alibi: Mutex<HashMap<Vec<u32>, Arc<CudaSlice<f32>>>>,
    /// Small i32 tables uploaded once per distinct content: a ragged batch's offsets and lengths, kernel
    /// schedules. A serving loop whose lengths change every step uploads each new set once.
    tables: Mutex<HashMap<Vec<i32>, Arc<CudaSlice<i32>>>>,
}

/// Distinct i32 tables kept on the device ([`Device::table_i32`]); past it the cache starts over.
const TABLES_KEPT: usize = 64;

/// Distinct ALiBi slope sets kept on the device; past it the cache starts over (a caller cycling through
/// more sets than any model has still gets correct slopes, uploaded again).
const ALIBI_SETS_KEPT: usize = 64;

/// Scratch kept between calls on the device's stream, for kernels that leave a zeroed tail zero when they
/// finish (splitkv's per-row-tile counters: the last block of each resets its own). While calls keep the
/// same layout (length and where the zeroed tail starts), every call finds the tail zero without a
/// memset; a new layout gets a new buffer, zeroed once. See [`Device::kept_scratch`].
#[derive(Debug, Default)]
pub struct KeptScratch {
    buf: Option<CudaSlice<f32>>,
    len: usize,
    zero_from: usize,
}

impl KeptScratch {
    /// The buffer ([`Device::kept_scratch`] always leaves one).
    pub fn buf(&self) -> Option<&CudaSlice<f32>> {
        self.buf.as_ref()
    }
}

/// The opt-in shared memory per block the kernels plan for: the device's, or less when the environment sets
/// `SDPA_CUDA_SMEM_OPTIN` (bytes) lower, so that a large GPU runs the tiles a smaller one would (the tests of
/// those fallback tiles use it on an H100). It never raises the device's limit.
fn optin_cap(device: i32) -> Result<i32> {
    match std::env::var("SDPA_CUDA_SMEM_OPTIN") {
        Err(_) => Ok(device),
        Ok(v) => match v.trim().parse::<i32>() {
            Ok(cap) if cap >= 0 => Ok(device.min(cap)),
            _ => Err(unavailable(format!("SDPA_CUDA_SMEM_OPTIN must be a byte count, got {v:?}"))),
        },
    }
}

fn driver_version() -> Result<i32> {
    let mut v = 0;
    // SAFETY: a valid out-pointer; the driver library is loaded (checked by the caller).
    let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    r.result().map_err(drv("cuDriverGetVersion", "reading the driver version"))?;
    Ok(v)
}

impl Device {
    /// Opens GPU `ordinal`. Never panics: a missing driver library, a driver that fails to initialise and
    /// an absent ordinal are `DeviceUnavailable` with the reason.
    pub fn open(ordinal: usize) -> Result<Self> {
        if !libs::driver_library_present() {
            return Err(unavailable(
                "no CUDA driver found (libcuda.so not loadable): this machine has no NVIDIA driver or it is not \
                 in the library path",
            ));
        }
        let init = cudarc::driver::result::init();
        if let Err(e) = init {
            return Err(unavailable(format!("the CUDA driver failed to initialise ({e}): no usable GPU")));
        }
        let count = cudarc::driver::result::device::get_count()
            .map_err(|e| unavailable(format!("could not count GPUs ({e})")))?;
        if count <= 0 {
            return Err(unavailable("no GPU: the CUDA driver reports 0 devices"));
        }
        if ordinal >= count as usize {
            return Err(unavailable(format!(
                "no GPU with ordinal {ordinal}: the driver reports {count} device(s) (0..{})",
                count - 1
            )));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| unavailable(format!("could not create a context on GPU {ordinal} ({e})")))?;
        let stream = ctx.new_stream().map_err(drv("cuStreamCreate", "creating the backend stream"))?;
        let info = Self::read_info(&ctx, ordinal)?;
        Ok(Device::assemble(ctx, stream, info))
    }

    fn assemble(ctx: Arc<CudaContext>, stream: Arc<CudaStream>, info: DeviceInfo) -> Device {
        Device {
            ctx,
            stream,
            info,
            programs: Mutex::default(),
            built: Condvar::new(),
            functions: Mutex::default(),
            loads: Mutex::default(),
            blas: Mutex::default(),
            kept_scratch: Mutex::default(),
            kept_counter: Mutex::default(),
            alibi: Mutex::default(),
            tables: Mutex::default(),
        }
    }

    /// `values` on the device, uploaded on the device's stream the first time this content is asked for and
    /// kept (as [`Device::alibi_slopes`] keeps slopes): a ragged batch's `cu_seqlens` and cache lengths, or a
    /// launcher's schedule. `what` names it in errors.
    pub fn table_i32(&self, values: &[i32], what: &str) -> Result<Arc<CudaSlice<i32>>> {
        let mut cache = self.tables.lock().map_err(|_| poisoned())?;
        if let Some(s) = cache.get(values) {
            return Ok(s.clone());
        }
        if cache.len() >= TABLES_KEPT {
            cache.clear();
        }
        let buf = self.stream.clone_htod(values).map_err(crate::error::driver(
            "cuMemcpyHtoDAsync",
            what,
            values.len() * 4,
        ))?;
        let buf = Arc::new(buf);
        cache.insert(values.to_vec(), buf.clone());
        Ok(buf)
    }

    /// The ALiBi slopes `slopes` (f32 per query head) on the device, uploaded on the device's stream the
    /// first time this set is asked for and kept: later calls with the same slopes upload nothing. A call on
    /// another stream takes the pointer through `device_ptr(stream)`, which orders it after the upload.
    pub fn alibi_slopes(&self, slopes: &[f32]) -> Result<Arc<CudaSlice<f32>>> {
        let key: Vec<u32> = slopes.iter().map(|x| x.to_bits()).collect();
        let mut cache = self.alibi.lock().map_err(|_| poisoned())?;
        if let Some(s) = cache.get(&key) {
            return Ok(s.clone());
        }
        if cache.len() >= ALIBI_SETS_KEPT {
            cache.clear();
        }
        let buf = self.stream.clone_htod(slopes).map_err(crate::error::driver(
            "cuMemcpyHtoDAsync",
            "ALiBi slopes",
            slopes.len() * 4,
        ))?;
        let buf = Arc::new(buf);
        cache.insert(key, buf.clone());
        Ok(buf)
    }

    /// Wraps a caller's context (candle's) on its own stream.
    pub fn from_stream(stream: Arc<CudaStream>) -> Result<Self> {
        let ctx = stream.context().clone();
        let info = Self::read_info(&ctx, ctx.ordinal())?;
        Ok(Device::assemble(ctx, stream, info))
    }

    /// `len` f32 of scratch on the device's stream whose elements `zero_from..len` are zero when the work
    /// queued next on the stream starts, kept between calls (see [`KeptScratch`]). The caller must queue
    /// only work that leaves that tail zero again when it completes, and hold the guard until it is
    /// queued. Works queued on another stream must not use it.
    pub fn kept_scratch(&self, len: usize, zero_from: usize, what: &str) -> Result<MutexGuard<'_, KeptScratch>> {
        let mut slot = self.kept_scratch.lock().map_err(|_| poisoned())?;
        if slot.buf.is_none() || slot.len != len || slot.zero_from != zero_from {
            // The old buffer is freed stream-ordered, after the work that used it.
            slot.buf = None;
            // SAFETY: the head is handed only to kernels that write it before reading it; the tail is
            // zeroed right below, before any work queued after this call.
            let mut buf = unsafe { self.stream.alloc::<f32>(len.max(1)) }.map_err(crate::error::driver(
                "cuMemAllocAsync",
                what,
                len.saturating_mul(4),
            ))?;
            let tail = len.max(1).min(zero_from)..len.max(1);
            self.stream.memset_zeros(&mut buf.slice_mut(tail)).map_err(crate::error::driver(
                "cuMemsetD8Async",
                what,
                len.saturating_sub(zero_from).saturating_mul(4),
            ))?;
            *slot = KeptScratch { buf: Some(buf), len, zero_from };
        }
        Ok(slot)
    }

    /// One u32 on the device's stream that is zero when the work queued next on the stream starts, kept
    /// between calls (zeroed once, when first asked for): for kernels that leave it zero when they finish
    /// (fa3's work-tile counter, whose last increment writes the zero back). The caller must queue only
    /// such work, hold the guard until it is queued, and never hand the counter to work on another stream.
    /// The guard always holds the buffer.
    pub fn kept_counter(&self, what: &str) -> Result<MutexGuard<'_, Option<CudaSlice<u32>>>> {
        let mut slot = self.kept_counter.lock().map_err(|_| poisoned())?;
        if slot.is_none() {
            // alloc_zeros queues the memset on the stream, before any work queued after this call.
            let buf = self.stream.alloc_zeros::<u32>(1).map_err(crate::error::driver("cuMemAllocAsync", what, 4))?;
            *slot = Some(buf);
        }
        Ok(slot)
    }

    fn read_info(ctx: &Arc<CudaContext>, ordinal: usize) -> Result<DeviceInfo> {
        let a = |attr: Attr| ctx.attribute(attr).map_err(drv("cuDeviceGetAttribute", "reading device limits"));
        Ok(DeviceInfo {
            ordinal,
            name: ctx.name().map_err(drv("cuDeviceGetName", "reading the device name"))?,
            compute_capability: ctx
                .compute_capability()
                .map_err(drv("cuDeviceGetAttribute", "reading the compute capability"))?,
            sm_count: a(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            max_threads_per_block: a(Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            max_grid: (
                a(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
                a(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
                a(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
            ),
            smem_per_block: a(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?,
            smem_per_block_optin: optin_cap(a(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?)?,
            driver_version: driver_version()?,
            total_mem: ctx.total_mem().map_err(drv("cuDeviceTotalMem", "reading the memory size"))?,
        })
    }

    /// The context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// `InsufficientMemory` when the GPU has fewer than `needed` bytes free for `what` (a call), checked
    /// before anything of the call is allocated.
    pub fn require_free(&self, needed: u64, what: impl FnOnce() -> String) -> Result<()> {
        let (free, _) = self.ctx.mem_get_info().map_err(drv("cuMemGetInfo", "reading free GPU memory"))?;
        if needed > free as u64 {
            return Err(SdpaError::InsufficientMemory {
                what: what(),
                needed,
                available: free as u64,
                place: "the GPU",
            });
        }
        Ok(())
    }

    /// The stream every launch of this device goes to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Limits and facts.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Loads every program of `programs` not loaded yet: images from the disk cache, the rest compiled on
    /// parallel threads ([`images::images`]). Returns what it loaded now (also kept for
    /// [`Device::take_loads`]). The first failure is the error, with the compiler log; the programs loaded
    /// before it stay loaded and logged.
    ///
    /// The lock on the loaded programs is held only to look up and to insert, not while NVRTC runs, so
    /// launches of loaded programs never wait for another thread's compile; a program another thread is
    /// building is waited for, not built twice.
    pub fn prepare(&self, programs: &[Program]) -> Result<Vec<ProgramLoad>> {
        let mut state = self.programs.lock().map_err(|_| poisoned())?;
        while programs.iter().any(|p| state.building.contains(&p.name)) {
            state = self.built.wait(state).map_err(|_| poisoned())?;
        }
        let mut todo: Vec<&Program> = Vec::new();
        for p in programs {
            if !state.loaded.contains_key(&p.name) && !todo.iter().any(|t| t.name == p.name) {
                todo.push(p);
            }
        }
        if todo.is_empty() {
            return Ok(Vec::new());
        }
        state.building.extend(todo.iter().map(|p| p.name.clone()));
        drop(state);

        let target = Target { arch: self.info.arch(), driver_version: self.info.driver_version };
        let built = images::images(&todo, &target);
        let mut state = self.programs.lock().map_err(|_| poisoned())?;
        let mut loaded = Vec::with_capacity(todo.len());
        let outcome = built.and_then(|built| {
            for (p, image) in todo.iter().zip(built) {
                let (module, load) = self.load(p, image?, &target)?;
                state.loaded.insert(p.name.clone(), module);
                loaded.push(load);
            }
            Ok(())
        });
        for p in &todo {
            state.building.remove(&p.name);
        }
        drop(state);
        self.built.notify_all();
        self.loads.lock().map_err(|_| poisoned())?.extend(loaded.iter().cloned());
        outcome.map(|()| loaded)
    }

    /// Loads one image into the context. An image from the disk cache that the driver refuses (a file
    /// damaged on disk) is deleted and compiled again, once.
    fn load(&self, p: &Program, image: images::Image, target: &Target) -> Result<(Arc<CudaModule>, ProgramLoad)> {
        let t = std::time::Instant::now();
        let images::Image { cubin, mut origin, mut seconds, key } = image;
        let module = match self.ctx.load_module(Ptx::from_binary(cubin)) {
            Ok(m) => m,
            Err(_) if origin == images::Origin::DiskCache => {
                let fresh = images::discard(p, target, &key)?;
                (origin, seconds) = (fresh.origin, seconds + fresh.seconds);
                self.ctx
                    .load_module(Ptx::from_binary(fresh.cubin))
                    .map_err(drv("cuModuleLoadData", "loading a compiled kernel"))?
            }
            Err(e) => return Err(drv("cuModuleLoadData", "loading a compiled kernel")(e)),
        };
        let load = ProgramLoad {
            program: p.name.clone(),
            family: p.module.name.to_string(),
            origin,
            image_s: seconds,
            load_s: t.elapsed().as_secs_f64(),
        };
        Ok((module, load))
    }

    /// The programs loaded since the last call (in load order), with where each image came from and what
    /// it cost: the first-call latency a record reports.
    pub fn take_loads(&self) -> Result<Vec<ProgramLoad>> {
        Ok(std::mem::take(&mut *self.loads.lock().map_err(|_| poisoned())?))
    }

    /// The loaded module of `program`, loading it on first use.
    pub fn module(&self, program: &Program) -> Result<Arc<CudaModule>> {
        let loaded = |d: &Self| d.programs.lock().map(|s| s.loaded.get(&program.name).cloned()).map_err(|_| poisoned());
        if let Some(m) = loaded(self)? {
            return Ok(m);
        }
        self.prepare(std::slice::from_ref(program))?;
        loaded(self)?
            .ok_or_else(|| CudaError::Library(format!("kernel `{}` did not load", program.name)).into_sdpa("loading"))
    }

    /// The entry point `function` of `program` (cached).
    pub fn function(&self, program: &Program, function: &str) -> Result<CudaFunction> {
        let key = format!("{}::{function}", program.name);
        if let Some(f) = self.functions.lock().map_err(|_| poisoned())?.get(&key) {
            return Ok(f.clone());
        }
        let module = self.module(program)?;
        let f = module.load_function(function).map_err(|e| {
            if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_FOUND {
                CudaError::MissingKernel { module: program.name.clone(), function: function.to_string() }
                    .into_sdpa("looking up a kernel")
            } else {
                drv("cuModuleGetFunction", "looking up a kernel")(e)
            }
        })?;
        self.functions.lock().map_err(|_| poisoned())?.insert(key, f.clone());
        Ok(f)
    }

    /// Runs `f` with the cuBLAS handle (created on first use; needs libcublas), holding a lock so that no
    /// other thread changes the handle's stream meanwhile. `f` sets the stream it wants.
    pub fn with_blas<R>(&self, f: impl FnOnce(&CudaBlas) -> Result<R>) -> Result<R> {
        let mut slot = self.blas.lock().map_err(|_| poisoned())?;
        if slot.is_none() {
            libs::ensure_cublas()
                .map_err(|e| CudaError::Library(format!("cuBLAS unavailable: {e}")).into_sdpa("the unfused kernel"))?;
            let b = CudaBlas::new(self.stream.clone()).map_err(|e| {
                CudaError::Cublas { call: "cublasCreate", message: format!("{e:?}") }.into_sdpa("the unfused kernel")
            })?;
            *slot = Some(b);
        }
        match slot.as_ref() {
            Some(b) => f(b),
            None => Err(poisoned()),
        }
    }

    /// Waits for the stream.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(drv("cuStreamSynchronize", "waiting for the GPU"))
    }
}

fn poisoned() -> SdpaError {
    CudaError::Library("a module cache lock was poisoned by an earlier panic".into()).into_sdpa("loading a kernel")
}
