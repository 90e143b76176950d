//! The tensor-core `fa2` and `splitkv` kernels (f16/bf16) against the f64 reference on the GPU: random data,
//! poisoned outputs, the foundation's awkward shapes plus GQA 8 and decoding shapes, every mask in both
//! causal alignments, both layouts, with and without LSE; each within twice the unfused kernel's error in
//! the same dtype on the same inputs, including every head-dim class of `fa2` (exact and padded, Dv != D).
//! Also: which kernel ran (head dims above 256, which the tensor cores cannot take, fall back to `fa1` and
//! say so) and what `auto` picks. Skips (printing why) without a GPU.

mod common;

use common::{
    assert_nan_in_a_query_stays_in_its_row, assert_passes, check_inputs, gpu, masks, rows_for, run_spec, sh,
    tensor_core_shapes, Case,
};
use sdpa_core::{DType, F32Math, HostBackend, HostInputs, Kernel, Layout, Mask, SdpaError, Shape};
use sdpa_cuda::CudaBackend;

const HALF: [DType; 2] = [DType::F16, DType::BF16];

/// The foundation's shapes plus GQA ratio 8, decoding (Sq = 1 and a few speculative tokens) and long keys.
fn table_shapes() -> Vec<Shape> {
    tensor_core_shapes([
        sh(1, 32, 4, 3, 777, 256),
        sh(3, 4, 4, 1, 4097, 128),
        sh(1, 8, 8, 200, 33, 96),
        // Row tiles spread over several blocks (their partials merged by the last block): every head dim.
        sh(2, 4, 1, 1, 3500, 64),
        sh(1, 16, 2, 2, 3000, 96),
        sh(1, 8, 4, 1, 2600, 256),
        // Many blocks per row tile: 79 splits, 20 blocks on a 132-SM GPU, whose 20 partial LSEs per row the
        // last block stages in shared memory.
        sh(1, 2, 1, 1, 40000, 64),
        // The head-dim classes: every class exact and padded, the MLA pair 192/128 exact and padded, unequal
        // head dims at the larger class (splitkv: both at the larger class), lengths off every tile.
        sh(1, 4, 2, 77, 130, 32),
        sh(2, 3, 1, 65, 100, 112),
        sh(1, 4, 4, 100, 70, 160),
        sh(1, 2, 1, 129, 50, 176),
        sh(1, 4, 2, 70, 90, 192),
        sh(1, 2, 2, 33, 200, 200),
        sh(1, 4, 1, 90, 90, 224),
        // Padded into the smallest and the largest classes, and into 160.
        sh(1, 4, 2, 50, 70, 16),
        sh(1, 2, 1, 70, 90, 144),
        sh(1, 2, 2, 65, 33, 248),
        Shape { dv: 248, ..sh(1, 4, 2, 40, 77, 240) },
        Shape { dv: 128, ..sh(1, 8, 2, 100, 140, 192) },
        Shape { dv: 120, ..sh(1, 4, 4, 65, 65, 184) },
        Shape { dv: 128, ..sh(1, 4, 2, 80, 60, 64) },
        Shape { dv: 64, ..sh(1, 2, 1, 60, 80, 128) },
        // Decoding at a padded class (splitkv's cp.async path; fa2's small tile when fa2 is asked).
        sh(2, 32, 8, 1, 3000, 80),
    ])
}

fn table(kernel: Kernel) -> Vec<Case> {
    common::table(table_shapes(), masks, kernel, F32Math::Exact, &HALF)
}

/// Runs every case against the reference and the unfused kernel's error ([`common::run_table_vs_unfused`]).
fn run_table(name: &str, cases: Vec<Case>) {
    common::run_table_vs_unfused(name, &cases, 5000, None);
}

#[test]
fn fa2_matches_the_reference_and_the_unfused_error() {
    run_table("fa2", table(Kernel::Fa2));
}

#[test]
fn splitkv_matches_the_reference_and_the_unfused_error() {
    run_table("splitkv", table(Kernel::SplitKv));
}

#[test]
fn auto_matches_the_reference() {
    run_table("auto", table(Kernel::Auto));
}

fn ran(gpu: &CudaBackend, case: &Case) -> Result<Kernel, SdpaError> {
    let spec = case.spec();
    let inputs = HostInputs::random(&spec, 3)?;
    Ok(gpu.run_host(&spec, &case.opts(), &inputs)?.kernel)
}

/// Specialised head dims and head-dim classes run the tensor-core kernels; others fall back to `fa1` and
/// report it; `auto` picks `splitkv` for decoding long keys and `fa2` for prefill and short keys.
#[test]
fn the_kernel_that_ran_is_reported() {
    let Some(gpu) = gpu() else { return };
    if std::env::var_os("SDPA_CUDA_SMEM_OPTIN").is_some() {
        // The choices below assume the device's full shared memory; a capped run takes other kernels.
        eprintln!("skipping: SDPA_CUDA_SMEM_OPTIN caps shared memory");
        return;
    }
    let case = |shape: Shape, kernel| {
        Case::new(shape, DType::BF16, Mask::CausalBottomRight, Layout::Bshd, kernel, F32Math::Exact)
    };
    for d in [64, 96, 128, 256] {
        let prefill = Shape { b: 1, hq: 4, hkv: 2, sq: 300, sk: 300, d, dv: d };
        assert_eq!(ran(&gpu, &case(prefill, Kernel::Fa2)).expect("runs"), Kernel::Fa2, "D = {d}");
        assert_eq!(ran(&gpu, &case(prefill, Kernel::SplitKv)).expect("runs"), Kernel::SplitKv, "D = {d}");
        assert_eq!(ran(&gpu, &case(prefill, Kernel::Auto)).expect("runs"), Kernel::Fa2, "D = {d}");
        let decode = Shape { b: 2, hq: 32, hkv: 8, sq: 1, sk: 5000, d, dv: d };
        assert_eq!(ran(&gpu, &case(decode, Kernel::Auto)).expect("runs"), Kernel::SplitKv, "D = {d}");
        // Many heads: one block per head, splits long enough for the cp.async path at D = 128 and 256.
        let many_heads = Shape { b: 2, hq: 80, hkv: 80, sq: 1, sk: 1100, d, dv: d };
        assert_eq!(ran(&gpu, &case(many_heads, Kernel::Auto)).expect("runs"), Kernel::SplitKv, "D = {d}");
        // Too few keys to split: one fa2 launch (issue 4's tiny shapes).
        for n in [64, 128, 512] {
            let tiny = Shape { b: 1, hq: 1, hkv: 1, sq: n, sk: n, d, dv: d };
            assert_eq!(ran(&gpu, &case(tiny, Kernel::Auto)).expect("runs"), Kernel::Fa2, "D = {d}, S = {n}");
            let short_decode = Shape { sq: 1, ..tiny };
            assert_eq!(ran(&gpu, &case(short_decode, Kernel::Auto)).expect("runs"), Kernel::Fa2, "D = {d}, S = {n}");
        }
    }
    for (d, dv) in [(80, 80), (40, 40), (192, 128), (160, 160)] {
        let classes = Shape { b: 1, hq: 2, hkv: 1, sq: 50, sk: 70, d, dv };
        let decode = Shape { b: 2, hq: 32, hkv: 8, sq: 1, sk: 5000, d, dv };
        assert_eq!(ran(&gpu, &case(classes, Kernel::Fa2)).expect("runs"), Kernel::Fa2, "D = {d}, Dv = {dv}");
        assert_eq!(ran(&gpu, &case(classes, Kernel::SplitKv)).expect("runs"), Kernel::SplitKv, "D = {d}, Dv = {dv}");
        assert_eq!(ran(&gpu, &case(decode, Kernel::Auto)).expect("runs"), Kernel::SplitKv, "D = {d}, Dv = {dv}");
    }
    // Head dims that are not multiples of 8 (issue 21) run the tensor-core kernels too; above 256, fa1.
    let odd = Shape { b: 1, hq: 2, hkv: 1, sq: 50, sk: 70, d: 36, dv: 36 };
    assert_eq!(ran(&gpu, &case(odd, Kernel::Fa2)).expect("runs"), Kernel::Fa2);
    assert_eq!(ran(&gpu, &case(odd, Kernel::SplitKv)).expect("runs"), Kernel::SplitKv);
    let wide = Shape { d: 264, dv: 264, ..odd };
    assert_eq!(ran(&gpu, &case(wide, Kernel::Fa2)).expect("runs"), Kernel::Fa1);
    let f32_case = Case { dtype: DType::F32, ..case(Shape::new(1, 2, 40, 40, 64), Kernel::SplitKv) };
    assert_eq!(ran(&gpu, &f32_case).expect("runs"), Kernel::Fa1);
}

/// Big enough to fill the GPU many times over (races and tile-boundary bugs show up here if anywhere),
/// and the decoding shapes of the benchmark, sampled. The small shapes of the table run `fa2`'s deep-ring
/// small tile (their grids leave SMs idle even with 64-row tiles); the first six awkward sizes here have
/// grids of at least 132 blocks, so they take the full-grid tiles; the next three have full-tile grids
/// under 132 blocks and small-tile grids over it (the 1-deep small tile), and the last one runs the deep
/// ring over 47 K/V tiles.
#[test]
fn larger_shapes_sampled() {
    let Some(gpu) = gpu() else { return };
    let s = |b, hq, hkv, sq, sk, d| Shape { b, hq, hkv, sq, sk, d, dv: d };
    for (shape, kernel) in [
        (s(2, 16, 4, 1000, 1500, 128), Kernel::Fa2),
        (s(1, 8, 8, 2048, 2048, 64), Kernel::Fa2),
        (s(2, 8, 1, 777, 1999, 256), Kernel::Fa2),
        (s(3, 48, 12, 333, 401, 64), Kernel::Fa2),
        (s(2, 40, 5, 300, 257, 128), Kernel::Fa2),
        (s(2, 36, 36, 200, 190, 96), Kernel::Fa2),
        (s(1, 16, 4, 1000, 1500, 128), Kernel::Fa2),
        (s(1, 12, 3, 1200, 999, 64), Kernel::Fa2),
        (s(1, 20, 5, 700, 650, 96), Kernel::Fa2),
        (s(1, 4, 2, 300, 3001, 96), Kernel::Fa2),
        (s(8, 32, 32, 1, 4096, 128), Kernel::SplitKv),
        (s(1, 32, 8, 1, 32768, 128), Kernel::SplitKv),
        (s(2, 16, 4, 1000, 1500, 128), Kernel::SplitKv),
        // Head-dim classes on full grids (the 8-warp 128 x 128 tiles of 160..224, padded and exact), the
        // MLA pair, and fa2 decoding at D = 80 (its small tile; `auto` takes splitkv there).
        (s(2, 16, 4, 1000, 1500, 160), Kernel::Fa2),
        (s(2, 16, 16, 777, 1201, 176), Kernel::Fa2),
        (s(1, 32, 8, 1500, 1000, 192), Kernel::Fa2),
        (s(2, 16, 8, 900, 900, 224), Kernel::Fa2),
        (Shape { dv: 128, ..s(1, 32, 32, 1100, 1300, 192) }, Kernel::Fa2),
        (s(2, 32, 8, 1000, 1000, 40), Kernel::Fa2),
        (s(2, 32, 8, 1000, 1000, 80), Kernel::Fa2),
        (s(8, 32, 32, 1, 4096, 80), Kernel::Auto),
        // splitkv at head-dim classes (the padded cp.async path): many blocks per row tile, GQA, MLA's pair.
        (s(1, 32, 8, 1, 32768, 80), Kernel::SplitKv),
        (s(2, 16, 2, 3, 9000, 160), Kernel::SplitKv),
        (Shape { dv: 128, ..s(4, 32, 32, 1, 4096, 192) }, Kernel::SplitKv),
        (s(1, 8, 1, 2, 20000, 32), Kernel::SplitKv),
        (s(2, 8, 2, 1, 6000, 248), Kernel::SplitKv),
    ] {
        for mask in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight] {
            for dtype in HALF {
                assert_passes(
                    &gpu,
                    &Case::new(shape, dtype, mask, Layout::Bhsd, kernel, F32Math::Exact),
                    77,
                    Some(128),
                );
            }
        }
    }
}

/// splitkv decoding at every head-dim class. On sm_90 these run the TMA path, the classes that are not
/// whole 64-column boxes at the next multiple of 64 with the tensor maps at the call's D and Dv (80 and 96
/// in 128, 40 and 32 in 64, 160 in 192, 224 and 248 in 256, MLA's 192/128 with V's third box never loaded), and
/// exact 192 on its own TMA tile; elsewhere (or with `SDPA_SPLITKV_LOAD=cp.async`) the cp.async path. Query
/// rows 1..3, GQA 1/4/8, keys off every step, chunk and split (one block per row tile up to tens), the
/// causal mask in both alignments, both layouts, LSE on and off, f16 and bf16; against the f64 reference
/// with the output poisoned first.
#[test]
fn splitkv_decodes_every_head_dim_class() {
    let Some(gpu) = gpu() else { return };
    // The TMA path is the one these calls take on sm_90 unless a comparison run forces another.
    // (Not under a lowered shared-memory cap, `SDPA_CUDA_SMEM_OPTIN`: classes whose TMA ring does not fit
    // take cp.async there.)
    let tma = gpu.info().compute_capability.0 >= 9
        && std::env::var_os("SDPA_SPLITKV_LOAD").is_none()
        && gpu.info().smem_per_block_optin >= 227 * 1024;
    let s = |b, hq, hkv, sq, sk, d, dv| Shape { b, hq, hkv, sq, sk, d, dv };
    let shapes = [
        s(2, 32, 8, 1, 4097, 80, 80),
        s(1, 8, 1, 3, 1000, 80, 80),
        s(3, 4, 4, 1, 777, 40, 40),
        s(1, 8, 8, 2, 2500, 32, 32),
        s(1, 32, 8, 1, 20011, 192, 128),
        s(2, 16, 16, 1, 3001, 192, 128),
        s(2, 8, 2, 1, 4000, 192, 192),
        s(1, 8, 2, 2, 9000, 160, 160),
        s(1, 4, 1, 1, 5003, 224, 224),
        s(1, 4, 1, 3, 6000, 248, 248),
        s(1, 4, 4, 1, 31, 80, 80),
        s(1, 16, 2, 2, 3000, 96, 96),
        // D and Dv in different classes that run at 96 on TMA: a K box (64/96) or a V box (96/40) never loaded.
        s(1, 8, 2, 1, 3003, 64, 96),
        s(2, 8, 8, 2, 1500, 96, 40),
    ];
    for (n, shape) in shapes.into_iter().enumerate() {
        for (m, mask) in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight].into_iter().enumerate() {
            for dtype in HALF {
                let layout = if (n + m) % 2 == 0 { Layout::Bhsd } else { Layout::Bshd };
                let case = Case {
                    lse: (n + m) % 3 != 2,
                    ..Case::new(shape, dtype, mask, layout, Kernel::SplitKv, F32Math::Exact)
                };
                if tma {
                    let programs = gpu.programs_for(&case.spec(), &case.opts()).expect("plans");
                    assert!(programs.iter().any(|p| p.name.starts_with("splitkv_tma_")), "{}", case.label());
                }
                assert_passes(&gpu, &case, 2100 + n as u64, None);
            }
        }
    }
}

/// A NaN in one query poisons exactly that row (NaN is never turned into a number).
#[test]
fn nan_in_a_query_propagates_to_its_row_only() {
    let Some(gpu) = gpu() else { return };
    let shape = Shape { b: 1, hq: 4, hkv: 1, sq: 70, sk: 300, d: 128, dv: 128 };
    for kernel in [Kernel::Fa2, Kernel::SplitKv] {
        let case = Case::new(shape, DType::BF16, Mask::CausalBottomRight, Layout::Bshd, kernel, F32Math::Exact);
        assert_nan_in_a_query_stays_in_its_row(&gpu, &case);
    }
}

/// A misaligned view (strides not a multiple of 8 elements) gets the right answer on `fa2`'s narrow copies
/// (issue 21; `odd_head_dims.rs` covers more alignments and kernels).
#[test]
fn misaligned_strides_run_the_narrow_copies() {
    let Some(gpu) = gpu() else { return };
    let shape = Shape { b: 1, hq: 2, hkv: 2, sq: 40, sk: 50, d: 64, dv: 64 };
    let case =
        Case { lse: false, ..Case::new(shape, DType::F16, Mask::None, Layout::Bhsd, Kernel::Fa2, F32Math::Exact) };
    let mut spec = case.spec();
    // Rows 68 elements apart: a padded layout whose rows are only 8-byte aligned.
    for st in [&mut spec.q_strides, &mut spec.k_strides, &mut spec.v_strides, &mut spec.o_strides] {
        st.s = 68;
        st.h = 68 * 50;
        st.b = 68 * 50 * 2;
    }
    let (ran, r) = run_spec(&gpu, &case, &spec, 11);
    assert_eq!(ran, Kernel::Fa2);
    assert!(r.pass, "{r:?}");
}

/// splitkv's TMA path needs a tensor map of K and V; on an sm_90 GPU both layouts at every head dim it
/// has a tile for must get one (otherwise the calls above would have quietly taken the bulk or cp.async path).
#[test]
fn tma_maps_describe_both_layouts() {
    use sdpa_cuda::tensor_map::{kv_tensor_map, padded_tensor_map, KvOperand};
    let Some(gpu) = gpu() else { return };
    if gpu.info().compute_capability.0 < 9 {
        eprintln!("skipping: TMA needs compute capability 9.0, this GPU is {:?}", gpu.info().compute_capability);
        return;
    }
    for layout in [Layout::Bhsd, Layout::Bshd] {
        for dtype in HALF {
            let op = |d| {
                let st = layout.strides(4, 777, d);
                // Only recorded by the driver, never read here: any 16-byte-aligned address will do.
                KvOperand {
                    ptr: 1 << 30,
                    dtype,
                    dims: [2, 4, 777, d],
                    strides: [st.b as i64, st.h as i64, st.s as i64],
                }
            };
            for d in [64, 128, 256] {
                assert!(kv_tensor_map(&op(d), 32).is_some(), "{layout:?} D = {d} {dtype:?}");
            }
            // The head-dim classes' maps at the call's own widths (splitkv_decodes_every_head_dim_class).
            for d in [32, 40, 80, 128, 160, 192, 224, 248] {
                assert!(padded_tensor_map(&op(d), 64).is_some(), "{layout:?} D = {d} {dtype:?}");
            }
        }
    }
}

/// splitkv keeps its scratch between calls of one layout and relies on the kernel leaving the row-tile
/// counters zero: calls of one layout, then another, then the first again, each on new random data, must
/// all match the reference (a counter left non-zero would make a block merge too early or never).
#[test]
fn repeated_splitkv_calls_reuse_the_kept_scratch() {
    let Some(gpu) = gpu() else { return };
    let s = |b, hq, hkv, sk, d| Shape { b, hq, hkv, sq: 1, sk, d, dv: d };
    // Both shapes spread each row tile over several blocks, so both use the counters.
    let (a, b) = (s(1, 32, 8, 20000, 128), s(2, 4, 1, 3500, 64));
    for (n, shape) in [a, a, a, b, b, a].into_iter().enumerate() {
        let case = Case {
            lse: n % 2 == 0,
            ..Case::new(shape, DType::BF16, Mask::None, Layout::Bhsd, Kernel::SplitKv, F32Math::Exact)
        };
        let inputs = HostInputs::random(&case.spec(), 900 + n as u64).expect("valid spec");
        let r = check_inputs(&gpu, &case, &inputs, rows_for(&shape)).expect("runs");
        assert!(r.pass, "call {n} ({}): {r:?}", case.label());
    }
}
