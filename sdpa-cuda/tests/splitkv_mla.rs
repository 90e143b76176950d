//! `splitkv`'s MLA path (`kernels/splitkv_mla.rs`: decoding at D = 576, Dv = 512 on sm_90) against the f64
//! reference on the GPU: random data, poisoned outputs, both tiles (16 rows per kv head and fewer; up to 64 per
//! block, with row groups past the kv head's rows idle), several row groups (128 heads), GQA over two kv heads,
//! speculative rows (Sq = 2, 3, 4) under both causal alignments, keys fewer than a step, off every step and split,
//! one split and many (merged in the launch), both layouts, LSE on and off, f16 and bf16, each within twice the
//! unfused kernel's error on the same inputs; a NaN in one query, and a NaN in V under a key that only some rows
//! see (the repair of non-finite rows). `auto` and `splitkv` must report `splitkv`. Skips (printing why) without
//! a GPU, and on GPUs other than sm_90, where the path refuses and `wide` runs these calls (tests/wide_heads.rs).

mod common;

use common::{check_inputs, gpu, sh, Case};
use sdpa_core::{DType, F32Math, HostInputs, Kernel, Layout, Mask, Shape};
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
        // One long sequence: many splits merged by the last block.
        mla(1, 16, 1, 1, 20011),
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
}
