//! Ragged (varlen) batches and paged KV caches on every CPU kernel and SIMD path, against the f64
//! reference (`check_output`, output and LSE poisoned with NaN before each call by `run_host`): empty and
//! single-token sequences, Sq_b > Sk_b, page sizes 1, 16 and 256 with lengths ending mid-page, shuffled and
//! repeated pages, both causal alignments, windows, softcap, ALiBi, GQA 1/4/8, both layouts, every dtype.
//! Sizes stay small: CI runs these in debug mode on two cores.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::{backends, check_inputs};
use sdpa_core::{
    Alibi, AppendSpec, AttentionSpec, DType, Diagonal, HostBuffer, HostInputs, Kernel, Layout, Mask, Paging, Ragged,
    RunOptions, Shape, Window,
};
use sdpa_cpu::CpuBackend;

const KERNELS: [Kernel; 4] = [Kernel::Unfused, Kernel::Fa2, Kernel::SplitKv, Kernel::Auto];

fn spec(hq: usize, hkv: usize, d: usize, r: Ragged, dtype: DType, layout: Layout) -> AttentionSpec {
    let shape = Shape { b: r.batch(), hq, hkv, sq: r.max_q().max(1), sk: r.max_k().max(1), d, dv: d };
    AttentionSpec::new(shape, dtype).with_ragged(r, layout)
}

/// Every kernel on `spec` (one seed's inputs), on `be`.
fn all_kernels(be: &CpuBackend, spec: &AttentionSpec, seed: u64) {
    let inputs = HostInputs::random(spec, seed).unwrap();
    for kernel in KERNELS {
        check_inputs(be, spec, kernel, &inputs);
    }
}

#[test]
fn packed_batches_with_empty_single_and_short_key_sequences() {
    // Sequence 1 has no query, 2 one query and no key, 4 more queries than keys; 3 spans several tiles.
    let r = Ragged::new(vec![5, 0, 1, 70, 17], vec![9, 4, 0, 83, 12]);
    let dtypes = [DType::F32, DType::F16, DType::BF16];
    for (n, be) in backends().iter().enumerate() {
        for (m, mask) in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight].into_iter().enumerate() {
            for layout in [Layout::Bshd, Layout::Bhsd] {
                let dtype = dtypes[(n + m) % 3];
                all_kernels(be, &spec(4, 1, 32, r.clone(), dtype, layout).with_mask(mask), 1);
            }
        }
    }
}

#[test]
fn gqa_groups_of_one_four_and_eight() {
    let r = Ragged::new(vec![3, 40, 1], vec![3, 50, 29]);
    for be in backends() {
        for (hq, hkv) in [(2, 2), (8, 2), (8, 1)] {
            for dtype in [DType::F32, DType::BF16] {
                let s = spec(hq, hkv, 16, r.clone(), dtype, Layout::Bshd).with_mask(Mask::CausalBottomRight);
                all_kernels(&be, &s, 2);
            }
        }
    }
}

#[test]
fn paged_decoding_over_page_sizes_one_sixteen_and_256() {
    // One query per sequence (decoding), cache lengths ending mid-page, an empty cache, a long one that
    // splitkv cuts into several chunks.
    let r = Ragged::new(vec![1, 1, 1, 1], vec![17, 0, 300, 1]);
    for be in backends() {
        for ps in [1, 16, 256] {
            for (layout, dtype) in [(Layout::Bshd, DType::BF16), (Layout::Bhsd, DType::F32), (Layout::Bshd, DType::F16)]
            {
                let s = spec(8, 2, 64, r.clone().paged(ps, 2), dtype, layout).with_mask(Mask::CausalBottomRight);
                all_kernels(&be, &s, ps as u64);
            }
        }
    }
}

#[test]
fn chunked_prefill_against_a_paged_cache() {
    // New tokens against a cache holding them and earlier ones (Sq_b < Sk_b, bottom-right), next to a
    // sequence with more queries than keys, in both alignments.
    let r = Ragged::new(vec![7, 3, 20, 9], vec![40, 19, 90, 4]);
    for be in backends() {
        for ps in [1, 16] {
            for (mask, layout) in [(Mask::CausalBottomRight, Layout::Bshd), (Mask::CausalTopLeft, Layout::Bhsd)] {
                for dtype in [DType::F32, DType::BF16] {
                    let s = spec(4, 2, 32, r.clone().paged(ps, 1), dtype, layout).with_mask(mask);
                    all_kernels(&be, &s, 3);
                }
            }
        }
    }
}

#[test]
fn shared_and_shuffled_pages() {
    // Six pages in use over a pool of three: the shuffled table repeats pages across sequences.
    let mut r = Ragged::new(vec![2, 1, 5], vec![8, 7, 8]).paged(4, 0);
    r.pages = r.pages.map(|p| Paging { num_pages: 3, ..p });
    for be in backends() {
        for dtype in [DType::F32, DType::F16] {
            all_kernels(&be, &spec(2, 1, 16, r.clone(), dtype, Layout::Bshd).with_mask(Mask::CausalBottomRight), 4);
        }
    }
}

#[test]
fn windows_softcap_and_alibi_per_sequence() {
    let r = Ragged::new(vec![6, 2, 33, 1], vec![11, 9, 4, 70]);
    let window = Window { left: Some(5), right: Some(1) };
    for be in backends() {
        for (k, diag) in [Diagonal::TopLeft, Diagonal::BottomRight].into_iter().enumerate() {
            let pages = if k == 0 { r.clone() } else { r.clone().paged(16, 1) };
            let base = spec(4, 2, 16, pages, DType::BF16, Layout::Bshd).with_diagonal(diag);
            all_kernels(&be, &base.clone().with_window(window), 5);
            all_kernels(&be, &base.clone().with_alibi(Alibi::Standard).with_softcap(7.0), 6);
        }
        let causal = spec(4, 4, 16, r.clone(), DType::F32, Layout::Bhsd).with_mask(Mask::CausalBottomRight);
        all_kernels(&be, &causal.with_window(Window::left(3)).with_softcap(4.0).with_alibi(Alibi::Standard), 7);
    }
}

#[test]
fn nan_in_v_under_a_masked_key_of_a_paged_cache_reaches_no_row() {
    // Key 0 of every sequence holds NaN in V; bottom-right with a window, no row of the short query
    // sequences sees it, so their rows stay finite in the reference and must here too.
    let r = Ragged::new(vec![2, 1], vec![40, 37]).paged(16, 0);
    let s = spec(2, 1, 16, r, DType::F32, Layout::Bshd).with_mask(Mask::CausalBottomRight).with_window(Window::left(8));
    let mut inputs = HostInputs::random(&s, 8).unwrap();
    let table = inputs.block_table.clone().unwrap();
    for b in 0..2 {
        let seq = s.seq(b);
        let off = s.kv_offset(sdpa_core::Operand::V, Some(&table), &seq, b, 0, 0);
        inputs.v.set_f32(off, f32::NAN);
    }
    for be in backends() {
        for kernel in KERNELS {
            check_inputs(&be, &s, kernel, &inputs);
        }
    }
}

#[test]
fn block_tables_are_required_and_checked() {
    let r = Ragged::new(vec![1, 1], vec![5, 3]).paged(4, 0);
    let s = spec(2, 2, 8, r, DType::F32, Layout::Bshd);
    let inputs = HostInputs::random(&s, 0).unwrap();
    let n = |op| s.required_len(op).unwrap();
    let f32s = |b: &HostBuffer| match b {
        HostBuffer::F32(v) => v.clone(),
        _ => unreachable!("an f32 spec"),
    };
    let (q, k, v) = (&f32s(&inputs.q)[..], &f32s(&inputs.k)[..], &f32s(&inputs.v)[..]);
    let mut o = vec![0.0f32; n(sdpa_core::Operand::O)];
    let opts = RunOptions::default();
    let e = sdpa_cpu::attention_ragged(&s, &opts, q, k, v, None, &mut o, None).unwrap_err().to_string();
    assert!(e.contains("needs its block table"), "{e}");
    let bad = vec![0u32, 7, 1, 2];
    let e = sdpa_cpu::attention_ragged(&s, &opts, q, k, v, Some(&bad), &mut o, None).unwrap_err().to_string();
    assert!(e.contains("names page 7"), "{e}");
    let table = inputs.block_table.clone().unwrap();
    assert!(sdpa_cpu::attention_ragged(&s, &opts, q, k, v, Some(&table), &mut o, None).is_ok());
    let dense = AttentionSpec::new(Shape::new(1, 1, 2, 2, 8), DType::F32);
    let x = vec![0.0f32; 16];
    let mut o = vec![0.0f32; 16];
    let e = sdpa_cpu::attention_ragged(&dense, &opts, &x, &x, &x, Some(&table), &mut o, None).unwrap_err();
    assert!(e.to_string().contains("not paged"), "{e}");
}

#[test]
fn parallel_append_matches_the_serial_definition() {
    let paging = Paging { page_size: 4, num_pages: 9, max_pages: 4 };
    // Sequence 0 grows across a page boundary, 1 from empty, 2 by nothing.
    let spec = AppendSpec::new(paging, 2, 3, vec![3, 0, 5], vec![6, 9, 0]);
    let table: Vec<u32> = vec![4, 0, 7, 99, 2, 5, 8, 99, 1, 6, 99, 99];
    let new: Vec<f32> = (0..15 * 2 * 3).map(|x| x as f32).collect();
    let mut want = vec![-1.0f32; 9 * 4 * 2 * 3];
    let mut got = want.clone();
    sdpa_core::append_to_pages(&spec, &table, &new, &mut want).unwrap();
    sdpa_cpu::append_to_pages(&spec, &table, &new, &mut got).unwrap();
    assert_eq!(got, want);
    // Two sequences growing into one shared page: the serial order decides, as in the definition.
    let shared = AppendSpec::new(paging, 2, 3, vec![0, 0], vec![2, 3]);
    let t2: Vec<u32> = vec![3, 99, 99, 99, 3, 99, 99, 99];
    let (mut a, mut b) = (vec![0.0f32; want.len()], vec![0.0f32; want.len()]);
    sdpa_core::append_to_pages(&shared, &t2, &new, &mut a).unwrap();
    sdpa_cpu::append_to_pages(&shared, &t2, &new, &mut b).unwrap();
    assert_eq!(a, b);
    // Beyond the pages: refused, nothing written.
    let full = AppendSpec::new(paging, 2, 3, vec![16, 0, 0], vec![1, 0, 0]);
    let before = got.clone();
    assert!(sdpa_cpu::append_to_pages(&full, &table, &new, &mut got).is_err());
    assert_eq!(got, before);
}
