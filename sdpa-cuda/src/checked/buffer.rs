//! Device buffers: one typed cudarc slice per dtype, so the dtype and the element count travel with the
//! memory.

use crate::error::{driver, drv};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use half::{bf16, f16};
use sdpa_core::{DType, HostBuffer, Result};
use std::sync::Arc;

/// A device buffer of one dtype.
#[derive(Debug)]
pub enum CudaBuffer {
    /// f32 elements.
    F32(CudaSlice<f32>),
    /// f16 elements.
    F16(CudaSlice<f16>),
    /// bf16 elements.
    BF16(CudaSlice<bf16>),
    /// E4M3 codes (inputs of `fa3` only).
    F8E4M3(CudaSlice<u8>),
}

impl CudaBuffer {
    /// The dtype.
    pub fn dtype(&self) -> DType {
        match self {
            CudaBuffer::F32(_) => DType::F32,
            CudaBuffer::F16(_) => DType::F16,
            CudaBuffer::BF16(_) => DType::BF16,
            CudaBuffer::F8E4M3(_) => DType::F8E4M3,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            CudaBuffer::F32(s) => s.len(),
            CudaBuffer::F16(s) => s.len(),
            CudaBuffer::BF16(s) => s.len(),
            CudaBuffer::F8E4M3(s) => s.len(),
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ordinal of the GPU the buffer lives on.
    pub fn ordinal(&self) -> usize {
        match self {
            CudaBuffer::F32(s) => s.ordinal(),
            CudaBuffer::F16(s) => s.ordinal(),
            CudaBuffer::BF16(s) => s.ordinal(),
            CudaBuffer::F8E4M3(s) => s.ordinal(),
        }
    }

    /// Uninitialised-free allocation: zero-filled buffer of `len` elements.
    pub fn zeros(stream: &Arc<CudaStream>, dtype: DType, len: usize) -> Result<Self> {
        let bytes = len.saturating_mul(dtype.size_bytes());
        let err = driver("cuMemAlloc", "a device buffer", bytes);
        Ok(match dtype {
            DType::F32 => CudaBuffer::F32(stream.alloc_zeros::<f32>(len).map_err(err)?),
            DType::F16 => CudaBuffer::F16(stream.alloc_zeros::<f16>(len).map_err(err)?),
            DType::BF16 => CudaBuffer::BF16(stream.alloc_zeros::<bf16>(len).map_err(err)?),
            DType::F8E4M3 => CudaBuffer::F8E4M3(stream.alloc_zeros::<u8>(len).map_err(err)?),
        })
    }

    /// Copies a host buffer to the device.
    pub fn upload(stream: &Arc<CudaStream>, host: &HostBuffer) -> Result<Self> {
        let bytes = host.size_bytes();
        let err = driver("cuMemcpyHtoD", "uploading a buffer", bytes);
        Ok(match host {
            HostBuffer::F32(v) => CudaBuffer::F32(stream.clone_htod(v).map_err(err)?),
            HostBuffer::F16(v) => CudaBuffer::F16(stream.clone_htod(v).map_err(err)?),
            HostBuffer::BF16(v) => CudaBuffer::BF16(stream.clone_htod(v).map_err(err)?),
            HostBuffer::F8E4M3(v) => CudaBuffer::F8E4M3(stream.clone_htod(v).map_err(err)?),
        })
    }

    /// Copies the buffer back to the host (waits for the stream).
    pub fn download(&self, stream: &Arc<CudaStream>) -> Result<HostBuffer> {
        let err = drv("cuMemcpyDtoH", "downloading a buffer");
        Ok(match self {
            CudaBuffer::F32(s) => HostBuffer::F32(stream.clone_dtoh(s).map_err(err)?),
            CudaBuffer::F16(s) => HostBuffer::F16(stream.clone_dtoh(s).map_err(err)?),
            CudaBuffer::BF16(s) => HostBuffer::BF16(stream.clone_dtoh(s).map_err(err)?),
            CudaBuffer::F8E4M3(s) => HostBuffer::F8E4M3(stream.clone_dtoh(s).map_err(err)?),
        })
    }

    /// Raw device address for reading on `stream`; keep the guard alive until the work is queued.
    pub fn ptr<'a>(&'a self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        match self {
            CudaBuffer::F32(s) => s.device_ptr(stream),
            CudaBuffer::F16(s) => s.device_ptr(stream),
            CudaBuffer::BF16(s) => s.device_ptr(stream),
            CudaBuffer::F8E4M3(s) => s.device_ptr(stream),
        }
    }

    /// Raw device address for writing on `stream`; keep the guard alive until the work is queued.
    pub fn ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        match self {
            CudaBuffer::F32(s) => s.device_ptr_mut(stream),
            CudaBuffer::F16(s) => s.device_ptr_mut(stream),
            CudaBuffer::BF16(s) => s.device_ptr_mut(stream),
            CudaBuffer::F8E4M3(s) => s.device_ptr_mut(stream),
        }
    }
}
