//! `fa2`'s pad-copy path (issue 21, `kernels/pad_copy.cu`): a dense f16/bf16 prefill call whose rows are not
//! 16-byte aligned (a head dim that is not a multiple of 8, or a misaligned view) copies Q, K and V once
//! into zero-filled scratch of `[B, H, S, D8]` (D8 = D rounded up to 8, likewise Dv8), runs `fa2` there on
//! whole 16-byte rows, and copies O's own Dv columns back into the caller's view. The narrow path (2-byte
//! copies inside the kernel) ran these calls at 0.17-0.22x of aligned `fa2` at the next multiple of 8
//! (`bench/results/gpu/headdims.md`); PyTorch pads the same way.
//!
//! What stays the caller's: the softmax scale (the parameters' `scale` and `scale_log2`, computed from the
//! call's own D, are carried over unchanged; zero columns add nothing to Q·Kᵀ), the mask and its strides,
//! the ALiBi slopes and the LSE (per row, written in place by the kernel). Which calls ([`pays`]): prefill
//! large enough that the copies cost at most what the narrow copies lose (which depends on their width:
//! 0.17-0.22x at 2-byte rows, 0.6x at 8-byte ones); decoding and `splitkv` keep the narrow path, as do
//! ragged and paged calls. Memory ([`fits`]): the scratch must leave headroom in what the device has
//! free, else, or if its allocation fails, the call runs the narrow path (never an error). The scratch is
//! stream-ordered pool memory, freed stream-ordered after the last copy, so repeated calls reuse the pool's
//! blocks; the device's kept scratch (`Device::kept_scratch`) is splitkv's (zeroed tail, one layout, the
//! device's stream only) and does not fit here. `SDPA_FA2_PAD_COPY=0` forces the narrow path, `=1` takes
//! this one for every call it can take whatever its size (tests and A/B timing).
//!
//! The backward's pad-copy path ([`super::bwd_pad`]) shares the pieces: [`round8`], [`pack`] (the scratch
//! parts), [`padded_params`], [`HEADROOM_BYTES`] and [`copy`] (2-byte rows, and 4-byte ones for its f32 dQ).

use super::fa2::{self, HeadDims, Serve};
use crate::checked::call::Call;
use crate::checked::launch::{launch, LaunchDims};
use crate::checked::params::AttnParams;
use crate::error::unsupported;
use crate::sys::modules::PAD_COPY;
use crate::sys::program::Program;
use cudarc::driver::{DevicePtr, DeviceRepr};
use sdpa_core::{DType, Result, Shape};

/// The environment variable that chooses the path: `0` narrow always, `1` pad-copy wherever it can run,
/// unset (or anything else) by [`pays`].
pub const ENV: &str = "SDPA_FA2_PAD_COPY";

/// The module, compiled whole (entries `pad_copy_2` and `pad_copy_4`: 2- and 4-byte elements, one warp per
/// row).
pub fn program() -> Program {
    Program::whole(&PAD_COPY)
}

/// What [`ENV`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// By [`pays`] (unset).
    Rule,
    /// Never (`0`).
    Off,
    /// Wherever the call can take it (`1`).
    Always,
}

impl Mode {
    /// The mode of [`ENV`]'s value.
    pub fn parse(v: Option<&str>) -> Mode {
        match v.map(str::trim) {
            Some("0") => Mode::Off,
            Some("1") => Mode::Always,
            _ => Mode::Rule,
        }
    }

    /// The mode the environment sets now (read per call, as `SDPA_FA2_TILE` is).
    pub fn from_env() -> Mode {
        Mode::parse(std::env::var(ENV).ok().as_deref())
    }
}

/// `x` rounded up to a multiple of 8 (a whole number of 16-byte chunks of 2-byte elements).
pub fn round8(x: usize) -> usize {
    x.div_ceil(8) * 8
}

/// The copy width (bytes) of the narrow path for `p`: the widest of 16, 8, 4 and 2 that divides every base
/// pointer, stride and row length of Q, K, V and O (`fa2_row_bytes` in kernels/fa2_mma.cuh, the same rule).
pub fn narrow_row_bytes(p: &AttnParams) -> usize {
    let mut x = p.q | p.k | p.v | p.o | (p.d as u64 * 2) | (p.dv as u64 * 2);
    for st in [p.q_stride, p.k_stride, p.v_stride, p.o_stride].iter().flatten() {
        x |= (*st as u64).wrapping_mul(2);
    }
    [16, 8, 4].into_iter().find(|&w| x.is_multiple_of(w as u64)).unwrap_or(2)
}

/// Time of the narrow path over aligned `fa2` at the next multiple of 8, by its copy width: measured on the
/// H100 (`bench/results/gpu/headdims.md`): 2-byte rows 4.5-5.9x at B = 4, H = 16, S = 4k and 4.9-6.1x at
/// B = 32, S = 512 causal (5 taken), 8-byte rows 1.6-1.7x (0.60-0.62x); 4-byte rows were not measured and
/// take a value between (2.5).
pub fn narrow_penalty(row_bytes: usize) -> f64 {
    match row_bytes {
        2 => 5.0,
        4 => 2.5,
        8 => 1.6,
        _ => 1.0,
    }
}

/// Time of one copied element over one element product of the aligned attention, measured on the H100 in
/// session 8's verification call (`bench/results/gpu/headdims.md`, pad-copy against fa2 at the next multiple
/// of 8, same run): the copies ran 194 G elements/s at D = 33 (B = 32, S = 512) and 383 G/s at D = 127 (4k),
/// the attention 85 and 160 T element products/s there: 438 and 418.
pub const COPY_FLOP_RATIO: f64 = 430.0;

/// Whether the copies pay for themselves. Per query head, the copies move `(Sq + Sk)·(D8 + Dv8)` elements
/// (Q and O per query, K and V per key; fewer under GQA, which the rule ignores) and the attention does
/// `Sq·keys·(cD + cDv)` element products at the class widths cD, cDv (the kernel computes the whole class),
/// `keys` the visible keys per query row on average (Sk without a mask, about half causal). Their time ratio
/// is about [`COPY_FLOP_RATIO`] times the element ratio; the pad-copy path saves `(penalty − 1)` times the
/// attention ([`narrow_penalty`] of the narrow copy width `row_bytes`); the rule takes it where the copies
/// cost at most that saving (both constants were measured; a first rule with half the saving as margin and
/// cheaper copies left B = 32, S = 512 causal at D = 65 and 127 on the narrow path, 2-5x slower than
/// padding). So decoding (a few query rows: copying a whole KV cache per step) never pays, prefill with
/// 2-byte rows pays from about 430 tokens causal at D = 127 (fewer at smaller D, whose class has more zero
/// columns), and 8-byte rows (a cheaper narrow path) need a few thousand tokens.
pub fn pays(sq: usize, sk: usize, keys: f64, d: usize, dv: usize, row_bytes: usize) -> bool {
    let Some((cd, cdv)) = fa2::head_dim_classes(d, dv) else { return false };
    if sq == 0 || sk == 0 || keys <= 0.0 {
        return false;
    }
    let copies = (sq as f64 + sk as f64) * (round8(d) + round8(dv)) as f64;
    let attention = sq as f64 * keys * (cd + cdv) as f64;
    COPY_FLOP_RATIO * copies / attention <= narrow_penalty(row_bytes) - 1.0
}

/// Visible keys per query row of `p` on average (its key band, `band_lo..=band_hi` around each row, clamped
/// to the keys), estimated from five rows spread over Sq: exact where the count is linear in the row (no
/// mask, causal without clamping), close enough for [`pays`] elsewhere.
pub fn mean_keys(p: &AttnParams) -> f64 {
    let (sq, sk) = (i64::from(p.sq.max(0)), i64::from(p.sk.max(0)));
    if sq == 0 {
        return 0.0;
    }
    let keys = |i: i64| {
        let lo = (i + i64::from(p.band_lo)).clamp(0, sk);
        let hi = (i + i64::from(p.band_hi) + 1).clamp(0, sk);
        (hi - lo).max(0) as f64
    };
    let rows = [0, sq / 4, sq / 2, 3 * sq / 4, sq - 1];
    rows.iter().map(|&i| keys(i)).sum::<f64>() / rows.len() as f64
}

/// Whether `call` runs the pad-copy path under `mode` (before the memory check): a dense f16/bf16 call
/// (ragged and paged ones keep the narrow path) whose rows are not 16-byte aligned, whose elements are
/// (every 2-byte element is, for the narrow path too), and that [`pays`] (or `mode` is [`Mode::Always`]).
pub fn wanted(call: &Call<'_>, mode: Mode) -> bool {
    let s = call.spec.shape;
    let p = &call.params;
    let candidate = matches!(call.spec.dtype, DType::F16 | DType::BF16)
        && Serve::of(call.spec) == Serve::Dense
        && !p.rows_16_byte_aligned(s.d, s.dv)
        && p.qkvo_aligned_2_bytes()
        && fa2::head_dim_classes(s.d, s.dv).is_some()
        && s.b > 0
        && s.hq > 0
        && s.sq > 0
        && s.sk > 0;
    candidate
        && match mode {
            Mode::Off => false,
            Mode::Always => true,
            Mode::Rule => pays(s.sq, s.sk, mean_keys(p), s.d, s.dv, narrow_row_bytes(p)),
        }
}

/// Elements of the scratch: offsets of padded Q, K, V and O in one buffer, and its length. Each part is a
/// multiple of 8 elements, so each starts 16-byte aligned after the allocation's own alignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scratch {
    /// Offsets of Q, K, V, O.
    pub at: [usize; 4],
    /// Total elements.
    pub len: usize,
}

/// Offsets of consecutive parts of `sizes` elements in one buffer, and the buffer's length; `None` when a
/// size (`None` itself: it overflowed) or the sum overflows. Parts that are multiples of 8 elements each
/// start 16-byte aligned after the allocation's own alignment.
pub fn pack<const N: usize>(sizes: [Option<usize>; N]) -> Option<([usize; N], usize)> {
    let mut at = [0; N];
    let mut len = 0usize;
    for (a, n) in at.iter_mut().zip(sizes) {
        *a = len;
        len = len.checked_add(n?)?;
    }
    Some((at, len))
}

/// Elements of one padded operand `[b, heads, rows, round8(cols)]` of `s`; `None` when it overflows.
pub fn part(s: &Shape, heads: usize, rows: usize, cols: usize) -> Option<usize> {
    s.b.checked_mul(heads)?.checked_mul(rows)?.checked_mul(round8(cols))
}

impl Scratch {
    /// The layout for `s`; `None` when its size overflows.
    pub fn of(s: &Shape) -> Option<Scratch> {
        let sizes = [
            part(s, s.hq, s.sq, s.d),
            part(s, s.hkv, s.sk, s.d),
            part(s, s.hkv, s.sk, s.dv),
            part(s, s.hq, s.sq, s.dv),
        ];
        let (at, len) = pack(sizes)?;
        Some(Scratch { at, len })
    }

    /// Bytes (2-byte elements).
    pub fn bytes(&self) -> u64 {
        (self.len as u64).saturating_mul(2)
    }
}

/// Free device memory the scratch leaves untouched: what the call's own launches, cuBLAS and other streams
/// may still need (the backend checked the operands before the call; this is on top of them).
pub const HEADROOM_BYTES: u64 = 256 << 20;

/// Whether scratch of `needed` bytes fits in `free` with [`HEADROOM_BYTES`] to spare.
pub fn fits(needed: u64, free: u64) -> bool {
    needed.checked_add(HEADROOM_BYTES).is_some_and(|n| n <= free)
}

/// Contiguous `[B, H, S, cols]` strides (batch, head, row), elements.
fn dense_strides(heads: usize, rows: usize, cols: usize) -> [i64; 3] {
    [(heads * rows * cols) as i64, (rows * cols) as i64, cols as i64]
}

/// The parameters of the padded call: the caller's (scale, mask, LSE, band, ALiBi, lengths) with Q, K, V
/// and O pointing into the scratch at `base`, contiguous strides and the padded head dims.
pub fn padded_params(p: &AttnParams, s: &Shape, layout: &Scratch, base: u64) -> AttnParams {
    let (d8, dv8) = (round8(s.d), round8(s.dv));
    let at = |i: usize| base + 2 * layout.at[i] as u64;
    AttnParams {
        q: at(0),
        k: at(1),
        v: at(2),
        o: at(3),
        q_stride: dense_strides(s.hq, s.sq, d8),
        k_stride: dense_strides(s.hkv, s.sk, d8),
        v_stride: dense_strides(s.hkv, s.sk, dv8),
        o_stride: dense_strides(s.hq, s.sq, dv8),
        d: d8 as i32,
        dv: dv8 as i32,
        ..*p
    }
}

/// The kernel's parameter: `PadCopyArgs<E>` in pad_copy.cu (strides in elements; the same layout for both
/// element widths).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct PadCopyArgs {
    src: u64,
    dst: u64,
    src_stride: [i64; 3],
    dst_stride: [i64; 3],
    rows: i64,
    h: i32,
    s: i32,
    n_src: i32,
    n_dst: i32,
}
const _: () = assert!(std::mem::size_of::<PadCopyArgs>() == 88);
// SAFETY: plain data with C layout matching the kernel's `PadCopyArgs`.
unsafe impl DeviceRepr for PadCopyArgs {}

/// One strided operand: base pointer and (batch, head, row) strides, elements.
#[derive(Debug, Clone, Copy)]
pub struct Rows {
    /// Device address of element (0, 0, 0, 0).
    pub ptr: u64,
    /// Batch, head and row strides, elements.
    pub stride: [i64; 3],
}

/// The element width a copy moves (raw bits, any dtype of that size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Width {
    /// f16, bf16 (`pad_copy_2`).
    Two,
    /// f32 (`pad_copy_4`: the backward's f32 dQ).
    Four,
}

/// Copies `[b, h, s]` rows of `n_src` columns from `src` to rows of `n_dst` columns at `dst`, zeros past
/// `n_src`, elements of `width`.
///
/// # Safety
/// Both views must address live device memory on the call's stream for every (batch < b, head < h,
/// row < s) and column below `n_src` (src) and `n_dst` (dst), with base pointers aligned to `width`.
pub unsafe fn copy(
    call: &Call<'_>,
    width: Width,
    src: Rows,
    dst: Rows,
    (b, h, s): (usize, usize, usize),
    n_src: usize,
    n_dst: usize,
) -> Result<()> {
    let rows = b.checked_mul(h).and_then(|x| x.checked_mul(s));
    let int = |v: usize| i32::try_from(v).map_err(|_| unsupported("pad-copy: a size exceeds i32"));
    let rows = rows.and_then(|t| i64::try_from(t).ok()).ok_or_else(|| unsupported("pad-copy: too many rows"))?;
    if rows == 0 || n_dst == 0 {
        return Ok(());
    }
    let args = PadCopyArgs {
        src: src.ptr,
        dst: dst.ptr,
        src_stride: src.stride,
        dst_stride: dst.stride,
        rows,
        h: int(h)?,
        s: int(s)?,
        n_src: int(n_src)?,
        n_dst: int(n_dst)?,
    };
    // One warp per row, 8 per block; enough blocks for several waves on any GPU, the grid-stride loop takes
    // the rest.
    let blocks = (rows as u64).div_ceil(8).clamp(1, 16384) as u32;
    let dims = LaunchDims { grid: (blocks, 1, 1), block: (256, 1, 1), smem_bytes: 0 };
    let entry = match width {
        Width::Two => "pad_copy_2",
        Width::Four => "pad_copy_4",
    };
    // SAFETY: the caller guarantees both views (see # Safety); each warp reads columns < n_src of one row
    // (batch < b, head < h, row < s) of `src` and writes columns < n_dst of the same row of `dst`.
    unsafe { launch(call.dev, call.stream, &program(), entry, dims, &args) }
}

/// The programs the pad-copy path launches for `call` (the copy and `fa2` at the padded head dims), or
/// `None` when it does not take the call under `mode` (warm-ups then compile the narrow plan).
pub fn programs_for(call: &Call<'_>, mode: Mode) -> Result<Option<Vec<Program>>> {
    if !wanted(call, mode) {
        return Ok(None);
    }
    let s = call.spec.shape;
    let plan = fa2::plan_at(call, padded_dims(&s)?)?;
    Ok(Some(vec![program(), plan.program]))
}

/// The aligned classes of the padded head dims (16-byte rows).
fn padded_dims(s: &Shape) -> Result<HeadDims> {
    HeadDims::of(round8(s.d), round8(s.dv))
        .ok_or_else(|| unsupported(format!("fa2 has no head-dim class for D = {}, Dv = {}", s.d, s.dv)))
}

/// Runs `call` through the padded scratch when it takes the path (see the module docs); `Ok(false)` when
/// it does not (not [`wanted`], or the scratch does not fit or cannot be allocated): the caller runs the
/// narrow path then.
pub fn run(call: &Call<'_>) -> Result<bool> {
    if !wanted(call, Mode::from_env()) {
        return Ok(false);
    }
    let s = call.spec.shape;
    let Some(layout) = Scratch::of(&s) else { return Ok(false) };
    // A failed query of free memory is no reason to fail the call: the narrow path needs nothing more.
    let Ok((free, _)) = call.dev.context().mem_get_info() else { return Ok(false) };
    if !fits(layout.bytes(), free as u64) {
        return Ok(false);
    }
    let plan = fa2::plan_at(call, padded_dims(&s)?)?;
    let Ok(buf) = call.scratch::<u16>(layout.len, "fa2 pad-copy scratch") else { return Ok(false) };
    // The guard orders the scratch's later reuse after this call's last copy; held until it is queued.
    let (base, guard) = buf.device_ptr(call.stream);
    let padded = padded_params(&call.params, &s, &layout, base);
    let p = &call.params;
    let (d8, dv8) = (round8(s.d), round8(s.dv));
    let from = |ptr, stride| Rows { ptr, stride };
    // SAFETY: the caller's views were checked by the backend against the validated spec (every strided
    // offset of [B, H, S, D] inside its buffer); the scratch holds [B, H, S, D8 or Dv8] of each operand
    // contiguously at `padded`'s pointers (Scratch::of), alive until `buf` drops after the last launch.
    unsafe {
        copy(call, Width::Two, from(p.q, p.q_stride), from(padded.q, padded.q_stride), (s.b, s.hq, s.sq), s.d, d8)?;
        copy(call, Width::Two, from(p.k, p.k_stride), from(padded.k, padded.k_stride), (s.b, s.hkv, s.sk), s.d, d8)?;
        copy(call, Width::Two, from(p.v, p.v_stride), from(padded.v, padded.v_stride), (s.b, s.hkv, s.sk), s.dv, dv8)?;
    }
    // Every row of padded Q, K, V written above (zeros past D and Dv), contiguous and 16-byte aligned.
    fa2::launch_dense(call, &plan, &padded)?;
    // SAFETY: as above; O's own Dv columns of each row go back, nothing else of the caller's view is written.
    unsafe {
        copy(call, Width::Two, from(padded.o, padded.o_stride), from(p.o, p.o_stride), (s.b, s.hq, s.sq), dv8, s.dv)?
    };
    drop(guard);
    drop(buf);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_takes_prefill_and_leaves_decoding_narrow() {
        let full = |_sq: usize, sk: usize| sk as f64;
        let causal = |sq: usize, sk: usize| sk as f64 - sq as f64 / 2.0;
        // Decoding: a few query rows against any cache never pays, whatever the copy width.
        for sk in [1, 128, 4096, 1 << 20] {
            for d in [1, 33, 100, 127, 255] {
                for w in [2, 4, 8] {
                    assert!(!pays(1, sk, full(1, sk), d, d, w), "Sq = 1, Sk = {sk}, D = {d}, {w}-byte rows");
                    assert!(!pays(8, sk, causal(8, sk), d, d, w), "Sq = 8, Sk = {sk}, D = {d}, {w}-byte rows");
                }
            }
        }
        // Long prefill on 2-byte rows pays at every odd head dim of issue 21, with unequal pairs, causal too.
        for d in [1, 3, 7, 33, 65, 127, 255] {
            assert!(pays(4096, 4096, causal(4096, 4096), d, d, 2), "D = {d}");
            assert!(pays(1024, 1024, causal(1024, 1024), d, d, 2), "D = {d}");
        }
        assert!(pays(2048, 2048, 2048.0, 190, 127, 2) && pays(2048, 2048, 2048.0, 65, 31, 2));
        // The boundary at D8 == class (127 -> 128), causal: 430 · 2S / (S · S/2) <= 4 from S = 430; the
        // measured B = 32, S = 512 causal point (pad-copy 2x faster than narrow) is inside.
        assert!(pays(430, 430, 215.0, 127, 127, 2) && !pays(429, 429, 214.5, 127, 127, 2));
        assert!(pays(512, 512, 256.0, 127, 127, 2) && pays(512, 512, 256.0, 65, 65, 2));
        // D = 33 copies 40 columns of a 64-wide class: pays from shorter calls (S = 269 causal).
        assert!(pays(512, 512, 256.0, 33, 33, 2) && !pays(256, 256, 128.0, 33, 33, 2));
        // 8-byte rows (D = 100) lose only 1.6x on the narrow path: 4k tokens pay, 512 do not.
        assert!(pays(4096, 4096, causal(4096, 4096), 100, 100, 8) && !pays(512, 512, 256.0, 100, 100, 8));
        // Issue 21's short test shapes stay narrow; so do empty calls, no visible key, head dims fa2 lacks,
        // and aligned rows (nothing to gain).
        assert!(!pays(77, 130, 130.0, 33, 33, 2) && !pays(130, 77, 77.0, 127, 127, 2));
        assert!(!pays(0, 4096, 1.0, 33, 33, 2) && !pays(4096, 0, 1.0, 33, 33, 2) && !pays(4096, 4096, 0.0, 33, 33, 2));
        assert!(!pays(4096, 4096, 4096.0, 300, 300, 2) && !pays(1 << 16, 1 << 16, 65536.0, 128, 128, 16));
    }

    #[test]
    fn the_narrow_width_and_the_mean_keys_follow_the_parameters() {
        use sdpa_core::{AttentionSpec, Mask, Window};
        let s = Shape { b: 1, hq: 2, hkv: 2, sq: 400, sk: 1000, d: 100, dv: 100 };
        let spec = AttentionSpec::new(s, DType::BF16);
        let p = |d| AttnParams::new(&AttentionSpec::new(Shape { d, dv: d, ..s }, DType::BF16), 0, 0, 0, 0, 0, 0);
        let width = |d| p(d).map(|p| narrow_row_bytes(&p)).ok();
        assert_eq!((width(128), width(100), width(66), width(33)), (Some(16), Some(8), Some(4), Some(2)));
        let mut q = p(128).expect("params");
        q.q = 2; // a base pointer off 4 bytes
        assert_eq!(narrow_row_bytes(&q), 2);
        let keys = |spec: &AttentionSpec| AttnParams::new(spec, 0, 0, 0, 0, 0, 0).map(|p| mean_keys(&p)).ok();
        assert_eq!(keys(&spec), Some(1000.0));
        // Bottom-right causal: row i sees 601 + i keys; the five rows average 601 + (0+100+200+300+399)/5.
        assert_eq!(keys(&spec.clone().with_mask(Mask::CausalBottomRight)), Some(601.0 + 999.0 / 5.0));
        // A window of 64 back (and the diagonal) on top-left causal: at most 65 keys a row.
        let w = spec.with_mask(Mask::CausalTopLeft).with_window(Window::left(64));
        assert!(keys(&w).is_some_and(|k| k <= 65.0 && k > 40.0), "{:?}", keys(&w));
    }

    #[test]
    fn the_variable_parses_to_a_mode() {
        assert_eq!(Mode::parse(None), Mode::Rule);
        assert_eq!(Mode::parse(Some("0")), Mode::Off);
        assert_eq!(Mode::parse(Some(" 1 ")), Mode::Always);
        assert_eq!(Mode::parse(Some("yes")), Mode::Rule);
    }

    #[test]
    fn scratch_parts_are_padded_contiguous_and_16_byte_aligned() {
        let s = Shape { b: 2, hq: 8, hkv: 2, sq: 77, sk: 130, d: 33, dv: 31 };
        let l = Scratch::of(&s).expect("fits");
        let (q, k, v, o) = (2 * 8 * 77 * 40, 2 * 2 * 130 * 40, 2 * 2 * 130 * 32, 2 * 8 * 77 * 32);
        assert_eq!(l.at, [0, q, q + k, q + k + v]);
        assert_eq!((l.len, l.bytes()), (q + k + v + o, 2 * (q + k + v + o) as u64));
        assert!(l.at.iter().all(|a| a % 8 == 0));
        let huge = Shape { b: usize::MAX / 2, ..s };
        assert_eq!(Scratch::of(&huge), None);
        // Memory: the scratch plus the headroom must be free.
        assert!(fits(1 << 30, (1 << 30) + HEADROOM_BYTES) && !fits(1 << 30, (1 << 30) + HEADROOM_BYTES - 1));
        assert!(!fits(u64::MAX, u64::MAX));
    }

    /// The padded call keeps the caller's scale (from D, never from D8), mask, LSE, band and lengths, and
    /// runs 16-byte rows at the padded head dims.
    #[test]
    fn the_padded_call_keeps_the_callers_scale_and_runs_aligned_rows() {
        use sdpa_core::{AttentionSpec, Mask};
        let s = Shape { b: 2, hq: 4, hkv: 2, sq: 300, sk: 400, d: 33, dv: 65 };
        let spec = AttentionSpec::new(s, DType::BF16).with_mask(Mask::CausalBottomRight);
        // A BSHD-like misaligned view of the caller.
        let p = AttnParams::new(&spec, 2, 4098, 8194, 12290, 0, 64).expect("params");
        assert!(!p.rows_16_byte_aligned(s.d, s.dv) && p.qkvo_aligned_2_bytes());
        let l = Scratch::of(&s).expect("fits");
        let q = padded_params(&p, &s, &l, 1 << 20);
        assert_eq!((q.scale, q.scale_log2), (p.scale, p.scale_log2));
        assert!((q.scale - 1.0 / 33f32.sqrt()).abs() < 1e-6, "scale {} is not 1/sqrt(33)", q.scale);
        assert_eq!((q.d, q.dv, q.lse, q.mask, q.causal_offset), (40, 72, 64, 0, 100));
        assert_eq!((q.band_lo, q.band_hi, q.sq, q.sk, q.hq, q.hkv), (p.band_lo, p.band_hi, 300, 400, 4, 2));
        assert_eq!(q.q_stride, [4 * 300 * 40, 300 * 40, 40]);
        assert_eq!(q.v_stride, [2 * 400 * 72, 400 * 72, 72]);
        assert_eq!(q.o, (1 << 20) + 2 * l.at[3] as u64);
        assert!(q.rows_16_byte_aligned(40, 72));
        assert_eq!(padded_dims(&s).map(|h| h.label()).ok(), Some("96p".into()));
        let exact = Shape { d: 127, dv: 127, ..s };
        assert_eq!(padded_dims(&exact).map(|h| h.label()).ok(), Some("128".into()));
    }
}
