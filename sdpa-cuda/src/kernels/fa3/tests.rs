//! Unit tests of `fa3`'s host side: head-dim classes, refusals (FP8 and the variant switch among them),
//! program names, the measurement switches, and the shared-memory count against fa3.cu's layout.

use super::*;
use sdpa_core::{ExplicitMask, MaskValues, Shape};

fn spec(d: usize, dv: usize, dtype: DType) -> AttentionSpec {
    AttentionSpec::new(Shape { b: 1, hq: 8, hkv: 2, sq: 300, sk: 500, d, dv }, dtype)
}

#[test]
fn head_dims_run_the_first_class_at_or_above_both() {
    let c = head_dim_class;
    assert_eq!(c(32, 32), Some((64, 64)));
    assert_eq!(c(64, 64), Some((64, 64)));
    assert_eq!(c(80, 80), Some((96, 96)));
    assert_eq!(c(96, 96), Some((96, 96)));
    assert_eq!(c(112, 112), Some((128, 128)));
    assert_eq!(c(160, 160), Some((160, 160)));
    assert_eq!(c(176, 176), Some((192, 192)));
    assert_eq!(c(192, 128), Some((192, 128)));
    assert_eq!(c(160, 128), Some((192, 128)));
    assert_eq!(c(136, 104), Some((192, 128)));
    assert_eq!(c(128, 192), Some((192, 192)));
    assert_eq!(c(64, 128), Some((128, 128)));
    assert_eq!(c(224, 224), Some((224, 224)));
    assert_eq!(c(240, 240), Some((256, 256)));
    assert_eq!(c(256, 128), Some((256, 256)));
    assert_eq!(c(256, 256), Some((256, 256)));
    for (d, dv) in [(36, 36), (64, 4), (264, 264), (0, 0)] {
        assert_eq!(c(d, dv), None, "{d}/{dv}");
    }
    // The narrow classes are stored as whole 64-column boxes, and take those widths' tiles.
    assert_eq!((stored(96), stored(160), stored(224), stored(64)), (128, 192, 256, 64));
    assert_eq!(tile_for(96, 96, false, 4096), tile_for(128, 128, false, 4096));
    assert_eq!(tile_for(160, 160, true, 4096), tile_for(192, 192, true, 4096));
    assert_eq!(tile_for(224, 224, false, 4096), tile_for(256, 256, false, 4096));
    // Class 64: three consumers without a mask, and with a causal one from 2k keys on.
    assert_eq!(tile_for(64, 64, false, 512).consumers, 3);
    assert_eq!(tile_for(64, 64, true, CAUSAL_64_THREE_FROM_KEYS - 1).consumers, 2);
    assert_eq!(tile_for(64, 64, true, CAUSAL_64_THREE_FROM_KEYS).consumers, 3);
    assert_eq!(tile_for(40, 40, true, 4096).consumers, 3);
    assert_eq!(tile_for(128, 128, true, 16384).consumers, 2);
    assert_eq!(table_tiles(64, 64, true).len(), 2);
}

#[test]
fn fa3_refuses_what_it_lacks_with_the_reason() {
    assert_eq!(refuses(&spec(128, 128, DType::BF16)), None);
    assert_eq!(refuses(&spec(64, 64, DType::F16).with_mask(Mask::CausalBottomRight)), None);
    for (d, dv) in [(96, 96), (256, 256), (192, 128), (64, 128), (40, 40), (8, 256)] {
        assert_eq!(refuses(&spec(d, dv, DType::BF16)), None, "{d}/{dv}");
    }
    for (d, dv) in [(36, 36), (64, 60), (264, 264), (128, 320), (0, 64)] {
        let why = refuses(&spec(d, dv, DType::BF16)).expect("refused");
        assert!(why.contains("head dims"), "{why}");
    }
    assert!(refuses(&spec(128, 128, DType::F32)).expect("refused").contains("f16, bf16 and f8e4m3"));
    let plain = spec(64, 64, DType::BF16);
    let explicit = plain.clone().with_mask(Mask::Explicit(ExplicitMask::full(MaskValues::Boolean, &plain.shape)));
    assert!(refuses(&explicit).expect("refused").contains("explicit"));
    assert!(refuses(&plain.with_scale(-1.0)).expect("refused").contains("positive scale"));
}

/// Windows, softcap and ALiBi: taken for f16, bf16 and f8e4m3 (at FP8's head dims; FP8 behind its verification
/// switch, refused naming it without); what fa3 lacks besides stays refused.
#[test]
fn variants_are_taken_for_every_dtype() {
    use sdpa_core::variants::{Alibi, Diagonal, Window};
    let plain = spec(128, 128, DType::BF16);
    let cases = [
        plain.clone().with_window(Window::left(64)),
        plain.clone().with_window(Window { left: Some(32), right: Some(32) }).with_diagonal(Diagonal::TopLeft),
        plain.clone().with_mask(Mask::CausalBottomRight).with_window(Window::left(100)),
        plain.clone().with_softcap(30.0),
        plain.clone().with_alibi(Alibi::Standard).with_diagonal(Diagonal::BottomRight),
        plain.clone().with_mask(Mask::CausalTopLeft).with_alibi(Alibi::Standard).with_softcap(50.0),
    ];
    for v in &cases {
        assert_eq!(refuses(v), None, "{}", v.variants.label(v.diagonal()));
        let f16 = AttentionSpec { dtype: DType::F16, ..v.clone() };
        assert_eq!(refuses(&f16), None);
        let fp8 = AttentionSpec { dtype: DType::F8E4M3, ..v.clone() };
        match refuses(&fp8) {
            None => assert!(fp8_variants_enabled(), "taken without {FP8_VARIANTS_SWITCH}=1"),
            Some(why) => assert!(!fp8_variants_enabled() && why.contains(FP8_VARIANTS_SWITCH), "{why}"),
        }
    }
    // FP8's head dims still bound it: D = 120 is no multiple of 16.
    let odd =
        AttentionSpec { dtype: DType::F8E4M3, shape: Shape { d: 120, dv: 120, ..cases[3].shape }, ..cases[3].clone() };
    assert!(refuses(&odd).expect("refused").contains("multiples of 16"));
    let explicit = plain.clone().with_mask(Mask::Explicit(ExplicitMask::full(MaskValues::Boolean, &plain.shape)));
    let explicit = explicit.with_window(Window::left(8));
    assert!(refuses(&explicit).expect("refused").contains("explicit"));
    assert!(refuses(&cases[0].clone().with_scale(-1.0)).expect("refused").contains("positive"));
    // Sq + Sk within the kernel's 32-bit band arithmetic.
    let long = |sq: usize, sk: usize| {
        AttentionSpec::new(Shape { b: 1, hq: 1, hkv: 1, sq, sk, d: 128, dv: 128 }, DType::BF16)
            .with_mask(Mask::CausalBottomRight)
            .with_window(Window::left(4096))
    };
    assert_eq!(refuses(&long(1 << 20, VARIANT_MAX_TOKENS - (1 << 20) - 1)), None);
    let why = refuses(&long(1 << 20, VARIANT_MAX_TOKENS - (1 << 20))).expect("refused");
    assert!(why.contains("Sq + Sk below"), "{why}");
}

/// The host's softcap constants reproduce cap·tanh(scaled score / cap) in log2 units as the kernel
/// evaluates them (exactly here; the kernel's ex2 and rcp are approximate), and the parameter layout
/// keeps the tensor maps at byte 384 with them.
#[test]
fn softcap_constants_give_the_capped_score_in_log2_units() {
    assert_eq!(softcap_consts(0.0, 1.0), [0.0; 3]);
    for (cap, scale) in [(30.0f32, 0.125f32), (50.0, 0.088), (1.0, 1.0)] {
        let sl2 = scale * std::f32::consts::LOG2_E;
        let [kc, c1, c2] = softcap_consts(cap, sl2);
        for x in [-1e4f32, -40.0, -1.0, 0.0, 0.5, 3.0, 100.0, 1e4] {
            let got = c1 + c2 / (1.0 + (x * kc).exp2());
            let want = cap * (x * scale / cap).tanh() * std::f32::consts::LOG2_E;
            assert!((got - want).abs() <= 1e-4 * cap, "cap {cap} x {x}: {got} vs {want}");
        }
    }
    assert_eq!(std::mem::offset_of!(Fa3Args, q), 384);
    assert!(FA3.source.contains("float softcap_kc, softcap_c1, softcap_c2;"));
}

#[test]
fn variant_programs_are_named_by_their_variant_bits() {
    use crate::checked::params::VAR_BAND;
    let t = variant_tile_for(128, 128);
    assert_eq!(t, Fa3Tile { bn: 128, stages: 2, consumers: 2 });
    let p = variant_program(DType::BF16, (128, 128), t, VAR_BAND | VAR_SOFTCAP | VAR_ALIBI, true, false);
    assert_eq!(p.name, "fa3_t128x2_bf16_128_band_softcap_alibi");
    assert_eq!(
        p.instantiation,
        "FA3_ENTRY_VAR(fa3_t128x2_bf16_128_band_softcap_alibi, __nv_bfloat16, 128, 128, 128, 2, \
         FA3_VAR_BAND | FA3_VAR_SOFTCAP | FA3_VAR_ALIBI, true, 2, 0)"
    );
    let p = variant_program(DType::F16, (192, 128), variant_tile_for(192, 128), VAR_BAND, false, false);
    assert_eq!(p.name, "fa3_t128x2_f16_192_128_band_pp0");
    assert!(p.instantiation.ends_with(", 192, 128, 128, 2, FA3_VAR_BAND, false, 2, 0)"), "{}", p.instantiation);
    // The pre-pass's layout is FP8's alone (f16/bf16 entries ignore the flag).
    assert_eq!(variant_program(DType::BF16, (128, 128), t, VAR_BAND, true, true).name, "fa3_t128x2_bf16_128_band");
    let p =
        variant_program(DType::F8E4M3, (128, 128), fp8_variant_tile_for(128, 128), VAR_BAND | VAR_SOFTCAP, true, true);
    assert_eq!(p.name, "fa3_t128x2_f8e4m3_128_band_softcap_vtp");
    assert!(p.instantiation.ends_with(", FA3_VAR_BAND | FA3_VAR_SOFTCAP, true, 2, 1024)"), "{}", p.instantiation);
    // Every variant entry: two consumers (240 registers each), the tile fits, names unique and apart
    // from the plain ones; only the compile check's four are in `programs`.
    let all = variant_programs();
    assert_eq!(all.len(), 2 * FA3_CLASSES.len() * 4 + FA3_FP8_CLASSES.len() * 4 * 2);
    let mut names: Vec<&str> = all.iter().map(|p| p.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), all.len());
    assert!(all.iter().all(|p| p.name.contains("_band") && p.instantiation.starts_with("FA3_ENTRY_VAR(")));
    for (d, dv) in FA3_CLASSES {
        let t = variant_tile_for(d, dv);
        assert_eq!(t.consumers, 2);
        assert!(t.smem_bytes(d, dv) <= 227 * 1024, "{t:?} at {d}/{dv}");
    }
    for (d, dv) in FA3_FP8_CLASSES {
        let t = fp8_variant_tile_for(d, dv);
        assert_eq!(t, Fa3Tile { bn: 128, stages: 2, consumers: 2 });
        for staged in [false, true] {
            assert!(fp8_smem_bytes(t, d, dv, staged) <= 227 * 1024, "{t:?} at {d}/{dv}");
        }
    }
    let listed = programs();
    let check = compile_check_variant_programs();
    assert_eq!(check.len(), 4);
    assert!(check.iter().all(|p| all.contains(p) && listed.contains(p) && compile_check_programs().contains(p)));
    let dense_band = |p: &&Program| p.name.contains("_band") && !p.name.ends_with("_varlen");
    assert_eq!(listed.iter().filter(dense_band).count(), check.len());
    // The kernel side has the entry macro and the variant bits the names stand for.
    assert!(FA3.source.contains("#define FA3_ENTRY_VAR(NAME, T, D, DV, BN, ST, VAR, PP, NC, XO)"));
    assert!(FA3.source.contains("#define FA3_VAR_SOFTCAP 2\n") && FA3.source.contains("#define FA3_VAR_ALIBI 4\n"));
    assert_eq!((VAR_BAND, VAR_SOFTCAP, VAR_ALIBI), (1, 2, 4));
}

#[test]
fn fp8_runs_three_classes_and_refuses_the_rest_with_the_reason() {
    let c = fp8_head_dim_class;
    assert_eq!(c(32, 32), Some((64, 64)));
    assert_eq!(c(64, 64), Some((64, 64)));
    assert_eq!(c(96, 96), Some((128, 128)));
    assert_eq!(c(128, 128), Some((128, 128)));
    assert_eq!(c(192, 128), Some((256, 256)));
    assert_eq!(c(256, 256), Some((256, 256)));
    for (d, dv) in [(40, 40), (64, 72), (272, 272), (0, 64)] {
        assert_eq!(c(d, dv), None, "{d}/{dv}");
        let why = refuses(&spec(d, dv, DType::F8E4M3)).expect("refused");
        assert!(why.contains("multiples of 16"), "{why}");
    }
    assert_eq!(refuses(&spec(128, 128, DType::F8E4M3).with_mask(Mask::CausalTopLeft)), None);
    // Every class fits the H100's 227 KB with the FP8 tile; the programs are named by dtype.
    for (d, dv) in FA3_FP8_CLASSES {
        for staged in [true, false] {
            assert!(fp8_smem_bytes(FP8_TILE, d, dv, staged) <= 227 * 1024, "{d}/{dv}");
        }
    }
    // Q, K and Vᵀ, O's staging (2 KB per consumer warp), the barriers; the product adds two staged V tiles of one
    // 128-column box (16 KB each) and their barrier pairs, which the `vt-prepass` switch has not.
    let staging = 8 * 2048;
    let prepass = 2 * 64 * 128 + 2 * 128 * (128 + 64) + staging + 8 * 12 + 20 * SCHED_RING;
    assert_eq!(fp8_smem_bytes(FP8_TILE, 64, 64, false), prepass);
    assert_eq!(fp8_smem_bytes(FP8_TILE, 64, 64, true), prepass + 2 * 16384 + 8 * 4);
    // At 256 one staged tile (32 KB) fits beside O's staging, two do not.
    assert_eq!(fp8_v_staging(FP8_TILE, 128, 128, true), (2, 16384));
    assert_eq!(fp8_v_staging(FP8_TILE, 256, 256, true), (1, 32768));
    assert_eq!(fp8_v_staging(FP8_TILE, 256, 256, false), (0, 0));
    assert_eq!(fp8_tile_for(64, 64, false).consumers, 3);
    assert_eq!(fp8_tile_for(64, 64, true).consumers, 2);
    assert_eq!(fp8_tile_for(128, 128, false), FP8_TILE);
    assert!(fp8_smem_bytes(fp8_tile_for(64, 64, false), 64, 64, true) <= 227 * 1024);
    // A 3-deep ring at 256 fits only without the staging (a forced tile the planner refuses by its size).
    assert!(fp8_smem_bytes(Fa3Tile { stages: 3, ..FP8_TILE }, 256, 256, false) <= 227 * 1024);
    assert!(fp8_smem_bytes(Fa3Tile { stages: 3, ..FP8_TILE }, 256, 256, true) > 227 * 1024);
    let p = program(DType::F8E4M3, (128, 128), FP8_TILE, MASK_CAUSAL, true);
    assert_eq!(p.name, "fa3_t128x2_f8e4m3_128_causal");
    assert!(p.instantiation.contains("sdpa_e4m3, 128, 128, 128, 2, FA3_MASK_CAUSAL, true, 2)"), "{}", p.instantiation);
    assert_eq!(fp8_programs().len(), 13);
    let long = fp8_programs().into_iter().filter(|p| p.name.ends_with("_vtp")).count();
    assert_eq!(long, 6, "each class and mask also reads the pre-pass's Vᵀ (long calls)");
    assert_eq!(vt_keys(1), 16);
    assert_eq!(vt_keys(32), 32);
    assert_eq!(vt_keys(33), 48);
}

/// FP8's layout by how many work tiles transpose each V tile (the group's query heads times Sq in 128-row
/// tiles): in the kernel up to 16 at the classes 64 and 128 (Sq = 2048 without GQA) and 8 at 256 (Sq = 1024),
/// as measured in session 23; the pre-pass's Vᵀ past them, except for calls the pre-pass cannot run. Decoding
/// takes the kernel's transpose at any Sk; GQA counts the group's heads.
#[test]
fn fp8_transposes_v_in_the_kernel_where_few_work_tiles_share_a_v_tile() {
    use sdpa_core::variants::{Diagonal, Window};
    let at = |hq: usize, hkv: usize, sq: usize, sk: usize, d: usize| {
        AttentionSpec::new(Shape { b: 2, hq, hkv, sq, sk, d, dv: d }, DType::F8E4M3)
    };
    for (d, max) in [(64, 2048), (128, 2048), (256, 1024), (48, 2048), (200, 1024)] {
        assert!(fp8_transposes_in_kernel(&at(8, 8, max, max, d)), "{d} {max}");
        assert!(!fp8_transposes_in_kernel(&at(8, 8, max + 1, max + 1, d)), "{d} {max}");
        // Decoding and short queries over long caches, and a long query over few keys.
        assert!(fp8_transposes_in_kernel(&at(8, 8, 1, 100_000, d)), "{d}");
        assert!(fp8_transposes_in_kernel(&at(8, 8, 4, 100_000, d)), "{d}");
        assert!(!fp8_transposes_in_kernel(&at(8, 8, 16_384, 512, d)), "{d}");
    }
    // GQA 8: eight query heads share each V tile, so 256 query rows a head reach the class 128's 16.
    assert!(fp8_transposes_in_kernel(&at(64, 8, 256, 4096, 128)));
    assert!(!fp8_transposes_in_kernel(&at(64, 8, 257, 4096, 128)));
    assert_eq!(fp8_in_kernel_max_transposes(128), 16);
    assert_eq!(fp8_in_kernel_max_transposes(256), 8);
    // A window bounds the query tiles that load a key tile: rows k0 - hi ..= k0 + 127 - lo. A causal mask alone,
    // or a window open on one side, leaves every tile of Sq.
    let long = at(8, 8, 16_384, 16_384, 128);
    assert_eq!(query_tiles_per_key(&long), 128);
    assert_eq!(query_tiles_per_key(&long.clone().with_mask(Mask::CausalBottomRight)), 128);
    assert_eq!(query_tiles_per_key(&long.clone().with_window(Window { left: Some(100), right: None })), 128);
    let local = |left: usize| long.clone().with_mask(Mask::CausalBottomRight).with_window(Window::left(left));
    assert_eq!(query_tiles_per_key(&local(127)), 2); // rows k0 ..= k0 + 254
    assert_eq!(query_tiles_per_key(&local(128)), 2); // rows k0 ..= k0 + 255
    assert_eq!(query_tiles_per_key(&local(129)), 3);
    assert!(fp8_transposes_in_kernel(&local(1920))); // rows k0 ..= k0 + 2047: 16 tiles
    assert!(!fp8_transposes_in_kernel(&local(1921)));
    // A diagonal off the tiles' grid (Sk = Sq + 64, bottom-right): rows k0 - 64 ..= k0 + 190, three tiles.
    let shifted = at(8, 8, 16_384, 16_448, 128).with_mask(Mask::CausalBottomRight).with_window(Window::left(127));
    assert_eq!(query_tiles_per_key(&shifted), 3);
    let both = long.clone().with_window(Window { left: Some(64), right: Some(63) }).with_diagonal(Diagonal::TopLeft);
    assert_eq!(query_tiles_per_key(&both), 3); // rows k0 - 63 ..= k0 + 191

    // Against a count of the row tiles that load key tiles in the middle of a long call, for windows of both
    // sides and diagonals off the grid (lo, hi: visible key minus row).
    for (sk_extra, left, right) in [(0, 0, 0), (64, 127, 0), (5, 300, 17), (100, 1, 1), (0, 1000, 129), (77, 129, 250)]
    {
        let spec = at(1, 1, 16_384, 16_384 + sk_extra, 128)
            .with_window(Window { left: Some(left), right: Some(right) })
            .with_diagonal(Diagonal::BottomRight);
        let (lo, hi) = (sk_extra as i64 - left as i64, sk_extra as i64 + right as i64);
        let most = (40..60)
            .map(|t| {
                let k0 = 128 * t;
                let (first, last) = (k0 - hi, k0 + 127 - lo); // rows that see some key of the tile
                (last.div_euclid(128) - first.div_euclid(128) + 1) as usize
            })
            .max();
        assert_eq!(Some(query_tiles_per_key(&spec)), most, "{sk_extra} {left} {right}");
    }
    // Never more than Sq's own tiles; GQA multiplies.
    assert_eq!(query_tiles_per_key(&at(8, 8, 100, 16_384, 128).with_window(Window::left(4096))), 1);
    let gqa = at(64, 8, 16_384, 16_384, 128).with_mask(Mask::CausalBottomRight).with_window(Window::left(255));
    assert!(!fp8_transposes_in_kernel(&gqa)); // 3 tiles x 8 heads

    // Past the pre-pass's grid: in the kernel at any size.
    let many = AttentionSpec::new(
        Shape { b: 2, hq: 40_000, hkv: 40_000, sq: 16_384, sk: 16_384, d: 128, dv: 128 },
        DType::F8E4M3,
    );
    assert!(fp8_transposes_in_kernel(&many));
}

/// FP8 calls of more (batch, kv head) pairs than the pre-pass's grid holds: the pre-pass (the `vt-prepass`
/// switch) refuses them from `check`, before its workspace is allocated; the product, which transposes V in the
/// kernel, takes them, as bf16 does. (`tests/fa3_fp8.rs` runs one both ways on the GPU.)
#[test]
fn fp8_calls_past_the_pre_pass_grid_are_refused_by_the_pre_pass_only() {
    let at = |b: usize, hkv: usize| {
        let shape = Shape { b, hq: hkv, hkv, sq: 16, sk: 16, d: 64, dv: 64 };
        AttentionSpec::new(shape, DType::F8E4M3)
    };
    assert_eq!(refuses(&at(2, 40_000)), None);
    assert_eq!(prepass_refuses(&at(1, VT_MAX_BATCH_HEADS)), None);
    let why = prepass_refuses(&at(2, 40_000)).expect("refused");
    assert!(why.contains("65535") && why.contains("B = 2 x Hkv = 40000"), "{why}");
    let p = AttnParams::new(&at(2, 40_000), 256, 512, 768, 1024, 0, 0).expect("params");
    if std::env::var_os("SDPA_FA3_AB").is_none() {
        assert!(check(&at(2, 40_000), &p, (9, 0), 227 * 1024).is_ok());
    }
    let shape = Shape { b: 2, hq: 40_000, hkv: 40_000, sq: 16, sk: 16, d: 64, dv: 64 };
    assert_eq!(refuses(&AttentionSpec::new(shape, DType::BF16)), None);
}

#[test]
fn fp8_refusals_name_no_kernel_that_refuses_fp8() {
    let fp8 = spec(128, 128, DType::F8E4M3).with_descale(sdpa_core::Descale::uniform(0.5));
    let explicit = fp8.clone().with_mask(Mask::Explicit(ExplicitMask::full(MaskValues::Boolean, &fp8.shape)));
    let ragged = {
        let r = sdpa_core::Ragged::new(vec![100, 200], vec![200, 300]);
        let s = Shape { b: 2, sq: 200, sk: 300, ..fp8.shape };
        AttentionSpec { shape: s, ..fp8.clone() }.with_ragged(r, sdpa_core::Layout::Bshd)
    };
    let cases = [explicit, ragged];
    for s in &cases {
        let why = refuses(s).expect("refused");
        assert!(!why.contains("fa2 does") && !why.contains("splitkv do"), "{why}");
        assert!(why.contains("no other kernel takes f8e4m3"), "{why}");
    }
    // The device check: a GPU other than sm_90.
    let p = AttnParams::new(&fp8, 256, 512, 768, 1024, 0, 0).expect("params");
    let why = check(&fp8, &p, (8, 0), 227 * 1024).expect_err("not sm_90").to_string();
    assert!(!why.contains("use fa2") && why.contains("f8e4m3"), "{why}");
    // f16/bf16 calls are still sent to fa2.
    let bf16 = spec(128, 128, DType::BF16);
    let explicit = bf16.clone().with_mask(Mask::Explicit(ExplicitMask::full(MaskValues::Boolean, &bf16.shape)));
    assert!(refuses(&explicit).expect("refused").contains("fa2 does"));
    let p = AttnParams::new(&bf16, 256, 512, 768, 1024, 0, 0).expect("params");
    assert!(check(&bf16, &p, (8, 0), 227 * 1024).expect_err("not sm_90").to_string().contains("use fa2"));
}

/// `Fa3Smem<T, D, DV, BN, ST, NC>::BYTES` of fa3.cu, transcribed term by term from its definition (the
/// lines asserted below), for the entry `instantiation` (`FA3_ENTRY(name, T, D, DV, BN, ST, MASK, PP, NC)`),
/// with its static_asserts; `None` where one of them would fail to compile.
fn kernel_smem_bytes(instantiation: &str) -> Option<usize> {
    // FA3_ENTRY(NAME, T, D, DV, BN, ST, MASK, PP, NC), FA3_ENTRY_VAR(NAME, T, D, DV, BN, ST, VAR, PP, NC, XO) and
    // FA3_ENTRY_SERVE(NAME, T, D, DV, BN, ST, MASK, PP, NC, VAR, SERVE) put the layout's parameters at the
    // same places.
    let inner = instantiation
        .strip_prefix("FA3_ENTRY(")
        .or_else(|| instantiation.strip_prefix("FA3_ENTRY_VAR("))
        .or_else(|| instantiation.strip_prefix("FA3_ENTRY_XO("))
        .or_else(|| instantiation.strip_prefix("FA3_ENTRY_SERVE("))?
        .strip_suffix(')')?;
    let f: Vec<&str> = inner.split(", ").collect();
    let num = |i: usize| f.get(i).and_then(|x| x.parse::<usize>().ok());
    let (d, dv, bn, st, nc) = (num(2)?, num(3)?, num(4)?, num(5)?, num(8)?);
    let fp8 = *f.get(1)? == "sdpa_e4m3";
    // The tenth argument of FA3_ENTRY_XO and FA3_ENTRY_VAR: the switches (FA3_XO_VT_PREPASS = 1024: no staged V
    // tiles).
    let xo = if instantiation.starts_with("FA3_ENTRY_XO(") || instantiation.starts_with("FA3_ENTRY_VAR(") {
        num(9)?
    } else {
        0
    };
    let vt_staged = fp8 && xo & 1024 == 0;
    let es = if fp8 { 1 } else { 2 };
    let cols = 128 / es;
    let ds = d.div_ceil(cols) * cols;
    let dvs = if fp8 { dv } else { dv.div_ceil(64) * 64 };
    let (q_bytes, k_bytes, v_bytes) = (64 * ds * es, bn * ds * es, bn * dvs * es);
    let vs_bytes = if vt_staged { bn * 128 * dv.div_ceil(128) } else { 0 };
    let vs_off = nc * q_bytes + st * k_bytes + st * v_bytes;
    let sv = if !vt_staged {
        0
    } else if vs_off + 2 * vs_bytes + 4 * nc * 2048 + 8 * (2 * nc + 4 * st + 4) + 20 * SCHED_RING <= 227 * 1024 {
        2
    } else {
        1
    };
    let tiles_end = vs_off + sv * vs_bytes;
    let o_stage_bytes = 4 * nc * 2048;
    let o_staged = tiles_end + o_stage_bytes + 8 * (2 * nc + 4 * st + 2 * sv) + 20 * SCHED_RING <= 227 * 1024;
    let bar_off = tiles_end + if o_staged { o_stage_bytes } else { 0 };
    let sched_bar_off = bar_off + 8 * (2 * nc + 4 * st + 2 * sv);
    let sched_off = sched_bar_off + 16 * SCHED_RING;
    let ok = d % 32 == 0 && dv % 32 == 0 && bn % 16 == 0 && bn <= 256;
    let aligned = k_bytes % 1024 == 0 && v_bytes % 1024 == 0 && (!fp8 || bn == 128);
    (ok && aligned).then_some(sched_off + 4 * SCHED_RING)
}

/// Every entry the planner can launch (the table's tiles and FP8's, each class, mask and dtype; the forced
/// tiles a tuning run may ask for) gets the shared memory the kernel lays out: the host's count equals
/// `Fa3Smem::BYTES` recomputed from fa3.cu's definition, which the static_asserts accept, within the
/// H100's 227 KB where the planner launches it. (The merge of FP8 once left the work-tile ring out of
/// the host's count; the kernel then wrote past its shared memory.)
#[test]
fn host_shared_memory_equals_the_kernel_layout_for_every_entry() {
    for line in [
        "static constexpr int DS = (D + COLS - 1) / COLS * COLS;",
        "static constexpr int DVS = Fa3Elem<T>::FP8 ? DV : (DV + 63) / 64 * 64;",
        "static constexpr int Q_BYTES = 64 * DS * ES;",
        "static constexpr int K_BYTES = BN * DS * ES;",
        "static constexpr int V_BYTES = BN * DVS * ES;",
        "static constexpr bool VT_STAGED = Fa3Elem<T>::FP8 && (XO & FA3_XO_VT_PREPASS) == 0;",
        "#define FA3_XO_VT_PREPASS 1024",
        "static constexpr int VS_BYTES = VT_STAGED ? BN * 128 * ((DV + 127) / 128) : 0;",
        "static constexpr int VS_OFF = V_OFF + ST * V_BYTES;",
        ": VS_OFF + 2 * VS_BYTES + 4 * NC * 2048 + 8 * (2 * NC + 4 * ST + 4) + 20 * FA3_SCHED <=",
        "static constexpr int TILES_END = VS_OFF + SV * VS_BYTES;",
        "static constexpr int O_STAGE_BYTES = 4 * NC * 2048;",
        "TILES_END + O_STAGE_BYTES + 8 * (2 * NC + 4 * ST + 2 * SV) + 20 * FA3_SCHED <= FA3_SMEM_LIMIT;",
        "static constexpr int O_OFF = TILES_END;",
        "static constexpr int BAR_OFF = O_OFF + (O_STAGED ? O_STAGE_BYTES : 0);",
        "#define FA3_SMEM_LIMIT (227 * 1024)",
        "static constexpr int SCHED_BAR_OFF = BAR_OFF + 8 * (2 * NC + 4 * ST + 2 * SV);",
        "static constexpr int SCHED_OFF = SCHED_BAR_OFF + 16 * FA3_SCHED;",
        "static constexpr int BYTES = SCHED_OFF + 4 * FA3_SCHED;",
    ] {
        assert!(FA3.source.contains(line), "fa3.cu's Fa3Smem changed ({line}): update kernel_smem_bytes");
    }
    let host = |p: &Program, tile: Fa3Tile, (d, dv): (usize, usize), fp8: bool| {
        let kernel = kernel_smem_bytes(&p.instantiation).unwrap_or_else(|| panic!("{} does not compile", p.name));
        // FA3_XO_VT_PREPASS (1024) among the entry's measurement switches: no staged V tiles.
        let inst = &p.instantiation;
        let xo = inst.strip_prefix("FA3_ENTRY_XO(").or_else(|| inst.strip_prefix("FA3_ENTRY_VAR(")).map_or(0, |x| {
            x.trim_end_matches(')').rsplit(", ").next().and_then(|v| v.parse::<u16>().ok()).expect("XO")
        });
        let staged = xo & 1024 == 0;
        let host = if fp8 { fp8_smem_bytes(tile, d, dv, staged) } else { tile.smem_bytes(d, dv) };
        assert_eq!(host, kernel, "{}", p.name);
        host
    };
    // Every listed program: each class, dtype, mask and table tile (with and without ping-pong), and FP8's.
    let mut n = 0;
    for p in programs().iter().filter(|p| p.name != vt_program().name) {
        let args = p.instantiation.trim_end_matches(')');
        // D, DV, BN, ST and NC by position (the sixth is the mask, or the variant bits).
        let f: Vec<Option<usize>> = args.split(", ").map(|x| x.parse().ok()).collect();
        let at = |i: usize| f.get(i).copied().flatten().unwrap_or_else(|| panic!("{}: {}", p.name, p.instantiation));
        let (d, dv, bn, stages, consumers) = (at(2), at(3), at(4), at(5), at(8));
        let tile = Fa3Tile { bn, stages, consumers };
        let fp8 = p.instantiation.contains("sdpa_e4m3");
        assert_eq!(fp8, p.name.contains("_f8e4m3_"), "{}", p.name);
        assert!(host(p, tile, (d, dv), fp8) <= 227 * 1024, "{}", p.name);
        n += 1;
    }
    assert_eq!(n, programs().len() - 1);
    // Forced tiles: the count agrees wherever the kernel compiles (the planner compares it with the
    // device's limit before launching).
    for class in FA3_CLASSES {
        for bn in [64, 80, 96, 112, 128, 176, 192] {
            for (stages, consumers) in [(1, 2), (2, 2), (3, 3), (4, 2), (4, 3), (2, 1), (3, 1)] {
                let tile = Fa3Tile { bn, stages, consumers };
                host(&program(DType::BF16, class, tile, MASK_CAUSAL, tile.pingpong(true)), tile, class, false);
            }
        }
    }
    for class in FA3_FP8_CLASSES {
        for (stages, consumers) in [(1, 2), (3, 2), (4, 3)] {
            let tile = Fa3Tile { stages, consumers, ..FP8_TILE };
            host(&program(DType::F8E4M3, class, tile, MASK_NONE, true), tile, class, true);
        }
    }
}

/// Regression: `SDPA_FA3_TILE` dropped the parts that were not numbers, so `128,x,2` ran 128 keys in two
/// stages instead of being refused.
#[test]
fn measurement_switches_name_their_entries_and_refuse_unknown_words() {
    assert_eq!(AbSwitches::parse("").expect("empty"), AbSwitches::default());
    let both = AbSwitches::parse("store16, tile-turns").expect("both");
    assert_eq!(both.bits(), 3);
    assert_eq!(AbSwitches::parse("tile-turns").expect("turns").bits(), 2);
    let err = AbSwitches::parse("store16,store4").expect_err("unknown").to_string();
    assert!(err.contains("`store4`") && err.contains("store16") && err.contains("tile-turns"), "{err}");
    let tile = tile_for(128, 128, false, 4096);
    let plain = program(DType::BF16, (128, 128), tile, MASK_NONE, true);
    let st = AbSwitches { store16: true, ..AbSwitches::default() };
    let m = measured_program(DType::BF16, (128, 128), tile, MASK_NONE, true, st);
    assert_eq!(m.name, format!("{}_xo1", plain.name));
    assert!(m.instantiation.starts_with("FA3_ENTRY_XO(") && m.instantiation.ends_with(", 1)"), "{}", m.instantiation);
    assert_eq!(
        measured_program(DType::BF16, (128, 128), tile, MASK_NONE, true, AbSwitches::default()).name,
        plain.name
    );
    assert!(FA3.source.contains("#define FA3_XO_STORE16 1\n#define FA3_XO_TILE_TURNS 2\n"), "bits changed");
    // exp-fma=k: k + 1 in bits 2-5, k = 0 (all on the MUFU) distinct from the product's share.
    assert_eq!(AbSwitches::parse("exp-fma=0").expect("k = 0").bits(), 1 << 2);
    let mixed = AbSwitches::parse("tile-turns,exp-fma=8").expect("k = 8");
    assert_eq!((mixed.bits(), mixed.exp_fma, mixed.touches_stores_or_turns()), (2 | (9 << 2), Some(8), true));
    assert!(!AbSwitches::parse("exp-fma=3").expect("k = 3").touches_stores_or_turns());
    for bad in ["exp-fma=9", "exp-fma=", "exp-fma=x", "exp-fma"] {
        let err = AbSwitches::parse(bad).expect_err(bad).to_string();
        assert!(err.contains(&format!("`{bad}`")), "{err}");
    }
    assert!(FA3.source.contains("#define FA3_XO_EXP_SHIFT 2\n"), "bits changed");
    let fold = AbSwitches::parse("desc-fold").expect("desc-fold");
    assert_eq!((fold.bits(), fold.touches_stores_or_turns()), (64, false));
    assert!(FA3.source.contains("#define FA3_XO_DESC_FOLD 64\n"), "bits changed");
    // Which calls take which switches: FP8 all but store16 / tile-turns; variant and ragged calls the layout
    // switches only.
    let none = AbSwitches::default();
    for (fp8, variant, ragged) in
        [(false, false, false), (true, false, false), (false, true, false), (false, false, true)]
    {
        assert!(none.check(fp8, variant, ragged).is_ok());
    }
    for sw in ["exp-fma=2", "desc-fold", "eager-max", "direct-o", "full-diag"] {
        let ab = AbSwitches::parse(sw).expect(sw);
        assert!(ab.check(false, false, false).is_ok() && ab.check(true, false, false).is_ok(), "{sw}");
        assert!(ab.check(false, true, false).is_err() && ab.check(false, false, true).is_err(), "{sw}");
    }
    for sw in ["store16", "tile-turns"] {
        let ab = AbSwitches::parse(sw).expect(sw);
        assert!(ab.check(false, false, false).is_ok(), "{sw}");
        let err = ab.check(true, false, false).expect_err(sw).to_string();
        assert!(err.contains("f16/bf16 inputs only"), "{err}");
    }
    // vt-prepass (bit 10, FA3_XO_VT_PREPASS): FP8's, a no-op that f16/bf16 calls accept; vt-kernel has no bit
    // (it keeps the pre-pass off); the two together are refused.
    let vt = AbSwitches::parse("vt-prepass").expect("vt-prepass");
    assert_eq!(vt.bits(), 1024);
    let vk = AbSwitches::parse("vt-kernel").expect("vt-kernel");
    assert_eq!(vk.bits(), 0);
    assert!(vk.check(true, false, false).is_ok() && vk.check(false, false, false).is_ok());
    let both = AbSwitches::parse("vt-kernel,vt-prepass").expect("parses");
    assert!(both.check(true, false, false).expect_err("opposite").to_string().contains("name one"));
    // The pre-pass's layout names its entry `_vtp`, not `_xo1024` (a product entry of long FP8 calls).
    let p = measured_program(DType::F8E4M3, (128, 128), FP8_TILE, MASK_CAUSAL, true, vt);
    assert!(p.name.ends_with("_causal_vtp") && p.instantiation.ends_with(", 1024)"), "{}", p.name);
    let both = AbSwitches { direct_o: true, ..vt };
    let p = measured_program(DType::F8E4M3, (128, 128), FP8_TILE, MASK_CAUSAL, true, both);
    assert!(p.name.ends_with("_vtp_xo256") && p.instantiation.ends_with(", 1280)"), "{}", p.name);
    assert!(FA3.source.contains("#define FA3_XO_VT_PREPASS 1024\n"), "bits changed");
    assert!(vt.check(true, false, false).is_ok() && vt.check(false, false, false).is_ok());
    // The layout switches reach FP8's variant entries (and pass f16/bf16 ones and ragged calls untouched); a
    // measurement switch does not.
    assert!(vt.check(true, true, false).is_ok() && vk.check(true, true, false).is_ok());
    assert!(vt.check(false, false, true).is_ok() && vk.check(false, true, true).is_ok());
    let direct_vt = AbSwitches { direct_o: true, ..vt };
    assert!(direct_vt.check(true, true, false).is_err() && direct_vt.check(false, false, true).is_err());
    let all = AbSwitches::parse("store16,tile-turns,exp-fma=8,desc-fold,eager-max,direct-o,full-diag").expect("all");
    assert_eq!(all.bits(), 1 | 2 | (9 << 2) | 64 | 128 | 256 | 512);
    assert!(FA3.source.contains("#define FA3_XO_FULL_DIAG 512\n"), "bits changed");
    assert!(FA3.source.contains("#define FA3_XO_EAGER_MAX 128\n"), "bits changed");
    assert_eq!(AbSwitches::parse("eager-max").expect("eager-max").bits(), 128);
    assert!(FA3.source.contains("#define FA3_XO_DIRECT_O 256\n"), "bits changed");
    let direct = AbSwitches::parse("direct-o").expect("direct-o");
    assert_eq!((direct.bits(), direct.touches_stores_or_turns()), (256, false));
    let m = measured_program(DType::BF16, (128, 128), tile, MASK_NONE, true, direct);
    assert!(m.name.ends_with("_xo256") && m.instantiation.ends_with(", 256)"), "{}", m.instantiation);
    // Every entry takes the slack (the variant ones since session 20); only the switch brings back the eager rule.
    assert!(FA3.source.contains("constexpr bool EAGER = (XO & FA3_XO_EAGER_MAX) != 0;"));
    assert!(FA3.source.contains("#define FA3_ENTRY_XO(NAME, T, D, DV, BN, ST, MASK, PP, NC, XO)"));
}

#[test]
fn forced_tiles_refuse_parts_that_are_not_numbers() {
    assert_eq!(parse_tile("128, 2"), Some(Fa3Tile { bn: 128, stages: 2, consumers: 2 }));
    assert_eq!(parse_tile("64,4,3"), Some(Fa3Tile { bn: 64, stages: 4, consumers: 3 }));
    assert_eq!(parse_tile("128,2,1"), Some(Fa3Tile { bn: 128, stages: 2, consumers: 1 }));
    for bad in ["128,x,2", "x,128,2", "128,2,", "128", "100,2", "128,5", "128,2,4", "128,2,0", ""] {
        assert_eq!(parse_tile(bad), None, "{bad:?}");
    }
}

/// One consumer (`SDPA_FA3_TILE=bn,stages,1`): two blocks an SM where their shared memory fits (the class 64 at
/// 128 keys two deep, with O's staging), one where it does not (the class 128); no turns with one consumer,
/// and FP8 refuses it (its entries take turns).
#[test]
fn one_consumer_runs_two_blocks_an_sm_where_they_fit_and_takes_no_turns() {
    let one = Fa3Tile { bn: 128, stages: 2, consumers: 1 };
    let smem64 = one.smem_bytes(64, 64);
    assert!(smem64 < 100 * 1024, "{smem64}");
    assert_eq!(one.blocks_per_sm(smem64), 2);
    assert_eq!(one.blocks_per_sm(one.smem_bytes(128, 128)), 1);
    assert_eq!(one.rows(), 64);
    assert_eq!(one.threads(), 256);
    assert!(!one.pingpong(true) && !one.pingpong(false));
    let two = Fa3Tile { consumers: 2, ..one };
    assert_eq!(two.blocks_per_sm(two.smem_bytes(64, 64)), 1);
    assert!(two.pingpong(true));
    assert_eq!(one.prefix(), "fa3_t128x2w1");
    // The kernel caps such a launch at 128 registers a thread and hands the producer's to the consumer.
    assert!(FA3.source.contains("#define FA3_MIN_BLOCKS(NC) ((NC) == 1 ? 2 : 1)"));
    assert!(FA3.source.contains("fa3_regs_inc<NC == 2 ? 240 : NC == 3 ? 160 : 232>();"));
}

#[test]
fn the_grid_is_persistent_except_static_long_causal_calls() {
    // fa2bench at S = 16k (128 tiles per head): persistent without a mask, a block per tile with one.
    let st = Schedule::Static;
    assert_eq!(grid_blocks(2048, 128, false, st, 132), 132);
    assert_eq!(grid_blocks(2048, 128, true, st, 132), 2048);
    // Up to 8k (64 tiles per head): persistent both ways; never more blocks than tiles.
    assert_eq!(grid_blocks(2048, 64, true, st, 132), 132);
    assert_eq!(grid_blocks(40, 1, true, st, 132), 40);
    assert_eq!(grid_blocks(40, 1, false, st, 0), 1);
    // The dynamic schedule stays persistent: its blocks balance the causal tiles themselves.
    assert_eq!(grid_blocks(2048, 128, true, Schedule::Dynamic, 132), 132);
    assert_eq!(grid_blocks(40, 1, true, Schedule::Dynamic, 132), 40);
}

#[test]
fn programs_are_named_by_tile_dtype_head_dim_mask_and_turns() {
    let all = programs();
    // Per dtype: every class's table tiles with ping-pong, and again without it at 64 and 128.
    let tiles = |(d, dv): (usize, usize)| table_tiles(d, dv, false).len() + table_tiles(d, dv, true).len();
    let with_pp: usize = FA3_CLASSES.into_iter().map(tiles).sum();
    assert_eq!(
        all.len(),
        2 * (with_pp + tiles((64, 64)) + tiles((128, 128)))
            + fp8_programs().len()
            + compile_check_variant_programs().len()
            + compile_check_ragged_programs().len()
            + 1 // measured_check_program
    );
    assert!(compile_check_programs().iter().all(|p| all.contains(p)));
    let mut names: Vec<&str> = all.iter().map(|p| p.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), all.len(), "two programs share a name");
    let p = program(DType::F16, (64, 64), Fa3Tile { bn: 128, stages: 2, consumers: 2 }, MASK_NONE, false);
    assert_eq!(p.name, "fa3_t128x2_f16_64_none_pp0");
    assert_eq!(
        p.instantiation,
        "FA3_ENTRY(fa3_t128x2_f16_64_none_pp0, __half, 64, 64, 128, 2, FA3_MASK_NONE, false, 2)"
    );
    let p = program(DType::BF16, (64, 64), Fa3Tile { bn: 128, stages: 2, consumers: 3 }, MASK_CAUSAL, true);
    assert_eq!(p.name, "fa3_t128x2w3_bf16_64_causal");
    let p = program(DType::BF16, (192, 128), tile_for(192, 128, true, 4096), MASK_CAUSAL, true);
    assert_eq!(p.name, "fa3_t128x2_bf16_192_128_causal");
    assert!(p.instantiation.contains(", 192, 128, 128, 2, FA3_MASK_CAUSAL, true, 2)"), "{}", p.instantiation);
    // Every tile the table picks fits the H100's 227 KB of shared memory, and so do the deepest forced
    // tiles a tuning run tries.
    for (d, dv) in FA3_CLASSES {
        for causal in [false, true] {
            for t in table_tiles(d, dv, causal) {
                assert!(t.smem_bytes(d, dv) <= 227 * 1024, "{t:?} at D = {d}, Dv = {dv}");
                assert!(t.rows() == 64 * t.consumers && t.threads() <= 512);
            }
        }
    }
    assert!(Fa3Tile { bn: 192, stages: 2, consumers: 2 }.smem_bytes(128, 128) <= 227 * 1024);
    assert!(Fa3Tile { bn: 192, stages: 4, consumers: 3 }.smem_bytes(64, 64) <= 227 * 1024);
    // The wider tiles would not fit at 256 (why it takes 80 keys).
    assert!(Fa3Tile { bn: 96, stages: 2, consumers: 2 }.smem_bytes(256, 256) > 227 * 1024);
    assert!(FA3.source.contains("#define FA3_THREADS(NC) (128 * ((NC) + 1))"), "block shape changed");
    // The host's shared-memory sizes count the kernel's work-tile ring (`barrier_bytes`).
    assert!(FA3.source.contains(&format!("#define FA3_SCHED {SCHED_RING}\n")), "work-tile ring changed");
}

/// Ragged batches: f16/bf16, packed K/V or pages the key tile's boxes fit; other page sizes and f8e4m3 are
/// refused naming who takes the call, never silently.
#[test]
fn ragged_calls_are_taken_or_refused_with_who_takes_them() {
    use sdpa_core::{Layout, Ragged};
    let ragged = |dtype: DType, d: usize, page: Option<usize>| {
        let r = Ragged::new(vec![100, 0, 1], vec![200, 5, 0]);
        let r = match page {
            Some(ps) => r.paged(ps, 0),
            None => r,
        };
        let shape = Shape { b: 3, hq: 8, hkv: 2, sq: 100, sk: 200, d, dv: d };
        AttentionSpec::new(shape, dtype).with_mask(Mask::CausalBottomRight).with_ragged(r, Layout::Bshd)
    };
    for dtype in [DType::F16, DType::BF16] {
        for page in [None, Some(16), Some(64), Some(256), Some(8)] {
            assert_eq!(refuses_ragged(&ragged(dtype, 128, page)), None, "{page:?}");
        }
        // Pages no tile's boxes fit: not a multiple of 8, or neither dividing nor a multiple of 128 or 64.
        for page in [1, 7, 24, 100] {
            let why = refuses_ragged(&ragged(dtype, 128, Some(page))).expect("refused");
            assert!(why.contains("page size") && why.contains("fa2") && why.contains("splitkv"), "{why}");
        }
    }
    let fp8 = refuses_ragged(&ragged(DType::F8E4M3, 128, None)).expect("fp8");
    assert!(fp8.contains("f16 and bf16") && fp8.contains("no other kernel takes f8e4m3"), "{fp8}");
    assert_eq!(refuses_ragged(&spec(128, 128, DType::BF16)), None, "dense calls are not this rule's");
    // The packed rows' 32-bit coordinates.
    let big = Ragged::new(vec![1 << 30], vec![(1 << 30) + (1 << 29)]);
    let shape = Shape { b: 1, hq: 1, hkv: 1, sq: 1 << 30, sk: (1 << 30) + (1 << 29), d: 64, dv: 64 };
    let big = AttentionSpec::new(shape, DType::BF16).with_ragged(big, Layout::Bshd);
    assert!(refuses_ragged(&big).expect("too many rows").contains("32-bit"));
}

/// The key tile of a paged call: the ragged tile where its keys fit the pages, else 64 keys, else none; a
/// box is min(keys per tile, page size) keys, whole 8-row swizzle atoms within one page.
#[test]
fn paged_calls_take_a_key_tile_their_pages_fit() {
    let at =
        |class: (usize, usize), ps: usize| paged_tile(ragged_tile_for(class.0, class.1, true, 1), ps).map(|t| t.bn);
    // 128 keys at 64..192/128: pages of 8..128 divide it, 256 and 512 are multiples.
    for ps in [8, 16, 32, 64, 128, 256, 512] {
        assert_eq!(at((128, 128), ps), Some(128), "{ps}");
    }
    // 112 keys at 192/192 and 80 at 256: 8 and 16 divide them; 32, 64 and 256 go to 64 keys.
    for class in [(192, 192), (256, 256)] {
        let bn = ragged_tile_for(class.0, class.1, true, 1).bn;
        assert_eq!((at(class, 8), at(class, 16)), (Some(bn), Some(bn)));
        assert_eq!((at(class, 32), at(class, 64), at(class, 256)), (Some(64), Some(64), Some(64)));
        assert_eq!(at(class, 48), None);
    }
    for ps in [0, 1, 4, 7, 12, 24, 100] {
        assert_eq!(at((128, 128), ps), None, "{ps}");
    }
    for bn in [64, 80, 112, 128] {
        for ps in 1..=600 {
            if pages_fit(bn, ps) {
                let boxr = bn.min(ps);
                assert!(boxr.is_multiple_of(8) && bn.is_multiple_of(boxr) && ps.is_multiple_of(boxr), "{bn} {ps}");
            }
        }
    }
}

/// Regression: `ragged_programs` (what `SDPA_NVRTC_ALL=1` compiles) left out the 64-key paged entries at
/// the 128-key classes, which `paged_tile` picks for pages of 192 slots (the multiple of 64 up to
/// `MAX_PAGE_SIZE` that neither divides 128 nor is a multiple of it). Every paged entry a launch can ask for is
/// listed: each class, masking and page size up to 1024 (past `MAX_PAGE_SIZE`, which the spec's validation
/// refuses, too) that `paged_tile` fits, at the tile `check` picks.
#[test]
fn every_paged_entry_a_launch_picks_is_listed() {
    let every = ragged_programs();
    let mut fallbacks_at_128 = 0;
    for (d, dv) in FA3_CLASSES {
        for m in Masking::all().into_iter().filter(|m| m.kind != crate::checked::params::MASK_EXPLICIT) {
            let tile =
                if m.var != 0 { variant_tile_for(d, dv) } else { ragged_tile_for(d, dv, m.kind == MASK_CAUSAL, 1) };
            for ps in 1..=1024 {
                let Some(t) = paged_tile(tile, ps) else { continue };
                fallbacks_at_128 += usize::from(tile.bn == 128 && t.bn == 64);
                for dtype in [DType::F16, DType::BF16] {
                    let p = serve_program(dtype, (d, dv), t, m, true, true);
                    assert!(every.contains(&p), "page size {ps}: {} not listed", p.name);
                }
            }
        }
    }
    assert!(fallbacks_at_128 > 0, "some page sizes take 64 keys at the 128-key classes (192)");
    assert_eq!(paged_tile(ragged_tile_for(128, 128, true, 1), 192).map(|t| t.bn), Some(64));
}

/// The ragged entries: names end `_varlen` or `_paged` after the masking, the instantiation is
/// `FA3_ENTRY_SERVE` in that mode, two consumers everywhere; the compile check's are among them, all names
/// are unique.
#[test]
fn ragged_entries_are_named_and_instantiated_as_the_kernel_declares_them() {
    let causal = Masking { kind: MASK_CAUSAL, var: 0 };
    let tile = ragged_tile_for(128, 128, true, 1 << 20);
    let p = serve_program(DType::BF16, (128, 128), tile, causal, false, true);
    assert_eq!(p.name, "fa3_t128x2_bf16_128_causal_varlen");
    let line = "FA3_ENTRY_SERVE(fa3_t128x2_bf16_128_causal_varlen, __nv_bfloat16, 128, 128, 128, 2, FA3_MASK_CAUSAL, \
                true, 2, 0, FA3_SERVE_VARLEN)";
    assert!(p.instantiation.contains(line), "{}", p.instantiation);
    let paged = serve_program(DType::F16, (128, 128), tile, causal, true, true);
    assert_eq!(paged.name, "fa3_t128x2_f16_128_causal_paged");
    assert!(paged.instantiation.ends_with("FA3_SERVE_PAGED)"), "{}", paged.instantiation);
    let all = crate::checked::params::VAR_BAND | VAR_SOFTCAP | VAR_ALIBI;
    let v = serve_program(
        DType::F16,
        (192, 128),
        variant_tile_for(192, 128),
        Masking { kind: MASK_NONE, var: all },
        false,
        false,
    );
    assert_eq!(v.name, "fa3_t128x2_f16_192_128_band_softcap_alibi_varlen_pp0");
    assert!(v.instantiation.contains("FA3_MASK_NONE, false, 2, FA3_VAR_BAND | FA3_VAR_SOFTCAP | FA3_VAR_ALIBI,"));
    assert!(FA3.source.contains("#define FA3_ENTRY_SERVE(NAME, T, D, DV, BN, ST, MASK, PP, NC, VAR, SERVE)"));
    assert!(FA3.source.contains("#define FA3_SERVE_VARLEN 1\n") && FA3.source.contains("#define FA3_SERVE_PAGED 2\n"));
    // Three consumers at the class 64 for dense calls, two for ragged ones.
    assert_eq!(tile_for(64, 64, false, 1 << 20).consumers, 3);
    assert_eq!(ragged_tile_for(64, 64, false, 1 << 20).consumers, 2);
    let every = ragged_programs();
    // Per dtype, class and masking: packed, paged, and paged at 64 keys (no class's tile is 64 keys).
    assert!(FA3_CLASSES.iter().all(|&(d, dv)| ragged_tile_for(d, dv, false, 1).bn != 64));
    assert_eq!(every.len(), 2 * 6 * 3 * FA3_CLASSES.len());
    let mut names: Vec<&str> = every.iter().map(|p| p.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), every.len());
    assert!(every.iter().all(|p| p.name.ends_with("_varlen") || p.name.ends_with("_paged")));
    for p in compile_check_ragged_programs() {
        assert!(every.contains(&p) && programs().contains(&p) && compile_check_programs().contains(&p), "{}", p.name);
    }
}

/// O leaves through shared memory (fa3.cu `Fa3Smem::O_STAGED`, the consumers' epilogue) at the classes whose blocks have room
/// for it: 64, 96, 128 and MLA's 192/128 in f16/bf16, every FP8 class; the wider ones store from registers.
#[test]
fn o_is_staged_where_the_block_has_room() {
    for (d, dv) in FA3_CLASSES {
        for causal in [false, true] {
            for t in table_tiles(d, dv, causal) {
                let staged = o_staged(t.tile_bytes(d, dv), t, 0);
                assert_eq!(staged, dv <= 128, "{d}/{dv} {t:?}");
                assert!(t.smem_bytes(d, dv) <= SMEM_LIMIT, "{d}/{dv} {t:?}");
            }
        }
    }
    for (d, dv) in FA3_FP8_CLASSES {
        for causal in [false, true] {
            let t = fp8_tile_for(d, dv, causal);
            for staged in [true, false] {
                let slots = fp8_v_staging(t, d, dv, staged).0;
                assert!(o_staged(fp8_tile_bytes(t, d, dv, staged), t, slots), "FP8 {d}/{dv} {t:?} {staged}");
            }
        }
    }
}
