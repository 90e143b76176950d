//! Findings: what to do about the attention ops, ranked by the GPU time at stake.
//!
//! Path A (model level): unfused attention, or SDPA's math fallback, should move to a fused kernel;
//! the expected speedup is our own measured unfused/fused ratio on that shape when benchmark records are
//! given, otherwise the seed's 3-10x range, labelled as such. Path B (kernel level): a fused kernel below
//! the best known rate for its device, dtype, pass, head dim, mask and length ([`crate::trace::frontier`]; at
//! or near it, an info finding that says so), or, where no frontier entry applies, below the expected
//! efficiency band for its sequence length, with what to check. Backward ops out of balance with their
//! forward ([`crate::trace::balance`]) and decode ops judged by bytes ([`crate::trace::decode`]) add theirs. Short sequences, where low
//! efficiency is expected, are reported as such and not flagged. Every finding about an op carries a
//! replay that runs the same shape on our backends.

use crate::results::evidence::{measured_ratio, same_problem};
use crate::trace::attention::{AttnBackend, BatchLayout, Kind, WorkBound};
use crate::trace::replay::Replay;
use crate::trace::report::{AttentionOp, DeviceInfo, Summary};
use sdpa_core::{BenchRecord, BenchSpec, DType, Layout};
use serde::Serialize;

/// How much a finding matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Large share of GPU time at stake.
    High,
    /// Worth doing.
    Medium,
    /// Small.
    Low,
    /// Context, not a problem.
    Info,
}

impl Severity {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Severity::High => "high",
            Severity::Medium => "medium",
            Severity::Low => "low",
            Severity::Info => "info",
        }
    }
}

/// An expected speedup range and where it comes from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Speedup {
    /// Lower edge, x.
    pub low: f64,
    /// Upper edge, x.
    pub high: f64,
    /// `measured: ...` or `seed range (not measured on this shape)`.
    pub source: String,
}

/// One finding.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// Severity.
    pub severity: Severity,
    /// `A` (fuse / migrate), `B` (tune the kernel) or `-` (context).
    pub path: &'static str,
    /// One line.
    pub title: String,
    /// The evidence and what to do.
    pub detail: String,
    /// GPU time the finding is about, µs.
    pub time_us: Option<f64>,
    /// Expected speedup of the fix (Path A).
    pub expected_speedup: Option<Speedup>,
    /// The `sdpa bench` command and spec that run this shape on our backends.
    pub replay: Option<Replay>,
    /// Why an op's finding has no replay (a varlen or paged batch whose sequence lengths the trace does not
    /// give).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_note: Option<String>,
    /// Index into the report's `attention_ops`.
    pub op_index: Option<usize>,
}

/// Seed range for fusing eager attention (Path A) when we have no measurement.
pub const SEED_SPEEDUP: (f64, f64) = (3.0, 10.0);

/// Builds the findings.
pub fn findings(
    ops: &[AttentionOp],
    summary: &Summary,
    device: &DeviceInfo,
    missing: &[String],
    bench: &[BenchRecord],
) -> Vec<Finding> {
    let mut out = Vec::new();
    let gpu_backend = if device.key.as_deref().is_some_and(|k| k.starts_with("zen")) { "cpu" } else { "cuda" };
    for (i, op) in ops.iter().enumerate() {
        let replay = replay_for(op, gpu_backend);
        let mut f = if op.kind == Kind::Unfused {
            Some(unfused_finding(i, op, device, bench, replay))
        } else if op.backend == AttnBackend::Math {
            Some(math_finding(i, op, replay))
        } else {
            fused_finding(i, op, device, bench, replay)
        };
        if let Some(f) = f.as_mut().filter(|f| f.replay.is_none()) {
            f.replay_note = no_replay_reason(op);
        }
        out.extend(f);
    }
    if let Some(f) = cache_write_finding(summary) {
        out.push(f);
    }
    out.extend(crate::trace::balance::findings(ops));
    out.extend(crate::trace::decode::findings(ops));
    let backends: Vec<&AttentionOp> = ops.iter().filter(|o| o.kind == Kind::Fused && o.fused_kernel).collect();
    if backends.iter().any(|o| o.backend == AttnBackend::Cudnn) {
        let k = backends
            .iter()
            .filter(|o| o.backend == AttnBackend::Cudnn)
            .flat_map(|o| o.kernels.first())
            .map(|k| k.name.as_str())
            .next()
            .unwrap_or("cudnn ... sdpa kernel");
        out.push(Finding {
            severity: Severity::Info,
            path: "-",
            title: "Flash attention is in use: SDPA dispatched to cuDNN's fused attention".into(),
            detail: format!(
                "cuDNN's SDPA kernel ({}) is a flash-attention kernel (tiled, online softmax, no score matrix \
                 in memory; on Hopper it uses wgmma). Do not 'migrate to flash attention': on H100 cuDNN \
                 measured 1.3-2x PyTorch's FlashAttention-2 backend at S = 512..16k (ANCHORS.md).",
                truncate(k, 90)
            ),
            time_us: Some(backends.iter().filter(|o| o.backend == AttnBackend::Cudnn).map(|o| o.total_us).sum()),
            expected_speedup: None,
            replay: None,
            replay_note: None,
            op_index: None,
        });
    }
    if summary.total_gpu_time_us > 0.0 {
        let share = summary.attention_share;
        let detail = if summary.attention_calls == 0 {
            "No attention was found: no SDPA / flash-attn op, no attention kernel, and no matmul-softmax-matmul \
             chain with matching shapes. If the model has attention, the trace may lack shapes (record_shapes) or \
             CPU ops."
                .to_string()
        } else if share < 0.05 {
            format!(
                "Attention takes {:.1} % of GPU time: speeding it up cannot gain more than that. Look at the \
                 other {:.1} % first.",
                share * 100.0,
                (1.0 - share) * 100.0
            )
        } else {
            format!(
                "Fused: {:.1} µs, unfused: {:.1} µs, over {} calls. Attention's share bounds what any \
                 attention fix can save (Amdahl).",
                summary.fused_time_us, summary.unfused_time_us, summary.attention_calls
            )
        };
        out.push(Finding {
            severity: Severity::Info,
            path: "-",
            title: format!(
                "Attention is {:.1} % of GPU time ({:.1} µs of {:.1} µs)",
                share * 100.0,
                summary.attention_time_us,
                summary.total_gpu_time_us
            ),
            detail,
            time_us: Some(summary.attention_time_us),
            expected_speedup: None,
            replay: ops.first().and_then(|op| replay_for(op, gpu_backend)),
            replay_note: None,
            op_index: if ops.is_empty() { None } else { Some(0) },
        });
    }
    for m in missing {
        let (title, detail) = match m.split_once(": ") {
            Some((file, rest)) if !file.contains(' ') => {
                (rest.split(':').next().unwrap_or(rest), format!("{file}: {rest}"))
            }
            _ => (m.split(':').next().unwrap_or(m), m.clone()),
        };
        out.push(Finding {
            severity: Severity::Info,
            path: "-",
            title: format!("Input lacks data: {title}"),
            detail,
            time_us: None,
            expected_speedup: None,
            replay: None,
            replay_note: None,
            op_index: None,
        });
    }
    out.sort_by(|a, b| a.severity.cmp(&b.severity).then(b.time_us.unwrap_or(0.0).total_cmp(&a.time_us.unwrap_or(0.0))));
    out
}

pub(crate) fn severity_for_share(share: f64) -> Severity {
    if share >= 0.10 {
        Severity::High
    } else if share >= 0.02 {
        Severity::Medium
    } else {
        Severity::Low
    }
}

pub(crate) fn where_(op: &AttentionOp) -> String {
    if op.module != "-" {
        let layers = if op.layers.len() > 1 { format!(" ({} layers)", op.layers.len()) } else { String::new() };
        format!("{}{}", op.module.rsplit('/').next().unwrap_or(&op.module), layers)
    } else {
        format!("{} calls starting at {} (no module info)", op.count, op.op)
    }
}

/// Why a varlen or paged op has no replay: `sdpa bench --seqlens-q/--seqlens-k` needs every length.
fn no_replay_reason(op: &AttentionOp) -> Option<String> {
    if op.layout == BatchLayout::Dense || op.suspect.is_some() {
        return None;
    }
    Some(match &op.ragged {
        Some(r) if r.exact_lengths().is_none() => format!(
            "no exact replay: the trace records {} sequences, {} query tokens and the longest lengths ({} and {}){}, \
             not each sequence's length, which `sdpa bench --seqlens-q/--seqlens-k{}` needs",
            r.sequences,
            r.total_q,
            r.max_q,
            r.max_k,
            if r.total_k.is_none() { " but no key total (a paged cache)" } else { "" },
            if op.layout == BatchLayout::Paged { " --page-size" } else { "" }
        ),
        Some(_) => return None,
        None => format!("no exact replay: a {} kernel with no op that records its shapes", op.layout.name()),
    })
}

/// Context for serving traces: the time spent writing new keys and values into the paged cache.
fn cache_write_finding(summary: &Summary) -> Option<Finding> {
    if summary.cache_write_time_us <= 0.0 {
        return None;
    }
    let names: Vec<String> = summary
        .cache_write_kernels
        .iter()
        .take(3)
        .map(|k| format!("{} {:.1} µs", truncate(&k.name, 70), k.total_us))
        .collect();
    let share = |t: f64| if summary.total_gpu_time_us > 0.0 { t / summary.total_gpu_time_us * 100.0 } else { 0.0 };
    Some(Finding {
        severity: Severity::Info,
        path: "-",
        title: format!(
            "Paged KV cache writes: {:.1} µs ({:.1} % of GPU time) beside attention's {:.1} µs",
            summary.cache_write_time_us,
            share(summary.cache_write_time_us),
            summary.attention_time_us
        ),
        detail: format!(
            "The kernels that copy each step's new keys and values into their cache pages ran {}. This is \
             attention-adjacent time, not counted as attention: a kernel that writes the cache inside attention \
             (FlashAttention's flash_attn_with_kvcache with k/v, FlashInfer's fused append) saves a launch and a \
             pass over the new tokens.",
            names.join(", ")
        ),
        time_us: Some(summary.cache_write_time_us),
        expected_speedup: None,
        replay: None,
        replay_note: None,
        op_index: None,
    })
}

fn replay_for(op: &AttentionOp, backend: &str) -> Option<Replay> {
    // An op whose rates are implausible has a shape or a time that is wrong: replaying it would benchmark
    // a shape nobody ran.
    if op.suspect.is_some() {
        return None;
    }
    // A varlen or paged batch replays only when every sequence's length is known.
    let lengths = match (op.layout, &op.ragged) {
        (BatchLayout::Dense, _) => None,
        (_, Some(r)) => Some((r.exact_lengths()?, r.page_size.filter(|_| op.layout == BatchLayout::Paged))),
        (_, None) => return None,
    };
    let shape = op.shape()?;
    let dtype = match op.dtype.as_deref() {
        Some("f16") => DType::F16,
        Some("f32") => DType::F32,
        _ => DType::BF16,
    };
    // An explicit mask that was built as a causal window replays as that window (`(W, 0)` on the top-left
    // diagonal is causal already), not as a random mask.
    let windowed = op.replay_variants.as_ref().is_some_and(|v| v.window.is_some());
    let mask = if windowed && op.mask.starts_with("explicit") { "none" } else { replay_mask(&op.mask) };
    let kernels: Vec<String> = if op.kind == Kind::Unfused || op.backend == AttnBackend::Math {
        vec!["unfused".into(), "fa2".into()]
    } else if op.decode {
        vec!["splitkv".into(), "fa2".into()]
    } else {
        vec!["fa2".into(), "auto".into()]
    };
    let spec = BenchSpec {
        backends: vec![backend.to_string()],
        kernels,
        dtypes: vec![dtype],
        shapes: vec![shape],
        masks: vec![mask.into()],
        layouts: vec![if op.q_bshd_strides { Layout::Bshd } else { Layout::Bhsd }],
        ..BenchSpec::default()
    };
    let replay = Replay::with_variants(spec, op.replay_variants.clone());
    Some(match lengths {
        Some(((q, k), page)) => replay.with_seqlens(&q, &k, page),
        None => replay,
    })
}

/// The `sdpa bench` mask for a trace's mask label: explicit masks replay as a full random explicit mask of
/// the same kind (the trace has only their dims), unknown as none.
fn replay_mask(label: &str) -> &'static str {
    match label {
        "causal" => "causal",
        "causal-br" => "causal-br",
        l if l.starts_with("explicit-additive") => "additive",
        l if l.starts_with("explicit-boolean") => "bool",
        _ => "none",
    }
}

pub(crate) fn shape_words(op: &AttentionOp) -> String {
    let s = op.shape_label();
    let dtype = op.dtype.as_deref().unwrap_or("?");
    let variants = if op.variants.is_empty() { String::new() } else { format!(", {}", op.variants) };
    let layout = match op.layout {
        BatchLayout::Dense => String::new(),
        _ => format!(", {} (Sq and Sk the longest lengths)", op.layout_label()),
    };
    format!("B,Hq,Hkv,Sq,Sk,D = {s}, {dtype}, mask {}{variants}{layout}", op.mask)
}

/// What a bounded op's figures mean, for the finding's text; empty when they are exact.
fn work_words(op: &AttentionOp) -> String {
    let why = op.work_why.as_deref().unwrap_or("the trace does not give every sequence's length");
    match op.work {
        WorkBound::Exact => String::new(),
        WorkBound::LowerBound => {
            format!(" FLOPs, rates and efficiency are lower bounds (the call did at least this work): {why}.")
        }
        WorkBound::UpperBound => {
            format!(" FLOPs, rates and efficiency are upper bounds (the call did at most this work): {why}.")
        }
    }
}

/// True for Gemma-2-style eager attention: a `tanh` softcap between the score matmul and the softmax.
fn softcapped(op: &AttentionOp) -> bool {
    op.variants.contains("softcap")
}

pub(crate) fn rates(op: &AttentionOp) -> String {
    // Unfused chains are measured against the same minimal FLOPs and bytes as a fused kernel: how far
    // they are from what one fused call could do.
    let of = if op.kind == Kind::Unfused { "of a fused kernel's" } else { "of the" };
    match (op.tflops, op.tbps, op.efficiency) {
        (Some(t), Some(b), Some(e)) => format!(
            "{} TFLOP/s, {} TB/s, {} % {of} {} roofline",
            op.bounded(format!("{t:.1}")),
            op.bounded(format!("{b:.2}")),
            op.bounded(format!("{:.1}", e * 100.0)),
            op.bound.map(|b| if b == sdpa_core::Bound::Compute { "compute" } else { "memory" }).unwrap_or("?")
        ),
        (Some(t), Some(b), None) => format!(
            "{} TFLOP/s, {} TB/s (device unknown: no efficiency)",
            op.bounded(format!("{t:.1}")),
            op.bounded(format!("{b:.2}"))
        ),
        _ => "rates unknown (no shapes)".into(),
    }
}

fn unfused_finding(
    i: usize,
    op: &AttentionOp,
    device: &DeviceInfo,
    bench: &[BenchRecord],
    replay: Option<Replay>,
) -> Finding {
    let measured = op.shape().and_then(|s| {
        let mask = replay_mask(&op.mask);
        measured_ratio(bench, &s, op.dtype.as_deref().unwrap_or(""), mask, device.key.as_deref())
    });
    let speedup = match &measured {
        Some(m) => Speedup {
            low: m.ratio,
            high: m.ratio,
            source: format!(
                "measured: our unfused {:.3} ms vs {} {:.3} ms on {} (same shape, dtype, mask)",
                m.times_ms.0, m.fused_kernel, m.times_ms.1, m.device
            ),
        },
        None => Speedup {
            low: SEED_SPEEDUP.0,
            high: SEED_SPEEDUP.1,
            source: "seed range 3-10x (not measured on this shape; pass --bench-results to use our own \
                     unfused-vs-fused measurement)"
                .into(),
        },
    };
    let save_lo = op.total_us * (1.0 - 1.0 / speedup.low.max(1.0));
    let save_hi = op.total_us * (1.0 - 1.0 / speedup.high.max(1.0));
    let mut d = format!(
        "{} calls of eager attention, {}. Each call runs {} and takes {:.1} µs of GPU time ({:.1} µs in total, \
         {:.1} % of GPU time); {}.",
        op.count,
        shape_words(op),
        op.parts
            .iter()
            .map(|p| format!("{} {:.1} µs", p.op, p.gpu_us / op.count as f64))
            .collect::<Vec<_>>()
            .join(" -> "),
        op.mean_us,
        op.total_us,
        op.share_of_gpu * 100.0,
        rates(op)
    );
    if let Some(s) = op.shape() {
        let eb = match op.dtype.as_deref() {
            Some("f32") => 4.0,
            _ => 2.0,
        };
        let scores = s.b as f64 * s.hq as f64 * s.sq as f64 * s.sk as f64 * eb;
        d.push_str(&format!(
            " The score matrix is {:.1} MiB per call, written and read several times (scale, mask, softmax, \
             cast); a fused kernel keeps it on chip.",
            scores / (1 << 20) as f64
        ));
    }
    if softcapped(op) {
        // SDPA has no softcap: the fused kernels that take one are FlexAttention's (a score_mod) and
        // flash-attn's (softcap=), both with the window as a block mask / window_size.
        d.push_str(
            " This is Gemma-2-style attention: a tanh logit softcap between the score matmul and the softmax, \
             which SDPA cannot express. Fix: a fused kernel that applies the cap on chip: FlexAttention \
             (torch.compile(flex_attention) with a score_mod `cap * tanh(score / cap)` and a block_mask from \
             create_block_mask for the window, attn_implementation=\"flex_attention\" in transformers), or \
             flash-attn (flash_attn_func(..., softcap=cap, window_size=(left, 0))), or sdpa's `--softcap`",
        );
        if op.variants.contains("window") {
            d.push_str(" `--window` (the window also skips the key tiles it leaves out)");
        }
    } else {
        d.push_str(
            " Fix: call torch.nn.functional.scaled_dot_product_attention (attn_implementation=\"sdpa\" in \
             transformers)",
        );
    }
    if op.hkv.is_some() && op.hkv != op.hq {
        d.push_str(" with enable_gqa=True instead of repeat_kv, which copies K and V");
    }
    if op.mask.starts_with("explicit") && !softcapped(op) {
        d.push_str(
            "; pass the mask as attn_mask, or is_causal=True if it is causal (the trace cannot tell: only its \
             dims are recorded), which lets SDPA pick a flash kernel",
        );
    }
    let label = if measured.is_some() { "measured on our kernels" } else { "the seed's range, not measured" };
    d.push_str(&format!(
        ". Expected: {:.1}-{:.1}x on these ops ({label}), about {:.0}-{:.0} µs saved.",
        speedup.low, speedup.high, save_lo, save_hi
    ));
    for n in &op.notes {
        d.push_str(&format!(" Note: {n}."));
    }
    if op.mask.starts_with("explicit") && !op.variants.contains("window") {
        d.push_str(
            " The replay uses a full-size random mask of the same kind (the trace records only the mask's dims).",
        );
    }
    Finding {
        severity: severity_for_share(op.share_of_gpu),
        path: "A",
        title: format!(
            "Unfused {}attention{} in {}: {:.1} % of GPU time",
            if softcapped(op) { "Gemma-2-style (tanh softcap) " } else { "" },
            if op.phase == crate::trace::attention::Phase::Bwd { " (backward)" } else { "" },
            where_(op),
            op.share_of_gpu * 100.0
        ),
        detail: d,
        time_us: Some(op.total_us),
        expected_speedup: Some(speedup),
        replay,
        replay_note: None,
        op_index: Some(i),
    }
}

fn math_finding(i: usize, op: &AttentionOp, replay: Option<Replay>) -> Finding {
    let mut why = Vec::new();
    if op.dtype.as_deref() == Some("f32") && op.hkv != op.hq {
        why.push(
            "fp32 with GQA (PyTorch then falls back to math: 10 TFLOP/s on H100 at Hq=32, Hkv=8, S=4096, ANCHORS.md)",
        );
    } else if op.dtype.as_deref() == Some("f32") {
        why.push("fp32 inputs (flash and cuDNN refuse fp32; only the memory-efficient kernel takes it)");
    }
    if op.d.is_some_and(|d| d > 256) {
        why.push("head dim above 256");
    }
    if op.mask.starts_with("explicit") && op.dropout.is_some_and(|p| p > 0.0) {
        why.push("explicit mask together with dropout");
    }
    if why.is_empty() {
        why.push("check torch.backends.cuda.sdp_kernel settings and input strides/dtypes");
    }
    Finding {
        severity: severity_for_share(op.share_of_gpu).min(Severity::Medium),
        path: "A",
        title: format!("SDPA fell back to the unfused math path in {}", where_(op)),
        detail: format!(
            "{} calls, {}: {}. The math backend materialises the scores like eager code. Likely cause: {}. \
             Expected: 3-10x on these calls once a fused backend runs (seed range, not measured).",
            op.count,
            shape_words(op),
            rates(op),
            why.join("; ")
        ),
        time_us: Some(op.total_us),
        expected_speedup: Some(Speedup {
            low: SEED_SPEEDUP.0,
            high: SEED_SPEEDUP.1,
            source: "seed range 3-10x (not measured)".into(),
        }),
        replay,
        replay_note: None,
        op_index: Some(i),
    }
}

fn fused_finding(
    i: usize,
    op: &AttentionOp,
    device: &DeviceInfo,
    bench: &[BenchRecord],
    replay: Option<Replay>,
) -> Option<Finding> {
    let band = op.expected_band.as_ref()?;
    let eff = op.efficiency?;
    let short = !op.decode && op.sk.is_some_and(|s| s < 512);
    if short {
        return Some(Finding {
            severity: Severity::Info,
            path: "-",
            title: format!(
                "Short sequences in {}: {} % efficiency is expected, not a bottleneck",
                where_(op),
                op.bounded(format!("{:.1}", eff * 100.0))
            ),
            detail: format!(
                "{} calls, {}: {}. At N < 512 a good kernel reaches 5-15 % of peak ({}); launch overhead \
                 dominates (ANCHORS.md: 8-10 µs per call at S = 64..512 on H100). Batch more sequences per call \
                 or capture the step in a CUDA graph if the calls are many.",
                op.count,
                shape_words(op),
                rates(op),
                band.label
            ),
            time_us: Some(op.total_us),
            expected_speedup: None,
            replay,
            replay_note: None,
            op_index: Some(i),
        });
    }
    let mut checks: Vec<String> = Vec::new();
    if let (Some(g), Some(sms)) = (op.grid_blocks, device.num_sms) {
        if g <= sms {
            let causal = if op.causal == Some(true) {
                ", and with a causal mask the blocks' work differs, so SMs idle while the longest finish"
            } else {
                ""
            };
            checks.push(format!(
                "grid: the main kernel launched {g} blocks for {sms} SMs, a single wave or less: B·Hq·⌈Sq/tile⌉ is \
                 too small to keep the GPU busy{causal}. Larger batches per call, or a split-KV kernel"
            ));
        } else if g < sms.saturating_mul(2) {
            checks.push(format!("grid: {g} blocks on {sms} SMs is one to two waves, so the tail wave leaves SMs idle"));
        }
    } else if let (Some(s), Some(sms)) = (op.shape(), device.num_sms) {
        let tiles = s.b as f64 * s.hq as f64 * s.sq.div_ceil(128) as f64;
        if tiles < sms as f64 {
            checks.push(format!("work: B·Hq·⌈Sq/128⌉ = {tiles} tiles for {sms} SMs, less than one wave"));
        }
    }
    let hopper = device.key.as_deref().is_some_and(|k| k.starts_with("h100") || k.starts_with("h200"));
    match op.backend {
        AttnBackend::Flash if hopper => checks.push(
            "backend: PyTorch's FlashAttention-2 kernel does not use Hopper's wgmma; cuDNN's measured 1.3-2x its \
             TFLOPS on H100 (ANCHORS.md): try sdpa_kernel(SDPBackend.CUDNN_ATTENTION)"
                .into(),
        ),
        AttnBackend::Efficient if op.dtype.as_deref() != Some("f32") => checks.push(
            "backend: the memory-efficient kernel is slower than flash / cuDNN for f16/bf16; an explicit mask or \
             an unsupported head dim may have ruled them out"
                .into(),
        ),
        _ => {}
    }
    if op.dtype.as_deref() == Some("f32") {
        checks.push("dtype: fp32 runs without tensor cores; bf16/f16 inputs run on the tensor-core kernels".into());
    }
    if let Some(n) = op.notes.iter().find(|n| n.starts_with("the explicit mask")) {
        checks.push(format!("mask: {n}"));
    } else if op.mask.starts_with("explicit") {
        checks.push("mask: an explicit mask costs B·H·Sq·Sk extra reads and excludes the flash backend; use is_causal when it is causal".into());
    }
    if op.backend == AttnBackend::Flex {
        checks.push(
            "backend: FlexAttention's Triton kernel, whose score_mod and mask_mod the trace does not show; a tanh \
             softcap score_mod doubled its time at S = 8k-32k on H100 (issue 22): replay the call with the \
             variants it uses on our kernels"
                .into(),
        );
    }
    if op.dropout.is_some_and(|p| p > 0.0) {
        checks.push("dropout > 0 adds RNG work inside the kernel".into());
    }
    if let Some(d) = op.d {
        if d % 8 != 0 || d > 256 {
            checks.push(format!("head dim {d} is off the fast paths (multiples of 8 up to 256)"));
        }
    }
    if op.phase == crate::trace::attention::Phase::Bwd && !band.label.starts_with("backward band") {
        checks.push("backward is judged against the forward band (it usually reaches somewhat less)".into());
    }
    if checks.is_empty() {
        checks.push("kernel choice and tile shape for this head dim and length: replay it and compare kernels".into());
    }
    if let Some(m) = measured_on_shape(op, bench) {
        checks.push(m);
    }
    // The primary judgement: the best known rate for this device, dtype, pass, head dim, mask and length.
    if let Some(fr) = &op.frontier {
        return Some(crate::trace::frontier::finding(i, op, fr, &checks, replay));
    }
    if eff >= band.low {
        return None;
    }
    // A lower bound below the band does not show the call is below it: say "at least", and rank it low.
    let (at, severity) = match op.work {
        WorkBound::LowerBound => ("at least", Severity::Low.max(severity_for_share(op.share_of_gpu))),
        WorkBound::UpperBound => ("at most", severity_for_share(op.share_of_gpu)),
        WorkBound::Exact => ("at", severity_for_share(op.share_of_gpu)),
    };
    Some(Finding {
        severity,
        path: "B",
        title: format!(
            "{} attention ({}) in {} {at} {:.1} % of peak, {}the expected {:.0}-{:.0} %",
            op.backend.name(),
            op.phase.name(),
            where_(op),
            eff * 100.0,
            if op.work == WorkBound::LowerBound { "a bound below " } else { "below " },
            band.low * 100.0,
            band.high * 100.0
        ),
        detail: format!(
            "{} calls, {}: {:.1} µs per call, {}; expected band: {}. Reaching the band's lower edge would save \
             about {:.1} µs ({:.2} % of GPU time{}). What to check: {}.{}",
            op.count,
            shape_words(op),
            op.mean_us,
            rates(op),
            band.label,
            op.total_us * (1.0 - eff / band.low),
            op.share_of_gpu * (1.0 - eff / band.low) * 100.0,
            if op.work == WorkBound::Exact { "" } else { "; an estimate, as the work is bounded" },
            checks.join("; "),
            work_words(op)
        ),
        time_us: Some(op.total_us),
        expected_speedup: None,
        replay,
        replay_note: None,
        op_index: Some(i),
    })
}

/// What our benchmark records measured on this exact shape, dtype and mask, fastest first (PyTorch's
/// backends included when the records hold them): a reference for what this GPU does on this call.
fn measured_on_shape(op: &AttentionOp, bench: &[BenchRecord]) -> Option<String> {
    let shape = op.shape()?;
    let dtype = op.dtype.as_deref()?;
    let mask = replay_mask(&op.mask);
    let mut rows: Vec<&BenchRecord> = bench.iter().filter(|r| same_problem(r, &shape, dtype, mask)).collect();
    if rows.is_empty() || op.phase != crate::trace::attention::Phase::Fwd {
        return None;
    }
    rows.sort_by(|a, b| a.time_ms.median.total_cmp(&b.time_ms.median));
    let fwd_flops = op.flops?;
    let list: Vec<String> = rows
        .iter()
        .take(5)
        .map(|r| {
            let t = fwd_flops / (r.time_ms.median * 1e-3) / 1e12;
            format!("{}/{} {:.1} µs ({:.0} TFLOP/s) on {}", r.backend, r.kernel, r.time_ms.median * 1e3, t, r.device)
        })
        .collect();
    Some(format!("measured on this shape by our benchmarks: {} (the trace: {:.1} µs)", list.join(", "), op.mean_us))
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}...", s.chars().take(n).collect::<String>())
    }
}
