//! Ring attention (context parallelism): how a sequence is cut across GPUs, what each ring step computes,
//! and a cost model for when a step's transfer hides under its compute.
//!
//! The sequence of length S is cut into `2N` chunks of about equal length (the first `S mod 2N` chunks one
//! row longer). Rank `r` holds chunks `r` and `2N-1-r`, concatenated ("zigzag"), so that under a causal
//! mask every rank does the same work: a rank with an early chunk also holds a late one. At step `t` rank
//! `r` holds the K/V of rank `s = (r - t) mod N` and computes one of the [`StepWork`] kinds; its partial
//! output is merged with the running one by the LSE rule ([`crate::softmax::merge_normalized`]). With this
//! layout no new mask kind is needed:
//! - `s == r`: the local concatenation under a top-left causal mask (chunk `r` precedes chunk `2N-1-r`);
//! - `s < r`: chunk `s` precedes both local chunks and chunk `2N-1-s` follows both: every local row sees the
//!   first visiting chunk whole and nothing of the second;
//! - `s > r`: chunk `r` precedes both visiting chunks, which precede chunk `2N-1-r`: only the second local
//!   chunk's rows see them, and see both whole.
//!
//! Without a mask every step is the whole local block against the whole visiting block.

use crate::error::{Result, SdpaError};
use crate::spec::{AttentionSpec, Mask};
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// The zigzag cut of one sequence over `ranks` GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingPlan {
    /// Number of GPUs in the ring.
    pub ranks: usize,
    /// Total sequence length (queries and keys alike).
    pub seq: usize,
}

/// What one ring step computes on one rank, in the rank's local rows (queries) and the visiting rank's
/// local rows (keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepWork {
    /// Local query rows that take part.
    pub rows: Range<usize>,
    /// Visiting key rows they see.
    pub keys: Range<usize>,
    /// The mask of the call: top-left causal on the diagonal step, none elsewhere.
    pub mask: Mask,
}

impl RingPlan {
    /// A plan, or `InvalidSpec` when the sequence is too short to give every rank two non-empty chunks.
    pub fn new(ranks: usize, seq: usize) -> Result<Self> {
        if ranks == 0 {
            return Err(SdpaError::InvalidSpec("a ring needs at least one GPU".into()));
        }
        let chunks = ranks.checked_mul(2).ok_or_else(|| SdpaError::InvalidSpec("too many GPUs".into()))?;
        if seq < chunks {
            return Err(SdpaError::InvalidSpec(format!(
                "a sequence of {seq} rows cannot be cut into {chunks} chunks for {ranks} GPUs"
            )));
        }
        Ok(RingPlan { ranks, seq })
    }

    /// Global rows of chunk `c` (of `2N`): lengths differ by at most one, the longer ones first.
    pub fn chunk(&self, c: usize) -> Range<usize> {
        let n = 2 * self.ranks;
        let (base, extra) = (self.seq / n, self.seq % n);
        let start = c * base + c.min(extra);
        start..start + base + usize::from(c < extra)
    }

    /// The two chunks rank `r` holds, in local order: chunk `r`, then chunk `2N-1-r`.
    pub fn chunks_of(&self, r: usize) -> [Range<usize>; 2] {
        [self.chunk(r), self.chunk(2 * self.ranks - 1 - r)]
    }

    /// Rows rank `r` holds.
    pub fn local_len(&self, r: usize) -> usize {
        self.chunks_of(r).iter().map(|c| c.len()).sum()
    }

    /// The longest local length (buffers that hold any rank's K/V are this long).
    pub fn max_local_len(&self) -> usize {
        (0..self.ranks).map(|r| self.local_len(r)).max().unwrap_or(0)
    }

    /// The global row of rank `r`'s local row `i`.
    pub fn global_row(&self, r: usize, i: usize) -> usize {
        let [a, b] = self.chunks_of(r);
        if i < a.len() {
            a.start + i
        } else {
            b.start + (i - a.len())
        }
    }

    /// The rank whose K/V rank `r` holds at step `t`.
    pub fn source(&self, r: usize, t: usize) -> usize {
        (r + self.ranks - t % self.ranks) % self.ranks
    }

    /// What rank `r` computes against rank `s`'s K/V; `None` when nothing is visible (never with this
    /// layout, kept for plans where it could happen).
    pub fn work(&self, r: usize, s: usize, causal: bool) -> Option<StepWork> {
        let (lr, ls) = (self.local_len(r), self.local_len(s));
        let w = if !causal {
            StepWork { rows: 0..lr, keys: 0..ls, mask: Mask::None }
        } else if s == r {
            StepWork { rows: 0..lr, keys: 0..ls, mask: Mask::CausalTopLeft }
        } else if s < r {
            StepWork { rows: 0..lr, keys: 0..self.chunk(s).len(), mask: Mask::None }
        } else {
            StepWork { rows: self.chunk(r).len()..lr, keys: 0..ls, mask: Mask::None }
        };
        (!w.rows.is_empty() && !w.keys.is_empty()).then_some(w)
    }

    /// Query-key pairs rank `r` computes at step `t` (one head).
    pub fn step_pairs(&self, r: usize, t: usize, causal: bool) -> u128 {
        self.work(r, self.source(r, t), causal)
            .map_or(0, |w| crate::cost::pairs_per_head(w.rows.len(), w.keys.len(), &w.mask))
    }
}

/// Checks that a spec can run as a ring over `ranks` GPUs: dense, BHSD, Sq = Sk, no explicit mask, no
/// window/softcap/ALiBi (the local calls would need the global positions), and a sequence long enough.
pub fn check_ring_spec(spec: &AttentionSpec, ranks: usize) -> Result<RingPlan> {
    let unsupported = |what: &str| {
        Err(SdpaError::Unsupported { backend: "cuda-ring", what: format!("{what} (ring attention over {ranks} GPUs)") })
    };
    let s = &spec.shape;
    if spec.ragged.is_some() {
        return unsupported("ragged batches");
    }
    if s.sq != s.sk {
        return unsupported("Sq != Sk");
    }
    if matches!(spec.mask, Mask::Explicit(_)) {
        return unsupported("explicit masks");
    }
    if !spec.variants.is_plain() {
        return unsupported("windows, softcap and ALiBi");
    }
    if spec.layout() != Some(crate::spec::Layout::Bhsd) {
        return unsupported("layouts other than contiguous BHSD");
    }
    RingPlan::new(ranks, s.sq)
}

/// The link between neighbouring GPUs and the compute rate, the inputs of [`RingCost`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RingLink {
    /// Bytes per second one GPU sends to its neighbour while receiving from the other, GB/s (10^9 B/s).
    pub gbs: f64,
    /// Fixed cost of one step's exchange (NCCL launch and handshake), microseconds.
    pub latency_us: f64,
    /// Each GPU's own memory bandwidth, GB/s: the merge (forward) and gradient adds (backward) of a step
    /// are passes over O or dQ/dK/dV at this rate.
    pub hbm_gbs: f64,
}

impl RingLink {
    /// H100 SXM over NVLink 4: 18 links of 25 GB/s per direction (450 GB/s); NCCL's point-to-point
    /// send/recv reaches about 80 % of it in practice (NVIDIA's nccl-tests on DGX H100), and about 20 µs per
    /// exchange of launch and handshake; HBM3 at the 3.0 TB/s copy rate measured on the lent H100
    /// (`../shared/ANCHORS.md`). A prior, to be replaced by the rates a run measures.
    pub const NVLINK4: RingLink = RingLink { gbs: 360.0, latency_us: 20.0, hbm_gbs: 3000.0 };
}

/// The predicted time of one ring layer: per step, compute and transfer side by side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RingCost {
    /// GPUs.
    pub ranks: usize,
    /// Per step (the busiest rank): compute milliseconds.
    pub compute_ms: Vec<f64>,
    /// Per step: milliseconds of the transfer that runs beside it (zero on the last forward step).
    pub transfer_ms: Vec<f64>,
    /// Milliseconds of the whole layer: each step takes the longer of its compute and the transfer it
    /// waits for.
    pub total_ms: f64,
    /// The same work on one GPU at the same rate, milliseconds.
    pub single_ms: f64,
}

impl RingCost {
    /// Predicts a forward (or backward, `backward`: 2.5x the FLOPs, and dK/dV travel beside K/V: in f32,
    /// the last hop home in the dtype)
    /// ring layer of `spec` (the whole sequence) over `ranks` GPUs whose attention kernel runs at
    /// `tflops` on calls of this size, linked by `link`. Step `t`'s compute needs the K/V that the transfer
    /// of step `t - 1` brought, so each step lasts the longer of its compute and that transfer.
    pub fn predict(spec: &AttentionSpec, ranks: usize, tflops: f64, link: RingLink, backward: bool) -> Result<Self> {
        let plan = RingPlan::new(ranks, spec.shape.sq)?;
        let s = &spec.shape;
        let causal = spec.mask.is_causal();
        let flops_per_pair = 2.0 * (s.d + s.dv) as f64 * (s.b * s.hq) as f64 * if backward { 2.5 } else { 1.0 };
        let rate = tflops.max(1e-9) * 1e12;
        let es = spec.dtype.size_bytes() as f64;
        let mut compute_ms = Vec::with_capacity(ranks);
        let mut transfer_ms = Vec::with_capacity(ranks);
        let rows_max = plan.max_local_len() as f64;
        // A step's pass over memory besides attention: the forward's merge reads the running O and the part
        // and writes the result (dtype); the backward adds dQ (f32 read and write, dtype part) and dK/dV.
        let pass_bytes = if backward {
            rows_max * (s.b * s.hq * s.d) as f64 * (8.0 + es)
                + rows_max * (s.b * s.hkv * (s.d + s.dv)) as f64 * (8.0 + es)
        } else {
            rows_max * (s.b * s.hq * s.dv) as f64 * 3.0 * es
        };
        for t in 0..ranks {
            let pairs = (0..ranks).map(|r| plan.step_pairs(r, t, causal)).max().unwrap_or(0) as f64;
            let pass_ms = if t > 0 || backward { pass_bytes / (link.hbm_gbs * 1e9) * 1e3 } else { 0.0 };
            compute_ms.push(pairs * flops_per_pair / rate * 1e3 + pass_ms);
            // The K/V that travel during step t are those of step t + 1 (none after the last forward step);
            // the backward also sends the dK/dV accumulator of step t on.
            let rows = (0..ranks).map(|r| plan.local_len(plan.source(r, t))).max().unwrap_or(0) as f64;
            let kv = rows * (s.b * s.hkv) as f64 * (s.d + s.dv) as f64;
            let mut bytes = if t + 1 < ranks { kv * es } else { 0.0 };
            if backward && ranks > 1 {
                // Accumulators in f32, except on the last hop home, which carries finished sums in the dtype.
                bytes += kv * if t + 1 < ranks { 4.0 } else { es };
            }
            let ms = if bytes > 0.0 { bytes / (link.gbs * 1e9) * 1e3 + link.latency_us * 1e-3 } else { 0.0 };
            transfer_ms.push(ms);
        }
        let mut total_ms = compute_ms.first().copied().unwrap_or(0.0);
        for t in 1..ranks {
            total_ms += compute_ms[t].max(transfer_ms[t - 1]);
        }
        if backward && ranks > 1 {
            // The last dK/dV hop home waits for the last step.
            total_ms += transfer_ms[ranks - 1];
        }
        let single_pairs = crate::cost::pairs_per_head(s.sq, s.sk, &spec.mask) as f64;
        let single_ms = single_pairs * flops_per_pair / rate * 1e3;
        Ok(RingCost { ranks, compute_ms, transfer_ms, total_ms, single_ms })
    }

    /// Single-GPU time over N times the ring time: 1.0 is perfect scaling.
    pub fn efficiency(&self) -> f64 {
        self.single_ms / (self.ranks as f64 * self.total_ms)
    }

    /// Speedup over one GPU.
    pub fn speedup(&self) -> f64 {
        self.single_ms / self.total_ms
    }

    /// Fraction of transfer time hidden under compute, per step that waits for one (steps 1..N).
    pub fn hidden(&self) -> Vec<f64> {
        (1..self.ranks)
            .map(|t| {
                let x = self.transfer_ms[t - 1];
                if x <= 0.0 {
                    1.0
                } else {
                    (self.compute_ms[t] / x).min(1.0)
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::pairs_per_head;
    use crate::dtype::DType;
    use crate::spec::Shape;

    /// Every global row lies in exactly one rank's chunks, for lengths divisible by 2N and not.
    #[test]
    fn chunks_cover_the_sequence_once() {
        for (n, s) in [(1, 2), (2, 8), (2, 11), (3, 17), (4, 64), (8, 1000)] {
            let p = RingPlan::new(n, s).unwrap();
            let mut seen = vec![0u8; s];
            for r in 0..n {
                for i in 0..p.local_len(r) {
                    seen[p.global_row(r, i)] += 1;
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "n={n} s={s}");
            let lens: Vec<usize> = (0..2 * n).map(|c| p.chunk(c).len()).collect();
            assert!(lens.iter().max().unwrap() - lens.iter().min().unwrap() <= 1, "{lens:?}");
        }
        assert!(RingPlan::new(4, 7).is_err());
        assert!(RingPlan::new(0, 7).is_err());
    }

    /// The steps' visible pairs are exactly the causal pairs of the gathered sequence: for every rank and
    /// every source rank, a pair (local i, visiting j) is computed iff global(i) >= global(j).
    #[test]
    fn zigzag_steps_compute_exactly_the_causal_pairs() {
        for (n, s) in [(2, 8), (2, 13), (3, 19), (4, 40)] {
            let p = RingPlan::new(n, s).unwrap();
            let mut total = 0u128;
            for r in 0..n {
                for src in 0..n {
                    let w = p.work(r, src, true).unwrap();
                    for i in 0..p.local_len(r) {
                        for j in 0..p.local_len(src) {
                            let in_call = w.rows.contains(&i)
                                && w.keys.contains(&j)
                                && (w.mask == Mask::None || j - w.keys.start <= i - w.rows.start);
                            let causal = p.global_row(r, i) >= p.global_row(src, j);
                            assert_eq!(in_call, causal, "n={n} s={s} r={r} src={src} i={i} j={j}");
                        }
                    }
                    total += pairs_per_head(w.rows.len(), w.keys.len(), &w.mask);
                }
            }
            assert_eq!(total, pairs_per_head(s, s, &Mask::CausalTopLeft));
        }
    }

    /// Zigzag balances causal work: at every step the busiest rank does at most a chunk's row more than the
    /// least busy one (equal when S is divisible by 2N).
    #[test]
    fn zigzag_balances_causal_work() {
        let p = RingPlan::new(4, 4096).unwrap();
        for t in 1..4 {
            let w: Vec<u128> = (0..4).map(|r| p.step_pairs(r, t, true)).collect();
            assert!(w.iter().all(|&x| x == w[0]), "step {t}: {w:?}");
        }
        // Each rank's whole layer is the same work.
        let per_rank: Vec<u128> = (0..4).map(|r| (0..4).map(|t| p.step_pairs(r, t, true)).sum()).collect();
        assert!(per_rank.iter().all(|&x| x == per_rank[0]), "{per_rank:?}");
    }

    #[test]
    fn source_walks_the_ring_backwards() {
        let p = RingPlan::new(4, 64).unwrap();
        assert_eq!((0..4).map(|t| p.source(1, t)).collect::<Vec<_>>(), vec![1, 0, 3, 2]);
    }

    /// The model: long sequences hide the transfer (efficiency near 1); short ones do not; causal halves the
    /// compute per step, so it needs twice the length to hide.
    #[test]
    fn cost_model_hides_long_transfers_and_not_short_ones() {
        let spec = |s: usize, causal: bool| {
            let a = AttentionSpec::new(Shape::new(1, 32, s, s, 128), DType::BF16);
            if causal {
                a.with_mask(Mask::CausalTopLeft)
            } else {
                a
            }
        };
        let long = RingCost::predict(&spec(131072, true), 2, 400.0, RingLink::NVLINK4, false).unwrap();
        assert!(long.efficiency() > 0.99, "{long:?}");
        assert!(long.hidden().iter().all(|&h| h >= 1.0));
        let short = RingCost::predict(&spec(1024, true), 8, 400.0, RingLink::NVLINK4, false).unwrap();
        assert!(short.efficiency() < 0.5, "{short:?}");
        // Perfect split of the work: the ring's compute sums to the single GPU's over N.
        let c = RingCost::predict(
            &spec(65536, false),
            4,
            400.0,
            RingLink { gbs: 1e12, latency_us: 0.0, hbm_gbs: 1e12 },
            false,
        )
        .unwrap();
        assert!((c.speedup() - 4.0).abs() < 1e-3, "{c:?}");
        let b = RingCost::predict(&spec(65536, true), 2, 400.0, RingLink::NVLINK4, true).unwrap();
        assert!(b.total_ms > 2.0 * c.total_ms / 4.0, "backward costs more: {b:?}");
    }

    #[test]
    fn ring_specs_refuse_what_the_local_calls_cannot_express() {
        let base = AttentionSpec::new(Shape::new(1, 4, 64, 64, 64), DType::BF16);
        assert!(check_ring_spec(&base, 2).is_ok());
        assert!(check_ring_spec(&AttentionSpec::new(Shape::new(1, 4, 32, 64, 64), DType::BF16), 2).is_err());
        assert!(check_ring_spec(&base.clone().with_layout(crate::spec::Layout::Bshd), 2).is_err());
        assert!(check_ring_spec(&base, 64).is_err());
    }
}
