//! The backward pass: what `dQ, dK, dV` of one attention call mean, the f64 reference that computes them,
//! and the check every backend's gradients pass (DESIGN.md: "the backward pass takes O, dO and the
//! forward's LSE and returns dQ, dK, dV").
//!
//! Per query row `i` of head `h` (kv head `g = h / (Hq/Hkv)`), over the keys `j` it sees:
//!
//! ```text
//! x_ij = scale·q_i·k_j     s_ij = softcap(x_ij) − ALiBi_ij + mask_ij     P_ij = exp(s_ij − LSE_i)
//! Δ_i  = Σ_c dO_ic·O_ic     dV_j += P_ij·dO_i     dP_ij = dO_i·v_j     dS_ij = P_ij·(dP_ij − Δ_i)
//! dX_ij = dS_ij·∂s/∂x (1 − tanh²(x/cap) under a softcap, else 1)
//! dQ_i += scale·Σ_j dX_ij·k_j     dK_j += scale·Σ_i dX_ij·q_i
//! ```
//!
//! GQA/MQA: `dK`/`dV` of kv head `g` sum over the query heads of its group. ALiBi slopes and explicit masks
//! are constants (no gradient). A row that sees no key contributes nothing (its `dQ` is zero); a key that no
//! row sees has zero `dK`/`dV`. Ragged (varlen) batches are one problem per sequence, like the forward;
//! paged KV caches have no backward (training keeps no cache) and are refused.
//!
//! `dQ` has Q's strides, `dK` K's, `dV` V's, `dO` O's; all in the spec's dtype, accumulated in f32 by the
//! kernels. The LSE is the forward's (`[B, Hq, Sq]`, or `[Hq, total_q]` for a ragged batch).

mod check;
mod reference;

pub use check::{backward_tolerance, check_gradients, compare_references, unfused_error, GradCheckReport};
pub use reference::{reference_backward, reference_backward_rounded, ReferenceGradients};

use crate::backend::{HostBackend, Kernel, RunOptions};
use crate::dtype::DType;
use crate::error::{Result, SdpaError};
use crate::ragged::Seq;
use crate::spec::{AttentionSpec, Operand};
use crate::tensor::{HostBuffer, HostInputs};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Which pass a run or a benchmark measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Pass {
    /// The forward call alone.
    #[default]
    #[serde(rename = "fwd")]
    Fwd,
    /// The backward call alone (the forward's O and LSE computed before, untimed).
    #[serde(rename = "bwd")]
    Bwd,
    /// One forward and one backward call, timed together (a training step's attention).
    #[serde(rename = "fwd+bwd")]
    FwdBwd,
}

impl Pass {
    /// Every pass.
    pub const ALL: [Pass; 3] = [Pass::Fwd, Pass::Bwd, Pass::FwdBwd];

    /// `fwd`, `bwd` or `fwd+bwd`.
    pub fn name(self) -> &'static str {
        match self {
            Pass::Fwd => "fwd",
            Pass::Bwd => "bwd",
            Pass::FwdBwd => "fwd+bwd",
        }
    }

    /// Whether the pass runs the backward.
    pub fn has_backward(self) -> bool {
        self != Pass::Fwd
    }

    /// Whether the pass times the forward.
    pub fn has_forward(self) -> bool {
        self != Pass::Bwd
    }
}

impl fmt::Display for Pass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Pass {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "fwd" | "forward" => Ok(Pass::Fwd),
            "bwd" | "backward" => Ok(Pass::Bwd),
            "fwd+bwd" | "fwdbwd" | "fwd_bwd" | "train" => Ok(Pass::FwdBwd),
            other => Err(format!("unknown pass `{other}` (expected fwd, bwd or fwd+bwd)")),
        }
    }
}

/// How to run one backward call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BackwardOptions {
    /// The result must not depend on thread or atomic ordering: bitwise the same from run to run. Kernels
    /// that accumulate `dQ` with atomics switch to an ordered path (slower).
    pub deterministic: bool,
    /// Also write `dQ` in f32 (`BackwardArgs::dq_accum`, Q's strides): the unrounded accumulator, for
    /// callers that keep f32 master gradients.
    pub dq_accum: bool,
}

/// What a backward call ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackwardRun {
    /// The kernel (what `auto` resolved to).
    pub kernel: Kernel,
    /// Whether this call's result is independent of thread and atomic ordering.
    pub deterministic: bool,
}

/// What a backward call takes besides Q, K, V on the host: the forward's O and LSE, and the upstream
/// gradient dO (O's strides and dtype).
#[derive(Debug, Clone)]
pub struct GradInputs {
    /// The forward's output.
    pub o: HostBuffer,
    /// The forward's log-sum-exp (f32, `[B, Hq, Sq]` or `[Hq, total_q]`).
    pub lse: Vec<f32>,
    /// The gradient of the loss with respect to O.
    pub d_o: HostBuffer,
}

impl GradInputs {
    /// Runs `backend`'s forward (with LSE) on `inputs` and draws a seeded random `dO`: what a benchmark or
    /// a test of the backward starts from.
    pub fn from_forward(
        spec: &AttentionSpec,
        backend: &dyn HostBackend,
        opts: &RunOptions,
        inputs: &HostInputs,
        seed: u64,
    ) -> Result<Self> {
        let run = backend.run_host(spec, &RunOptions { lse: true, ..*opts }, inputs)?;
        let lse = run.output.lse.ok_or_else(|| SdpaError::invalid("the forward wrote no log-sum-exp"))?;
        let d_o = HostBuffer::try_random(spec.dtype, spec.required_len(Operand::O)?, seed, "dO")?;
        Ok(GradInputs { o: run.output.o, lse, d_o })
    }

    /// Checks dtypes and lengths against `spec`.
    pub fn check(&self, spec: &AttentionSpec) -> Result<()> {
        self.o.expect_dtype("o", spec.dtype)?;
        self.d_o.expect_dtype("d_o", spec.dtype)?;
        let o = spec.required_len(Operand::O)?;
        for (name, len) in [("o", self.o.len()), ("d_o", self.d_o.len())] {
            if len < o {
                return Err(SdpaError::BufferTooShort { name, len, needed: o });
            }
        }
        let lse = spec.lse_len()?;
        if self.lse.len() < lse {
            return Err(SdpaError::BufferTooShort { name: "lse", len: self.lse.len(), needed: lse });
        }
        Ok(())
    }
}

/// The gradients a backward call wrote, on the host.
#[derive(Debug, Clone)]
pub struct HostGradients {
    /// `dQ`, Q's strides.
    pub dq: HostBuffer,
    /// `dK`, K's strides.
    pub dk: HostBuffer,
    /// `dV`, V's strides.
    pub dv: HostBuffer,
    /// `dQ` in f32 when [`BackwardOptions::dq_accum`] asked for it.
    pub dq_accum: Option<Vec<f32>>,
    /// What ran.
    pub run: BackwardRun,
}

/// Refuses what no backward can run: paged KV caches (training keeps no cache). Called by
/// [`crate::Capabilities::check_backward`] after the spec's own validation.
pub fn validate_backward(spec: &AttentionSpec) -> Result<()> {
    spec.validate()?;
    if spec.dtype == DType::F8E4M3 {
        return Err(SdpaError::invalid(
            "the backward pass of f8e4m3 inputs: FP8 attention is a forward (inference) path; train in bf16",
        ));
    }
    if spec.ragged.as_ref().is_some_and(|r| r.pages.is_some()) {
        return Err(SdpaError::invalid(
            "the backward pass of a paged KV cache: training keeps no cache; pack K/V (varlen) instead",
        ));
    }
    Ok(())
}

/// Index of kv row `(b, g, j)` in the reference's logical order of `dK`/`dV`: `[B, Hkv, Sk]` for a dense
/// batch, `[Hkv, total_k]` for a ragged one (the order [`crate::AttentionSpec::row_index`] uses for queries).
pub fn kv_row_index(spec: &AttentionSpec, seq: &Seq, b: usize, g: usize, j: usize) -> usize {
    match &spec.ragged {
        None => (b * spec.shape.hkv + g) * spec.shape.sk + j,
        Some(r) => g * r.total_k() + seq.k_start + j,
    }
}

/// Number of kv rows (`B·Hkv·Sk`, or `Hkv·total_k` for a ragged batch).
pub fn kv_rows(spec: &AttentionSpec) -> Result<usize> {
    let s = &spec.shape;
    let keys = match &spec.ragged {
        None => s.b.checked_mul(s.sk),
        Some(r) => Some(r.total_k()),
    };
    keys.and_then(|k| k.checked_mul(s.hkv)).ok_or_else(|| SdpaError::overflow("kv rows"))
}

/// Rounds an f64 to `dtype` and back (f32, f16 or bf16), as a store of that dtype does.
pub(crate) fn round_to(dtype: DType, x: f64) -> f64 {
    match dtype {
        DType::F32 => x as f32 as f64,
        DType::F16 => half::f16::from_f64(x).to_f64(),
        DType::BF16 => half::bf16::from_f64(x).to_f64(),
        DType::F8E4M3 => f64::from(crate::fp8::e4m3_to_f32(crate::fp8::f32_to_e4m3(x as f32))),
    }
}
