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
//! What it takes ([`refuses`]): f16/bf16, dense batches, no mask or a causal one (either alignment; Sq > 1
//! is speculative decoding), no variant, rows of whole 16-byte chunks, a GPU of compute capability 9.x
//! with the shared memory of its tile. `auto` picks it for such calls with at most [`AUTO_MAX_ROWS`] rows per
//! kv head; everything else at these head dims runs on `wide`.

use super::splitkv::{with_scratch, L2Policy, TmaArgs};
use crate::checked::call::Call;
use crate::checked::launch::{launch, LaunchDims};
use crate::checked::params::{AttnParams, MASK_CAUSAL, MASK_NONE};
use crate::checked::tensor_map::{kv_tensor_map, KvOperand};
use crate::error::unsupported;
use crate::sys::modules::SPLITKV_MLA;
use crate::sys::program::{cuda_type, Program};
use cudarc::driver::sys::CUtensorMap;
use sdpa_core::{AttentionSpec, DType, Mask, Result};

/// Head dim of Q and K the kernel is built for (MLA: 512 latent columns and 64 rotary ones).
pub const MLA_D: usize = 576;
/// Head dim of V and O (the latent columns).
pub const MLA_DV: usize = 512;
/// Most rows per kv head (`group·Sq`) for which `auto` picks this kernel: every row group of 64 streams the
/// keys again (from L2 after the first), so past a few groups the GEMMs of `wide` are the better tool.
pub const AUTO_MAX_ROWS: usize = 128;
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
    if spec.ragged.is_some() {
        return Some("splitkv's MLA path takes dense batches only".into());
    }
    if matches!(spec.mask, Mask::Explicit(_)) || !spec.variants.is_plain() {
        return Some("splitkv's MLA path takes no mask or a causal one, without windows, softcap or ALiBi".into());
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
    let tile = MlaTile::for_rows(s.group_size() * s.sq).ok()?;
    (tile.smem_bytes() > optin).then(|| {
        format!("splitkv's MLA tile needs {} bytes of shared memory, the GPU allows {optin}", tile.smem_bytes())
    })
}

/// Whether `auto` sends a call this kernel takes here: decoding, at most [`AUTO_MAX_ROWS`] rows per kv head.
pub fn auto_takes(spec: &AttentionSpec) -> bool {
    spec.shape.group_size() * spec.shape.sq <= AUTO_MAX_ROWS
}

/// The program of entry `splitkv_mla_{dtype}_576_512_{mask}_r{rows}`.
pub fn program(dtype: DType, tile: MlaTile, mask_kind: i32) -> Program {
    let mask = super::mask_const("FA2", mask_kind);
    let suffix = crate::checked::params::Masking { kind: mask_kind, var: 0 }.suffix();
    let name = format!("splitkv_mla_{}_{MLA_D}_{MLA_DV}_{suffix}_r{}", dtype.name(), tile.rows());
    let MlaTile { row_warps, col_warps, keys_per_step, stages } = tile;
    let line = format!(
        "SPLITKV_MLA_ENTRY({name}, {}, {MLA_D}, {MLA_DV}, {row_warps}, {col_warps}, {keys_per_step}, {stages}, {mask})",
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

/// Dynamic shared memory of a combine block for `splits` partials (`MLA_COMBINE_SMEM`): the other groups'
/// sums, three statistics and one weight per split; at least the parameters the repair of non-finite rows
/// keeps there.
pub fn combine_smem_bytes(splits: usize) -> usize {
    let bytes = (COMBINE_GROUPS - 1) * MLA_DV * 4 + 16 + splits.div_ceil(4) * 16;
    bytes.max(crate::checked::params::ATTN_PARAMS_SIZE)
}

/// The program of the merge of split row tiles, `splitkv_mla_combine_{dtype}_512`: one block of
/// [`COMBINE_GROUPS`] x Dv / 4 threads per query row.
pub fn combine_program(dtype: DType) -> Program {
    let name = format!("splitkv_mla_combine_{}_{MLA_DV}", dtype.name());
    let line = format!("SPLITKV_MLA_COMBINE_ENTRY({name}, {}, {MLA_DV})", cuda_type(dtype));
    Program::entry(&SPLITKV_MLA, name, line)
}

/// Every instantiation: both dtypes, both tiles, no mask and causal, and the combine of each dtype.
pub fn programs() -> Vec<Program> {
    let mut all = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        all.push(combine_program(dtype));
        for tile in [MlaTile::NARROW, MlaTile::TALL] {
            for mask in [MASK_NONE, MASK_CAUSAL] {
                all.push(program(dtype, tile, mask));
            }
        }
    }
    all
}

/// Splits of the keys per row tile: one block per multiprocessor over all row tiles (the tile fills an
/// SM's shared memory), at least [`MIN_KEYS_PER_SPLIT`] keys each, at most [`MAX_SPLITS`]; `SDPA_MLA_SPLITS`
/// forces the count for tuning runs.
pub fn plan_splits(units: usize, keys: usize, sm_count: usize) -> Result<usize> {
    let most = keys.div_ceil(MIN_KEYS_PER_SPLIT).max(1);
    if let Ok(v) = std::env::var("SDPA_MLA_SPLITS") {
        let n: usize = v.parse().map_err(|_| unsupported(format!("SDPA_MLA_SPLITS must be a count, got {v:?}")))?;
        return Ok(n.clamp(1, keys.clamp(1, MAX_SPLITS)));
    }
    Ok((sm_count.max(1) / units.max(1)).clamp(1, most.min(MAX_SPLITS)))
}

/// One planned launch.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The entry.
    pub program: Program,
    /// Grid (row groups, splits, batch x kv heads), block and shared memory.
    pub dims: LaunchDims,
    /// The call's parameters with the L2 policy set.
    pub params: AttnParams,
    /// Splits of the keys (blocks per row tile).
    pub splits: usize,
    /// The merge of the partials, when `splits > 1`, and its launch shape.
    pub combine: Option<(Program, LaunchDims)>,
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

/// Program, launch shape and tensor maps of a call [`refuses`] accepts.
pub fn plan(call: &Call<'_>) -> Result<Plan> {
    let info = call.dev.info();
    let optin = info.smem_per_block_optin.max(0) as usize;
    if let Some(why) = refuses(call.spec, &call.params, info.compute_capability, optin) {
        return Err(unsupported(why));
    }
    let s = call.spec.shape;
    let rows = s.group_size() * s.sq;
    let tile = MlaTile::for_rows(rows)?;
    let row_groups = rows.div_ceil(tile.rows()).max(1);
    // Causal rows see at most Sk keys; the kernel cuts each row tile's keys further.
    let splits = plan_splits(s.b * s.hkv * row_groups, s.sk, info.sm_count.max(1) as usize)?;
    let p = &call.params;
    let op = |ptr, st, w| KvOperand { ptr, dtype: call.spec.dtype, dims: [s.b, s.hkv, s.sk, w], strides: st };
    let maps = kv_tensor_map(&op(p.k, p.k_stride, s.d), tile.keys_per_step)
        .zip(kv_tensor_map(&op(p.v, p.v_stride, s.dv), tile.keys_per_step))
        .ok_or_else(|| unsupported("splitkv's MLA path: no TMA tensor map describes this K/V layout"))?;
    let mut params = call.params;
    params.num_splits = i32::try_from(splits).map_err(|_| unsupported("too many splits"))?;
    // Several row groups read each key chunk, the second from L2: keep the lines at normal priority then.
    let policy = super::splitkv::forced_l2_policy()?.unwrap_or(if row_groups > 1 {
        L2Policy::EvictNormal
    } else {
        L2Policy::EvictFirst
    });
    params.extra = policy as i32;
    let u32_of =
        |v: usize, what: &str| u32::try_from(v).map_err(|_| unsupported(format!("splitkv MLA: {what} too large")));
    let dims = LaunchDims {
        grid: (u32_of(row_groups, "row groups")?, u32_of(splits, "splits")?, u32_of(s.b * s.hkv, "batch x kv heads")?),
        block: (tile.threads() as u32, 1, 1),
        smem_bytes: tile.smem_bytes() as u32,
    };
    let mask = if matches!(call.spec.mask, Mask::None) { MASK_NONE } else { MASK_CAUSAL };
    // The combine's blocks: one per (query row of a batch entry, batch entry).
    let combine = (splits > 1)
        .then(|| -> Result<_> {
            let dims = LaunchDims {
                grid: (u32_of(s.hq * s.sq, "query rows")?, u32_of(s.b, "batch")?, 1),
                block: ((combine_groups(splits) * MLA_DV / 4) as u32, 1, 1),
                smem_bytes: combine_smem_bytes(splits) as u32,
            };
            Ok((combine_program(call.spec.dtype), dims))
        })
        .transpose()?;
    Ok(Plan { program: program(call.spec.dtype, tile, mask), dims, params, splits, combine, maps })
}

/// Runs the call: one launch, and the combine after it when the row tiles are split (with scratch for the
/// partials).
pub fn run(call: &Call<'_>) -> Result<()> {
    let Plan { program, dims, params, splits, combine, maps: (k, v) } = plan(call)?;
    let s = call.spec.shape;
    let go = |params: &AttnParams| -> Result<()> {
        // SAFETY: the entry takes SplitKvTmaArgs (AttnParams, padding, the K and V maps), which TmaArgs mirrors;
        // the maps describe the call's K and V, and every pointer in params is the call's (checked by Call).
        unsafe { launch(call.dev, call.stream, &program, &program.name, dims, &TmaArgs::new(*params, k, v)) }?;
        if let Some((cp, cdims)) = &combine {
            // SAFETY: the combine takes AttnParams by value; it reads the partials the launch before it wrote
            // into params.workspace (same stream) and writes the call's O and LSE.
            unsafe { launch(call.dev, call.stream, cp, &cp.name, *cdims, params) }?;
        }
        Ok(())
    };
    if combine.is_none() {
        return go(&params);
    }
    let units = s.b * s.hkv * dims.grid.0 as usize;
    with_scratch(call, params, s.b * s.hq * s.sq, splits, MLA_DV, units, go)
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
    }

    #[test]
    fn programs_are_named_for_their_tile_and_mask() {
        let names: Vec<String> = programs().into_iter().map(|p| p.name).collect();
        assert_eq!(names.len(), 10);
        assert!(names.contains(&"splitkv_mla_combine_bf16_512".to_string()), "{names:?}");
        assert!(names.contains(&"splitkv_mla_bf16_576_512_causal_r64".to_string()), "{names:?}");
        assert!(names.contains(&"splitkv_mla_f16_576_512_none_r16".to_string()), "{names:?}");
    }
}
