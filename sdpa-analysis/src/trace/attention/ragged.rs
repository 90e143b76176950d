//! Varlen and paged batches: what a trace tells about them, and the work they did, exact or bounded.
//!
//! A varlen call (FlashAttention's `cu_seqlens`, PyTorch's nested tensors and `varlen_attn`) packs B sequences
//! of different lengths into `[total_tokens, H, D]`; a paged call reads each sequence's keys from fixed-size
//! pages of a cache through a block table (vLLM, FlashInfer, FlashAttention's `block_table`). The profiler
//! records tensor dims and scalar arguments, never tensor values, so a trace gives the number of sequences
//! (the length of `cu_seqlens`, B + 1), the token totals (the packed dims), the longest lengths (the
//! `max_seqlen` scalars) and the page size, but not each sequence's length. The work is then exact only when
//! those numbers pin every length down (every sequence as long as the longest); otherwise it is a bound,
//! and [`Work`] says which way and why.

use serde::Serialize;

/// How a call's batch was laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum BatchLayout {
    /// One `[B, H, S, D]` (or `[B, S, H, D]`) tensor per operand: every sequence padded to the same length.
    #[default]
    Dense,
    /// Sequences packed without padding, delimited by cumulative offsets (`cu_seqlens`).
    Varlen,
    /// Keys and values in fixed-size pages of a cache, addressed through a block table.
    Paged,
}

impl BatchLayout {
    /// `dense`, `varlen` or `paged`.
    pub fn name(self) -> &'static str {
        match self {
            BatchLayout::Dense => "dense",
            BatchLayout::Varlen => "varlen",
            BatchLayout::Paged => "paged",
        }
    }
}

/// What the trace recorded about a varlen or paged batch. Lengths are tokens per sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Ragged {
    /// Number of sequences B (`cu_seqlens` holds B + 1 offsets; a paged decode has one query row per sequence).
    pub sequences: usize,
    /// Query tokens of all sequences together (the packed Q's first dim).
    pub total_q: usize,
    /// The longest query length, as the call states it (`max_seqlen_q`).
    pub max_q: usize,
    /// Key tokens of all sequences together, when K is packed; `None` for a paged cache, whose tensor holds
    /// pages, not the keys in use.
    pub total_k: Option<usize>,
    /// The longest key length, as the call states it (`max_seqlen_k`, vLLM's `max_seq_len`).
    pub max_k: usize,
    /// Tokens per page of a paged cache, when recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_size: Option<usize>,
}

/// How far the work of a call is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum WorkBound {
    /// FLOPs and bytes are those of the call.
    #[default]
    Exact,
    /// The call did at least this much work, so its rates and efficiency are at least those shown.
    LowerBound,
    /// The call did at most this much work, so its rates and efficiency are at most those shown.
    UpperBound,
}

impl WorkBound {
    /// `exact`, `lower_bound` or `upper_bound`.
    pub fn name(self) -> &'static str {
        match self {
            WorkBound::Exact => "exact",
            WorkBound::LowerBound => "lower_bound",
            WorkBound::UpperBound => "upper_bound",
        }
    }

    /// The sign put before a bounded figure: `>=` (lower bound), `<=` (upper bound), nothing when exact.
    pub fn sign(self) -> &'static str {
        match self {
            WorkBound::Exact => "",
            WorkBound::LowerBound => ">=",
            WorkBound::UpperBound => "<=",
        }
    }
}

/// The mask a ragged call applies within each sequence, as far as its work goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowMask {
    /// Every query sees every key of its sequence (also explicit or unknown masks: the kernel computes every
    /// pair of the sequence).
    Full,
    /// Causal, aligned top-left in each sequence.
    CausalTopLeft,
    /// Causal, aligned bottom-right in each sequence (FlashAttention's convention).
    CausalBottomRight,
}

/// The work of a ragged call: the (query, key) pairs per query head summed over sequences, and the key
/// tokens read per key/value head, with how far they are known.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Work {
    /// Score pairs per query head, summed over the sequences.
    pub pairs_per_head: f64,
    /// Key (and value) tokens read, summed over the sequences.
    pub key_tokens: f64,
    /// Exact, or which way the figures bound the truth.
    pub bound: WorkBound,
    /// Why the figures are exact or how the bound follows.
    pub why: String,
}

impl Ragged {
    /// True when the recorded numbers pin every sequence's length: every query length is `max_q` and every
    /// key length `max_k` (each length is at most its maximum, so totals of B times the maximum leave no room
    /// for a shorter one).
    pub fn uniform(&self) -> bool {
        self.queries_uniform() && self.total_k == Some(self.sequences.saturating_mul(self.max_k))
    }

    fn queries_uniform(&self) -> bool {
        self.total_q == self.sequences.saturating_mul(self.max_q)
    }

    /// The lengths of each sequence when [`Ragged::uniform`] pins them: (query lengths, key lengths).
    pub fn exact_lengths(&self) -> Option<(Vec<usize>, Vec<usize>)> {
        // A replay lists every length; a trace claiming a million sequences is not replayed length by length.
        const MAX_LISTED: usize = 4096;
        (self.uniform() && self.sequences <= MAX_LISTED)
            .then(|| (vec![self.max_q; self.sequences], vec![self.max_k; self.sequences]))
    }

    /// `varlen B=16 Tq=65536 Tk=65536 max 8192/8192`, `paged B=32 Tq=32 max 1/32768 page 16`.
    pub fn label(&self, layout: BatchLayout) -> String {
        let tk = self.total_k.map(|t| t.to_string()).unwrap_or_else(|| "?".into());
        let page = self.page_size.map(|p| format!(" page {p}")).unwrap_or_default();
        format!(
            "{} B={} Tq={} Tk={tk} max {}/{}{page}",
            layout.name(),
            self.sequences,
            self.total_q,
            self.max_q,
            self.max_k
        )
    }

    /// The work of the call under `mask`; `windowed` says a sliding window also limits each row (then only an
    /// upper bound holds unless the lengths are known).
    pub fn work(&self, mask: RowMask, windowed: bool, band_pairs: impl Fn(usize, usize) -> u128) -> Work {
        let b = self.sequences as f64;
        let tq = self.total_q as f64;
        if self.uniform() {
            // Every sequence is (max_q, max_k): B copies of one dense problem, whatever the mask and window.
            return Work {
                pairs_per_head: b * band_pairs(self.max_q, self.max_k) as f64,
                key_tokens: b * self.max_k as f64,
                bound: WorkBound::Exact,
                why: format!(
                    "every sequence has the longest lengths ({} queries, {} keys): the token totals are B times them",
                    self.max_q, self.max_k
                ),
            };
        }
        let Some(tk) = self.total_k.map(|t| t as f64) else { return self.paged_work(mask, windowed) };
        if self.queries_uniform() && self.max_q == 1 && mask != RowMask::CausalTopLeft && !windowed {
            // One query per sequence that sees all of its keys (bottom-right causal included): Tk pairs.
            return Work {
                pairs_per_head: tk,
                key_tokens: tk,
                bound: WorkBound::Exact,
                why: "one query per sequence, each seeing all of its sequence's keys: the pairs are the key total"
                    .into(),
            };
        }
        let upper = (self.max_q as f64 * tk).min(self.max_k as f64 * tq);
        let self_attention = self.total_k == Some(self.total_q) && self.max_k == self.max_q;
        if self_attention && !windowed {
            // Σ s_b² ≥ (Σ s_b)² / B (Cauchy-Schwarz): the work is least when the tokens are spread evenly.
            let squares = tq * tq / b.max(1.0);
            let pairs = match mask {
                RowMask::Full => squares,
                RowMask::CausalTopLeft | RowMask::CausalBottomRight => (squares + tq) / 2.0,
            };
            return Work {
                pairs_per_head: pairs.min(upper),
                key_tokens: tk,
                bound: WorkBound::LowerBound,
                why: format!(
                    "the trace gives B = {} sequences and T = {} tokens, not each length: Σ s² ≥ T²/B \
                     (Cauchy-Schwarz), equal only when all lengths are equal; assumes each sequence's query and key \
                     lengths agree (Q and K have the same total and maximum)",
                    self.sequences, self.total_q
                ),
            };
        }
        Work {
            pairs_per_head: upper,
            key_tokens: tk,
            bound: WorkBound::UpperBound,
            why: format!(
                "the trace gives the token totals (Tq = {}, Tk = {}) and the longest lengths ({}, {}), not each \
                 length{}: each query sees at most max_k keys and each key at most max_q queries",
                self.total_q,
                self.total_k.unwrap_or(0),
                self.max_q,
                self.max_k,
                if windowed { ", and a window limits each row" } else { "" }
            ),
        }
    }

    /// A paged cache's keys are not in any recorded dim: bound them from the queries. A sequence's cache holds
    /// at least its new tokens (s_k ≥ s_q), so the work is at least that of its queries attending to themselves.
    fn paged_work(&self, mask: RowMask, windowed: bool) -> Work {
        let b = self.sequences as f64;
        let tq = self.total_q as f64;
        let page = self.page_size.map(|p| format!(", pages of {p} tokens")).unwrap_or_default();
        let upper_keys = b * self.max_k as f64;
        if windowed {
            return Work {
                pairs_per_head: self.max_k as f64 * tq,
                key_tokens: upper_keys,
                bound: WorkBound::UpperBound,
                why: format!(
                    "paged cache{page}: the trace gives the longest key length ({}), not each sequence's, and a \
                     window limits each row: each query sees at most max_k keys",
                    self.max_k
                ),
            };
        }
        if self.queries_uniform() && self.max_q == 1 && mask != RowMask::CausalTopLeft {
            // Decoding: the pairs are the keys in the cache, at least the longest sequence plus one key for each
            // of the others.
            let keys = (self.max_k as f64 + b - 1.0).min(upper_keys).max(b);
            return Work {
                pairs_per_head: keys,
                key_tokens: keys,
                bound: WorkBound::LowerBound,
                why: format!(
                    "paged decode{page}: the trace gives B = {} sequences and the longest cache ({} keys), not each \
                     cache length: at least the longest plus one key per other sequence (assumes max_seq_len is \
                     the batch's longest, as vLLM and FlashAttention's callers pass it)",
                    self.sequences, self.max_k
                ),
            };
        }
        let squares = tq * tq / b.max(1.0);
        let pairs = match mask {
            RowMask::Full => squares,
            RowMask::CausalTopLeft | RowMask::CausalBottomRight => (squares + tq) / 2.0,
        };
        Work {
            pairs_per_head: pairs.min(self.max_k as f64 * tq),
            key_tokens: tq.min(upper_keys),
            bound: WorkBound::LowerBound,
            why: format!(
                "paged cache{page}: the trace gives B = {} sequences and T = {} new tokens, not each cache length; a \
                 cache holds at least its sequence's new tokens, so the work is at least theirs attending to \
                 themselves, Σ s² ≥ T²/B (Cauchy-Schwarz)",
                self.sequences, self.total_q
            ),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use sdpa_core::cost::pairs_per_head;
    use sdpa_core::Mask;

    fn full(sq: usize, sk: usize) -> u128 {
        pairs_per_head(sq, sk, &Mask::None)
    }

    fn causal(sq: usize, sk: usize) -> u128 {
        pairs_per_head(sq, sk, &Mask::CausalBottomRight)
    }

    fn varlen(lengths: &[usize]) -> Ragged {
        let t = lengths.iter().sum();
        let m = lengths.iter().copied().max().unwrap_or(0);
        Ragged { sequences: lengths.len(), total_q: t, max_q: m, total_k: Some(t), max_k: m, page_size: None }
    }

    #[test]
    fn equal_lengths_are_exact() {
        let r = varlen(&[512, 512, 512]);
        let w = r.work(RowMask::CausalBottomRight, false, causal);
        assert_eq!(w.bound, WorkBound::Exact);
        assert_eq!(w.pairs_per_head, 3.0 * 512.0 * 513.0 / 2.0);
        assert_eq!(r.exact_lengths().unwrap().0, [512, 512, 512]);
    }

    #[test]
    fn unequal_lengths_give_a_lower_bound_below_the_truth() {
        let lengths = [128, 2000, 7, 8192, 1];
        let r = varlen(&lengths);
        let truth_full: u128 = lengths.iter().map(|&s| full(s, s)).sum();
        let truth_causal: u128 = lengths.iter().map(|&s| causal(s, s)).sum();
        let w = r.work(RowMask::Full, false, full);
        assert_eq!(w.bound, WorkBound::LowerBound);
        assert!(w.pairs_per_head <= truth_full as f64);
        let t = lengths.iter().sum::<usize>() as f64;
        assert_eq!(w.pairs_per_head, t * t / 5.0);
        let c = r.work(RowMask::CausalTopLeft, false, causal);
        assert!(c.pairs_per_head <= truth_causal as f64 && c.pairs_per_head > 0.0);
        assert!(c.why.contains("Cauchy-Schwarz"), "{}", c.why);
        assert!(r.exact_lengths().is_none());
    }

    #[test]
    fn decoding_one_query_per_sequence_is_exact_with_packed_keys() {
        let r = Ragged { sequences: 3, total_q: 3, max_q: 1, total_k: Some(4431), max_k: 4097, page_size: None };
        let w = r.work(RowMask::CausalBottomRight, false, causal);
        assert_eq!((w.bound, w.pairs_per_head), (WorkBound::Exact, 4431.0));
    }

    #[test]
    fn paged_decoding_is_a_lower_bound_that_holds() {
        // Lengths 1, 4097, 333 in pages of 16: the trace shows B, max and the page size only.
        let r = Ragged { sequences: 3, total_q: 3, max_q: 1, total_k: None, max_k: 4097, page_size: Some(16) };
        let w = r.work(RowMask::Full, false, full);
        assert_eq!(w.bound, WorkBound::LowerBound);
        assert_eq!(w.pairs_per_head, 4099.0);
        assert!(w.pairs_per_head <= (1 + 4097 + 333) as f64);
        assert!(r.label(BatchLayout::Paged).ends_with("page 16"), "{}", r.label(BatchLayout::Paged));
    }

    #[test]
    fn cross_lengths_give_an_upper_bound() {
        // Queries (3, 1) against keys (1, 5): the truth is 3 + 5 = 8 pairs.
        let r = Ragged { sequences: 2, total_q: 4, max_q: 3, total_k: Some(6), max_k: 5, page_size: None };
        let w = r.work(RowMask::Full, false, full);
        assert_eq!(w.bound, WorkBound::UpperBound);
        assert!(w.pairs_per_head >= 8.0);
    }

    proptest::proptest! {
        /// Whatever the lengths, an exact figure is the truth and a bound lies on its side of it.
        #[test]
        fn bounds_hold_for_any_lengths(
            q in proptest::collection::vec(0usize..3000, 1..12),
            extra in proptest::collection::vec(0usize..3000, 12),
            same in proptest::bool::ANY,
            causal in proptest::bool::ANY,
        ) {
            // Keys: the queries' own lengths (self-attention), or at least as many (a cache before new tokens).
            let k: Vec<usize> = if same { q.clone() } else { q.iter().zip(&extra).map(|(a, e)| a + e).collect() };
            let (mask, core) = if causal {
                (RowMask::CausalBottomRight, Mask::CausalBottomRight)
            } else {
                (RowMask::Full, Mask::None)
            };
            let truth: u128 = q.iter().zip(&k).map(|(&a, &b)| pairs_per_head(a, b, &core)).sum();
            let max = |v: &[usize]| v.iter().copied().max().unwrap_or(0);
            let packed = Ragged {
                sequences: q.len(),
                total_q: q.iter().sum(),
                max_q: max(&q),
                total_k: Some(k.iter().sum()),
                max_k: max(&k),
                page_size: None,
            };
            let paged = Ragged { total_k: None, page_size: Some(16), ..packed };
            for r in [packed, paged] {
                let w = r.work(mask, false, |a, b| pairs_per_head(a, b, &core));
                let t = truth as f64;
                match w.bound {
                    WorkBound::Exact => proptest::prop_assert!((w.pairs_per_head - t).abs() <= 1e-9 * t.max(1.0)),
                    WorkBound::LowerBound => proptest::prop_assert!(w.pairs_per_head <= t * (1.0 + 1e-12), "{} > {t}: {}", w.pairs_per_head, w.why),
                    WorkBound::UpperBound => proptest::prop_assert!(w.pairs_per_head >= t * (1.0 - 1e-12), "{} < {t}: {}", w.pairs_per_head, w.why),
                }
            }
        }
    }

    #[test]
    fn absurd_numbers_do_not_panic() {
        let r = Ragged {
            sequences: usize::MAX,
            total_q: usize::MAX,
            max_q: usize::MAX,
            total_k: Some(usize::MAX),
            max_k: 0,
            page_size: Some(0),
        };
        for m in [RowMask::Full, RowMask::CausalTopLeft, RowMask::CausalBottomRight] {
            let w = r.work(m, false, |_, _| u128::MAX);
            assert!(w.pairs_per_head.is_finite());
        }
        let z = Ragged { sequences: 0, total_q: 0, max_q: 0, total_k: None, max_k: 0, page_size: None };
        assert!(z.work(RowMask::Full, true, full).pairs_per_head.is_finite());
    }
}
