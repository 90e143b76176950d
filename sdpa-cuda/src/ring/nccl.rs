//! NCCL, loaded at run time: the library found without panicking, the few calls the ring makes (one
//! communicator per GPU for all GPUs of this process, grouped send/recv on a stream), and a communicator
//! that is destroyed when dropped.
//!
//! cudarc's `nccl` bindings are not used: their loader looks for `libnccl.so`, `libnccl.so.13`, `.12`, ...
//! but not `libnccl.so.2`, the name that both the system packages and PyPI's `nvidia-nccl-cu13` wheel
//! install, and it panics when nothing loads. Here the library is looked up by `SDPA_NCCL_LIB` (a path),
//! then by name (`libnccl.so.2`, `libnccl.so`), then in the pip wheel's `nvidia/nccl/lib/` of every Python
//! site directory that [`crate::sys::libs`] searches; absence is `DeviceUnavailable` with what to do.

use crate::error::unavailable;
use sdpa_core::{Result, SdpaError};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::PathBuf;
use std::sync::OnceLock;

type RawComm = *mut c_void;
type InitAll = unsafe extern "C" fn(*mut RawComm, c_int, *const c_int) -> c_int;
type Destroy = unsafe extern "C" fn(RawComm) -> c_int;
type GroupCall = unsafe extern "C" fn() -> c_int;
type SendRecv = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, RawComm, *mut c_void) -> c_int;
type ErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type Version = unsafe extern "C" fn(*mut c_int) -> c_int;

/// `ncclUint8`: every transfer is counted in bytes.
const NCCL_UINT8: c_int = 1;

/// The loaded library and the entry points the ring uses.
#[derive(Debug)]
pub struct Nccl {
    /// Where it was loaded from.
    pub path: String,
    /// `ncclGetVersion`, e.g. 22703 for 2.27.3.
    pub version: i32,
    init_all: InitAll,
    destroy: Destroy,
    group_start: GroupCall,
    group_end: GroupCall,
    send: SendRecv,
    recv: SendRecv,
    error_string: ErrorString,
    // Kept loaded for the life of the process (the fields above point into it).
    _lib: libloading::Library,
}

/// Loads NCCL once per process; the error says what to install when it is absent.
pub fn nccl() -> Result<&'static Nccl> {
    static NCCL: OnceLock<std::result::Result<Nccl, String>> = OnceLock::new();
    NCCL.get_or_init(load).as_ref().map_err(|e| unavailable(e.clone()))
}

fn candidates() -> Vec<PathBuf> {
    let mut c: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("SDPA_NCCL_LIB") {
        c.push(PathBuf::from(p));
    }
    c.push(PathBuf::from("libnccl.so.2"));
    c.push(PathBuf::from("libnccl.so"));
    for site in crate::sys::libs::python_site_dirs() {
        c.push(site.join("nvidia/nccl/lib/libnccl.so.2"));
    }
    c
}

fn load() -> std::result::Result<Nccl, String> {
    let mut tried = Vec::new();
    for path in candidates() {
        let is_name = path.components().count() == 1;
        if !is_name && !path.is_file() {
            continue;
        }
        // SAFETY: loading NCCL runs only its initialisers; the library stays loaded in the returned value.
        match unsafe { libloading::Library::new(&path) } {
            Ok(lib) => return bind(lib, path.display().to_string()),
            Err(e) => tried.push(format!("{} ({e})", path.display())),
        }
    }
    Err(format!(
        "NCCL not found: install nvidia-nccl-cu13 (pip) or the system's libnccl2, or set LD_LIBRARY_PATH or \
         SDPA_NCCL_LIB to libnccl.so.2 (tried: {})",
        tried.join("; ")
    ))
}

fn bind(lib: libloading::Library, path: String) -> std::result::Result<Nccl, String> {
    fn sym<T: Copy>(lib: &libloading::Library, name: &str, path: &str) -> std::result::Result<T, String> {
        // SAFETY: the type is the documented C signature of `name` in nccl.h (NCCL 2.x).
        unsafe { lib.get::<T>(name.as_bytes()) }
            .map(|s| *s)
            .map_err(|e| format!("{path} lacks `{name}`: {e} (NCCL 2.18 or later is needed)"))
    }
    let version_fn: Version = sym(&lib, "ncclGetVersion", &path)?;
    let mut version = 0;
    // SAFETY: a valid out-pointer.
    unsafe { version_fn(&mut version) };
    Ok(Nccl {
        init_all: sym(&lib, "ncclCommInitAll", &path)?,
        destroy: sym(&lib, "ncclCommDestroy", &path)?,
        group_start: sym(&lib, "ncclGroupStart", &path)?,
        group_end: sym(&lib, "ncclGroupEnd", &path)?,
        send: sym(&lib, "ncclSend", &path)?,
        recv: sym(&lib, "ncclRecv", &path)?,
        error_string: sym(&lib, "ncclGetErrorString", &path)?,
        path,
        version,
        _lib: lib,
    })
}

impl Nccl {
    fn check(&self, call: &'static str, code: c_int) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static C string for any code.
        let text = unsafe { CStr::from_ptr((self.error_string)(code)) }.to_string_lossy().into_owned();
        Err(SdpaError::Backend {
            backend: crate::error::BACKEND,
            context: format!("NCCL call {call}"),
            source: Box::new(crate::error::CudaError::Library(format!("{call} failed with code {code}: {text}"))),
        })
    }

    /// One communicator per GPU of `ordinals`, rank i on `ordinals[i]` (`ncclCommInitAll`).
    pub fn comms(&'static self, ordinals: &[usize]) -> Result<Vec<Comm>> {
        let devs: Vec<c_int> = ordinals
            .iter()
            .map(|&o| c_int::try_from(o).map_err(|_| SdpaError::InvalidSpec(format!("GPU ordinal {o}"))))
            .collect::<Result<_>>()?;
        let n = c_int::try_from(devs.len()).map_err(|_| SdpaError::InvalidSpec("too many GPUs".into()))?;
        let mut raw: Vec<RawComm> = vec![std::ptr::null_mut(); devs.len()];
        // SAFETY: `raw` has room for `n` communicators and `devs` holds `n` ordinals.
        self.check("ncclCommInitAll", unsafe { (self.init_all)(raw.as_mut_ptr(), n, devs.as_ptr()) })?;
        Ok(raw.into_iter().map(|raw| Comm { raw, nccl: self }).collect())
    }
}

/// One rank's communicator; destroyed on drop.
#[derive(Debug)]
pub struct Comm {
    raw: RawComm,
    nccl: &'static Nccl,
}

// SAFETY: an NCCL communicator may be used from any thread as long as one thread uses it at a time; the
// ring hands each rank's communicators to that rank's thread only.
unsafe impl Send for Comm {}
// SAFETY: as above; `&Comm` is only used by the thread that runs the rank.
unsafe impl Sync for Comm {}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: a communicator made by ncclCommInitAll, destroyed once. A failure here has no remedy.
        let _ = unsafe { (self.nccl.destroy)(self.raw) };
    }
}

/// One transfer of a grouped exchange: `bytes` at device address `ptr`, to or from `peer`.
#[derive(Debug, Clone, Copy)]
pub struct Transfer {
    /// Device address.
    pub ptr: u64,
    /// Length in bytes.
    pub bytes: usize,
    /// The other rank.
    pub peer: usize,
}

impl Comm {
    /// Queues on `stream` (a stream of this rank's GPU) one NCCL group with every send and receive:
    /// grouped, so that neighbours sending to each other do not wait on each other.
    ///
    /// # Safety
    /// Every address must be device memory of this rank's GPU, valid for `bytes` (read for sends, written
    /// for receives) until the group completes on the stream; the peers must queue the matching calls.
    pub unsafe fn exchange(&self, stream: *mut c_void, sends: &[Transfer], recvs: &[Transfer]) -> Result<()> {
        let n = self.nccl;
        // SAFETY: no arguments; pairs with the ncclGroupEnd below, which runs whatever happens in between.
        n.check("ncclGroupStart", unsafe { (n.group_start)() })?;
        let mut result = Ok(());
        for (t, f, name) in
            sends.iter().map(|t| (t, n.send, "ncclSend")).chain(recvs.iter().map(|t| (t, n.recv, "ncclRecv")))
        {
            let peer = c_int::try_from(t.peer).unwrap_or(c_int::MAX);
            // SAFETY: the caller guarantees the memory and the stream (see # Safety).
            let code = unsafe { f(t.ptr as *mut c_void, t.bytes, NCCL_UINT8, peer, self.raw, stream) };
            result = n.check(name, code);
            if result.is_err() {
                break;
            }
        }
        // SAFETY: closes the group opened above.
        let end = n.check("ncclGroupEnd", unsafe { (n.group_end)() });
        result.and(end)
    }
}
