//! The forward/backward balance of a training step's attention: each backward op against the forward op of
//! the same layer (module, backend, shape, dtype, mask, variants and layout).
//!
//! The backward does 2.5x the forward's FLOPs (masks counted exactly, [`crate::trace::perf`]), so at equal
//! rates it takes 2.5x the forward's time; at each pass's best known rate ([`crate::trace::frontier`]) the
//! ratio is 2.5x the forward's best rate over the backward's. Every pair is listed in one info finding; a
//! backward that takes more than 1.25x the FLOPs ratio of its forward's time while below its own frontier
//! (or, where no entry applies, more than 4x its forward) gets a Path B finding with what to switch to and a
//! `sdpa bench --pass bwd` replay.

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

/// A backward taking more than this times the FLOPs ratio of its forward's time is slow against its forward.
pub const SLOW_AGAINST_FORWARD: f64 = 1.25;

/// One pair of a layer's forward and backward ops.
struct Pair<'a> {
    i: usize,
    f: &'a AttentionOp,
    b: &'a AttentionOp,
    /// Backward time / forward time.
    ratio: f64,
    /// The ratio at the best known forward and backward rates, when both apply.
    at_best: Option<f64>,
}

/// Whether a pair is out of balance: the backward takes more than [`SLOW_AGAINST_FORWARD`] x the FLOPs ratio of
/// its forward and is below its frontier, or, with no frontier entry, more than
/// [`UNBALANCED_WITHOUT_FRONTIER`] x.
fn unbalanced(p: &Pair<'_>) -> bool {
    match &p.b.frontier {
        Some(fr) => fr.verdict == Verdict::Below && p.ratio > SLOW_AGAINST_FORWARD * BWD_FLOPS_RATIO,
        None => p.ratio > UNBALANCED_WITHOUT_FRONTIER,
    }
}

/// The balance findings: one info finding listing every forward/backward pair, and a Path B finding for each
/// backward out of balance with its forward.
pub fn findings(ops: &[AttentionOp]) -> Vec<Finding> {
    let pairs: Vec<Pair<'_>> = ops
        .iter()
        .enumerate()
        .filter(|(_, b)| b.phase == Phase::Bwd && b.mean_us > 0.0)
        .filter_map(|(i, b)| {
            let f = forward_of(ops, b)?;
            let at_best = match (&f.frontier, &b.frontier) {
                (Some(ff), Some(bf)) => Some(BWD_FLOPS_RATIO * ff.best.tflops / bf.best.tflops),
                _ => None,
            };
            Some(Pair { i, f, b, ratio: b.mean_us / f.mean_us, at_best })
        })
        .collect();
    let mut out = Vec::new();
    if pairs.is_empty() {
        return out;
    }
    let lines: Vec<String> = pairs
        .iter()
        .map(|p| {
            format!(
                "{} {} ({}): backward {:.1} µs / forward {:.1} µs = {:.2}x{}",
                p.b.backend.name(),
                p.b.shape_label(),
                p.b.mask,
                p.b.mean_us,
                p.f.mean_us,
                p.ratio,
                p.at_best.map(|r| format!(" (at the best known rates: {r:.2}x)")).unwrap_or_default()
            )
        })
        .collect();
    out.push(Finding {
        severity: Severity::Info,
        path: "-",
        title: format!("Backward/forward balance of {} attention layer(s)", pairs.len()),
        detail: format!(
            "The backward does {BWD_FLOPS_RATIO}x the forward's FLOPs, so at equal rates it takes {BWD_FLOPS_RATIO}x \
             the forward's time; at the best known rates of each pass the ratio is that times the forward's best \
             rate over the backward's. {}.",
            lines.join("; ")
        ),
        time_us: Some(pairs.iter().map(|p| p.b.total_us + p.f.total_us).sum()),
        expected_speedup: None,
        replay: None,
        replay_note: None,
        op_index: None,
    });
    for p in pairs.iter().filter(|p| unbalanced(p)) {
        let b = p.b;
        let expected = match (&b.frontier, p.at_best) {
            (Some(fr), Some(r)) => format!(
                "at the best known backward rate ({:.1} TFLOP/s, {}, {}; {}) it would take {:.1} µs; at both \
                 passes' best known rates the ratio is {r:.2}x",
                fr.best.tflops, fr.best.kernel, fr.best.how, fr.best.source, fr.best_us
            ),
            (Some(fr), None) => format!(
                "at the best known backward rate ({:.1} TFLOP/s, {}; {}) it would take {:.1} µs",
                fr.best.tflops, fr.best.kernel, fr.best.source, fr.best_us
            ),
            _ => "no best known backward rate applies to this shape".into(),
        };
        let saved = b.frontier.as_ref().map(|fr| (b.mean_us - fr.best_us).max(0.0) * b.count as f64);
        let rate = b.tflops.map(|t| format!(", {t:.1} TFLOP/s")).unwrap_or_default();
        out.push(Finding {
            severity: crate::trace::findings::severity_for_share(b.share_of_gpu),
            path: "B",
            title: format!(
                "{} backward in {} takes {:.2}x its forward ({:.1} vs {:.1} µs); FLOPs predict {BWD_FLOPS_RATIO}x",
                b.backend.name(),
                crate::trace::findings::where_(b),
                p.ratio,
                b.mean_us,
                p.f.mean_us
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
            op_index: Some(p.i),
        });
    }
    out
}
