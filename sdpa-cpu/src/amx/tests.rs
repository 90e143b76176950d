//! The AMX layout and item driver on the scalar model of the tile unit ([`super::tile::Emulated`]), so
//! they are proven on any CPU with AVX-512 and AVX512_BF16 (the softmax and the packing's instructions),
//! AMX or not. The real instructions are tested by `tests/amx.rs` and the reference suites on a machine
//! with AMX.

use super::kernel::{process_emulated, pv, scores, ALIGN};
use super::pack::{pack_k, pack_v};
use super::tile::{Emulated, TileUnit};
use crate::fa2::{all_row_tiles, Bf16Item, Item, Scratch, Sink, Tiles};
use crate::problem::{round_up, Problem};
use crate::simd::{x86, SimdPath};
use half::bf16;
use sdpa_core::check::check_output;
use sdpa_core::variants::{Alibi, Window};
use sdpa_core::{AttentionSpec, DType, F32Math, HostBuffer, HostInputs, HostOutput, Layout, Mask, Operand, Shape};

/// Whether this CPU runs the emulated kernel; prints why not.
fn can_run() -> bool {
    let ok = x86::avx512_supported() && x86::avx512bf16_supported();
    if !ok {
        eprintln!("skipped: the AMX kernel's softmax and packing need AVX-512 with AVX512_BF16");
    }
    ok
}

/// Deterministic values in [-1, 1), rounded to bf16.
fn values(n: usize, seed: u64) -> Vec<bf16> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            bf16::from_f32((x >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        })
        .collect()
}

/// Q·Kᵀ and P·V of one 32-row group through the packed layouts and the emulated `TDPBF16PS`, for head dims
/// and key counts that leave every kind of edge (odd dims, partial key tiles, pairs past a 16-block),
/// against the same products in f64.
#[test]
fn packed_layouts_multiply_like_f64() {
    if !can_run() {
        return;
    }
    for (d, dv, nk, bc) in
        [(64, 64, 64, 64), (40, 24, 37, 64), (128, 128, 96, 128), (33, 17, 5, 32), (256, 80, 130, 160)]
    {
        // SAFETY: AVX-512 with AVX512_BF16 is present (checked).
        let (s, o) = unsafe { products(d, dv, nk, bc) };
        let (q, k, v, p) = (values(32 * d, 1), values(nk * d, 2), values(nk * dv, 3), values(32 * nk, 4));
        let dvp = round_up(dv, ALIGN);
        for r in 0..32 {
            for j in 0..nk {
                let want: f64 = (0..d).map(|c| q[r * d + c].to_f64() * k[j * d + c].to_f64()).sum();
                let got = s[r * bc + j] as f64;
                assert!((got - want).abs() <= 1e-5 * (d as f64), "S d={d} nk={nk} r={r} j={j}: {got} vs {want}");
            }
            for c in 0..dv {
                let want: f64 = (0..nk).map(|j| p[r * nk + j].to_f64() * v[j * dv + c].to_f64()).sum();
                let got = o[r * dvp + c] as f64;
                assert!((got - want).abs() <= 1e-5 * (nk as f64), "O dv={dv} nk={nk} r={r} c={c}: {got} vs {want}");
            }
        }
    }
}

/// Packs the operands of [`packed_layouts_multiply_like_f64`] as the kernel does and multiplies them on the
/// emulated unit: the scores (32 rows of `bc`) and P·V (32 rows of `round_up(dv, 32)`).
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,avx512bf16")]
unsafe fn products(d: usize, dv: usize, nk: usize, bc: usize) -> (Vec<f32>, Vec<f32>) {
    let (dp, dvp, nkp) = (round_up(d, ALIGN), round_up(dv, ALIGN), round_up(nk, ALIGN));
    let (q, k, v, p) = (values(32 * d, 1), values(nk * d, 2), values(nk * dv, 3), values(32 * nk, 4));
    let bits = |x: &[bf16]| x.iter().map(|y| y.to_bits()).collect::<Vec<u16>>();
    let (k, v) = (bits(&k), bits(&v));
    let mut qb = vec![0u16; 32 * dp];
    let mut pb = vec![0u16; 32 * bc];
    for r in 0..32 {
        qb[r * dp..r * dp + d].copy_from_slice(&bits(&q[r * d..(r + 1) * d]));
        pb[r * bc..r * bc + nk].copy_from_slice(&bits(&p[r * nk..(r + 1) * nk]));
    }
    // Pad pairs and keys past nk hold garbage the kernel never lets through: NaN here would show a leak.
    let mut kb = vec![0u32; dp / 2 * bc];
    let mut vb = vec![0u32; bc / 2 * dvp];
    let (mut s, mut o) = (vec![0f32; 32 * bc], vec![0f32; 32 * dvp]);
    let mut u = Emulated::new();
    // SAFETY: every buffer is sized as the kernel's (`Buffers::new`) for these dims; AVX-512 F/BW/BF16 are
    // this function's features.
    unsafe {
        pack_k(k.as_ptr(), d, nk, d, kb.as_mut_ptr(), bc);
        pack_v(v.as_ptr(), dv, nk, dv, vb.as_mut_ptr(), dvp);
        for j in nk..bc {
            for kp in 0..d.div_ceil(2) {
                kb[kp * bc + j] = 0x7FC0_7FC0;
            }
        }
        u.configure();
        scores(&mut u, qb.as_mut_ptr(), dp, kb.as_mut_ptr(), bc, nkp, s.as_mut_ptr());
        pv(&mut u, pb.as_mut_ptr(), bc, vb.as_mut_ptr(), dvp, nkp, o.as_mut_ptr());
        u.release();
    }
    (s, o)
}

/// Runs a bf16 call through the AMX item driver on the emulated unit, items as `fa2` makes them, on
/// NaN-poisoned output and LSE.
fn run_emulated(spec: &AttentionSpec, inputs: &HostInputs, tiles: Tiles) -> HostOutput {
    let bf = |b: &HostBuffer| match b {
        HostBuffer::BF16(x) => x.clone(),
        _ => panic!("bf16 inputs"),
    };
    let (q, k, v) = (bf(&inputs.q), bf(&inputs.k), bf(&inputs.v));
    let mut o = vec![bf16::NAN; spec.required_len(Operand::O).expect("valid spec")];
    let mut lse = vec![f32::NAN; spec.lse_len().expect("valid spec")];
    {
        let ps =
            Problem::parts(spec, &q, &k, &v, inputs.mask.as_deref(), &mut o, Some(&mut lse), None).expect("valid spec");
        let mut scr = Scratch::new(SimdPath::Amx, tiles, spec.shape.d, spec.shape.dv, true, false);
        for (pi, b, kvh, r0, nr, _) in all_row_tiles(&ps, tiles.br) {
            let item = Item { pi, b, kvh, r0, nr, k_lo: 0, k_hi: ps[pi].sk, slot: 0 };
            for careful in [false, true] {
                // SAFETY: AVX-512 with AVX512_BF16 is present (the caller checked); the scratch is the AMX
                // path's for these tiles, whose key blocks are multiples of 32.
                let job = Bf16Item { p: &ps[pi], q: &q, k: &k, v: &v, tiles, item, sink: Sink::Output };
                if unsafe { process_emulated(job, &mut scr, careful) } {
                    break;
                }
            }
        }
    }
    HostOutput { o: HostBuffer::BF16(o), lse: Some(lse) }
}

fn check(spec: &AttentionSpec, inputs: &HostInputs, tiles: Tiles) {
    let out = run_emulated(spec, inputs, tiles);
    let rep = check_output(spec, inputs, &out, F32Math::Exact, None).expect("valid spec");
    assert!(rep.pass, "{} {:?} {:?} {tiles:?}: {rep:?}", spec.shape, spec.mask, spec.layout());
}

/// The whole item driver (packing, tiles, softmax, rescaling, row groups, key-block edges) against the f64
/// reference: awkward lengths and head dims, GQA, both layouts, every plain mask kind, the variants, and a
/// NaN in V under a masked key (the careful re-run).
#[test]
fn item_driver_matches_reference_on_emulated_tiles() {
    if !can_run() {
        return;
    }
    let mut gqa = Shape::new(1, 4, 45, 70, 40);
    gqa.hkv = 2;
    gqa.dv = 24;
    let shapes = [
        Shape::new(2, 1, 33, 97, 64),
        gqa,
        Shape::new(1, 2, 20, 130, 33),
        Shape::new(1, 1, 150, 600, 128),
        Shape::new(1, 1, 270, 530, 64),
    ];
    // The last two are the long key ranges' tiles (`fa2::amx_call_tiles`): several 256-key blocks, 4 and 8
    // row groups (the 256-row items taken with few threads for the work), both ending short.
    let tiles = [
        Tiles { br: 32, bc: 32 },
        Tiles { br: 64, bc: 64 },
        Tiles { br: 96, bc: 128 },
        Tiles { br: 128, bc: 256 },
        Tiles { br: 256, bc: 256 },
    ];
    for (n, shape) in shapes.into_iter().enumerate() {
        for layout in [Layout::Bshd, Layout::Bhsd] {
            for mask in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight] {
                let spec = AttentionSpec::new(shape, DType::BF16).with_layout(layout).with_mask(mask);
                let inputs = HostInputs::random(&spec, 5 + n as u64).expect("valid spec");
                check(&spec, &inputs, tiles[n]);
            }
        }
    }
    let base = AttentionSpec::new(Shape::new(1, 2, 50, 90, 64), DType::BF16).with_mask(Mask::CausalBottomRight);
    for spec in [
        base.clone().with_window(Window::left(20)),
        base.clone().with_softcap(5.0),
        base.clone().with_alibi(Alibi::Standard),
        AttentionSpec::new(Shape::new(1, 2, 40, 60, 64), DType::BF16).with_mask(Mask::Explicit(
            sdpa_core::ExplicitMask::full(sdpa_core::MaskValues::Boolean, &Shape::new(1, 2, 40, 60, 64)),
        )),
    ] {
        let inputs = HostInputs::random(&spec, 9).expect("valid spec");
        check(&spec, &inputs, Tiles { br: 64, bc: 32 });
    }
    // Scores of any magnitude (a near one-hot softmax whose tile maxima differ): the fused softmax forms its
    // exponent as (x·scale - max)·log2 e, exactly 0 at the maximum (one FMA's rounding grew with |max|).
    for scale in [1e4, 1e8, 1e9] {
        let spec = AttentionSpec::new(Shape::new(1, 2, 40, 300, 64), DType::BF16)
            .with_mask(Mask::CausalBottomRight)
            .with_scale(scale);
        let inputs = HostInputs::random(&spec, 13).expect("valid spec");
        check(&spec, &inputs, Tiles { br: 64, bc: 64 });
    }
    // A NaN in V at key 50: rows before it (causal) never see it and must stay exact.
    let spec = AttentionSpec::new(Shape::new(1, 1, 64, 64, 32), DType::BF16).with_mask(Mask::CausalTopLeft);
    let mut inputs = HostInputs::random(&spec, 11).expect("valid spec");
    if let HostBuffer::BF16(v) = &mut inputs.v {
        v[50 * 32 + 3] = bf16::NAN;
    }
    check(&spec, &inputs, Tiles { br: 64, bc: 64 });
}
