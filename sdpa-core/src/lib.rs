//! sdpa-core: what one scaled dot-product attention call means, and the tools every backend shares.
//!
//! `O = softmax(Q·Kᵀ·scale + mask)·V`, described by an [`AttentionSpec`] (shapes, strides, dtype, mask,
//! scale, GQA, and the [`variants`]: sliding window, logit softcap, ALiBi), computed exactly by the f64 [`reference`](mod@reference) (the oracle for every backend),
//! costed by the [`cost`] model against the [`hardware`] table, and run by implementations of [`Backend`].
//!
//! This crate depends on no backend and no GPU crate.
//!
//! ```
//! use sdpa_core::{AttentionSpec, DType, HostBackend, HostInputs, Mask, ReferenceBackend, RunOptions, Shape};
//! use sdpa_core::check::check_output;
//!
//! let shape: Shape = "2,8,2,77,130,64".parse().unwrap();
//! let spec = AttentionSpec::new(shape, DType::BF16).with_mask(Mask::CausalBottomRight);
//! let inputs = HostInputs::random(&spec, 0).unwrap();
//! let run = ReferenceBackend.run_host(&spec, &RunOptions::default(), &inputs).unwrap();
//! let report = check_output(&spec, &inputs, &run.output, Default::default(), None).unwrap();
//! assert!(report.pass);
//! ```

pub mod backend;
pub mod backward;
pub mod check;
pub mod cost;
pub mod dtype;
pub mod error;
pub mod fp8;
pub mod hardware;
pub mod memory;
pub mod ragged;
pub mod record;
pub mod reference;
pub mod ring;
pub mod softmax;
pub mod spec;
pub mod tensor;
pub mod variants;

pub use backend::{
    Backend, BackwardArgs, Capabilities, F32Math, ForwardArgs, HostBackend, HostRun, Kernel, MaskKind, PassBuffers,
    RunOptions,
};
pub use backward::{BackwardOptions, BackwardRun, GradInputs, HostGradients, Pass};
pub use cost::{expected_band, AttentionCost, Bound, EfficiencyBand, Roofline};
pub use dtype::DType;
pub use error::{Result, SdpaError};
pub use fp8::Descale;
pub use hardware::{HardwareSpec, HARDWARE};
pub use ragged::{
    append_to_pages, sequence_as_dense, AppendSpec, Paging, Ragged, RaggedRequest, Seq, Serving, MAX_PAGE_SIZE,
};
pub use record::{
    parse_results, BenchFile, BenchRecord, BenchSpec, FirstCall, ImageOrigin, KernelCache, MeasuredPeak, ProgramLoad,
    Skipped, TimeStats, WarmUp, BENCH_FORMAT,
};
pub use reference::{reference_attention, ReferenceBackend, ReferenceOutput};
pub use ring::{check_ring_spec, RingCost, RingLink, RingPlan, StepWork};
pub use softmax::OnlineSoftmax;
pub use spec::{AttentionSpec, ExplicitMask, Layout, Mask, MaskValues, Operand, Shape, Strides};
pub use tensor::{mask_from_bool, HostBuffer, HostInputs, HostOutput};
pub use variants::{standard_alibi_slopes, Alibi, Diagonal, KeyBand, Variant, Variants, Window};
