//! Before / after: two analyses of the same model compared op by op (`sdpa analyze --diff BEFORE AFTER`).
//!
//! Attention ops are matched by what they compute, never by how: the module path (instance numbers removed),
//! the pass, the full shape (B, Hq, Hkv, Sq, Sk, D, Dv), the dtype and the batch layout must agree, so a
//! different shape is never matched. Ops that also agree on the mask and variants match first; the rest are then
//! matched on the same key without the mask, because replacing an eager chain by SDPA usually replaces an
//! explicit additive mask by `is_causal` (the match says so, and that the two efficiencies count different
//! work). Several ops of one side under one key (layers forced onto different backends) form one side of the
//! match, their times summed and their efficiencies weighted by time. An op whose shape the trace did not
//! record matches only an op of the same backend under the same key.
//!
//! Each match says what changed ([`Change`]): Path A realised (an unfused chain or SDPA's math fallback
//! replaced by a fused kernel), regressed (the reverse), another fused backend, or faster / slower / unchanged
//! per call. Ops on one side only are listed as appeared or disappeared. Time deltas add up: the attention
//! delta of the two reports equals the matched deltas plus what appeared minus what disappeared.
//!
//! [`analyze_both`] analyses the two inputs on two threads; [`TraceDiff::new`] compares the reports.

use crate::error::Result;
use crate::trace::analyze::{analyze_path, Options};
use crate::trace::attention::{Kind, Phase};
use crate::trace::report::{AttentionOp, TraceReport};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// A per-call time change smaller than this fraction is called unchanged: one profiled step is noisy.
pub const UNCHANGED_WITHIN: f64 = 0.03;

/// The comparison of two reports.
#[derive(Debug, Clone, Serialize)]
pub struct TraceDiff {
    /// The report before the change.
    pub before: Side,
    /// The report after it.
    pub after: Side,
    /// After's attention time minus before's, µs (negative: attention got faster).
    pub attention_delta_us: f64,
    /// After's total GPU time minus before's, µs.
    pub gpu_delta_us: f64,
    /// Before's attention time / after's (above 1: faster), when both are positive.
    pub attention_speedup: Option<f64>,
    /// Ops found on both sides, largest time change first.
    pub matched: Vec<Matched>,
    /// Ops only after the change, largest first.
    pub appeared: Vec<Unmatched>,
    /// Ops only before the change, largest first.
    pub disappeared: Vec<Unmatched>,
    /// Matches where Path A was realised (unfused or math replaced by a fused kernel).
    pub path_a_realised: usize,
    /// Matches that regressed from a fused kernel to an unfused chain or the math fallback, plus unfused ops
    /// that appeared.
    pub regressed: usize,
    /// What the reader should know about the comparison itself (different devices, inputs without shapes).
    pub notes: Vec<String>,
}

/// One report, summarised for the comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    /// Its files.
    pub inputs: Vec<String>,
    /// Its device (the hardware-table name, or as the trace named it).
    pub device: Option<String>,
    /// Total GPU time, µs.
    pub total_gpu_time_us: f64,
    /// Attention GPU time, µs.
    pub attention_time_us: f64,
    /// Attention / total GPU time.
    pub attention_share: f64,
    /// Fused attention time, µs.
    pub fused_time_us: f64,
    /// Unfused attention time, µs.
    pub unfused_time_us: f64,
    /// Attention calls.
    pub attention_calls: usize,
    /// Efficiency of its attention, weighted by time over the ops that have one (None when none has).
    pub efficiency: Option<f64>,
    /// Number of findings.
    pub findings: usize,
}

/// What changed between the two sides of a match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Path A realised: an unfused chain (or SDPA's math fallback) became a fused kernel.
    Fused,
    /// Regressed: a fused kernel became an unfused chain or the math fallback.
    Unfused,
    /// Another implementation (backend) of the same kind.
    Backend,
    /// Faster per call by more than [`UNCHANGED_WITHIN`].
    Faster,
    /// Slower per call by more than [`UNCHANGED_WITHIN`].
    Slower,
    /// Within [`UNCHANGED_WITHIN`] per call.
    Unchanged,
}

impl Change {
    /// Words for tables: `Path A realised (fused)`, `regressed (unfused)`, `backend changed`, ...
    pub fn label(self) -> &'static str {
        match self {
            Change::Fused => "Path A realised (now fused)",
            Change::Unfused => "regressed (now unfused)",
            Change::Backend => "backend changed",
            Change::Faster => "faster",
            Change::Slower => "slower",
            Change::Unchanged => "unchanged",
        }
    }
}

/// One side of a match: the ops of one report under the match's key.
#[derive(Debug, Clone, Serialize)]
pub struct OpSet {
    /// Indices into that report's `attention_ops`.
    pub ops: Vec<usize>,
    /// `kind backend` of each op (`unfused eager`, `fused cudnn`).
    pub implementations: Vec<String>,
    /// Mask and variants of each op, deduplicated.
    pub masks: Vec<String>,
    /// True when every op ran a fused (flash-style) kernel.
    pub fused: bool,
    /// Layer instances (innermost module), deduplicated.
    pub layers: Vec<String>,
    /// Calls.
    pub count: usize,
    /// Total GPU time, µs.
    pub total_us: f64,
    /// Mean GPU time per call, µs.
    pub mean_us: f64,
    /// Efficiency weighted by time (None unless every op has one).
    pub efficiency: Option<f64>,
    /// Achieved TFLOP/s weighted by time (None unless every op has one).
    pub tflops: Option<f64>,
}

/// Ops found on both sides.
#[derive(Debug, Clone, Serialize)]
pub struct Matched {
    /// Module path, instance numbers removed (`-` when unknown).
    pub module: String,
    /// Pass.
    pub phase: Phase,
    /// `B,Hq,Hkv,Sq,Sk,D` (or `?`).
    pub shape: String,
    /// Dtype.
    pub dtype: Option<String>,
    /// Batch layout (`dense`, or the varlen / paged batch).
    pub layout: String,
    /// Before the change.
    pub before: OpSet,
    /// After it.
    pub after: OpSet,
    /// What changed.
    pub change: Change,
    /// After's total minus before's, µs.
    pub time_delta_us: f64,
    /// After's mean per call minus before's, µs.
    pub mean_delta_us: f64,
    /// Before's mean per call / after's (above 1: faster).
    pub speedup: Option<f64>,
    /// After's efficiency minus before's (fractions of peak).
    pub efficiency_delta: Option<f64>,
    /// True when matched without the mask (the masks differ).
    pub mask_changed: bool,
    /// What to keep in mind reading this match.
    pub notes: Vec<String>,
}

/// An op found on one side only.
#[derive(Debug, Clone, Serialize)]
pub struct Unmatched {
    /// Index into its report's `attention_ops`.
    pub op: usize,
    /// Module path (`-` when unknown).
    pub module: String,
    /// Pass.
    pub phase: Phase,
    /// `kind backend`.
    pub implementation: String,
    /// True when it ran a fused kernel.
    pub fused: bool,
    /// `B,Hq,Hkv,Sq,Sk,D` (or `?`).
    pub shape: String,
    /// Dtype.
    pub dtype: Option<String>,
    /// Mask and variants.
    pub mask: String,
    /// Calls.
    pub count: usize,
    /// Total GPU time, µs.
    pub total_us: f64,
    /// Efficiency.
    pub efficiency: Option<f64>,
    /// What it means (`regressed: unfused attention appeared`, ...).
    pub meaning: String,
}

/// Analyses two inputs (trace files or per-rank directories) at once, on two threads, with their own options
/// (each its own progress callback). The first error is returned, naming its file.
pub fn analyze_both(before: &Path, after: &Path, opts: [&Options; 2]) -> Result<(TraceReport, TraceReport)> {
    let [ob, oa] = opts;
    let (b, a) = std::thread::scope(|s| {
        let hb = s.spawn(|| analyze_path(before, ob));
        let a = analyze_path(after, oa);
        // A panic in the other thread is a bug, not bad input: let it continue as one.
        let b = hb.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        (b, a)
    });
    Ok((b?, a?))
}

/// True when the op ran a flash-style fused kernel (not an eager chain, not SDPA's math fallback).
fn is_fused(o: &AttentionOp) -> bool {
    o.kind == Kind::Fused && o.fused_kernel
}

/// What must agree for two ops to match, without the mask.
fn loose_key(o: &AttentionOp) -> String {
    // An op without a recorded shape matches only the same backend: nothing else ties two unknown shapes.
    let backend = if o.shape().is_none() { o.backend.name() } else { "" };
    format!(
        "{}\u{1f}{}\u{1f}{}\u{1f}{}\u{1f}{}\u{1f}{}",
        o.module,
        o.phase.name(),
        o.shape_label(),
        o.dtype.as_deref().unwrap_or("?"),
        o.layout_label(),
        backend
    )
}

fn strict_key(o: &AttentionOp) -> String {
    format!("{}\u{1f}{}", loose_key(o), o.mask_and_variants())
}

fn weighted(ops: &[&AttentionOp], f: impl Fn(&AttentionOp) -> Option<f64>) -> Option<f64> {
    let mut num = 0.0;
    let mut den = 0.0;
    for o in ops {
        num += f(o)? * o.total_us;
        den += o.total_us;
    }
    (den > 0.0).then(|| num / den)
}

fn push_new(list: &mut Vec<String>, s: &str) {
    if !list.iter().any(|x| x == s) {
        list.push(s.to_string());
    }
}

fn implementation(o: &AttentionOp) -> String {
    format!("{} {}", o.kind.name(), o.backend.name())
}

fn op_set(report: &TraceReport, idx: &[usize]) -> OpSet {
    let ops: Vec<&AttentionOp> = idx.iter().filter_map(|&i| report.attention_ops.get(i)).collect();
    let mut set = OpSet {
        ops: idx.to_vec(),
        implementations: Vec::new(),
        masks: Vec::new(),
        fused: ops.iter().all(|o| is_fused(o)),
        layers: Vec::new(),
        count: ops.iter().map(|o| o.count).sum(),
        total_us: ops.iter().fold(0.0, |a, o| a + o.total_us),
        mean_us: 0.0,
        efficiency: weighted(&ops, |o| o.efficiency),
        tflops: weighted(&ops, |o| o.tflops),
    };
    for o in &ops {
        push_new(&mut set.implementations, &implementation(o));
        push_new(&mut set.masks, &o.mask_and_variants());
        for l in &o.layers {
            push_new(&mut set.layers, l);
        }
    }
    set.mean_us = if set.count > 0 { set.total_us / set.count as f64 } else { 0.0 };
    set
}

fn side(r: &TraceReport) -> Side {
    let ops: Vec<&AttentionOp> = r.attention_ops.iter().filter(|o| o.efficiency.is_some()).collect();
    let s = &r.summary;
    Side {
        inputs: r.inputs.clone(),
        device: r.device.spec.clone().or_else(|| r.device.name.clone()),
        total_gpu_time_us: s.total_gpu_time_us,
        attention_time_us: s.attention_time_us,
        attention_share: s.attention_share,
        fused_time_us: s.fused_time_us,
        unfused_time_us: s.unfused_time_us,
        attention_calls: s.attention_calls,
        efficiency: weighted(&ops, |o| o.efficiency),
        findings: r.findings.len(),
    }
}

fn change(before: &OpSet, after: &OpSet) -> Change {
    if !before.fused && after.fused {
        Change::Fused
    } else if before.fused && !after.fused {
        Change::Unfused
    } else if before.implementations != after.implementations {
        Change::Backend
    } else if before.mean_us > 0.0 && after.mean_us < before.mean_us * (1.0 - UNCHANGED_WITHIN) {
        Change::Faster
    } else if after.mean_us > before.mean_us * (1.0 + UNCHANGED_WITHIN) {
        Change::Slower
    } else {
        Change::Unchanged
    }
}

fn matched(b: &TraceReport, a: &TraceReport, bi: &[usize], ai: &[usize], mask_changed: bool) -> Option<Matched> {
    let first = b.attention_ops.get(*bi.first()?)?;
    let before = op_set(b, bi);
    let after = op_set(a, ai);
    let mut notes = Vec::new();
    if mask_changed {
        notes.push(format!(
            "masks differ ({} -> {}): each side's FLOPs and efficiency count the pairs its own mask leaves (an \
             explicit mask's values are not in a trace, so it counts every pair); compare times",
            before.masks.join(", "),
            after.masks.join(", ")
        ));
    }
    if before.count != after.count {
        notes.push(format!(
            "{} calls before, {} after: the total delta mixes the change per call with the number of calls",
            before.count, after.count
        ));
    }
    Some(Matched {
        module: first.module.clone(),
        phase: first.phase,
        shape: first.shape_label(),
        dtype: first.dtype.clone(),
        layout: first.layout_label(),
        change: change(&before, &after),
        time_delta_us: after.total_us - before.total_us,
        mean_delta_us: after.mean_us - before.mean_us,
        speedup: (after.mean_us > 0.0 && before.mean_us > 0.0).then(|| before.mean_us / after.mean_us),
        efficiency_delta: before.efficiency.zip(after.efficiency).map(|(x, y)| y - x),
        mask_changed,
        notes,
        before,
        after,
    })
}

fn unmatched(r: &TraceReport, i: usize, appeared: bool) -> Option<Unmatched> {
    let o = r.attention_ops.get(i)?;
    let fused = is_fused(o);
    let meaning = match (appeared, fused) {
        (true, false) => "regressed: unfused attention appeared (a Path A candidate)",
        (true, true) => "new fused attention",
        (false, false) => "unfused attention gone",
        (false, true) => "fused attention gone",
    };
    Some(Unmatched {
        op: i,
        module: o.module.clone(),
        phase: o.phase,
        implementation: implementation(o),
        fused,
        shape: o.shape_label(),
        dtype: o.dtype.clone(),
        mask: o.mask_and_variants(),
        count: o.count,
        total_us: o.total_us,
        efficiency: o.efficiency,
        meaning: meaning.to_string(),
    })
}

/// Ops of a report by key, in report order (largest first).
fn by_key(r: &TraceReport, key: impl Fn(&AttentionOp) -> String, keep: &[bool]) -> BTreeMap<String, Vec<usize>> {
    let mut m: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, o) in r.attention_ops.iter().enumerate() {
        if keep.get(i).copied().unwrap_or(false) {
            m.entry(key(o)).or_default().push(i);
        }
    }
    m
}

impl TraceDiff {
    /// Compares `before` with `after`.
    pub fn new(before: &TraceReport, after: &TraceReport) -> Self {
        let mut left_b = vec![true; before.attention_ops.len()];
        let mut left_a = vec![true; after.attention_ops.len()];
        let mut matches = Vec::new();
        for mask_changed in [false, true] {
            let key = |o: &AttentionOp| if mask_changed { loose_key(o) } else { strict_key(o) };
            let kb = by_key(before, key, &left_b);
            let ka = by_key(after, key, &left_a);
            for (k, bi) in &kb {
                let Some(ai) = ka.get(k) else { continue };
                matches.extend(matched(before, after, bi, ai, mask_changed));
                bi.iter().for_each(|&i| left_b[i] = false);
                ai.iter().for_each(|&i| left_a[i] = false);
            }
        }
        matches.sort_by(|x, y| y.time_delta_us.abs().total_cmp(&x.time_delta_us.abs()));
        let collect = |r: &TraceReport, left: &[bool], appeared: bool| -> Vec<Unmatched> {
            let mut v: Vec<Unmatched> =
                (0..left.len()).filter(|&i| left[i]).filter_map(|i| unmatched(r, i, appeared)).collect();
            v.sort_by(|x, y| y.total_us.total_cmp(&x.total_us));
            v
        };
        let appeared = collect(after, &left_a, true);
        let disappeared = collect(before, &left_b, false);
        let (sb, sa) = (side(before), side(after));
        let mut notes = Vec::new();
        if sb.device != sa.device {
            notes.push(format!(
                "the two inputs ran on different devices ({} and {}): time deltas mix the change with the hardware",
                sb.device.as_deref().unwrap_or("unknown"),
                sa.device.as_deref().unwrap_or("unknown")
            ));
        }
        let unshaped = before.attention_ops.iter().chain(&after.attention_ops).filter(|o| o.shape().is_none()).count();
        if unshaped > 0 {
            notes.push(format!(
                "{unshaped} ops have no recorded shape: they match only the same backend under the same module"
            ));
        }
        let path_a_realised = matches.iter().filter(|m| m.change == Change::Fused).count();
        let regressed = matches.iter().filter(|m| m.change == Change::Unfused).count()
            + appeared.iter().filter(|u| !u.fused).count();
        TraceDiff {
            attention_delta_us: sa.attention_time_us - sb.attention_time_us,
            gpu_delta_us: sa.total_gpu_time_us - sb.total_gpu_time_us,
            attention_speedup: (sa.attention_time_us > 0.0 && sb.attention_time_us > 0.0)
                .then(|| sb.attention_time_us / sa.attention_time_us),
            before: sb,
            after: sa,
            matched: matches,
            appeared,
            disappeared,
            path_a_realised,
            regressed,
            notes,
        }
    }

    /// Matched deltas plus what appeared minus what disappeared, µs: equal to [`TraceDiff::attention_delta_us`]
    /// up to rounding (every attention call belongs to one op).
    pub fn accounted_delta_us(&self) -> f64 {
        let m = self.matched.iter().fold(0.0, |a, x| a + x.time_delta_us);
        let up = self.appeared.iter().fold(0.0, |a, x| a + x.total_us);
        let down = self.disappeared.iter().fold(0.0, |a, x| a + x.total_us);
        m + up - down
    }
}
