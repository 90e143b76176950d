//! Arbitrary shapes, strides, masks, variants (windows, softcaps, ALiBi slopes), scales and dtypes -> `AttentionSpec::validate`, sizing and the cost
//! model; a spec that validates and is small also gets `HostInputs::random` and the f64 reference.
//!
//! Invariants: no panic, no abort. A validated spec's lengths, element counts and costs are computable
//! and finite, and its own buffer lengths pass `check_lengths`. A spec whose buffers could never exist
//! (more than `isize::MAX` bytes) gets an error from `HostInputs::random`, not a capacity-overflow panic
//! or an allocation abort. Specs between "small" and "impossible" are not allocated (the fuzzer would run
//! out of memory; refusing them before allocating is the memory-estimate work of issue 19).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use sdpa_core::{
    reference_attention, Alibi, AttentionCost, AttentionSpec, DType, Diagonal, ExplicitMask, HostInputs, Layout, Mask,
    MaskValues, Operand, Shape, Strides, Variants, Window,
};

/// A size: mostly small, sometimes at the edges of `usize`.
#[derive(Debug, Arbitrary)]
enum Dim {
    Small(u8),
    Pow2(u8),
    Near(u8),
    Any(u64),
}

impl Dim {
    fn get(&self) -> usize {
        match *self {
            Dim::Small(x) => x as usize % 24,
            Dim::Pow2(s) => 1usize.checked_shl(s as u32 % 64).unwrap_or(0),
            Dim::Near(k) => usize::MAX - (k as usize % 4),
            Dim::Any(x) => x as usize,
        }
    }
}

#[derive(Debug, Arbitrary)]
enum MaskIn {
    None,
    TopLeft,
    BottomRight,
    /// Each dim: 0 = broadcast (1), 1 = full, 2 = the given size.
    Explicit {
        additive: bool,
        how: [u8; 4],
        dims: [Dim; 4],
    },
}

#[derive(Debug, Arbitrary)]
struct Input {
    dims: [Dim; 7],
    dtype: u8,
    bshd: bool,
    mask: MaskIn,
    scale: Option<f64>,
    /// Replaces the strides of (Q, K, V, O) when present.
    strides: [Option<[Dim; 3]>; 4],
    seed: u64,
    variants: VariantsIn,
}

/// Variants with hostile values: any window sides, any cap (0, negative, NaN, infinite), slope lists of any
/// length and content, a diagonal or none.
#[derive(Debug, Arbitrary)]
struct VariantsIn {
    window: Option<(Option<Dim>, Option<Dim>)>,
    softcap: Option<f64>,
    /// `Some(None)`: the standard slopes.
    alibi: Option<Option<Vec<f32>>>,
    diagonal: Option<bool>,
}

impl VariantsIn {
    fn get(&self) -> Variants {
        Variants {
            window: self
                .window
                .as_ref()
                .map(|(l, r)| Window { left: l.as_ref().map(Dim::get), right: r.as_ref().map(Dim::get) }),
            softcap: self.softcap,
            alibi: self.alibi.as_ref().map(|s| s.clone().map_or(Alibi::Standard, Alibi::Slopes)),
            diagonal: self.diagonal.map(|br| if br { Diagonal::BottomRight } else { Diagonal::TopLeft }),
        }
    }
}

/// Bytes of host memory the target allows itself for one spec's inputs.
const SMALL_BYTES: u128 = 4 << 20;
/// Multiply-adds the target allows the reference for one spec.
const SMALL_WORK: u128 = 1 << 22;

fuzz_target!(|inp: Input| {
    let [b, hq, hkv, sq, sk, d, dv] = inp.dims.each_ref().map(Dim::get);
    let shape = Shape { b, hq, hkv, sq, sk, d, dv };
    let dtype = DType::ALL[inp.dtype as usize % 3];
    let mut spec = AttentionSpec::new(shape, dtype);
    if inp.bshd {
        spec = spec.with_layout(Layout::Bshd);
    }
    spec.mask = match &inp.mask {
        MaskIn::None => Mask::None,
        MaskIn::TopLeft => Mask::CausalTopLeft,
        MaskIn::BottomRight => Mask::CausalBottomRight,
        MaskIn::Explicit { additive, how, dims } => {
            let full = [b, hq, sq, sk];
            let mut m = [1usize; 4];
            for i in 0..4 {
                m[i] = match how[i] % 3 {
                    0 => 1,
                    1 => full[i],
                    _ => dims[i].get(),
                };
            }
            let values = if *additive { MaskValues::Additive } else { MaskValues::Boolean };
            Mask::Explicit(ExplicitMask { values, dims: m })
        }
    };
    spec.scale = inp.scale;
    spec.variants = inp.variants.get();
    for (op, st) in [Operand::Q, Operand::K, Operand::V, Operand::O].into_iter().zip(&inp.strides) {
        if let Some([sb, sh, ss]) = st {
            let s = Strides { b: sb.get(), h: sh.get(), s: ss.get() };
            match op {
                Operand::Q => spec.q_strides = s,
                Operand::K => spec.k_strides = s,
                Operand::V => spec.v_strides = s,
                Operand::O => spec.o_strides = s,
            }
        }
    }
    let _ = spec.layout();
    let _ = AttentionCost::of(&shape, &spec.mask, dtype);
    if spec.validate().is_err() {
        return;
    }

    // A validated spec can be sized and costed.
    let lens: Vec<usize> = [Operand::Q, Operand::K, Operand::V, Operand::O]
        .into_iter()
        .map(|op| {
            spec.numel(op).expect("a validated spec's element count");
            spec.required_len(op).expect("a validated spec's buffer length")
        })
        .collect();
    let lse = spec.lse_len().expect("a validated spec's lse length");
    let mask_len = match &spec.mask {
        Mask::Explicit(m) => Some(m.len().expect("a validated spec's mask length")),
        _ => None,
    };
    spec.check_lengths(lens[0], lens[1], lens[2], lens[3], mask_len).expect("its own lengths fit");
    let cost = AttentionCost::of_spec(&spec);
    assert!(cost.flops.is_finite() && cost.bytes.is_finite() && cost.flops >= 0.0, "{cost:?}");
    let band = spec.band();
    assert!(band.pairs(sq, sk) <= sq as u128 * sk as u128, "band pairs");
    for i in [0, sq / 2, sq - 1] {
        let r = band.range(i, sk);
        assert!(r.start <= r.end && r.end <= sk, "band range {r:?}");
    }
    assert!(spec.scale().is_finite() || spec.scale.is_none(), "scale");

    // Host bytes for the inputs: f32 staging for every operand, plus the mask as f32.
    let elems: u128 = lens[..3].iter().map(|&n| n as u128).sum::<u128>() + mask_len.unwrap_or(0) as u128;
    let bytes = elems * 4;
    let biggest = lens[..3].iter().chain(mask_len.iter()).map(|&n| n as u128 * 4).max().unwrap_or(0);
    let work = lse as u128 * sk as u128 * (d as u128 + dv as u128);
    if bytes <= SMALL_BYTES && work <= SMALL_WORK && lse as u128 * dv as u128 * 8 <= SMALL_BYTES {
        let inputs = HostInputs::random(&spec, inp.seed).expect("inputs for a small valid spec");
        inputs.check(&spec).expect("random inputs fit their spec");
        let out = reference_attention(&spec, &inputs).expect("the reference runs on a small valid spec");
        assert_eq!(out.o.len(), lse * dv, "reference output length");
        assert_eq!(out.lse.len(), lse, "reference lse length");
    } else if biggest > isize::MAX as u128 {
        // No such buffer can exist: an error, before anything is allocated.
        assert!(HostInputs::random(&spec, inp.seed).is_err(), "inputs for {shape} cannot exist");
    }
});
