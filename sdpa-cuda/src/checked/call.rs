//! [`Call`]: everything one kernel implementation needs for one forward call, built once by the backend
//! (from its own buffers or from a caller's slices and stream) and handed through
//! [`crate::kernels::dispatch`] to the `run` of the launcher the policy picks.

use crate::checked::device::Device;
use crate::checked::params::AttnParams;
use crate::error::driver;
use cudarc::driver::{CudaSlice, CudaStream};
use sdpa_core::{AttentionSpec, Result, RunOptions};
use std::sync::Arc;

/// One validated forward call with raw device pointers already ordered after their last writers on
/// `stream` (the backend holds the cudarc guards until every launch of the call is queued).
#[derive(Debug)]
pub struct Call<'a> {
    /// The device (modules, limits, cuBLAS handle).
    pub dev: &'a Device,
    /// The stream every launch of this call goes to (the backend's or the caller's).
    pub stream: &'a Arc<CudaStream>,
    /// The validated spec.
    pub spec: &'a AttentionSpec,
    /// Options (kernel, f32 math, LSE).
    pub opts: &'a RunOptions,
    /// Kernel parameters with every pointer filled in (`mask` and `lse` 0 when absent).
    pub params: AttnParams,
}

impl Call<'_> {
    /// Uninitialised scratch of `len` elements on the call's stream (stream-ordered allocation; freed
    /// stream-ordered when dropped). The kernel must write before it reads.
    pub fn scratch<T: cudarc::driver::DeviceRepr>(&self, len: usize, what: &str) -> Result<CudaSlice<T>> {
        let bytes = len.saturating_mul(std::mem::size_of::<T>());
        // SAFETY: the memory is only handed to kernels that write every element before reading it.
        unsafe { self.stream.alloc::<T>(len.max(1)) }.map_err(driver("cuMemAllocAsync", what, bytes))
    }
}
