//! `splitkv`: flash-decoding on tensor cores (`kernels/splitkv.cu`) for f16/bf16, in one launch.
//!
//! Every warp is one split of the keys of one 16-row tile of the query rows that share a kv head (GQA heads
//! packed together so they read K/V once). How it streams K/V ([`SplitKvLoad`], [`choose_load`]): on sm_90
//! with TMA tensor copies (one thread per block copies the block's whole K/V chunk into a ring its warps
//! share; tensor maps built per call by [`crate::checked::tensor_map`]) where the layout allows, else with 1-D bulk
//! copies for splits of at most [`BULK_MAX_KEYS_PER_SPLIT`] keys; otherwise, and before sm_90, with
//! `cp.async`. The K/V loads carry an L2 policy chosen by split length ([`l2_policy`]). The warps of
//! a block (consecutive splits of one row tile) merge their partials in shared memory; when a row tile spans several blocks, each writes one partial
//! (normalised output + LSE) to scratch and the last block to finish, found with a per-row-tile counter,
//! merges them. Both merges use `sdpa_core::softmax::merge_normalized`'s rule. The number of splits
//! ([`plan_splits`]) fills the GPU's resident block slots twice, from its SM count and the kernel's shared
//! memory, with at least [`MIN_KEYS_PER_SPLIT`] keys per split; split `s` of `n` covers keys
//! `[s·Sk/n, (s+1)·Sk/n)`; with windows (issue 22) the splits share the keys of the row tile's band
//! instead ([`band_keys`] plans their number from it), so a decode step through a 4096-key window over 32k
//! keys streams 4k keys, never the rest. Head dims: [`HeadDims`], fa2's classes at the larger of D and Dv, padded on the
//! `cp.async` path; on TMA every class runs at whole boxes ([`HeadDims::for_tma_wide`]: 64 columns, so D = 80
//! runs at 128 and MLA's 192/128 at 192; [`HeadDims::for_tma`]'s 32-column boxes for D = 96 and 80 under
//! `SDPA_SPLITKV_TMA_NARROW=1`, a measurement switch: correct on the H100 but not faster), the tensor maps at the call's D and Dv so that only its own columns are read. Calls it cannot take ([`policy::splitkv_limit`](super::policy::splitkv_limit): what
//! stops `fa2`, or a tile larger than the device's shared memory) never reach it: the policy sends them to
//! `fa2` or to the generic `fa1` path.
//!
//! Ragged batches (issue 23: packed varlen K/V or a paged KV cache) take the ragged entries
//! (`splitkv_ragged_*`, `plan_ragged`): the host cuts each sequence's keys into chunks of about equal
//! length ([`ragged_schedule`], uploaded once per content), one block per (chunk, kv head, row tile), so
//! that a batch mixing short and long sequences stays balanced; each sequence's own band, diagonal, softcap
//! and ALiBi; K/V through `cp.async` (paged rows through the block table), on a 3-deep ring where shared
//! memory allows ([`ragged_tile`]). H100, bf16, B=32 decoding rows over 512..32k keys, page 16
//! (`examples/paged_timing.rs`): 91 % of the device-to-device copy bandwidth, 0.97x the same lengths
//! packed, 0.94x dense `splitkv` on its cp.async path and 0.89x on its TMA path, per byte.

use super::policy::splitkv_limit;
use crate::checked::call::Call;
use crate::checked::launch::{launch, LaunchDims};
use crate::checked::params::{AttnParams, Masking, MASK_NONE, VAR_BAND};
use crate::checked::tensor_map::{map_in_rows, BoxRow, KvOperand, BOX_COLS};
use crate::error::{driver, unsupported};
use crate::sys::modules::SPLITKV;
use crate::sys::program::{cuda_type, Program};
use cudarc::driver::sys::CUtensorMap;
use cudarc::driver::DeviceRepr;
use sdpa_core::{DType, Result};
use std::sync::Arc;

/// Query rows per warp tile (one m16 tile).
const ROWS_PER_TILE: usize = 16;
/// Fewest keys a split gets (unless Sk itself is shorter).
pub const MIN_KEYS_PER_SPLIT: usize = 512;

/// How K/V reach shared memory (`LOAD` in `kernels/splitkv.cu`), and the entry-point prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitKvLoad {
    /// 16-byte `cp.async` per lane, every architecture; contiguous splits (`splitkv_*`).
    CpAsync,
    /// sm_90: one 1-D `cp.async.bulk` per K or V row; warps interleaved (`splitkv_bulk_*`).
    Bulk,
    /// sm_90: TMA tensor copies of the block's whole K/V chunk (warps x keys per step) into one
    /// unpadded swizzled ring the warps share, each warp computing its slice (`splitkv_tma_*`).
    Tma,
}

impl SplitKvLoad {
    /// Entry-point prefix.
    pub fn prefix(self) -> &'static str {
        match self {
            SplitKvLoad::CpAsync => "splitkv",
            SplitKvLoad::Bulk => "splitkv_bulk",
            SplitKvLoad::Tma => "splitkv_tma",
        }
    }
}

/// Shape of one `splitkv` specialisation (the arguments of `SPLITKV_ENTRY` / `SPLITKV_TMA_ENTRY` in
/// `kernels/splitkv.cu` after the head dim).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitKvTile {
    /// Warps (splits) per block.
    pub warps: usize,
    /// Depth of the K/V ring (each warp's, or the block's shared one for TMA).
    pub stages: usize,
    /// Keys per step.
    pub keys_per_step: usize,
    /// How the ring is filled (decides its layout).
    pub load: SplitKvLoad,
}

impl SplitKvTile {
    /// Dynamic shared memory of a block for head dim `d`, bytes (`SplitKvTile::smem_bytes` in splitkv.cu):
    /// each warp's Q tile (rows padded to d + 8) and K/V ring (padded the same way); for TMA the block's
    /// unpadded ring (as large as the warps' rings together), one shared Q tile and 1024 bytes to align
    /// the block's base; then 8 bytes of mbarriers per stage and warp.
    pub fn smem_bytes(&self, d: usize) -> usize {
        let q = ROWS_PER_TILE * (d + 8);
        let bars = 8 * self.stages * self.warps;
        if self.load == SplitKvLoad::Tma {
            1024 + (self.warps * 2 * self.stages * self.keys_per_step * d + q) * 2 + bars
        } else {
            (q + 2 * self.stages * self.keys_per_step * (d + 8)) * 2 * self.warps + bars
        }
    }
}

/// The tile for head dim (class) `d` and load path, if specialised (measured on the H100 for D = 128:
/// `bench/results/gpu/fa2.md`; two-warp blocks, two per SM, were 2-10 % slower on both decoding shapes). TMA
/// takes whole boxes ([`tma_box_row`]): D = 96 at 128 in 64-column boxes, or under `SDPA_SPLITKV_TMA_NARROW=1`
/// at 96 in 32-column boxes, four stages deep (196 KB; session 17 measured that ring correct but not faster,
/// 0.51 of copy at D = 80 over 32k keys against 0.55), and the other classes that are not whole boxes at the next multiple of 64 ([`HeadDims::for_tma`]). D = 192 (the MLA pair and class 160) takes the keys per step of its neighbour
/// 256 with a third stage (151 KB). The other head-dim classes take the cp.async path only where TMA cannot
/// run, with the keys per step of their neighbours. `SDPA_SPLITKV_TMA_TILE` overrides the TMA tile for
/// tuning runs ([`tma_tile_override`]).
pub fn tile_for(d: usize, load: SplitKvLoad) -> Option<SplitKvTile> {
    let t = |stages, keys_per_step| Some(SplitKvTile { warps: 4, stages, keys_per_step, load });
    match (d, load) {
        (32 | 64 | 96 | 128, SplitKvLoad::CpAsync) => t(2, 32),
        (160 | 192 | 224, SplitKvLoad::CpAsync) => t(2, 16),
        (64 | 96 | 128, SplitKvLoad::Bulk) | (64 | 128, SplitKvLoad::Tma) => t(3, 32),
        (96, SplitKvLoad::Tma) => t(4, 32),
        (192, SplitKvLoad::Tma) => t(3, 16),
        (256, _) => t(2, 16),
        _ => None,
    }
}

/// The box rows of the TMA ring at head dim `d` (`SplitKvTile::BOXC` in splitkv.cu): 128 bytes where `d` is
/// whole 64-column boxes, else 64 (32 columns, the 64-byte swizzle).
pub fn tma_box_row(d: usize) -> BoxRow {
    if d.is_multiple_of(BOX_COLS) {
        BoxRow::Bytes128
    } else {
        BoxRow::Bytes64
    }
}

/// `SDPA_SPLITKV_TMA_TILE`: the TMA tile's ring depth and keys per warp step at head dim `d` (the kernel's,
/// after [`HeadDims::for_tma`]) for tuning runs, or `None`. The value is a comma-separated list of
/// `STAGESxKEYS` (every head dim) or `D:STAGESxKEYS` (that head dim only, before an entry for every head
/// dim), keys 16 or 32, stages 2 to 8: `96:8x16,128:6x16`. The entry's name then carries the tile
/// (`_s8k16`), so that it never shares a name with the default instantiation.
pub fn tma_tile_override(d: usize) -> Result<Option<(usize, usize)>> {
    let Ok(v) = std::env::var("SDPA_SPLITKV_TMA_TILE") else { return Ok(None) };
    parse_tile_override(&v, d)
}

fn parse_tile_override(v: &str, d: usize) -> Result<Option<(usize, usize)>> {
    let bad = || {
        unsupported(format!(
            "SDPA_SPLITKV_TMA_TILE must list STAGESxKEYS or D:STAGESxKEYS (stages 2..8, keys 16 or 32), got {v:?}"
        ))
    };
    let (mut any, mut this) = (None, None);
    for entry in v.split(',') {
        let (dim, tile) = match entry.split_once(':') {
            Some((dim, tile)) => (Some(dim.trim().parse::<usize>().map_err(|_| bad())?), tile),
            None => (None, entry),
        };
        let (st, ks) = tile.split_once('x').ok_or_else(bad)?;
        let (st, ks) = (st.trim().parse::<usize>().map_err(|_| bad())?, ks.trim().parse::<usize>().map_err(|_| bad())?);
        if !(2..=8).contains(&st) || !matches!(ks, 16 | 32) {
            return Err(bad());
        }
        match dim {
            Some(x) if x == d => this = Some((st, ks)),
            Some(_) => {}
            None => any = Some((st, ks)),
        }
    }
    Ok(this.or(any))
}

/// `tile` (the TMA tile at kernel head dim `d`) with [`tma_tile_override`]'s stages and keys per step, if
/// any; an override whose ring does not fit in `optin` bytes of shared memory is an error, not a fallback.
fn with_tma_override(tile: SplitKvTile, d: usize, optin: usize) -> Result<SplitKvTile> {
    let Some((stages, keys_per_step)) = tma_tile_override(d)? else { return Ok(tile) };
    let tile = SplitKvTile { stages, keys_per_step, ..tile };
    if tile.smem_bytes(d) > optin {
        return Err(unsupported(format!(
            "SDPA_SPLITKV_TMA_TILE: {stages} stages of {keys_per_step} keys at D = {d} need {} bytes of shared \
             memory per block, the device allows {optin}",
            tile.smem_bytes(d)
        )));
    }
    Ok(tile)
}

/// The head dim `splitkv` runs a call at: the larger of fa2's head-dim classes of D and Dv
/// ([`super::fa2::head_dim_classes`]) for both, and whether the call's head dims are below it (`pad`: the
/// kernel reads and stores only the call's columns, on the cp.async path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadDims {
    /// The class of both D and Dv.
    pub d: usize,
    /// The call's D or Dv is below it.
    pub pad: bool,
}

impl HeadDims {
    /// The class of a call with head dims `d`, `dv`, if `splitkv` takes them.
    pub fn of(d: usize, dv: usize) -> Option<Self> {
        let (cd, cdv) = super::fa2::head_dim_classes(d, dv)?;
        let c = cd.max(cdv);
        Some(HeadDims { d: c, pad: d != c || dv != c })
    }

    /// The head dims the TMA path runs this class at: whole boxes ([`tma_box_row`]), 32-column ones where
    /// a TMA tile exists at the class rounded up to 32 columns (D = 96), else 64-column ones; padded when
    /// that is above the call's D or Dv (TMA zero-fills a box's columns past the widths the tensor maps
    /// carry, and never loads boxes wholly past them).
    pub fn for_tma(self) -> Self {
        let narrow = self.d.next_multiple_of(BOX_COLS / 2);
        if tile_for(narrow, SplitKvLoad::Tma).is_some() {
            HeadDims { d: narrow, pad: self.pad || narrow != self.d }
        } else {
            self.for_tma_wide()
        }
    }

    /// This class on TMA in 64-column boxes whatever it is (D = 80 and 96 at 128): what calls run unless
    /// `SDPA_SPLITKV_TMA_NARROW=1` asks for [`HeadDims::for_tma`]'s 32-column boxes (a measurement switch).
    pub fn for_tma_wide(self) -> Self {
        let d = self.d.next_multiple_of(BOX_COLS);
        HeadDims { d, pad: self.pad || d != self.d }
    }
}

/// The program of entry `{prefix}_{dtype}_{d}[p]_{mask}` with `tile` (its load path names the prefix; `p`
/// for a padded class, which takes the cp.async or the TMA path; a tile other than [`tile_for`]'s, from a
/// tuning override, adds `_s{stages}k{keys}`).
pub fn program(dtype: DType, dims: HeadDims, tile: SplitKvTile, masking: Masking) -> Program {
    let d = dims.d;
    let pad = if dims.pad { "p" } else { "" };
    let mut name = format!("{}_{}_{d}{pad}_{}", tile.load.prefix(), dtype.name(), masking.suffix());
    if tile_for(d, tile.load) != Some(tile) {
        name += &format!("_s{}k{}", tile.stages, tile.keys_per_step);
    }
    let (t, mask, var) = (cuda_type(dtype), super::mask_const("FA2", masking.kind), masking.var_const());
    let SplitKvTile { warps, stages, keys_per_step: ks, load } = tile;
    debug_assert!(!dims.pad || load != SplitKvLoad::Bulk, "padded classes take the cp.async or the TMA path");
    if dims.pad && load == SplitKvLoad::Tma {
        let line = format!("SPLITKV_TMA_ENTRY_PAD({name}, {t}, {d}, {warps}, {stages}, {ks}, {mask}, {var})");
        return Program::entry(&SPLITKV, name, line);
    }
    if dims.pad {
        let line = format!("SPLITKV_ENTRY_PAD({name}, {t}, {d}, {warps}, {stages}, {ks}, {mask}, {var})");
        return Program::entry(&SPLITKV, name, line);
    }
    let line = match load {
        SplitKvLoad::CpAsync => {
            format!("SPLITKV_ENTRY({name}, {t}, {d}, {warps}, {stages}, {ks}, {mask}, SKV_CP_ASYNC, false, {var})")
        }
        SplitKvLoad::Bulk => {
            format!(
                "SPLITKV_ENTRY({name}, {t}, {d}, {warps}, {stages}, {ks}, {mask}, SKV_BULK_OR_CP_ASYNC, true, {var})"
            )
        }
        SplitKvLoad::Tma => format!("SPLITKV_TMA_ENTRY({name}, {t}, {d}, {warps}, {stages}, {ks}, {mask}, {var})"),
    };
    Program::entry(&SPLITKV, name, line)
}

/// The maskings of a ragged call's entries: always the band (each sequence's own causal mask and window),
/// with its softcap and ALiBi; explicit masks are refused with ragged batches.
pub fn ragged_masking(spec: &sdpa_core::AttentionSpec) -> Masking {
    Masking { kind: MASK_NONE, var: VAR_BAND | Masking::of(spec).var }
}

/// The ring depth a ragged call's cp.async tile takes where shared memory allows (the dense tile's 2
/// otherwise).
pub const RAGGED_DEEP_STAGES: usize = 3;

/// The tiles a ragged entry of head-dim class `d` comes in: the dense cp.async tile, and the same with a
/// [`RAGGED_DEEP_STAGES`]-deep ring where that fits an H100's 227 KB.
pub fn ragged_tiles(d: usize) -> Vec<SplitKvTile> {
    let Some(base) = tile_for(d, SplitKvLoad::CpAsync) else { return Vec::new() };
    let deep = SplitKvTile { stages: RAGGED_DEEP_STAGES, ..base };
    if deep.smem_bytes(d) <= 227 * 1024 {
        vec![base, deep]
    } else {
        vec![base]
    }
}

/// The tile a ragged call of class `d` runs on a device allowing `optin` bytes per block: the deepest of
/// [`ragged_tiles`] that fits; `SDPA_SPLITKV_RAGGED_STAGES` (2 or 3) forces one for comparisons.
pub fn ragged_tile(d: usize, optin: usize) -> Result<SplitKvTile> {
    let tiles = ragged_tiles(d);
    let forced = match std::env::var("SDPA_SPLITKV_RAGGED_STAGES") {
        Err(_) => None,
        Ok(v) => Some(v.parse::<usize>().map_err(|_| unsupported(format!("SDPA_SPLITKV_RAGGED_STAGES: {v:?}")))?),
    };
    tiles
        .into_iter()
        .rev()
        .find(|t| t.smem_bytes(d) <= optin && forced.is_none_or(|n| t.stages == n))
        .ok_or_else(|| unsupported(format!("splitkv has no ragged tile for D = {d} in {optin} bytes")))
}

/// The program of the ragged entry `splitkv_ragged_{dtype}_{d}[p]_{band...}_s{stages}`
/// (`SPLITKV_RAGGED_ENTRY`: cp.async loads, the schedule in its parameter).
pub fn ragged_program(dtype: DType, dims: HeadDims, tile: SplitKvTile, masking: Masking) -> Program {
    let d = dims.d;
    let pad = if dims.pad { "p" } else { "" };
    let name = format!("splitkv_ragged_{}_{d}{pad}_{}_s{}", dtype.name(), masking.suffix(), tile.stages);
    let SplitKvTile { warps, stages, keys_per_step: ks, .. } = tile;
    let (t, var) = (cuda_type(dtype), masking.var_const());
    let line = format!("SPLITKV_RAGGED_ENTRY({name}, {t}, {d}, {warps}, {stages}, {ks}, {var}, {})", dims.pad);
    Program::entry(&SPLITKV, name, line)
}

/// Every `splitkv` instantiation a launch can ask for: each class on every load path it has, padded on the
/// cp.async path, and padded on TMA at each class rounded up to whole boxes ([`HeadDims::for_tma`]); the
/// ragged entries of each class (padded and not) for the maskings a ragged call takes. Their names hold
/// `_band`, so the CI compile check takes them for bf16 at D = 128 only.
pub fn programs() -> Vec<Program> {
    let mut all = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for d in super::fa2::HEAD_DIM_CLASSES {
            for tile in ragged_tiles(d) {
                for pad in [false, true] {
                    let maskings = Masking::variants().into_iter().filter(|m| m.kind == MASK_NONE);
                    all.extend(maskings.map(|m| ragged_program(dtype, HeadDims { d, pad }, tile, m)));
                }
            }
            for load in [SplitKvLoad::CpAsync, SplitKvLoad::Bulk, SplitKvLoad::Tma] {
                let Some(tile) = tile_for(d, load) else { continue };
                let pads: &[bool] = if load == SplitKvLoad::CpAsync { &[false, true] } else { &[false] };
                for &pad in pads {
                    all.extend(Masking::all().into_iter().map(|m| program(dtype, HeadDims { d, pad }, tile, m)));
                }
            }
            // Padded on TMA: once per box-rounded dim (classes 32 and 64 share 64p).
            let tma = HeadDims { d, pad: true }.for_tma();
            if d == tma.d {
                if let Some(tile) = tile_for(d, SplitKvLoad::Tma) {
                    all.extend(Masking::all().into_iter().map(|m| program(dtype, tma, tile, m)));
                }
            }
        }
    }
    all
}

/// The TMA entries' parameter: `SplitKvTmaArgs` in splitkv.cu (AttnParams, padding to byte 384, then the K
/// and V tensor maps, 640 bytes in all: explicit padding, so that the maps sit at 384 whichever alignment
/// either side gives them).
#[repr(C)]
#[derive(Clone, Copy)]
struct TmaArgs {
    p: AttnParams,
    pad: [u8; TMA_PAD],
    k: CUtensorMap,
    v: CUtensorMap,
}
const TMA_PAD: usize = 384 - crate::checked::params::ATTN_PARAMS_SIZE;
const _: () = assert!(std::mem::size_of::<TmaArgs>() == 640);
// SAFETY: plain data with C layout matching the kernel's `SplitKvTmaArgs` (size asserted on both sides):
// AttnParams (asserted 264 bytes), padding to 384 and two opaque 128-byte-aligned tensor maps.
unsafe impl DeviceRepr for TmaArgs {}

impl TmaArgs {
    /// The parameter of a TMA entry (`splitkv_tma_*`): `p`, then the K and V maps.
    fn new(p: AttnParams, k: CUtensorMap, v: CUtensorMap) -> Self {
        TmaArgs { p, pad: [0; TMA_PAD], k, v }
    }
}

/// The load path a call would take on a GPU of compute capability `major`, before the layout checks of
/// the TMA path: `SDPA_SPLITKV_LOAD` (`cp.async`, `bulk` or `tma`) forces one for comparisons (the
/// sm_90 paths only where the GPU has them); by default sm_90 takes TMA, and the bulk path where TMA has
/// no tile or cannot describe the layout.
pub fn choose_load(major: i32) -> Result<SplitKvLoad> {
    let forced = match std::env::var("SDPA_SPLITKV_LOAD") {
        Err(_) => None,
        Ok(v) => Some(match v.as_str() {
            "cp.async" => SplitKvLoad::CpAsync,
            "bulk" => SplitKvLoad::Bulk,
            "tma" => SplitKvLoad::Tma,
            _ => return Err(unsupported(format!("SDPA_SPLITKV_LOAD must be cp.async, bulk or tma, got {v:?}"))),
        }),
    };
    Ok(match (forced, major >= 9) {
        (_, false) | (Some(SplitKvLoad::CpAsync), _) => SplitKvLoad::CpAsync,
        (Some(SplitKvLoad::Bulk), true) => SplitKvLoad::Bulk,
        (None | Some(SplitKvLoad::Tma), true) => SplitKvLoad::Tma,
    })
}

/// Longest split that takes the bulk-copy path on sm_90 when TMA cannot (D = 96, layouts no tensor map
/// describes); longer ones take `cp.async`. Measured on the H100 (`bench/results/gpu/fa2.md`):
/// bulk copies beat `cp.async` by about 6 % at 512 keys per split (B=1, Hkv=8, Sk=32k) and lose by 4-70 %
/// at 1024-2048 (B=8, Hkv=32, Sk=4k); the cause of the loss is not established.
pub const BULK_MAX_KEYS_PER_SPLIT: usize = 512;

/// L2 policy of the K/V loads on the sm_90 paths (`params.extra` of the kernel: 0 evict-first, 1
/// evict-normal, 2 evict-last).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum L2Policy {
    /// Streamed lines leave L2 first.
    EvictFirst = 0,
    /// The default priority.
    EvictNormal = 1,
    /// Streamed lines stay in L2 longest.
    EvictLast = 2,
}

/// Longest split whose K/V loads are marked evict-first; longer splits are marked evict-last. Measured on
/// the H100 through the Rust backend after a 256 MB L2 write flush, as PyTorch is timed
/// (`bench/results/gpu/fa2.md`, "Decoding"), on the two decoding shapes only: B=8, Hkv=32, Sk=4k (1024 keys
/// per split) 196.7 us evict-first, 191.1 normal, 189.2 evict-last; B=1, Hkv=8, Sk=32k (512 keys per
/// split) 61.5 / 64.1 / 63.2 us. Why the better policy flips between them was not established; the
/// threshold is a fit to those two points.
pub const EVICT_FIRST_MAX_KEYS_PER_SPLIT: usize = 512;

/// The L2 policy for a split of `keys_per_split` keys: `SDPA_SPLITKV_L2` (`first`, `normal` or `last`)
/// forces one for comparisons, otherwise [`EVICT_FIRST_MAX_KEYS_PER_SPLIT`] decides.
pub fn l2_policy(keys_per_split: usize) -> Result<L2Policy> {
    Ok(forced_l2_policy()?.unwrap_or(if keys_per_split <= EVICT_FIRST_MAX_KEYS_PER_SPLIT {
        L2Policy::EvictFirst
    } else {
        L2Policy::EvictLast
    }))
}

/// The L2 policy `SDPA_SPLITKV_L2` (`first`, `normal` or `last`) forces for comparisons, if set (also read
/// by the MLA path, [`super::splitkv_mla`]).
pub fn forced_l2_policy() -> Result<Option<L2Policy>> {
    Ok(match std::env::var("SDPA_SPLITKV_L2").as_deref() {
        Ok("first") => Some(L2Policy::EvictFirst),
        Ok("normal") => Some(L2Policy::EvictNormal),
        Ok("last") => Some(L2Policy::EvictLast),
        Ok(v) => return Err(unsupported(format!("SDPA_SPLITKV_L2 must be first, normal or last, got {v:?}"))),
        Err(_) => None,
    })
}

/// `params.extra` bit that makes the kernel write its timeline to the module global `splitkv_trace`
/// (`kernels/splitkv.cu`, [`TRACE_GLOBAL`]).
const TRACE_BIT: i32 = 0x100;
/// The module global holding the last traced launch: [`TRACE_FIELDS`] u64 per block, in launch order
/// (x fastest), for the first [`TRACE_BLOCKS`] blocks.
pub const TRACE_GLOBAL: &str = "splitkv_trace";
/// Blocks the trace holds (`SKV_TRACE_BLOCKS`).
pub const TRACE_BLOCKS: usize = 4096;
/// Words per block (`SKV_TRACE_FIELDS`): globaltimer at entry and exit (ns); clock64 at entry, first stage
/// landed (0 on the cp.async path), key loop done, partial counted, exit; SM id and 1 if the block merged
/// its row tile (both 0 when a row tile has one block).
pub const TRACE_FIELDS: usize = 9;

/// Whether `SDPA_SPLITKV_TRACE=1` asks the kernel for its timeline (tuning runs only).
pub fn trace_requested() -> bool {
    std::env::var_os("SDPA_SPLITKV_TRACE").is_some_and(|v| v == "1")
}

/// Split plan of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitPlan {
    /// Splits per (batch, kv head, row tile); split `s` covers keys `[s·Sk/splits, (s+1)·Sk/splits)`.
    pub splits: usize,
    /// Keys of the longest split: `ceil(Sk / splits)`.
    pub keys_per_split: usize,
    /// Row tiles per kv head: `ceil(group·Sq / 16)`.
    pub row_tiles: usize,
    /// Blocks per row tile: `ceil(splits / warps)`; above 1 the blocks' partials go through scratch.
    pub blocks: usize,
}

/// Chooses the splits: enough warps to fill every resident block slot of the GPU twice (slots per SM from
/// the kernel's shared memory), but at least [`MIN_KEYS_PER_SPLIT`] keys per split so that the merge of
/// the partials stays small. Measured on the H100 (`bench/results/gpu/fa2.md`): B=8, Hkv=32, Sk=4k gets 4
/// splits (201 us against 207 us with 2); B=1, Hkv=8, Sk=32k gets 64 (128 were slower; 66 splits over
/// 264 two-warp blocks, every SM busy, were slower too: the time grows with the blocks per row tile).
pub fn plan_splits(
    b: usize,
    hkv: usize,
    group: usize,
    sq: usize,
    sk: usize,
    sm_count: usize,
    smem_per_sm: usize,
    tile: SplitKvTile,
    d: usize,
) -> SplitPlan {
    let row_tiles = (group * sq).div_ceil(ROWS_PER_TILE).max(1);
    let units = (b * hkv * row_tiles).max(1);
    let per_sm = ((smem_per_sm + 1024) / (tile.smem_bytes(d) + 1024)).clamp(1, 64 / tile.warps);
    let target_warps = 2 * sm_count.max(1) * per_sm * tile.warps;
    let max_splits = sk.div_ceil(MIN_KEYS_PER_SPLIT).max(1);
    let splits = (target_warps / units).clamp(1, max_splits);
    SplitPlan { splits, keys_per_split: sk.div_ceil(splits).max(1), row_tiles, blocks: splits.div_ceil(tile.warps) }
}

/// Scratch of a call whose row tiles span `blocks > 1` blocks, in 4-byte elements: the blocks' partial
/// LSEs (`rows x blocks`, padded to 16 bytes), the partial outputs (`rows x blocks x d` f32), then one u32
/// counter per (batch, row tile) (`units`). Returns (total length, offset of the counters).
pub fn workspace_len(rows: usize, blocks: usize, d: usize, units: usize) -> Option<(usize, usize)> {
    let n = rows.checked_mul(blocks)?;
    let counters = n.div_ceil(4).checked_mul(4)?.checked_add(n.checked_mul(d)?)?;
    Some((counters.checked_add(units)?, counters))
}

/// One planned `splitkv` launch.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The program (one entry point).
    pub program: Program,
    /// Grid, block and shared memory.
    pub dims: LaunchDims,
    /// The call's parameters with the split count and flags set (the scratch pointer is set at launch).
    pub params: AttnParams,
    /// The split plan.
    pub splits: SplitPlan,
    /// The head-dim class the kernel runs (the width of each partial output in the scratch).
    pub head_dim: usize,
    /// The K and V tensor maps of a TMA entry.
    maps: Option<(CUtensorMap, CUtensorMap)>,
    /// A ragged call's schedule (its entry walks it instead of the dense split grid).
    pub ragged: Option<RaggedSchedule>,
}

/// Program, launch shape, splits and (for TMA) tensor maps of `splitkv` for the call. A call the
/// tensor-core kernels cannot take is an error here; the policy sends such calls to `fa1` before they get
/// here.
pub fn plan(call: &Call<'_>) -> Result<Plan> {
    let optin = call.dev.info().smem_per_block_optin.max(0) as usize;
    if let Some(limit) = splitkv_limit(call.spec, &call.params, optin) {
        return Err(unsupported(format!("splitkv cannot take this call: {limit}")));
    }
    let s = call.spec.shape;
    let info = call.dev.info();
    let hd = HeadDims::of(s.d, s.dv)
        .ok_or_else(|| unsupported(format!("splitkv has no head-dim class for D = {}, Dv = {}", s.d, s.dv)))?;
    // Rows that are not 16-byte aligned take the padded cp.async instantiation's narrow copies (issue 21).
    let hd = HeadDims { pad: hd.pad || !call.params.rows_16_byte_aligned(s.d, s.dv), ..hd };
    let d = hd.d;
    if call.spec.ragged.is_some() {
        return plan_ragged(call, hd);
    }
    // The keys the splits share: all of them, or (variants) the union of the rows' bands, so that the split
    // count and length follow a window, not Sk.
    let keys = band_keys(call.spec);
    let plan_for = |tile: SplitKvTile, d: usize| {
        plan_splits(
            s.b,
            s.hkv,
            s.group_size(),
            s.sq,
            keys,
            info.sm_count.max(1) as usize,
            info.smem_per_block_optin.max(0) as usize,
            tile,
            d,
        )
    };
    let no_tile = |d: usize| unsupported(format!("splitkv has no tile for D = {d}"));
    // The bulk path exists for the measured head dims at their exact size only; TMA takes every class, at
    // whole boxes (padded where that is above the call's head dims).
    let bulk_tile = !hd.pad && tile_for(d, SplitKvLoad::Bulk).is_some();
    let mut load = choose_load(info.compute_capability.0)?;
    if load == SplitKvLoad::Bulk && !bulk_tile {
        load = SplitKvLoad::CpAsync;
    }
    // Rows of Q or O that are only 2-byte aligned take cp.async: the 2-byte row copy of Q (splitkv.cu
    // `load_q`) is written for the one warp of a cp.async block, where the TMA entry loads one Q tile with
    // the whole block (the TMA maps themselves check K and V).
    if load == SplitKvLoad::Tma && hd.pad && super::pad_copy::narrow_row_bytes(&call.params) < 4 {
        load = SplitKvLoad::CpAsync;
    }
    // The head dims the kernel runs: the class, or on TMA the class at whole boxes.
    let mut kd = hd;
    // TMA: its tile and both tensor maps (carrying the call's D and Dv when padded), or else the bulk path
    // where it has a tile, cp.async otherwise.
    let mut tma = None;
    if load == SplitKvLoad::Tma {
        // 32-column boxes at D = 96 only with `SDPA_SPLITKV_TMA_NARROW=1`: a measurement switch. Written in
        // session 15 for D = 80's decoding; session 17 ran it on the H100, correct (tests and sanitizers) but
        // no faster (bench/results/gpu/headdims.md), so the plan keeps 64-column boxes.
        let narrow = std::env::var("SDPA_SPLITKV_TMA_NARROW").is_ok_and(|v| v == "1");
        let td = if narrow { hd.for_tma() } else { hd.for_tma_wide() };
        if let Some(t) = tile_for(td.d, load) {
            let t = with_tma_override(t, td.d, optin)?;
            let p = &call.params;
            let op = |ptr, st, w| KvOperand { ptr, dtype: call.spec.dtype, dims: [s.b, s.hkv, s.sk, w], strides: st };
            // One box row per key of the block's chunk: every warp's step.
            let chunk = t.warps * t.keys_per_step;
            let (k, v) = (op(p.k, p.k_stride, s.d), op(p.v, p.v_stride, s.dv));
            let row = tma_box_row(td.d);
            tma = map_in_rows(&k, chunk, row, td.pad).zip(map_in_rows(&v, chunk, row, td.pad)).map(|m| (t, m));
        }
        if tma.is_some() {
            kd = td;
        } else {
            load = if bulk_tile { SplitKvLoad::Bulk } else { SplitKvLoad::CpAsync };
        }
    }
    let (mut tile, mut maps) = match tma {
        Some((t, m)) => (t, Some(m)),
        None => (tile_for(kd.d, load).ok_or_else(|| no_tile(kd.d))?, None),
    };
    // The sm_90 rings are deeper than cp.async's: where the device's shared memory cannot hold them (an
    // sm_90 part capped below the H100's 227 KB, `SDPA_CUDA_SMEM_OPTIN`), cp.async runs (the policy checked it fits).
    if tile.smem_bytes(kd.d) > optin && load != SplitKvLoad::CpAsync {
        (load, maps, kd) = (SplitKvLoad::CpAsync, None, hd);
        tile = tile_for(d, load).ok_or_else(|| no_tile(d))?;
    }
    let d = kd.d;
    let mut plan = plan_for(tile, d);
    // Long splits stream better through cp.async than through per-row bulk copies (measured, see
    // BULK_MAX_KEYS_PER_SPLIT); unless the bulk path was asked for by name.
    let bulk_forced = std::env::var("SDPA_SPLITKV_LOAD").is_ok_and(|v| v == "bulk");
    if load == SplitKvLoad::Bulk && plan.keys_per_split > BULK_MAX_KEYS_PER_SPLIT && !bulk_forced {
        load = SplitKvLoad::CpAsync;
        tile = tile_for(d, load).ok_or_else(|| no_tile(d))?;
        plan = plan_for(tile, d);
    }
    // `SDPA_SPLITKV_SPLITS` forces the split count (for tuning runs; at most one split per key).
    if let Ok(v) = std::env::var("SDPA_SPLITKV_SPLITS") {
        let n: usize = v.parse().map_err(|_| unsupported(format!("SDPA_SPLITKV_SPLITS must be a count, got {v:?}")))?;
        let splits = n.clamp(1, keys.max(1));
        plan = SplitPlan {
            splits,
            keys_per_split: keys.div_ceil(splits).max(1),
            blocks: splits.div_ceil(tile.warps),
            ..plan
        };
    }
    let mut params = call.params;
    params.num_splits = i32::try_from(plan.splits).map_err(|_| unsupported("too many splits"))?;
    params.extra = l2_policy(plan.keys_per_split)? as i32 | if trace_requested() { TRACE_BIT } else { 0 };

    let u32_of = |v: usize, what: &str| u32::try_from(v).map_err(|_| unsupported(format!("splitkv: {what} too large")));
    let dims = LaunchDims {
        grid: (
            u32_of(plan.blocks, "split count")?,
            u32_of(s.hkv * plan.row_tiles, "kv heads x row tiles")?,
            u32_of(s.b, "batch")?,
        ),
        block: (tile.warps as u32 * 32, 1, 1),
        smem_bytes: tile.smem_bytes(d) as u32,
    };
    let program = program(call.spec.dtype, kd, tile, Masking::of(call.spec));
    Ok(Plan { program, dims, params, splits: plan, head_dim: d, maps, ragged: None })
}

/// Ints per unit of a ragged schedule (`SKV_UNIT_INTS` in splitkv.cu): sequence, chunk index, chunks of the
/// sequence, first key, end key, first partial slot of the sequence.
pub const UNIT_INTS: usize = 6;

/// Waves of blocks a ragged schedule aims for: more, shorter chunks than the dense plan's two waves, so
/// that the blocks of the shortest sequences (one chunk each, shorter than the rest) fill the tail.
pub const RAGGED_WAVES: usize = 4;

/// The grid of a ragged call: units of roughly equal key counts cut from each sequence's keys, so that a
/// batch mixing 100-token and 100k-token sequences spreads evenly over the GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaggedSchedule {
    /// [`UNIT_INTS`] per unit (one block per unit, kv head and row tile), longest chunks first.
    pub units: Vec<i32>,
    /// Partial slots in the scratch: `Hq·Sq_b·n_b` for each sequence cut into `n_b > 1` chunks.
    pub parts: usize,
    /// Row tiles per kv head of the widest sequence (`ceil(group·Sq_b / 16)`).
    pub row_tiles: usize,
    /// The longest chunk a unit gets, keys.
    pub chunk_keys: usize,
}

impl RaggedSchedule {
    /// Units in the schedule (blocks per kv head and row tile).
    pub fn len(&self) -> usize {
        self.units.len() / UNIT_INTS
    }

    /// No unit: no sequence has a query row.
    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }
}

/// Cuts each sequence's keys (the union of its rows' bands: all of them, or a window's) into chunks of at
/// most `chunk` keys, where `chunk` gives about [`RAGGED_WAVES`] waves of blocks over the whole batch (each
/// block a (chunk, kv head, row tile)), and at least `warps x` [`MIN_KEYS_PER_SPLIT`] keys so that the
/// merges stay small. `SDPA_SPLITKV_CHUNK` forces the chunk (tuning runs). A sequence without query rows
/// gets no unit; one without keys gets one empty unit (its rows are zeros with LSE -inf).
pub fn ragged_schedule(
    spec: &sdpa_core::AttentionSpec,
    tile: SplitKvTile,
    d: usize,
    sm_count: usize,
    smem_per_sm: usize,
) -> Result<RaggedSchedule> {
    let per_sm = ((smem_per_sm + 1024) / (tile.smem_bytes(d) + 1024)).clamp(1, 64 / tile.warps);
    let blocks =
        UnitBlocks { rows: ROWS_PER_TILE, per_sm, min_chunk: tile.warps * MIN_KEYS_PER_SPLIT, waves: RAGGED_WAVES };
    ragged_units(spec, blocks, sm_count)
}

/// What a ragged schedule needs of the kernel whose blocks walk it: query rows per row tile, blocks resident per
/// SM, the fewest keys a chunk gets, and the waves of blocks to aim for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitBlocks {
    /// Packed query rows (heads x positions) of one row tile.
    pub rows: usize,
    /// Blocks resident per SM.
    pub per_sm: usize,
    /// Fewest keys per chunk (unless a sequence has fewer).
    pub min_chunk: usize,
    /// Waves of blocks the chunks aim for ([`RAGGED_WAVES`] for `splitkv`).
    pub waves: usize,
}

/// [`ragged_schedule`] for any kernel's blocks (`splitkv`'s, or the MLA path's, [`super::splitkv_mla`]).
pub fn ragged_units(spec: &sdpa_core::AttentionSpec, blocks: UnitBlocks, sm_count: usize) -> Result<RaggedSchedule> {
    let s = spec.shape;
    let group = s.group_size();
    // (sequence, first key, keys, row tiles) of every sequence with rows.
    let mut seqs = Vec::new();
    for (b, seq) in spec.seqs().iter().enumerate() {
        if seq.sq == 0 {
            continue;
        }
        let band = spec.band_for(seq.sq, seq.sk);
        let first = band.range(0, seq.sk).start;
        let end = band.range(seq.sq - 1, seq.sk).end.max(first);
        seqs.push((b, first, end - first, (group * seq.sq).div_ceil(blocks.rows)));
    }
    let weighted: usize = seqs.iter().map(|&(_, _, keys, rt)| s.hkv * rt * keys).sum();
    let target_blocks = blocks.waves.max(1) * sm_count.max(1) * blocks.per_sm.max(1);
    let mut chunk = weighted.div_ceil(target_blocks).max(blocks.min_chunk);
    if let Ok(v) = std::env::var("SDPA_SPLITKV_CHUNK") {
        chunk = v
            .parse::<usize>()
            .map_err(|_| unsupported(format!("SDPA_SPLITKV_CHUNK must be a count, got {v:?}")))?
            .max(1);
    }
    let int =
        |v: usize| i32::try_from(v).map_err(|_| unsupported("splitkv: a ragged batch too large for its schedule"));
    let mut units: Vec<[i32; UNIT_INTS]> = Vec::new();
    let (mut parts, mut row_tiles, mut chunk_keys) = (0usize, 1usize, 0usize);
    for &(b, first, keys, rt) in &seqs {
        let n = keys.div_ceil(chunk).max(1);
        let base = if n > 1 { parts } else { 0 };
        if n > 1 {
            parts += s.hq * spec.seq(b).sq * n;
        }
        row_tiles = row_tiles.max(rt);
        for c in 0..n {
            let (kb, ke) = (first + c * keys / n, first + (c + 1) * keys / n);
            chunk_keys = chunk_keys.max(ke - kb);
            units.push([int(b)?, int(c)?, int(n)?, int(kb)?, int(ke)?, int(base)?]);
        }
    }
    int(parts)?;
    // Longest first: the blocks of short sequences fill the last wave.
    units.sort_by_key(|u| std::cmp::Reverse(u[4] - u[3]));
    Ok(RaggedSchedule { units: units.concat(), parts, row_tiles, chunk_keys })
}

/// The plan of a ragged call: its schedule, one block per (unit, kv head, row tile), the ragged entry.
fn plan_ragged(call: &Call<'_>, hd: HeadDims) -> Result<Plan> {
    let s = call.spec.shape;
    let info = call.dev.info();
    let tile = ragged_tile(hd.d, info.smem_per_block_optin.max(0) as usize)?;
    let sched = ragged_schedule(
        call.spec,
        tile,
        hd.d,
        info.sm_count.max(1) as usize,
        info.smem_per_block_optin.max(0) as usize,
    )?;
    let mut params = call.params;
    params.num_splits = tile.warps as i32;
    params.extra = l2_policy(sched.chunk_keys / tile.warps)? as i32;
    let u32_of = |v: usize, what: &str| u32::try_from(v).map_err(|_| unsupported(format!("splitkv: {what} too large")));
    let dims = LaunchDims {
        grid: (u32_of(sched.len(), "schedule")?, u32_of(s.hkv * sched.row_tiles, "kv heads x row tiles")?, 1),
        block: (tile.warps as u32 * 32, 1, 1),
        smem_bytes: tile.smem_bytes(hd.d) as u32,
    };
    let program = ragged_program(call.spec.dtype, hd, tile, ragged_masking(call.spec));
    let splits = SplitPlan {
        splits: tile.warps,
        keys_per_split: sched.chunk_keys.div_ceil(tile.warps),
        row_tiles: sched.row_tiles,
        blocks: sched.len(),
    };
    Ok(Plan { program, dims, params, splits, head_dim: hd.d, maps: None, ragged: Some(sched) })
}

/// A launch parameter of AttnParams, a device table of ints (or 0) and the partial slots: the ragged
/// entries' `SplitKvRaggedArgs` in splitkv.cu (the unit schedule) and the MLA combine's
/// `SplitKvMlaCombineArgs` in splitkv_mla.cu (the per-sequence table).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct TableArgs {
    pub(super) p: AttnParams,
    pub(super) table: u64,
    pub(super) parts: i64,
}
const _: () = assert!(std::mem::size_of::<TableArgs>() == crate::checked::params::ATTN_PARAMS_SIZE + 16);
// SAFETY: plain data with C layout matching both kernels' structs (the size asserted here, and in splitkv.cu for
// `SplitKvRaggedArgs`; `SplitKvMlaCombineArgs` has the same three fields).
unsafe impl DeviceRepr for TableArgs {}

/// Runs a ragged call's plan: uploads its schedule (kept per content by the device), then one launch on
/// the scratch (when some sequence has several chunks) like the dense path.
fn run_ragged(call: &Call<'_>, plan: Plan, sched: RaggedSchedule) -> Result<()> {
    if sched.is_empty() {
        return Ok(()); // no sequence has a query row: nothing to write
    }
    let table = call.dev.table_i32(&sched.units, "splitkv's ragged schedule")?;
    let (units, table_guard) = cudarc::driver::DevicePtr::device_ptr(table.as_ref(), call.stream);
    let counters = call.spec.shape.b * plan.dims.grid.1 as usize;
    let parts = i64::try_from(sched.parts).map_err(|_| unsupported("splitkv: too many partials"))?;
    let go = |params: &AttnParams| {
        let args = TableArgs { p: *params, table: units, parts };
        // SAFETY: `params` holds the backend's checked pointers (Q/O rows, packed K/V or pages through
        // the block table, clamped into the pool, as the spec's validated lengths address them); `units`
        // is the schedule of exactly `grid.x` units, alive until the launch is queued; every unit with
        // several chunks addresses partial slots below `parts`, which the scratch holds.
        unsafe { launch(call.dev, call.stream, &plan.program, &plan.program.name, plan.dims, &args) }
    };
    if sched.parts == 0 {
        go(&plan.params)?;
    } else {
        with_scratch(call, plan.params, sched.parts, 1, plan.head_dim, counters, go)?;
    }
    drop(table_guard);
    Ok(())
}

/// Runs `go` with `params.workspace` pointing at scratch for `rows x blocks` partials of width `head_dim`
/// and `units` zeroed counters (`workspace_len`): on the device's own stream the kept scratch (its counters
/// stay zero between calls: the kernel resets them), on another stream scratch allocated and zeroed for
/// this call.
pub(crate) fn with_scratch(
    call: &Call<'_>,
    mut params: AttnParams,
    rows: usize,
    blocks: usize,
    head_dim: usize,
    units: usize,
    go: impl Fn(&AttnParams) -> Result<()>,
) -> Result<()> {
    let (len, counters) =
        workspace_len(rows, blocks, head_dim, units).ok_or_else(|| unsupported("splitkv scratch size overflows"))?;
    // The kernel finds the last block of each row tile with the counters, which must be zero before the
    // launch; it leaves them zero again. On the device's own stream the scratch is kept between calls, so
    // repeated calls of one layout (every step of a decoding loop) skip the memset; on another stream it
    // is allocated and zeroed per call.
    if Arc::ptr_eq(call.stream, call.dev.stream()) {
        let kept = call.dev.kept_scratch(len, counters, "splitkv partial outputs")?;
        let ws = kept.buf().ok_or_else(|| unsupported("internal: splitkv's kept scratch is missing"))?;
        let (ws_ptr, ws_guard) = cudarc::driver::DevicePtr::device_ptr(ws, call.stream);
        params.workspace = ws_ptr;
        // The kept buffer has exactly this layout and zero counters (KeptScratch), and the kernel leaves
        // them zero. The lock is held until the launch is queued.
        go(&params)?;
        drop(ws_guard);
        drop(kept);
        return Ok(());
    }
    let mut ws = call.scratch::<f32>(len, "splitkv partial outputs")?;
    call.stream.memset_zeros(&mut ws.slice_mut(counters..len)).map_err(driver(
        "cuMemsetD8Async",
        "splitkv counters",
        units * 4,
    ))?;
    // The guard orders the scratch's later reuse after this call's kernel; held until it is queued.
    let (ws_ptr, ws_guard) = cudarc::driver::DevicePtr::device_ptr(&ws, call.stream);
    params.workspace = ws_ptr;
    // `ws`, sized by `workspace_len` with zeroed counters, lives until the launch is queued and is freed
    // stream-ordered after it.
    go(&params)?;
    drop(ws_guard);
    drop(ws);
    Ok(())
}

/// The keys `splitkv`'s splits cover: Sk for plain calls; with variants the keys some row's band reaches,
/// from the first row's first to the last row's last (the band moves right with the row). The kernel cuts
/// each row tile's own band the same way.
pub fn band_keys(spec: &sdpa_core::AttentionSpec) -> usize {
    let s = spec.shape;
    if spec.variants.is_plain() || s.sq == 0 {
        return s.sk;
    }
    let band = spec.band();
    let (first, last) = (band.range(0, s.sk), band.range(s.sq - 1, s.sk));
    last.end.saturating_sub(first.start)
}

/// Runs `splitkv` (one launch, plus a memset of the row-tile counters when they are used) on the call's
/// stream.
pub fn run(call: &Call<'_>) -> Result<()> {
    let mut plan = self::plan(call)?;
    if let Some(sched) = plan.ragged.take() {
        return run_ragged(call, plan, sched);
    }
    let Plan { program, dims, params, splits: plan, head_dim, maps, .. } = plan;
    let s = call.spec.shape;
    let rows = s.b * s.hq * s.sq;
    let units = s.b * s.hkv * plan.row_tiles;
    // The launch itself: AttnParams alone, or with the tensor maps for the TMA entries.
    let go = |params: &AttnParams| -> Result<()> {
        match maps {
            // SAFETY (both arms): `params` holds the backend's checked pointers; with one block per row
            // tile the kernel merges its warps' partials in shared memory and writes O rows < Sq and LSE
            // entries < B·Hq·Sq only, never touching `workspace` (null); with several, `workspace` is
            // scratch sized by `workspace_len` for exactly `rows x blocks` partials and `units` zeroed
            // counters (with_scratch): every block writes its partial slots before counting itself on its
            // row tile's counter, and only the last block (which fences first) reads them back. The maps
            // describe exactly K and V of `params` (same pointers, extents and strides), so every tensor
            // copy reads inside those tensors.
            Some((k, v)) => unsafe {
                launch(call.dev, call.stream, &program, &program.name, dims, &TmaArgs::new(*params, k, v))
            },
            None => unsafe { launch(call.dev, call.stream, &program, &program.name, dims, params) },
        }
    };
    if plan.blocks == 1 {
        return go(&params);
    }
    with_scratch(call, params, rows, plan.blocks, head_dim, units, go)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_fill_the_gpu_and_cover_every_key() {
        let tile = SplitKvTile { warps: 4, stages: 2, keys_per_step: 32, load: SplitKvLoad::CpAsync };
        // D = 128: 153 KB per block, one block (4 warps) per SM, two waves = 1056 warps on 132 SMs.
        // B=8, Hkv=32, one row per head: 256 units -> 4 splits of 1024 keys.
        let p = plan_splits(8, 32, 1, 1, 4096, 132, 227 * 1024, tile, 128);
        assert_eq!((p.splits, p.keys_per_split, p.row_tiles, p.blocks), (4, 1024, 1, 1));
        // B=1, Hkv=8, group 4: 8 units -> 132 splits wanted, capped at 512 keys each: 64 splits.
        let p = plan_splits(1, 8, 4, 1, 32768, 132, 227 * 1024, tile, 128);
        assert_eq!((p.splits, p.keys_per_split, p.blocks), (64, 512, 16));
        // Short keys: at least MIN_KEYS_PER_SPLIT keys per split; the splits cover Sk (the longest is
        // ceil(Sk / splits), the kernel cuts at s·Sk/splits).
        for sk in [1, 31, 33, 77, 1000, 5000] {
            let p = plan_splits(1, 1, 1, 1, sk, 132, 227 * 1024, tile, 64);
            assert_eq!(p.splits, sk.div_ceil(MIN_KEYS_PER_SPLIT), "sk {sk}: {p:?}");
            assert!(p.splits * p.keys_per_split >= sk, "sk {sk}: {p:?}");
            assert_eq!(p.blocks, p.splits.div_ceil(4));
        }
    }

    #[test]
    fn shared_memory_mirrors_the_kernel_layout() {
        // Padded rings: (16 + 2·stages·keys) rows of d + 8, per warp, plus the mbarriers.
        let t = tile_for(128, SplitKvLoad::CpAsync).expect("tile");
        assert_eq!(t.smem_bytes(128), (16 + 2 * 2 * 32) * 136 * 2 * 4 + 8 * 2 * 4);
        // TMA at D = 128: ring 3·2·32·128 elements + Q 16·136, rounded up to 512 elements per warp; plus
        // TMA at D = 128: 4 unpadded rings of 3·2·32·128 elements, one Q tile of 16·136, the 1024 bytes
        // that align the base (SplitKvTile<128, 3, 32, SKV_TMA>::smem_bytes(4) = 202080).
        let t = tile_for(128, SplitKvLoad::Tma).expect("tile");
        assert_eq!(t.smem_bytes(128), 1024 + (4 * 3 * 2 * 32 * 128 + 16 * 136) * 2 + 96);
        assert!(t.smem_bytes(128) <= 227 * 1024);
        // TMA at D = 96: 32-column boxes, four stages.
        let t = tile_for(96, SplitKvLoad::Tma).expect("tile");
        assert_eq!(t.smem_bytes(96), 1024 + (4 * 4 * 2 * 32 * 96 + 16 * 104) * 2 + 128);
        assert!(t.smem_bytes(96) <= 227 * 1024);
        assert!(tile_for(256, SplitKvLoad::Tma).is_some_and(|t| t.smem_bytes(256) <= 227 * 1024));
    }

    /// Every class has a TMA tile at whole boxes that fits an H100's 227 KB, padded where the class (or the
    /// call) is narrower; D = 96 in 32-column boxes; the programs list each padded TMA entry once.
    #[test]
    fn every_class_runs_tma_at_whole_boxes() {
        for d in crate::kernels::fa2::HEAD_DIM_CLASSES {
            let exact = HeadDims { d, pad: false }.for_tma();
            let boxed = if d == 96 { 96 } else { d.next_multiple_of(64) };
            assert_eq!(exact, HeadDims { d: boxed, pad: d != boxed }, "class {d}");
            assert_eq!(tma_box_row(exact.d), if d == 96 { BoxRow::Bytes64 } else { BoxRow::Bytes128 });
            assert_eq!(HeadDims { d, pad: true }.for_tma(), HeadDims { d: exact.d, pad: true });
            let t = tile_for(exact.d, SplitKvLoad::Tma).expect("a TMA tile");
            assert!(t.smem_bytes(exact.d) <= 227 * 1024, "class {d}: {} bytes", t.smem_bytes(exact.d));
        }
        assert_eq!(HeadDims::of(80, 80).map(HeadDims::for_tma), Some(HeadDims { d: 96, pad: true }));
        assert_eq!(HeadDims::of(96, 96).map(HeadDims::for_tma), Some(HeadDims { d: 96, pad: false }));
        assert_eq!(HeadDims::of(96, 64).map(HeadDims::for_tma), Some(HeadDims { d: 96, pad: true }));
        assert_eq!(HeadDims::of(192, 128).map(HeadDims::for_tma), Some(HeadDims { d: 192, pad: true }));
        assert_eq!(HeadDims::of(128, 128).map(HeadDims::for_tma), Some(HeadDims { d: 128, pad: false }));
        let names: Vec<String> = programs().into_iter().map(|p| p.name).collect();
        for d in [64, 96, 128, 192, 256] {
            let n = names.iter().filter(|n| *n == &format!("splitkv_tma_bf16_{d}p_none")).count();
            assert_eq!(n, 1, "D = {d}");
        }
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "program names are unique");
    }

    #[test]
    fn tile_overrides_apply_per_head_dim() {
        assert_eq!(parse_tile_override("6x16", 128).ok().flatten(), Some((6, 16)));
        assert_eq!(parse_tile_override("96:8x16,128:6x16", 96).ok().flatten(), Some((8, 16)));
        assert_eq!(parse_tile_override("96:8x16,128:6x16", 128).ok().flatten(), Some((6, 16)));
        assert_eq!(parse_tile_override("96:8x16", 192).ok().flatten(), None);
        assert_eq!(parse_tile_override("4x32,96:8x16", 96).ok().flatten(), Some((8, 16)));
        assert_eq!(parse_tile_override("4x32,96:8x16", 64).ok().flatten(), Some((4, 32)));
        for bad in ["", "6", "6x24", "9x16", "1x32", "a:6x16", "96:6y16", "6x16,"] {
            assert!(parse_tile_override(bad, 96).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn long_splits_keep_their_lines_in_l2() {
        if std::env::var_os("SDPA_SPLITKV_L2").is_some() {
            return; // forced for a comparison run
        }
        assert_eq!(l2_policy(512).expect("policy"), L2Policy::EvictFirst);
        assert_eq!(l2_policy(1024).expect("policy"), L2Policy::EvictLast);
    }

    /// The splits of a windowed call cover the window's keys, not Sk: a decoding row with a 4096-key window
    /// over 32k keys plans its splits over 4097 keys.
    #[test]
    fn splits_follow_the_window() {
        use sdpa_core::{DType, Mask, Shape, Window};
        let shape = Shape { b: 1, hq: 32, hkv: 8, sq: 1, sk: 32768, d: 128, dv: 128 };
        let plain = sdpa_core::AttentionSpec::new(shape, DType::BF16).with_mask(Mask::CausalBottomRight);
        assert_eq!(band_keys(&plain), 32768);
        assert_eq!(band_keys(&plain.clone().with_window(Window::left(4096))), 4097);
        assert_eq!(band_keys(&plain.clone().with_softcap(30.0)), 32768);
        // Four decoding rows: the union of their windows.
        let four = sdpa_core::AttentionSpec::new(Shape { sq: 4, ..shape }, DType::BF16)
            .with_mask(Mask::CausalBottomRight)
            .with_window(Window::left(100));
        assert_eq!(band_keys(&four), 104);
        let tile = tile_for(128, SplitKvLoad::CpAsync).expect("tile");
        let wide = plan_splits(1, 8, 4, 1, 32768, 132, 227 * 1024, tile, 128);
        let narrow = plan_splits(1, 8, 4, 1, 4097, 132, 227 * 1024, tile, 128);
        assert!(narrow.splits < wide.splits && narrow.splits * narrow.keys_per_split >= 4097, "{narrow:?}");
    }

    /// The schedule covers every key of every sequence with rows exactly once, in chunks of about equal
    /// length (longest first), gives sequences without rows no unit and one without keys an empty one,
    /// and numbers partial slots only for sequences cut into several chunks.
    #[test]
    fn ragged_schedule_balances_short_and_long_sequences() {
        use sdpa_core::{AttentionSpec, DType, Mask, Ragged, Shape};
        if std::env::var_os("SDPA_SPLITKV_CHUNK").is_some() {
            return; // forced for a tuning run
        }
        let r = Ragged::new(vec![1, 0, 2, 1, 1], vec![100, 50, 100_000, 0, 9000]).paged(16, 0);
        let shape = Shape { b: 5, hq: 8, hkv: 2, sq: 2, sk: 100_000, d: 128, dv: 128 };
        let spec = AttentionSpec::new(shape, DType::BF16)
            .with_ragged(r, sdpa_core::Layout::Bshd)
            .with_mask(Mask::CausalBottomRight);
        let tile = tile_for(128, SplitKvLoad::CpAsync).expect("tile");
        let s = ragged_schedule(&spec, tile, 128, 132, 227 * 1024).expect("schedule");
        let units: Vec<&[i32]> = s.units.chunks(UNIT_INTS).collect();
        assert!(units.windows(2).all(|w| w[0][4] - w[0][3] >= w[1][4] - w[1][3]), "longest first");
        for (b, keys) in [(0, 100), (2, 100_000), (3, 0), (4, 9000)] {
            let mut mine: Vec<&[i32]> = units.iter().copied().filter(|u| u[0] == b).collect();
            mine.sort_by_key(|u| u[1]);
            let n = mine.len();
            assert!(mine.iter().all(|u| u[2] as usize == n), "seq {b}: {mine:?}");
            assert_eq!((mine[0][3], mine[n - 1][4]), (0, keys), "seq {b} covers its keys");
            assert!(mine.windows(2).all(|w| w[0][4] == w[1][3]), "seq {b}: chunks are contiguous");
            assert!(mine.iter().all(|u| (u[4] - u[3]) as usize <= s.chunk_keys));
        }
        assert!(units.iter().all(|u| u[0] != 1), "no rows, no unit");
        let long = units.iter().filter(|u| u[0] == 2).count();
        assert!(long > 8, "the long sequence is cut into many chunks: {long}");
        // Two rows x 8 heads x chunks of the long sequence, plus the 9000-key one if it is cut.
        let cut9000 = units.iter().filter(|u| u[0] == 4).count();
        let expected = 8 * 2 * long + if cut9000 > 1 { 8 * cut9000 } else { 0 };
        assert_eq!(s.parts, expected);
        assert_eq!(s.row_tiles, 1);
    }

    #[test]
    fn workspace_has_room_for_lse_outputs_then_counters() {
        assert_eq!(workspace_len(3, 5, 64, 7), Some((16 + 15 * 64 + 7, 16 + 15 * 64)));
        assert_eq!(workspace_len(usize::MAX, 2, 64, 1), None);
    }
}
