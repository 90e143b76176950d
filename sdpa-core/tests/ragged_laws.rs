//! Laws of ragged batches and paged caches: the f64 reference on a ragged batch equals, sequence by
//! sequence, the reference on that sequence alone as a dense call (`sequence_as_dense`), whatever the
//! packing, page size, page order, layout, mask alignment and variants. The dense reference is the
//! independent oracle: it never reads offsets or block tables.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use sdpa_core::{
    reference_attention, sequence_as_dense, Alibi, AttentionSpec, DType, Diagonal, HostInputs, Layout, Mask, Ragged,
    Shape, Window,
};

/// Runs the ragged reference and each sequence's dense reference; asserts they agree exactly (both are f64
/// over the same rounded inputs, summing the same keys in the same order).
fn agrees_with_dense(spec: &AttentionSpec, seed: u64) {
    spec.validate().unwrap_or_else(|e| panic!("{e}"));
    let inputs = HostInputs::random(spec, seed).unwrap();
    let got = reference_attention(spec, &inputs).unwrap();
    let dv = spec.shape.dv;
    for (b, seq) in spec.seqs().iter().enumerate() {
        let dense = sequence_as_dense(spec, &inputs, b).unwrap();
        for h in 0..spec.shape.hq {
            for i in 0..seq.sq {
                let row = spec.row_index(seq, b, h, i);
                let (o, lse) = (&got.o[row * dv..(row + 1) * dv], got.lse[row]);
                match &dense {
                    // No key: the row is zeros with LSE −inf.
                    None => {
                        assert!(o.iter().all(|&x| x == 0.0) && lse == f64::NEG_INFINITY, "seq {b} row {i}");
                    }
                    Some((ds, di)) => {
                        let want = reference_attention(ds, di).unwrap();
                        let r = (h * seq.sq + i) * dv;
                        assert_eq!(o, &want.o[r..r + dv], "seq {b} head {h} row {i} of {spec:?}");
                        assert_eq!(lse.to_bits(), want.lse[h * seq.sq + i].to_bits(), "lse seq {b} row {i}");
                    }
                }
            }
        }
    }
}

fn spec(hq: usize, hkv: usize, d: usize, dv: usize, r: Ragged, layout: Layout) -> AttentionSpec {
    let shape = Shape { b: r.batch(), hq, hkv, sq: r.max_q().max(1), sk: r.max_k().max(1), d, dv };
    AttentionSpec::new(shape, DType::BF16).with_ragged(r, layout)
}

#[test]
fn packed_batches_with_empty_and_single_token_sequences() {
    let r = Ragged::new(vec![5, 0, 1, 17, 3], vec![9, 4, 1, 17, 0]);
    for layout in [Layout::Bshd, Layout::Bhsd] {
        for mask in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight] {
            agrees_with_dense(&spec(4, 2, 24, 16, r.clone(), layout).with_mask(mask), 1);
        }
    }
}

#[test]
fn paged_caches_of_every_page_size_in_shuffled_order() {
    // Sq > Sk inside a sequence, lengths that end mid-page, page size 1, a page size past every length.
    let r = Ragged::new(vec![3, 1, 7], vec![13, 1, 5]);
    for ps in [1, 2, 5, 16, 256] {
        for layout in [Layout::Bshd, Layout::Bhsd] {
            let s = spec(6, 3, 8, 8, r.clone().paged(ps, 3), layout).with_mask(Mask::CausalBottomRight);
            agrees_with_dense(&s, ps as u64);
        }
    }
}

#[test]
fn shared_pages_are_read_by_every_sequence_that_names_them() {
    // A pool smaller than the pages in use: the shuffled table repeats pages across sequences.
    let mut r = Ragged::new(vec![2, 2, 2], vec![8, 8, 8]).paged(4, 0);
    r.pages = r.pages.map(|p| sdpa_core::Paging { num_pages: 3, ..p });
    let s = spec(2, 1, 8, 8, r, Layout::Bshd);
    let inputs = HostInputs::random(&s, 3).unwrap();
    let t = inputs.block_table.as_ref().unwrap();
    let used: Vec<u32> = t.iter().copied().filter(|&p| p != u32::MAX).collect();
    assert!(used.len() > 3, "six pages in use over a pool of three: some repeat");
    agrees_with_dense(&s, 3);
}

#[test]
fn variants_measure_from_each_sequence_s_own_diagonal() {
    let r = Ragged::new(vec![6, 2, 9], vec![11, 9, 4]);
    let window = Window { left: Some(3), right: Some(1) };
    for diag in [Diagonal::TopLeft, Diagonal::BottomRight] {
        let base = spec(4, 4, 16, 16, r.clone().paged(4, 1), Layout::Bshd).with_diagonal(diag);
        agrees_with_dense(&base.clone().with_window(window), 5);
        agrees_with_dense(&base.clone().with_alibi(Alibi::Standard).with_softcap(7.0), 6);
    }
    let causal = spec(4, 2, 16, 16, r, Layout::Bhsd).with_mask(Mask::CausalBottomRight);
    agrees_with_dense(&causal.with_window(Window { left: Some(2), right: None }).with_softcap(4.0), 7);
}

#[test]
fn impossible_ragged_specs_are_refused_with_their_reason() {
    let r = Ragged::new(vec![2, 3], vec![4, 4]);
    let s = spec(2, 2, 8, 8, r.clone(), Layout::Bshd);
    let mut short = s.clone();
    short.shape.sq = 2;
    assert!(short.validate().unwrap_err().to_string().contains("sequence 1 has 3 query tokens"));
    let explicit = s.clone().with_mask(Mask::Explicit(sdpa_core::ExplicitMask {
        values: sdpa_core::MaskValues::Boolean,
        dims: [1, 1, 1, 1],
    }));
    assert!(explicit.validate().unwrap_err().to_string().contains("explicit mask"));
    // A dense spec given a block table, a paged one without.
    let dense = AttentionSpec::new(Shape::new(1, 1, 2, 2, 8), DType::F32);
    let mut inputs = HostInputs::random(&dense, 0).unwrap();
    inputs.block_table = Some(vec![0]);
    assert!(inputs.check(&dense).unwrap_err().to_string().contains("dense"));
    let paged = spec(2, 2, 8, 8, r.paged(2, 0), Layout::Bshd);
    let mut inputs = HostInputs::random(&paged, 0).unwrap();
    inputs.block_table = None;
    assert!(inputs.check(&paged).unwrap_err().to_string().contains("needs its block table"));
}

#[test]
fn cost_counts_each_sequence_s_own_work() {
    let r = Ragged::new(vec![4, 1], vec![4, 100]);
    let s = spec(2, 1, 8, 8, r, Layout::Bshd).with_mask(Mask::CausalBottomRight);
    let c = sdpa_core::AttentionCost::of_spec(&s);
    // Sequence 0: causal 4x4 = 10 pairs; sequence 1: one row seeing all 100 keys.
    assert_eq!(c.flops, 2.0 * 2.0 * (10.0 + 100.0) * 16.0);
    assert_eq!(c.bytes, 2.0 * ((5.0 * 2.0 * 16.0) + (104.0 * 16.0)));
}
