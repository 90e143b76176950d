//! The forward/backward balance of a training step's attention: each backward op against the forward op of
//! the same layer (module, backend, shape, dtype, mask, variants and layout).
//!
//! The backward does 2.5x the forward's FLOPs (masks counted exactly, [`crate::trace::perf`]), so at equal
//! rates it takes 2.5x the forward's time. What a backward should take is its FLOPs at the best known
//! backward rate for the shape ([`crate::trace::frontier`]); a backward below that frontier, or (where no
//! entry applies) one that takes much more than 2.5x its forward, is a finding with what to switch to and a
//! replay of the backward on our kernels.

use crate::trace::attention::{AttnBackend, Phase};
use crate::trace::findings::{Finding, Severity};
use crate::trace::frontier::Verdict;
use crate::trace::replay::Replay;
use crate::trace::report::AttentionOp;
use sdpa_core::{BenchSpec, DType, Layout, Pass};

/// The FLOP ratio of a backward to its forward.
pub const BWD_FLOPS_RATIO: f64 = 2.5;

/// Without a frontier entry, a backward taking more than this many times its forward is flagged (2.5x the
/// FLOPs at somewhat lower rates, as every published backward runs below its forward).
pub const UNBALANCED_WITHOUT_FRONTIER: f64 = 4.0;

/// The forward op of the same layer as backward op `b`.
fn forward_of<'a>(ops: &'a [AttentionOp], b: &AttentionOp) -> Option<&'a AttentionOp> {
    ops.iter().find(|f| {
        f.phase == Phase::Fwd
            && f.kind == b.kind
            && f.backend == b.backend
            && f.module == b.module
            && f.shape() == b.shape()
            && f.dtype == b.dtype
            && f.mask == b.mask
            && f.variants == b.variants
            && f.layout == b.layout
            && f.mean_us > 0.0
    })
}

/// What to do about a slow backward of this backend.
fn advice(b: &AttentionOp) -> &'static str {
    match b.backend {
        AttnBackend::Efficient => {
            "PyTorch chose the memory-efficient kernel, whose backward runs at a fraction of flash's and \
             cuDNN's on this GPU: let SDPA use them (with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, \
             SDPBackend.FLASH_ATTENTION]); an explicit attn_mask, an unsupported head dim or fp32 inputs rule \
             them out)"
        }
        AttnBackend::Flash => {
            "PyTorch's flash backward is FlashAttention-2's; on Hopper cuDNN's backward is faster (try \
             sdpa_kernel(SDPBackend.CUDNN_ATTENTION))"
        }
        _ => "replay the backward on our kernels and PyTorch's backends and compare",
    }
}

/// The `sdpa bench --pass bwd` replay of a backward op's shape.
fn backward_replay(b: &AttentionOp) -> Option<Replay> {
    let shape = b.shape()?;
    if b.suspect.is_some() || b.replay_variants.is_some() {
        return None;
    }
    let mask = match b.mask.as_str() {
        "causal" => "causal",
        "causal-br" => "causal-br",
        "none" => "none",
        _ => return None,
    };
    let dtype = match b.dtype.as_deref() {
        Some("f16") => DType::F16,
        Some("f32") => DType::F32,
        _ => DType::BF16,
    };
    let spec = BenchSpec {
        backends: vec!["cuda".into()],
        kernels: vec!["fa2".into()],
        dtypes: vec![dtype],
        shapes: vec![shape],
        masks: vec![mask.into()],
        layouts: vec![if b.q_bshd_strides { Layout::Bshd } else { Layout::Bhsd }],
        passes: vec![Pass::Bwd],
        ..BenchSpec::default()
    };
    let mut r = Replay::new(spec);
    r.command.push_str(" --pass bwd --with-pytorch");
    Some(r)
}

/// One finding per backward op out of balance with its forward.
pub fn findings(ops: &[AttentionOp]) -> Vec<Finding> {
    let mut out = Vec::new();
    for (i, b) in ops.iter().enumerate() {
        if b.phase != Phase::Bwd || b.mean_us <= 0.0 {
            continue;
        }
        let Some(f) = forward_of(ops, b) else { continue };
        let ratio = b.mean_us / f.mean_us;
        let at_best = b.frontier.as_ref().map(|fr| fr.best_us);
        let flagged = match &b.frontier {
            Some(fr) => fr.verdict == Verdict::Below,
            None => ratio > UNBALANCED_WITHOUT_FRONTIER,
        };
        if !flagged {
            continue;
        }
        let expected = match (&b.frontier, at_best) {
            (Some(fr), Some(t)) => format!(
                "at the best known backward rate ({:.1} TFLOP/s, {}, {}; {}) it would take {:.1} µs, {:.2}x this \
                 forward",
                fr.best.tflops,
                fr.best.kernel,
                fr.best.how,
                fr.best.source,
                t,
                t / f.mean_us
            ),
            _ => "no best known backward rate applies to this shape".into(),
        };
        let saved = at_best.map(|t| (b.mean_us - t).max(0.0) * b.count as f64);
        let rate = b.tflops.map(|t| format!(", {t:.1} TFLOP/s")).unwrap_or_default();
        out.push(Finding {
            severity: if b.share_of_gpu >= 0.10 {
                Severity::High
            } else if b.share_of_gpu >= 0.02 {
                Severity::Medium
            } else {
                Severity::Low
            },
            path: "B",
            title: format!(
                "{} backward in {} takes {:.2}x its forward ({:.1} vs {:.1} µs); FLOPs predict {BWD_FLOPS_RATIO}x",
                b.backend.name(),
                b.module.rsplit('/').next().unwrap_or(&b.module),
                ratio,
                b.mean_us,
                f.mean_us
            ),
            detail: format!(
                "{} backward calls (B,Hq,Hkv,Sq,Sk,D = {}, {}, mask {}{rate}) against the forward of the same layer. \
                 The backward does {BWD_FLOPS_RATIO}x the forward's FLOPs, so at equal rates it takes \
                 {BWD_FLOPS_RATIO}x its time; {expected}.{} Fix: {}.",
                b.count,
                b.shape_label(),
                b.dtype.as_deref().unwrap_or("?"),
                b.mask,
                saved.map(|s| format!(" Reaching that rate saves about {s:.1} µs over the step.")).unwrap_or_default(),
                advice(b)
            ),
            time_us: Some(b.total_us),
            expected_speedup: None,
            replay: backward_replay(b),
            replay_note: None,
            op_index: Some(i),
        });
    }
    out
}
