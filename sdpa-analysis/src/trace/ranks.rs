//! Many ranks: attention time per rank, how unevenly it is spread, and how much of the collective
//! communication (NCCL kernels: the send/recv, all-to-all and all-gather that rotate K/V in ring or
//! context-parallel attention) runs while attention kernels run on the same GPU.
//!
//! Each trace file is one rank ([`RankStats::of`], computed while that trace is in memory, so a directory is
//! read one file at a time). The rank number is the trace's `distributedInfo.rank` when recorded, otherwise
//! unknown (files are then listed in name order). Overlap is measured on the kernel intervals themselves:
//! for every NCCL kernel, the part of its time during which an attention kernel (a kernel whose name is a
//! known attention kernel, [`crate::trace::attention::implementation`] or the detector's
//! [`crate::trace::attention::signature::kernel_backend`]) ran on the same device, and, for context, during
//! which any other compute kernel ran.

use crate::trace::attention::implementation::classify;
use crate::trace::attention::signature::kernel_backend;
use crate::trace::attention::{AttentionCall, Phase};
use crate::trace::findings::{Finding, Severity};
use crate::trace::kineto::{GpuKind, Trace};
use crate::trace::tree::{OpTree, NONE};
use serde::Serialize;

/// The ranks of a run.
#[derive(Debug, Clone, Serialize)]
pub struct RankReport {
    /// One entry per trace file, in rank order (files without a rank after, in name order).
    pub ranks: Vec<RankStats>,
    /// Attention time of the busiest rank over the mean of all ranks (1.0: even); with two or more ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attention_max_over_mean: Option<f64>,
    /// The rank (or file) with the most attention time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub busiest: Option<String>,
    /// The rank (or file) with the least.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idlest: Option<String>,
    /// The likely cause, when the pattern fits one (a causal context-parallel split without load balancing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub likely_cause: Option<String>,
}

/// One rank's attention and communication.
#[derive(Debug, Clone, Serialize)]
pub struct RankStats {
    /// The trace file.
    pub input: String,
    /// `distributedInfo.rank`, when recorded.
    pub rank: Option<i64>,
    /// `distributedInfo.world_size`, when recorded.
    pub world_size: Option<i64>,
    /// All GPU kernel, copy and set time, µs.
    pub gpu_time_us: f64,
    /// Attention time (fused kernels and unfused chains, forward and backward), µs.
    pub attention_us: f64,
    /// Of which forward, µs.
    pub attention_fwd_us: f64,
    /// Of which backward, µs.
    pub attention_bwd_us: f64,
    /// Attention calls.
    pub attention_calls: usize,
    /// Collective communication kernels and how much of them ran under attention; absent without NCCL kernels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm: Option<CommOverlap>,
}

impl RankStats {
    /// `rank 1`, or the file name when the trace has no rank.
    pub fn label(&self) -> String {
        match self.rank {
            Some(r) => format!("rank {r}"),
            None => std::path::Path::new(&self.input)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| self.input.clone()),
        }
    }

    /// The statistics of one trace, from its op tree and the attention calls found in it.
    pub fn of(t: &Trace, tree: &OpTree<'_>, calls: &[AttentionCall]) -> RankStats {
        let time = |p: Option<Phase>| {
            calls.iter().filter(|c| p.is_none_or(|p| c.phase == p)).fold(0.0, |a, c| a + c.gpu_us * c.repeat as f64)
        };
        RankStats {
            input: t.path.display().to_string(),
            rank: t.distributed.and_then(|d| d.rank),
            world_size: t.distributed.and_then(|d| d.world_size),
            gpu_time_us: t.gpu.iter().fold(0.0, |a, g| a + g.dur),
            attention_us: time(None),
            attention_fwd_us: time(Some(Phase::Fwd)),
            attention_bwd_us: time(Some(Phase::Bwd)),
            attention_calls: calls.iter().map(|c| c.repeat as usize).sum(),
            comm: comm_overlap(t, tree),
        }
    }
}

/// How much collective communication hides under attention on one rank.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CommOverlap {
    /// Each kind of collective kernel (by kernel and launching op), largest first.
    pub collectives: Vec<Collective>,
    /// All collective kernel time, µs.
    pub total_us: f64,
    /// Of it, time during which an attention kernel ran on the same device (another stream), µs.
    pub under_attention_us: f64,
    /// `under_attention_us / total_us` (0..1).
    pub under_attention: f64,
    /// Of it, time during which any compute kernel (attention or not) ran on the same device, µs.
    pub under_compute_us: f64,
    /// `under_compute_us / total_us` (0..1).
    pub under_compute: f64,
}

/// One kind of collective kernel on one rank.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Collective {
    /// The collective the kernel name says (`SendRecv`, `AllGather`, `AllReduce`, ...).
    pub collective: String,
    /// The outermost communication op that launched it (`_c10d_functional::all_to_all_single`), or `-`.
    pub op: String,
    /// Kernels.
    pub count: usize,
    /// Their time, µs.
    pub total_us: f64,
    /// Of it under attention kernels, µs.
    pub under_attention_us: f64,
}

/// `SendRecv` from `ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)`, `AllGather` from
/// `ncclKernel_AllGather_RING_LL_Sum_int8_t(...)`; `None` for a kernel that is not NCCL's.
pub fn nccl_collective(kernel: &str) -> Option<&str> {
    let k = kernel.trim().strip_prefix("void ").unwrap_or(kernel.trim());
    let rest = k.strip_prefix("ncclDevKernel_").or_else(|| k.strip_prefix("ncclKernel_"))?;
    let name = rest.split(['_', '(', '<']).next().unwrap_or(rest);
    (!name.is_empty()).then_some(name)
}

fn is_attention_kernel(name: &str) -> bool {
    kernel_backend(name).is_some() || classify(name).is_some()
}

/// Merged `[start, end)` intervals.
fn union(mut v: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<(f64, f64)> = Vec::with_capacity(v.len());
    for (s, e) in v {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Length of `[s, e)` covered by sorted, disjoint intervals.
fn covered(u: &[(f64, f64)], s: f64, e: f64) -> f64 {
    let first = u.partition_point(|iv| iv.1 <= s);
    let mut total = 0.0;
    for iv in &u[first..] {
        if iv.0 >= e {
            break;
        }
        total += (iv.1.min(e) - iv.0.max(s)).max(0.0);
    }
    total
}

/// The collective kernels of one trace and their overlap with attention and compute kernels, per device.
fn comm_overlap(t: &Trace, tree: &OpTree<'_>) -> Option<CommOverlap> {
    let nccl: Vec<usize> = t
        .gpu
        .iter()
        .enumerate()
        .filter(|(_, g)| g.kind == GpuKind::Kernel && nccl_collective(t.names.get(g.name)).is_some())
        .map(|(i, _)| i)
        .collect();
    if nccl.is_empty() {
        return None;
    }
    let mut devices: Vec<i64> = nccl.iter().map(|&i| t.gpu[i].device).collect();
    devices.sort_unstable();
    devices.dedup();
    let mut out = CommOverlap {
        collectives: Vec::new(),
        total_us: 0.0,
        under_attention_us: 0.0,
        under_attention: 0.0,
        under_compute_us: 0.0,
        under_compute: 0.0,
    };
    for dev in devices {
        let (mut attn, mut compute) = (Vec::new(), Vec::new());
        for g in t.gpu.iter().filter(|g| g.device == dev && g.kind == GpuKind::Kernel) {
            let name = t.names.get(g.name);
            if nccl_collective(name).is_some() {
                continue;
            }
            compute.push((g.ts, g.ts + g.dur));
            if is_attention_kernel(name) {
                attn.push((g.ts, g.ts + g.dur));
            }
        }
        let (attn, compute) = (union(attn), union(compute));
        for &i in nccl.iter().filter(|&&i| t.gpu[i].device == dev) {
            let g = &t.gpu[i];
            let (a, c) = (covered(&attn, g.ts, g.ts + g.dur), covered(&compute, g.ts, g.ts + g.dur));
            out.total_us += g.dur;
            out.under_attention_us += a;
            out.under_compute_us += c;
            let collective = nccl_collective(t.names.get(g.name)).unwrap_or("?");
            let op = comm_op(tree, i);
            match out.collectives.iter_mut().find(|x| x.collective == collective && x.op == op) {
                Some(x) => {
                    x.count += 1;
                    x.total_us += g.dur;
                    x.under_attention_us += a;
                }
                None => out.collectives.push(Collective {
                    collective: collective.to_string(),
                    op: op.to_string(),
                    count: 1,
                    total_us: g.dur,
                    under_attention_us: a,
                }),
            }
        }
    }
    out.collectives.sort_by(|a, b| b.total_us.total_cmp(&a.total_us));
    if out.total_us > 0.0 {
        out.under_attention = (out.under_attention_us / out.total_us).clamp(0.0, 1.0);
        out.under_compute = (out.under_compute_us / out.total_us).clamp(0.0, 1.0);
    }
    Some(out)
}

/// The outermost communication op above GPU activity `g` (`_c10d_functional::...`, `c10d::...`, `nccl:...`),
/// else its launching op, else `-`.
fn comm_op<'t>(tree: &OpTree<'t>, g: usize) -> &'t str {
    let mut o = tree.gpu_op[g];
    let launcher = o;
    let mut found = None;
    while o != NONE {
        let n = tree.name(o);
        if n.starts_with("_c10d_functional::") || n.starts_with("c10d::") || n.starts_with("nccl:") {
            found = Some(n);
        }
        o = tree.parent[o as usize];
    }
    found.or_else(|| (launcher != NONE).then(|| tree.name(launcher))).unwrap_or("-")
}

/// The ranks section: present with two or more traces, or with collective kernels in one.
pub fn report(mut ranks: Vec<RankStats>, causal: bool) -> Option<RankReport> {
    if ranks.len() < 2 && ranks.iter().all(|r| r.comm.is_none()) {
        return None;
    }
    ranks.sort_by(|a, b| match (a.rank, b.rank) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.input.cmp(&b.input),
    });
    let mut out = RankReport { ranks, attention_max_over_mean: None, busiest: None, idlest: None, likely_cause: None };
    let n = out.ranks.len();
    let mean = out.ranks.iter().map(|r| r.attention_us).sum::<f64>() / n as f64;
    if n >= 2 && mean > 0.0 {
        let busiest = out.ranks.iter().max_by(|a, b| a.attention_us.total_cmp(&b.attention_us));
        let idlest = out.ranks.iter().min_by(|a, b| a.attention_us.total_cmp(&b.attention_us));
        if let (Some(b), Some(i)) = (busiest, idlest) {
            out.attention_max_over_mean = Some(b.attention_us / mean);
            out.busiest = Some(b.label());
            out.idlest = Some(i.label());
        }
        out.likely_cause = likely_cause(&out, causal);
    }
    Some(out)
}

/// Imbalance at or above which the report calls attention uneven across ranks.
pub const IMBALANCED: f64 = 1.10;

/// A causal context-parallel split into contiguous chunks gives rank r the queries of chunk r, which see
/// r + 1 chunks of keys (r full blocks and a causal diagonal one): work grows with the rank, and the busiest
/// over the mean is (2N - 1) / N. The pattern fits when attention is causal, the ranks exchange data through
/// collectives, every rank is numbered and attention time grows strictly with the rank.
fn likely_cause(r: &RankReport, causal: bool) -> Option<String> {
    let ratio = r.attention_max_over_mean?;
    let n = r.ranks.len();
    let numbered = r.ranks.iter().all(|x| x.rank.is_some());
    let comm = r.ranks.iter().all(|x| x.comm.is_some());
    let growing = r.ranks.windows(2).all(|w| w[1].attention_us > w[0].attention_us);
    if ratio < IMBALANCED || !causal || !numbered || !comm || !growing {
        return None;
    }
    let expected = (2.0 * n as f64 - 1.0) / n as f64;
    Some(format!(
        "causal context-parallel split into contiguous chunks, without load balancing: attention time grows with \
         the rank (a contiguous split gives rank r the queries that see r + 1 chunks of keys; on {n} ranks its \
         busiest/mean is {expected:.2}, here {ratio:.2}). Shard the sequence zigzag / head-tail so each rank holds \
         chunks r and 2N-1-r (PyTorch context_parallel: `_cp_options.enable_load_balance = True`; ring-flash-attn's \
         zigzag variant)"
    ))
}

/// The findings of the ranks section: imbalance (or its absence) and the communication that attention hides.
pub fn findings(r: &RankReport) -> Vec<Finding> {
    let mut out = Vec::new();
    if let (Some(ratio), Some(busiest)) = (r.attention_max_over_mean, &r.busiest) {
        let n = r.ranks.len() as f64;
        let max = r.ranks.iter().map(|x| x.attention_us).fold(0.0, f64::max);
        let mean = r.ranks.iter().map(|x| x.attention_us).sum::<f64>() / n;
        let per_rank: Vec<String> = r
            .ranks
            .iter()
            .map(|x| format!("{} {:.1} µs in {} calls", x.label(), x.attention_us, x.attention_calls))
            .collect();
        let waits: Vec<String> = r
            .ranks
            .iter()
            .filter_map(|x| x.comm.as_ref().map(|c| format!("{} {:.1} µs", x.label(), c.total_us)))
            .collect();
        let mut detail = format!("Attention per rank: {}.", per_rank.join(", "));
        if !waits.is_empty() {
            detail.push_str(&format!(
                " Collective kernel time per rank: {} (a rank that finishes early waits inside its NCCL kernels).",
                waits.join(", ")
            ));
        }
        let (severity, title) = if ratio >= IMBALANCED {
            detail.push_str(&format!(" Every step waits for {busiest}."));
            if let Some(c) = &r.likely_cause {
                detail.push_str(&format!(" Likely cause: {c}."));
            }
            let s = if ratio >= 1.25 { Severity::Medium } else { Severity::Low };
            (s, format!("Attention is uneven across ranks: busiest/mean {ratio:.2} ({busiest} does the most)"))
        } else {
            (Severity::Info, format!("Attention is even across {} ranks (busiest/mean {ratio:.2})", r.ranks.len()))
        };
        out.push(Finding {
            severity,
            path: "-",
            title,
            detail,
            time_us: Some(max - mean),
            expected_speedup: None,
            replay: None,
            replay_note: None,
            op_index: None,
        });
    }
    let comm: Vec<(String, &CommOverlap)> =
        r.ranks.iter().filter_map(|x| x.comm.as_ref().map(|c| (x.label(), c))).collect();
    if !comm.is_empty() {
        let total: f64 = comm.iter().map(|(_, c)| c.total_us).sum();
        let hidden: f64 = comm.iter().map(|(_, c)| c.under_attention_us).sum();
        let exposed: f64 = comm.iter().map(|(_, c)| c.total_us - c.under_compute_us).sum();
        let each: Vec<String> = comm
            .iter()
            .map(|(l, c)| {
                format!(
                    "{l}: {:.1} of {:.1} µs under attention ({:.0} %), {:.0} % under any compute",
                    c.under_attention_us,
                    c.total_us,
                    c.under_attention * 100.0,
                    c.under_compute * 100.0
                )
            })
            .collect();
        let gpu: f64 = r.ranks.iter().map(|x| x.gpu_time_us).sum();
        let severity = if gpu > 0.0 && exposed / gpu >= 0.10 { Severity::Low } else { Severity::Info };
        out.push(Finding {
            severity,
            path: "-",
            title: format!(
                "Collectives: {:.0} % of NCCL kernel time runs under attention kernels ({:.1} of {:.1} µs)",
                if total > 0.0 { hidden / total * 100.0 } else { 0.0 },
                hidden,
                total
            ),
            detail: format!(
                "{}. NCCL kernel time is the kernels' span, which includes waiting for the peer; time under no \
                 compute kernel ({exposed:.1} µs in all) is exposed unless the peer was late.",
                each.join("; ")
            ),
            time_us: Some(total - hidden),
            expected_speedup: None,
            replay: None,
            replay_note: None,
            op_index: None,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_kernels_name_their_collective() {
        assert_eq!(nccl_collective("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"), Some("SendRecv"));
        assert_eq!(
            nccl_collective("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
            Some("AllGather")
        );
        assert_eq!(
            nccl_collective("void ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"),
            Some("AllReduce")
        );
        assert_eq!(nccl_collective("void at::native::vectorized_elementwise_kernel<4>"), None);
    }

    #[test]
    fn coverage_counts_each_instant_once() {
        let u = union(vec![(0.0, 10.0), (5.0, 15.0), (20.0, 30.0)]);
        assert_eq!(u, vec![(0.0, 15.0), (20.0, 30.0)]);
        assert_eq!(covered(&u, 10.0, 25.0), 10.0);
        assert_eq!(covered(&u, 15.0, 20.0), 0.0);
        assert_eq!(covered(&u, -5.0, 40.0), 25.0);
    }

    fn rank(r: i64, us: f64) -> RankStats {
        RankStats {
            input: format!("rank{r}.json.gz"),
            rank: Some(r),
            world_size: Some(2),
            gpu_time_us: 1000.0,
            attention_us: us,
            attention_fwd_us: us,
            attention_bwd_us: 0.0,
            attention_calls: 2,
            comm: Some(CommOverlap {
                collectives: Vec::new(),
                total_us: 10.0,
                under_attention_us: 5.0,
                under_attention: 0.5,
                under_compute_us: 8.0,
                under_compute: 0.8,
            }),
        }
    }

    #[test]
    fn growing_causal_work_names_the_contiguous_split() {
        let r = report(vec![rank(1, 300.0), rank(0, 100.0)], true).unwrap();
        assert_eq!(r.ranks[0].rank, Some(0), "sorted by rank");
        assert_eq!(r.attention_max_over_mean, Some(1.5));
        assert!(r.likely_cause.as_deref().is_some_and(|c| c.contains("zigzag")));
        assert!(report(vec![rank(0, 300.0), rank(1, 100.0)], true).unwrap().likely_cause.is_none(), "shrinking");
        assert!(report(vec![rank(0, 100.0), rank(1, 300.0)], false).unwrap().likely_cause.is_none(), "not causal");
        let even = report(vec![rank(0, 100.0), rank(1, 104.0)], true).unwrap();
        assert!(even.likely_cause.is_none());
        assert_eq!(findings(&even)[0].severity, Severity::Info);
        assert_eq!(findings(&r)[0].severity, Severity::Medium);
    }
}
