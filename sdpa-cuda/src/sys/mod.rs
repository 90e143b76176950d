//! Layer 1, library access: finding and loading the CUDA libraries at run time ([`libs`]), the registry of
//! kernel sources and headers built into the binary ([`modules`]), the programs made of them ([`program`]: one per
//! kernel instantiation), their run-time compilation by NVRTC ([`nvrtc`]), many at once ([`images`]) and the on-disk cache of the compiled images ([`cache`]).
//!
//! Nothing here needs a GPU or touches device memory; the only `unsafe` is the raw NVRTC calls of
//! [`nvrtc`]. The checked wrappers ([`crate::checked`]) build on it.

pub mod cache;
pub mod images;
pub mod libs;
pub mod modules;
pub mod nvrtc;
pub mod program;
