//! `splitkv` at MLA's head dims (`kernels/splitkv_mla.cu`): decoding with D = 576 for Q·Kᵀ and Dv = 512 for
//! P·V (DeepSeek-V2/V3's absorbed attention: many query heads on one kv head), fused, on sm_90 (issue 21).
//! Reported as kernel `splitkv`.
//!
//! `splitkv`'s own tiles stop at 256: one warp there owns a 16-row tile and its whole output row, which at
//! Dv = 512 is 256 f32 registers per lane. Here the warps of a block share up to [`MlaTile::rows`] packed
//! rows (the query heads of one kv head and their query positions) and split the output columns, the scores
//! of each step's keys and, through shared memory, the softmax. K and V arrive by TMA; the keys are split over
//! blocks ([`plan_splits`]) and the partials of a row tile split over several blocks (`splitkv`'s scratch
//! layout, [`super::splitkv::workspace_len`]) are merged by a second launch, one block per query row
//! ([`combine_program`]); merging in the forward's last block, as `splitkv` does, left one block loading a
//! whole row tile's partials (H100: 170 us of a 16-head, 32k-key call at 128 splits, 4x the kernel).
//!
//! What it takes ([`refuses`]): f16/bf16; no mask, a causal one (either alignment; Sq > 1 is speculative
//! decoding) or a window, through every call's key band; no explicit mask, softcap or ALiBi; dense batches, and
//! ragged ones with K/V packed or in a paged cache whose pages hold 8, 16 or a multiple of 32 slots (a step's
//! boxes come whole from one page), on `splitkv`'s schedule of chunks of about equal keys
//! ([`super::splitkv::ragged_units`]); K/V layouts a TMA tensor map describes; rows of whole 16-byte chunks; at
//! most 65535 batch entries x kv heads; a GPU of compute capability 9.x with the shared memory of its tile.
//! `auto` picks it for dense calls with at most [`AUTO_MAX_ROWS`] rows per kv head and for every ragged call it
//! takes; the rest runs on `wide` (dense calls; ragged ones at these head dims have no other kernel and are
//! refused with this path's reason).

use super::splitkv::{ragged_units, with_scratch, L2Policy, TableArgs, UnitBlocks, UNIT_INTS};
use crate::checked::call::Call;
use crate::checked::launch::{launch, LaunchDims};
use crate::checked::params::{AttnParams, Masking, MASK_CAUSAL, VAR_BAND};
use crate::checked::tensor_map::{kv_describable, kv_operands, kv_tensor_map};
use crate::error::unsupported;
use crate::sys::modules::SPLITKV_MLA;
use crate::sys::program::{cuda_type, Program};
use cudarc::driver::sys::CUtensorMap;
use cudarc::driver::DeviceRepr;
use sdpa_core::{AttentionSpec, DType, Mask, Result};

/// Head dim of Q and K the kernel is built for (MLA: 512 latent columns and 64 rotary ones).
pub const MLA_D: usize = 576;
/// Head dim of V and O (the latent columns).
pub const MLA_DV: usize = 512;
/// Most rows per kv head (`group·Sq`) for which `auto` picks this kernel: every row group of 64 streams the
/// keys again (from L2 after the first), so past a few groups the GEMMs of `wide` are the better tool.
pub const AUTO_MAX_ROWS: usize = 128;
/// Keys per step of both tiles (`KS`; the TMA boxes' rows).
pub const KEYS_PER_STEP: usize = 32;
/// Fewest keys a split gets (unless Sk itself is shorter): each split's partial costs `rows x Dv` f32 of
/// scratch traffic.
pub const MIN_KEYS_PER_SPLIT: usize = 256;

/// One compiled shape of the kernel (`MlaTile` in splitkv_mla.cu).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaTile {
    /// Row groups of 16 rows (warps along the rows).
    pub row_warps: usize,
    /// Warps sharing a row group's output columns.
    pub col_warps: usize,
    /// Keys per step.
    pub keys_per_step: usize,
    /// Depth of the K/V ring.
    pub stages: usize,
}

impl MlaTile {
    /// Few rows (up to 16 per kv head: DeepSeek's 16 heads per GPU at tensor parallelism 8): one row group,
    /// four warps on 128 columns each, a three-deep ring.
    pub const NARROW: MlaTile = MlaTile { row_warps: 1, col_warps: 4, keys_per_step: 32, stages: 3 };
    /// More rows (up to 64 per block: 128 heads take two blocks per split): four row groups, two warps on
    /// 256 columns each, a two-deep ring.
    pub const TALL: MlaTile = MlaTile { row_warps: 4, col_warps: 2, keys_per_step: 32, stages: 2 };

    /// Packed rows one block holds.
    pub fn rows(&self) -> usize {
        16 * self.row_warps
    }

    /// Threads per block.
    pub fn threads(&self) -> usize {
        32 * self.row_warps * self.col_warps
    }

    /// Dynamic shared memory of a block, bytes (`MlaTile::SMEM` in splitkv_mla.cu): 1024 bytes to align the
    /// base, the ring of K and V boxes, the padded Q tile, P and the row maxima double-buffered, the mbarriers.
    pub fn smem_bytes(&self) -> usize {
        let r = self.rows();
        let ring = self.stages * (MLA_D + MLA_DV) * self.keys_per_step * 2;
        let q = r * (MLA_D + 8) * 2;
        let p = 2 * r * (self.keys_per_step + 8) * 2;
        let red = 2 * self.row_warps * self.col_warps * 16 * 4;
        1024 + ring + q + p + red + self.stages * 16
    }

    /// The tile for `rows` packed rows per kv head: `SDPA_MLA_TILE` (`narrow` or `tall`) forces one for
    /// comparisons, otherwise [`Self::NARROW`] up to 16 rows and [`Self::TALL`] above.
    pub fn for_rows(rows: usize) -> Result<MlaTile> {
        match std::env::var("SDPA_MLA_TILE").as_deref() {
            Ok("narrow") => Ok(Self::NARROW),
            Ok("tall") => Ok(Self::TALL),
            Ok(v) => Err(unsupported(format!("SDPA_MLA_TILE must be narrow or tall, got {v:?}"))),
            Err(_) if rows <= 16 => Ok(Self::NARROW),
            Err(_) => Ok(Self::TALL),
        }
    }
}

/// Rows per kv head the call's tile must hold: `group·Sq`, or of the widest sequence of a ragged call.
fn rows_per_kv_head(spec: &AttentionSpec) -> usize {
    let sq = spec.ragged.as_ref().map_or(spec.shape.sq, |r| r.max_q());
    spec.shape.group_size() * sq
}

/// Most blocks along a grid's y and z (CUDA's limit): the dense grid's z is B x Hkv, the combine's y is B.
const GRID_YZ_MAX: usize = 65535;

/// Why the kernel cannot take `spec` with `params` on a GPU of compute capability `cc` allowing `optin`
/// bytes of shared memory per block, or `None`.
pub fn refuses(spec: &AttentionSpec, params: &AttnParams, cc: (i32, i32), optin: usize) -> Option<String> {
    let s = spec.shape;
    if (s.d, s.dv) != (MLA_D, MLA_DV) {
        return Some(format!("splitkv's MLA path takes D = {MLA_D}, Dv = {MLA_DV} (got {}, {})", s.d, s.dv));
    }
    if !matches!(spec.dtype, DType::F16 | DType::BF16) {
        return Some(format!("splitkv's MLA path takes f16 and bf16 (got {})", spec.dtype));
    }
    if matches!(spec.mask, Mask::Explicit(_)) || spec.variants.softcap.is_some() || spec.variants.alibi.is_some() {
        return Some("splitkv's MLA path takes no mask, a causal one or a window, without softcap or ALiBi".into());
    }
    if let Some(pages) = spec.ragged.as_ref().and_then(|r| r.pages) {
        let (ps, ks) = (pages.page_size, KEYS_PER_STEP);
        if ps % 8 != 0 || (ks % ps != 0 && ps % ks != 0) {
            return Some(format!(
                "splitkv's MLA path takes pages of 8, 16 or a multiple of {ks} slots (got {ps}): a step's keys come \
                 as whole boxes of one page"
            ));
        }
    }
    if spec.scale() <= 0.0 {
        return Some(format!("splitkv's MLA path needs a positive scale (got {})", spec.scale()));
    }
    if cc.0 != 9 {
        return Some(format!("splitkv's MLA path runs on sm_90 (TMA), this GPU is sm_{}{}", cc.0, cc.1));
    }
    if !params.rows_16_byte_aligned(s.d, s.dv) {
        return Some("splitkv's MLA path needs rows of whole 16-byte chunks, 16-byte aligned".into());
    }
    let (k, v, box_keys) = kv_operands(spec, params, KEYS_PER_STEP);
    if !kv_describable(&k, box_keys) || !kv_describable(&v, box_keys) {
        return Some(
            "splitkv's MLA path reads K and V through TMA tensor maps, which need strides that are positive \
             multiples of 16 bytes (broadcast K/V with a zero stride cannot be described)"
                .into(),
        );
    }
    let yz = if spec.ragged.is_some() { s.hkv.max(s.b) } else { s.b.saturating_mul(s.hkv) };
    if yz > GRID_YZ_MAX {
        return Some(format!(
            "splitkv's MLA path launches a block row per batch entry and kv head: at most {GRID_YZ_MAX} (got B = {}, \
             Hkv = {})",
            s.b, s.hkv
        ));
    }
    let tile = match MlaTile::for_rows(rows_per_kv_head(spec)) {
        Ok(t) => t,
        Err(e) => return Some(e.to_string()),
    };
    (tile.smem_bytes() > optin).then(|| {
        format!("splitkv's MLA tile needs {} bytes of shared memory, the GPU allows {optin}", tile.smem_bytes())
    })
}

/// Whether `auto` sends a call this kernel takes here: decoding, at most [`AUTO_MAX_ROWS`] rows per kv head
/// (of every sequence, for a ragged call).
pub fn auto_takes(spec: &AttentionSpec) -> bool {
    rows_per_kv_head(spec) <= AUTO_MAX_ROWS
}

/// The program of entry `splitkv_mla_{dtype}_576_512_{none|band}_r{rows}`: `band` tests each key against its
/// row's band (causal masks, windows).
pub fn program(dtype: DType, tile: MlaTile, band: bool) -> Program {
    let name = format!(
        "splitkv_mla_{}_{MLA_D}_{MLA_DV}_{}_r{}",
        dtype.name(),
        if band { "band" } else { "none" },
        tile.rows()
    );
    let MlaTile { row_warps, col_warps, keys_per_step, stages } = tile;
    let line = format!(
        "SPLITKV_MLA_ENTRY({name}, {}, {MLA_D}, {MLA_DV}, {row_warps}, {col_warps}, {keys_per_step}, {stages}, {band})",
        cuda_type(dtype)
    );
    Program::entry(&SPLITKV_MLA, name, line)
}

/// Most thread groups of a combine block (`MLA_COMBINE_GROUPS`): group g of G adds partials g, g + G, ... of its
/// columns.
pub const COMBINE_GROUPS: usize = 4;
/// Splits per thread group of a combine block, at least ([`combine_groups`]).
pub const COMBINE_SPLITS_PER_GROUP: usize = 16;

/// Thread groups of the combine of `splits` partials: one per [`COMBINE_SPLITS_PER_GROUP`] splits, 1 to
/// [`COMBINE_GROUPS`]. Measured on the H100 (`bench/results/gpu/headdims.md`, "MLA decoding"): four groups took
/// 16 heads over 32k keys (128 splits) from 56 to 44 us, and cost 128 heads at B = 8 (1024 rows, 8 splits) 11 us.
pub fn combine_groups(splits: usize) -> usize {
    (splits / COMBINE_SPLITS_PER_GROUP).clamp(1, COMBINE_GROUPS)
}

/// Most splits of a row tile (the combine keeps one weight per split in shared memory).
pub const MAX_SPLITS: usize = 4096;

/// Dynamic shared memory of a combine block for `splits` partials (the layout `splitkv_mla_combine` describes): the other groups'
/// sums, three statistics and one weight per split; at least the parameters the repair of non-finite rows
/// keeps there.
pub fn combine_smem_bytes(splits: usize) -> usize {
    let bytes = (COMBINE_GROUPS - 1) * MLA_DV * 4 + 16 + splits.div_ceil(4) * 16;
    bytes.max(crate::checked::params::ATTN_PARAMS_SIZE)
}

/// The program of the merge of split row tiles, `splitkv_mla_combine_{dtype}_512`: one block of
/// [`combine_groups`] x Dv / 4 threads per query row.
pub fn combine_program(dtype: DType) -> Program {
    let name = format!("splitkv_mla_combine_{}_{MLA_DV}", dtype.name());
    let line = format!("SPLITKV_MLA_COMBINE_ENTRY({name}, {}, {MLA_DV})", cuda_type(dtype));
    Program::entry(&SPLITKV_MLA, name, line)
}

/// Every instantiation: both dtypes, both tiles, with and without the band test, and the combine of each dtype.
pub fn programs() -> Vec<Program> {
    let mut all = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        all.push(combine_program(dtype));
        for tile in [MlaTile::NARROW, MlaTile::TALL] {
            for band in [false, true] {
                all.push(program(dtype, tile, band));
            }
        }
    }
    all
}

/// Splits of the keys per row tile of a dense call: one block per multiprocessor over all row tiles (the tile
/// fills an SM's shared memory), at least [`MIN_KEYS_PER_SPLIT`] keys each, at most [`MAX_SPLITS`];
/// `SDPA_MLA_SPLITS` forces the count for tuning runs.
pub fn plan_splits(units: usize, keys: usize, sm_count: usize) -> Result<usize> {
    let most = keys.div_ceil(MIN_KEYS_PER_SPLIT).max(1);
    if let Ok(v) = std::env::var("SDPA_MLA_SPLITS") {
        let n: usize = v.parse().map_err(|_| unsupported(format!("SDPA_MLA_SPLITS must be a count, got {v:?}")))?;
        return Ok(n.clamp(1, keys.clamp(1, MAX_SPLITS)));
    }
    Ok((sm_count.max(1) / units.max(1)).clamp(1, most.min(MAX_SPLITS)))
}

/// Keys the rows of a dense call reach together: the union of their bands, causal masks included (a top-left
/// causal decode step of one row reaches one key, and splitting Sk for it would leave all but one split empty).
pub fn band_keys(spec: &AttentionSpec) -> usize {
    let s = spec.shape;
    if s.sq == 0 {
        return 0;
    }
    let band = spec.band();
    let (first, last) = (band.range(0, s.sk), band.range(s.sq - 1, s.sk));
    last.end.saturating_sub(first.start)
}

/// The forward's parameter: `SplitKvMlaArgs` in splitkv_mla.cu (AttnParams, the ragged schedule and the
/// combine's per-sequence table (0 when dense), the partial slots, padding to byte 384, the K and V maps).
#[repr(C)]
#[derive(Clone, Copy)]
struct MlaArgs {
    p: AttnParams,
    units: u64,
    seqs: u64,
    parts: i64,
    pad: [u8; MLA_PAD],
    k: CUtensorMap,
    v: CUtensorMap,
}
const MLA_PAD: usize = 384 - crate::checked::params::ATTN_PARAMS_SIZE - 24;
const _: () = assert!(std::mem::size_of::<MlaArgs>() == 640);
// SAFETY: plain data with C layout matching the kernel's `SplitKvMlaArgs` (size asserted on both sides).
unsafe impl DeviceRepr for MlaArgs {}

/// One planned call: the forward, and the combine when row tiles are split.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The forward's entry.
    pub program: Program,
    /// Its grid (dense: row groups, splits, batch x kv heads; ragged: units x row groups, kv heads), block and
    /// shared memory.
    pub dims: LaunchDims,
    /// The call's parameters with the L2 policy and the split count (ragged: the row groups) set.
    pub params: AttnParams,
    /// Partial slots in the scratch (0: no row tile is split, no combine).
    pub parts: usize,
    /// The merge of the partials, when some row tile is split, and its launch shape.
    pub combine: Option<(Program, LaunchDims)>,
    /// A ragged call's schedule (`splitkv::UNIT_INTS` ints per unit) and per-sequence (chunks, first slot).
    ragged: Option<(Vec<i32>, Vec<i32>)>,
    maps: (CUtensorMap, CUtensorMap),
}

impl Plan {
    /// The programs the call launches.
    pub fn programs(&self) -> Vec<Program> {
        let mut v = vec![self.program.clone()];
        v.extend(self.combine.iter().map(|(p, _)| p.clone()));
        v
    }
}

fn u32_of(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| unsupported(format!("splitkv MLA: {what} too large")))
}

/// Program, launch shapes, tensor maps and (ragged) schedule of a call [`refuses`] accepts.
pub fn plan(call: &Call<'_>) -> Result<Plan> {
    let info = call.dev.info();
    let optin = info.smem_per_block_optin.max(0) as usize;
    let spec = call.spec;
    if let Some(why) = refuses(spec, &call.params, info.compute_capability, optin) {
        return Err(unsupported(why));
    }
    let s = spec.shape;
    let tile = MlaTile::for_rows(rows_per_kv_head(spec))?;
    let sm_count = info.sm_count.max(1) as usize;
    let masking = Masking::of(spec);
    let band = masking.kind == MASK_CAUSAL || masking.var & VAR_BAND != 0;
    let ragged = spec.ragged.as_ref();
    let (k_op, v_op, box_keys) = kv_operands(spec, &call.params, KEYS_PER_STEP);
    let maps = kv_tensor_map(&k_op, box_keys)
        .zip(kv_tensor_map(&v_op, box_keys))
        .ok_or_else(|| unsupported("splitkv's MLA path: the driver could not encode the K/V tensor maps"))?;
    let mut params = call.params;
    let (grid, parts, ragged_tables, row_groups) = match ragged {
        None => {
            let row_groups = (s.group_size() * s.sq).div_ceil(tile.rows()).max(1);
            // The keys the splits share: the union of the rows' bands (a causal mask's or a window's).
            let splits = plan_splits(s.b * s.hkv * row_groups, band_keys(spec), sm_count)?;
            params.num_splits = i32::try_from(splits).map_err(|_| unsupported("too many splits"))?;
            let grid = (
                u32_of(row_groups, "row groups")?,
                u32_of(splits, "splits")?,
                u32_of(s.b * s.hkv, "batch x kv heads")?,
            );
            let parts = if splits > 1 { s.b * s.hq * s.sq * splits } else { 0 };
            (grid, parts, None, row_groups)
        }
        Some(_) => {
            // splitkv's four waves of chunks. One wave (chunks of Σ keys / SMs, rounded up per sequence) was tried
            // on the H100 and lost: 8 x 4096 keys in 64-slot pages at 128 heads 129 us against 97.5 us, the
            // mixed-length batch 93.3 against 82.1 us (the rounding leaves a second, nearly empty wave).
            let blocks = UnitBlocks {
                rows: tile.rows(),
                per_sm: 1,
                min_chunk: MIN_KEYS_PER_SPLIT,
                waves: super::splitkv::RAGGED_WAVES,
            };
            let sched = ragged_units(spec, blocks, sm_count)?;
            // The combine's table: each sequence's chunks and first partial slot (0 chunks: no query rows).
            let mut seqs = vec![0i32; 2 * s.b];
            for u in sched.units.chunks(UNIT_INTS) {
                let b = u[0] as usize;
                seqs[2 * b] = u[2];
                seqs[2 * b + 1] = u[5];
            }
            let row_groups = sched.row_tiles.max(1);
            // A ragged call's num_splits carries the row groups per unit (the kernel's grid decoding).
            params.num_splits = i32::try_from(row_groups).map_err(|_| unsupported("too many row groups"))?;
            let units = sched.len().max(1);
            let grid = (
                u32_of(units.saturating_mul(row_groups), "schedule units x row groups")?,
                u32_of(s.hkv, "kv heads")?,
                1,
            );
            (grid, sched.parts, Some((sched.units, seqs)), row_groups)
        }
    };
    // Several row groups read each key chunk, the second from L2: keep the lines at normal priority then.
    let policy = super::splitkv::forced_l2_policy()?.unwrap_or(if row_groups > 1 {
        L2Policy::EvictNormal
    } else {
        L2Policy::EvictFirst
    });
    params.extra = policy as i32;
    let dims = LaunchDims { grid, block: (tile.threads() as u32, 1, 1), smem_bytes: tile.smem_bytes() as u32 };
    // The combine: one block per (head x query row of the widest sequence, batch entry), its thread groups
    // from the most splits a row tile has.
    let most_splits = match &ragged_tables {
        Some((units, _)) => units.chunks(UNIT_INTS).map(|u| u[2].max(1) as usize).max().unwrap_or(1),
        None => params.num_splits.max(1) as usize,
    };
    if most_splits > MAX_SPLITS {
        // Only a forced chunk (SDPA_SPLITKV_CHUNK) cuts a sequence this fine: the combine keeps one weight per split.
        return Err(unsupported(format!(
            "splitkv MLA: a sequence cut into {most_splits} chunks, the combine takes at most {MAX_SPLITS}"
        )));
    }
    let max_sq = ragged.map_or(s.sq, |r| r.max_q());
    let combine = (parts > 0)
        .then(|| -> Result<_> {
            let dims = LaunchDims {
                grid: (u32_of(s.hq * max_sq.max(1), "query rows")?, u32_of(s.b, "batch")?, 1),
                block: ((combine_groups(most_splits) * MLA_DV / 4) as u32, 1, 1),
                smem_bytes: combine_smem_bytes(most_splits) as u32,
            };
            Ok((combine_program(spec.dtype), dims))
        })
        .transpose()?;
    Ok(Plan { program: program(spec.dtype, tile, band), dims, params, parts, combine, ragged: ragged_tables, maps })
}

/// Runs the call: the forward, and the combine after it when some row tile is split (with scratch for the
/// partials); a ragged call's schedule is uploaded once per content.
pub fn run(call: &Call<'_>) -> Result<()> {
    let Plan { program, dims, params, parts, combine, ragged, maps: (k, v) } = plan(call)?;
    if ragged.as_ref().is_some_and(|(units, _)| units.is_empty()) {
        return Ok(()); // no sequence has a query row: nothing to write
    }
    let tables = match &ragged {
        Some((units, seqs)) => Some((
            call.dev.table_i32(units, "splitkv MLA's ragged schedule")?,
            call.dev.table_i32(seqs, "splitkv MLA's per-sequence chunks")?,
        )),
        None => None,
    };
    let guards = tables.as_ref().map(|(u, q)| {
        (
            cudarc::driver::DevicePtr::device_ptr(u.as_ref(), call.stream),
            cudarc::driver::DevicePtr::device_ptr(q.as_ref(), call.stream),
        )
    });
    let (units, seqs) = guards.as_ref().map_or((0, 0), |((u, _), (q, _))| (*u, *q));
    let parts_i = i64::try_from(parts).map_err(|_| unsupported("splitkv MLA: too many partials"))?;
    let go = |params: &AttnParams| -> Result<()> {
        let args = MlaArgs { p: *params, units, seqs, parts: parts_i, pad: [0; MLA_PAD], k, v };
        // SAFETY: the entry takes SplitKvMlaArgs, which MlaArgs mirrors; the maps describe the call's K and V,
        // the tables were uploaded above and outlive the launch (their guards are held), and every pointer in
        // params is the call's (checked by Call).
        unsafe { launch(call.dev, call.stream, &program, &program.name, dims, &args) }?;
        if let Some((cp, cdims)) = &combine {
            // SAFETY: the combine takes SplitKvMlaCombineArgs; it reads the partials the forward wrote into
            // params.workspace (same stream) and writes the call's O and LSE.
            let cargs = TableArgs { p: *params, table: seqs, parts: parts_i };
            unsafe { launch(call.dev, call.stream, cp, &cp.name, *cdims, &cargs) }?;
        }
        Ok(())
    };
    if combine.is_none() {
        return go(&params);
    }
    // splitkv's scratch layout (partial LSEs, then outputs); the MLA path keeps no per-tile counters, one
    // keeps the layout's tail non-empty.
    with_scratch(call, params, parts, 1, MLA_DV, 1, go)?;
    drop(guards);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sdpa_core::Shape;

    #[test]
    fn both_tiles_fit_an_h100_block() {
        for t in [MlaTile::NARROW, MlaTile::TALL] {
            assert!(t.smem_bytes() <= 227 * 1024, "{t:?}: {} bytes", t.smem_bytes());
        }
        // The kernel's layout, worked by hand for the narrow tile: a 3 x 32-key ring of 17 boxes, Q 16 x 584,
        // P 2 x 16 x 40, row maxima 2 x 4 x 16 f32, 6 mbarriers.
        assert_eq!(MlaTile::NARROW.smem_bytes(), 1024 + 3 * 17 * 32 * 128 + 16 * 584 * 2 + 2 * 16 * 40 * 2 + 512 + 48);
    }

    #[test]
    fn the_combine_holds_its_sums_and_one_weight_per_split() {
        assert_eq!([8, 16, 40, 64, 128, 4096].map(combine_groups), [1, 1, 2, 4, 4, 4]);
        assert_eq!(combine_smem_bytes(1), 3 * 2048 + 16 + 16);
        assert_eq!(combine_smem_bytes(130), 3 * 2048 + 16 + 33 * 16);
        assert!(combine_smem_bytes(MAX_SPLITS) <= 48 * 1024, "within the default dynamic shared memory");
    }

    #[test]
    fn splits_fill_the_gpu_once_and_keep_their_keys() {
        if std::env::var_os("SDPA_MLA_SPLITS").is_some() {
            return; // forced for a tuning run
        }
        assert_eq!(plan_splits(1, 32768, 132).expect("plan"), 128);
        assert_eq!(plan_splits(8, 4096, 132).expect("plan"), 16);
        assert_eq!(plan_splits(16, 4096, 132).expect("plan"), 8);
        assert_eq!(plan_splits(1, 300, 132).expect("plan"), 2);
        assert_eq!(plan_splits(200, 1 << 20, 132).expect("plan"), 1);
    }

    #[test]
    fn it_refuses_what_it_does_not_implement() {
        let shape = Shape { b: 2, hq: 16, hkv: 1, sq: 1, sk: 1000, d: MLA_D, dv: MLA_DV };
        let spec = AttentionSpec::new(shape, DType::BF16);
        let params = AttnParams::new(&spec, 256, 1 << 20, 2 << 20, 3 << 20, 0, 0).expect("params");
        let optin = 227 * 1024;
        assert_eq!(refuses(&spec, &params, (9, 0), optin), None);
        assert!(refuses(&spec, &params, (8, 0), optin).is_some_and(|w| w.contains("sm_90")));
        assert!(refuses(&spec, &params, (9, 0), 100 * 1024).is_some_and(|w| w.contains("shared memory")));
        let causal = spec.clone().with_mask(Mask::CausalTopLeft);
        assert_eq!(refuses(&causal, &params, (9, 0), optin), None);
        assert_eq!(refuses(&causal.clone().with_window(sdpa_core::Window::left(100)), &params, (9, 0), optin), None);
        // Ragged batches: packed, and paged in pages whose boxes a step can take whole.
        let ragged = |pages: Option<usize>| {
            let r = sdpa_core::Ragged::new(vec![1, 1], vec![700, 1000]);
            let r = match pages {
                Some(ps) => r.paged(ps, 0),
                None => r,
            };
            spec.clone().with_ragged(r, sdpa_core::Layout::Bshd)
        };
        for pages in [None, Some(8), Some(16), Some(32), Some(64), Some(256)] {
            let r = ragged(pages);
            let p = AttnParams::new(&r, 256, 1 << 20, 2 << 20, 3 << 20, 0, 0).expect("params");
            assert_eq!(refuses(&r, &p, (9, 0), optin), None, "pages {pages:?}");
        }
        for pages in [24, 48] {
            let r = ragged(Some(pages));
            let p = AttnParams::new(&r, 256, 1 << 20, 2 << 20, 3 << 20, 0, 0).expect("params");
            assert!(refuses(&r, &p, (9, 0), optin).is_some_and(|w| w.contains("pages")), "pages {pages}");
        }
        for other in [
            spec.clone().with_softcap(30.0),
            AttentionSpec::new(Shape { d: 512, ..shape }, DType::BF16),
            AttentionSpec::new(shape, DType::F32),
        ] {
            let p = AttnParams::new(&other, 256, 1 << 20, 2 << 20, 3 << 20, 0, 0).expect("params");
            assert!(refuses(&other, &p, (9, 0), optin).is_some(), "{other:?}");
        }
        let odd = AttnParams::new(&spec, 258, 1 << 20, 2 << 20, 3 << 20, 0, 0).expect("params");
        assert!(refuses(&spec, &odd, (9, 0), optin).is_some_and(|w| w.contains("16-byte")));
        // K and V broadcast over the batch (stride 0): no tensor map describes them, so `wide` keeps them.
        let mut broadcast = spec.clone();
        broadcast.k_strides.b = 0;
        broadcast.v_strides.b = 0;
        let bp = AttnParams::new(&broadcast, 256, 1 << 20, 2 << 20, 3 << 20, 0, 0).expect("params");
        assert!(refuses(&broadcast, &bp, (9, 0), optin).is_some_and(|w| w.contains("tensor maps")));
        // More batch entries x kv heads than a grid's z holds.
        let many = AttentionSpec::new(Shape { b: 512, hq: 128, hkv: 128, ..shape }, DType::BF16);
        let mp = AttnParams::new(&many, 256, 1 << 30, 2 << 30, 3 << 30, 0, 0).expect("params");
        assert!(refuses(&many, &mp, (9, 0), optin).is_some_and(|w| w.contains("65535")));
    }

    #[test]
    fn splits_follow_the_keys_the_rows_reach() {
        let shape = Shape { b: 1, hq: 16, hkv: 1, sq: 1, sk: 32768, d: MLA_D, dv: MLA_DV };
        let spec = AttentionSpec::new(shape, DType::BF16);
        assert_eq!(band_keys(&spec), 32768);
        assert_eq!(band_keys(&spec.clone().with_mask(Mask::CausalBottomRight)), 32768);
        // Top-left, one row: key 0 only.
        assert_eq!(band_keys(&spec.clone().with_mask(Mask::CausalTopLeft)), 1);
        let four = AttentionSpec::new(Shape { sq: 4, ..shape }, DType::BF16).with_mask(Mask::CausalBottomRight);
        assert_eq!(band_keys(&four.with_window(sdpa_core::Window::left(100))), 104);
    }

    #[test]
    fn programs_are_named_for_their_tile_and_mask() {
        let names: Vec<String> = programs().into_iter().map(|p| p.name).collect();
        assert_eq!(names.len(), 10);
        assert!(names.contains(&"splitkv_mla_combine_bf16_512".to_string()), "{names:?}");
        assert!(names.contains(&"splitkv_mla_bf16_576_512_band_r64".to_string()), "{names:?}");
        assert!(names.contains(&"splitkv_mla_f16_576_512_none_r16".to_string()), "{names:?}");
    }
}
