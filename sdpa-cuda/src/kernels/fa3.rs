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
//! The grid is persistent ([`grid_blocks`]: one block per multiprocessor (two for a one-consumer tile, where they
//! fit: [`Fa3Tile::blocks_per_sm`]) walking the work tiles, the next tile's Q and K/V loaded while the current one
//! finishes); each block takes its next tile from an atomic counter when it is ready for one
//! ([`Schedule::Dynamic`]; the counter is kept zero between calls, see [`run`]), or follows session 7's static
//! share (`SDPA_FA3_SCHED=static`); the tile ([`tile_for`]: keys per tile, ring depth, consumer warpgroups) is
//! chosen by head dim and mask. `SDPA_FA3_TILE` and `SDPA_FA3_GRID` override both for tuning runs and tests.
//!
//! Head dims: compiled classes (Q/K width, V/O width) [`FA3_CLASSES`]; a call runs the first class at or
//! above its D and Dv ([`head_dim_class`]). The tensor maps carry the call's own widths, so TMA fills a box's
//! columns past them with zeros (64-column blocks wholly past them are not loaded), and O is stored up to Dv.
//!
//! What it takes today ([`refuses`]): f16/bf16 (and f8e4m3, below), D and Dv multiples of 8 up to 256, no mask or a
//! causal one, a positive scale, dense batches and ragged ones (packed or paged, below), operands a tensor map can
//! describe (base and every stride of Q, K, V, O multiples of 8 elements), a compute-capability 9.0 GPU. Everything
//! else is refused with what `fa3` lacks (it never falls back silently): `fa2` runs those calls. `auto` picks `fa3`
//! where it takes the call and was measured faster than `fa2` ([`super::policy::resolve_auto`];
//! `bench/results/gpu/fa3.md`).
//!
//! Windows, softcap and ALiBi (`FA3_ENTRY_VAR`, [`variant_program`]; f16/bf16 written in session 9 without a GPU,
//! verified on the H100 in session 10: `bench/results/gpu/fa3.md`; f8e4m3 written in session 24, behind
//! [`FP8_VARIANTS_SWITCH`] until a GPU verifies it). A variant entry restricts
//! the keys to the call's band (windows, causal masks as a special case): only the key tiles some row of the work tile
//! sees are loaded, each consumer computes its own rows' tiles, and only tiles crossing a band edge run the mask code;
//! softcap and ALiBi transform the scores in registers before the online softmax. Two consumers at every class
//! ([`variant_tile_for`], [`fp8_variant_tile_for`]). FP8 variant entries come in both V layouts (below).
//!
//! Ragged (varlen) batches, K/V packed or in a paged cache (f16/bf16; `FA3_ENTRY_SERVE`, [`serve_program`]), were
//! written in session 10 without a GPU and verified on the H100 in the same session (`bench/results/gpu/fa3.md`,
//! "Ragged batches"); [`refuses_ragged`] says what they do not take. The work tiles are [`super::fa2::schedule`]'s
//! (sequence, query tile) pairs, heaviest first, times the heads (uploaded per content, read by the kernel through
//! `Fa3Args::seq_tiles`); each runs the dense code on its sequence's own lengths, band and diagonal (both causal
//! alignments and the variants as `fa2` defines them per sequence). The Q and O maps run over the packed rows as one
//! batch; K and V too, or over the pool's pages, a key tile arriving as boxes of min(keys per tile, page size) keys
//! through the block table ([`paged_tile`]: page sizes that are multiples of 8 and divide the key tile or are multiples
//! of it, 64 keys per tile where the table's tile does not fit: pages of 32 or 64 slots at 112 or 80 keys, of 192 at
//! 128). What a box loads past a sequence is other data (the next sequence's rows, slots past the cache length), so
//! keys past Sk_b are masked on every tile that reaches them and rows past Sq_b are never stored; the LSE is
//! `[Hq, total_q]`. Two consumers at every class ([`ragged_tile_for`]). Other page sizes and f8e4m3 ragged calls are
//! refused, naming `fa2` and `splitkv`; `auto` sends packed ragged prefill here
//! ([`super::policy::fa3_may_take_ragged`]), paged calls only when asked for by name.
//!
//! FP8 (E4M3 inputs with per-tensor descales, bf16 O; kernels/fa3_fp8.cuh): classes 64, 128 and 256 with D and
//! Dv multiples of 16 ([`fp8_head_dim_class`]), 128 keys per tile ([`fp8_tile_for`]), Q, K and V bases and
//! strides multiples of 16 bytes. 8-bit `wgmma` reads V K-major, with the keys of each group of 16 permuted to
//! match P's registers, in one of two ways ([`fp8_transposes_in_kernel`], by how many work tiles read each V
//! tile, measured in session 23; under a window, only the query tiles its rows straddle, [`query_tiles_per_key`]):
//! - few (short queries: up to Sq = 2048 without GQA, 1024 at the class 256; decoding at any Sk), and calls of
//!   more than [`VT_MAX_BATCH_HEADS`] (batch, kv head) pairs: TMA stages each V tile as stored and the producer
//!   warpgroup's three warps that issue no copies write it transposed into the Vᵀ ring, once per work tile that
//!   loads it (kernels/fa3_fp8.cuh `fa3_fp8_transpose_v`; session 22);
//! - many: [`run`] first writes Vᵀ into a workspace (the `fa3_fp8_vt` pre-pass, a second launch of one grid row
//!   per pair, each V tile transposed once) and the kernel loads that (entries `_vtp`).
//!
//! The switches `vt-kernel` and `vt-prepass` ([`AbSwitches`]) force either for every call. Q's and K's descales
//! are folded into the softmax scale, V's into O's final scale ([`plan_with`]).
//! No non-finite repair yet: a NaN code in V under a masked key of a loaded tile (past the diagonal, or outside a
//! row's window) reaches that tile's rows, where f16/bf16 keep it out.
//! Speed and accuracy: `bench/results/gpu/fp8.md`.

use crate::checked::call::Call;
use crate::checked::launch::{launch, LaunchDims};
use crate::checked::params::{mask_suffix, AttnParams, Masking, MASK_CAUSAL, MASK_NONE, VAR_ALIBI, VAR_SOFTCAP};
use crate::checked::tensor_map::{kv_operands, padded_tensor_map, KvOperand};
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
    /// Consumer warpgroups (2, or 3: 160 registers each instead of 240; or 1, a measurement tile: two blocks
    /// an SM where their shared memory fits, [`Fa3Tile::blocks_per_sm`]).
    pub consumers: usize,
}

impl Fa3Tile {
    /// Dynamic shared memory of a block at head-dim class (`d`, `dv`) (`Fa3Smem::BYTES`): Q of every
    /// consumer, the K and V rings (rows of [`stored`] columns), O's staging where it fits, the mbarriers
    /// (full and empty per consumer's Q, per K and per V slot) and the work-tile ring.
    pub fn smem_bytes(&self, d: usize, dv: usize) -> usize {
        with_o_stage(self.tile_bytes(d, dv), *self, 0)
    }

    /// The tiles' part of [`Fa3Tile::smem_bytes`] (f16/bf16): Q of every consumer and the K and V rings.
    pub fn tile_bytes(&self, d: usize, dv: usize) -> usize {
        let (d, dv) = (stored(d), stored(dv));
        self.consumers * 64 * d * 2 + self.stages * self.bn * (d + dv) * 2
    }

    /// Query rows per block (a work tile): 64 per consumer warpgroup.
    pub fn rows(&self) -> usize {
        64 * self.consumers
    }

    /// Blocks an SM holds at once with `smem` bytes of dynamic shared memory each (`FA3_MIN_BLOCKS`): two for one
    /// consumer where two blocks' shared memory fits the SM's 228 KB (1 KB of it reserved per block), one
    /// otherwise (a block of two or three consumers takes every register). The persistent grid launches this
    /// many blocks per SM.
    pub fn blocks_per_sm(&self, smem: usize) -> usize {
        if self.consumers == 1 && 2 * (smem + 1024) <= 228 * 1024 {
            2
        } else {
            1
        }
    }

    /// Whether the consumers take turns issuing their products (ping-pong, `PP`): with two or more, unless
    /// `SDPA_FA3_PINGPONG=0` turns it off (`forced_pp`: FP8 entries keep it on).
    pub fn pingpong(&self, forced_pp: bool) -> bool {
        self.consumers > 1 && (forced_pp || pingpong())
    }

    /// Threads per block: the consumers and the producer warpgroup (`FA3_THREADS`).
    pub fn threads(&self) -> usize {
        128 * (self.consumers + 1)
    }
}

impl Fa3Tile {
    /// The prefix of this tile's entry names: `fa3_t{bn}x{stages}`, with `w3` for three consumers and `w1` for one.
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
/// dynamic schedule (session 8, call 1) they ran 1.077x / 1.089x two at 4k / 16k and 0.904x at 1k, and in
/// session 17 1.042x at 2k, 0.925x at 1k and 0.883x at 512 (bf16, the fa2bench grid). Longer key tiles
/// (176, 192) at 64/128 were within the card's run-to-run spread, or slower (causal D = 128: 0.67-0.87x);
/// so were shorter ones and deeper rings at S = 512..2k (session 17, two consumers on both sides: 64 keys
/// four or three deep 0.78-0.98x, 96 keys three deep 0.84-0.97x at D = 64 causal and D = 128, 128 keys three
/// deep 0.98-0.99x at D = 64 causal).
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
pub const CAUSAL_64_THREE_FROM_KEYS: usize = 2048;

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
             stages and 1 (two blocks an SM where they fit), 2 or 3 consumer warpgroups"
        ))
    })
}

/// The tile `bn,stages[,consumers]` names, or `None` when a part is not a number (every part must be one: a
/// part left out would shift the others into other meanings) or a value is not one the kernel takes.
fn parse_tile(v: &str) -> Option<Fa3Tile> {
    let parsed: Vec<usize> = v.split(',').map(|x| x.trim().parse().ok()).collect::<Option<_>>()?;
    match parsed[..] {
        [bn @ (64 | 80 | 96 | 112 | 128 | 176 | 192), stages @ 1..=4] => Some(Fa3Tile { bn, stages, consumers: 2 }),
        [bn @ (64 | 80 | 96 | 112 | 128 | 176 | 192), stages @ 1..=4, consumers @ 1..=3] => {
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

/// Most (batch, kv head) pairs the FP8 pre-pass takes: it launches one grid row (`gridDim.z`) per pair, and CUDA
/// caps that dimension at 65535. The product transposes V in the kernel for larger calls
/// ([`fp8_transposes_in_kernel`]); under the `vt-prepass` switch they are refused before the workspace is
/// allocated ([`prepass_refuses`], from `check`).
pub const VT_MAX_BATCH_HEADS: usize = 65535;

/// Why the FP8 pre-pass cannot run `spec` (more than [`VT_MAX_BATCH_HEADS`] pairs), or `None`.
pub fn prepass_refuses(spec: &AttentionSpec) -> Option<String> {
    let s = spec.shape;
    (s.b.saturating_mul(s.hkv) > VT_MAX_BATCH_HEADS).then(|| {
        format!(
            "fa3's Vᵀ pre-pass (SDPA_FA3_AB=vt-prepass) takes f8e4m3 calls of at most {VT_MAX_BATCH_HEADS} (batch, \
             kv head) pairs (one grid row per pair; got B = {} x Hkv = {}); without the switch fa3 takes any count, \
             transposing V in the kernel",
            s.b, s.hkv
        )
    })
}

/// Why `fa3` cannot run the ragged `spec`, or `None` (also for a dense spec). f16/bf16 only (the f8e4m3 entries
/// have no ragged instantiation), packed K/V or a paged cache whose page size the key tile's boxes fit ([`paged_tile`]);
/// the others are refused with who takes them. The packed rows must leave the kernel's 32-bit TMA row coordinates
/// (packed row of a tile plus a box) room: total query rows plus keys below [`VARIANT_MAX_TOKENS`].
pub fn refuses_ragged(spec: &AttentionSpec) -> Option<String> {
    let r = spec.ragged.as_ref()?;
    if spec.dtype == DType::F8E4M3 {
        return Some(format!(
            "fa3 runs ragged (varlen) batches of f16 and bf16 only (its f8e4m3 entries read dense batches); {}",
            elsewhere(spec, "")
        ));
    }
    if let (Some(pages), Some((d, dv))) = (r.pages, head_dim_class(spec.shape.d, spec.shape.dv)) {
        let tile = ragged_tile_for(d, dv, false, 1);
        if paged_tile(tile, pages.page_size).is_none() {
            return Some(format!(
                "fa3 reads paged caches whose page size is a multiple of 8 that divides its key tile or is a \
                 multiple of it ({} or 64 keys at these head dims: e.g. 8, 16, 32, 64, 128, 256; got {}); fa2 \
                 (prefill) and splitkv (decoding) take any page size",
                tile.bn, pages.page_size
            ));
        }
    }
    if r.total_q().saturating_add(r.total_k()) >= VARIANT_MAX_TOKENS {
        return Some(format!(
            "fa3 takes ragged batches of fewer than {VARIANT_MAX_TOKENS} packed query rows plus keys (its TMA row \
             coordinates are 32-bit; got {} + {}); fa2 does",
            r.total_q(),
            r.total_k()
        ));
    }
    None
}

/// The verification switch of FP8's windows, softcap and ALiBi (session 24, written without a GPU): until a GPU
/// run verifies them, f8e4m3 variant calls are refused unless it is `1`, as session 9's f16/bf16 variants were
/// behind `SDPA_FA3_VARIANTS=1` until session 10 ran them.
pub const FP8_VARIANTS_SWITCH: &str = "SDPA_FA3_FP8_VARIANTS";

/// Whether [`FP8_VARIANTS_SWITCH`] is `1`.
pub fn fp8_variants_enabled() -> bool {
    std::env::var_os(FP8_VARIANTS_SWITCH).is_some_and(|v| v == "1")
}

/// Bound on Sq + Sk of the calls `fa3` takes with variants: the kernel's band tests and ALiBi distances
/// (keys minus band bounds, keys minus rows and diagonals) are 32-bit, which 64 Ki below 2^31 leaves room for
/// (64-bit ones made ptxas spill in the main loop).
pub const VARIANT_MAX_TOKENS: usize = (1 << 31) - (1 << 16);

/// Why `fa3` cannot run `spec` (whatever the device and pointers), or `None`.
pub fn refuses(spec: &AttentionSpec) -> Option<String> {
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
    if let Some(why) = refuses_ragged(spec) {
        return Some(why);
    }
    if spec.scale() <= 0.0 {
        return Some(format!("fa3 needs a positive scale (got {})", spec.scale()));
    }
    // Last, so that the switch it names would make the call run.
    if spec.dtype == DType::F8E4M3 && !kinds.is_empty() && !fp8_variants_enabled() {
        let names: Vec<&str> = kinds.iter().map(|v| v.name()).collect();
        return Some(format!(
            "fa3 takes {} on f8e4m3 inputs only under {FP8_VARIANTS_SWITCH}=1: that code is written but not yet \
             verified on a GPU (f16 and bf16 take them); {}",
            names.join(", "),
            elsewhere(spec, "")
        ));
    }
    None
}

/// The program of entry `{tile prefix}_{dtype}_{d}[_{dv}]_{mask}` (`_{dv}` for unequal classes, `_pp0`:
/// without ping-pong) at head-dim class (`d`, `dv`) with `tile`.
pub fn program(dtype: DType, class: (usize, usize), tile: Fa3Tile, mask_kind: i32, pingpong: bool) -> Program {
    measured_program(dtype, class, tile, mask_kind, pingpong, AbSwitches::default())
}

/// [`program`] with the switches `ab`: entry `..._xo{bits}` (`FA3_ENTRY_XO`) when a measurement switch
/// (`SDPA_FA3_AB`) is on, `..._vtp` when an FP8 entry reads the pre-pass's Vᵀ (`vt_prepass`, a product layout of
/// long FP8 calls), both in that order, else the plain entry itself.
pub fn measured_program(
    dtype: DType,
    (d, dv): (usize, usize),
    tile: Fa3Tile,
    mask_kind: i32,
    pingpong: bool,
    ab: AbSwitches,
) -> Program {
    let xo = ab.bits();
    // The pre-pass's layout is a product entry of FP8's long calls (`_vtp`); the other bits are measurement
    // switches (`_xo{bits}`).
    let measured = xo & !FA3_XO_VT_PREPASS;
    let xs = if measured == 0 { String::new() } else { format!("_xo{measured}") };
    let vtp = if ab.vt_prepass { "_vtp" } else { "" };
    let name = format!("{}{vtp}{xs}", entry_name(tile, dtype, (d, dv), mask_suffix(mask_kind), pingpong));
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

/// `{tile prefix}_{dtype}_{d}[_{dv}]_{tail}[_pp0]`: the name every `fa3` entry starts with (`_{dv}` for unequal
/// classes, `_pp0` without ping-pong; `tail` the mask or the variant set).
fn entry_name(tile: Fa3Tile, dtype: DType, (d, dv): (usize, usize), tail: &str, pingpong: bool) -> String {
    let pp = if pingpong { "" } else { "_pp0" };
    let dims = if d == dv { format!("{d}") } else { format!("{d}_{dv}") };
    format!("{}_{}_{dims}_{tail}{pp}", tile.prefix(), dtype.name())
}

/// Measurement switches (`SDPA_FA3_AB`, kernels/fa3.cu `FA3_XO_*`): each is the other side of an A/B the product
/// settled (the old code, or an alternative measured and left off), so that a single call times both on the
/// same card (bench/results/gpu/fa3.md, "Fifth step" to "Eighth step"). For measurement only: the product
/// kernel runs with none of them, but for `vt_prepass`, which also names the layout a long FP8 call reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AbSwitches {
    /// O stored as 16-byte row chunks after a quad transpose (`store16`, session 8's choice), inside the
    /// epilogue of sessions 10-19 (as `direct-o`), not through the product's staging.
    pub store16: bool,
    /// Ping-pong turns restarted at every work tile (`tile-turns`), not round robin across tiles.
    pub tile_turns: bool,
    /// `exp-fma=k` (k = 0..=8): k of every 8 columns of a score tile exponentiated on the FMA pipe instead of
    /// the special-function unit, in place of the product's share (`FA3_XO_EXP_FMA`; the plain entries, FP8
    /// included).
    pub exp_fma: Option<u8>,
    /// `desc-fold`: each step's `wgmma` descriptor formed as sessions 7-17 did (the tile's whole descriptor
    /// plus the step's offset, refolded by the compiler into a masked and shifted address per step), not as
    /// the product's one add to the low word (`FA3_XO_DESC_FOLD`; the plain entries; it restores the Q·Kᵀ
    /// steps and whole-block V steps, not FP8's P·V steps or the N = 32 product of classes 96, 160, 224). It
    /// also runs the causal diagonal's P·V whole, as `full_diag` does: the half product is written for the
    /// one-add descriptors only.
    pub desc_fold: bool,
    /// `eager-max`: each row's reference maximum moves whenever a tile's maximum exceeds it, O rescaled
    /// then (sessions 7-17), not only past the product's slack of 8 in log2 units (`FA3_XO_EAGER_MAX`; the
    /// plain entries, FP8 included).
    pub eager_max: bool,
    /// `direct-o`: O written as sessions 10-19 did (row sums reduced after the last P·V, a branch per
    /// finiteness test, 4-byte stores from registers), not through the product's staging (`FA3_XO_DIRECT_O`;
    /// the plain entries, FP8 included).
    pub direct_o: bool,
    /// `full-diag`: a causal warpgroup's last P·V over the whole key tile, where the product runs it over only
    /// the first 64 keys, the ones its rows see (`FA3_XO_FULL_DIAG`; f16/bf16 causal entries with 128-key
    /// tiles, a no-op elsewhere).
    pub full_diag: bool,
    /// `vt-prepass`: FP8's Vᵀ written into a workspace by a pre-pass kernel before the call (its own launch,
    /// which reads and writes V once more, and one grid row per (batch, kv head) pair), at every length
    /// (`FA3_XO_VT_PREPASS`, the entry suffix `_vtp`; FP8 entries, a no-op for f16/bf16). The product takes it
    /// for long calls only ([`fp8_transposes_in_kernel`]); as a planned entry's field, the layout it reads.
    pub vt_prepass: bool,
    /// `vt-kernel`: FP8's V tiles transposed inside the kernel by the producer warpgroup at every length, where
    /// the product does so for short calls only ([`fp8_transposes_in_kernel`]). No bit: it only keeps
    /// `vt_prepass` off.
    pub vt_kernel: bool,
}

/// `FA3_XO_VT_PREPASS` in fa3.cu: an FP8 entry that reads the pre-pass's Vᵀ (no staged V tiles).
const FA3_XO_VT_PREPASS: u16 = 1024;

impl AbSwitches {
    /// The `FA3_XO_*` bits (`exp_fma` as k + 1 in bits 2-5, `desc_fold` bit 6, `eager_max` bit 7, `direct_o`
    /// bit 8, `full_diag` bit 9, `vt_prepass` bit 10).
    pub fn bits(self) -> u16 {
        u16::from(self.store16)
            | (u16::from(self.tile_turns) << 1)
            | (self.exp_fma.map_or(0, |k| u16::from(k) + 1) << 2)
            | (u16::from(self.desc_fold) << 6)
            | (u16::from(self.eager_max) << 7)
            | (u16::from(self.direct_o) << 8)
            | (u16::from(self.full_diag) << 9)
            | if self.vt_prepass { FA3_XO_VT_PREPASS } else { 0 }
    }

    /// Refuses switches a call's entry does not take: any measurement switch for windows, softcap and ALiBi
    /// (`variant`) or ragged batches (`ragged`), whose entries have no measurement instantiation, and
    /// `store16` / `tile-turns` for FP8 inputs (`fp8`), and `vt-prepass` with `vt-kernel`. Those two name FP8's
    /// layout, which variant entries have too, and are no-ops for f16/bf16 (their entries are the product's), so
    /// that one environment can time both dtypes (`fa3_fp8_bench.py`, tests/fa3_fp8's comparison with bf16).
    pub fn check(self, fp8: bool, variant: bool, ragged: bool) -> Result<()> {
        if self.vt_prepass && self.vt_kernel {
            return Err(unsupported("SDPA_FA3_AB: vt-prepass and vt-kernel force opposite FP8 layouts; name one"));
        }
        let measuring = AbSwitches { vt_prepass: false, vt_kernel: false, ..self } != AbSwitches::default();
        if (measuring && (variant || ragged)) || (fp8 && self.touches_stores_or_turns()) {
            return Err(unsupported(
                "SDPA_FA3_AB (a measurement switch) applies to the plain entries only, not to windows, softcap \
                 and ALiBi or ragged batches; store16 and tile-turns to f16/bf16 inputs only",
            ));
        }
        Ok(())
    }

    /// Whether an FP8 call `spec` transposes V inside the kernel rather than reading the pre-pass's Vᵀ: `vt-kernel`
    /// / `vt-prepass` force either, else [`fp8_transposes_in_kernel`].
    pub fn fp8_in_kernel(self, spec: &AttentionSpec) -> bool {
        if self.vt_kernel || self.vt_prepass {
            self.vt_kernel
        } else {
            fp8_transposes_in_kernel(spec)
        }
    }

    /// Whether `store16` or `tile-turns` is on (those apply to f16/bf16 inputs only).
    pub fn touches_stores_or_turns(self) -> bool {
        self.store16 || self.tile_turns
    }

    /// Parses `SDPA_FA3_AB`'s value: a comma-separated list of `store16`, `tile-turns`, `exp-fma=k`,
    /// `desc-fold`, `eager-max`, `direct-o`, `full-diag`, `vt-prepass` and `vt-kernel` (empty: none).
    pub fn parse(v: &str) -> Result<Self> {
        let mut ab = AbSwitches::default();
        for part in v.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            match part {
                "store16" => ab.store16 = true,
                "tile-turns" => ab.tile_turns = true,
                "desc-fold" => ab.desc_fold = true,
                "eager-max" => ab.eager_max = true,
                "direct-o" => ab.direct_o = true,
                "full-diag" => ab.full_diag = true,
                "vt-prepass" => ab.vt_prepass = true,
                "vt-kernel" => ab.vt_kernel = true,
                other => match other.strip_prefix("exp-fma=").map(str::parse::<u8>) {
                    Some(Ok(k)) if k <= 8 => ab.exp_fma = Some(k),
                    Some(_) => {
                        return Err(unsupported(format!(
                            "SDPA_FA3_AB={v}: `{other}` needs k in 0..=8 (eighths of the exponentials on the FMA pipe)"
                        )))
                    }
                    None => {
                        return Err(unsupported(format!(
                            "SDPA_FA3_AB={v}: unknown switch `{other}` (expected store16, tile-turns, exp-fma=k, \
                             desc-fold, eager-max, direct-o, full-diag, vt-prepass or vt-kernel, comma-separated)"
                        )))
                    }
                },
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

/// The FP8 tile of a variant call (a band, maybe softcap and ALiBi) at class (`d`, `dv`): [`FP8_TILE`], two consumers
/// at every class, as f16/bf16 variant calls take them ([`variant_tile_for`]). Not measured.
pub fn fp8_variant_tile_for(d: usize, dv: usize) -> Fa3Tile {
    fp8_tile_for(d, dv, true)
}

/// An FP8 tile forced by `SDPA_FA3_TILE` (tuning runs): the keys per tile must stay 128.
fn forced_fp8_tile() -> Result<Option<Fa3Tile>> {
    match forced_tile()? {
        Some(t) if t.bn != FP8_TILE.bn => {
            Err(unsupported(format!("SDPA_FA3_TILE: f8e4m3 takes {} keys per tile, not {}", FP8_TILE.bn, t.bn)))
        }
        Some(t) if t.consumers < 2 => {
            Err(unsupported("SDPA_FA3_TILE: f8e4m3 takes 2 or 3 consumer warpgroups (its entries take turns)"))
        }
        t => Ok(t),
    }
}

/// Shared memory of an FP8 block at class (`d`, `dv`): Q and K rows of whole 128-column boxes, Vᵀ tiles of
/// `dv` rows of 128 keys, one byte each, the V tiles staged for the producer's transpose (`staged`: the product;
/// none under [`AbSwitches::vt_prepass`]) and the barriers (`Fa3Smem` with `ES = 1`).
pub fn fp8_smem_bytes(t: Fa3Tile, d: usize, dv: usize, staged: bool) -> usize {
    let (slots, _) = fp8_v_staging(t, d, dv, staged);
    with_o_stage(fp8_tile_bytes(t, d, dv, staged), t, slots)
}

/// The tiles' part of [`fp8_smem_bytes`]: Q, the K ring, the Vᵀ ring and the staged V tiles.
pub fn fp8_tile_bytes(t: Fa3Tile, d: usize, dv: usize, staged: bool) -> usize {
    let (slots, bytes) = fp8_v_staging(t, d, dv, staged);
    fp8_ring_bytes(t, d, dv) + slots * bytes
}

/// Q, the K ring and the Vᵀ ring of an FP8 block (`Fa3Smem::VS_OFF`).
fn fp8_ring_bytes(t: Fa3Tile, d: usize, dv: usize) -> usize {
    let ds = d.div_ceil(128) * 128;
    t.consumers * 64 * ds + t.stages * t.bn * (ds + dv)
}

/// The V tiles an FP8 block stages for its transposing warps (`Fa3Smem::SV`, `VS_BYTES`): (slots, bytes of
/// one), a tile being `bn` keys of whole 128-column boxes; two slots where they fit beside O's staging, else
/// one; none where the call reads the pre-pass's Vᵀ (`staged` false).
pub fn fp8_v_staging(t: Fa3Tile, d: usize, dv: usize, staged: bool) -> (usize, usize) {
    if !staged {
        return (0, 0);
    }
    let bytes = t.bn * 128 * dv.div_ceil(128);
    let two = fp8_ring_bytes(t, d, dv) + 2 * bytes + o_stage_bytes(t) + barrier_bytes(t, 2) <= SMEM_LIMIT;
    (if two { 2 } else { 1 }, bytes)
}

/// Dynamic shared memory an sm_90 block may take (`FA3_SMEM_LIMIT`).
pub const SMEM_LIMIT: usize = 227 * 1024;

/// O's staging of a block (`Fa3Smem::O_STAGE_BYTES`): 16 rows of 64 two-byte columns per consumer warp.
fn o_stage_bytes(t: Fa3Tile) -> usize {
    4 * t.consumers * 2048
}

/// Whether a block whose tiles (Q, K and V) take `tiles` bytes stages O through shared memory
/// (`Fa3Smem::O_STAGED`): where the staging, the barriers (with `slots` staged FP8 V tiles) and the tiles fit
/// in [`SMEM_LIMIT`].
pub fn o_staged(tiles: usize, t: Fa3Tile, slots: usize) -> bool {
    tiles + o_stage_bytes(t) + barrier_bytes(t, slots) <= SMEM_LIMIT
}

/// A block's shared memory after its tiles (`tiles` bytes), for every element type (fa3.cu `Fa3Smem`): O's
/// staging where it fits ([`o_staged`]), then the Q and K/V ring mbarriers, 8 bytes each, and the work-tile
/// ring (an mbarrier pair and a tile index per slot).
fn with_o_stage(tiles: usize, t: Fa3Tile, slots: usize) -> usize {
    tiles + if o_staged(tiles, t, slots) { o_stage_bytes(t) } else { 0 } + barrier_bytes(t, slots)
}

/// The mbarriers (with `slots` staged FP8 V tiles, a pair each) and the work-tile ring.
fn barrier_bytes(t: Fa3Tile, slots: usize) -> usize {
    8 * (2 * t.consumers + 4 * t.stages + 2 * slots) + 20 * SCHED_RING
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

/// The tile of a ragged call without variants at head-dim class (`d`, `dv`): the dense table's keys per tile
/// and ring depth ([`tile_for`], `sk` the longest sequence's keys) with two consumer warpgroups everywhere:
/// the per-sequence lengths and offsets take registers that three consumers at 160 each have not got to
/// spare (the plain three-consumer entries spilled at 160 in session 7), and 128-row work tiles waste less of
/// short sequences than 192-row ones. Not measured.
pub fn ragged_tile_for(d: usize, dv: usize, causal: bool, sk: usize) -> Fa3Tile {
    Fa3Tile { consumers: 2, ..tile_for(d, dv, causal, sk) }
}

/// Whether key tiles of `bn` keys can be loaded from pages of `page_size` slots: in boxes of
/// min(`bn`, page size) keys, each within one page and a multiple of 8 rows (whole 1024-byte atoms of the
/// 128-byte swizzle), so the page size must be a multiple of 8 that divides the tile or is a multiple of it.
pub fn pages_fit(bn: usize, page_size: usize) -> bool {
    page_size > 0 && page_size.is_multiple_of(8) && (page_size.is_multiple_of(bn) || bn.is_multiple_of(page_size))
}

/// The tile of a paged call from the ragged (or variant) `tile`: itself where its keys per tile fit the pages
/// ([`pages_fit`]), else the same with 64 keys per tile (which pages of 8, 16, 32, 64 and multiples of 64 fit,
/// at every class: the 112 keys of 192/192 and the 80 of 256 take only 8 and 16, or their multiples), else
/// `None`. Not measured.
pub fn paged_tile(tile: Fa3Tile, page_size: usize) -> Option<Fa3Tile> {
    [tile.bn, 64].into_iter().find(|&bn| pages_fit(bn, page_size)).map(|bn| Fa3Tile { bn, ..tile })
}

/// The `FA3_VAR_*` expression of a variant set `var` (`VAR_BAND` with softcap and ALiBi bits), `0` for none.
fn var_const(var: i32) -> String {
    if var == 0 {
        return "0".into();
    }
    let mut bits = vec!["FA3_VAR_BAND"];
    if var & VAR_SOFTCAP != 0 {
        bits.push("FA3_VAR_SOFTCAP");
    }
    if var & VAR_ALIBI != 0 {
        bits.push("FA3_VAR_ALIBI");
    }
    bits.join(" | ")
}

/// The program of ragged entry `{tile prefix}_{dtype}_{d}[_{dv}]_{masking}_{varlen|paged}[_pp0]`
/// (`FA3_ENTRY_SERVE`; packed K/V, or a paged cache when `paged`): `masking` a plain one (no mask, causal) or
/// a variant set over no mask; f16/bf16 only.
pub fn serve_program(
    dtype: DType,
    (d, dv): (usize, usize),
    tile: Fa3Tile,
    masking: Masking,
    paged: bool,
    pingpong: bool,
) -> Program {
    let (serve, mode) = if paged { ("paged", "FA3_SERVE_PAGED") } else { ("varlen", "FA3_SERVE_VARLEN") };
    let name = entry_name(tile, dtype, (d, dv), &format!("{}_{serve}", masking.suffix()), pingpong);
    let Fa3Tile { bn, stages, consumers } = tile;
    let (mask, var) = (super::mask_const("FA3", masking.kind), var_const(masking.var));
    let line = format!(
        "FA3_ENTRY_SERVE({name}, {}, {d}, {dv}, {bn}, {stages}, {mask}, {pingpong}, {consumers}, {var}, {mode})",
        cuda_type(dtype)
    );
    Program::entry(&FA3, name, line)
}

/// The ragged entries the CI compile check builds (and [`programs`] lists; the others, 216, compile on first
/// use): bf16 causal at the class 128 (the plain path with per-sequence lengths), packed and
/// paged, and bf16 with every variant bit at 256 (the widest accumulators, where registers are tightest,
/// with the band code). The others compile on first use; `SDPA_NVRTC_ALL=1` compiles them all
/// ([`ragged_programs`]).
pub fn compile_check_ragged_programs() -> Vec<Program> {
    let all = Masking { kind: MASK_NONE, var: crate::checked::params::VAR_BAND | VAR_SOFTCAP | VAR_ALIBI };
    let causal = Masking { kind: MASK_CAUSAL, var: 0 };
    let tile = ragged_tile_for(128, 128, true, 4096);
    vec![
        serve_program(DType::BF16, (128, 128), tile, causal, false, true),
        serve_program(DType::BF16, (128, 128), tile, causal, true, true),
        serve_program(DType::BF16, (256, 256), variant_tile_for(256, 256), all, false, true),
    ]
}

/// Every ragged entry a launch can ask for with the table's tiles and ping-pong: each dtype, class and
/// masking (no mask, causal, and the four variant sets over no mask), with the tile [`check`] picks, packed
/// and paged, paged also with 64 keys per tile ([`paged_tile`]'s fallback, at every class: pages of 32, 64 or
/// more slots at 112 or 80 keys per tile, and at 128 keys pages of 192 slots, the one multiple of 64 up to
/// `sdpa_core::MAX_PAGE_SIZE` (256) that neither divides 128 nor is a multiple of it).
pub fn ragged_programs() -> Vec<Program> {
    let mut all = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for (d, dv) in FA3_CLASSES {
            for m in Masking::all().into_iter().filter(|m| m.kind != crate::checked::params::MASK_EXPLICIT) {
                // One tile per masking: with two consumers the table's tile does not change with the keys.
                let tile =
                    if m.var != 0 { variant_tile_for(d, dv) } else { ragged_tile_for(d, dv, m.kind == MASK_CAUSAL, 1) };
                all.push(serve_program(dtype, (d, dv), tile, m, false, true));
                all.push(serve_program(dtype, (d, dv), tile, m, true, true));
                if tile.bn != 64 {
                    all.push(serve_program(dtype, (d, dv), Fa3Tile { bn: 64, ..tile }, m, true, true));
                }
            }
        }
    }
    all
}

/// The program of variant entry `{tile prefix}_{dtype}_{d}[_{dv}]_band[_softcap][_alibi][_pp0][_vtp]`
/// (`FA3_ENTRY_VAR`): `var` is a [`Masking`] variant set (`VAR_BAND` with softcap and ALiBi bits) over no
/// mask; `vt_prepass` (FP8 only): the entry reads the pre-pass's Vᵀ (`_vtp`, `FA3_XO_VT_PREPASS`), as FP8's
/// plain entries for long calls do ([`fp8_transposes_in_kernel`]).
pub fn variant_program(
    dtype: DType,
    (d, dv): (usize, usize),
    tile: Fa3Tile,
    var: i32,
    pingpong: bool,
    vt_prepass: bool,
) -> Program {
    let vt_prepass = vt_prepass && dtype == DType::F8E4M3;
    let vtp = if vt_prepass { "_vtp" } else { "" };
    let name =
        format!("{}{vtp}", entry_name(tile, dtype, (d, dv), &Masking { kind: MASK_NONE, var }.suffix(), pingpong));
    let Fa3Tile { bn, stages, consumers } = tile;
    let xo = if vt_prepass { FA3_XO_VT_PREPASS } else { 0 };
    let line = format!(
        "FA3_ENTRY_VAR({name}, {}, {d}, {dv}, {bn}, {stages}, {}, {pingpong}, {consumers}, {xo})",
        cuda_type(dtype),
        var_const(var | crate::checked::params::VAR_BAND)
    );
    Program::entry(&FA3, name, line)
}

/// Every variant entry a launch can ask for (with the table's tiles and ping-pong): each dtype (f16, bf16),
/// class and variant set (band; with softcap, ALiBi, both), 64 programs, and FP8's ([`fp8_variant_programs`],
/// 24). Not in [`programs`] (the compile check and `warm_up_all` build those; at about 6 s each they would add
/// minutes to both): they compile on first use and stay in the disk cache, except
/// [`compile_check_variant_programs`]. `SDPA_NVRTC_ALL=1` compiles them all in `tests/nvrtc_compile.rs`.
pub fn variant_programs() -> Vec<Program> {
    let mut all = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for (d, dv) in FA3_CLASSES {
            for m in Masking::variants().into_iter().filter(|m| m.kind == MASK_NONE) {
                all.push(variant_program(dtype, (d, dv), variant_tile_for(d, dv), m.var, true, false));
            }
        }
    }
    all.extend(fp8_variant_programs());
    all
}

/// FP8's variant entries: each FP8 class and variant set at [`fp8_variant_tile_for`]'s tile, with V transposed in
/// the kernel and reading the pre-pass's Vᵀ (`_vtp`), 24 programs.
pub fn fp8_variant_programs() -> Vec<Program> {
    let mut all = Vec::new();
    for (d, dv) in FA3_FP8_CLASSES {
        for m in Masking::variants().into_iter().filter(|m| m.kind == MASK_NONE) {
            for vt_prepass in [false, true] {
                all.push(variant_program(DType::F8E4M3, (d, dv), fp8_variant_tile_for(d, dv), m.var, true, vt_prepass));
            }
        }
    }
    all
}

/// The variant entries the CI compile check builds (and [`programs`] lists): bf16 with every variant bit at
/// the class 128 and at 256 (the widest accumulators, where registers are tightest), and FP8's at 256 in both
/// layouts. Within a class the variant sets differ by code that the full set contains; the classes differ in
/// constants.
pub fn compile_check_variant_programs() -> Vec<Program> {
    let all = crate::checked::params::VAR_BAND | VAR_SOFTCAP | VAR_ALIBI;
    let mut check: Vec<Program> = [(128, 128), (256, 256)]
        .into_iter()
        .map(|(d, dv)| variant_program(DType::BF16, (d, dv), variant_tile_for(d, dv), all, true, false))
        .collect();
    for vt_prepass in [false, true] {
        check.push(variant_program(DType::F8E4M3, (256, 256), fp8_variant_tile_for(256, 256), all, true, vt_prepass));
    }
    check
}

/// The FP8 programs: each class and mask with ping-pong at its tile ([`fp8_tile_for`]), V transposed in the
/// kernel (short calls) and read from the pre-pass's workspace (`_vtp`, long calls), and the pre-pass (13).
pub fn fp8_programs() -> Vec<Program> {
    let mut all = vec![vt_program()];
    for class in FA3_FP8_CLASSES {
        for mask in [MASK_NONE, MASK_CAUSAL] {
            let tile = fp8_tile_for(class.0, class.1, mask == MASK_CAUSAL);
            for vt_prepass in [false, true] {
                let ab = AbSwitches { vt_prepass, ..AbSwitches::default() };
                all.push(measured_program(DType::F8E4M3, class, tile, mask, true, ab));
            }
        }
    }
    all
}

/// Every plain `fa3` instantiation a launch can ask for with the table's tiles: each class, dtype, mask and
/// tile with ping-pong, and without it (`SDPA_FA3_PINGPONG=0`, a measurement switch) at 64 and 128; the
/// entries without ping-pong of the other classes are compiled on first use, as forced tiles are. Of the
/// variant entries only [`compile_check_variant_programs`] (4; the others compile on first use), of the
/// ragged ones only [`compile_check_ragged_programs`] (3).
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
    all.extend(compile_check_ragged_programs());
    all.push(measured_check_program());
    all
}

/// The measurement switches' entry the compile check builds (and [`programs`] lists): every switch at once
/// (two eighths of the exponentials on the FMA pipe), at one class, bf16, causal (they touch no layout).
fn measured_check_program() -> Program {
    let both = AbSwitches {
        store16: true,
        tile_turns: true,
        exp_fma: Some(2),
        desc_fold: true,
        eager_max: true,
        direct_o: true,
        full_diag: true,
        vt_prepass: false, // FP8's layout: fp8_programs
        vt_kernel: false,
    };
    measured_program(DType::BF16, (128, 128), tile_for(128, 128, true, 4096), MASK_CAUSAL, true, both)
}

/// The `fa3` programs the CI compile check builds: one per head-dim class (bf16, causal, ping-pong, its tile
/// from 4k keys; each class has its own wgmma widths and shared-memory layout, the dtypes and masks differ
/// in constants only), FP8's, four variant entries ([`compile_check_variant_programs`]), three ragged ones
/// ([`compile_check_ragged_programs`]) and the measurement entries.
pub fn compile_check_programs() -> Vec<Program> {
    let mut all: Vec<Program> = FA3_CLASSES
        .into_iter()
        .map(|c| program(DType::BF16, c, tile_for(c.0, c.1, true, 4096), MASK_CAUSAL, true))
        .collect();
    // FP8: its own products and layouts per class (causal; and the class 64 without a mask, which runs three
    // consumers, which the transposing warps count on the work-tile ring), and the pre-pass.
    let fp8_check =
        |p: &Program| p.name.contains("_causal") || p.name.contains("_f8e4m3_64_none") || p.name == vt_program().name;
    all.extend(fp8_programs().into_iter().filter(fp8_check));
    all.extend(compile_check_variant_programs());
    all.extend(compile_check_ragged_programs());
    all.push(measured_check_program());
    all
}

/// The entries' parameter: `Fa3Args` in fa3.cu (AttnParams, the scheduling section, O's scale, the softcap's
/// constants ([`softcap_consts`]), a ragged call's schedule (count of (sequence, query tile) pairs and their
/// device address, set at launch), padding to byte 384, then the Q, K and V tensor maps; 768 bytes, asserted
/// on both sides).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Fa3Args {
    p: AttnParams,
    section: i32,
    o_scale: f32,
    softcap: [f32; 3],
    n_seq_tiles: i32,
    seq_tiles: u64,
    pad: [u8; ARGS_PAD],
    q: CUtensorMap,
    k: CUtensorMap,
    v: CUtensorMap,
}
const ARGS_PAD: usize = 384 - crate::checked::params::ATTN_PARAMS_SIZE - 32;
const _: () = assert!(std::mem::size_of::<Fa3Args>() == 768);
const _: () = assert!(std::mem::offset_of!(Fa3Args, seq_tiles) == crate::checked::params::ATTN_PARAMS_SIZE + 24);
// SAFETY: plain data with C layout matching the kernel's `Fa3Args` (size and the schedule's offset asserted
// on both sides): AttnParams, the section, O's scale, the softcap's three constants, the schedule's count and
// address, padding to 384 and three opaque 128-byte tensor maps.
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
    /// A ragged call's (sequence, query tile) pairs, heaviest first, for the kernel to read
    /// (`Fa3Args::seq_tiles`, uploaded by [`run`]); `None` for a dense call.
    pub seq_tiles: Option<Vec<i32>>,
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
        let plain = spec.variants.is_plain();
        forced_fp8_tile()?.unwrap_or_else(|| {
            if plain {
                fp8_tile_for(class.0, class.1, causal)
            } else {
                fp8_variant_tile_for(class.0, class.1)
            }
        })
    } else if !spec.variants.is_plain() {
        forced_tile()?.unwrap_or_else(|| variant_tile_for(class.0, class.1))
    } else if spec.ragged.is_some() {
        forced_tile()?.unwrap_or_else(|| ragged_tile_for(class.0, class.1, causal, s.sk))
    } else {
        forced_tile()?.unwrap_or_else(|| tile_for(class.0, class.1, causal, s.sk))
    };
    // A paged cache: a key tile the pages can feed (a forced one must fit them as it is).
    let tile = match spec.ragged.as_ref().and_then(|r| r.pages) {
        Some(pages) => {
            let fitted = if forced_tile()?.is_some() {
                pages_fit(tile.bn, pages.page_size).then_some(tile)
            } else {
                paged_tile(tile, pages.page_size)
            };
            fitted.ok_or_else(|| {
                unsupported(format!(
                    "fa3: {} keys per tile cannot be loaded from pages of {} slots (page sizes that are multiples of \
                     8 and divide the tile or are multiples of it); fa2 and splitkv take any page size",
                    tile.bn, pages.page_size
                ))
            })?
        }
        None => tile,
    };
    let staged = !fp8 || fp8_vt_staged(spec)?;
    if !staged {
        if let Some(why) = prepass_refuses(spec) {
            return Err(unsupported(why));
        }
    }
    let smem = if fp8 { fp8_smem_bytes(tile, class.0, class.1, staged) } else { tile.smem_bytes(class.0, class.1) };
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

/// Whether an FP8 call transposes V inside the kernel rather than reading the pre-pass's Vᵀ, under the
/// environment's switches ([`AbSwitches::fp8_in_kernel`]).
fn fp8_vt_staged(spec: &AttentionSpec) -> Result<bool> {
    Ok(ab_switches()?.fp8_in_kernel(spec))
}

/// Most transposes of each V tile for which an FP8 call at a class of V width `dv_class` transposes V inside the
/// kernel. The kernel's producer transposes a V tile once per work tile that loads it: once per 128 query rows
/// of every query head of the kv head's group. The pre-pass transposes it once, in a launch and an extra pass
/// over V of its own. So the kernel's way pays where few work tiles share a V tile (short calls, decoding) and
/// the pre-pass where many do. Measured on the H100 in session 23 (bench/results/gpu/fp8.md, Sq = Sk, no GQA,
/// two consumers or three at 64 without a mask):
/// - classes 64 and 128: the kernel's way 1.19-1.33x the pre-pass at S = 512 (4 work tiles per V tile) and
///   1.03-1.09x at 2k (16), 0.94-0.98x at 16k (128);
/// - class 256: 1.18-1.37x at 512, 0.93 / 1.01x at 2k and 0.81-0.85x from 8k, where its one staging slot holds
///   the loads back.
pub fn fp8_in_kernel_max_transposes(dv_class: usize) -> usize {
    if dv_class > 128 {
        8
    } else {
        16
    }
}

/// The product's FP8 layout for `spec`: V transposed inside the kernel where each V tile is transposed at most
/// [`fp8_in_kernel_max_transposes`] times (the group's query heads times Sq in 128-row tiles: up to Sq = 2048,
/// or 1024 at the class 256, without GQA; decoding at any Sk), and at any size for calls the pre-pass cannot
/// run ([`prepass_refuses`]); the pre-pass's Vᵀ otherwise.
pub fn fp8_transposes_in_kernel(spec: &AttentionSpec) -> bool {
    let s = spec.shape;
    let dv_class = fp8_head_dim_class(s.d, s.dv).map_or(s.dv, |c| c.1);
    let transposes = (s.hq / s.hkv.max(1)).saturating_mul(query_tiles_per_key(spec));
    transposes <= fp8_in_kernel_max_transposes(dv_class) || prepass_refuses(spec).is_some()
}

/// Most 128-row query tiles that load one 128-key tile: Sq in 128-row tiles, or under a band bounded on both
/// sides (a window) the tiles its rows span. Key tile [k0, k0 + 127] (k0 a multiple of 128) is loaded by rows
/// k0 - hi ..= k0 + 127 - lo (`lo`, `hi`: the band's visible key minus row), so by row tiles
/// floor((k0 - hi) / 128) ..= floor((k0 + 127 - lo) / 128): ceil(hi / 128) + floor((127 - lo) / 128) + 1 of them
/// whatever k0 (at most Sq's).
pub fn query_tiles_per_key(spec: &AttentionSpec) -> usize {
    let all = spec.shape.sq.div_ceil(128);
    let band = spec.band();
    match (band.lo, band.hi) {
        (Some(lo), Some(hi)) if hi >= lo => {
            let ceil_hi = -(-hi).div_euclid(128);
            let tiles = ceil_hi + (127 - lo).div_euclid(128) + 1;
            usize::try_from(tiles.max(1)).map_or(all, |t| all.min(t))
        }
        _ => all,
    }
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
/// map over V itself (the map the kernel reads; where the call takes the pre-pass, the checks only: [`run`] plans
/// the launch again over the Vᵀ workspace, [`plan_with`]).
pub fn plan(call: &Call<'_>) -> Result<Plan> {
    plan_with(call, None)
}

/// [`plan`], with FP8's V map over the pre-pass's Vᵀ workspace at `vt` (`[B, Hkv, Dv, vt_keys(Sk)]` bytes) when
/// given.
pub fn plan_with(call: &Call<'_>, vt: Option<u64>) -> Result<Plan> {
    let spec = call.spec;
    let info = call.dev.info();
    let p = &call.params;
    let (class, tile) = check(spec, p, info.compute_capability, info.smem_per_block_optin)?;
    let fp8 = spec.dtype == DType::F8E4M3;
    // The entry's switches, with FP8's layout as the call takes it (`vt_prepass`: the pre-pass's Vᵀ).
    let env = ab_switches()?;
    let ab = AbSwitches { vt_prepass: fp8 && !env.fp8_in_kernel(spec), vt_kernel: false, ..env };
    let smem =
        if fp8 { fp8_smem_bytes(tile, class.0, class.1, !ab.vt_prepass) } else { tile.smem_bytes(class.0, class.1) };
    let s = spec.shape;
    let masking = Masking::of(spec);
    // A band (variants) weighs query tiles unequally as a causal mask does (the static schedule's grid).
    let causal = p.mask_kind == MASK_CAUSAL || masking.var != 0;
    // The maps carry the call's own head dims (TMA zero-fills the class's columns past them). A ragged call's
    // run over the packed rows as one batch, `[1, H, total rows, D]` (the batch stride unused; extents at
    // least 1: a batch without keys loads none), its work tiles addressing each sequence's first row; a paged
    // cache's K and V over the pool, one page a box (`kv_operands`, shared with splitkv's MLA path).
    let ragged = spec.ragged.as_ref();
    let (nb, lq) = match ragged {
        Some(r) => (1, r.total_q().max(1)),
        None => (s.b, s.sq),
    };
    let packed = |st: [i64; 3]| if ragged.is_some() { [0, st[1], st[2]] } else { st };
    let op = |ptr, h, sl, d, st| KvOperand { ptr, dtype: spec.dtype, dims: [nb, h, sl, d], strides: packed(st) };
    let pages = ragged.and_then(|r| r.pages);
    let (k_op, v_op, box_keys) = kv_operands(spec, p, tile.bn);
    let v_map = if fp8 && ab.vt_prepass {
        // The pre-pass's Vᵀ: rows of dv columns of Sk_pad keys, boxes of 128 keys x Dv (class) rows.
        let kp = vt_keys(s.sk) as i64;
        let dv = s.dv as i64;
        let st = [s.hkv as i64 * dv * kp, dv * kp, kp];
        padded_tensor_map(&op(vt.unwrap_or(p.v), s.hkv, s.dv, kp as usize, st), class.1)
    } else {
        // V as stored (FP8: boxes of 128 one-byte columns, which the kernel stages and transposes).
        padded_tensor_map(&v_op, box_keys)
    };
    let maps = (padded_tensor_map(&op(p.q, s.hq, lq, s.d, p.q_stride), 64), padded_tensor_map(&k_op, box_keys), v_map);
    let (Some(q), Some(k), Some(v)) = maps else {
        return Err(unsupported(format!(
            "fa3: a TMA tensor map cannot describe this Q, K or V layout (strides must be positive multiples of \
             16 bytes below 2^40, extents below 2^32); {}",
            elsewhere(spec, "use fa2")
        )));
    };
    // A ragged call's work tiles: its (sequence, query tile) pairs, heaviest first (fa2's schedule, at this
    // tile's rows and keys), times the heads (`fa3_varlen_tile`).
    let seq_tiles = ragged.map(|_| super::fa2::schedule(spec, tile.rows(), tile.bn));
    let (per_head, n_mblocks) = match (&seq_tiles, ragged) {
        (Some(t), Some(r)) => (t.len() / 2, r.max_q().div_ceil(tile.rows())),
        _ => (s.sq.div_ceil(tile.rows()).saturating_mul(s.b), s.sq.div_ceil(tile.rows())),
    };
    let work = per_head
        .checked_mul(s.hq)
        .filter(|&x| x <= i32::MAX as usize)
        .ok_or_else(|| unsupported("fa3: more than 2^31 query tiles"))?;
    let schedule = schedule()?;
    let (blocks, section) = match forced_schedule()? {
        Some((blocks, section)) => (blocks.min(work), section.unwrap_or(1)),
        None => {
            let slots = info.sm_count.saturating_mul(tile.blocks_per_sm(smem) as i32);
            (grid_blocks(work, n_mblocks, causal, schedule, slots), 1)
        }
    };
    let blocks = blocks.max(1); // no tile (an empty batch): one block that finds no work
    let dims = LaunchDims {
        // work <= i32::MAX, checked above
        grid: (u32::try_from(blocks).unwrap_or(u32::MAX), 1, 1),
        block: (tile.threads() as u32, 1, 1),
        smem_bytes: smem as u32,
    };
    let section = i32::try_from(section.clamp(1, s.b * s.hq)).unwrap_or(i32::MAX);
    env.check(fp8, masking.var != 0, ragged.is_some())?;
    let program = if ragged.is_some() {
        serve_program(spec.dtype, class, tile, masking, pages.is_some(), tile.pingpong(false))
    } else if masking.var != 0 {
        variant_program(spec.dtype, class, tile, masking.var, tile.pingpong(fp8), ab.vt_prepass)
    } else {
        measured_program(spec.dtype, class, tile, p.mask_kind, tile.pingpong(fp8), ab)
    };
    // FP8: Q's and K's descales scale the scores (folded into the softmax scale), V's scales O at the end.
    let ds = spec.descales();
    let mut p = *p;
    p.scale *= ds.q * ds.k;
    p.scale_log2 *= ds.q * ds.k;
    let o_scale = ds.v;
    let softcap = softcap_consts(p.softcap, p.scale_log2);
    let n_seq_tiles = i32::try_from(per_head).map_err(|_| unsupported("fa3: more than 2^31 query tiles"))?;
    let n_seq_tiles = if ragged.is_some() { n_seq_tiles } else { 0 };
    let args = Fa3Args { p, section, o_scale, softcap, n_seq_tiles, seq_tiles: 0, pad: [0; ARGS_PAD], q, k, v };
    Ok(Plan { program, dims, args, schedule, seq_tiles })
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

/// The programs a call launches: its entry, and for FP8 inputs that take the pre-pass
/// ([`fp8_transposes_in_kernel`], the switches) the Vᵀ pre-pass before it. `planned` is the call's own [`plan`]
/// when the caller made it already (dispatch's `auto`), planned here otherwise.
pub fn programs_for(call: &Call<'_>, planned: Option<Plan>) -> Result<Vec<Program>> {
    let main = planned.map_or_else(|| plan(call), Ok)?.program;
    Ok(if call.spec.dtype == DType::F8E4M3 && !fp8_vt_staged(call.spec)? {
        vec![vt_program(), main]
    } else {
        vec![main]
    })
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

/// FP8 calls past [`fp8_in_kernel_max_transposes`] (or any under the `vt-prepass` switch): writes Vᵀ (`[B, Hkv, Dv,
/// vt_keys(Sk)]`, keys permuted within groups of 16, zeros past Sk) into a workspace on the call's stream, then
/// runs `fa3` reading it. The workspace is freed stream-ordered after both kernels; timing a call times both.
/// `planned`, [`run`]'s, stands for the check before allocating when given; the launch itself is planned again,
/// its V map over the workspace.
fn run_fp8_prepass(call: &Call<'_>, planned: Option<Plan>) -> Result<()> {
    use cudarc::driver::DevicePtrMut;
    let s = call.spec.shape;
    let kp = vt_keys(s.sk);
    if planned.is_none() {
        plan(call)?; // refuse before allocating (`check`: the pre-pass's grid too, prepass_refuses)
    }
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
    let Plan { program, dims, args, schedule, .. } = plan_with(call, Some(vt_ptr))?;
    let r = launch_scheduled(call, &program, dims, args, schedule);
    drop(guard);
    r
}

/// Blocks of the grid for `work` query tiles, `n_mblocks` of them per head. Persistent (one block per slot:
/// `slots` is the multiprocessors times [`Fa3Tile::blocks_per_sm`]; each block walks tiles head by head)
/// except, on the static schedule, under a causal mask with more than [`PERSISTENT_CAUSAL_MAX_MBLOCKS`] tiles
/// per head: there the static share cannot balance the tiles' weights (1 to n_mblocks key tiles, in a saw-tooth
/// over the heads) and one block per tile, which the hardware hands out as blocks finish, ran faster (H100,
/// fa2bench causal at S = 16k, D = 128: 604 TFLOPS against 431 persistent; bench/results/gpu/fa3.md). The
/// dynamic schedule balances by itself.
pub fn grid_blocks(work: usize, n_mblocks: usize, causal: bool, schedule: Schedule, slots: i32) -> usize {
    if schedule == Schedule::Static && causal && n_mblocks > PERSISTENT_CAUSAL_MAX_MBLOCKS {
        work
    } else {
        work.min(at_least_one(slots))
    }
}

/// Most query tiles per head for which a causal call runs on the persistent grid on the static schedule
/// ([`grid_blocks`]).
pub const PERSISTENT_CAUSAL_MAX_MBLOCKS: usize = 64;

/// The persistent grid's slots as a count, at least one.
fn at_least_one(slots: i32) -> usize {
    usize::try_from(slots).unwrap_or(1).max(1)
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

/// Launches `fa3` on the call's stream. `planned` is the call's own [`plan`] when the caller made it
/// already (dispatch, deciding whether `auto` takes `fa3`), so a ragged call's schedule is not built twice;
/// planned here otherwise.
pub fn run(call: &Call<'_>, planned: Option<Plan>) -> Result<()> {
    if call.spec.dtype == DType::F8E4M3 && !fp8_vt_staged(call.spec)? {
        return run_fp8_prepass(call, planned);
    }
    let Plan { program, dims, mut args, schedule, seq_tiles } = planned.map_or_else(|| plan(call), Ok)?;
    let Some(seq_tiles) = seq_tiles else {
        if call.spec.shape.sq == 0 {
            return Ok(()); // no query row: nothing to write
        }
        return launch_scheduled(call, &program, dims, args, schedule);
    };
    if seq_tiles.is_empty() {
        return Ok(()); // no sequence has a query row: nothing to write
    }
    let table = call.dev.table_i32(&seq_tiles, "fa3's schedule of query tiles")?;
    let (ptr, guard) = table.device_ptr(call.stream);
    args.seq_tiles = ptr;
    let r = launch_scheduled(call, &program, dims, args, schedule);
    // The table stays kept by the device (per content); the guard orders its use on this stream.
    drop(guard);
    r
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
    // offset; the tensor maps describe exactly those operands (TMA reads nothing past their extents; a
    // ragged call's maps cover the packed rows of the whole batch, or the pool of a paged cache, whose page
    // indices from the block table the kernel clamps into the pool), the kernel writes O rows < Sq (ragged:
    // rows < Sq_b of each sequence, at its packed offset from the uploaded cu_seqlens) and columns < Dv with
    // 4-byte or 16-byte stores (16-byte ones where O is staged, or with the measurement switch `store16`) that
    // the 8-element alignment allows, and LSE entries of its own rows (ragged: the `[Hq, total_q]` entries of its sequence's rows).
    // A ragged call's `seq_tiles` names sequences < B and query tiles inside them (`fa2::schedule`),
    // `n_seq_tiles` of them. It is launched only on a compute-capability 9.0 device, for which its program
    // is built as sm_90a. `p.workspace` is null (static schedule) or one u32, zero at the
    // launch, which the kernel only increments and writes back to zero.
    unsafe { launch(call.dev, call.stream, program, &program.name, dims, args) }
}

#[cfg(test)]
mod protocol;
#[cfg(test)]
mod tests;
