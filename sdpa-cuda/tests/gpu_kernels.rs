//! Every kernel of the foundation against the f64 reference on the GPU: random data, poisoned outputs,
//! awkward sizes (D in {1, 40, 64, 80, 96, 128, 256, 8192}, lengths off the tiles, Sq != Sk), every mask,
//! GQA, both layouts, each dtype, with and without LSE. f16/bf16 `fa1` must also stay within twice the
//! unfused kernel's error in the same dtype on the same inputs. Skips (printing why) without a GPU.

mod common;

use common::{
    assert_nan_in_a_query_stays_in_its_row, assert_passes, cases, check, check_inputs, gpu, rows_for, run_spec, Case,
};
use sdpa_core::{DType, F32Math, HostBackend, HostBuffer, HostInputs, Kernel, Layout, Mask, SdpaError, Shape};

/// Runs a table, prints one line per failure and a summary, fails if any case failed.
fn run_table(name: &str, table: Vec<Case>, mut extra: impl FnMut(&Case, &HostInputs, f64) -> Option<String>) {
    let Some(gpu) = gpu() else { return };
    let mut failures = Vec::new();
    let mut worst: f64 = 0.0;
    let mut unsupported = 0;
    for (n, case) in table.iter().enumerate() {
        let spec = case.spec();
        let inputs = HostInputs::random(&spec, 1000 + n as u64).expect("valid spec");
        match check_inputs(&gpu, case, &inputs, rows_for(&case.shape)) {
            Ok(r) => {
                worst = worst.max(r.rel_err / r.tolerance);
                if !r.pass {
                    failures.push(format!("{}: {r:?}", case.label()));
                } else if let Some(f) = extra(case, &inputs, r.rel_err) {
                    failures.push(format!("{}: {f}", case.label()));
                }
            }
            Err(SdpaError::Unsupported { what, .. }) => {
                unsupported += 1;
                if unsupported <= 3 {
                    eprintln!("{}: unsupported ({what})", case.label());
                }
            }
            Err(e) => failures.push(format!("{}: error: {e}", case.label())),
        }
    }
    eprintln!(
        "{name}: {} cases, {} failed, {unsupported} unsupported, worst rel_err/tolerance {worst:.3}",
        table.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), table.len(), failures.join("\n"));
}

#[test]
fn unfused_matches_the_reference() {
    run_table("unfused", cases(Kernel::Unfused, F32Math::Exact, &DType::ALL), |_, _, _| None);
}

#[test]
fn unfused_tf32_matches_the_reference() {
    run_table("unfused tf32", cases(Kernel::Unfused, F32Math::Tf32, &[DType::F32]), |_, _, _| None);
}

#[test]
fn fa1_matches_the_reference_and_the_unfused_error() {
    let unfused_gpu = gpu();
    run_table("fa1", cases(Kernel::Fa1, F32Math::Exact, &DType::ALL), |case, inputs, err| {
        if case.dtype == DType::F32 {
            return None;
        }
        let g = unfused_gpu.as_ref()?;
        let base = Case { kernel: Kernel::Unfused, ..case.clone() };
        let r = check_inputs(g, &base, inputs, rows_for(&case.shape)).ok()?;
        // Both at the output dtype's rounding floor counts as equal (2x of a near-zero error is noise).
        let bound = 2.0 * r.rel_err.max(case.dtype.unit_roundoff());
        (err > bound).then(|| format!("fa1 rel_err {err:.3e} > 2 x unfused {:.3e}", r.rel_err))
    });
}

#[test]
fn tf32_matches_the_reference() {
    run_table("fa2 f32 tf32", cases(Kernel::Fa2, F32Math::Tf32, &[DType::F32]), |_, _, _| None);
}

#[test]
fn split_tf32_matches_the_reference() {
    run_table("fa2 f32 split-tf32", cases(Kernel::Fa2, F32Math::SplitTf32, &[DType::F32]), |_, _, _| None);
}

/// A NaN in one query poisons exactly that row in every kernel (NaN is never turned into a number).
#[test]
fn nan_in_a_query_propagates_to_its_row_only() {
    let Some(gpu) = gpu() else { return };
    let shape = Shape { b: 1, hq: 2, hkv: 1, sq: 70, sk: 90, d: 64, dv: 64 };
    for (kernel, f32_math, dtype) in [
        (Kernel::Unfused, F32Math::Exact, DType::BF16),
        (Kernel::Fa1, F32Math::Exact, DType::F16),
        (Kernel::Fa1, F32Math::Exact, DType::F32),
        (Kernel::Fa2, F32Math::SplitTf32, DType::F32),
    ] {
        assert_nan_in_a_query_stays_in_its_row(
            &gpu,
            &Case::new(shape, dtype, Mask::CausalTopLeft, Layout::Bshd, kernel, f32_math),
        );
    }
}

/// Big enough to fill the GPU many times over: races and tile-boundary bugs show up here if anywhere.
#[test]
fn larger_shapes_sampled() {
    let Some(gpu) = gpu() else { return };
    let shape = Shape { b: 2, hq: 16, hkv: 4, sq: 1000, sk: 1500, d: 128, dv: 128 };
    for (kernel, f32_math, dtype) in [
        (Kernel::Unfused, F32Math::Exact, DType::BF16),
        (Kernel::Fa1, F32Math::Exact, DType::BF16),
        (Kernel::Fa1, F32Math::Exact, DType::F32),
        (Kernel::Fa2, F32Math::Tf32, DType::F32),
        (Kernel::Fa2, F32Math::SplitTf32, DType::F32),
    ] {
        for mask in [Mask::None, Mask::CausalBottomRight] {
            assert_passes(&gpu, &Case::new(shape, dtype, mask, Layout::Bhsd, kernel, f32_math), 99, Some(128));
        }
    }
}

/// Unsupported combinations are errors of the `Unsupported` kind, never wrong answers.
#[test]
fn unsupported_requests_say_so() {
    let Some(gpu) = gpu() else { return };
    let shape = Shape { b: 1, hq: 1, hkv: 1, sq: 8, sk: 8, d: 512, dv: 512 };
    let case =
        Case { lse: false, ..Case::new(shape, DType::F32, Mask::None, Layout::Bhsd, Kernel::Fa2, F32Math::Tf32) };
    match check(&gpu, &case, 1, None) {
        Err(SdpaError::Unsupported { what, .. }) => assert!(what.contains("up to 256"), "{what}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let case = Case { kernel: Kernel::Fa1, f32_math: F32Math::Tf32, shape: Shape::new(1, 1, 8, 8, 64), ..case };
    assert!(matches!(check(&gpu, &case, 1, None), Err(SdpaError::Unsupported { .. })));
    let case = Case { kernel: Kernel::Unfused, f32_math: F32Math::SplitTf32, ..case };
    assert!(matches!(check(&gpu, &case, 1, None), Err(SdpaError::Unsupported { .. })));
}

/// A buffer of the wrong dtype or length is refused before anything runs.
#[test]
fn bad_buffers_are_refused() {
    use sdpa_core::{Backend, ForwardArgs, RunOptions};
    let Some(gpu) = gpu() else { return };
    let spec = sdpa_core::AttentionSpec::new(Shape::new(1, 2, 16, 16, 64), DType::F16);
    let q = gpu.upload(&HostBuffer::random(DType::F16, 2 * 16 * 64, 1)).expect("upload");
    let short = gpu.upload(&HostBuffer::random(DType::F16, 100, 2)).expect("upload");
    let wrong = gpu.upload(&HostBuffer::random(DType::BF16, 2 * 16 * 64, 3)).expect("upload");
    let mut o = gpu.upload(&HostBuffer::poisoned(DType::F16, 2 * 16 * 64)).expect("upload");
    let opts = RunOptions::default();
    let e = gpu.forward(
        &spec,
        &opts,
        ForwardArgs { q: &q, k: &short, v: &q, mask: None, o: &mut o, lse: None, block_table: None },
    );
    assert!(matches!(e, Err(SdpaError::BufferTooShort { name: "k", .. })), "{e:?}");
    let e = gpu.forward(
        &spec,
        &opts,
        ForwardArgs { q: &q, k: &q, v: &wrong, mask: None, o: &mut o, lse: None, block_table: None },
    );
    assert!(matches!(e, Err(SdpaError::DTypeMismatch { name: "v", .. })), "{e:?}");
}

/// A view whose rows are `row` elements apart (only 8- or 4-byte aligned for odd multiples of 2), so the
/// tiled fa1 variant (16-byte copies) must hand over to the plain fixed one.
fn padded_rows(spec: &mut sdpa_core::AttentionSpec, row: usize) {
    let s = spec.shape;
    for (st, heads, len) in [
        (&mut spec.q_strides, s.hq, s.sq),
        (&mut spec.k_strides, s.hkv, s.sk),
        (&mut spec.v_strides, s.hkv, s.sk),
        (&mut spec.o_strides, s.hq, s.sq),
    ] {
        st.s = row;
        st.h = row * len;
        st.b = row * len * heads;
    }
}

/// The fast fa1 variants on shapes spanning several query blocks (128 rows in the tiled variant) and key
/// tiles, with partial last tiles, GQA, Sq != Sk: D = 32 (absent from the shared table) and the common head
/// dims, every mask, both layouts, every dtype; then each dtype on a misaligned view (plain fixed variant).
#[test]
fn fa1_fast_variants_on_multi_tile_shapes() {
    let mut table = Vec::new();
    let s = |hq, hkv, sq, sk, d| Shape { b: 2, hq, hkv, sq, sk, d, dv: d };
    for (i, shape) in [s(4, 2, 300, 333, 32), s(2, 1, 257, 190, 64), s(2, 2, 130, 300, 128), s(2, 1, 140, 150, 256)]
        .into_iter()
        .enumerate()
    {
        for mask in common::masks(&shape) {
            for layout in [Layout::Bhsd, Layout::Bshd] {
                for dtype in DType::ALL {
                    let lse = (i + table.len()) % 3 != 0;
                    table.push(Case { shape, dtype, mask, layout, kernel: Kernel::Fa1, f32_math: F32Math::Exact, lse });
                }
            }
        }
    }
    run_table("fa1 fast variants", table, |_, _, _| None);

    let Some(gpu) = gpu() else { return };
    for dtype in DType::ALL {
        let shape = Shape { b: 1, hq: 2, hkv: 1, sq: 140, sk: 150, d: 64, dv: 64 };
        let case = Case::new(shape, dtype, Mask::CausalBottomRight, Layout::Bhsd, Kernel::Fa1, F32Math::Exact);
        let mut spec = case.spec();
        padded_rows(&mut spec, 66);
        let (_, r) = run_spec(&gpu, &case, &spec, 21);
        assert!(r.pass, "misaligned {dtype}: {r:?}");
    }
}

/// A few small shapes, one per fa1 variant (tensor cores at D = 64 and 128, tiled with each dtype and several head dims, plain fixed on a
/// misaligned view, generic), for `compute-sanitizer --tool memcheck|racecheck`: lengths off the tiles,
/// more than one query block and key tile, GQA, masks that mix full and partial tiles.
#[test]
fn fa1_small_shapes_for_the_sanitizer() {
    let Some(gpu) = gpu() else { return };
    let add = |sh: &Shape| Mask::Explicit(sdpa_core::ExplicitMask::full(sdpa_core::MaskValues::Additive, sh));
    let sh = |sq, sk, d| Shape { b: 1, hq: 2, hkv: 1, sq, sk, d, dv: d };
    let runs = [
        (sh(150, 200, 64), DType::BF16, Mask::CausalTopLeft, false),
        (sh(130, 70, 128), DType::F16, Mask::CausalBottomRight, false),
        (sh(150, 200, 64), DType::F32, Mask::CausalBottomRight, false),
        (sh(150, 140, 128), DType::F32, Mask::CausalTopLeft, false),
        (sh(140, 130, 128), DType::BF16, add(&sh(140, 130, 128)), false),
        (sh(70, 150, 256), DType::F16, Mask::None, false),
        (sh(129, 129, 80), DType::F32, Mask::CausalTopLeft, false),
        (sh(100, 140, 64), DType::F32, Mask::CausalTopLeft, true),
        (sh(70, 90, 40), DType::F32, Mask::CausalTopLeft, false),
    ];
    for (shape, dtype, mask, misaligned) in runs {
        let case = Case::new(shape, dtype, mask, Layout::Bshd, Kernel::Fa1, F32Math::Exact);
        let mut spec = case.spec();
        if misaligned {
            padded_rows(&mut spec, 66);
        }
        let (_, r) = run_spec(&gpu, &case, &spec, 5);
        assert!(r.pass, "{}: {r:?}", case.label());
    }
}

/// The entry point `fa1` plans for `spec` (Q, K, V, O at 16-byte aligned stand-in addresses; nothing runs).
fn fa1_entry(gpu: &sdpa_cuda::CudaBackend, spec: &sdpa_core::AttentionSpec) -> String {
    let base = 1u64 << 32;
    let mask = if matches!(spec.mask, Mask::Explicit(_)) { base * 5 } else { 0 };
    let params = sdpa_cuda::AttnParams::new(spec, base, base * 2, base * 3, base * 4, mask, base * 6).expect("params");
    let opts = sdpa_core::RunOptions::default();
    let dev = gpu.device();
    let call = sdpa_cuda::Call { dev, stream: dev.stream(), spec, opts: &opts, params };
    sdpa_cuda::fa1::plan(&call).expect("plans").0.name
}

/// The tensor-core fa1 (`fa1m`, warps splitting the keys of each K/V tile) on shapes spanning several query
/// blocks and key tiles with partial last ones, GQA, Sq < Sk and Sq > Sk (bottom-right causal rows that
/// see no key), every mask, both layouts, f16 and bf16, with and without LSE; each case must plan `fa1m`
/// and stay within twice the unfused kernel's error in the same dtype.
#[test]
fn fa1_tensor_cores_on_multi_tile_shapes() {
    let Some(gpu) = gpu() else { return };
    let s = |b, hq, hkv, sq, sk, d| Shape { b, hq, hkv, sq, sk, d, dv: d };
    let mut table = Vec::new();
    for shape in
        [s(2, 4, 2, 200, 333, 64), s(1, 2, 1, 300, 130, 64), s(2, 2, 1, 260, 190, 128), s(1, 4, 4, 129, 400, 128)]
    {
        for mask in common::masks(&shape) {
            for layout in [Layout::Bhsd, Layout::Bshd] {
                for dtype in [DType::F16, DType::BF16] {
                    let lse = table.len() % 3 != 0;
                    table.push(Case { shape, dtype, mask, layout, kernel: Kernel::Fa1, f32_math: F32Math::Exact, lse });
                }
            }
        }
    }
    for case in &table {
        let entry = fa1_entry(&gpu, &case.spec());
        assert!(entry.starts_with("fa1m_"), "{}: planned {entry}, not the tensor-core variant", case.label());
    }
    run_table("fa1 tensor cores", table, |case, inputs, err| {
        let base = Case { kernel: Kernel::Unfused, ..case.clone() };
        let r = check_inputs(&gpu, &base, inputs, rows_for(&case.shape)).ok()?;
        let bound = 2.0 * r.rel_err.max(case.dtype.unit_roundoff());
        (err > bound).then(|| format!("fa1m rel_err {err:.3e} > 2 x unfused {:.3e}", r.rel_err))
    });
}

/// f16/bf16 at the tensor-core head dims still reach the SIMT variants when the tensor-core one cannot
/// take the call: an output view whose rows are not 16-byte aligned (the register-tiled SIMT kernel only
/// needs Q, K and V aligned), a negative scale, and a fully misaligned view (plain fixed SIMT kernel).
#[test]
fn fa1_simt_half_variants_at_tensor_core_head_dims() {
    let Some(gpu) = gpu() else { return };
    for (d, dtype, mask) in [
        (64, DType::F16, Mask::CausalBottomRight),
        (128, DType::BF16, Mask::None),
        (64, DType::BF16, Mask::CausalTopLeft),
        (128, DType::F16, Mask::CausalBottomRight),
    ] {
        let shape = Shape { b: 1, hq: 4, hkv: 2, sq: 150, sk: 170, d, dv: d };
        let base = || sdpa_core::AttentionSpec::new(shape, dtype).with_layout(Layout::Bshd).with_mask(mask);
        // O rows padded by 2 elements.
        let mut spec = base();
        let row = d * 4 + 2;
        spec.o_strides = sdpa_core::Strides { b: row * shape.sq, h: d, s: row };
        let entry = fa1_entry(&gpu, &spec);
        assert!(entry.starts_with("fa1t_"), "padded O, D={d}: planned {entry}");
        check_spec(&gpu, &spec, &format!("padded O {dtype} D={d}"));
        // Negative scale.
        let spec = base().with_scale(-0.7 / (d as f64).sqrt());
        let entry = fa1_entry(&gpu, &spec);
        assert!(entry.starts_with("fa1t_"), "negative scale, D={d}: planned {entry}");
        check_spec(&gpu, &spec, &format!("negative scale {dtype} D={d}"));
        // Everything misaligned.
        let mut spec = base();
        padded_rows(&mut spec, d + 2);
        let entry = fa1_entry(&gpu, &spec);
        assert!(entry.starts_with(&format!("fa1_{}_", dtype.name())), "misaligned, D={d}: planned {entry}");
        check_spec(&gpu, &spec, &format!("misaligned {dtype} D={d}"));
    }
}

/// Runs `fa1` with LSE on random inputs for `spec` (output poisoned) and checks it against the reference.
fn check_spec(gpu: &sdpa_cuda::CudaBackend, spec: &sdpa_core::AttentionSpec, what: &str) {
    let inputs = HostInputs::random(spec, 31).expect("valid");
    let opts = sdpa_core::RunOptions { kernel: Kernel::Fa1, f32_math: F32Math::Exact, threads: None, lse: true };
    let run = gpu.run_host(spec, &opts, &inputs).expect("runs");
    let r = sdpa_core::check::check_output(spec, &inputs, &run.output, F32Math::Exact, None).expect("checks");
    assert!(r.pass, "{what}: {r:?}");
}

/// NaN under a key a row does not see (causal in both alignments, an explicit additive `-inf`) leaves that
/// row exact on every kernel, even when the key sits inside a tile the row's block loads; rows that do see
/// the key are poisoned exactly where the f64 reference is (V: that column; K: the whole row). The kernels
/// multiply a masked key's zero weight by V, so this is the path that recomputes such rows without masked keys.
#[test]
fn nan_under_masked_keys_stays_out_of_rows_that_do_not_see_them() {
    use sdpa_core::reference::reference_attention;
    use sdpa_core::{ExplicitMask, MaskValues};
    let Some(gpu) = gpu() else { return };
    let s = |hq, hkv, sq, sk, d| Shape { b: 1, hq, hkv, sq, sk, d, dv: d };
    // (kernel, f32 math, dtype, shape): unfused (three row widths); fa1's register-tiled (f32 D=64, f16
    // D=80), generic (D=40) and tensor-core (bf16 D=128) variants; fa2 at its small-grid tiles, the deep-ring
    // one (2 heads) and the 1-deep one (32 heads) (the full-grid tiles share the template and its epilogue);
    // TF32 and split TF32; splitkv with one block per row tile and with several (Sk = 5000).
    let runs = [
        (Kernel::Unfused, F32Math::Exact, DType::BF16, s(2, 1, 70, 90, 64)),
        // unfused's check pass: 34 16-byte chunks per row (more than a warp), and rows off 16-byte alignment.
        (Kernel::Unfused, F32Math::Exact, DType::F32, s(2, 1, 70, 90, 136)),
        (Kernel::Unfused, F32Math::Exact, DType::F16, s(2, 1, 70, 90, 36)),
        (Kernel::Fa1, F32Math::Exact, DType::F32, s(2, 1, 70, 90, 64)),
        (Kernel::Fa1, F32Math::Exact, DType::F32, s(2, 1, 70, 90, 40)),
        (Kernel::Fa1, F32Math::Exact, DType::F16, s(2, 1, 70, 90, 80)),
        (Kernel::Fa1, F32Math::Exact, DType::BF16, s(4, 2, 200, 333, 128)),
        (Kernel::Fa2, F32Math::Exact, DType::BF16, s(2, 1, 70, 90, 64)),
        (Kernel::Fa2, F32Math::Exact, DType::F16, s(32, 8, 300, 333, 128)),
        (Kernel::Fa2, F32Math::Tf32, DType::F32, s(2, 1, 70, 90, 64)),
        (Kernel::Fa2, F32Math::SplitTf32, DType::F32, s(2, 1, 70, 90, 128)),
        (Kernel::SplitKv, F32Math::Exact, DType::BF16, s(4, 1, 3, 5000, 128)),
        (Kernel::SplitKv, F32Math::Exact, DType::F16, s(8, 2, 1, 300, 64)),
    ];
    let mut failures = Vec::new();
    for (kernel, f32_math, dtype, shape) in runs {
        let explicit = Mask::Explicit(ExplicitMask::full(MaskValues::Additive, &shape));
        for mask in [Mask::CausalTopLeft, Mask::CausalBottomRight, explicit] {
            let case = Case::new(shape, dtype, mask, Layout::Bshd, kernel, f32_math);
            let spec = case.spec();
            let mut inputs = HostInputs::random(&spec, 5).expect("valid spec");
            // Keys seen by some rows and not by others: under causal masks the rows before them (V poisoned
            // at one key, K at the next); under the explicit mask -inf on a third of the (row, key) pairs,
            // elsewhere a small additive value, with the two poisoned keys masked for the same rows.
            let (kv, kk) = match mask {
                Mask::CausalTopLeft => (shape.sq / 2, shape.sq / 2 + 1),
                Mask::CausalBottomRight => {
                    let k = shape.sk - shape.sq + shape.sq / 2;
                    (k, (k + 1).min(shape.sk - 1))
                }
                _ => (shape.sk / 4 * 2, shape.sk / 4 * 2 + 1),
            };
            if let Mask::Explicit(_) = mask {
                let n = shape.hq * shape.sq * shape.sk;
                inputs.mask = Some(
                    (0..n)
                        .map(|x| if (x / shape.sk + x % shape.sk / 2) % 3 == 0 { f32::NEG_INFINITY } else { 0.25 })
                        .collect(),
                );
            }
            let (kvh, col) = (shape.hkv - 1, 5 % shape.d);
            inputs.v.set_f32(spec.v_strides.offset(0, kvh, kv) + col, f32::NAN);
            inputs.k.set_f32(spec.k_strides.offset(0, kvh, kk) + col, f32::NAN);
            // The case must poison some rows and spare others that load the same tiles.
            let want = reference_attention(&spec, &inputs).expect("reference");
            let bad_rows = want.o.chunks(shape.dv).filter(|r| r.iter().any(|x| x.is_nan())).count();
            let rows = shape.hq * shape.sq;
            assert!(bad_rows > 0 && bad_rows < rows, "{}: {bad_rows} of {rows} rows poisoned", case.label());
            match check_inputs(&gpu, &case, &inputs, None) {
                Ok(r) if r.pass => {}
                Ok(r) => failures.push(format!("{}: {r:?}", case.label())),
                Err(e) => failures.push(format!("{}: error: {e}", case.label())),
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}
