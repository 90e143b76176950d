//! The bounded face of the `result_file`, `bench_spec` and `attention_spec` fuzz targets (fuzz/README.md):
//! the committed seeds (real result files and presets) mutated a bounded number of times through the same
//! entry points, and arbitrary specs through validation, sizing, inputs and the reference. Every outcome
//! is a value or an error, never a panic. Arbitrary specs carry arbitrary variants (windows, caps, slopes). A few seconds in CI; the coverage-guided search is `cargo fuzz`.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

#[path = "../../fuzz/bounded/mutate.rs"]
#[allow(dead_code)] // `scratch` serves the analysis tests
mod mutate;

use mutate::{apply, edits, seeds};
use proptest::prelude::*;
use proptest::sample::Index;
use sdpa_core::backward::reference_backward;
use sdpa_core::record::{parse_results, BenchSpec};
use sdpa_core::{
    reference_attention, Alibi, AttentionCost, AttentionSpec, DType, Diagonal, ExplicitMask, HostBuffer, HostInputs,
    Layout, Mask, MaskValues, Operand, Paging, Ragged, Shape, Strides, Variants, Window,
};
use std::sync::OnceLock;

fn pool(target: &'static str, cell: &'static OnceLock<Vec<Vec<u8>>>) -> &'static Vec<Vec<u8>> {
    cell.get_or_init(|| seeds(target).into_iter().map(|(_, b)| b).collect())
}

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![
        6 => 1usize..6,
        1 => Just(0usize),
        1 => 6usize..70,
        1 => (0u32..64).prop_map(|s| 1usize << s),
        1 => (0usize..4).prop_map(|k| usize::MAX - k),
        1 => any::<usize>(),
    ]
}

fn strides() -> impl Strategy<Value = Option<Strides>> {
    prop::option::weighted(0.2, (dim(), dim(), dim()).prop_map(|(b, h, s)| Strides { b, h, s }))
}

/// Windows, caps and slopes with hostile values: unbounded and huge sides, caps that are not positive or not
/// finite, slope lists of the wrong length or with NaN, with and without a named diagonal.
fn variants() -> impl Strategy<Value = Variants> {
    let side = || prop::option::of(dim());
    let window = prop::option::weighted(0.4, (side(), side()).prop_map(|(left, right)| Window { left, right }));
    let cap = prop::option::weighted(
        0.3,
        prop_oneof![Just(0.0), Just(-1.0), Just(f64::NAN), Just(f64::INFINITY), Just(1e300), 1e-3f64..100.0],
    );
    let slope = prop_oneof![Just(f32::NAN), Just(f32::INFINITY), -2.0f32..2.0];
    let alibi = prop::option::weighted(
        0.3,
        prop_oneof![Just(Alibi::Standard), prop::collection::vec(slope, 0..6).prop_map(Alibi::Slopes)],
    );
    let diagonal = prop::option::of(prop_oneof![Just(Diagonal::TopLeft), Just(Diagonal::BottomRight)]);
    (window, cap, alibi, diagonal).prop_map(|(window, softcap, alibi, diagonal)| Variants {
        window,
        softcap,
        alibi,
        diagonal,
    })
}

proptest! {
    // A fixed seed: CI must not pass or fail by chance. The open-ended search is the cargo-fuzz targets'
    // (fuzz/README.md); a bug they find gets a named regression test.
    #![proptest_config(ProptestConfig {
        cases: 4096,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5d_9a_19),
        ..ProptestConfig::default()
    })]

    /// fuzz `result_file`, bounded: what parses serialises and reads back with the same records.
    #[test]
    fn mutated_result_files_parse_or_fail_cleanly(seed in any::<Index>(), e in edits(6)) {
        static S: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
        let pool = pool("result_file", &S);
        let bytes = apply(&pool[seed.index(pool.len())], pool, &e);
        let text = String::from_utf8_lossy(&bytes);
        if let Ok(f) = parse_results(&text, "m.json") {
            let back = parse_results(&serde_json::to_string(&f).unwrap(), "back.json").unwrap();
            prop_assert_eq!((back.records.len(), back.skipped.len()), (f.records.len(), f.skipped.len()));
        }
    }

    /// fuzz `bench_spec`, bounded: a spec that reads serialises and reads back equal.
    #[test]
    fn mutated_bench_specs_read_or_fail_cleanly(seed in any::<Index>(), e in edits(6)) {
        static S: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
        let pool = pool("bench_spec", &S);
        let bytes = apply(&pool[seed.index(pool.len())], pool, &e);
        let text = String::from_utf8_lossy(&bytes);
        let mut specs: Vec<BenchSpec> = Vec::new();
        if let Ok(s) = serde_json::from_str::<BenchSpec>(&text) {
            specs.push(s);
        }
        if let Ok(v) = serde_json::from_str::<Vec<BenchSpec>>(&text) {
            specs.extend(v);
        }
        for s in specs.iter().take(16) {
            let back: BenchSpec = serde_json::from_str(&serde_json::to_string(s).unwrap()).unwrap();
            // serde_json may read a printed f64 back one ulp off (the cargo-fuzz target found max_time_s
            // 4e-84 -> 3.9999999999999997e-84): the budget within rounding, the rest exactly.
            let (a, b) = (back.max_time_s, s.max_time_s);
            let close = match (a, b) {
                (Some(x), Some(y)) => x == y || (x - y).abs() <= 4.0 * f64::EPSILON * x.abs().max(y.abs()),
                (x, y) => x == y,
            };
            prop_assert!(close, "max_time_s {:?} read back as {:?}", b, a);
            prop_assert_eq!(BenchSpec { max_time_s: None, ..back }, BenchSpec { max_time_s: None, ..s.clone() });
            for (shape, &dtype) in s.shapes.iter().zip(s.dtypes.iter().cycle()).take(64) {
                let spec = AttentionSpec::new(*shape, dtype);
                if spec.validate().is_ok() {
                    let c = AttentionCost::of_spec(&spec);
                    prop_assert!(c.flops.is_finite() && c.bytes.is_finite());
                }
            }
        }
    }

    /// fuzz `attention_spec`, bounded: validation never panics; a spec that validates can be sized and
    /// costed; small ones get inputs and the reference; ones whose buffers cannot exist get an error.
    #[test]
    fn arbitrary_specs_validate_or_fail_cleanly(
        (b, hq, hkv, sq, sk, d, dv) in (dim(), dim(), dim(), dim(), dim(), dim(), dim()),
        dtype in prop::sample::select(DType::ALL.to_vec()),
        bshd in any::<bool>(),
        mask in 0u8..5, mask_dims in [0u8..3, 0u8..3, 0u8..3, 0u8..3], odd_dims in [dim(), dim(), dim(), dim()],
        scale in prop::option::of(prop_oneof![Just(f64::NAN), Just(f64::INFINITY), Just(1e308), -4.0f64..4.0]),
        st in [strides(), strides(), strides(), strides()],
        variants in variants(),
    ) {
        let shape = Shape { b, hq, hkv, sq, sk, d, dv };
        let mut spec = AttentionSpec::new(shape, dtype);
        if bshd { spec = spec.with_layout(Layout::Bshd); }
        let full = [b, hq, sq, sk];
        let explicit = |values| {
            let dims = std::array::from_fn(|i| match mask_dims[i] { 0 => 1, 1 => full[i], _ => odd_dims[i] });
            Mask::Explicit(ExplicitMask { values, dims })
        };
        spec.mask = match mask {
            0 => Mask::None,
            1 => Mask::CausalTopLeft,
            2 => Mask::CausalBottomRight,
            3 => explicit(MaskValues::Boolean),
            _ => explicit(MaskValues::Additive),
        };
        spec.scale = scale;
        spec.variants = variants;
        for (s, slot) in st.iter().zip([&mut spec.q_strides, &mut spec.k_strides, &mut spec.v_strides, &mut spec.o_strides]) {
            if let Some(s) = s { *slot = *s; }
        }
        if spec.validate().is_err() {
            return Ok(());
        }
        let lens: Vec<usize> = [Operand::Q, Operand::K, Operand::V, Operand::O]
            .into_iter()
            .map(|op| { spec.numel(op).unwrap(); spec.required_len(op).unwrap() })
            .collect();
        let mask_len = match &spec.mask { Mask::Explicit(m) => Some(m.len().unwrap()), _ => None };
        spec.check_lengths(lens[0], lens[1], lens[2], lens[3], mask_len).unwrap();
        let c = AttentionCost::of_spec(&spec);
        prop_assert!(c.flops.is_finite() && c.bytes.is_finite());
        let c = AttentionCost::backward_of_spec(&spec);
        prop_assert!(c.flops.is_finite() && c.bytes.is_finite());
        // The band never claims more pairs than the full matrix, and its rows are in range.
        let band = spec.band();
        prop_assert!(band.pairs(sq, sk) <= sq as u128 * sk as u128);
        for i in [0, sq / 2, sq - 1] {
            let r = band.range(i, sk);
            prop_assert!(r.start <= r.end && r.end <= sk);
        }
        let host: Vec<u128> = lens[..3].iter().chain(mask_len.iter()).map(|&n| n as u128 * 4).collect();
        let rows = spec.lse_len().unwrap() as u128;
        if host.iter().sum::<u128>() <= 1 << 20 && rows * sk as u128 * (d + dv) as u128 <= 1 << 18 {
            let inputs = HostInputs::random(&spec, 7).unwrap();
            let out = reference_attention(&spec, &inputs).unwrap();
            prop_assert_eq!(out.o.len() as u128, rows * dv as u128);
            // The backward of every valid dense spec runs, on any strides.
            let d_o = HostBuffer::random(dtype, lens[3], 8);
            let g = reference_backward(&spec, &inputs, &d_o).unwrap();
            prop_assert_eq!(g.dq.len() as u128, rows * d as u128);
        } else if host.iter().any(|&x| x > isize::MAX as u128) {
            prop_assert!(HostInputs::random(&spec, 7).is_err());
        }
    }

    /// Arbitrary ragged batches and paged caches: hostile lengths (0, huge, lists of the wrong length), page
    /// geometry (size 0 or past 256, pools too small, tables too narrow) and corrupted block tables
    /// validate or fail cleanly; small valid ones run the reference, and a table entry outside the pool is
    /// an error from the input check, never an out-of-bounds read.
    #[test]
    fn arbitrary_ragged_batches_validate_or_fail_cleanly(
        lens in prop::collection::vec((dim(), dim()), 0..6),
        (hq, hkv, d, dv) in (1usize..5, 1usize..3, dim(), 1usize..9),
        bound in (dim(), dim()),
        paged in prop::option::of((dim(), dim(), dim())),
        causal in 0u8..3, bshd in any::<bool>(), variants in variants(),
        corrupt in prop::option::of((any::<Index>(), any::<u32>())),
    ) {
        let seqlens_q: Vec<usize> = lens.iter().map(|l| l.0).collect();
        let seqlens_k: Vec<usize> = lens.iter().map(|l| l.1).collect();
        let mut r = Ragged::new(seqlens_q, seqlens_k);
        r.pages = paged.map(|(page_size, num_pages, max_pages)| Paging { page_size, num_pages, max_pages });
        let shape = Shape { b: lens.len(), hq: hq * hkv, hkv, sq: bound.0, sk: bound.1, d, dv };
        let layout = if bshd { Layout::Bshd } else { Layout::Bhsd };
        let mask = [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight][causal as usize];
        let spec = AttentionSpec::new(shape, DType::F32).with_mask(mask).with_variants(variants).with_ragged(r, layout);
        if spec.validate().is_err() {
            return Ok(());
        }
        let c = AttentionCost::of_spec(&spec);
        prop_assert!(c.flops.is_finite() && c.bytes.is_finite());
        let lens: Vec<u128> = [Operand::Q, Operand::K, Operand::V, Operand::O]
            .into_iter()
            .map(|op| spec.required_len(op).unwrap() as u128)
            .collect();
        let rows = spec.lse_len().unwrap() as u128;
        let table = sdpa_core::memory::OperandBytes::of(&spec).unwrap().block_table as u128;
        if table > 1 << 20 {
            // A block table the host cannot hold is an error, not an abort.
            if let Err(e) = HostInputs::random(&spec, 9) {
                let clean = matches!(e, sdpa_core::SdpaError::InsufficientMemory { .. } | sdpa_core::SdpaError::SizeOverflow { .. });
                prop_assert!(clean, "{e}");
            }
            return Ok(());
        }
        if lens.iter().sum::<u128>() <= 1 << 18 && rows * spec.shape.sk as u128 * (d + dv) as u128 <= 1 << 18 {
            let mut inputs = HostInputs::random(&spec, 9).unwrap();
            let out = reference_attention(&spec, &inputs).unwrap();
            prop_assert_eq!(out.o.len() as u128, rows * dv as u128);
            // Varlen batches have a backward; paged caches are refused with an error.
            let d_o = HostBuffer::random(DType::F32, lens[3] as usize, 10);
            let g = reference_backward(&spec, &inputs, &d_o);
            prop_assert_eq!(g.is_ok(), spec.ragged.as_ref().is_some_and(|r| r.pages.is_none()), "{:?}", g.err());
            if let (Some(t), Some((at, page))) = (inputs.block_table.as_mut(), corrupt) {
                if !t.is_empty() {
                    let i = at.index(t.len());
                    t[i] = page;
                    // Either the entry is unused or inside the pool (then it runs), or the check refuses it.
                    if inputs.check(&spec).is_ok() {
                        prop_assert!(reference_attention(&spec, &inputs).is_ok());
                    }
                }
            }
        }
    }
}
