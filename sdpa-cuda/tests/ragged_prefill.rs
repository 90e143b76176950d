//! `fa2` on ragged batches (packed K/V) and paged KV caches against the f64 reference on the GPU (issue 23):
//! lengths off every tile, sequences of length 0 and 1, Sq_b above and below Sk_b, chunked prefill against
//! a paged cache, page sizes 1 to 256 with lengths ending mid-page, shuffled and shared pages, both causal
//! alignments, windows, softcap, ALiBi, GQA, both layouts, LSE, f16 and bf16, every head-dim class of
//! `fa2`; NaN in a value row under a masked key (the non-finite repair reads pages too); and the kernels
//! that refuse ragged calls. Outputs are NaN-poisoned before each call (`HostBackend::run_host`). Skips,
//! printing why, without a GPU.

mod common;

use common::gpu;
use sdpa_core::check::check_output;
use sdpa_core::{
    Alibi, AttentionSpec, DType, Diagonal, F32Math, HostBackend, HostBuffer, HostInputs, Kernel, Layout, Mask, Operand,
    Ragged, RunOptions, SdpaError, Shape, Window,
};
use sdpa_cuda::CudaBackend;

/// Query and key lengths of the packed batch most cases run: a sequence off every tile with Sq = Sk, an
/// empty one with keys, single tokens, Sq < Sk over more than one tile, Sq > Sk, and rows without keys.
fn lengths() -> (Vec<usize>, Vec<usize>) {
    (vec![70, 0, 1, 130, 33, 3], vec![70, 5, 1, 200, 20, 0])
}

fn spec(hq: usize, hkv: usize, d: usize, dv: usize, r: Ragged, layout: Layout, dtype: DType) -> AttentionSpec {
    let shape = Shape { b: r.batch(), hq, hkv, sq: r.max_q().max(1), sk: r.max_k().max(1), d, dv };
    AttentionSpec::new(shape, dtype).with_ragged(r, layout)
}

fn opts(kernel: Kernel) -> RunOptions {
    RunOptions { kernel, f32_math: F32Math::Exact, threads: None, lse: true }
}

/// Runs `spec` on `fa2` with LSE and checks it against the reference; the failure in words, if any.
fn check_with(gpu: &CudaBackend, spec: &AttentionSpec, inputs: &HostInputs) -> Option<String> {
    let label = format!("{spec:?}");
    let run = match gpu.run_host(spec, &opts(Kernel::Fa2), inputs) {
        Ok(r) => r,
        Err(e) => return Some(format!("{label}: error: {e}")),
    };
    if run.kernel != Kernel::Fa2 {
        return Some(format!("{label}: ran {}", run.kernel));
    }
    match check_output(spec, inputs, &run.output, F32Math::Exact, None) {
        Ok(r) if r.pass => None,
        Ok(r) => Some(format!("{label}: {r:?}")),
        Err(e) => Some(format!("{label}: check error: {e}")),
    }
}

fn check(gpu: &CudaBackend, spec: &AttentionSpec, seed: u64) -> Option<String> {
    let inputs = match HostInputs::random(spec, seed) {
        Ok(i) => i,
        Err(e) => return Some(format!("{spec:?}: inputs: {e}")),
    };
    check_with(gpu, spec, &inputs)
}

fn run_all(specs: Vec<AttentionSpec>) {
    let Some(gpu) = gpu() else { return };
    let failures: Vec<String> = specs.iter().enumerate().filter_map(|(n, s)| check(&gpu, s, 9000 + n as u64)).collect();
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), specs.len(), failures.join("\n"));
}

const MASKS: [Mask; 3] = [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight];

#[test]
fn packed_batches_match_the_reference_in_every_mask_layout_and_half_type() {
    let (q, k) = lengths();
    let mut specs = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for layout in [Layout::Bshd, Layout::Bhsd] {
            for mask in MASKS {
                specs.push(spec(4, 2, 64, 64, Ragged::new(q.clone(), k.clone()), layout, dtype).with_mask(mask));
            }
        }
    }
    run_all(specs);
}

#[test]
fn every_head_dim_class_runs_ragged() {
    let (q, k) = lengths();
    let r = || Ragged::new(q.clone(), k.clone());
    let mut specs = Vec::new();
    // Every class exact, padded classes (40 -> 64, 80 -> 96, 248 -> 256) and the MLA pair 192/128.
    let dims = [(32, 32), (40, 40), (80, 80), (128, 128), (160, 160), (192, 192), (224, 224), (248, 248), (192, 128)];
    for (n, (d, dv)) in dims.into_iter().enumerate() {
        let dtype = if n % 2 == 0 { DType::BF16 } else { DType::F16 };
        let layout = if n % 3 == 0 { Layout::Bhsd } else { Layout::Bshd };
        specs.push(spec(2, 1, d, dv, r(), layout, dtype).with_mask(MASKS[n % 3]));
    }
    // Paged at the classes whose rows are not a whole number of rows per thread sweep (96: 12 chunks).
    specs.push(spec(4, 4, 96, 96, r().paged(16, 2), Layout::Bshd, DType::BF16).with_mask(Mask::CausalBottomRight));
    specs.push(spec(2, 2, 256, 256, r().paged(7, 0), Layout::Bhsd, DType::F16).with_mask(Mask::None));
    run_all(specs);
}

#[test]
fn paged_caches_of_every_page_size_match_the_reference() {
    let (q, k) = lengths();
    let mut specs = Vec::new();
    // Page size 1, lengths ending mid-page (7, 16), one page per tile (64) and past every length (256).
    for (n, page) in [1, 7, 16, 64, 256].into_iter().enumerate() {
        let r = Ragged::new(q.clone(), k.clone()).paged(page, 3);
        let dtype = if n % 2 == 0 { DType::BF16 } else { DType::F16 };
        for layout in [Layout::Bshd, Layout::Bhsd] {
            specs.push(spec(4, 2, 128, 128, r.clone(), layout, dtype).with_mask(MASKS[(n + 1) % 3]));
        }
    }
    run_all(specs);
}

/// Chunked prefill: new tokens (Sq_b < Sk_b) against a paged cache, causal bottom-right, GQA 4.
#[test]
fn chunked_prefill_against_a_paged_cache() {
    let r = || Ragged::new(vec![16, 1, 40, 0, 129], vec![300, 129, 77, 64, 1000]);
    let mut specs = Vec::new();
    for (page, dtype) in [(16, DType::BF16), (1, DType::F16), (256, DType::BF16)] {
        specs.push(spec(8, 2, 128, 128, r().paged(page, 1), Layout::Bshd, dtype).with_mask(Mask::CausalBottomRight));
    }
    specs.push(spec(8, 2, 64, 64, r(), Layout::Bhsd, DType::F16).with_mask(Mask::CausalBottomRight));
    run_all(specs);
}

/// Windows, softcap and ALiBi measure from each sequence's own diagonal, packed and paged.
#[test]
fn variants_follow_each_sequence_diagonal() {
    let (q, k) = lengths();
    let mut specs = Vec::new();
    for (n, paged) in [false, true, false, true].into_iter().enumerate() {
        let r = Ragged::new(q.clone(), k.clone());
        let r = if paged { r.paged(16, 0) } else { r };
        let dtype = if n % 2 == 0 { DType::BF16 } else { DType::F16 };
        let base = spec(4, 2, 64, 64, r, if n < 2 { Layout::Bshd } else { Layout::Bhsd }, dtype);
        specs.push(base.clone().with_mask(Mask::CausalBottomRight).with_window(Window::left(24)));
        specs.push(
            base.clone().with_window(Window { left: Some(10), right: Some(17) }).with_diagonal(Diagonal::TopLeft),
        );
        specs.push(base.clone().with_mask(Mask::CausalTopLeft).with_softcap(20.0));
        specs.push(base.clone().with_mask(Mask::CausalBottomRight).with_alibi(Alibi::Standard));
        specs.push(base.with_alibi(Alibi::Standard).with_softcap(30.0).with_diagonal(Diagonal::BottomRight));
    }
    run_all(specs);
}

/// A block table whose sequences share their first pages (a common prefix) and otherwise come shuffled.
#[test]
fn shared_prefix_pages() {
    let Some(gpu) = gpu() else { return };
    let r = Ragged::new(vec![50, 20, 33], vec![96, 64, 130]).paged(16, 0);
    let spec = spec(4, 4, 128, 128, r, Layout::Bshd, DType::BF16).with_mask(Mask::CausalBottomRight);
    let mut inputs = HostInputs::random(&spec, 77).expect("inputs");
    let max_pages = spec.ragged.as_ref().and_then(|r| r.pages).map_or(0, |p| p.max_pages);
    if let Some(t) = inputs.block_table.as_mut() {
        // Sequences 1 and 2 start with sequence 0's first three pages.
        for b in 1..3 {
            for c in 0..3 {
                t[b * max_pages + c] = t[c];
            }
        }
    }
    assert_eq!(check_with(&gpu, &spec, &inputs), None);
}

/// NaN in the value row of a key some rows do not see (the last key of a causal sequence) stays out of
/// those rows, packed and paged (the repair recomputes them through the block table).
#[test]
fn nan_under_a_masked_key_stays_in_the_rows_that_see_it() {
    let Some(gpu) = gpu() else { return };
    let (q, k) = lengths();
    for r in [Ragged::new(q.clone(), k.clone()), Ragged::new(q, k).paged(7, 1)] {
        let spec = spec(2, 1, 64, 64, r, Layout::Bshd, DType::BF16).with_mask(Mask::CausalTopLeft);
        let mut inputs = HostInputs::random(&spec, 5).expect("inputs");
        let seq = spec.seq(3);
        let at = spec.kv_offset(Operand::V, inputs.block_table.as_deref(), &seq, 3, 0, seq.sk - 1);
        let mut v = inputs.v.to_f32_vec();
        v[at] = f32::NAN;
        inputs.v = HostBuffer::from_f32(spec.dtype, &v);
        assert_eq!(check_with(&gpu, &spec, &inputs), None);
    }
}

/// fa1, unfused and f32 inputs refuse ragged calls, naming what to use; auto runs fa2 on prefill.
#[test]
fn refusals_name_the_kernel_and_what_to_use() {
    let Some(gpu) = gpu() else { return };
    let (q, k) = lengths();
    let half = spec(4, 2, 64, 64, Ragged::new(q.clone(), k.clone()), Layout::Bshd, DType::BF16);
    let inputs = HostInputs::random(&half, 3).expect("inputs");
    for kernel in [Kernel::Fa1, Kernel::Unfused] {
        match gpu.run_host(&half, &opts(kernel), &inputs) {
            Err(SdpaError::Unsupported { what: m, .. }) => {
                assert!(m.contains(kernel.name()) && m.contains("fa2"), "{m}")
            }
            other => panic!("{kernel}: {other:?}"),
        }
    }
    // auto: fa3 on sm_90 (packed ragged prefill, `policy::fa3_may_take_ragged`), fa2 elsewhere.
    let want = if gpu.info().compute_capability == (9, 0) { Kernel::Fa3 } else { Kernel::Fa2 };
    assert_eq!(gpu.run_host(&half, &opts(Kernel::Auto), &inputs).expect("auto").kernel, want);
    let f32_spec = spec(4, 2, 64, 64, Ragged::new(q, k).paged(16, 0), Layout::Bshd, DType::F32);
    let inputs = HostInputs::random(&f32_spec, 4).expect("inputs");
    for kernel in [Kernel::Auto, Kernel::Fa2, Kernel::Fa1] {
        match gpu.run_host(&f32_spec, &opts(kernel), &inputs) {
            Err(SdpaError::Unsupported { what: m, .. }) => {
                assert!(m.contains("paged") && m.contains("f16/bf16"), "{m}")
            }
            other => panic!("{kernel}: {other:?}"),
        }
    }
}
