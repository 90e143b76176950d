//! The case tables of issue 21's head dims that are not multiples of 8, shared by `odd_head_dims` (the
//! narrow copies) and `odd_head_dims_pad_copy` (the same cases through fa2's pad-copy path).

use super::Case;
use sdpa_core::{AttentionSpec, DType, ExplicitMask, F32Math, Kernel, Layout, Mask, MaskValues, Shape};

/// The head dims (Dv = D), then unequal pairs (the larger sets the class; 190/127 is the MLA class
/// pair 192/128).
pub fn head_dims() -> Vec<(usize, usize)> {
    let mut v: Vec<(usize, usize)> = [1, 3, 7, 33, 65, 100, 127, 130, 250, 255].map(|d| (d, d)).to_vec();
    v.extend([(65, 31), (33, 100), (127, 130), (250, 3), (1, 255), (190, 127)]);
    v
}

/// The 2-byte dtypes.
pub const HALF: [DType; 2] = [DType::F16, DType::BF16];

/// The masks of the `i`-th head-dim pair: none and causal in both alignments always, an explicit additive
/// mask on every third pair (each costs programs of its own).
pub fn masks_for(i: usize, shape: &Shape) -> Vec<Mask> {
    let mut m = vec![Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight];
    if i.is_multiple_of(3) {
        m.push(Mask::Explicit(ExplicitMask::full(MaskValues::Additive, shape)));
    }
    m
}

/// Every case of `kernel`: prefill shapes (lengths off every tile, Sq > Sk and Sq < Sk, GQA 2 and 4) for
/// `fa2` and `auto`, decoding shapes (a few query rows, keys split over blocks, GQA 4) for `splitkv` and
/// `auto`; both layouts; one dtype per pair, alternating, and both for the first two pairs and the last;
/// LSE on three cases of four.
pub fn cases(kernel: Kernel) -> Vec<Case> {
    let dims = head_dims();
    let mut out = Vec::new();
    for (i, &(d, dv)) in dims.iter().enumerate() {
        let s = |b, hq, hkv, sq, sk| Shape { b, hq, hkv, sq, sk, d, dv };
        let prefill = [s(2, 4, 2, 77, 130), s(1, 8, 2, 130, 77)];
        let decode = [s(2, 8, 2, 2, 3000)];
        let shapes: Vec<Shape> = match kernel {
            Kernel::Fa2 => prefill.to_vec(),
            Kernel::SplitKv => decode.to_vec(),
            _ => vec![prefill[0], decode[0]],
        };
        let dtypes: &[DType] = if i < 2 || i + 1 == dims.len() { &HALF } else { &HALF[i % 2..i % 2 + 1] };
        for shape in shapes {
            for mask in masks_for(i, &shape) {
                for layout in [Layout::Bhsd, Layout::Bshd] {
                    for &dtype in dtypes {
                        let lse = out.len() % 4 != 3;
                        out.push(Case { lse, ..Case::new(shape, dtype, mask, layout, kernel, F32Math::Exact) });
                    }
                }
            }
        }
    }
    out
}

/// `case`'s spec (BHSD) with every operand's rows `row` elements apart and its heads `step` elements more
/// than their rows apart, `step` the row stride's own alignment (so that the call's copy width stays the
/// row's): every head's base is off 16 bytes too.
pub fn misaligned(case: &Case, row: usize) -> AttentionSpec {
    let s = case.shape;
    let mut spec = case.spec();
    let step = 1usize << row.trailing_zeros().min(3);
    for (st, rows, heads) in [
        (&mut spec.q_strides, s.sq, s.hq),
        (&mut spec.k_strides, s.sk, s.hkv),
        (&mut spec.v_strides, s.sk, s.hkv),
        (&mut spec.o_strides, s.sq, s.hq),
    ] {
        st.s = row;
        st.h = row * rows + step;
        st.b = (row * rows + step) * heads + step;
    }
    spec
}
