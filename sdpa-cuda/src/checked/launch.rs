//! Checked kernel launches: the one place that calls `cuLaunchKernel`.
//!
//! A launch is described by [`LaunchDims`], checked against the device's limits (threads per block, grid
//! size, shared memory), with the dynamic shared-memory limit raised through
//! `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` when a block needs more than the default 48 KB. Attention
//! kernels take one [`AttnParams`](crate::checked::params::AttnParams) by value; [`launch`] takes any
//! `DeviceRepr` struct so other parameters can use it too (splitkv's TMA entries, the L2 flush). Errors after the launch
//! (`cuGetLastError`-style launch failures) come back as values.

use crate::checked::device::Device;
use crate::error::{drv, CudaError};
use crate::sys::program::Program;
use cudarc::driver::sys::CUfunction_attribute as FnAttr;
use cudarc::driver::{CudaFunction, CudaStream, DeviceRepr};
use sdpa_core::Result;

/// Grid, block and dynamic shared memory of one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchDims {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads in x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, bytes.
    pub smem_bytes: u32,
}

impl LaunchDims {
    /// Checks the dims against the device and the function's static usage.
    pub fn check(&self, dev: &Device, name: &str, func: &CudaFunction) -> Result<()> {
        let info = dev.info();
        let fail = |what: String| Err(CudaError::LaunchLimits { function: name.to_string(), what }.into_sdpa("launch"));
        let threads = self.block.0 as u64 * self.block.1 as u64 * self.block.2 as u64;
        if threads == 0 || self.grid.0 == 0 || self.grid.1 == 0 || self.grid.2 == 0 {
            return fail(format!("empty launch: grid {:?}, block {:?}", self.grid, self.block));
        }
        let max_threads = func
            .max_threads_per_block()
            .map_err(drv("cuFuncGetAttribute", "reading a kernel's thread limit"))?
            .min(info.max_threads_per_block);
        if threads > max_threads as u64 {
            return fail(format!("{threads} threads per block, the kernel allows {max_threads}"));
        }
        let (gx, gy, gz) = info.max_grid;
        if self.grid.0 as i64 > gx as i64 || self.grid.1 as i64 > gy as i64 || self.grid.2 as i64 > gz as i64 {
            return fail(format!("grid {:?} exceeds the device's {:?}", self.grid, info.max_grid));
        }
        let static_smem =
            func.shared_size_bytes().map_err(drv("cuFuncGetAttribute", "reading a kernel's shared memory"))?;
        let total = self.smem_bytes as i64 + static_smem as i64;
        if total > info.smem_per_block_optin as i64 {
            return fail(format!(
                "{total} bytes of shared memory per block ({} dynamic + {static_smem} static), the device allows {}",
                self.smem_bytes, info.smem_per_block_optin
            ));
        }
        Ok(())
    }
}

/// Looks up `function` in `program` (loading it on first use), checks `dims`, raises the shared-memory limit if needed and launches
/// with `params` as the single by-value argument on `stream` (a stream of `dev`'s context).
///
/// # Safety
/// `params` must describe device memory that is valid for everything the kernel reads and writes (the
/// pointers are raw addresses the kernel trusts), and that memory must stay alive and unaliased by other
/// writers until the launch completes on the stream.
pub unsafe fn launch<P: DeviceRepr>(
    dev: &Device,
    stream: &CudaStream,
    program: &Program,
    function: &str,
    dims: LaunchDims,
    params: &P,
) -> Result<()> {
    let func = dev.function(program, function)?;
    dims.check(dev, function, &func)?;
    if dims.smem_bytes > 48 * 1024 {
        func.set_attribute(FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dims.smem_bytes as i32)
            .map_err(drv("cuFuncSetAttribute", "raising a kernel's shared-memory limit"))?;
    }
    // cuLaunchKernel wants, per argument, a pointer to the argument's bytes: here the struct itself.
    let mut args = [params as *const P as *mut std::ffi::c_void];
    // SAFETY: the function comes from a loaded module of this context; `args` holds one pointer to a
    // `P` whose layout matches the kernel's single by-value parameter (DeviceRepr); the caller guarantees
    // the memory it points to (see # Safety).
    let r = unsafe {
        cudarc::driver::result::launch_kernel(
            func.cu_function(),
            dims.grid,
            dims.block,
            dims.smem_bytes,
            stream.cu_stream(),
            &mut args,
        )
    };
    r.map_err(drv("cuLaunchKernel", function))?;
    Ok(())
}
