//! `fa3`: the Hopper forward for f16/bf16 (`kernels/fa3.cu`, sm_90a): TMA tensor loads of Q, K and V
//! through tensor maps built per call ([`crate::checked::tensor_map`]), `wgmma` for S = Q·Kᵀ (both operands
//! in shared memory) and O += P·V (P from registers), a producer warpgroup feeding an mbarrier ring of K/V
//! stages to two or three consumer warpgroups (`setmaxnreg` moves the producer's registers to them), online
//! softmax in registers, LSE, causal masks of both alignments with the tiles past the diagonal never loaded
//! and the heaviest query tiles first, GQA by index, any Sq and Sk (TMA zero-fills rows past the extents;
//! the tail keys are masked). The consumers overlap their own softmax with their P·V (S(j+1) is issued
//! before P(j)·V(j)) and take turns issuing products (ping-pong); `SDPA_FA3_PINGPONG=0` runs the entries
//! without the turns, for comparisons.
//!
//! The grid is persistent ([`grid_blocks`]: one block per multiprocessor walking the work tiles, the next
//! tile's Q and K/V loaded while the current one finishes); each block takes its next tile from an atomic
//! counter when it is ready for one ([`Schedule::Dynamic`]; the counter is kept zero between calls, see
//! [`run`]), or follows session 7's static share (`SDPA_FA3_SCHED=static`); the tile ([`tile_for`]: keys per tile, ring depth, consumer warpgroups) is chosen by head dim and
//! mask. `SDPA_FA3_TILE` and `SDPA_FA3_GRID` override both for tuning runs and tests.
//!
//! Head dims: compiled classes (Q/K width, V/O width) [`FA3_CLASSES`]; a call runs the first class at or
//! above its D and Dv ([`head_dim_class`]). The tensor maps carry the call's own widths, so TMA fills a box's
//! columns past them with zeros (64-column blocks wholly past them are not loaded), and O is stored up to Dv.
//!
//! What it takes today ([`refuses`]): f16/bf16 (and f8e4m3, below), D and Dv multiples of 8 up to 256, no mask or a causal one,
//! a positive scale, dense batches, operands a tensor map can describe (base and every stride of Q, K, V, O
//! multiples of 8 elements), a compute-capability 9.0 GPU. Everything else is refused with what `fa3` lacks
//! (it never falls back silently): `fa2` runs those calls. `auto` picks `fa3` where it takes the call and was
//! measured faster than `fa2` ([`super::policy::resolve_auto`]; `bench/results/gpu/fa3.md`).
//!
//! Windows, softcap and ALiBi (f16/bf16; `FA3_ENTRY_VAR`, [`variant_program`]) are written but have not
//! run on a GPU yet: they are taken only when `SDPA_FA3_VARIANTS=1` ([`variants_enabled`], the
//! verification switch), and refused with that reason otherwise. A variant entry restricts the keys to the
//! call's band (windows, causal masks as a special case): only the key tiles some row of the work tile sees
//! are loaded, each consumer computes its own rows' tiles, and only tiles crossing a band edge run the mask
//! code; softcap and ALiBi transform the scores in registers before the online softmax. Two consumers at
//! every class ([`variant_tile_for`]).
//!
//! FP8 (E4M3 inputs with per-tensor descales, bf16 O; kernels/fa3_fp8.cuh): classes 64, 128 and 256 with D and
//! Dv multiples of 16 ([`fp8_head_dim_class`]), 128 keys per tile ([`fp8_tile_for`]), Q, K and V bases and
//! strides multiples of 16 bytes. 8-bit `wgmma` reads V K-major, so [`run`] first writes Vᵀ into a workspace
//! (the `fa3_fp8_vt` pre-pass, keys permuted within groups of 16 to match P's registers) and the kernel loads
//! that. Q's and K's descales are folded into the softmax scale, V's into O's final scale ([`plan_with`]).
//! No non-finite repair yet: a NaN code in V under a masked key of a loaded tile reaches that tile's rows.
//! Speed and accuracy: `bench/results/gpu/fp8.md`.

use crate::checked::call::Call;
use crate::checked::launch::{launch, LaunchDims};
use crate::checked::params::{mask_suffix, AttnParams, Masking, MASK_CAUSAL, MASK_NONE, VAR_ALIBI, VAR_SOFTCAP};
use crate::checked::tensor_map::{padded_tensor_map, KvOperand};
use crate::error::{driver, unsupported};
use crate::sys::modules::FA3;
use crate::sys::program::{cuda_type, Program};
use cudarc::driver::sys::CUtensorMap;
use cudarc::driver::{DevicePtr, DeviceRepr};
use sdpa_core::{AttentionSpec, DType, Mask, Result};
use std::sync::Arc;

/// Head-dim classes (D, Dv) `fa3` is compiled for, cheapest first: the widths of Q/K and of V/O that the
/// products compute (multiples of 32). Shared memory holds whole 64-column TMA boxes ([`stored`]), so 96,
/// 160 and 224 take the tiles of 128, 192 and 256 and compute a quarter, a sixth and an eighth less.
/// 192/128 is MLA prefill (DeepSeek-V2/V3); other unequal head dims run the first class that holds both.
pub const FA3_CLASSES: [(usize, usize); 8] =
    [(64, 64), (96, 96), (128, 128), (192, 128), (160, 160), (192, 192), (224, 224), (256, 256)];

/// Columns a row of head dim class `w` takes in shared memory: whole 64-column TMA boxes (`Fa3Smem::DS`).
pub fn stored(w: usize) -> usize {
    w.div_ceil(64) * 64
}

/// The class (D, Dv) a call with head dims `d`, `dv` runs: the first of [`FA3_CLASSES`] at or above both, or
/// `None` when one is 0, not a multiple of 8 (rows of whole 16-byte chunks, for the tensor maps and the
/// stores of O) or above 256.
pub fn head_dim_class(d: usize, dv: usize) -> Option<(usize, usize)> {
    if d == 0 || dv == 0 || !d.is_multiple_of(8) || !dv.is_multiple_of(8) {
        return None;
    }
    FA3_CLASSES.into_iter().find(|&(cd, cdv)| d <= cd && dv <= cdv)
}
/// Depth of the kernel's work-tile ring (`FA3_SCHED`): an mbarrier pair (16 bytes) and a tile (4) each.
const SCHED_RING: usize = 4;

/// The tiling of an entry: keys per tile, ring depth and consumer warpgroups (`BN`, `ST`, `NC` of
/// `FA3_ENTRY`); a block runs 64 query rows per consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fa3Tile {
    /// Keys per K/V tile (a multiple of 16 up to 256 with a `wgmma` width for it in fa3_wgmma.cuh: 64, 80,
    /// 96, 112, 128, 176 or 192).
    pub bn: usize,
    /// K/V ring slots.
    pub stages: usize,
    /// Consumer warpgroups (2, or 3: 160 registers each instead of 240).
    pub consumers: usize,
}

impl Fa3Tile {
    /// Dynamic shared memory of a block at head-dim class (`d`, `dv`) (`Fa3Smem::BYTES`): Q of every
    /// consumer, the K and V rings (rows of [`stored`] columns), the mbarriers (full and empty per consumer's
    /// Q, per K and per V slot) and the work-tile ring (`barrier_bytes`).
    pub fn smem_bytes(&self, d: usize, dv: usize) -> usize {
        let (d, dv) = (stored(d), stored(dv));
        self.consumers * 64 * d * 2 + self.stages * self.bn * (d + dv) * 2 + barrier_bytes(*self)
    }

    /// Query rows per block (a work tile): 64 per consumer warpgroup.
    pub fn rows(&self) -> usize {
        64 * self.consumers
    }

    /// Threads per block: the consumers and the producer warpgroup (`FA3_THREADS`).
    pub fn threads(&self) -> usize {
        128 * (self.consumers + 1)
    }
}

impl Fa3Tile {
    /// The prefix of this tile's entry names: `fa3_t{bn}x{stages}`, with `w3` for three consumers.
    pub fn prefix(&self) -> String {
        let w = if self.consumers == 2 { String::new() } else { format!("w{}", self.consumers) };
        format!("fa3_t{}x{}{w}", self.bn, self.stages)
    }
}

/// The tile of a call by head-dim class (`d`, `dv`), mask and key count `sk` (measured on the H100,
/// bench/results/gpu/fa3.md). Keys per tile: a 2-deep ring of 128 keys up to 192/128 (stored widths), 112
/// keys when both are stored as 192, 80 at 256 (the widest that fit the 227 KB of shared memory with two
/// stages; FlashAttention-3 takes the same, `hopper/tile_size.h`; 64 keys at 256, 96 at 192 and 112 at
/// 192/128 measured 0.95-0.98x median). Consumers: three warpgroups (192 query rows a block) at the class
/// 64 without a mask (1.05-1.21x two consumers) and with a causal one from [`CAUSAL_64_THREE_FROM_KEYS`]
/// keys on, two otherwise (wider classes need the 240 registers of two). Three at D = 64 causal lost 2-15 %
/// in session 7, when their unmasked tiles spilled; with the unmasked tiles in their own loop and the
/// dynamic schedule (session 8, call 1) they ran 1.077x / 1.089x two at 4k / 16k and 0.904x at 1k. Longer
/// key tiles (176, 192) at 64/128 were within the card's run-to-run spread, or slower (causal D = 128:
/// 0.67-0.87x).
pub fn tile_for(d: usize, dv: usize, causal: bool, sk: usize) -> Fa3Tile {
    let bn = match (stored(d), stored(dv)) {
        (256, _) => 80,
        (192, 192) => 112,
        _ => 128,
    };
    let three = (stored(d), stored(dv)) == (64, 64) && (!causal || sk >= CAUSAL_64_THREE_FROM_KEYS);
    Fa3Tile { bn, stages: 2, consumers: if three { 3 } else { 2 } }
}

/// Keys from which a causal call at the class 64 runs three consumer warpgroups ([`tile_for`]).
pub const CAUSAL_64_THREE_FROM_KEYS: usize = 4096;

/// The tiles [`tile_for`] can choose at head-dim class (`d`, `dv`) under a causal mask or none (each compiled
/// in [`programs`]): the table changes tiles by length at most once, at [`CAUSAL_64_THREE_FROM_KEYS`].
fn table_tiles(d: usize, dv: usize, causal: bool) -> Vec<Fa3Tile> {
    let lengths = [1, CAUSAL_64_THREE_FROM_KEYS - 1, CAUSAL_64_THREE_FROM_KEYS, 1 << 20];
    let mut tiles: Vec<Fa3Tile> = lengths.into_iter().map(|sk| tile_for(d, dv, causal, sk)).collect();
    tiles.sort_by_key(|t| (t.bn, t.stages, t.consumers));
    tiles.dedup();
    tiles
}

/// The tile `SDPA_FA3_TILE=bn,stages[,consumers]` forces (tuning runs: `dev/fa3_bench.py --tiles`); entries of
/// tiles the table does not use are compiled on first use (not listed in [`programs`]). `None` when unset;
/// an unusable value is an error naming what is allowed.
fn forced_tile() -> Result<Option<Fa3Tile>> {
    let Ok(v) = std::env::var("SDPA_FA3_TILE") else { return Ok(None) };
    parse_tile(&v).map(Some).ok_or_else(|| {
        unsupported(format!(
            "SDPA_FA3_TILE={v}: expected `bn,stages[,consumers]` with bn 64, 80, 96, 112, 128, 176 or 192, 1 to 4 \
             stages and 2 or 3 consumer warpgroups"
        ))
    })
}

/// The tile `bn,stages[,consumers]` names, or `None` when a part is not a number (every part must be one: a
/// part left out would shift the others into other meanings) or a value is not one the kernel takes.
fn parse_tile(v: &str) -> Option<Fa3Tile> {
    let parsed: Vec<usize> = v.split(',').map(|x| x.trim().parse().ok()).collect::<Option<_>>()?;
    match parsed[..] {
        [bn @ (64 | 80 | 96 | 112 | 128 | 176 | 192), stages @ 1..=4] => Some(Fa3Tile { bn, stages, consumers: 2 }),
        [bn @ (64 | 80 | 96 | 112 | 128 | 176 | 192), stages @ 1..=4, consumers @ (2 | 3)] => {
            Some(Fa3Tile { bn, stages, consumers })
        }
        _ => None,
    }
}

/// Where a call `fa3` refuses can run instead: `fa2`-family advice for f16/bf16 (`for_16_bit`), and for
/// f8e4m3 inputs, which no other kernel takes, that there is no such kernel (pointing an FP8 caller at
/// `fa2` would only earn a second refusal).
fn elsewhere(spec: &AttentionSpec, for_16_bit: &str) -> String {
    if spec.dtype == DType::F8E4M3 {
        "no other kernel takes f8e4m3 inputs (dequantize to bf16 for fa2)".into()
    } else {
        for_16_bit.into()
    }
}

/// Most (batch, kv head) pairs of an FP8 call: the Vᵀ pre-pass launches one grid row (`gridDim.z`) per pair,
/// and CUDA caps that dimension at 65535. Refused up front, before the workspace is allocated, rather than
/// failing at launch (launching the pre-pass in chunks of pairs would lift it; not written without a GPU to
/// run it on).
pub const VT_MAX_BATCH_HEADS: usize = 65535;

/// Whether `SDPA_FA3_VARIANTS=1` is set: the verification switch of `fa3`'s windows, softcap and ALiBi
/// (`FA3_ENTRY_VAR` in kernels/fa3.cu). They were written in session 9 on a machine without a GPU and have
/// not run on an H100 yet, so without the switch [`refuses`] refuses variant calls (they run on `fa2`) and
/// `auto` never sends them here ([`super::policy::fa3_measured_faster`]); the GPU tests
/// (`tests/fa3_variants.rs`) and `bench/studies/fa3/variants9/run.sh` set it. Once those pass on an H100,
/// this switch goes and variants become part of what `fa3` takes.
pub fn variants_enabled() -> bool {
    std::env::var_os("SDPA_FA3_VARIANTS").is_some_and(|v| v == "1")
}

/// Bound on Sq + Sk of the calls `fa3` takes with variants: the kernel's band tests and ALiBi distances
/// (keys minus band bounds, keys minus rows and diagonals) are 32-bit, which 64 Ki below 2^31 leaves room for
/// (64-bit ones made ptxas spill in the main loop).
pub const VARIANT_MAX_TOKENS: usize = (1 << 31) - (1 << 16);

/// Why `fa3` cannot run `spec` (whatever the device and pointers), or `None`; variants as
/// [`variants_enabled`] says.
pub fn refuses(spec: &AttentionSpec) -> Option<String> {
    refuses_with(spec, variants_enabled())
}

/// [`refuses`] with the variant switch given: `variants` says whether windows, softcap and ALiBi are taken
/// (f16/bf16 only; f8e4m3 refuses them either way).
pub fn refuses_with(spec: &AttentionSpec, variants: bool) -> Option<String> {
    let s = spec.shape;
    if !matches!(spec.dtype, DType::F16 | DType::BF16 | DType::F8E4M3) {
        return Some(format!("fa3 takes f16, bf16 and f8e4m3 inputs, not {} (use fa2 or fa1)", spec.dtype));
    }
    if spec.dtype == DType::F8E4M3 && fp8_head_dim_class(s.d, s.dv).is_none() {
        return Some(format!(
            "fa3 takes f8e4m3 head dims D and Dv that are multiples of 16 up to 256 (classes 64, 128 and 256; \
             TMA rows of whole 16-byte chunks; got D = {}, Dv = {}); no other kernel takes f8e4m3",
            s.d, s.dv
        ));
    }
    if spec.dtype == DType::F8E4M3 && s.b.saturating_mul(s.hkv) > VT_MAX_BATCH_HEADS {
        return Some(format!(
            "fa3 takes f8e4m3 calls of at most {VT_MAX_BATCH_HEADS} (batch, kv head) pairs (its Vᵀ pre-pass \
             runs one grid row per pair; got B = {} x Hkv = {}); no other kernel takes f8e4m3",
            s.b, s.hkv
        ));
    }
    if head_dim_class(s.d, s.dv).is_none() {
        return Some(format!(
            "fa3 takes head dims D and Dv that are multiples of 8 up to 256 (TMA rows of whole 16-byte chunks; got \
             D = {}, Dv = {}); fa2 or fa1 takes the others",
            s.d, s.dv
        ));
    }
    let kinds = spec.variants.kinds();
    if !kinds.is_empty() {
        let names: Vec<&str> = kinds.iter().map(|v| v.name()).collect();
        let names = names.join(", ");
        if spec.dtype == DType::F8E4M3 {
            return Some(format!(
                "fa3 does not implement {names} for f8e4m3 inputs (f16 and bf16 only); {}",
                elsewhere(spec, "")
            ));
        }
        if !variants {
            return Some(format!(
                "fa3 does not implement {names} yet (its kernel for them has not run on a GPU; \
                 SDPA_FA3_VARIANTS=1 turns it on for verification); fa2 does"
            ));
        }
        if s.sq.saturating_add(s.sk) >= VARIANT_MAX_TOKENS {
            return Some(format!(
                "fa3 takes {names} for Sq + Sk below {VARIANT_MAX_TOKENS} (its band arithmetic is 32-bit; got Sq = \
                 {}, Sk = {}); fa2 does",
                s.sq, s.sk
            ));
        }
    }
    if matches!(spec.mask, Mask::Explicit(_)) {
        return Some(format!(
            "fa3 does not take explicit masks yet (no mask or causal only); {}",
            elsewhere(spec, "fa2 does")
        ));
    }
    if spec.ragged.is_some() {
        return Some(format!(
            "fa3 does not run ragged (varlen) batches or paged KV caches yet; {}",
            elsewhere(spec, "fa2 and splitkv do")
        ));
    }
    if spec.scale() <= 0.0 {
        return Some(format!("fa3 needs a positive scale (got {})", spec.scale()));
    }
    None
}

/// The program of entry `{tile prefix}_{dtype}_{d}[_{dv}]_{mask}` (`_{dv}` for unequal classes, `_pp0`:
/// without ping-pong) at head-dim class (`d`, `dv`) with `tile`.
pub fn program(dtype: DType, class: (usize, usize), tile: Fa3Tile, mask_kind: i32, pingpong: bool) -> Program {
    measured_program(dtype, class, tile, mask_kind, pingpong, AbSwitches::default())
}

/// [`program`] with the measurement switches `ab` (`SDPA_FA3_AB`): entry `..._xo{bits}` (`FA3_ENTRY_XO`) when
/// any is on, else the product entry itself.
pub fn measured_program(
    dtype: DType,
    (d, dv): (usize, usize),
    tile: Fa3Tile,
    mask_kind: i32,
    pingpong: bool,
    ab: AbSwitches,
) -> Program {
    let pp = if pingpong { "" } else { "_pp0" };
    let dims = if d == dv { format!("{d}") } else { format!("{d}_{dv}") };
    let xo = ab.bits();
    let xs = if xo == 0 { String::new() } else { format!("_xo{xo}") };
    let name = format!("{}_{}_{dims}_{}{pp}{xs}", tile.prefix(), dtype.name(), mask_suffix(mask_kind));
    let Fa3Tile { bn, stages, consumers } = tile;
    let mask = super::mask_const("FA3", mask_kind);
    let ty = cuda_type(dtype);
    let line = if xo == 0 {
        format!("FA3_ENTRY({name}, {ty}, {d}, {dv}, {bn}, {stages}, {mask}, {pingpong}, {consumers})")
    } else {
        format!("FA3_ENTRY_XO({name}, {ty}, {d}, {dv}, {bn}, {stages}, {mask}, {pingpong}, {consumers}, {xo})")
    };
    Program::entry(&FA3, name, line)
}

/// Measurement switches (`SDPA_FA3_AB`, kernels/fa3.cu `FA3_XO_*`): each brings back one of session 7's
/// choices that session 8 replaced, so that a single call times both on the same card (session 8 measured
/// the two replacements together 4-11 % slower at S <= 2k and could not say which one costs it;
/// bench/results/gpu/fa3.md). For measurement only: the product kernel runs with neither.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AbSwitches {
    /// O stored as 4-byte column pairs (`store4`), not 16-byte row chunks.
    pub store4: bool,
    /// Ping-pong turns restarted at every work tile (`tile-turns`), not round robin across tiles.
    pub tile_turns: bool,
}

impl AbSwitches {
    /// The `FA3_XO_*` bits.
    pub fn bits(self) -> u8 {
        u8::from(self.store4) | (u8::from(self.tile_turns) << 1)
    }

    /// Parses `SDPA_FA3_AB`'s value: a comma-separated list of `store4` and `tile-turns` (empty: none).
    pub fn parse(v: &str) -> Result<Self> {
        let mut ab = AbSwitches::default();
        for part in v.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            match part {
                "store4" => ab.store4 = true,
                "tile-turns" => ab.tile_turns = true,
                other => {
                    return Err(unsupported(format!(
                    "SDPA_FA3_AB={v}: unknown switch `{other}` (expected store4, tile-turns or both, comma-separated)"
                )))
                }
            }
        }
        Ok(ab)
    }
}

/// The measurement switches the environment asks for (`SDPA_FA3_AB`; none when unset).
fn ab_switches() -> Result<AbSwitches> {
    match std::env::var("SDPA_FA3_AB") {
        Ok(v) => AbSwitches::parse(&v),
        Err(_) => Ok(AbSwitches::default()),
    }
}

/// Head-dim classes (D = Dv) of FP8 inputs: a 128-byte box row holds 128 E4M3 columns, so 64 takes half a box
/// (zeros past it from TMA) and 128 and 256 whole ones.
pub const FA3_FP8_CLASSES: [(usize, usize); 3] = [(64, 64), (128, 128), (256, 256)];

/// The FP8 class of a call: the first of [`FA3_FP8_CLASSES`] at or above both head dims, which must be
/// multiples of 16 (E4M3 rows of whole 16-byte chunks, TMA's stride unit).
pub fn fp8_head_dim_class(d: usize, dv: usize) -> Option<(usize, usize)> {
    if d == 0 || dv == 0 || !d.is_multiple_of(16) || !dv.is_multiple_of(16) {
        return None;
    }
    FA3_FP8_CLASSES.into_iter().find(|&(cd, cdv)| d <= cd && dv <= cdv)
}

/// The FP8 tile: 128 keys (a Vᵀ tile row is one 128-byte box row), a 2-deep ring, two consumers.
pub const FP8_TILE: Fa3Tile = Fa3Tile { bn: 128, stages: 2, consumers: 2 };

/// The FP8 tile of a call at class (`d`, `dv`): [`FP8_TILE`], with three consumers at the class 64 without a
/// mask as bf16 takes them there ([`tile_for`]: 1.05-1.21x two consumers for bf16; FP8 at 64 ran 0.93-0.99x
/// bf16 with two, bench/results/gpu/fp8.md).
pub fn fp8_tile_for(d: usize, dv: usize, causal: bool) -> Fa3Tile {
    let consumers = if (d, dv) == (64, 64) && !causal { 3 } else { 2 };
    Fa3Tile { consumers, ..FP8_TILE }
}

/// An FP8 tile forced by `SDPA_FA3_TILE` (tuning runs): the keys per tile must stay 128.
fn forced_fp8_tile() -> Result<Option<Fa3Tile>> {
    match forced_tile()? {
        Some(t) if t.bn != FP8_TILE.bn => {
            Err(unsupported(format!("SDPA_FA3_TILE: f8e4m3 takes {} keys per tile, not {}", FP8_TILE.bn, t.bn)))
        }
        t => Ok(t),
    }
}

/// Shared memory of an FP8 block at class (`d`, `dv`): Q and K rows of whole 128-column boxes, Vᵀ tiles of
/// `dv` rows of 128 keys, one byte each, and the barriers (`Fa3Smem` with `ES = 1`).
pub fn fp8_smem_bytes(t: Fa3Tile, d: usize, dv: usize) -> usize {
    let ds = d.div_ceil(128) * 128;
    t.consumers * 64 * ds + t.stages * t.bn * (ds + dv) + barrier_bytes(t)
}

/// The shared memory after the tiles, for every element type (fa3.cu `Fa3Smem`): the Q and K/V ring
/// mbarriers, 8 bytes each, then the work-tile ring (an mbarrier pair and a tile index per slot).
fn barrier_bytes(t: Fa3Tile) -> usize {
    8 * (2 * t.consumers + 4 * t.stages) + 20 * SCHED_RING
}

/// Threads of a Vᵀ pre-pass block (a 64-key x 64-column tile, one 16-byte load and store each).
const VT_THREADS: u32 = 256;

/// The Vᵀ pre-pass of FP8 calls (`FA3_FP8_VT_ENTRY` in kernels/fa3_fp8.cuh).
pub fn vt_program() -> Program {
    Program::entry(&FA3, "fa3_fp8_vt", format!("FA3_FP8_VT_ENTRY(fa3_fp8_vt, {VT_THREADS})"))
}

/// The tile of a variant call (a band, maybe softcap and ALiBi) at head-dim class (`d`, `dv`): the causal
/// table's tile with two consumer warpgroups everywhere (at the class 64 too, where three would have 160
/// registers each for the variant code as well; not measured), whatever the key count.
pub fn variant_tile_for(d: usize, dv: usize) -> Fa3Tile {
    Fa3Tile { consumers: 2, ..tile_for(d, dv, true, 1) }
}

/// The program of variant entry `{tile prefix}_{dtype}_{d}[_{dv}]_band[_softcap][_alibi][_pp0]`
/// (`FA3_ENTRY_VAR`): `var` is a [`Masking`] variant set (`VAR_BAND` with softcap and ALiBi bits) over no
/// mask; f16/bf16 only.
pub fn variant_program(dtype: DType, (d, dv): (usize, usize), tile: Fa3Tile, var: i32, pingpong: bool) -> Program {
    let pp = if pingpong { "" } else { "_pp0" };
    let dims = if d == dv { format!("{d}") } else { format!("{d}_{dv}") };
    let suffix = Masking { kind: MASK_NONE, var }.suffix();
    let name = format!("{}_{}_{dims}_{suffix}{pp}", tile.prefix(), dtype.name());
    let Fa3Tile { bn, stages, consumers } = tile;
    let mut bits = vec!["FA3_VAR_BAND"];
    if var & VAR_SOFTCAP != 0 {
        bits.push("FA3_VAR_SOFTCAP");
    }
    if var & VAR_ALIBI != 0 {
        bits.push("FA3_VAR_ALIBI");
    }
    let line = format!(
        "FA3_ENTRY_VAR({name}, {}, {d}, {dv}, {bn}, {stages}, {}, {pingpong}, {consumers})",
        cuda_type(dtype),
        bits.join(" | ")
    );
    Program::entry(&FA3, name, line)
}

/// Every variant entry a launch can ask for (with the table's tiles and ping-pong): each dtype (f16, bf16),
/// class and variant set (band; with softcap, ALiBi, both), 64 programs. Not in [`programs`] (the
/// compile check and `warm_up_all` build those) while the variants are behind [`variants_enabled`]: they
/// compile on first use, except [`compile_check_variant_programs`]. `SDPA_NVRTC_ALL=1` compiles them all
/// in `tests/nvrtc_compile.rs`.
pub fn variant_programs() -> Vec<Program> {
    let mut all = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for (d, dv) in FA3_CLASSES {
            for m in Masking::variants().into_iter().filter(|m| m.kind == MASK_NONE) {
                all.push(variant_program(dtype, (d, dv), variant_tile_for(d, dv), m.var, true));
            }
        }
    }
    all
}

/// The variant entries the CI compile check builds (and [`programs`] lists): bf16 with every variant bit at
/// the class 128 and at 256 (the widest accumulators, where registers are tightest). Within a class the
/// variant sets differ by code that the full set contains; the classes differ in constants.
pub fn compile_check_variant_programs() -> Vec<Program> {
    let all = crate::checked::params::VAR_BAND | VAR_SOFTCAP | VAR_ALIBI;
    [(128, 128), (256, 256)]
        .into_iter()
        .map(|(d, dv)| variant_program(DType::BF16, (d, dv), variant_tile_for(d, dv), all, true))
        .collect()
}

/// The FP8 programs: each class and mask with ping-pong at its tile ([`fp8_tile_for`]), and the Vᵀ
/// pre-pass (7).
pub fn fp8_programs() -> Vec<Program> {
    let mut all = vec![vt_program()];
    for class in FA3_FP8_CLASSES {
        for mask in [MASK_NONE, MASK_CAUSAL] {
            all.push(program(DType::F8E4M3, class, fp8_tile_for(class.0, class.1, mask == MASK_CAUSAL), mask, true));
        }
    }
    all
}

/// Every plain `fa3` instantiation a launch can ask for with the table's tiles: each class, dtype, mask and
/// tile with ping-pong, and without it (`SDPA_FA3_PINGPONG=0`, a measurement switch) at 64 and 128; the
/// entries without ping-pong of the other classes are compiled on first use, as forced tiles are. Of the
/// variant entries, behind [`variants_enabled`], only [`compile_check_variant_programs`] (2).
pub fn programs() -> Vec<Program> {
    let mut all = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for class in FA3_CLASSES {
            for mask in [MASK_NONE, MASK_CAUSAL] {
                for pp in [true, false] {
                    if !pp && !matches!(class, (64, 64) | (128, 128)) {
                        continue;
                    }
                    for tile in table_tiles(class.0, class.1, mask == MASK_CAUSAL) {
                        all.push(program(dtype, class, tile, mask, pp));
                    }
                }
            }
        }
    }
    all.extend(fp8_programs());
    all.extend(compile_check_variant_programs());
    all.push(measured_check_program());
    all
}

/// The measurement switches' entry the compile check builds (and [`programs`] lists): both switches at once,
/// at one class, bf16, causal (they touch no layout).
fn measured_check_program() -> Program {
    let both = AbSwitches { store4: true, tile_turns: true };
    measured_program(DType::BF16, (128, 128), tile_for(128, 128, true, 4096), MASK_CAUSAL, true, both)
}

/// The `fa3` programs the CI compile check builds: one per head-dim class (bf16, causal, ping-pong, its tile
/// from 4k keys; each class has its own wgmma widths and shared-memory layout, the dtypes and masks differ
/// in constants only).
pub fn compile_check_programs() -> Vec<Program> {
    let mut all: Vec<Program> = FA3_CLASSES
        .into_iter()
        .map(|c| program(DType::BF16, c, tile_for(c.0, c.1, true, 4096), MASK_CAUSAL, true))
        .collect();
    // FP8: its own products and layout per class, and the pre-pass.
    all.extend(fp8_programs().into_iter().filter(|p| !p.name.ends_with("_none")));
    all.extend(compile_check_variant_programs());
    all.push(measured_check_program());
    all
}

/// The entries' parameter: `Fa3Args` in fa3.cu (AttnParams, the scheduling section, O's scale, the softcap's
/// constants ([`softcap_consts`]), padding to byte 384,
/// then the Q, K and V tensor maps; 768 bytes, asserted on both sides).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Fa3Args {
    p: AttnParams,
    section: i32,
    o_scale: f32,
    softcap: [f32; 3],
    pad: [u8; ARGS_PAD],
    q: CUtensorMap,
    k: CUtensorMap,
    v: CUtensorMap,
}
const ARGS_PAD: usize = 384 - crate::checked::params::ATTN_PARAMS_SIZE - 20;
const _: () = assert!(std::mem::size_of::<Fa3Args>() == 768);
// SAFETY: plain data with C layout matching the kernel's `Fa3Args` (size asserted on both sides):
// AttnParams, the section, O's scale, the softcap's three constants, padding to 384 and three opaque
// 128-byte tensor maps.
unsafe impl DeviceRepr for Fa3Args {}

impl std::fmt::Debug for Fa3Args {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The tensor maps are opaque bytes.
        f.debug_struct("Fa3Args").field("p", &self.p).finish_non_exhaustive()
    }
}

/// False when the environment sets `SDPA_FA3_PINGPONG=0` (the entries without ping-pong).
fn pingpong() -> bool {
    std::env::var_os("SDPA_FA3_PINGPONG").is_none_or(|v| v != "0")
}

/// One planned `fa3` launch.
#[derive(Debug)]
pub struct Plan {
    /// The program (one entry point).
    pub program: Program,
    /// Grid, block and shared memory.
    pub dims: LaunchDims,
    /// The parameter with its tensor maps (`p.workspace` is set at launch: the work-tile counter).
    pub args: Fa3Args,
    /// How the blocks take their work tiles.
    pub schedule: Schedule,
}

/// How `fa3`'s blocks take their work tiles (`SDPA_FA3_SCHED`; each head's heaviest query tiles first
/// either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// The default: a persistent grid whose blocks take the next tile from an atomic counter when they are
    /// ready for one (`Fa3TileSource` in fa3.cu), so causal tiles of unequal weight balance by themselves.
    Dynamic,
    /// Session 7's schedule (`SDPA_FA3_SCHED=static`, for comparisons): a static snake over the persistent
    /// grid, and one block per tile for causal calls with more than [`PERSISTENT_CAUSAL_MAX_MBLOCKS`] tiles
    /// per head.
    Static,
}

/// The schedule the environment asks for: `SDPA_FA3_SCHED=static` or `dynamic` (the default when unset);
/// anything else is an error naming both.
fn schedule() -> Result<Schedule> {
    match std::env::var("SDPA_FA3_SCHED").as_deref() {
        Err(_) | Ok("dynamic") => Ok(Schedule::Dynamic),
        Ok("static") => Ok(Schedule::Static),
        Ok(v) => Err(unsupported(format!("SDPA_FA3_SCHED={v}: expected `dynamic` or `static`"))),
    }
}

/// The part of [`plan`] that needs no tensor map: the head-dim class and tile of a call with parameters `p`
/// on GPUs of compute capability `cc` whose blocks may use `smem_optin` bytes of shared memory, or why `fa3`
/// cannot run it. Ring attention asks this for every step of every rank before any of them starts.
pub fn check(
    spec: &AttentionSpec,
    p: &AttnParams,
    cc: (i32, i32),
    smem_optin: i32,
) -> Result<((usize, usize), Fa3Tile)> {
    if let Some(why) = refuses(spec) {
        return Err(unsupported(why));
    }
    if cc != (9, 0) {
        let (major, minor) = cc;
        return Err(unsupported(format!(
            "fa3 runs on compute capability 9.0 (H100/H200: wgmma, TMA) only; this GPU is {major}.{minor}; {}",
            elsewhere(spec, "use fa2")
        )));
    }
    let s = spec.shape;
    let fp8 = spec.dtype == DType::F8E4M3;
    let class = if fp8 { fp8_head_dim_class(s.d, s.dv) } else { head_dim_class(s.d, s.dv) }
        .ok_or_else(|| unsupported("fa3: no head-dim class"))?;
    let causal = p.mask_kind == MASK_CAUSAL;
    let tile = if fp8 {
        forced_fp8_tile()?.unwrap_or_else(|| fp8_tile_for(class.0, class.1, causal))
    } else if !spec.variants.is_plain() {
        forced_tile()?.unwrap_or_else(|| variant_tile_for(class.0, class.1))
    } else {
        forced_tile()?.unwrap_or_else(|| tile_for(class.0, class.1, causal, s.sk))
    };
    let smem = if fp8 { fp8_smem_bytes(tile, class.0, class.1) } else { tile.smem_bytes(class.0, class.1) };
    if smem > smem_optin.max(0) as usize {
        return Err(unsupported(format!(
            "fa3 needs {smem} bytes of shared memory per block, the device allows {smem_optin}"
        )));
    }
    if fp8 && !fp8_aligned(p) {
        return Err(unsupported(
            "fa3 loads f8e4m3 Q, K and V through TMA tensor maps: their base pointers and strides must be \
             multiples of 16 elements (16 bytes), O's (bf16) multiples of 8",
        ));
    }
    if !fp8 && !p.qkvo_aligned_8_elements() {
        return Err(unsupported(
            "fa3 loads Q, K and V through TMA tensor maps: base pointers and strides of Q, K, V and O must be \
             multiples of 8 elements (16 bytes); use fa2",
        ));
    }
    if p.mask_kind != MASK_NONE && p.mask_kind != MASK_CAUSAL {
        return Err(unsupported("fa3 takes no mask or a causal one"));
    }
    Ok((class, tile))
}

/// FP8 operands for TMA: Q, K and V (bytes) with 16-byte aligned bases and strides, O (bf16) with 8-element ones.
fn fp8_aligned(p: &AttnParams) -> bool {
    let ptrs = [p.q, p.k, p.v, p.o].iter().all(|&a| a % 16 == 0);
    let inputs = [p.q_stride, p.k_stride, p.v_stride].iter().flatten().all(|&st| st % 16 == 0);
    ptrs && inputs && p.o_stride.iter().all(|&st| st % 8 == 0)
}

/// Keys of a Vᵀ row in the FP8 workspace: Sk rounded up to whole 16-key groups (the pre-pass's unit, and
/// 16-byte rows for the tensor map).
pub fn vt_keys(sk: usize) -> usize {
    sk.div_ceil(16) * 16
}

/// Program, launch shape and tensor maps of `fa3` for the call, or why it cannot run it. FP8 calls get V's
/// map over V itself here (the checks only); [`run`] plans them over the Vᵀ workspace ([`plan_with`]).
pub fn plan(call: &Call<'_>) -> Result<Plan> {
    plan_with(call, None)
}

/// [`plan`], with FP8's V map over the Vᵀ workspace at `vt` (`[B, Hkv, Dv, vt_keys(Sk)]` bytes) when given.
pub fn plan_with(call: &Call<'_>, vt: Option<u64>) -> Result<Plan> {
    let spec = call.spec;
    let info = call.dev.info();
    let p = &call.params;
    let (class, tile) = check(spec, p, info.compute_capability, info.smem_per_block_optin)?;
    let fp8 = spec.dtype == DType::F8E4M3;
    let smem = if fp8 { fp8_smem_bytes(tile, class.0, class.1) } else { tile.smem_bytes(class.0, class.1) };
    let s = spec.shape;
    let masking = Masking::of(spec);
    // A band (variants) weighs query tiles unequally as a causal mask does (the static schedule's grid).
    let causal = p.mask_kind == MASK_CAUSAL || masking.var != 0;
    // The maps carry the call's own head dims (TMA zero-fills the class's columns past them).
    let op = |ptr, h, sl, d, st| KvOperand { ptr, dtype: spec.dtype, dims: [s.b, h, sl, d], strides: st };
    let v_map = if fp8 {
        // Vᵀ: rows of dv columns of Sk_pad keys, boxes of 128 keys x Dv (class) rows.
        let kp = vt_keys(s.sk) as i64;
        let dv = s.dv as i64;
        let st = [s.hkv as i64 * dv * kp, dv * kp, kp];
        padded_tensor_map(&op(vt.unwrap_or(p.v), s.hkv, s.dv, kp as usize, st), class.1)
    } else {
        padded_tensor_map(&op(p.v, s.hkv, s.sk, s.dv, p.v_stride), tile.bn)
    };
    let maps = (
        padded_tensor_map(&op(p.q, s.hq, s.sq, s.d, p.q_stride), 64),
        padded_tensor_map(&op(p.k, s.hkv, s.sk, s.d, p.k_stride), tile.bn),
        v_map,
    );
    let (Some(q), Some(k), Some(v)) = maps else {
        return Err(unsupported(format!(
            "fa3: a TMA tensor map cannot describe this Q, K or V layout (strides must be positive multiples of \
             16 bytes below 2^40, extents below 2^32); {}",
            elsewhere(spec, "use fa2")
        )));
    };
    let work =
        s.sq.div_ceil(tile.rows())
            .checked_mul(s.b * s.hq)
            .filter(|&x| x <= i32::MAX as usize)
            .ok_or_else(|| unsupported("fa3: more than 2^31 query tiles"))?;
    let schedule = schedule()?;
    let (blocks, section) = match forced_schedule()? {
        Some((blocks, section)) => (blocks.min(work), section.unwrap_or(1)),
        None => (grid_blocks(work, s.sq.div_ceil(tile.rows()), causal, schedule, info.sm_count), 1),
    };
    let blocks = blocks.max(1); // no tile (an empty batch): one block that finds no work
    let dims = LaunchDims {
        // work <= i32::MAX, checked above
        grid: (u32::try_from(blocks).unwrap_or(u32::MAX), 1, 1),
        block: (tile.threads() as u32, 1, 1),
        smem_bytes: smem as u32,
    };
    let section = i32::try_from(section.clamp(1, s.b * s.hq)).unwrap_or(i32::MAX);
    let ab = ab_switches()?;
    if ab != AbSwitches::default() && (fp8 || masking.var != 0) {
        return Err(unsupported(
            "SDPA_FA3_AB (a measurement switch) applies to the plain f16/bf16 entries only, not to f8e4m3 inputs or \
             windows, softcap and ALiBi",
        ));
    }
    let program = if masking.var != 0 {
        variant_program(spec.dtype, class, tile, masking.var, pingpong())
    } else {
        measured_program(spec.dtype, class, tile, p.mask_kind, fp8 || pingpong(), ab)
    };
    // FP8: Q's and K's descales scale the scores (folded into the softmax scale), V's scales O at the end.
    let ds = spec.descales();
    let mut p = *p;
    p.scale *= ds.q * ds.k;
    p.scale_log2 *= ds.q * ds.k;
    let o_scale = ds.v;
    let softcap = softcap_consts(p.softcap, p.scale_log2);
    Ok(Plan { program, dims, args: Fa3Args { p, section, o_scale, softcap, pad: [0; ARGS_PAD], q, k, v }, schedule })
}

/// The softcap in log2 units as the variant entries take it (`Fa3Args::softcap_kc, softcap_c1, softcap_c2`
/// in fa3.cu): `c1 + c2 / (1 + 2^(x·kc)) = cap·log2(e)·tanh(x·scale / cap)` for a raw score `x`, so
/// `[kc, c1, c2] = [2·scale·log2(e) / cap, cap·log2(e), −2·cap·log2(e)]` from the cap and
/// `scale_log2 = scale·log2(e)`, in f32 as the kernel would compute them; zeros without a cap (`cap <= 0`).
pub fn softcap_consts(cap: f32, scale_log2: f32) -> [f32; 3] {
    if cap <= 0.0 {
        return [0.0; 3];
    }
    let log2e = std::f32::consts::LOG2_E;
    [2.0 * scale_log2 / cap, cap * log2e, -2.0 * cap * log2e]
}

/// The programs a call launches: its entry, and the Vᵀ pre-pass before it for FP8 inputs.
pub fn programs_for(call: &Call<'_>) -> Result<Vec<Program>> {
    let main = plan(call)?.program;
    Ok(if call.spec.dtype == DType::F8E4M3 { vec![vt_program(), main] } else { vec![main] })
}

/// `Fa3VtArgs` of kernels/fa3_fp8.cuh (56 bytes on both sides).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct VtArgs {
    v: u64,
    vt: u64,
    v_stride: [i64; 3],
    hkv: i32,
    sk: i32,
    dv: i32,
    sk_pad: i32,
}
const _: () = assert!(std::mem::size_of::<VtArgs>() == 56);
// SAFETY: plain data with C layout matching the kernel's `Fa3VtArgs` (size asserted on both sides).
unsafe impl DeviceRepr for VtArgs {}

/// FP8: writes Vᵀ (`[B, Hkv, Dv, vt_keys(Sk)]`, keys permuted within groups of 16, zeros past Sk) into a
/// workspace on the call's stream, then runs `fa3` reading it. The workspace is freed stream-ordered after
/// both kernels; timing a call times both.
fn run_fp8(call: &Call<'_>) -> Result<()> {
    use cudarc::driver::DevicePtrMut;
    let s = call.spec.shape;
    let kp = vt_keys(s.sk);
    plan(call)?; // refuse before allocating
    if s.sq == 0 {
        return Ok(()); // no query row: nothing to write
    }
    let len = [s.b, s.hkv, s.dv, kp].iter().try_fold(1usize, |a, &x| a.checked_mul(x));
    let len = len.ok_or_else(|| unsupported("fa3: the f8e4m3 Vᵀ workspace overflows"))?;
    let mut vt = call.scratch::<u8>(len, "the f8e4m3 Vᵀ workspace of fa3")?;
    let (vt_ptr, guard) = vt.device_ptr_mut(call.stream);
    let p = &call.params;
    let args = VtArgs {
        v: p.v,
        vt: vt_ptr,
        v_stride: p.v_stride,
        hkv: p.hkv,
        sk: p.sk,
        dv: p.dv,
        sk_pad: i32::try_from(kp).map_err(|_| unsupported("fa3: Sk too long for f8e4m3"))?,
    };
    let blocks = |n: usize| u32::try_from(n.div_ceil(64)).map_err(|_| unsupported("fa3: f8e4m3 grid too large"));
    let bh = u32::try_from(s.b * s.hkv).map_err(|_| unsupported("fa3: f8e4m3 grid too large"))?;
    let dims = LaunchDims { grid: (blocks(kp)?, blocks(s.dv)?, bh), block: (VT_THREADS, 1, 1), smem_bytes: 0 };
    let vt_prog = vt_program();
    // SAFETY: V is read through the validated spec's strides at keys < Sk and columns < Dv with 16-byte loads
    // (bases and strides 16-byte aligned, checked by `plan`); the workspace holds B·Hkv·Dv·Sk_pad bytes and
    // the pre-pass writes rows < Dv and keys < Sk_pad of it with 16-byte stores.
    unsafe { launch(call.dev, call.stream, &vt_prog, &vt_prog.name, dims, &args)? };
    // The V map describes the workspace just written on the same stream.
    let Plan { program, dims, args, schedule } = plan_with(call, Some(vt_ptr))?;
    let r = launch_scheduled(call, &program, dims, args, schedule);
    drop(guard);
    r
}

/// Blocks of the grid for `work` query tiles, `n_mblocks` of them per head. Persistent (one block per
/// multiprocessor, each walking tiles head by head) except, on the static schedule, under a causal mask
/// with more than [`PERSISTENT_CAUSAL_MAX_MBLOCKS`] tiles per head: there the static share cannot balance
/// the tiles' weights (1 to n_mblocks key tiles, in a saw-tooth over the heads) and one block per tile,
/// which the hardware hands out as blocks finish, ran faster (H100, fa2bench causal at S = 16k, D = 128:
/// 604 TFLOPS against 431 persistent; bench/results/gpu/fa3.md). The dynamic schedule balances by itself.
pub fn grid_blocks(work: usize, n_mblocks: usize, causal: bool, schedule: Schedule, sm_count: i32) -> usize {
    if schedule == Schedule::Static && causal && n_mblocks > PERSISTENT_CAUSAL_MAX_MBLOCKS {
        work
    } else {
        work.min(sms(sm_count))
    }
}

/// Most query tiles per head for which a causal call runs on the persistent grid on the static schedule
/// ([`grid_blocks`]).
pub const PERSISTENT_CAUSAL_MAX_MBLOCKS: usize = 64;

/// One block per multiprocessor (a block fills one: all its registers).
fn sms(sm_count: i32) -> usize {
    usize::try_from(sm_count).unwrap_or(1).max(1)
}

/// The schedule `SDPA_FA3_GRID=blocks[,section]` forces (tests: many tiles per block on small calls, and
/// sections shorter than the heads; sweeps): the persistent grid's block count and, when given, the query
/// heads per section. `None` when unset; an unusable value is an error naming what is allowed.
fn forced_schedule() -> Result<Option<(usize, Option<usize>)>> {
    let Ok(v) = std::env::var("SDPA_FA3_GRID") else { return Ok(None) };
    let parsed: Vec<Option<usize>> = v.split(',').map(|x| x.trim().parse().ok().filter(|&n| n > 0)).collect();
    match parsed[..] {
        [Some(blocks)] => Ok(Some((blocks, None))),
        [Some(blocks), Some(section)] => Ok(Some((blocks, Some(section)))),
        _ => Err(unsupported(format!(
            "SDPA_FA3_GRID={v}: expected `blocks` or `blocks,section` (positive counts of blocks and query heads)"
        ))),
    }
}

/// Launches `fa3` on the call's stream.
pub fn run(call: &Call<'_>) -> Result<()> {
    if call.spec.dtype == DType::F8E4M3 {
        return run_fp8(call);
    }
    let Plan { program, dims, args, schedule } = plan(call)?;
    if call.spec.shape.sq == 0 {
        return Ok(()); // no query row: nothing to write
    }
    launch_scheduled(call, &program, dims, args, schedule)
}

/// Launches a planned `fa3` call with its work-tile counter (none for the static schedule).
fn launch_scheduled(
    call: &Call<'_>,
    program: &Program,
    dims: LaunchDims,
    mut args: Fa3Args,
    schedule: Schedule,
) -> Result<()> {
    if schedule == Schedule::Static {
        args.p.workspace = 0; // no counter: the kernel's static schedule
        return launch_with(call, program, dims, &args);
    }
    // The work-tile counter: zero when the launch starts, left zero by it (fa3.cu `Fa3TileSource`). On the
    // device's own stream the kept one (no memset per call); on another stream one per call, zeroed on it.
    const WHAT: &str = "fa3's work-tile counter";
    if Arc::ptr_eq(call.stream, call.dev.stream()) {
        let kept = call.dev.kept_counter(WHAT)?;
        let counter = kept.as_ref().ok_or_else(|| unsupported("internal: fa3's kept counter is missing"))?;
        let (ptr, guard) = counter.device_ptr(call.stream);
        args.p.workspace = ptr;
        // The lock is held until the launch is queued, so no other call on this device queues between.
        let r = launch_with(call, program, dims, &args);
        drop(guard);
        drop(kept);
        return r;
    }
    let counter = call.stream.alloc_zeros::<u32>(1).map_err(driver("cuMemAllocAsync", WHAT, 4))?;
    let (ptr, guard) = counter.device_ptr(call.stream);
    args.p.workspace = ptr;
    let r = launch_with(call, program, dims, &args);
    // Freed stream-ordered after the launch.
    drop(guard);
    drop(counter);
    r
}

fn launch_with(call: &Call<'_>, program: &Program, dims: LaunchDims, args: &Fa3Args) -> Result<()> {
    // SAFETY: `call.params` was built from the validated spec and buffers whose lengths cover every strided
    // offset; the tensor maps describe exactly those operands (TMA reads nothing past their extents), the
    // kernel writes O rows < Sq and columns < Dv with 16-byte stores that the 8-element alignment allows,
    // and LSE entries of its own rows. It is launched only on a compute-capability 9.0 device, for which
    // its program is built as sm_90a. `p.workspace` is null (static schedule) or one u32, zero at the
    // launch, which the kernel only increments and writes back to zero.
    unsafe { launch(call.dev, call.stream, program, &program.name, dims, args) }
}

#[cfg(test)]
mod tests {
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
        // Class 64: three consumers without a mask, and with a causal one from 4k keys on.
        assert_eq!(tile_for(64, 64, false, 512).consumers, 3);
        assert_eq!(tile_for(64, 64, true, 2048).consumers, 2);
        assert_eq!(tile_for(40, 40, true, 4096).consumers, 3);
        assert_eq!(tile_for(128, 128, true, 16384).consumers, 2);
        assert_eq!(table_tiles(64, 64, true).len(), 2);
    }

    #[test]
    fn fa3_refuses_what_it_lacks_with_the_reason() {
        let refuses = |spec: &AttentionSpec| refuses_with(spec, false);
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
        let windowed = plain.clone().with_window(sdpa_core::variants::Window::left(64));
        assert!(refuses(&windowed).expect("refused").contains("does not implement"));
        assert!(refuses(&plain.clone().with_softcap(30.0)).expect("refused").contains("does not implement"));
        assert!(refuses(&plain.with_scale(-1.0)).expect("refused").contains("positive scale"));
    }

    /// Windows, softcap and ALiBi: refused, naming the verification switch, unless it is on; f8e4m3 refuses
    /// them either way; what fa3 lacks besides stays refused with the switch on.
    #[test]
    fn variants_are_taken_only_behind_the_verification_switch() {
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
            let why = refuses_with(v, false).expect("refused without the switch");
            assert!(why.contains("does not implement") && why.contains("SDPA_FA3_VARIANTS=1"), "{why}");
            assert!(why.contains("fa2 does"), "{why}");
            assert_eq!(refuses_with(v, true), None, "{why}");
            let f16 = AttentionSpec { dtype: DType::F16, ..v.clone() };
            assert_eq!(refuses_with(&f16, true), None);
            let fp8 = AttentionSpec { dtype: DType::F8E4M3, ..v.clone() };
            for on in [false, true] {
                let why = refuses_with(&fp8, on).expect("f8e4m3 refuses variants");
                assert!(why.contains("f8e4m3"), "{why}");
            }
        }
        let named = refuses_with(&cases[5], false).expect("refused");
        assert!(named.contains("softcap") && named.contains("alibi"), "{named}");
        let explicit = plain.clone().with_mask(Mask::Explicit(ExplicitMask::full(MaskValues::Boolean, &plain.shape)));
        let explicit = explicit.with_window(Window::left(8));
        assert!(refuses_with(&explicit, true).expect("refused").contains("explicit"));
        assert!(refuses_with(&cases[0].clone().with_scale(-1.0), true).expect("refused").contains("positive"));
        // Sq + Sk within the kernel's 32-bit band arithmetic.
        let long = |sq: usize, sk: usize| {
            AttentionSpec::new(Shape { b: 1, hq: 1, hkv: 1, sq, sk, d: 128, dv: 128 }, DType::BF16)
                .with_mask(Mask::CausalBottomRight)
                .with_window(Window::left(4096))
        };
        assert_eq!(refuses_with(&long(1 << 20, VARIANT_MAX_TOKENS - (1 << 20) - 1), true), None);
        let why = refuses_with(&long(1 << 20, VARIANT_MAX_TOKENS - (1 << 20)), true).expect("refused");
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
        let p = variant_program(DType::BF16, (128, 128), t, VAR_BAND | VAR_SOFTCAP | VAR_ALIBI, true);
        assert_eq!(p.name, "fa3_t128x2_bf16_128_band_softcap_alibi");
        assert_eq!(
            p.instantiation,
            "FA3_ENTRY_VAR(fa3_t128x2_bf16_128_band_softcap_alibi, __nv_bfloat16, 128, 128, 128, 2, \
             FA3_VAR_BAND | FA3_VAR_SOFTCAP | FA3_VAR_ALIBI, true, 2)"
        );
        let p = variant_program(DType::F16, (192, 128), variant_tile_for(192, 128), VAR_BAND, false);
        assert_eq!(p.name, "fa3_t128x2_f16_192_128_band_pp0");
        assert!(p.instantiation.ends_with(", 192, 128, 128, 2, FA3_VAR_BAND, false, 2)"), "{}", p.instantiation);
        // Every variant entry: two consumers (240 registers each), the tile fits, names unique and apart
        // from the plain ones; only the compile check's two are in `programs`.
        let all = variant_programs();
        assert_eq!(all.len(), 2 * FA3_CLASSES.len() * 4);
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
        let listed = programs();
        let check = compile_check_variant_programs();
        assert_eq!(check.len(), 2);
        assert!(check.iter().all(|p| all.contains(p) && listed.contains(p) && compile_check_programs().contains(p)));
        assert_eq!(listed.iter().filter(|p| p.name.contains("_band")).count(), check.len());
        // The kernel side has the entry macro and the variant bits the names stand for.
        assert!(FA3.source.contains("#define FA3_ENTRY_VAR(NAME, T, D, DV, BN, ST, VAR, PP, NC)"));
        assert!(FA3.source.contains("#define FA3_VAR_SOFTCAP 2\n") && FA3.source.contains("#define FA3_VAR_ALIBI 4\n"));
        assert_eq!((VAR_BAND, VAR_SOFTCAP, VAR_ALIBI), (1, 2, 4));
    }

    /// A model of the kernel's key-tile ranges under a band, line by line as fa3.cu computes them
    /// (`fa3_kv_tiles` with VAR, and `fa3_consume_tile`'s ja, je, jp0, jp1 and its loops' bounds a1, a2), checked
    /// against sdpa-core's band by brute force: every key a row sees lies in a tile its warpgroup computes, the
    /// loaded tiles lie inside the keys, each warpgroup's tiles inside the work tile's, and the tiles its plain
    /// loop runs without the mask code are wholly visible to every row of the warpgroup (and those a warp's
    /// `edge` test passes to every row of the warp).
    #[test]
    fn the_kernels_band_tile_ranges_hold_every_visible_key() {
        use sdpa_core::variants::{Diagonal, Window};
        // fa3.cu fa3_band_keys.
        let band_keys = |lo: i64, hi: i64, sk: i64, r_first: i64, r_last: i64| {
            let first = (r_first + lo).clamp(0, sk);
            let end = (r_last + hi + 1).clamp(0, sk);
            (first, end)
        };
        let mut checked = 0usize;
        for (sq, sk) in [(1, 1), (77, 300), (300, 77), (129, 257), (200, 130), (513, 1000), (64, 4096)] {
            let windows = [
                (None, Some(0)),
                (Some(0), Some(0)),
                (Some(5), Some(0)),
                (Some(100), Some(0)),
                (Some(130), Some(3)),
                (Some(40), None),
                (None, Some(17)),
                (Some(1), Some(1)),
                (Some(300), Some(300)),
                (Some(1 << 20), Some(1 << 20)),
            ];
            for (left, right) in windows {
                for diag in [Diagonal::TopLeft, Diagonal::BottomRight] {
                    for mask in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight] {
                        let spec =
                            AttentionSpec::new(Shape { b: 1, hq: 1, hkv: 1, sq, sk, d: 64, dv: 64 }, DType::BF16)
                                .with_mask(mask)
                                .with_window(Window { left, right })
                                .with_diagonal(diag);
                        let band = spec.band();
                        let (lo, hi) = band.clamped(sq, sk);
                        for bn in [64i64, 80, 128] {
                            for nc in [2, 3] {
                                checked += model_check(&band, lo, hi, sq as i64, sk as i64, bn, nc, &band_keys);
                            }
                        }
                    }
                }
            }
        }
        assert!(checked > 1000, "{checked}");
    }

    /// A work tile of the model: its key-tile count and, per consumer warpgroup, the tiles `ja .. je` it
    /// computes (`None`: no rows, `fa3_has_rows`). The first key tile does not enter the protocol.
    type ModelTile = (i64, Vec<Option<(i64, i64)>>);

    /// The work tile at `m0` of a variant entry with `nc` consumers under the kernel's band ranges (the model
    /// of `the_kernels_band_tile_ranges_hold_every_visible_key`: `fa3_kv_tiles` with VAR, and
    /// `fa3_consume_tile`'s ja, je).
    fn model_tile(lo: i64, hi: i64, sq: i64, sk: i64, bn: i64, m0: i64, nc: i64) -> ModelTile {
        let keys = |r_first: i64, r_last: i64| ((r_first + lo).clamp(0, sk), (r_last + hi + 1).clamp(0, sk));
        let (first, end) = keys(m0, (m0 + 64 * nc).min(sq) - 1);
        let (t0, n) = if end <= first { (0, 0) } else { (first / bn, (end + bn - 1) / bn - first / bn) };
        let wg = |w: i64| {
            let r0 = m0 + 64 * w;
            (r0 < sq).then(|| {
                let (first, end) = keys(r0, (r0 + 63).min(sq - 1));
                let ja = if end > first { n.min((first / bn - t0).max(0)) } else { 0 };
                let je = if end > first { ja.max(n.min((end + bn - 1) / bn - t0)) } else { 0 };
                (ja, je)
            })
        };
        (n, (0..nc).map(wg).collect())
    }

    /// The work tile at `m0` of a plain entry (VAR = 0) with `nc` consumers: no mask (`causal` None) or a
    /// causal one with that `causal_offset` (`fa3_kv_tiles` without VAR; `fa3_consume_tile`'s ja = 0 and je
    /// from `wg_last_key`).
    fn plain_model_tile(causal: Option<i64>, sq: i64, sk: i64, bn: i64, m0: i64, nc: i64) -> ModelTile {
        let m_end = (m0 + 64 * nc).min(sq);
        let n_keys = causal.map_or(sk, |co| (m_end + co).min(sk).max(0));
        let n = (n_keys + bn - 1) / bn;
        let wg = |w: i64| {
            (m0 + 64 * w < sq).then(|| match causal {
                None => (0, n),
                Some(co) => {
                    let wg_last_key = m0 + 64 * w + 63 + co;
                    (0, if wg_last_key < 0 { 0 } else { n.min(wg_last_key / bn + 1) })
                }
            })
        };
        (n, (0..nc).map(wg).collect())
    }

    /// Depth of the work-tile ring (fa3.cu `FA3_SCHED`).
    const MODEL_SCHED: usize = 4;

    /// One step of the protocol between the producer's thread and the consumer warpgroups, as fa3.cu issues
    /// them (barrier arrivals and waits only; what the copies and products do is not modelled). Kinds of
    /// mbarrier pairs: K (0) and V (1) ring slots, each consumer's Q buffer (2), the work-tile ring (3).
    #[derive(Debug, Clone, Copy)]
    enum Op {
        /// Producer: wait until the consumers released use `u` of slot `s` of kind `k` (`(k, s, u)`).
        WaitEmpty(usize, usize, usize),
        /// Producer: fill use `u` of a slot (its `full` barrier completes).
        Fill(usize, usize, usize),
        /// Consumer: wait until use `u` of a slot landed.
        WaitFull(usize, usize, usize),
        /// Consumer: arrive on the `empty` barrier of use `u` of a slot.
        Release(usize, usize, usize),
        /// `bar.sync b, 256` (a turn begins) and `bar.arrive b, 256` (a turn is handed on).
        Sync(usize),
        Arrive(usize),
    }

    /// The ops of one block running `tiles` with ring depth `st`, `nc` consumers, ping-pong or not, and the
    /// turns restarted at every work tile or not (`tt`: FA3_XO_TILE_TURNS): the producer's, then each
    /// consumer's, in program order. The work-tile ring carries the tiles and then the end (-1).
    fn protocol(tiles: &[ModelTile], st: usize, nc: usize, pp: bool, tt: bool) -> Vec<Vec<Op>> {
        let mut prod = Vec::new();
        let mut cons = vec![Vec::new(); nc];
        let (mut ring, mut nq, mut turn) = (0usize, vec![0usize; nc], vec![0usize; nc]);
        // fa3_publish_tile by the producer, fa3_take_tile by every consumer: entry `k` of the work-tile ring.
        let sched = |prod: &mut Vec<Op>, cons: &mut [Vec<Op>], k: usize| {
            let (s, u) = (k % MODEL_SCHED, k / MODEL_SCHED);
            if u > 0 {
                prod.push(Op::WaitEmpty(3, s, u - 1));
            }
            prod.push(Op::Fill(3, s, u));
            for ops in cons.iter_mut() {
                ops.extend([Op::WaitFull(3, s, u), Op::Release(3, s, u)]);
            }
        };
        for (k, (n, wgs)) in tiles.iter().enumerate() {
            assert_eq!(wgs.len(), nc);
            sched(&mut prod, &mut cons, k);
            let n = *n as usize;
            let at = |j: usize| ((ring + j) % st, (ring + j) / st);
            // fa3_produce_tile: K0, each consumer's Q, then V0, K1, V1, ...
            let load = |prod: &mut Vec<Op>, kind: usize, j: usize| {
                let (s, u) = at(j);
                if u > 0 {
                    prod.push(Op::WaitEmpty(kind, s, u - 1));
                }
                prod.push(Op::Fill(kind, s, u));
            };
            if n > 0 {
                load(&mut prod, 0, 0);
            }
            for (w, wg) in wgs.iter().enumerate() {
                if wg.is_some() {
                    if nq[w] > 0 {
                        prod.push(Op::WaitEmpty(2, w, nq[w] - 1));
                    }
                    prod.push(Op::Fill(2, w, nq[w]));
                }
            }
            for j in 0..n {
                if j > 0 {
                    load(&mut prod, 0, j);
                }
                load(&mut prod, 1, j);
            }
            // fa3_consume_tile, per warpgroup.
            for (w, wg) in wgs.iter().enumerate() {
                let ops = &mut cons[w];
                let last_wg = w == nc - 1;
                let turns = if n > 0 { n + 1 } else { 0 };
                let turns_end = turn[w] + turns;
                // turn_begin and turn_end; `t` is this warpgroup's turn count (over the block's run).
                let t = std::cell::Cell::new(turn[w]);
                let take_turn = |ops: &mut Vec<Op>| {
                    if pp && (tt || w != 0 || t.get() > 0) {
                        ops.push(Op::Sync(3 + w));
                    }
                    if pp && !(tt && last_wg && t.get() == turns_end - 1) {
                        ops.push(Op::Arrive(3 + if last_wg { 0 } else { w + 1 }));
                    }
                    t.set(t.get() + 1);
                };
                // FA3_XO_TILE_TURNS: the last warpgroup hands warpgroup 0 its first turn of the tile.
                if pp && tt && last_wg && turns > 0 {
                    ops.push(Op::Arrive(3));
                }
                let (ja, je) = wg.map_or((0, 0), |(a, e)| (a as usize, e as usize));
                if wg.is_some() {
                    ops.push(Op::WaitFull(2, w, nq[w]));
                    if je == ja {
                        ops.push(Op::Release(2, w, nq[w]));
                    }
                }
                let skip = |ops: &mut Vec<Op>, j: usize, take_turn: &dyn Fn(&mut Vec<Op>)| {
                    let (s, u) = at(j);
                    take_turn(ops);
                    ops.extend([
                        Op::WaitFull(0, s, u),
                        Op::Release(0, s, u),
                        Op::WaitFull(1, s, u),
                        Op::Release(1, s, u),
                    ]);
                };
                for j in 0..ja {
                    skip(ops, j, &take_turn);
                }
                if je > ja {
                    let (s, u) = at(ja);
                    ops.push(Op::WaitFull(0, s, u));
                    take_turn(ops);
                    if je - ja == 1 {
                        ops.push(Op::Release(2, w, nq[w]));
                    }
                    ops.push(Op::Release(0, s, u));
                }
                for j in ja + 1..je {
                    let ((s, u), (sp, up)) = (at(j), at(j - 1));
                    ops.extend([Op::WaitFull(0, s, u), Op::WaitFull(1, sp, up)]);
                    take_turn(ops);
                    if j == je - 1 {
                        ops.push(Op::Release(2, w, nq[w]));
                    }
                    ops.extend([Op::Release(0, s, u), Op::Release(1, sp, up)]);
                }
                if je > ja {
                    let (s, u) = at(je - 1);
                    ops.push(Op::WaitFull(1, s, u));
                    take_turn(ops);
                    ops.push(Op::Release(1, s, u));
                }
                for j in je..n {
                    skip(ops, j, &take_turn);
                }
                while t.get() < turns_end {
                    take_turn(ops);
                }
                assert_eq!(t.get(), turns_end, "consumer {w} took more turns than n + 1");
                turn[w] = turns_end;
            }
            ring += n;
            for (w, wg) in wgs.iter().enumerate() {
                nq[w] += usize::from(wg.is_some());
            }
        }
        sched(&mut prod, &mut cons, tiles.len()); // the end (-1)
                                                  // fa3_end_turns: warpgroup 0 takes the last hand-over (none left with the turns restarted per tile).
        if pp && !tt && turn[0] > 0 {
            cons[0].push(Op::Sync(3));
        }
        let mut all = vec![prod];
        all.extend(cons);
        all
    }

    /// Runs the agents' ops (`ops[0]` the producer's, then `nc` consumers') under a random interleaving
    /// (`seed`): each step, one agent whose next op can proceed takes it. Fails on a deadlock, on a wait that
    /// could see a barrier two phases ahead, on an `empty` arrival for a phase other than the current one or
    /// twice in one phase or before the fill landed, on a fill out of order, on a named-barrier `bar.sync` by a
    /// warpgroup other than its owner or an arrival by one other than the previous in the round, and on a
    /// named-barrier arrival while an earlier one is unconsumed (128 more arrivals would complete the
    /// 256-thread barrier without its owner); at the end every fill was released and every hand-over taken.
    fn run_protocol(ops: &[Vec<Op>], st: usize, mut seed: u64) -> Result<(), String> {
        let nc = ops.len() - 1;
        let slots = |k: usize| match k {
            2 => nc,
            3 => MODEL_SCHED,
            _ => st,
        };
        let mut full: Vec<Vec<usize>> = (0..4).map(|k| vec![0; slots(k)]).collect();
        let mut empty = full.clone();
        let mut pending: Vec<Vec<Vec<bool>>> = (0..4).map(|k| vec![vec![false; nc]; slots(k)]).collect();
        let (mut arrivals, mut syncs) = ([0usize; 8], [0usize; 8]);
        let mut pc = vec![0usize; ops.len()];
        loop {
            let ready = |a: usize,
                         full: &Vec<Vec<usize>>,
                         empty: &Vec<Vec<usize>>,
                         arrivals: &[usize; 8],
                         syncs: &[usize; 8]| {
                match ops[a].get(pc[a]) {
                    None => false,
                    Some(Op::WaitEmpty(k, s, u)) => empty[*k][*s] > *u,
                    Some(Op::WaitFull(k, s, u)) => full[*k][*s] > *u,
                    Some(Op::Sync(b)) => arrivals[*b] > syncs[*b],
                    Some(_) => true,
                }
            };
            let runnable: Vec<usize> = (0..ops.len()).filter(|&a| ready(a, &full, &empty, &arrivals, &syncs)).collect();
            if runnable.is_empty() {
                if (0..ops.len()).all(|a| pc[a] == ops[a].len()) {
                    break;
                }
                let at: Vec<String> = (0..ops.len()).map(|a| format!("{:?}", ops[a].get(pc[a]))).collect();
                return Err(format!("deadlock: producer at {}, consumers at {:?}", at[0], &at[1..]));
            }
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let a = runnable[(seed >> 33) as usize % runnable.len()];
            let op = ops[a][pc[a]];
            pc[a] += 1;
            match op {
                Op::WaitEmpty(k, s, u) if empty[k][s] > u + 1 => return Err(format!("{op:?}: two phases ahead")),
                Op::WaitFull(k, s, u) if full[k][s] > u + 1 => return Err(format!("{op:?}: two phases ahead")),
                Op::Fill(k, s, u) => {
                    if full[k][s] != u {
                        return Err(format!("{op:?}: fill out of order"));
                    }
                    full[k][s] += 1;
                }
                Op::Release(k, s, u) => {
                    let w = a - 1;
                    // A Q buffer has one consumer; the K/V slots and the work-tile ring take every one.
                    let need = if k == 2 { 1 } else { nc };
                    if empty[k][s] != u || pending[k][s][w] || full[k][s] <= u {
                        return Err(format!("consumer {w} {op:?}: empty at {}, full at {}", empty[k][s], full[k][s]));
                    }
                    pending[k][s][w] = true;
                    if pending[k][s].iter().filter(|&&x| x).count() == need {
                        pending[k][s].iter_mut().for_each(|x| *x = false);
                        empty[k][s] += 1;
                    }
                }
                Op::Sync(b) => {
                    if b != 3 + (a - 1) {
                        return Err(format!("consumer {} syncs on barrier {b}", a - 1));
                    }
                    syncs[b] += 1;
                }
                Op::Arrive(b) => {
                    if b != 3 + a % nc {
                        return Err(format!("consumer {} arrives on barrier {b}", a - 1));
                    }
                    if arrivals[b] != syncs[b] {
                        return Err(format!("consumer {} arrives on {b} before its last arrival was taken", a - 1));
                    }
                    arrivals[b] += 1;
                }
                _ => {}
            }
        }
        for k in 0..4 {
            if full[k] != empty[k] {
                return Err(format!("kind {k}: fills {:?}, releases {:?}", full[k], empty[k]));
            }
        }
        if arrivals != syncs {
            return Err(format!("named barriers: arrivals {arrivals:?}, syncs {syncs:?}"));
        }
        Ok(())
    }

    /// Some sequences of work tiles one block may run: all of them in fa3_tile_of's order (heaviest first),
    /// the static snake's share of block 1 of 3, pseudo-random subsets in order (the dynamic schedule's
    /// shares), each of at most `max` tiles, and none.
    fn model_sequences(all: &[ModelTile], max: usize) -> Vec<Vec<ModelTile>> {
        let mut seqs = vec![all.iter().take(max).cloned().collect::<Vec<_>>()];
        seqs.push(all.iter().skip(1).step_by(3).take(max).cloned().collect());
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ all.len() as u64;
        for _ in 0..2 {
            let pick: Vec<_> = all
                .iter()
                .filter(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (x >> 33) & 1 == 0
                })
                .take(max)
                .cloned()
                .collect();
            seqs.push(pick);
        }
        seqs.push(Vec::new()); // a block that finds no tile
        seqs
    }

    /// The ring and turn accounting of the variant entries, simulated: blocks running sequences of work tiles
    /// whose key ranges start and end at different tiles (windows of several widths, both diagonals, causal
    /// bands, rows with no key, tiles with no key tile, consumers with no rows), two or three consumers, ring
    /// depths 1 to 4, with and without ping-pong, under many random interleavings, never deadlock, release
    /// every slot use once per fill after it landed, and hand every turn over exactly once (`run_protocol`).
    #[test]
    fn the_variant_ring_and_turns_neither_deadlock_nor_miscount() {
        use sdpa_core::variants::{Diagonal, Window};
        let mut runs = 0;
        for (sq, sk) in [(77, 300), (300, 77), (300, 200), (513, 1000), (700, 650), (1000, 2500)] {
            for (left, right, mask) in [
                (Some(5), Some(0), Mask::CausalBottomRight),
                (Some(150), Some(0), Mask::None),
                (Some(64), Some(64), Mask::None),
                (None, Some(3), Mask::None),
                (Some(300), None, Mask::CausalTopLeft),
                (Some(2), Some(0), Mask::None),
                (Some(1 << 20), Some(1 << 20), Mask::None),
            ] {
                let spec = AttentionSpec::new(Shape { b: 1, hq: 1, hkv: 1, sq, sk, d: 64, dv: 64 }, DType::BF16)
                    .with_mask(mask)
                    .with_window(Window { left, right })
                    .with_diagonal(if sq > sk { Diagonal::BottomRight } else { Diagonal::TopLeft });
                let (lo, hi) = spec.band().clamped(sq, sk);
                for nc in [2i64, 3] {
                    for bn in [80i64, 128] {
                        let all: Vec<_> = (0..(sq as i64 + 64 * nc - 1) / (64 * nc))
                            .rev()
                            .map(|mb| model_tile(lo, hi, sq as i64, sk as i64, bn, 64 * nc * mb, nc))
                            .collect();
                        for tiles in model_sequences(&all, 8) {
                            for st in 1..=4 {
                                for pp in [true, false] {
                                    let ops = protocol(&tiles, st, nc as usize, pp, false);
                                    for seed in 0..4 {
                                        if let Err(e) = run_protocol(&ops, st, seed) {
                                            panic!(
                                                "Sq {sq} Sk {sk} window {left:?},{right:?} {mask:?} NC {nc} BN {bn} \
                                                 ST {st} pp {pp} tiles {tiles:?}: {e}"
                                            );
                                        }
                                        runs += 1;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(runs > 5000, "{runs}");
    }

    /// The plain and measurement entries' ring and turns, simulated as the variants' are
    /// (`the_variant_ring_and_turns_neither_deadlock_nor_miscount`): no mask and causal masks of both
    /// alignments (bottom-right with Sq > Sk gives work tiles with no key tile and warpgroups that skip every
    /// tile), rows past Sq (consumers with no rows), two or three consumers, ring depths 1 to 4, with and
    /// without ping-pong, with the turns round robin across tiles and restarted at every tile
    /// (FA3_XO_TILE_TURNS, `SDPA_FA3_AB=tile-turns`).
    #[test]
    fn the_plain_and_tile_turn_rings_neither_deadlock_nor_miscount() {
        let mut runs = 0;
        for (sq, sk) in [(77, 300), (300, 77), (129, 129), (513, 1000), (700, 200), (1000, 650)] {
            let (sq, sk) = (sq as i64, sk as i64);
            for causal in [None, Some(0), Some(sk - sq)] {
                for nc in [2i64, 3] {
                    for bn in [64i64, 128, 176] {
                        let all: Vec<_> = (0..(sq + 64 * nc - 1) / (64 * nc))
                            .rev()
                            .map(|mb| plain_model_tile(causal, sq, sk, bn, 64 * nc * mb, nc))
                            .collect();
                        for tiles in model_sequences(&all, 8) {
                            for st in 1..=4 {
                                for (pp, tt) in [(true, false), (true, true), (false, false)] {
                                    let ops = protocol(&tiles, st, nc as usize, pp, tt);
                                    for seed in 0..4 {
                                        if let Err(e) = run_protocol(&ops, st, seed) {
                                            panic!(
                                                "Sq {sq} Sk {sk} causal {causal:?} NC {nc} BN {bn} ST {st} pp {pp} \
                                                 tile turns {tt} tiles {tiles:?}: {e}"
                                            );
                                        }
                                        runs += 1;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(runs > 5000, "{runs}");
    }

    /// Regression: a warpgroup skipping tile j waited for its K and V to land before taking its empty turn j,
    /// and with ring depth 1 the fill of V(j) waits for V(j - 1) from a later warpgroup that releases it only
    /// after its own turn j: with three consumers, the first seeing no key of a work tile whose others do
    /// (causal bottom-right, Sq > Sk), the block deadlocked, in either turn protocol. fa3.cu's `skip` now takes
    /// the turn first.
    #[test]
    fn a_warpgroup_skipping_a_tile_hands_its_turn_on_before_waiting_for_the_tile() {
        let tile: ModelTile = (2, vec![Some((0, 0)), Some((0, 1)), Some((0, 2))]);
        assert_eq!(plain_model_tile(Some(200 - 700), 700, 200, 64, 384, 3), tile);
        for tt in [false, true] {
            let ops = protocol(std::slice::from_ref(&tile), 1, 3, true, tt);
            for seed in 0..16 {
                if let Err(e) = run_protocol(&ops, 1, seed) {
                    panic!("tile turns {tt}: {e}");
                }
            }
        }
    }

    /// One call's work tiles (`nc` consumers, 64 `nc` rows) under the model; returns the tiles checked.
    #[allow(clippy::too_many_arguments)]
    fn model_check(
        band: &sdpa_core::KeyBand,
        lo: i64,
        hi: i64,
        sq: i64,
        sk: i64,
        bn: i64,
        nc: i64,
        band_keys: &dyn Fn(i64, i64, i64, i64, i64) -> (i64, i64),
    ) -> usize {
        let visible = |i: i64| band.range(i as usize, sk as usize);
        let mut checked = 0;
        for m0 in (0..sq).step_by(64 * nc as usize) {
            let m_end = (m0 + 64 * nc).min(sq);
            // fa3_kv_tiles<BN, MASK, VAR>.
            let (first, end) = band_keys(lo, hi, sk, m0, m_end - 1);
            let (t0, n_tiles) = if end <= first { (0, 0) } else { (first / bn, (end + bn - 1) / bn - first / bn) };
            assert!(t0 >= 0 && (t0 + n_tiles) * bn < sk + bn, "loaded tiles past the keys");
            for wgi in 0..nc {
                let r0 = m0 + 64 * wgi;
                if r0 >= sq {
                    continue; // fa3_has_rows: no rows, every tile released unread
                }
                let r1 = (r0 + 63).min(sq - 1);
                let (first, end) = band_keys(lo, hi, sk, r0, r1);
                let ja = if end > first { n_tiles.min((first / bn - t0).max(0)) } else { 0 };
                let je = if end > first { ja.max(n_tiles.min((end + bn - 1) / bn - t0)) } else { 0 };
                let lo_key = r1 + lo;
                let hi_end = (r0 + hi + 1).min(sk);
                let jp0 = (if lo_key <= 0 { 0 } else { (lo_key + bn - 1) / bn }) - t0;
                let jp1 = (if hi_end <= 0 { 0 } else { hi_end / bn }) - t0;
                assert!(0 <= ja && ja <= je && je <= n_tiles);
                for i in r0..=r1 {
                    let keys = visible(i);
                    if !keys.is_empty() {
                        let (k0, k1) = (keys.start as i64, keys.end as i64);
                        assert!(k0 >= (t0 + ja) * bn && k1 <= (t0 + je) * bn, "row {i} keys {k0}..{k1} outside");
                    }
                }
                // The loops: masked ja + 1 .. a1, plain a1 .. a2, masked a2 .. je (the prologue's tile ja masked).
                let a1 = (ja + 1).max(jp0).min(je);
                let a2 = a1.max(jp1).min(je);
                for j in a1..a2 {
                    let n0 = (t0 + j) * bn;
                    for i in r0..=r1 {
                        let keys = visible(i);
                        assert!(keys.start as i64 <= n0 && n0 + bn <= keys.end as i64, "plain tile {j} row {i}");
                    }
                    checked += 1;
                }
                // A warp's edge test (16 rows): no edge means every row of the warp sees the whole tile.
                for w0 in (r0..=r1).step_by(16) {
                    for j in ja..je {
                        let n0 = (t0 + j) * bn;
                        let edge = n0 + bn > sk || n0 < w0 + 15 + lo || n0 + bn - 1 > w0 + hi;
                        if !edge {
                            for i in w0..(w0 + 16).min(sq) {
                                let keys = visible(i);
                                assert!(keys.start as i64 <= n0 && n0 + bn <= keys.end as i64, "warp tile {j} row {i}");
                            }
                        }
                        checked += 1;
                    }
                }
            }
        }
        checked
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
            assert!(fp8_smem_bytes(FP8_TILE, d, dv) <= 227 * 1024, "{d}/{dv}");
        }
        assert_eq!(fp8_smem_bytes(FP8_TILE, 64, 64), 2 * 64 * 128 + 2 * 128 * (128 + 64) + 8 * 12 + 20 * SCHED_RING);
        assert_eq!(fp8_tile_for(64, 64, false).consumers, 3);
        assert_eq!(fp8_tile_for(64, 64, true).consumers, 2);
        assert_eq!(fp8_tile_for(128, 128, false), FP8_TILE);
        assert!(fp8_smem_bytes(fp8_tile_for(64, 64, false), 64, 64) <= 227 * 1024);
        assert!(fp8_smem_bytes(Fa3Tile { stages: 3, ..FP8_TILE }, 256, 256) <= 227 * 1024);
        let p = program(DType::F8E4M3, (128, 128), FP8_TILE, MASK_CAUSAL, true);
        assert_eq!(p.name, "fa3_t128x2_f8e4m3_128_causal");
        assert!(
            p.instantiation.contains("sdpa_e4m3, 128, 128, 128, 2, FA3_MASK_CAUSAL, true, 2)"),
            "{}",
            p.instantiation
        );
        assert_eq!(fp8_programs().len(), 7);
        assert_eq!(vt_keys(1), 16);
        assert_eq!(vt_keys(32), 32);
        assert_eq!(vt_keys(33), 48);
    }

    /// Regression: FP8 calls that `fa3` refuses (variants, explicit masks, ragged batches, a GPU other than
    /// sm_90) were told that `fa2` takes them, which then refuses f8e4m3 too; f16/bf16 keep the advice.
    #[test]
    fn fp8_calls_past_the_pre_pass_grid_are_refused_up_front() {
        let at = |b: usize, hkv: usize| {
            let shape = Shape { b, hq: hkv, hkv, sq: 16, sk: 16, d: 64, dv: 64 };
            refuses(&AttentionSpec::new(shape, DType::F8E4M3))
        };
        assert_eq!(at(1, VT_MAX_BATCH_HEADS), None);
        let why = at(2, 40_000).expect("refused");
        assert!(why.contains("65535") && why.contains("B = 2 x Hkv = 40000"), "{why}");
        // bf16 has no pre-pass: the same shape is not refused for it.
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
        let cases = [
            fp8.clone().with_window(sdpa_core::variants::Window::left(64)),
            fp8.clone().with_softcap(30.0),
            explicit,
            ragged,
        ];
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
        assert!(refuses(&bf16.clone().with_softcap(30.0)).expect("refused").contains("fa2 does"));
        let p = AttnParams::new(&bf16, 256, 512, 768, 1024, 0, 0).expect("params");
        assert!(check(&bf16, &p, (8, 0), 227 * 1024).expect_err("not sm_90").to_string().contains("use fa2"));
    }

    /// `Fa3Smem<T, D, DV, BN, ST, NC>::BYTES` of fa3.cu, transcribed term by term from its definition (the
    /// lines asserted below), for the entry `instantiation` (`FA3_ENTRY(name, T, D, DV, BN, ST, MASK, PP, NC)`),
    /// with its static_asserts; `None` where one of them would fail to compile.
    fn kernel_smem_bytes(instantiation: &str) -> Option<usize> {
        // FA3_ENTRY(NAME, T, D, DV, BN, ST, MASK, PP, NC) and FA3_ENTRY_VAR(NAME, T, D, DV, BN, ST, VAR, PP, NC)
        // put the layout's parameters at the same places.
        let inner = instantiation
            .strip_prefix("FA3_ENTRY(")
            .or_else(|| instantiation.strip_prefix("FA3_ENTRY_VAR("))
            .or_else(|| instantiation.strip_prefix("FA3_ENTRY_XO("))?
            .strip_suffix(')')?;
        let f: Vec<&str> = inner.split(", ").collect();
        let num = |i: usize| f.get(i).and_then(|x| x.parse::<usize>().ok());
        let (d, dv, bn, st, nc) = (num(2)?, num(3)?, num(4)?, num(5)?, num(8)?);
        let fp8 = *f.get(1)? == "sdpa_e4m3";
        let es = if fp8 { 1 } else { 2 };
        let cols = 128 / es;
        let ds = d.div_ceil(cols) * cols;
        let dvs = if fp8 { dv } else { dv.div_ceil(64) * 64 };
        let (q_bytes, k_bytes, v_bytes) = (64 * ds * es, bn * ds * es, bn * dvs * es);
        let bar_off = nc * q_bytes + st * k_bytes + st * v_bytes;
        let sched_bar_off = bar_off + 8 * (2 * nc + 4 * st);
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
            "static constexpr int BAR_OFF = V_OFF + ST * V_BYTES;",
            "static constexpr int SCHED_BAR_OFF = BAR_OFF + 8 * (2 * NC + 4 * ST);",
            "static constexpr int SCHED_OFF = SCHED_BAR_OFF + 16 * FA3_SCHED;",
            "static constexpr int BYTES = SCHED_OFF + 4 * FA3_SCHED;",
        ] {
            assert!(FA3.source.contains(line), "fa3.cu's Fa3Smem changed ({line}): update kernel_smem_bytes");
        }
        let host = |p: &Program, tile: Fa3Tile, (d, dv): (usize, usize), fp8: bool| {
            let kernel = kernel_smem_bytes(&p.instantiation).unwrap_or_else(|| panic!("{} does not compile", p.name));
            let host = if fp8 { fp8_smem_bytes(tile, d, dv) } else { tile.smem_bytes(d, dv) };
            assert_eq!(host, kernel, "{}", p.name);
            host
        };
        // Every listed program: each class, dtype, mask and table tile (with and without ping-pong), and FP8's.
        let mut n = 0;
        for p in programs().iter().filter(|p| p.name != vt_program().name) {
            let args = p.instantiation.trim_end_matches(')');
            // D, DV, BN, ST and NC by position (the sixth is the mask, or the variant bits).
            let f: Vec<Option<usize>> = args.split(", ").map(|x| x.parse().ok()).collect();
            let at =
                |i: usize| f.get(i).copied().flatten().unwrap_or_else(|| panic!("{}: {}", p.name, p.instantiation));
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
                for (stages, consumers) in [(1, 2), (2, 2), (3, 3), (4, 2), (4, 3)] {
                    let tile = Fa3Tile { bn, stages, consumers };
                    host(&program(DType::BF16, class, tile, MASK_CAUSAL, true), tile, class, false);
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
        let both = AbSwitches::parse("store4, tile-turns").expect("both");
        assert_eq!(both.bits(), 3);
        assert_eq!(AbSwitches::parse("tile-turns").expect("turns").bits(), 2);
        let err = AbSwitches::parse("store4,store16").expect_err("unknown").to_string();
        assert!(err.contains("store16") && err.contains("tile-turns"), "{err}");
        let tile = tile_for(128, 128, false, 4096);
        let plain = program(DType::BF16, (128, 128), tile, MASK_NONE, true);
        let st = AbSwitches { store4: true, tile_turns: false };
        let m = measured_program(DType::BF16, (128, 128), tile, MASK_NONE, true, st);
        assert_eq!(m.name, format!("{}_xo1", plain.name));
        assert!(
            m.instantiation.starts_with("FA3_ENTRY_XO(") && m.instantiation.ends_with(", 1)"),
            "{}",
            m.instantiation
        );
        assert_eq!(
            measured_program(DType::BF16, (128, 128), tile, MASK_NONE, true, AbSwitches::default()).name,
            plain.name
        );
        assert!(FA3.source.contains("#define FA3_XO_STORE4 1\n#define FA3_XO_TILE_TURNS 2\n"), "bits changed");
        assert!(FA3.source.contains("#define FA3_ENTRY_XO(NAME, T, D, DV, BN, ST, MASK, PP, NC, XO)"));
    }

    #[test]
    fn forced_tiles_refuse_parts_that_are_not_numbers() {
        assert_eq!(parse_tile("128, 2"), Some(Fa3Tile { bn: 128, stages: 2, consumers: 2 }));
        assert_eq!(parse_tile("64,4,3"), Some(Fa3Tile { bn: 64, stages: 4, consumers: 3 }));
        for bad in ["128,x,2", "x,128,2", "128,2,", "128", "100,2", "128,5", "128,2,4", ""] {
            assert_eq!(parse_tile(bad), None, "{bad:?}");
        }
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
}
