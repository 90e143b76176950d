//! The analysis result as plain data: device, GPU-time summary, attention ops (calls grouped by kind,
//! phase, backend, module, shape, dtype and mask) with their performance model, and findings. Renderers
//! (text, markdown, CSV) and `serde_json` print it; nothing here formats for people.

use crate::trace::attention::{dtype_label, AttentionCall, BatchLayout, Kind, Part, Ragged, WorkBound};
use crate::trace::findings::Finding;
use crate::trace::perf::{self, Band};
use crate::trace::timeline::Timeline;
use crate::trace::tree::LinkStats;
use sdpa_core::{HardwareSpec, Shape};
use serde::Serialize;
use std::collections::BTreeMap;

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct TraceReport {
    /// Files analysed.
    pub inputs: Vec<String>,
    /// The device efficiency is measured against.
    pub device: DeviceInfo,
    /// GPU time and attention's share of it.
    pub summary: Summary,
    /// Attention ops, largest total time first.
    pub attention_ops: Vec<AttentionOp>,
    /// Findings, most severe first.
    pub findings: Vec<Finding>,
    /// What the input lacked and what that costs the analysis.
    pub missing: Vec<String>,
    /// Values outside physical bounds ([`crate::trace::plausible`]), left out of totals, efficiencies and
    /// replays.
    pub suspect: Vec<Suspect>,
    /// Files of a directory input that could not be read (the error of each); the report covers the others.
    pub unreadable: Vec<String>,
    /// Parse and linking counters.
    pub trace: TraceInfo,
    /// Per-rank attention time, its imbalance and the collectives hidden under attention: with two or more
    /// trace files, or collective kernels in one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks: Option<crate::trace::ranks::RankReport>,
    /// GPU idle time between consecutive decode attention calls, per input file that has a decode loop
    /// ([`crate::trace::decode::gaps`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub decode_gaps: Vec<crate::trace::decode::DecodeGaps>,
    /// Every attention call in time order, by layer ([`crate::trace::timeline`]); empty for the TraceLens
    /// contract, whose rows are not calls in time.
    #[serde(skip_serializing_if = "Timeline::is_empty")]
    pub timeline: Timeline,
}

/// Events or calls whose values lie outside physical bounds: what they were, how many, the first one, and
/// what the analysis did instead of using them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Suspect {
    /// The file they came from, when one file.
    pub input: Option<String>,
    /// What was implausible, e.g. `GPU activity duration`, `attention shape`, `achieved rate`.
    pub what: String,
    /// How many events (parse) or calls (shapes, rates).
    pub count: u64,
    /// The first one, with its value and what is wrong with it.
    pub example: String,
    /// What was left out because of it.
    pub effect: String,
}

impl Suspect {
    /// One line for people: `FILE: 3 GPU activity duration values are implausible (e.g. ...): left out of ...`.
    pub fn line(&self) -> String {
        let file = self.input.as_deref().map(|f| format!("{f}: ")).unwrap_or_default();
        format!("{file}{} implausible {} (e.g. {}): {}", self.count, self.what, self.example, self.effect)
    }

    /// Adds `n` occurrences to the entry for `what` (and `input`), creating it with `example` when new.
    pub fn tally(list: &mut Vec<Suspect>, input: Option<&str>, what: &str, example: &str, effect: &str, n: u64) {
        match list.iter_mut().find(|s| s.what == what && s.input.as_deref() == input) {
            Some(s) => s.count += n,
            None => list.push(Suspect {
                input: input.map(str::to_string),
                what: what.to_string(),
                count: n,
                example: example.to_string(),
                effect: effect.to_string(),
            }),
        }
    }
}

/// The device.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DeviceInfo {
    /// Name as the trace (or metadata) reports it.
    pub name: Option<String>,
    /// Hardware-table key it matched (`h100-sxm`), if any.
    pub key: Option<String>,
    /// Hardware-table name.
    pub spec: Option<String>,
    /// `trace`, `override` or `metadata`.
    pub source: String,
    /// Streaming multiprocessors, when recorded.
    pub num_sms: Option<i64>,
    /// Dense bf16 peak of the matched spec, TFLOP/s.
    pub peak_bf16_tflops: Option<f64>,
    /// Memory bandwidth of the matched spec, GB/s.
    pub mem_bandwidth_gbs: Option<f64>,
}

impl DeviceInfo {
    /// Resolves the device from a reported name and an optional override (`--device`).
    pub fn resolve(reported: Option<&str>, num_sms: Option<i64>, override_key: Option<&str>, source: &str) -> Self {
        let (hw, src) = match override_key {
            Some(k) => (HardwareSpec::find(k), "override"),
            None => (reported.and_then(HardwareSpec::find), source),
        };
        DeviceInfo {
            name: reported.map(str::to_string),
            key: hw.map(|h| h.key.to_string()),
            spec: hw.map(|h| h.name.to_string()),
            source: src.to_string(),
            num_sms,
            peak_bf16_tflops: hw.map(|h| h.bf16_tflops),
            mem_bandwidth_gbs: hw.map(|h| h.mem_bandwidth_gbs),
        }
    }

    /// The matched hardware spec.
    pub fn hardware(&self) -> Option<&'static HardwareSpec> {
        self.key.as_deref().and_then(HardwareSpec::find)
    }
}

/// GPU time summary.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    /// Sum of all GPU kernel, copy and set durations, µs.
    pub total_gpu_time_us: f64,
    /// GPU time of all attention calls (fused kernels, or every op of an unfused chain), µs.
    pub attention_time_us: f64,
    /// attention / total.
    pub attention_share: f64,
    /// Of which fused, µs.
    pub fused_time_us: f64,
    /// Of which unfused, µs.
    pub unfused_time_us: f64,
    /// Number of attention calls.
    pub attention_calls: usize,
    /// True when any call ran a fused flash-style kernel (flash, cuDNN, efficient, flash-attn, CK).
    pub fused_kernels_in_use: bool,
    /// Attention-adjacent time: the kernels that write new keys and values into a paged KV cache
    /// (`reshape_and_cache`, `AppendPagedKVCacheKernel`), µs. Not part of attention time.
    pub cache_write_time_us: f64,
    /// Those kernels by name, largest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cache_write_kernels: Vec<KernelTime>,
}

/// Per-kernel time of an op group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelTime {
    /// Kernel name.
    pub name: String,
    /// Total over the group's calls, µs.
    pub total_us: f64,
}

/// A group of identical attention calls.
#[derive(Debug, Clone, Serialize)]
pub struct AttentionOp {
    /// `fused` or `unfused`.
    pub kind: Kind,
    /// `fwd` or `bwd`.
    pub phase: crate::trace::attention::Phase,
    /// `flash`, `cudnn`, `efficient`, `math`, `flash_attn`, `ck`, `eager`, ...
    pub backend: crate::trace::attention::AttnBackend,
    /// True when the kernel is a fused (flash-style, online-softmax) kernel.
    pub fused_kernel: bool,
    /// Module path with instance numbers removed (`LlamaModel/LlamaDecoderLayer/LlamaAttention`), or `-`.
    pub module: String,
    /// Innermost module instances, in time order (`LlamaAttention_0`, ...).
    pub layers: Vec<String>,
    /// Outermost op name.
    pub op: String,
    /// Batch.
    pub b: Option<usize>,
    /// Query heads.
    pub hq: Option<usize>,
    /// Key/value heads.
    pub hkv: Option<usize>,
    /// Query length.
    pub sq: Option<usize>,
    /// Key length.
    pub sk: Option<usize>,
    /// Head dim of Q/K.
    pub d: Option<usize>,
    /// Head dim of V.
    pub dv: Option<usize>,
    /// `dense`, `varlen` or `paged`. For varlen and paged ops, Sq and Sk above are the longest lengths.
    pub layout: BatchLayout,
    /// A varlen or paged op's sequences as the trace recorded them (count, token totals, longest lengths,
    /// page size).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ragged: Option<Ragged>,
    /// `exact`, or `lower_bound` / `upper_bound` when the trace does not give every sequence's length: then
    /// FLOPs, bytes, TFLOP/s, TB/s and efficiency bound the truth the same way.
    pub work: WorkBound,
    /// Why the work of a varlen or paged op is exact, or how its bound follows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub work_why: Option<String>,
    /// `bf16`, `f16`, `f32` (or PyTorch's name for others).
    pub dtype: Option<String>,
    /// Causal mask (None when unknown).
    pub causal: Option<bool>,
    /// Mask label (`none`, `causal`, `explicit-additive[2,1,1024,1024]`, `block-mask[1,1,16,16]`, `unknown`).
    pub mask: String,
    /// Variants label (`window 256,0 tl · softcap 50`, `softcap ?` when the cap is not recorded), empty for
    /// plain attention.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub variants: String,
    /// The variants a replay runs (`sdpa_core::Variants`' serde form; an unrecorded cap as 50, unrecorded
    /// ALiBi slopes as the standard ones), absent for plain attention.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay_variants: Option<sdpa_core::Variants>,
    /// Calls in the group.
    pub count: usize,
    /// Total GPU time, µs.
    pub total_us: f64,
    /// Mean GPU time per call, µs.
    pub mean_us: f64,
    /// total / total GPU time of the trace.
    pub share_of_gpu: f64,
    /// FLOPs per call.
    pub flops: Option<f64>,
    /// Minimal bytes per call.
    pub bytes: Option<f64>,
    /// Achieved TFLOP/s.
    pub tflops: Option<f64>,
    /// Achieved TB/s (minimal bytes).
    pub tbps: Option<f64>,
    /// Roofline efficiency on the device.
    pub efficiency: Option<f64>,
    /// Expected efficiency band for this sequence length.
    pub expected_band: Option<Band>,
    /// `below`, `within`, `above`.
    pub band_status: Option<&'static str>,
    /// `compute` or `memory`.
    pub bound: Option<sdpa_core::Bound>,
    /// True for decoding-like calls (Sq <= 16).
    pub decode: bool,
    /// Blocks of the main attention kernel (fused), when recorded.
    pub grid_blocks: Option<i64>,
    /// Q is a transposed `[B, S, H, D]` view.
    pub q_bshd_strides: bool,
    /// Softmax scale from `Concrete Inputs` (None: not recorded, or the default 1/sqrt(D)).
    pub scale: Option<f64>,
    /// Dropout p.
    pub dropout: Option<f64>,
    /// Kernels and their total time.
    pub kernels: Vec<KernelTime>,
    /// Unfused: the ops of the chain, time summed over the group.
    pub parts: Vec<Part>,
    /// Notes from detection.
    pub notes: Vec<String>,
    /// Why this op's shape or rates were left out as implausible (no efficiency, no replay), if they were.
    pub suspect: Option<String>,
    /// Whose code ran a fused op (FlashAttention-2 or -3, cuDNN, CUTLASS, ...), read from its kernel names;
    /// absent for unfused ops and SDPA's math path, and for ops that launched no kernel.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub implementation: Option<crate::trace::attention::implementation::Implementation>,
    /// The op against the best known rate for its device, dtype, pass, head dim, mask and length
    /// ([`crate::trace::frontier`]); absent where no entry applies (the seed band judges it then).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frontier: Option<crate::trace::frontier::FrontierJudgement>,
    /// A decoding op judged by bytes ([`crate::trace::decode`]): K/V bytes with Hkv heads at the element
    /// size the kernel reads, the cache's stored dtype, split-KV combine kernels' share.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv: Option<crate::trace::decode::KvJudgement>,
    /// For a dense decode loop grouped over its steps: the shortest and longest cache length (Sk above is
    /// their mean, weighted by calls).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sk_range: Option<(usize, usize)>,
}

impl AttentionOp {
    /// The shape when fully known.
    pub fn shape(&self) -> Option<Shape> {
        Some(Shape { b: self.b?, hq: self.hq?, hkv: self.hkv?, sq: self.sq?, sk: self.sk?, d: self.d?, dv: self.dv? })
    }

    /// The mask with the variants after it (`causal · window 256,0 tl · softcap ?`), for tables.
    pub fn mask_and_variants(&self) -> String {
        if self.variants.is_empty() {
            self.mask.clone()
        } else {
            format!("{} · {}", self.mask, self.variants)
        }
    }

    /// `dense`, or the varlen / paged batch as recorded (`varlen B=16 Tq=65536 Tk=65536 max 8192/8192`).
    pub fn layout_label(&self) -> String {
        match &self.ragged {
            Some(r) => r.label(self.layout),
            None => self.layout.name().to_string(),
        }
    }

    /// A figure with the sign of its bound: `>=312.4` for a lower bound, `312.4` when exact.
    pub fn bounded(&self, figure: String) -> String {
        if figure == "-" {
            figure
        } else {
            format!("{}{figure}", self.work.sign())
        }
    }

    /// `B,Hq,Hkv,Sq,Sk,D` (with Dv when different) or `?`.
    pub fn shape_label(&self) -> String {
        match self.shape() {
            Some(s) if s.d == s.dv => format!("{},{},{},{},{},{}", s.b, s.hq, s.hkv, s.sq, s.sk, s.d),
            Some(s) => s.to_string(),
            None => "?".into(),
        }
    }
}

/// Parse and link counters, summed over inputs.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TraceInfo {
    /// Events read.
    pub events: u64,
    /// Decompressed bytes parsed.
    pub bytes: u64,
    /// CPU ops kept.
    pub cpu_ops: u64,
    /// GPU activities kept.
    pub gpu_activities: u64,
    /// Kernel linking.
    pub links: LinkStats,
}

/// The implementation of a fused op with a fused kernel (not SDPA's math path), from its kernels.
fn implementation_of(
    kind: Kind,
    backend: crate::trace::attention::AttnBackend,
    kernels: &[KernelTime],
) -> Option<crate::trace::attention::implementation::Implementation> {
    if kind != Kind::Fused || backend == crate::trace::attention::AttnBackend::Math {
        return None;
    }
    crate::trace::attention::implementation::of_kernels(kernels.iter().map(|k| (k.name.as_str(), k.total_us)))
}

/// Strips `_N` instance suffixes: `LlamaAttention_1` -> `LlamaAttention`.
pub fn module_class(name: &str) -> &str {
    match name.rsplit_once('_') {
        Some((head, tail)) if !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit()) => head,
        _ => name,
    }
}

/// Groups calls into ops and applies the performance model.
pub fn group(calls: &[AttentionCall], total_gpu_us: f64, hw: Option<&HardwareSpec>) -> Vec<AttentionOp> {
    group_indexed(calls, total_gpu_us, hw).0
}

/// [`group`], with the index of each call's op in the returned list (the timeline's link from call to op).
pub fn group_indexed(
    calls: &[AttentionCall],
    total_gpu_us: f64,
    hw: Option<&HardwareSpec>,
) -> (Vec<AttentionOp>, Vec<usize>) {
    type Key = (
        Kind,
        crate::trace::attention::Phase,
        crate::trace::attention::AttnBackend,
        String,
        Option<Shape>,
        Option<String>,
        String,
        String,
        BatchLayout,
        Option<Ragged>,
        String,
        Option<String>,
    );
    let mut groups: BTreeMap<String, (Key, Vec<&AttentionCall>, Vec<usize>)> = BTreeMap::new();
    for (i, c) in calls.iter().enumerate() {
        let module = if c.module.is_empty() {
            "-".to_string()
        } else {
            c.module.iter().map(|m| module_class(m)).collect::<Vec<_>>().join("/")
        };
        let key: Key = (
            c.kind,
            c.phase,
            c.backend,
            module,
            crate::trace::decode::loop_key(c),
            c.dtype.clone(),
            c.mask.label(),
            c.variants.label(),
            c.layout,
            c.ragged,
            // The entry point: a direct `aten::_flash_attention_forward` is not SDPA's call of the same shape.
            c.op.clone(),
            c.kv.stored_dtype.clone(),
        );
        let k = format!("{key:?}");
        let g = groups.entry(k).or_insert_with(|| (key, Vec::new(), Vec::new()));
        g.1.push(c);
        g.2.push(i);
    }
    let mut member_lists: Vec<Vec<usize>> = Vec::with_capacity(groups.len());
    let out: Vec<AttentionOp> = groups
        .into_values()
        .map(|(key, members, indices)| {
            member_lists.push(indices);
            let (kind, phase, backend, module, shape, dtype, mask_label, variants_label, layout, ragged, _op, _) = key;
            // A dense decode loop is one op over its cache lengths: costed at their mean, the range kept.
            let (shape, sk_range) = crate::trace::decode::loop_shape(shape, &members);
            let first = members[0];
            let count = members.iter().map(|c| c.repeat as usize).sum::<usize>().max(1);
            let total: f64 = members.iter().map(|c| c.gpu_us * c.repeat as f64).sum();
            let mean = total / count as f64;
            let mut layers: Vec<String> = Vec::new();
            for c in &members {
                if let Some(l) = c.module.last() {
                    if !layers.contains(l) {
                        layers.push(l.clone());
                    }
                }
            }
            let mut kernels: Vec<KernelTime> = Vec::new();
            let mut parts: Vec<Part> = Vec::new();
            let mut notes: Vec<String> = Vec::new();
            for c in &members {
                let w = c.repeat as f64;
                for (k, us) in &c.kernels {
                    match kernels.iter_mut().find(|x| &x.name == k) {
                        Some(x) => x.total_us += us * w,
                        None => kernels.push(KernelTime { name: k.clone(), total_us: us * w }),
                    }
                }
                for (i, p) in c.parts.iter().enumerate() {
                    if parts.len() == i {
                        parts.push(Part { gpu_us: p.gpu_us * w, ..p.clone() });
                    } else if let Some(x) = parts.get_mut(i).filter(|x| x.role == p.role) {
                        x.gpu_us += p.gpu_us * w;
                    }
                }
                for n in &c.notes {
                    if !notes.contains(n) {
                        notes.push(n.clone());
                    }
                }
            }
            kernels.sort_by(|a, b| b.total_us.total_cmp(&a.total_us));
            let mut suspect = members.iter().find_map(|c| c.suspect.clone());
            let variants = &first.variants.variants;
            let mut perf = shape.and_then(|s| {
                perf::model(
                    &s,
                    &first.mask,
                    variants,
                    dtype.as_deref(),
                    phase,
                    mean,
                    hw,
                    ragged.as_ref(),
                    first.kv.cache_dtype.as_deref(),
                )
            });
            // A shape that passed its bounds can still be absurd against the time it took (a plausible
            // shape in 0.001 µs): such rates say the time or the shape is wrong, so neither is trusted.
            if let Some(why) = perf.as_ref().and_then(|p| crate::trace::plausible::rates(p.tflops, p.tbps, hw).err()) {
                suspect = Some(format!("achieved rate {why}"));
                perf = None;
            }
            let decode = shape.is_some_and(|s| perf::is_decode(&s));
            let implementation = implementation_of(kind, backend, &kernels);
            let dtype_label_ = dtype.as_deref().map(dtype_label);
            let frontier = match (shape, perf.as_ref(), dtype_label_.as_deref()) {
                (Some(shape), Some(p), Some(dt)) if p.work == WorkBound::Exact => crate::trace::frontier::judge(
                    &crate::trace::frontier::OpFacts {
                        kind,
                        phase,
                        backend,
                        shape,
                        dtype: dt,
                        mask: &mask_label,
                        has_variants: !variants_label.is_empty(),
                        layout,
                        tflops: p.tflops,
                        mean_us: mean,
                    },
                    hw,
                ),
                _ => None,
            };
            let kv = crate::trace::decode::judge_kv(&members, shape, dtype.as_deref(), &kernels, total, decode);
            AttentionOp {
                kind,
                phase,
                backend,
                fused_kernel: backend.is_fused_kernel(),
                module,
                layers,
                op: first.op.clone(),
                b: shape.map(|s| s.b),
                hq: shape.map(|s| s.hq),
                hkv: shape.map(|s| s.hkv),
                sq: shape.map(|s| s.sq),
                sk: shape.map(|s| s.sk),
                d: shape.map(|s| s.d),
                dv: shape.map(|s| s.dv),
                layout,
                ragged,
                work: perf.as_ref().map(|p| p.work).unwrap_or_default(),
                work_why: perf.as_ref().and_then(|p| p.work_why.clone()),
                dtype: dtype.as_deref().map(dtype_label),
                causal: first.mask.causal(),
                mask: mask_label,
                variants: variants_label,
                replay_variants: first.variants.replay(),
                count,
                total_us: total,
                mean_us: mean,
                share_of_gpu: if total_gpu_us > 0.0 { total / total_gpu_us } else { 0.0 },
                flops: perf.as_ref().map(|p| p.flops),
                bytes: perf.as_ref().map(|p| p.bytes),
                tflops: perf.as_ref().map(|p| p.tflops),
                tbps: perf.as_ref().map(|p| p.tbps),
                efficiency: perf.as_ref().and_then(|p| p.efficiency),
                expected_band: perf.as_ref().map(|p| p.band.clone()),
                band_status: perf.as_ref().and_then(|p| p.band_status),
                bound: perf.as_ref().and_then(|p| p.bound),
                decode,
                grid_blocks: first.grid_blocks,
                q_bshd_strides: first.q_bshd_strides,
                scale: first.scale,
                dropout: first.dropout,
                kernels,
                parts,
                notes,
                suspect,
                implementation,
                frontier,
                kv,
                sk_range,
            }
        })
        .collect();
    // Largest first; the same permutation carries each group's call indices to its op's final place.
    let mut order: Vec<usize> = (0..out.len()).collect();
    order.sort_by(|&a, &b| out[b].total_us.total_cmp(&out[a].total_us));
    let mut op_of_call = vec![0; calls.len()];
    for (place, &g) in order.iter().enumerate() {
        for &c in &member_lists[g] {
            op_of_call[c] = place;
        }
    }
    let mut slots: Vec<Option<AttentionOp>> = out.into_iter().map(Some).collect();
    let out = order.iter().filter_map(|&g| slots[g].take()).collect();
    (out, op_of_call)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::module_class;

    #[test]
    fn module_instance_numbers_are_stripped() {
        assert_eq!(module_class("LlamaAttention_12"), "LlamaAttention");
        assert_eq!(module_class("Linear"), "Linear");
        assert_eq!(module_class("my_block"), "my_block");
    }
}
