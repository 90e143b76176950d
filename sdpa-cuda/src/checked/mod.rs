//! Layer 2, checked wrappers over the cudarc driver API: one GPU and its limits ([`device`]), typed device
//! buffers ([`buffer`]), the kernels' parameter struct ([`params`]) and TMA tensor maps ([`tensor_map`]),
//! the one place that launches a kernel after checking its shape against the device ([`launch`]), and
//! the [`call::Call`] a launcher receives.
//!
//! Errors are values (`sdpa_core::SdpaError`, with [`crate::CudaError`] as the source), never panics.
//! The kernel launchers ([`crate::kernels`]) use only this layer and the module registry.

pub mod buffer;
pub mod call;
pub mod device;
pub mod launch;
pub mod params;
pub mod tensor_map;
