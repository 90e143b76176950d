//! `splitkv` on ragged batches (issue 23) against the f64 reference: paged decoding with page sizes 1, 16
//! and 256, cache lengths 0, 1, mid-page and long (a 3-key and a 20000-key sequence in one batch, the long
//! one cut into several chunks whose partials the kernel merges), shuffled and repeated pages, several query
//! rows per sequence (speculative decoding), both causal alignments, windows, softcap, ALiBi, GQA, both
//! layouts, LSE `[Hq, total_q]`, packed varlen K/V, f16 and bf16 and every head-dim class `splitkv` has;
//! outputs NaN-poisoned before each call (`run_host`). Then the append kernel against
//! `sdpa_core::append_to_pages`. `splitkv` is requested by name. Skips (printing why) without a GPU.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::gpu;
use sdpa_core::check::check_output;
use sdpa_core::{
    append_to_pages, Alibi, AppendSpec, AttentionSpec, DType, Diagonal, F32Math, HostBackend, HostInputs, Kernel,
    Layout, Mask, Paging, Ragged, RunOptions, Shape, Window,
};
use sdpa_cuda::CudaBackend;

fn spec(hq: usize, hkv: usize, d: usize, dv: usize, dtype: DType, r: Ragged, layout: Layout) -> AttentionSpec {
    let shape = Shape { b: r.batch(), hq, hkv, sq: r.max_q().max(1), sk: r.max_k().max(1), d, dv };
    AttentionSpec::new(shape, dtype).with_ragged(r, layout)
}

/// Runs `spec` on `splitkv` (asked by name) with the LSE on random inputs seeded `seed`, and checks it
/// against the f64 reference.
fn passes(gpu: &CudaBackend, spec: &AttentionSpec, seed: u64) {
    spec.validate().unwrap_or_else(|e| panic!("{e}: {spec:?}"));
    let inputs = HostInputs::random(spec, seed).unwrap();
    let opts = RunOptions { kernel: Kernel::SplitKv, lse: true, ..Default::default() };
    let run = gpu.run_host(spec, &opts, &inputs).unwrap_or_else(|e| panic!("{e}: {spec:?}"));
    assert_eq!(run.kernel, Kernel::SplitKv, "{spec:?}");
    let r = check_output(spec, &inputs, &run.output, F32Math::Exact, None).unwrap();
    assert!(r.pass, "{:?} {}: {r:?}", spec.dtype, label(spec));
}

fn label(spec: &AttentionSpec) -> String {
    let r = spec.ragged.as_ref().unwrap();
    format!(
        "Hq {} Hkv {} D {} Dv {} {} {} sq {:?} sk {:?} pages {:?}",
        spec.shape.hq,
        spec.shape.hkv,
        spec.shape.d,
        spec.shape.dv,
        spec.mask.name(),
        spec.variants.label(spec.diagonal()),
        r.seqlens_q,
        r.seqlens_k,
        r.pages
    )
}

/// Decoding one token per sequence over caches of 0, 1, 23 (mid-page), 3 and 20000 keys, page sizes 1, 16
/// and 256, both dtypes and layouts, GQA 4.
#[test]
fn paged_decoding_over_short_and_long_caches() {
    let Some(gpu) = gpu() else { return };
    let r = Ragged::new(vec![1; 5], vec![0, 1, 23, 3, 20000]);
    for (n, ps) in [1, 16, 256].into_iter().enumerate() {
        let dtype = [DType::BF16, DType::F16][n % 2];
        let layout = [Layout::Bshd, Layout::Bhsd][n % 2];
        let s = spec(8, 2, 128, 128, dtype, r.clone().paged(ps, 2), layout).with_mask(Mask::CausalBottomRight);
        passes(&gpu, &s, 10 + n as u64);
    }
}

/// Several query rows per sequence (speculative decoding, group·Sq_b up to 64 and one wider), Sq_b > Sk_b,
/// a sequence without rows, both causal alignments, a window, softcap and ALiBi.
#[test]
fn several_rows_per_sequence_with_every_variant() {
    let Some(gpu) = gpu() else { return };
    let r = Ragged::new(vec![1, 4, 8, 0, 3, 5], vec![5, 300, 5000, 7, 2, 4099]);
    let window = Window { left: Some(100), right: Some(0) };
    let cases = [
        (8, 1, DType::BF16, Layout::Bshd, Mask::CausalBottomRight, None, None, None),
        (8, 2, DType::F16, Layout::Bhsd, Mask::CausalTopLeft, None, None, None),
        (8, 1, DType::F16, Layout::Bshd, Mask::None, Some(window), None, None),
        (4, 2, DType::BF16, Layout::Bhsd, Mask::CausalBottomRight, None, Some(20.0), Some(Alibi::Standard)),
        (16, 2, DType::BF16, Layout::Bshd, Mask::CausalBottomRight, Some(window), Some(5.0), None),
    ];
    for (n, (hq, hkv, dtype, layout, mask, win, cap, alibi)) in cases.into_iter().enumerate() {
        let mut s = spec(hq, hkv, 64, 64, dtype, r.clone().paged(16, 1), layout).with_mask(mask);
        if let Some(w) = win {
            s = s.with_window(w);
            // Without a causal mask the window names its diagonal.
            s.variants.diagonal = s.variants.diagonal.or(Some(Diagonal::BottomRight));
        }
        if let Some(c) = cap {
            s = s.with_softcap(c);
        }
        if let Some(a) = alibi {
            s = s.with_alibi(a);
        }
        passes(&gpu, &s, 20 + n as u64);
    }
}

/// A pool smaller than the pages in use: the shuffled table names pages again across sequences.
#[test]
fn shared_pages_are_read_by_every_sequence_that_names_them() {
    let Some(gpu) = gpu() else { return };
    let mut r = Ragged::new(vec![2, 1, 1], vec![700, 3000, 45]).paged(16, 0);
    r.pages = r.pages.map(|p| Paging { num_pages: 40, ..p });
    let s = spec(8, 4, 128, 128, DType::BF16, r, Layout::Bshd).with_mask(Mask::CausalBottomRight);
    let inputs = HostInputs::random(&s, 3).unwrap();
    let used = inputs.block_table.as_ref().unwrap().iter().filter(|&&p| p != u32::MAX).count();
    assert!(used > 40, "more pages in use than the pool has: some repeat");
    passes(&gpu, &s, 3);
}

/// Packed varlen K/V (no pages): rows and keys of each sequence at its offsets.
#[test]
fn packed_varlen_keys() {
    let Some(gpu) = gpu() else { return };
    let r = Ragged::new(vec![2, 1, 0, 5, 1], vec![40, 6000, 9, 1, 0]);
    for (n, (dtype, mask)) in [(DType::F16, Mask::None), (DType::BF16, Mask::CausalBottomRight)].into_iter().enumerate()
    {
        let s = spec(6, 3, 64, 64, dtype, r.clone(), [Layout::Bshd, Layout::Bhsd][n]).with_mask(mask);
        passes(&gpu, &s, 30 + n as u64);
    }
}

/// Every head-dim class of `splitkv` (exact and padded) and Dv != D, on a small paged batch.
#[test]
fn every_head_dim_class() {
    let Some(gpu) = gpu() else { return };
    let r = Ragged::new(vec![1, 2, 1], vec![37, 2500, 1]).paged(16, 0);
    let dims = [(32, 32), (64, 64), (80, 80), (96, 96), (128, 128), (160, 160), (192, 128), (224, 224), (256, 256)];
    for (n, (d, dv)) in dims.into_iter().enumerate() {
        let dtype = [DType::BF16, DType::F16][n % 2];
        let s = spec(4, 2, d, dv, dtype, r.clone(), Layout::Bshd).with_mask(Mask::CausalBottomRight);
        passes(&gpu, &s, 40 + n as u64);
    }
}

/// The append kernel writes exactly what `sdpa_core::append_to_pages` writes (and nothing else), for K
/// (D = 128, 16-byte copies) and V (Dv = 20, 4-byte copies), page sizes 1 and 16, one sequence appending
/// nothing and one starting empty.
#[test]
fn append_matches_the_host_append() {
    let Some(gpu) = gpu() else { return };
    use half::bf16;
    use sdpa_core::Backend;
    for (n, ps) in [1usize, 16].into_iter().enumerate() {
        let cache = vec![5, 0, 31, 7];
        let new = vec![1, 3, 2, 0];
        let grown: Vec<usize> = cache.iter().zip(&new).map(|(c, n)| c + n).collect();
        let r = Ragged::new(vec![1; 4], grown).paged(ps, 3);
        let paging = r.pages.unwrap();
        let table = r.shuffled_block_table(n as u64).unwrap();
        let dev_table = gpu.upload_index(&table).unwrap();
        for dim in [128usize, 20] {
            let spec = AppendSpec::new(paging, 2, dim, cache.clone(), new.clone());
            let rows = |len: usize, seed: u64| -> Vec<bf16> {
                sdpa_core::HostBuffer::random(DType::BF16, len, seed)
                    .to_f32_vec()
                    .into_iter()
                    .map(bf16::from_f32)
                    .collect()
            };
            let src = rows(spec.new_len().unwrap(), 50 + n as u64);
            let mut want = rows(spec.pages_len().unwrap(), 60 + n as u64);
            let stream = gpu.device().stream().clone();
            let d_src = stream.clone_htod(&src).unwrap();
            let mut d_pages = stream.clone_htod(&want).unwrap();
            gpu.append_to_pages(&stream, &spec, &dev_table, &d_src, &mut d_pages).unwrap();
            append_to_pages(&spec, &table, &src, &mut want).unwrap();
            let got = stream.clone_dtoh(&d_pages).unwrap();
            assert!(got == want, "page size {ps}, dim {dim}: the device append differs from the host's");
            // A spec the buffers cannot hold is refused before any launch.
            let short = stream.clone_htod(&src[..src.len() - 1]).unwrap();
            assert!(gpu.append_to_pages(&stream, &spec, &dev_table, &short, &mut d_pages).is_err());
        }
    }
}
