//! The backward pass on tensor cores (`kernels/bwd.cu`, FlashAttention-2's algorithm, f16/bf16 with f32
//! accumulation): dQ, dK and dV from Q, K, V, O, dO and the forward's LSE.
//!
//! Three launches per call: `_pre` (Delta = rowsum(dO o O) per row, into a workspace), the main kernel (one
//! block per key tile, kv head and sequence: K/V loaded once, the query tiles of the band walked for every
//! query head of the group, so dK/dV need no atomics; dQ added into an f32 workspace with atomics), and
//! `_convert` (dQ into the dtype through Q's strides, and into the caller's f32 dQ when asked). The
//! deterministic programs (`_det`) run the main kernel without dQ and then `_dq`, one block per query tile
//! that recomputes P and dS over its band's key tiles and keeps dQ in registers: nothing depends on the
//! order blocks run in, at the price of recomputing S and dP once more.
//!
//! Head dims run the forward's classes ([`HeadDims`]): multiples of 8 up to 256, each at the smallest class
//! at or above it, 192/128 natively. Every other head dim from 1 to 256 (D and Dv independent), and operands
//! whose rows are not whole 16-byte chunks starting 16-byte aligned (misaligned views), take the pad-copy
//! path ([`super::bwd_pad`], issue 21): Q, K, V, O and dO copied into zero-filled scratch with D and Dv
//! rounded up to 8, this backward run there, dQ, dK and dV's own columns copied back ([`run`] routes, by
//! [`aligned`]).
//!
//! Tiles ([`tile_for`]): classes up to 96 take 8 warps of 16 keys (128 keys per block), 64 query rows per
//! step, except D = 64, which takes 4 warps of 32 keys and 32 query rows
//! (two blocks per SM; measured faster); D = 128 takes FlashAttention-2's layout (8 warps: 4 along the keys, 32
//! each, times 2 splitting the queries of S and dP and the columns of dK and dV, P^T and dS^T through shared
//! memory; measured 1.05x the 8-warp tile); the classes above take 4 warps of 16 keys with 2 warps splitting
//! the dK/dV columns of each (64 keys per block), which keeps the accumulators in registers; all fit the
//! H100's shared memory with the next query tile in flight (about 178 KB at D = 128, 208 KB at D = 256).
//! `SDPA_BWD_TILE` forces another tile for tuning runs ([`forced_tile`]). Causal masks launch the main
//! kernel's grid heavy-first ([`Features::heavy_first`]).
//!
//! Refused here (`Unsupported`, [`refusal`]): f32 (no f32 backward on the GPU), paged KV caches (training has
//! no cache), head dims above 256, a non-positive scale, operands not aligned to their own elements, and
//! devices whose shared memory per block is smaller than the tile's; a pad-copy call whose scratch does not
//! fit the free device memory (`InsufficientMemory`) or overflows (`Unsupported`).

use super::pad_copy::{self, round8};
use crate::checked::call::Call;
use crate::checked::launch::{launch, LaunchDims};
use crate::checked::params::AttnParams;
use crate::error::unsupported;
use crate::sys::modules::BWD;
use crate::sys::program::{cuda_type, Program};
use cudarc::driver::{DevicePtr, DeviceRepr};
use sdpa_core::{AttentionSpec, DType, Mask, Result};

pub use super::fa2::HeadDims;
use super::fa2::HEAD_DIM_CLASSES;

/// The launch argument of every backward entry, mirrored by `struct BwdParams` in `kernels/bwd.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BwdParams {
    /// The forward's parameters: Q, K, V, O (`o`), mask, LSE (`lse`), strides, band, variants, ragged offsets.
    pub attn: AttnParams,
    /// dO (O's strides).
    pub d_o: u64,
    /// dQ (Q's strides).
    pub dq: u64,
    /// dK (K's strides).
    pub dk: u64,
    /// dV (V's strides).
    pub dv: u64,
    /// Delta per row (workspace; rows indexed as the LSE's).
    pub delta: u64,
    /// The f32 dQ accumulator `[rows][d]` (workspace of the atomic programs), 0 otherwise.
    pub dq_acc: u64,
    /// The caller's f32 dQ (Q's strides), 0 when not asked for.
    pub dq_f32: u64,
}

/// Size checked against `static_assert(sizeof(BwdParams) == 384)` in bwd.cu.
pub const BWD_PARAMS_SIZE: usize = 384;
const _: () = assert!(std::mem::size_of::<BwdParams>() == BWD_PARAMS_SIZE);

// SAFETY: plain-old-data with C layout and no padding (AttnParams is, and seven u64 follow; size asserted),
// the layout the kernels declare.
unsafe impl DeviceRepr for BwdParams {}

/// Tile of the main kernel: `bm` query rows per step, `kw` warps of `16 * mt` keys, `cw` warps splitting the
/// dK/dV columns of the same keys, `min_blocks` blocks per SM (`__launch_bounds__`). With `split`
/// (FlashAttention-2's layout) the `cw` warps of a key row also split the queries of S and dP, and P^T and dS^T
/// go through shared memory; without it each of them computes S and dP for all `bm` queries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BwdTile {
    /// Query rows per step.
    pub bm: usize,
    /// Warps along the keys.
    pub kw: usize,
    /// Warps along the dK/dV columns.
    pub cw: usize,
    /// m16 key tiles per warp (the block's key tile is `16 * mt * kw`).
    pub mt: usize,
    /// Blocks per SM the registers must allow.
    pub min_blocks: usize,
    /// S and dP split over the `cw` warps, P^T and dS^T through shared memory.
    pub split: bool,
}

impl BwdTile {
    /// Keys per block.
    pub fn bn(&self) -> usize {
        16 * self.kw * self.mt
    }

    /// Threads per block.
    pub fn threads(&self) -> usize {
        32 * self.kw * self.cw
    }

    /// Dynamic shared memory for classes `d`, `dv` (`BwdTile::SMEM` in bwd.cu): K, V, two Q and two dO
    /// buffers, dS^T (and P^T when split), two LSE and two Delta rows.
    pub fn smem_bytes(&self, d: usize, dv: usize) -> usize {
        let (bn, bm) = (self.bn(), self.bm);
        let s_tiles = if self.split { 2 } else { 1 };
        (bn * (d + 8) + bn * (dv + 8) + 2 * bm * (d + 8) + 2 * bm * (dv + 8) + s_tiles * bn * (bm + 8)) * 2
            + 2 * 2 * bm * 4
    }

    /// Whether the kernel's static asserts hold for classes `d`, `dv` (whole k16 steps and x4 column pairs
    /// per warp for dK/dV and dQ).
    pub fn fits(&self, d: usize, dv: usize) -> bool {
        let nw = self.kw * self.cw;
        let ok = |x: usize, by: usize| by > 0 && x.is_multiple_of(by);
        if !(ok(self.bm, 16) && ok(d, 16) && ok(dv, 16) && ok(d / self.cw.max(1), 16) && ok(dv / self.cw.max(1), 16))
            || nw == 0
            || self.mt == 0
            || nw > 16
            || (self.split && !ok(self.bm / self.cw.max(1), 16))
        {
            return false;
        }
        // BwdTile::QPAIR / QR / DQC.
        let pair = ok(self.bm, 32) && ok(nw, self.bm / 32) && ok(d / (nw / (self.bm / 32)), 16);
        let qr = self.bm / if pair { 32 } else { 16 };
        ok(nw, qr) && ok(d / (nw / qr), 16)
    }
}

/// Tile of the deterministic dQ kernel: `bm` query rows on `warps` warps, key tiles of `bn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DqTile {
    /// Query rows per block.
    pub bm: usize,
    /// Keys per tile.
    pub bn: usize,
    /// Warps.
    pub warps: usize,
}

impl DqTile {
    /// Dynamic shared memory: Q, dO, K, V.
    pub fn smem_bytes(&self, d: usize, dv: usize) -> usize {
        (self.bm * (d + 8) + self.bm * (dv + 8) + self.bn * (d + 8) + self.bn * (dv + 8)) * 2
    }
}

/// The tiles for head-dim class `d` (see the module docs). D = 64 takes 4 warps of 32 keys and 32 query rows per
/// step, two blocks per SM: each B fragment then serves two m16 key tiles, which measured 1.16x the 8-warp tile
/// of 16 keys per warp on the fa2bench grid (H100, `bench/studies/backward/README.md`; the split layout at
/// D = 64 measured 0.85x or less). At D = 128 the dK/dV accumulators of 32 keys and all of a tile's queries do
/// not fit the registers; the split layout (32 keys x 32 queries of S per warp, 32 keys x 64 columns of dK/dV)
/// does, and measured 1.05x the 8-warp tile of 16 keys.
pub fn tile_for(d: usize) -> (BwdTile, DqTile) {
    let t = |bm, kw, cw, mt, min_blocks| BwdTile { bm, kw, cw, mt, min_blocks, split: false };
    if d == 64 {
        (t(32, 4, 1, 2, 2), DqTile { bm: 64, bn: 64, warps: 4 })
    } else if d == 128 {
        (BwdTile { split: true, ..t(64, 4, 2, 2, 1) }, DqTile { bm: 64, bn: 64, warps: 4 })
    } else if d <= 128 {
        (t(64, 8, 1, 1, 1), DqTile { bm: 64, bn: 64, warps: 4 })
    } else {
        (t(64, 4, 2, 1, 1), DqTile { bm: 64, bn: 32, warps: 4 })
    }
}

/// The main kernel's tile `SDPA_BWD_TILE=[D:]bm,kw,cw,mt,min_blocks[,s]` forces on backward launches of
/// head-dim class `d`, for tuning runs (`examples/backward_timing.rs`): on every class, or only on class `D`
/// when the prefix is there; a trailing `s` asks for the split layout. Its programs are named
/// `bwd_tile{bm}x{kw}x{cw}x{mt}x{min_blocks}[s]_*` and compiled on first use. `None` when unset or meant for
/// another class; a value that is not a tile is an error.
pub fn forced_tile(d: usize) -> Result<Option<BwdTile>> {
    let Ok(v) = std::env::var("SDPA_BWD_TILE") else { return Ok(None) };
    let bad = || {
        unsupported(format!("SDPA_BWD_TILE must be [D:]bm,kw,cw,mt,min_blocks[,s] (e.g. 128:64,4,2,2,1,s), got {v:?}"))
    };
    let tile = match v.trim().split_once(':') {
        Some((only, tile)) => {
            if only.trim().parse::<usize>().map_err(|_| bad())? != d {
                return Ok(None);
            }
            tile
        }
        None => v.trim(),
    };
    let (nums, split) = match tile.strip_suffix(",s") {
        Some(head) => (head, true),
        None => (tile, false),
    };
    let n: Vec<usize> = nums.split(',').map(|x| x.trim().parse().map_err(|_| bad())).collect::<Result<_>>()?;
    let [bm, kw, cw, mt, min_blocks] = n[..] else { return Err(bad()) };
    if !(1..=4).contains(&min_blocks) {
        return Err(bad());
    }
    Ok(Some(BwdTile { bm, kw, cw, mt, min_blocks, split }))
}

/// The tiles a call with head-dim class `d` runs: [`forced_tile`] when set, else [`tile_for`]'s; and the
/// program-name prefix that goes with them.
fn tiles(d: usize) -> Result<(BwdTile, DqTile, String)> {
    let (t, q) = tile_for(d);
    Ok(match forced_tile(d)? {
        Some(f) => {
            let s = if f.split { "s" } else { "" };
            (f, q, format!("bwd_tile{}x{}x{}x{}x{}{s}", f.bm, f.kw, f.cw, f.mt, f.min_blocks))
        }
        None => (t, q, "bwd".to_string()),
    })
}

/// Score features a program compiles in: an explicit mask, softcap, ALiBi (causal masks and windows are the
/// band, tested at run time on the tiles that cross it), and the grid order of causal masks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Features {
    /// Explicit additive mask.
    pub explicit: bool,
    /// Logit softcap.
    pub softcap: bool,
    /// ALiBi.
    pub alibi: bool,
    /// The main kernel's grid heavy-first, (kv heads, sequences, key tiles): under a causal mask the first key
    /// tiles of every head see the most query rows, and starting them first keeps a heavy block from starting
    /// at the end of the launch. Causal masks (either alignment) take it unless `SDPA_BWD_HEAVY_FIRST=0` (for
    /// timing runs).
    pub heavy_first: bool,
}

impl Features {
    /// What a call needs.
    pub fn of(spec: &AttentionSpec) -> Features {
        Features {
            explicit: matches!(spec.mask, Mask::Explicit(_)),
            softcap: spec.softcap().is_some(),
            alibi: spec.variants.alibi.is_some(),
            heavy_first: matches!(spec.mask, Mask::CausalTopLeft | Mask::CausalBottomRight)
                && std::env::var("SDPA_BWD_HEAVY_FIRST").map_or(true, |v| v != "0"),
        }
    }

    /// All twelve (an explicit mask is never causal).
    pub fn all() -> Vec<Features> {
        (0..16)
            .map(|i| Features { explicit: i & 1 != 0, softcap: i & 2 != 0, alibi: i & 4 != 0, heavy_first: i & 8 != 0 })
            .filter(|f| !(f.explicit && f.heavy_first))
            .collect()
    }

    /// Entry-name part: `plain`, or the features joined (`explicit_softcap_alibi`, `softcap_hf`).
    fn label(&self) -> String {
        let names: Vec<&str> =
            [(self.explicit, "explicit"), (self.softcap, "softcap"), (self.alibi, "alibi"), (self.heavy_first, "hf")]
                .into_iter()
                .filter_map(|(on, n)| on.then_some(n))
                .collect();
        if names.is_empty() {
            "plain".into()
        } else {
            names.join("_")
        }
    }
}

/// The program `bwd_{dtype}_{head dims}_{features}[_det]`: the atomic program defines the entry of its name
/// plus `_pre` and `_convert`; the deterministic one its name plus `_pre` and `_dq`.
pub fn program(dtype: DType, dims: HeadDims, f: Features, deterministic: bool) -> Program {
    let (tile, q) = tile_for(dims.d);
    program_with("bwd", tile, q, dtype, dims, f, deterministic)
}

/// [`program`] with a given tile and name prefix.
fn program_with(
    prefix: &str,
    tile: BwdTile,
    q: DqTile,
    dtype: DType,
    dims: HeadDims,
    f: Features,
    deterministic: bool,
) -> Program {
    // Padded head dims run the same code (the kernels always read the call's columns only).
    let dims = HeadDims { pad: false, ..dims };
    let name =
        format!("{prefix}_{}_{}_{}{}", dtype.name(), dims.label(), f.label(), if deterministic { "_det" } else { "" });
    let (t, HeadDims { d, dv, .. }) = (cuda_type(dtype), dims);
    let BwdTile { bm, kw, cw, mt, min_blocks, split } = tile;
    let (e, s, a, hf) = (f.explicit, f.softcap, f.alibi, f.heavy_first);
    let args = format!("{name}, {t}, {d}, {dv}, {bm}, {kw}, {cw}, {mt}, {split}, {min_blocks}, {e}, {s}, {a}, {hf}");
    let line = if deterministic {
        format!("BWD_ENTRY_DET({args}, {}, {}, {})", q.bm, q.bn, q.warps)
    } else {
        format!("BWD_ENTRY({args})")
    };
    Program::entry(&BWD, name, line)
}

/// Every backward program: both dtypes, each class and class pair (exact and padded share a program: the
/// kernels always read the call's columns only), every feature set, atomic and deterministic.
pub fn programs() -> Vec<Program> {
    let mut all = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for d in HEAD_DIM_CLASSES {
            let pairs = super::fa2::DV_CLASS_PAIRS.iter().filter(|(pd, _)| *pd == d).map(|&(_, dv)| dv);
            for dv in std::iter::once(d).chain(pairs) {
                for f in Features::all() {
                    for det in [false, true] {
                        all.push(program(dtype, HeadDims { d, dv, pad: false }, f, det));
                    }
                }
            }
        }
    }
    all
}

/// The few backward programs the CI compile check builds: bf16 at 128 plain (atomic and deterministic), with
/// every feature, f16 at 64 with the heavy-first grid, and the big-class tile at 256 and 192/128.
pub fn compile_check_programs() -> Vec<Program> {
    let hd = |d, dv| HeadDims { d, dv, pad: false };
    let all = Features { explicit: true, softcap: true, alibi: true, heavy_first: false };
    let hf = Features { heavy_first: true, ..Features::default() };
    vec![
        program(DType::BF16, hd(128, 128), Features::default(), false),
        program(DType::BF16, hd(128, 128), Features::default(), true),
        program(DType::BF16, hd(128, 128), all, false),
        program(DType::F16, hd(64, 64), hf, false),
        program(DType::BF16, hd(256, 256), all, true),
        program(DType::BF16, hd(192, 128), Features::default(), false),
    ]
}

/// The classes the kernels run head dims `d`, `dv` at: those of D and Dv rounded up to 8 (the pad-copy
/// path's scratch widths, the call's own where they are multiples of 8); `None` above 256 or at 0.
pub fn padded_dims(d: usize, dv: usize) -> Option<HeadDims> {
    HeadDims::of(round8(d), round8(dv))
}

/// The programs a backward call of `spec` on `params`' pointers and strides launches, as [`run`] routes it,
/// for warm-ups: the backward's own (its entries `_pre`, the main kernel and `_convert` or `_dq`; the same
/// program in place and on the padded copies), and the copy module when the call takes the pad-copy path
/// (not [`aligned`]: head dims that are not multiples of 8, or a misaligned view of any head dims).
pub fn programs_for(spec: &AttentionSpec, params: &BwdParams, deterministic: bool) -> Result<Vec<Program>> {
    let s = spec.shape;
    let mut all = vec![program_for(spec, deterministic)?];
    if !aligned(params, s.d, s.dv) {
        all.push(pad_copy::program());
    }
    Ok(all)
}

/// The backward's own program for `spec` (at [`padded_dims`]).
fn program_for(spec: &AttentionSpec, deterministic: bool) -> Result<Program> {
    let s = spec.shape;
    let dims = padded_dims(s.d, s.dv).ok_or_else(|| {
        unsupported(format!("the CUDA backward has no head-dim class for D = {}, Dv = {}", s.d, s.dv))
    })?;
    let (tile, qtile, prefix) = tiles(dims.d)?;
    Ok(program_with(&prefix, tile, qtile, spec.dtype, dims, Features::of(spec), deterministic))
}

/// Whether the kernels can read and write the call in place: head dims multiples of 8 and every row of Q, K,
/// V, O, dO, dQ, dK and dV whole 16-byte chunks that start 16-byte aligned (their loads and stores copy
/// whole chunks; dO, dQ, dK and dV take O's, Q's, K's and V's strides), and the f32 dQ, when asked for,
/// 16-byte aligned too (`bwd_convert` in bwd.cu stores it as `float4`; Q's strides of 8 elements keep its
/// rows so). Other calls take the pad-copy path, whose copy back moves the f32 dQ 4 bytes at a time.
pub fn aligned(params: &BwdParams, d: usize, dv: usize) -> bool {
    let grads = [params.d_o, params.dq, params.dk, params.dv, params.dq_f32].iter().all(|p| p.is_multiple_of(16));
    params.attn.rows_16_byte_aligned(d, dv) && grads
}

/// Why the backward cannot run a call on this device, or `None`. Calls that are not [`aligned`] are checked
/// as the pad-copy path runs them: at [`padded_dims`], with pointers aligned to their own elements only.
pub fn refusal(spec: &AttentionSpec, params: &BwdParams, smem_optin: usize) -> Option<String> {
    let s = spec.shape;
    if spec.ragged.as_ref().is_some_and(|r| r.pages.is_some()) {
        return Some("backward of a paged KV cache".into());
    }
    if !matches!(spec.dtype, DType::F16 | DType::BF16) {
        return Some(format!("the CUDA backward runs f16 and bf16 only, not {}", spec.dtype));
    }
    let Some(dims) = padded_dims(s.d, s.dv) else {
        return Some(format!("the CUDA backward takes head dims from 1 to 256, got D = {}, Dv = {}", s.d, s.dv));
    };
    if spec.scale() <= 0.0 {
        return Some(format!("scale {} (the backward needs a positive scale)", spec.scale()));
    }
    let halves =
        [params.attn.q, params.attn.k, params.attn.v, params.attn.o, params.d_o, params.dq, params.dk, params.dv];
    let elements = halves.iter().all(|p| p.is_multiple_of(2)) && params.dq_f32.is_multiple_of(4);
    if !(aligned(params, s.d, s.dv) || elements) {
        return Some(
            "operands not aligned to their elements (odd addresses of 2-byte values, or f32 dQ off 4 bytes)".into(),
        );
    }
    let Ok((t, q, _)) = tiles(dims.d) else { return Some("SDPA_BWD_TILE is not a tile".into()) };
    if !t.fits(dims.d, dims.dv) {
        return Some(format!("the tile {t:?} does not divide head dims {} / {}", dims.d, dims.dv));
    }
    let needed = t.smem_bytes(dims.d, dims.dv).max(q.smem_bytes(dims.d, dims.dv));
    (needed > smem_optin).then(|| format!("{needed} bytes of shared memory per block, the device allows {smem_optin}"))
}

/// Rows of the call's row space (the LSE's): `B * Hq * Sq`, or `Hq * total_q` for a ragged batch.
fn rows(spec: &AttentionSpec) -> usize {
    let s = spec.shape;
    match &spec.ragged {
        Some(r) => s.hq * r.total_q(),
        None => s.b * s.hq * s.sq,
    }
}

/// Bytes of the workspace [`run_aligned`] allocates for `spec`: Delta (an f32 per row) and, on the atomic
/// path (not `deterministic`), the f32 dQ accumulator (`rows × D`); `None` when the size overflows.
pub(super) fn workspace_bytes(spec: &AttentionSpec, deterministic: bool) -> Option<u64> {
    let n = rows(spec);
    let acc = if deterministic { 0 } else { n.checked_mul(spec.shape.d)? };
    let floats = u64::try_from(n.checked_add(acc)?).ok()?;
    floats.checked_mul(4)
}

/// Device memory a backward call of `spec` on `params`' pointers and strides allocates beyond its operands,
/// as [`run`] routes it, and so needs free when it starts: in place ([`aligned`]) its workspace
/// (`workspace_bytes`); through the copies what [`super::bwd_pad::required_free`] requires (the scratch,
/// the padded call's workspace and the headroom). `None` when a size overflows.
pub fn device_bytes(spec: &AttentionSpec, params: &BwdParams, deterministic: bool) -> Option<u64> {
    let s = spec.shape;
    if aligned(params, s.d, s.dv) {
        workspace_bytes(spec, deterministic)
    } else {
        super::bwd_pad::required_free(spec, params.dq_f32 != 0, deterministic)
    }
}

/// Runs the backward of `call` (its params hold Q, K, V, O, mask, LSE and the ragged offsets) with the
/// backward's pointers in `ptrs` (`delta` and `dq_acc` are filled in here from stream-ordered scratch): in
/// place when [`aligned`], else through the pad-copy path ([`super::bwd_pad::run`]). Returns whether the run
/// was deterministic (it is exactly when asked: the atomic path is not).
pub fn run(call: &Call<'_>, ptrs: BwdParams, deterministic: bool) -> Result<bool> {
    let optin = call.dev.info().smem_per_block_optin.max(0) as usize;
    let params = BwdParams { attn: call.params, ..ptrs };
    if let Some(why) = refusal(call.spec, &params, optin) {
        return Err(unsupported(why));
    }
    let s = call.spec.shape;
    if aligned(&params, s.d, s.dv) {
        run_aligned(call, params, deterministic)
    } else {
        super::bwd_pad::run(call, params, deterministic)
    }
}

/// [`run`] on a call that is [`aligned`] (the caller's, or the pad-copy path's padded one); `params.attn` is
/// the call's parameters.
pub(super) fn run_aligned(call: &Call<'_>, params: BwdParams, deterministic: bool) -> Result<bool> {
    let spec = call.spec;
    let optin = call.dev.info().smem_per_block_optin.max(0) as usize;
    if let Some(why) = refusal(spec, &params, optin) {
        return Err(unsupported(why));
    }
    let s = spec.shape;
    if !aligned(&params, s.d, s.dv) {
        return Err(unsupported("the backward's in-place kernels need 16-byte aligned rows"));
    }
    let dims = HeadDims::of(s.d, s.dv).ok_or_else(|| unsupported("head dims"))?;
    let (tile, qtile, _) = tiles(dims.d)?;
    let program = program_for(spec, deterministic)?;
    let n_rows = rows(spec);
    let (max_q, max_k) = match &spec.ragged {
        Some(r) => (r.max_q(), r.max_k()),
        None => (s.sq, s.sk),
    };
    let too_many = |what: &str| unsupported(format!("backward: too many {what} for one launch"));
    let u32_of = |x: usize, what: &str| u32::try_from(x).map_err(|_| too_many(what));
    let y_z = |x: usize, what: &str| u32::try_from(x).ok().filter(|&v| v <= 65535).ok_or_else(|| too_many(what));

    let delta = call.scratch::<f32>(n_rows, "the backward's Delta rows")?;
    // The accumulator's rows are zeroed by `_pre`, before the main kernel adds into them.
    let mut acc = if deterministic {
        None
    } else {
        Some(call.scratch::<f32>(n_rows.saturating_mul(s.d), "the backward's f32 dQ accumulator")?)
    };
    let (delta_ptr, delta_guard) = delta.device_ptr(call.stream);
    let acc_guard = acc.as_mut().map(|a| a.device_ptr(call.stream));
    let params = BwdParams { delta: delta_ptr, dq_acc: acc_guard.as_ref().map_or(0, |g| g.0), ..params };

    let row_blocks = u32_of(n_rows.div_ceil(8), "rows")?;
    let per_row = |name: String| (name, LaunchDims { grid: (row_blocks, 1, 1), block: (256, 1, 1), smem_bytes: 0 });
    // bwd.cu's bwd_dkdv: (key tiles, kv heads, sequences), or heavy-first (kv heads, sequences, key tiles).
    let key_tiles = max_k.div_ceil(tile.bn());
    let grid = if Features::of(spec).heavy_first {
        (u32_of(s.hkv, "kv heads")?, y_z(s.b, "sequences")?, y_z(key_tiles, "key tiles")?)
    } else {
        (u32_of(key_tiles, "key tiles")?, y_z(s.hkv, "kv heads")?, y_z(s.b, "sequences")?)
    };
    let main = (
        program.name.clone(),
        LaunchDims { grid, block: (tile.threads() as u32, 1, 1), smem_bytes: tile.smem_bytes(dims.d, dims.dv) as u32 },
    );
    let mut launches = Vec::with_capacity(3);
    if n_rows > 0 {
        launches.push(per_row(format!("{}_pre", program.name)));
    }
    if max_k > 0 {
        launches.push(main);
    }
    if n_rows > 0 {
        if deterministic {
            let dq = LaunchDims {
                grid: (u32_of(max_q.div_ceil(qtile.bm), "query tiles")?, y_z(s.hq, "heads")?, y_z(s.b, "sequences")?),
                block: (qtile.warps as u32 * 32, 1, 1),
                smem_bytes: qtile.smem_bytes(dims.d, dims.dv) as u32,
            };
            launches.push((format!("{}_dq", program.name), dq));
        } else {
            launches.push(per_row(format!("{}_convert", program.name)));
        }
    }
    let mut result = Ok(());
    for (name, dims) in launches {
        // SAFETY: the backend checked every buffer against the validated spec (Q, K, V, O, dO, dQ, dK, dV,
        // the mask and the LSE cover every strided offset; ragged offsets uploaded and pointed at); Delta
        // holds `rows` floats and the accumulator `rows * d` (zeroed by `_pre` first), both alive until the guards
        // drop after the launches are queued. The kernels read rows inside each sequence's lengths only
        // and write dQ/dK/dV rows of the spec (and Delta and the accumulator rows of the row space).
        result = unsafe { launch(call.dev, call.stream, &program, &name, dims, &params) };
        if result.is_err() {
            break;
        }
    }
    drop(acc_guard);
    drop(delta_guard);
    drop(acc);
    drop(delta);
    result.map(|()| deterministic)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_fit_the_h100_and_programs_have_unique_names() {
        const H100: usize = 227 * 1024;
        for d in HEAD_DIM_CLASSES {
            let (t, q) = tile_for(d);
            assert!(t.smem_bytes(d, d) <= H100, "D = {d}: {}", t.smem_bytes(d, d));
            assert!(q.smem_bytes(d, d) <= H100);
            assert!(t.fits(d, d), "D = {d}");
        }
        let t = tile_for(192).0;
        assert!(t.fits(192, 128));
        // A tile whose dK columns per warp are not whole x4 pairs (32 / 2 = 16 is, 32 / 4 is not) is refused.
        let t = |kw, cw, split| BwdTile { bm: 64, kw, cw, mt: 1, min_blocks: 1, split };
        assert!(t(4, 2, false).fits(32, 32));
        assert!(!t(2, 4, false).fits(32, 32));
        // Split: each warp's queries of S must be whole x4 pairs (64 / 2 = 32 are, 64 / 8 are not).
        assert!(t(4, 2, true).fits(128, 128));
        assert!(!t(2, 8, true).fits(128, 128));
        let all = programs();
        let mut names: Vec<&str> = all.iter().map(|p| p.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len());
        assert!(compile_check_programs().iter().all(|p| all.contains(p)));
        let f = Features { explicit: false, softcap: true, alibi: true, heavy_first: false };
        assert_eq!(
            program(DType::BF16, HeadDims { d: 128, dv: 128, pad: true }, f, true).name,
            "bwd_bf16_128_softcap_alibi_det"
        );
    }
}
