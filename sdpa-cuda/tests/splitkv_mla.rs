//! `splitkv`'s MLA path (`kernels/splitkv_mla.rs`: decoding at D = 576, Dv = 512 on sm_90) against the f64
//! reference on the GPU: random data, poisoned outputs, both tiles (16 rows per kv head and fewer; up to 64 per
//! block, with row groups past the kv head's rows idle), several row groups (128 heads), GQA over two kv heads,
//! speculative rows (Sq = 2, 3, 4) under both causal alignments, keys fewer than a step, off every step and split,
//! one split and many (merged by the combine launch with one to four thread groups), both layouts, LSE on and off, f16 and bf16, each within twice the
//! unfused kernel's error on the same inputs; a NaN in one query, and a NaN in V under a key that only some rows
//! see (the repair of non-finite rows); windows; ragged batches with K/V packed or paged (pages of 8, 16, 32, 64
//! and 256 slots; caches of 0, 1, mid-page and 20000 keys; speculative rows; 128 heads). `auto` and `splitkv`
//! must report `splitkv`. Skips (printing why) without
//! a GPU, and on GPUs other than sm_90, where the path refuses and `wide` runs these calls (tests/wide_heads.rs).

mod common;

use common::{check_inputs, gpu, sh, Case};
use sdpa_core::check::check_output;
use sdpa_core::{
    AttentionSpec, DType, Diagonal, F32Math, HostBackend, HostInputs, Kernel, Layout, Mask, Ragged, RunOptions, Shape,
    Window,
};
use sdpa_cuda::CudaBackend;

const HALF: [DType; 2] = [DType::F16, DType::BF16];

fn mla(b: usize, hq: usize, hkv: usize, sq: usize, sk: usize) -> Shape {
    Shape { dv: 512, ..sh(b, hq, hkv, sq, sk, 576) }
}

/// The GPU when it is an sm_90 part (the path's TMA and its tile's shared memory), else `None` with the reason.
fn hopper() -> Option<CudaBackend> {
    let gpu = gpu()?;
    let cc = gpu.info().compute_capability;
    if cc.0 != 9 {
        eprintln!("skipping: splitkv's MLA path runs on sm_90, this GPU is sm_{}{}", cc.0, cc.1);
        return None;
    }
    Some(gpu)
}

fn shapes() -> Vec<Shape> {
    vec![
        // DeepSeek at tensor parallelism 8: 16 heads, the narrow tile; several splits.
        mla(2, 16, 1, 1, 1000),
        // Fewer keys than one 32-key step, and fewer heads than the tile's 16 rows.
        mla(1, 8, 1, 1, 19),
        // Speculative rows: 16 x 3 = 48 rows, the tall tile with one idle row group.
        mla(1, 16, 1, 3, 300),
        // 128 heads: two row groups of 64 per split.
        mla(1, 128, 1, 1, 3000),
        // GQA over two kv heads, 20 rows each (tall tile, two idle row groups), keys off every step.
        mla(2, 40, 2, 1, 777),
        // 32 heads x 4 rows: 128 rows, two row groups, both causal alignments matter.
        mla(1, 32, 1, 4, 517),
        // One long sequence: 79 splits merged by the combine's four thread groups.
        mla(1, 16, 1, 1, 20011),
        // The tall tile in one split (its own output, LSE and repair): 128 heads over fewer than 256 keys.
        mla(2, 128, 1, 1, 200),
        // The combine with two thread groups (36 splits, tall tile) and three (51 splits, narrow tile).
        mla(1, 16, 1, 2, 9000),
        mla(1, 16, 1, 1, 13000),
    ]
}

fn cases(kernel: Kernel) -> Vec<Case> {
    let mut out = Vec::new();
    for (si, shape) in shapes().into_iter().enumerate() {
        for mask in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight] {
            for layout in [Layout::Bhsd, Layout::Bshd] {
                for dtype in HALF {
                    let lse = (si + out.len()) % 4 != 0;
                    out.push(Case { shape, dtype, mask, layout, kernel, f32_math: F32Math::Exact, lse });
                }
            }
        }
    }
    out
}

#[test]
fn mla_decoding_matches_the_reference_and_the_unfused_error() {
    let Some(gpu) = hopper() else { return };
    common::run_table_on(&gpu, "splitkv_mla auto", &cases(Kernel::Auto), 9100, Some(Kernel::SplitKv));
}

/// `splitkv` asked for by name runs the path at any row count: 128 heads x 4 speculative rows (8 row
/// groups), past what `auto` sends it.
#[test]
fn splitkv_by_name_takes_many_rows() {
    let Some(gpu) = hopper() else { return };
    let mut table = Vec::new();
    for mask in [Mask::None, Mask::CausalBottomRight] {
        let case = Case::new(mla(1, 128, 1, 4, 1500), DType::BF16, mask, Layout::Bshd, Kernel::SplitKv, F32Math::Exact);
        table.push(case);
    }
    common::run_table_on(&gpu, "splitkv_mla by name", &table, 9300, Some(Kernel::SplitKv));
}

/// A NaN in one head's query poisons that row only; the other heads of its row tile stay exact.
#[test]
fn a_nan_in_a_query_stays_in_its_row() {
    let Some(gpu) = hopper() else { return };
    for shape in [mla(1, 16, 1, 1, 2000), mla(1, 64, 1, 1, 700)] {
        let case = Case::new(shape, DType::BF16, Mask::None, Layout::Bshd, Kernel::Auto, F32Math::Exact);
        let spec = case.spec();
        let mut inputs = HostInputs::random(&spec, 7).expect("valid");
        inputs.q.set_f32(spec.q_strides.offset(0, 3, 0) + 5, f32::NAN);
        let r = check_inputs(&gpu, &case, &inputs, None).expect("runs");
        assert!(r.pass, "{}: {r:?}", case.label());
    }
}

/// A NaN in V at the second-last key, under a bottom-right causal mask with 3 rows: row 0 does not see it
/// but its step loads it (0·NaN), so the kernel's output there is repaired; rows 1 and 2 see it and are NaN.
#[test]
fn a_nan_under_a_hidden_key_does_not_reach_the_rows_that_cannot_see_it() {
    let Some(gpu) = hopper() else { return };
    for shape in [mla(1, 16, 1, 3, 1000), mla(1, 16, 1, 3, 40)] {
        let case = Case::new(shape, DType::F16, Mask::CausalBottomRight, Layout::Bhsd, Kernel::Auto, F32Math::Exact);
        let spec = case.spec();
        let mut inputs = HostInputs::random(&spec, 8).expect("valid");
        inputs.v.set_f32(spec.v_strides.offset(0, 0, shape.sk - 2) + 100, f32::NAN);
        let r = check_inputs(&gpu, &case, &inputs, None).expect("runs");
        assert!(r.pass, "{}: {r:?}", case.label());
    }
}

/// Small calls of both tiles and masks: what the device script runs under compute-sanitizer memcheck, racecheck
/// and synccheck.
#[test]
fn small_mla_calls_for_the_sanitizer() {
    let Some(gpu) = hopper() else { return };
    let mut table = Vec::new();
    for shape in [mla(1, 16, 1, 1, 300), mla(1, 16, 1, 3, 100)] {
        for mask in [Mask::None, Mask::CausalBottomRight] {
            table.push(Case::new(shape, DType::BF16, mask, Layout::Bshd, Kernel::Auto, F32Math::Exact));
        }
    }
    common::run_table_on(&gpu, "splitkv_mla sanitizer", &table, 9500, Some(Kernel::SplitKv));
    // A paged batch in 16-slot pages (two boxes per step) with a split sequence, and a packed one.
    let r = Ragged::new(vec![1, 2], vec![40, 700]);
    for r in [r.clone().paged(16, 1), r] {
        let spec = ragged(16, 1, DType::BF16, r, Layout::Bshd).with_mask(Mask::CausalBottomRight);
        passes(&gpu, &spec, Kernel::SplitKv, 9600).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// A ragged MLA batch: `hq` query heads on `hkv` kv heads.
fn ragged(hq: usize, hkv: usize, dtype: DType, r: Ragged, layout: Layout) -> AttentionSpec {
    let shape = Shape { b: r.batch(), hq, hkv, sq: r.max_q().max(1), sk: r.max_k().max(1), d: 576, dv: 512 };
    AttentionSpec::new(shape, dtype).with_ragged(r, layout)
}

/// Runs `spec` with `kernel` and the LSE on inputs seeded `seed` (outputs poisoned): it must run on `splitkv`
/// and match the f64 reference.
fn passes(gpu: &CudaBackend, spec: &AttentionSpec, kernel: Kernel, seed: u64) -> Result<(), String> {
    spec.validate().map_err(|e| format!("{e}: {spec:?}"))?;
    let inputs = HostInputs::random(spec, seed).map_err(|e| e.to_string())?;
    let opts = RunOptions { kernel, lse: true, ..Default::default() };
    let run = gpu.run_host(spec, &opts, &inputs).map_err(|e| format!("{e}: {spec:?}"))?;
    if run.kernel != Kernel::SplitKv {
        return Err(format!("ran {} for {spec:?}", run.kernel));
    }
    let r = check_output(spec, &inputs, &run.output, F32Math::Exact, None).map_err(|e| e.to_string())?;
    if !r.pass {
        return Err(format!("{:?} {:?} {:?}: {r:?}", spec.dtype, spec.mask, spec.ragged));
    }
    Ok(())
}

/// Paged decoding (one token per sequence) over caches of 0, 1, 23, 3 and 20000 keys in pages of 8, 16, 32, 64
/// and 256 slots (one step's boxes from several pages, and from part of one), and the same lengths packed.
#[test]
fn paged_and_packed_decoding() {
    let Some(gpu) = hopper() else { return };
    let lens = Ragged::new(vec![1; 5], vec![0, 1, 23, 3, 20000]);
    let mut failures = Vec::new();
    for (n, pages) in [Some(8), Some(16), Some(32), Some(64), Some(256), None].into_iter().enumerate() {
        let r = match pages {
            Some(ps) => lens.clone().paged(ps, 2),
            None => lens.clone(),
        };
        let (dtype, layout) = ([DType::BF16, DType::F16][n % 2], [Layout::Bshd, Layout::Bhsd][n % 2]);
        let spec = ragged(16, 1, dtype, r, layout).with_mask(Mask::CausalBottomRight);
        let kernel = [Kernel::Auto, Kernel::SplitKv][n % 2];
        failures.extend(passes(&gpu, &spec, kernel, 40 + n as u64).err());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Several rows per sequence (speculative decoding: up to 64 rows per kv head, the tall tile), a sequence
/// without rows, Sq_b > Sk_b, both causal alignments and a window; 128 heads in one ragged batch; a window on
/// a dense call.
#[test]
fn speculative_rows_windows_and_many_heads() {
    let Some(gpu) = hopper() else { return };
    let window = Window { left: Some(100), right: Some(0) };
    let r = Ragged::new(vec![1, 4, 0, 3, 5], vec![5, 3000, 7, 2, 4099]);
    let mut failures = Vec::new();
    let cases = [
        (r.clone().paged(32, 1), Mask::CausalBottomRight, None, DType::BF16, Layout::Bshd),
        (r.clone().paged(16, 0), Mask::CausalTopLeft, None, DType::F16, Layout::Bhsd),
        (r.clone(), Mask::None, Some(window), DType::BF16, Layout::Bhsd),
        (r.clone().paged(64, 0), Mask::CausalBottomRight, Some(window), DType::F16, Layout::Bshd),
    ];
    for (n, (r, mask, win, dtype, layout)) in cases.into_iter().enumerate() {
        let mut spec = ragged(16, 1, dtype, r, layout).with_mask(mask);
        if let Some(w) = win {
            spec = spec.with_window(w);
            // A window without a causal mask measures from the diagonal it names (FlashAttention's).
            spec.variants.diagonal = spec.variants.diagonal.or(Some(Diagonal::BottomRight));
        }
        failures.extend(passes(&gpu, &spec, Kernel::Auto, 60 + n as u64).err());
    }
    let many = ragged(128, 1, DType::BF16, Ragged::new(vec![1, 1, 1], vec![100, 5000, 33]).paged(64, 0), Layout::Bshd);
    failures.extend(passes(&gpu, &many.with_mask(Mask::CausalBottomRight), Kernel::Auto, 70).err());
    let dense = AttentionSpec::new(mla(2, 16, 1, 2, 3000), DType::BF16).with_mask(Mask::CausalBottomRight);
    failures.extend(passes(&gpu, &dense.with_window(Window::left(300)), Kernel::Auto, 71).err());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// GQA over two kv heads in a ragged batch, K/V paged head-major (BHSD) and packed, and NaN written into the
/// unwritten tail slots of a page (K and V past a sequence's length): the rows stay exact.
#[test]
fn two_kv_heads_and_garbage_in_page_tails() {
    let Some(gpu) = hopper() else { return };
    let mut failures = Vec::new();
    let lens = Ragged::new(vec![1, 2, 1], vec![300, 2000, 5]);
    for (n, (r, layout)) in
        [(lens.clone().paged(32, 0), Layout::Bhsd), (lens.clone(), Layout::Bshd)].into_iter().enumerate()
    {
        let spec = ragged(16, 2, DType::BF16, r, layout).with_mask(Mask::CausalBottomRight);
        failures.extend(passes(&gpu, &spec, Kernel::Auto, 80 + n as u64).err());
    }
    let spec = ragged(16, 1, DType::F16, Ragged::new(vec![1, 1], vec![37, 1000]).paged(64, 1), Layout::Bshd)
        .with_mask(Mask::CausalBottomRight);
    let mut inputs = HostInputs::random(&spec, 90).expect("valid");
    let table = inputs.block_table.clone().expect("paged");
    let max_pages = table.len() / 2;
    for (b, len) in [(0usize, 37usize), (1, 1000)] {
        let page = table[b * max_pages + len / 64] as usize;
        let slot = len % 64 + 3;
        inputs.k.set_f32(spec.k_strides.offset(page, 0, slot) + 7, f32::NAN);
        inputs.v.set_f32(spec.v_strides.offset(page, 0, slot) + 9, f32::NAN);
    }
    let opts = RunOptions { kernel: Kernel::Auto, lse: true, ..Default::default() };
    match gpu.run_host(&spec, &opts, &inputs) {
        Ok(run) => {
            let r = check_output(&spec, &inputs, &run.output, F32Math::Exact, None).expect("checks");
            if !r.pass || run.kernel != Kernel::SplitKv {
                failures.push(format!("page tails: ran {}: {r:?}", run.kernel));
            }
        }
        Err(e) => failures.push(format!("page tails: {e}")),
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Page sizes whose boxes a step cannot take whole are refused with the reason, not run wrong.
#[test]
fn page_sizes_it_cannot_take_are_refused() {
    let Some(gpu) = hopper() else { return };
    let spec = ragged(16, 1, DType::BF16, Ragged::new(vec![1, 1], vec![100, 300]).paged(24, 0), Layout::Bshd);
    let inputs = HostInputs::random(&spec, 3).expect("valid");
    let opts = RunOptions { kernel: Kernel::Auto, lse: true, ..Default::default() };
    let err = gpu.run_host(&spec, &opts, &inputs).expect_err("refused");
    assert!(err.to_string().contains("pages of 8, 16"), "the path's own reason: {err}");
}
