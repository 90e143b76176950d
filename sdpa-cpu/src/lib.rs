//! sdpa-cpu: the CPU attention backend.
//!
//! Kernels (names shared with the CUDA backend):
//! - `unfused`: scores materialised by a SIMD GEMM, softmax pass, GEMM with V (the eager baseline);
//! - `fa2`: the fused tiled flash kernel: query-tile × key-tile blocks, SIMD micro-kernels for Q·Kᵀ and
//!   P·V, scale, softcap, ALiBi, mask and online softmax fused with a vectorised exp, rayon over (batch, kv
//!   head, query tile), key tiles outside the band (causal mask and sliding window) never touched, GQA by
//!   index, O(threads × tile) scratch;
//! - `splitkv`: keys split across workers, partial states merged with sdpa-core's merge. For decoding (at
//!   most `LANES / 4` query rows per kv head) it streams K and V in memory order, each worker a contiguous
//!   run, with software prefetch, on both layouts (`decode`); both split only the keys the band leaves;
//! - `auto`: `splitkv` for decoding and when the query tiles cannot fill the threads, `fa2` otherwise.
//!
//! The backward pass (`fa2`'s, the only one; sdpa-core's `backward` module defines it): dQ, dK, dV from
//! Q, K, V, O, dO and the forward's LSE in the FlashAttention-2 style, P recomputed per (query tile, key
//! tile) on the forward's micro-kernels, dK/dV per key block and dQ per query tile (or beside dK/dV when
//! the (batch, kv head) groups fill the threads), tiles outside the band skipped, bitwise deterministic for
//! any thread count; dense and ragged batches, every mask and variant ([`attention_backward`],
//! `Backend::backward`; paged caches are refused).
//!
//! SIMD is chosen at run time ([`SimdPath::detect`]): AMX (bf16 Q·Kᵀ and P·V on tiles, where the CPU has
//! AMX-BF16 and the OS grants the tile state: [`amx_status`] says why not), AVX-512 with AVX512_BF16 (bf16
//! inputs multiply pairs with `vdpbf16ps`), AVX-512, AVX2 + FMA, or a scalar fallback; a generic build runs
//! the fastest path the CPU has; `SDPA_CPU_SIMD=avx2` (or `amx`, `avx512`, `avx512-bf16`, `scalar`) forces
//! one for every call
//! ([`SimdPath::chosen`]: `sdpa devices` shows it, records name it in the device), and
//! [`CpuBackend::with_simd`] forces one per backend (the tests run every supported path).
//! f32, f16 and bf16 in and out, f32 accumulation; head dims up to [`MAX_HEAD_DIM`], with no special
//! case: 64 and 128 (any multiple of the micro-tile width) run without edge tiles, others add a masked
//! edge vector.
//!
//! Every kernel honours sdpa-core's variants natively: a sliding window is part of the key band (with the
//! causal mask), so time grows with the window, not with Sk; the softcap `cap · tanh(x / cap)` and the ALiBi
//! bias `−slope · |j − diag(i)|` (computed per element from the row's slope and diagonal, no bias tensor)
//! modify the score tile in registers before the mask and the online max (`variants`).
//!
//! Ragged (varlen) batches and paged KV caches (`sdpa_core::ragged`) run on every kernel: each sequence is
//! a part of its own (its lengths, band and ALiBi diagonal; keys through its row of the block table), and
//! the kernels schedule the parts' work items together (`fa2` heaviest first, `splitkv` in chunks of equal
//! key counts across the batch). [`attention_ragged`] is the slice entry that takes the block table;
//! [`append_to_pages`] writes new K/V rows into a paged cache in parallel.
//!
//! Semantics are sdpa-core's: a row with no visible key is zeros with LSE `-inf`; masked keys are set to
//! `-inf` before the softmax (an explicit `-inf` replaces the score rather than adding to it), so NaN in Q
//! or K reaches only rows that see it. NaN or inf in V under a key masked for some rows of a tile those
//! rows load would reach them through `0 · NaN` in the tile's P·V; each work item checks its accumulators
//! once and, only when one is non-finite, runs again keeping such V rows out of the rows that do not
//! attend to them (`nonfinite`), so every row matches the f64 reference, poisoned or not.
//!
//! ```
//! use sdpa_core::{AttentionSpec, DType, HostBackend, HostInputs, Mask, RunOptions, Shape};
//! use sdpa_core::check::check_output;
//! use sdpa_cpu::CpuBackend;
//!
//! let spec = AttentionSpec::new(Shape::new(1, 4, 100, 100, 64), DType::F32).with_mask(Mask::CausalTopLeft);
//! let inputs = HostInputs::random(&spec, 0).unwrap();
//! let cpu = CpuBackend::new(Some(2)).unwrap();
//! let run = cpu.run_host(&spec, &RunOptions::default(), &inputs).unwrap();
//! assert!(check_output(&spec, &inputs, &run.output, Default::default(), None).unwrap().pass);
//! ```

mod aligned;
mod amx;
mod append;
mod backend;
mod backward;
mod decode;
mod element;
mod fa2;
mod micro;
mod nonfinite;
mod problem;
mod run;
mod simd;
mod transpose;
mod unfused;
mod variants;

pub use amx::{has_amx_fp16, status as amx_status};
pub use append::append_to_pages;
pub use backend::CpuBackend;
pub use backward::BackwardSlices;
pub use element::CpuElement;
pub use run::{attention, attention_backward, attention_ragged, MAX_HEAD_DIM};
pub use simd::{simd_paths, supported_paths, SimdPath, SIMD_ENV};
