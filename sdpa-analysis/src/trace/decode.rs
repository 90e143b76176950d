//! Decoding judged by bytes: what a decode step's attention reads and what the GPU does between steps.
//!
//! - K/V bytes per call with Hkv heads (GQA reads each key/value head once for its group of query heads) at
//!   the element size the kernel reads: an FP8 cache (vLLM's `kv_cache_dtype` `fp8`/`fp8_e4m3`/`fp8_e5m2`, a
//!   1-byte K tensor) counts one byte, and a cache stored in FP8 but converted to bf16 right before SDPA is
//!   found ([`converted_kv`]): the kernel then reads twice the bytes the cache holds, and the conversion
//!   costs its own kernels.
//! - The split-KV combine kernels' share of a decode op's time (`flash_fwd_splitkv_combine_kernel`,
//!   vLLM's `paged_attention_v2_reduce_kernel`, FlashInfer's merge-states kernels).
//! - Launch gaps ([`gaps`]): GPU idle time between consecutive decode attention calls, from the trace's GPU
//!   timeline; a large share says the decode loop is CPU-bound (kernel launches from Python) and a CUDA graph
//!   would remove it.

use crate::trace::attention::{elem_bytes, AttentionCall, Phase};
use crate::trace::findings::{Finding, Severity};
use crate::trace::kineto::Trace;
use crate::trace::report::{AttentionOp, KernelTime};
use crate::trace::tree::{OpTree, NONE};
use sdpa_core::Shape;
use serde::Serialize;

/// What the trace shows about a call's K/V beyond its shape, and where its kernels ran on the GPU clock.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KvFacts {
    /// The element type of the K/V the kernel reads when it differs from Q's (a 1-byte vLLM cache is
    /// `unsigned char`), or vLLM's `kv_cache_dtype` argument when it names FP8.
    pub cache_dtype: Option<String>,
    /// The dtype K and V were stored in before a conversion right before the call (`c10::Float8_e4m3fn`).
    pub stored_dtype: Option<String>,
    /// GPU time of that conversion, µs.
    pub convert_us: f64,
    /// First kernel start and last kernel end of the call, µs on the trace's clock.
    pub gpu_span: Option<(f64, f64)>,
}

impl KvFacts {
    /// Extends the GPU span over one activity.
    pub fn widen(&mut self, start: f64, end: f64) {
        self.gpu_span = Some(match self.gpu_span {
            Some((a, b)) => (a.min(start), b.max(end)),
            None => (start, end),
        });
    }
}

/// The shape a call is grouped by: a dense decode call's with its cache length left out (Sk = 0), so that a
/// decode loop, whose cache grows by one token per step, is one op instead of one per step.
pub fn loop_key(c: &AttentionCall) -> Option<Shape> {
    match c.shape {
        Some(s) if c.ragged.is_none() && crate::trace::perf::is_decode(&s) => Some(Shape { sk: 0, ..s }),
        other => other,
    }
}

/// The shape of a group keyed by [`loop_key`]: for a decode loop, Sk is the members' mean cache length
/// (weighted by calls), with the shortest and longest.
pub fn loop_shape(key: Option<Shape>, members: &[&AttentionCall]) -> (Option<Shape>, Option<(usize, usize)>) {
    let Some(k) = key.filter(|k| k.sk == 0) else { return (key, None) };
    let sks: Vec<(usize, f64)> =
        members.iter().filter_map(|c| c.shape.map(|s| (s.sk, c.repeat.max(1) as f64))).collect();
    let n: f64 = sks.iter().map(|x| x.1).sum();
    if sks.is_empty() || n <= 0.0 {
        return (key, None);
    }
    let mean = (sks.iter().map(|(s, w)| *s as f64 * w).sum::<f64>() / n).round() as usize;
    let lo = sks.iter().map(|x| x.0).min().unwrap_or(mean);
    let hi = sks.iter().map(|x| x.0).max().unwrap_or(mean);
    (Some(Shape { sk: mean, ..k }), (lo != hi).then_some((lo, hi)))
}

/// vLLM's `kv_cache_dtype` values that store the cache in one byte per element.
pub fn is_fp8_name(t: &str) -> bool {
    let l = t.to_ascii_lowercase();
    l.contains("fp8") || l.contains("float8")
}

/// A decoding op judged by the bytes it reads.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvJudgement {
    /// K/V heads the bytes count (Hkv, not Hq).
    pub kv_heads: usize,
    /// Element type of the K/V the kernel reads (`bf16`, `fp8`, ...).
    pub kv_dtype: String,
    /// K and V bytes one call reads.
    pub kv_bytes: f64,
    /// `exact`, or how the bytes bound the truth (a paged batch without a key total).
    pub kv_bytes_are: &'static str,
    /// K/V bytes / mean time, TB/s.
    pub kv_tbps: f64,
    /// The dtype the cache is stored in when it is converted right before the call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stored_dtype: Option<String>,
    /// K/V bytes the cache holds in that stored dtype.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stored_bytes: Option<f64>,
    /// GPU time of the conversions over the group, µs.
    pub convert_us: f64,
    /// Split-KV combine kernels' time over the group, µs.
    pub combine_us: f64,
    /// combine / the group's attention time.
    pub combine_share: f64,
    /// The combine kernels by name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub combine_kernels: Vec<String>,
}

/// True for the kernels that merge split-KV partial results, as the implementation rules classify them
/// ([`crate::trace::attention::implementation`]: FlashAttention's combine, vLLM's v2 reduce, FlashInfer's merge,
/// cuDNN's lean reduction, CK's split-KV combine).
pub fn is_combine_kernel(name: &str) -> bool {
    use crate::trace::attention::implementation::{classify, Role};
    classify(name).is_some_and(|c| c.role == Role::Combine)
}

/// The byte judgement of a decoding op group (`decode`: Sq <= 16 against a longer cache), from its calls,
/// shape, Q dtype, kernels and total time.
pub fn judge_kv(
    members: &[&AttentionCall],
    shape: Option<Shape>,
    dtype: Option<&str>,
    kernels: &[KernelTime],
    total_us: f64,
    decode: bool,
) -> Option<KvJudgement> {
    let s = shape?;
    let first = members.first()?;
    if !decode || first.phase != Phase::Fwd {
        return None;
    }
    let q_eb = dtype.map(elem_bytes).unwrap_or(2.0);
    let read = first.kv.cache_dtype.as_deref();
    let kv_eb = read.map(elem_bytes).filter(|_| read.is_some_and(is_fp8_or_byte)).unwrap_or(q_eb);
    let kv_dtype = match read {
        Some(r) if is_fp8_or_byte(r) => "fp8".to_string(),
        _ => dtype.map(crate::trace::attention::dtype_label).unwrap_or_else(|| "?".into()),
    };
    let (tokens, kv_bytes_are) = match &first.ragged {
        Some(r) => match r.total_k {
            Some(t) => (t as f64, "exact"),
            None => ((r.sequences * r.max_k) as f64, "upper bound (sequences x longest cache)"),
        },
        None => ((s.b * s.sk) as f64, "exact"),
    };
    let elems = tokens * s.hkv as f64 * (s.d + s.dv) as f64;
    let kv_bytes = elems * kv_eb;
    let count = members.iter().map(|c| c.repeat as f64).sum::<f64>().max(1.0);
    let mean_us = total_us / count;
    let stored_dtype = first.kv.stored_dtype.clone();
    let stored_bytes = stored_dtype.as_deref().map(|t| elems * elem_bytes(t));
    let combine: Vec<&KernelTime> = kernels.iter().filter(|k| is_combine_kernel(&k.name)).collect();
    let combine_us: f64 = combine.iter().map(|k| k.total_us).sum();
    Some(KvJudgement {
        kv_heads: s.hkv,
        kv_dtype,
        kv_bytes,
        kv_bytes_are,
        kv_tbps: if mean_us > 0.0 { kv_bytes / (mean_us * 1e-6) / 1e12 } else { 0.0 },
        stored_dtype: stored_dtype.map(|t| crate::trace::attention::dtype_label(&t)),
        stored_bytes,
        convert_us: members.iter().map(|c| c.kv.convert_us * c.repeat as f64).sum(),
        combine_us,
        combine_share: if total_us > 0.0 { combine_us / total_us } else { 0.0 },
        combine_kernels: combine.iter().map(|k| k.name.clone()).collect(),
    })
}

fn is_fp8_or_byte(t: &str) -> bool {
    is_fp8_name(t) || elem_bytes(t) == 1.0
}

/// How far back on the thread [`converted_kv`] looks for the conversion of K and V.
const LOOKBACK: usize = 256;

/// The conversion of K or V from an FP8 store right before a decode call at `root`: `aten::to` /
/// `aten::_to_copy` ops under the same parent, before the call, whose input is FP8 and has K's (or V's) dims.
/// Returns the stored dtype and the conversions' GPU time.
pub fn converted_kv(tree: &OpTree<'_>, root: u32, kv_dims: &[&[i64]]) -> Option<(String, f64)> {
    let ops = &tree.trace.ops;
    let r = root as usize;
    let parent = tree.parent[r];
    let thread = ops[r].thread as usize;
    let list = tree.thread_ops.get(thread)?;
    let at = tree.pos[r] as usize;
    let parent_ts = if parent == NONE { f64::NEG_INFINITY } else { ops[parent as usize].ts };
    let mut found: Option<String> = None;
    let mut us = 0.0;
    for &o in list[..at].iter().rev().take(LOOKBACK) {
        let op = &ops[o as usize];
        if op.ts < parent_ts {
            break;
        }
        if tree.parent[o as usize] != parent {
            continue;
        }
        let name = tree.name(o);
        if name != "aten::to" && name != "aten::_to_copy" {
            continue;
        }
        let Some(args) = op.args.as_deref() else { continue };
        let (Some(ty), Some(dims)) = (args.ty(0), args.dim(0)) else { continue };
        if is_fp8_name(ty) && kv_dims.contains(&dims) {
            found.get_or_insert_with(|| ty.to_string());
            us += tree.incl_gpu_us[o as usize];
        }
    }
    found.map(|t| (t, us))
}

/// Launch gaps between consecutive decode attention calls on one trace's GPU timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecodeGaps {
    /// Decode attention calls on the timeline.
    pub calls: usize,
    /// Gaps measured (consecutive pairs).
    pub gaps: usize,
    /// Median GPU idle time between two consecutive calls, µs.
    pub median_idle_us: f64,
    /// Median time from one call's start to the next's, µs.
    pub median_period_us: f64,
    /// median idle / median period: the share of a decode period the GPU does nothing.
    pub idle_share: f64,
    /// GPU idle time summed over the gaps no longer than 10x the median period (longer ones are pauses
    /// between phases, not launch overhead), µs.
    pub total_idle_us: f64,
}

/// The GPU idle time between consecutive decode attention calls of one trace (`calls`: that trace's calls).
/// `None` with fewer than three decode calls.
pub fn gaps(trace: &Trace, calls: &[AttentionCall]) -> Option<DecodeGaps> {
    let mut spans: Vec<(f64, f64)> = calls
        .iter()
        .filter(|c| c.phase == Phase::Fwd && c.shape.is_some_and(|s| crate::trace::perf::is_decode(&s)))
        .filter_map(|c| c.kv.gpu_span)
        .collect();
    if spans.len() < 3 {
        return None;
    }
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    // The GPU timeline: activities by start, with the latest end so far, to measure busy time in a window.
    let mut order: Vec<u32> = (0..trace.gpu.len() as u32).collect();
    order.sort_by(|&a, &b| trace.gpu[a as usize].ts.total_cmp(&trace.gpu[b as usize].ts));
    let mut reach = Vec::with_capacity(order.len());
    let mut m = f64::NEG_INFINITY;
    for &g in &order {
        let a = &trace.gpu[g as usize];
        m = m.max(a.ts + a.dur);
        reach.push(m);
    }
    let idle_in = |a: f64, b: f64| -> f64 {
        if b <= a {
            return 0.0;
        }
        // Busy from a up to the latest end of anything that started before a.
        let i = order.partition_point(|&g| trace.gpu[g as usize].ts < a);
        let mut covered = if i > 0 { reach[i - 1].clamp(a, b) } else { a };
        let mut idle = 0.0;
        for &g in &order[i..] {
            let act = &trace.gpu[g as usize];
            if act.ts >= b {
                break;
            }
            if act.ts > covered {
                idle += act.ts - covered;
            }
            covered = covered.max((act.ts + act.dur).min(b));
        }
        idle + (b - covered).max(0.0)
    };
    let mut idles = Vec::with_capacity(spans.len() - 1);
    let mut periods = Vec::with_capacity(spans.len() - 1);
    for w in spans.windows(2) {
        idles.push(idle_in(w[0].1, w[1].0));
        periods.push(w[1].0 - w[0].0);
    }
    let median_period = median(&periods);
    let total_idle: f64 = idles.iter().zip(&periods).filter(|(_, &p)| p <= 10.0 * median_period).map(|(i, _)| *i).sum();
    let median_idle = median(&idles);
    Some(DecodeGaps {
        calls: spans.len(),
        gaps: idles.len(),
        median_idle_us: median_idle,
        median_period_us: median_period,
        idle_share: if median_period > 0.0 { median_idle / median_period } else { 0.0 },
        total_idle_us: total_idle,
    })
}

fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Above this idle share of a decode period the loop is called CPU-bound.
pub const CPU_BOUND_IDLE: f64 = 0.20;

/// The finding about launch gaps, when the GPU idles between decode calls.
pub fn gap_finding(g: &DecodeGaps) -> Option<Finding> {
    if g.idle_share < CPU_BOUND_IDLE {
        return None;
    }
    let severity = if g.idle_share >= 0.5 { Severity::High } else { Severity::Medium };
    Some(Finding {
        severity,
        path: "B",
        title: format!(
            "Decode loop is CPU-bound: the GPU idles {:.0} % of each decode period ({:.1} µs of {:.1} µs between \
             consecutive attention calls)",
            g.idle_share * 100.0,
            g.median_idle_us,
            g.median_period_us
        ),
        detail: format!(
            "Over {} decode attention calls ({} gaps), the GPU had no kernel running for a median {:.1} µs between \
             one call's end and the next one's start, {:.1} µs in all (pauses longer than 10x the median period \
             left out). Launching kernels one at a time from Python keeps the GPU busy only when each kernel runs \
             longer than its launch takes; a decode step's kernels are short, so the GPU waits on the CPU. Capture the decode step in \
             a CUDA graph: torch.compile(model, mode=\"reduce-overhead\") with a static KV cache \
             (transformers: cache_implementation=\"static\"), or a server that replays CUDA graphs for decode \
             (vLLM, SGLang, TensorRT-LLM); the gap is what it can save.",
            g.calls, g.gaps, g.median_idle_us, g.total_idle_us
        ),
        time_us: Some(g.total_idle_us),
        expected_speedup: None,
        replay: None,
        replay_note: None,
        op_index: None,
    })
}

/// Puts the launch gaps in the report with their findings, ranked among the others.
pub fn attach_gaps(report: &mut crate::trace::report::TraceReport, gaps: Vec<DecodeGaps>) {
    report.findings.extend(gaps.iter().filter_map(gap_finding));
    report.findings.sort_by(|a, b| {
        a.severity.cmp(&b.severity).then(b.time_us.unwrap_or(0.0).total_cmp(&a.time_us.unwrap_or(0.0)))
    });
    report.decode_gaps = gaps;
}

/// Findings about decode ops' bytes: an FP8 store converted before the kernel, and split-KV combine time.
pub fn findings(ops: &[AttentionOp]) -> Vec<Finding> {
    let mut out = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let Some(kv) = &op.kv else { continue };
        if let (Some(stored), Some(stored_bytes)) = (&kv.stored_dtype, kv.stored_bytes) {
            let mib = |b: f64| b / (1u64 << 20) as f64;
            out.push(Finding {
                severity: if op.share_of_gpu >= 0.02 { Severity::Medium } else { Severity::Low },
                path: "B",
                title: format!(
                    "FP8 KV cache converted to {} before attention: the kernel reads {:.1}x the bytes the cache holds",
                    kv.kv_dtype,
                    kv.kv_bytes / stored_bytes
                ),
                detail: format!(
                    "{} decode calls (B,Hq,Hkv,Sq,Sk,D = {}): K and V are stored as {stored} ({:.1} MiB per call \
                     with {} KV heads) but converted to {} right before SDPA, so the attention kernel reads {:.1} \
                     MiB per call and the conversions take {:.1} µs of GPU time besides ({:.1} µs of attention). \
                     A kernel that reads the FP8 cache directly (vLLM kv_cache_dtype=\"fp8\", FlashInfer or \
                     FlashAttention-3 with an FP8 KV cache) reads half the bytes and needs no conversion.",
                    op.count,
                    op.shape_label(),
                    mib(stored_bytes),
                    kv.kv_heads,
                    kv.kv_dtype,
                    mib(kv.kv_bytes),
                    kv.convert_us,
                    op.total_us
                ),
                time_us: Some(kv.convert_us + op.total_us * (1.0 - stored_bytes / kv.kv_bytes).max(0.0)),
                expected_speedup: None,
                replay: None,
                replay_note: None,
                op_index: Some(i),
            });
        }
        if kv.combine_us > 0.0 {
            out.push(Finding {
                severity: Severity::Info,
                path: "-",
                title: format!(
                    "Split-KV decode: combine kernels take {:.1} % of {}'s decode attention time",
                    kv.combine_share * 100.0,
                    op.backend.name()
                ),
                detail: format!(
                    "{} calls (B,Hq,Hkv,Sq,Sk,D = {}) split each sequence's keys across thread blocks and merge the \
                     partial results in a second kernel ({}): {:.1} µs of {:.1} µs. The split keeps the GPU busy \
                     at small batch; a large combine share says the splits are too many for the cache length.",
                    op.count,
                    op.shape_label(),
                    kv.combine_kernels.join(", "),
                    kv.combine_us,
                    op.total_us
                ),
                time_us: Some(kv.combine_us),
                expected_speedup: None,
                replay: None,
                replay_note: None,
                op_index: Some(i),
            });
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn combine_kernels_are_named() {
        assert!(is_combine_kernel(
            "void pytorch_flash::flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<128, 64>>"
        ));
        assert!(is_combine_kernel("void vllm::paged_attention_v2_reduce_kernel<c10::BFloat16, 128>"));
        assert!(is_combine_kernel("void cudnn::fusion::lean_reduction_kernel<false, false, false>(void*)"));
        assert!(!is_combine_kernel("void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64>>"));
    }

    #[test]
    fn fp8_names_count_one_byte() {
        for t in ["fp8", "fp8_e4m3", "fp8_e5m2", "c10::Float8_e4m3fn", "unsigned char"] {
            assert!(is_fp8_or_byte(t), "{t}");
        }
        assert!(!is_fp8_or_byte("auto") && !is_fp8_or_byte("c10::BFloat16"));
    }

    #[test]
    fn median_of_even_and_odd() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }
}
