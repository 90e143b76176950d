//! `fa2`: FlashAttention-2 on tensor cores for f16 and bf16 (`kernels/fa2.cu`, f32 accumulation).
//!
//! One block per (query tile, query head, batch); each warp owns whole query rows; `mma.sync` m16n8k16 with
//! `ldmatrix` (transposed for V), padded shared memory, `cp.async` K/V loads overlapping the math, P kept
//! in registers, `exp2` with the scale folded in; causal tiles above the diagonal are never loaded.
//! Windows, softcap and ALiBi (issue 22) are instantiations of their own ([`Masking`]): the K/V loop runs
//! from the tile of the query tile's first visible key to that of its last (so a window's time follows the
//! window), only tiles crossing a band edge run the band test, and softcap and ALiBi transform the scores
//! in registers before the online max.
//!
//! Head dims: D (Q, K) and Dv (V, O) are compile-time head-dim classes ([`HEAD_DIM_CLASSES`], multiples of
//! 32 up to 256; [`head_dim_classes`]): a call whose head dims are multiples of 8 runs the smallest class at
//! or above them, the extra columns zero-filled in shared memory (they add nothing to Q·Kᵀ, and the extra O
//! columns are not stored), so D = 40 runs the D = 64 kernel and D = 80 the D = 96 one. Dv != D runs natively
//! for the pairs in [`DV_CLASS_PAIRS`] (192/128, MLA prefill) and at the larger class for both otherwise.
//! The tiles ([`tile_for`]) were chosen by measurement on the H100: D = 64, 96, 128 and 256 with
//! `dev/fa2_bench.py` (`bench/results/gpu/fa2.md`), 160..224 with `dev/fa2_tile_sweep.py`
//! (`bench/results/gpu/headdims.md`); D = 32 takes D = 64's. Calls
//! the tensor-core kernels cannot take ([`policy::tensor_core_limit`](super::policy::tensor_core_limit))
//! never reach it: the policy sends them to the generic fused `fa1` path.
//!
//! Ragged batches and paged KV caches (issue 23) run instantiations of their own ([`Serve`]): the grid walks
//! a [`schedule`] of (sequence, query tile) pairs, heaviest first, uploaded per content, so empty sequences
//! cost nothing; each block runs the dense code on its sequence's own lengths, band and diagonal, and paged
//! K/V load each key row through the sequence's block-table row (any page size; a tile may cross pages).
//! A compile-time mode rather than a run-time branch: the dense programs stay exactly as they were.
//!
//! A NaN or inf in a *value* row that a query may not see (masked by causal or an explicit `-inf`) reaches
//! that query inside the kernel's P·V (the masked key's `p = 0` times NaN); the block then recomputes the
//! rows it wrote non-finite without their masked keys (see the crate docs), so the output matches the
//! reference. NaN in Q or K, and NaN in visible values, propagate exactly as in the reference.

use crate::checked::call::Call;
use crate::checked::launch::{launch, LaunchDims};
use crate::checked::params::{AttnParams, Masking, MASK_EXPLICIT};
use crate::error::unsupported;
use crate::sys::modules::FA2;
use crate::sys::program::{cuda_type, Program};
use cudarc::driver::DevicePtr;
use sdpa_core::{AttentionSpec, DType, Result, Serving};

use super::policy::tensor_core_limit;
pub use super::policy::FA2_HEAD_DIMS;

/// Head-dim classes `fa2` is compiled for (f16/bf16): a call runs the smallest class at or above its head
/// dims: 32 .. 256 in steps of 32, so 40 (Stable Diffusion) pads to 64 and 80 (Phi-2) to 96.
pub const HEAD_DIM_CLASSES: [usize; 8] = [32, 64, 96, 128, 160, 192, 224, 256];

/// (D class, Dv class) pairs compiled with Dv != D; other unequal head dims run both at the larger class.
/// 192/128 is MLA prefill (DeepSeek-V2/V3: 128 + 64 rotary dims for Q and K, 128 for V).
pub const DV_CLASS_PAIRS: [(usize, usize); 1] = [(192, 128)];

/// The (D, Dv) classes `fa2` runs head dims `d`, `dv` with, or `None` when it cannot: each from 1 to 256.
/// Head dims that are not multiples of 8 (rows that are not whole 16-byte chunks) run the padded
/// instantiation of their class with narrower copies (issue 21; `fa2_row_bytes` in kernels/fa2_mma.cuh).
pub fn head_dim_classes(d: usize, dv: usize) -> Option<(usize, usize)> {
    if d == 0 || dv == 0 {
        return None;
    }
    let class = |x: usize| HEAD_DIM_CLASSES.into_iter().find(|&c| x <= c);
    let (cd, cdv) = (class(d)?, class(dv)?);
    Some(if cd == cdv || DV_CLASS_PAIRS.contains(&(cd, cdv)) {
        (cd, cdv)
    } else {
        let c = cd.max(cdv);
        (c, c)
    })
}

/// Tile of one `fa2` specialisation (the arguments of `FA2_ENTRY` in `kernels/fa2.cu` after the head dim).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fa2Tile {
    /// Query rows per block.
    pub bm: usize,
    /// Keys per K/V tile.
    pub bn: usize,
    /// Warps per block (each owns `bm / warps` rows).
    pub warps: usize,
    /// K/V buffers: 1 (`V[t]` loads during Q·Kᵀ, `K[t+1]` during softmax and P·V) or a ring of `stages`
    /// (`stages - 1` tiles in flight while one is computed).
    pub stages: usize,
    /// Blocks per SM the registers must allow (`__launch_bounds__`).
    pub min_blocks: usize,
}

impl Fa2Tile {
    /// Dynamic shared memory of a block for head-dim classes `d` (Q, K) and `dv` (V), bytes (rows padded by
    /// 8 elements): Q, then the K ring, then the V ring (`Fa2Tile::SMEM_ELEMS` in fa2.cu).
    pub fn smem_bytes(&self, d: usize, dv: usize) -> usize {
        (self.bm * (d + 8) + self.stages * self.bn * (d + 8 + dv + 8)) * 2
    }
}

/// The tile for head-dim class `d`: `small == false` for grids that fill the GPU (`fa2_*` entries),
/// `small == true` for grids that leave SMs idle (`fa2_small_*` entries: 64 query rows, 4 warps, 128 keys
/// per tile at D = 64 (46 KB, no opt-in), 64 at D = 96 and 128: more blocks and a shorter path through
/// each; measured on issue 4's tiny shapes, `bench/results/gpu/fa2.md`). D = 256 runs 64 x 64 either way.
/// D = 32 takes D = 64's tiles and the classes 160, 192 and 224 (and the 192/128 pair) 128 query rows on 8
/// warps with 128 keys per tile on full grids, 64 x 64 on small ones: measured against PyTorch's flash
/// backend on issue 21's grid with `dev/fa2_tile_sweep.py` (`bench/results/gpu/headdims.md`).
pub fn tile_for(d: usize, small: bool) -> Option<Fa2Tile> {
    let t = |bm, bn, warps, stages, min_blocks| Some(Fa2Tile { bm, bn, warps, stages, min_blocks });
    match (d, small) {
        (32 | 64, false) => t(128, 128, 4, 1, 1),
        (96, false) => t(128, 64, 4, 2, 2),
        (128, false) => t(128, 64, 4, 1, 2),
        (32 | 64, true) => t(64, 128, 4, 1, 1),
        (160 | 192 | 224, false) => t(128, 128, 8, 1, 1),
        (96 | 128 | 160 | 192 | 224, true) | (256, _) => t(64, 64, 4, 1, 1),
        _ => None,
    }
}

/// Blocks of a launch as a function of the tile's query rows `bm`: `ceil(Sq / bm) x Hq x B` for a dense
/// call, the sum of `ceil(Sq_b / bm)` over the sequences times Hq for a ragged one ([`blocks_of`]).
pub type Blocks<'a> = &'a dyn Fn(usize) -> usize;

/// The block count of `spec`'s launch for tiles of `bm` query rows (see [`Blocks`]).
pub fn blocks_of(spec: &AttentionSpec, bm: usize) -> usize {
    let s = spec.shape;
    let tiles = match &spec.ragged {
        Some(r) => r.seqlens_q.iter().map(|&q| q.div_ceil(bm)).fold(0usize, usize::saturating_add),
        None => s.sq.div_ceil(bm).saturating_mul(s.b),
    };
    tiles.saturating_mul(s.hq)
}

/// Whether `fa2` takes the small tile: the full-grid tile's grid has fewer blocks than the GPU has SMs
/// (issue 4's tiny shapes, short prefill of one sequence), so halving the tile adds blocks on idle SMs and
/// halves each block's work.
pub fn small_grid(blocks: Blocks<'_>, big: Fa2Tile, sm_count: usize) -> bool {
    blocks(big.bm) < sm_count
}

/// K/V ring depth of the `fa2_deep_*` entries; mirrors `kernels/fa2.cu`.
pub const DEEP_STAGES: usize = 4;

/// The small tile with a [`DEEP_STAGES`]-deep K/V ring (one block per SM, so one per SM suffices).
fn deep_tile(small: Fa2Tile) -> Fa2Tile {
    Fa2Tile { stages: DEEP_STAGES, min_blocks: 1, ..small }
}

/// Head dims of one `fa2` instantiation: the classes of Q/K and of V/O, and whether the call's head dims
/// are below them (the kernel then reads and stores only the call's columns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadDims {
    /// Class of D.
    pub d: usize,
    /// Class of Dv.
    pub dv: usize,
    /// The call's D or Dv is below its class.
    pub pad: bool,
}

impl HeadDims {
    /// The classes a call with head dims `d`, `dv` runs ([`head_dim_classes`]), with rows of whole 16-byte
    /// chunks that start 16-byte aligned.
    pub fn of(d: usize, dv: usize) -> Option<Self> {
        head_dim_classes(d, dv).map(|(cd, cdv)| HeadDims { d: cd, dv: cdv, pad: cd != d || cdv != dv })
    }

    /// The classes of a call whose rows are 16-byte aligned or not (`aligned`,
    /// [`AttnParams::rows_16_byte_aligned`]): rows that are not run the padded instantiation, which picks
    /// its copy width per call (`fa2_row_bytes`), even at a head dim that is exactly a class.
    pub fn of_rows(d: usize, dv: usize, aligned: bool) -> Option<Self> {
        Self::of(d, dv).map(|h| HeadDims { pad: h.pad || !aligned, ..h })
    }

    /// The entry name's head-dim part: `128`, `160p` (padded), `192_128`, `192_128p`.
    pub(crate) fn label(&self) -> String {
        let dv = if self.dv == self.d { String::new() } else { format!("_{}", self.dv) };
        format!("{}{dv}{}", self.d, if self.pad { "p" } else { "" })
    }
}

/// How an instantiation reads its rows (`SERVE` in kernels/fa2.cu): a dense batch, or a ragged one with
/// packed or paged K/V.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serve {
    /// Dense batch (`FA2_ENTRY`, `FA2_ENTRY_DV`, `FA2_ENTRY_VAR`).
    Dense,
    /// Ragged batch, packed K/V (`FA2_SERVE_VARLEN`).
    Varlen,
    /// Ragged batch, paged K/V (`FA2_SERVE_PAGED`).
    Paged,
}

impl Serve {
    /// The ragged modes.
    pub const RAGGED: [Serve; 2] = [Serve::Varlen, Serve::Paged];

    /// What a call needs.
    pub fn of(spec: &AttentionSpec) -> Serve {
        match Serving::of(spec) {
            None => Serve::Dense,
            Some(Serving::Varlen) => Serve::Varlen,
            Some(Serving::Paged) => Serve::Paged,
        }
    }

    /// Entry-name suffix: nothing for dense batches (their names are as before), `_varlen`, `_paged`.
    fn suffix(self) -> &'static str {
        match self {
            Serve::Dense => "",
            Serve::Varlen => "_varlen",
            Serve::Paged => "_paged",
        }
    }
}

/// The program of entry `{prefix}_{dtype}_{head dims}_{masking}{serve}` with `tile` (variants:
/// `FA2_ENTRY_VAR`; ragged: `FA2_ENTRY_SERVE`).
pub fn program(prefix: &str, dtype: DType, dims: HeadDims, tile: Fa2Tile, masking: Masking, serve: Serve) -> Program {
    let name = format!("{prefix}_{}_{}_{}{}", dtype.name(), dims.label(), masking.suffix(), serve.suffix());
    let Fa2Tile { bm, bn, warps, stages, min_blocks } = tile;
    let (mask, t, HeadDims { d, dv, pad }) = (super::mask_const("FA2", masking.kind), cuda_type(dtype), dims);
    // The common case keeps the short form (and the programs it has always named).
    let line = if serve != Serve::Dense {
        let var = masking.var_const();
        let mode = if serve == Serve::Paged { "FA2_SERVE_PAGED" } else { "FA2_SERVE_VARLEN" };
        format!(
            "FA2_ENTRY_SERVE({name}, {t}, {d}, {dv}, {bm}, {bn}, {warps}, {stages}, {min_blocks}, {mask}, {pad}, {var}, \
             {mode})"
        )
    } else if masking.var != 0 {
        let var = masking.var_const();
        format!(
            "FA2_ENTRY_VAR({name}, {t}, {d}, {dv}, {bm}, {bn}, {warps}, {stages}, {min_blocks}, {mask}, {pad}, {var})"
        )
    } else if d == dv && !pad {
        format!("FA2_ENTRY({name}, {t}, {d}, {bm}, {bn}, {warps}, {stages}, {min_blocks}, {mask})")
    } else {
        format!("FA2_ENTRY_DV({name}, {t}, {d}, {dv}, {bm}, {bn}, {warps}, {stages}, {min_blocks}, {mask}, {pad})")
    };
    Program::entry(&FA2, name, line)
}

/// Every `fa2` instantiation a launch can ask for (the compile check and full warm-ups): each class and
/// class pair, exact and padded, with its full-grid tile, the small one (classes below 256) and the deep
/// one (classes up to 128), under every masking (plain and variant, [`Masking::all`]); and each of those
/// again for ragged batches with packed and with paged K/V, without the explicit maskings (ragged calls
/// refuse explicit masks).
pub fn programs() -> Vec<Program> {
    let mut all = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for d in HEAD_DIM_CLASSES {
            let pairs = DV_CLASS_PAIRS.iter().filter(|(pd, _)| *pd == d).map(|&(_, dv)| dv);
            for dv in std::iter::once(d).chain(pairs) {
                let mut tiles: Vec<(&str, Fa2Tile)> = tile_for(d, false).map(|t| ("fa2", t)).into_iter().collect();
                if d < 256 {
                    tiles.extend(tile_for(d, true).map(|t| ("fa2_small", t)));
                }
                if d <= 128 {
                    tiles.extend(tile_for(d, true).map(|t| ("fa2_deep", deep_tile(t))));
                }
                for pad in [false, true] {
                    for &(prefix, tile) in &tiles {
                        let dims = HeadDims { d, dv, pad };
                        for m in Masking::all() {
                            all.push(program(prefix, dtype, dims, tile, m, Serve::Dense));
                            if m.kind != MASK_EXPLICIT {
                                all.extend(Serve::RAGGED.map(|serve| program(prefix, dtype, dims, tile, m, serve)));
                            }
                        }
                    }
                }
            }
        }
    }
    all
}

/// Tile and entry-point prefix for head-dim classes `d`, `dv` on a grid of `blocks(bm)` blocks: the full-grid tile;
/// the small tile when that grid leaves SMs idle ([`small_grid`]); and the small tile with a
/// [`DEEP_STAGES`]-deep K/V ring when even the small tile's grid has no more blocks than SMs, so each block
/// is alone on its SM and its shared memory costs nothing (if the device has the 117-153 KB per block:
/// `smem_optin`, the opt-in limit): with so little math per K/V tile, the 1-deep form waits about two
/// memory latencies per tile (issue 4's tiny shapes). D = 256 runs 64-row tiles already; the classes
/// between take the small tile but no deep ring (not measured there; at 224 it would not fit). A full-grid
/// tile larger than the device's opt-in shared memory (`smem_optin`) gives way to the small one.
pub fn choose_tile(
    d: usize,
    dv: usize,
    blocks: Blocks<'_>,
    sm_count: usize,
    smem_optin: usize,
) -> Option<(Fa2Tile, &'static str)> {
    let big = tile_for(d, false)?;
    // A device without the H100's shared memory (99 KB per block on compute capability 8.6/8.9, 163 KB on
    // an A100) cannot hold the 8-warp tiles of 160..224: it runs the small tile, which fits 99 KB at every
    // class.
    let big_fits = big.smem_bytes(d, dv) <= smem_optin;
    if d == 256 || (big_fits && !small_grid(blocks, big, sm_count)) {
        return Some((big, "fa2"));
    }
    let small = tile_for(d, true)?;
    if d > 128 {
        return Some((small, "fa2_small"));
    }
    let deep = deep_tile(small);
    if blocks(small.bm) <= sm_count && deep.smem_bytes(d, dv) <= smem_optin {
        Some((deep, "fa2_deep"))
    } else {
        Some((small, "fa2_small"))
    }
}

/// The tile `SDPA_FA2_TILE=bm,bn,warps,stages` forces on every `fa2` launch, for tuning runs
/// (`dev/fa2_tile_sweep.py`); its entries are named `fa2_tile{bm}x{bn}x{warps}x{stages}_*` and compiled on
/// first use. `None` when unset; a value that does not describe a tile is an error.
pub fn forced_tile() -> Result<Option<Fa2Tile>> {
    let Ok(v) = std::env::var("SDPA_FA2_TILE") else { return Ok(None) };
    let bad = || unsupported(format!("SDPA_FA2_TILE must be bm,bn,warps,stages (e.g. 128,64,8,1), got {v:?}"));
    let n: Vec<usize> = v.split(',').map(|x| x.trim().parse().map_err(|_| bad())).collect::<Result<_>>()?;
    let [bm, bn, warps, stages] = n[..] else { return Err(bad()) };
    // Whole m16 tiles per warp, whole k16 steps, at least one K/V buffer (the kernel's static asserts).
    if warps == 0 || bm == 0 || bm % (16 * warps) != 0 || bn == 0 || bn % 16 != 0 || stages == 0 || warps > 16 {
        return Err(bad());
    }
    Ok(Some(Fa2Tile { bm, bn, warps, stages, min_blocks: 1 }))
}

/// The (sequence, query tile) pairs of a ragged call for tiles of `bm` query rows and `bn` keys, as i32
/// pairs for the kernel's schedule (`fa2_ragged`): every query tile of every sequence with query rows,
/// heaviest first (the key tiles its rows' bands reach, one more for its own load and store), so the
/// longest blocks start first and the short ones fill the tail; ties in batch order. Empty sequences have
/// no entry. Empty for a dense call.
pub fn schedule(spec: &AttentionSpec, bm: usize, bn: usize) -> Vec<i32> {
    if spec.ragged.is_none() {
        return Vec::new();
    }
    let mut tiles: Vec<(usize, i32, i32)> = Vec::new();
    for (b, seq) in spec.seqs().iter().enumerate() {
        let (lo, hi) = spec.band_for(seq.sq, seq.sk).clamped(seq.sq, seq.sk);
        let sk = seq.sk as i64;
        for t in 0..seq.sq.div_ceil(bm.max(1)) {
            let (m0, m_end) = ((t * bm) as i64, ((t + 1) * bm).min(seq.sq) as i64);
            let first = (m0 + lo).clamp(0, sk);
            let end = (m_end + hi).clamp(0, sk).max(first);
            let key_tiles = (end as usize).div_ceil(bn.max(1)) - first as usize / bn.max(1);
            // Lengths fit i32 (the parameters checked them), so do sequence and tile indices.
            tiles.push((key_tiles + 1, b as i32, t as i32));
        }
    }
    tiles.sort_by_key(|&(cost, ..)| std::cmp::Reverse(cost));
    tiles.into_iter().flat_map(|(_, b, t)| [b, t]).collect()
}

/// What `fa2` launches for a call: the program, the launch shape and, for a ragged call, its
/// [`schedule`] (the grid's x walks it).
#[derive(Debug, Clone)]
pub struct Fa2Plan {
    /// The entry point.
    pub program: Program,
    /// Grid, block and shared memory.
    pub dims: LaunchDims,
    /// (sequence, query tile) pairs of a ragged call; `None` for a dense one.
    pub schedule: Option<Vec<i32>>,
}

/// Program (one entry point) and launch shape of `fa2` for a supported call, on the call's own rows.
pub fn plan(call: &Call<'_>) -> Result<Fa2Plan> {
    let s = call.spec.shape;
    let dims = HeadDims::of_rows(s.d, s.dv, call.params.rows_16_byte_aligned(s.d, s.dv))
        .ok_or_else(|| unsupported(format!("fa2 has no head-dim class for D = {}, Dv = {}", s.d, s.dv)))?;
    plan_at(call, dims)
}

/// As [`plan`] with the instantiation's head dims given: the call's own, or the padded ones of the
/// pad-copy path ([`super::pad_copy`]), whose scratch rows are whole 16-byte chunks.
pub fn plan_at(call: &Call<'_>, dims: HeadDims) -> Result<Fa2Plan> {
    let s = call.spec.shape;
    let info = call.dev.info();
    let (sm_count, optin) = (info.sm_count.max(1) as usize, info.smem_per_block_optin.max(0) as usize);
    let (tile, prefix) = match forced_tile()? {
        Some(t) => (t, format!("fa2_tile{}x{}x{}x{}", t.bm, t.bn, t.warps, t.stages)),
        None => choose_tile(dims.d, dims.dv, &|bm| blocks_of(call.spec, bm), sm_count, optin)
            .map(|(t, p)| (t, p.to_string()))
            .ok_or_else(|| unsupported(format!("fa2 has no tile for D = {}", dims.d)))?,
    };
    let serve = Serve::of(call.spec);
    let schedule = (serve != Serve::Dense).then(|| schedule(call.spec, tile.bm, tile.bn));
    let too_many = |what: &str| unsupported(format!("fa2: too many {what} for one launch"));
    let (tiles, b) = match &schedule {
        Some(s) => (s.len() / 2, 1),
        None => (s.sq.div_ceil(tile.bm), s.b),
    };
    let tiles = u32::try_from(tiles).map_err(|_| too_many("query tiles"))?;
    let hq = u32::try_from(s.hq).ok().filter(|&h| h <= 65535).ok_or_else(|| too_many("heads"))?;
    let b = u32::try_from(b).ok().filter(|&b| b <= 65535).ok_or_else(|| too_many("sequences"))?;
    let program = program(&prefix, call.spec.dtype, dims, tile, Masking::of(call.spec), serve);
    let dims = LaunchDims {
        grid: (tiles, hq, b),
        block: (tile.warps as u32 * 32, 1, 1),
        smem_bytes: tile.smem_bytes(dims.d, dims.dv) as u32,
    };
    Ok(Fa2Plan { program, dims, schedule })
}

/// Launches `fa2` on the call's stream. A call the tensor-core kernels cannot take
/// ([`policy::tensor_core_limit`](super::policy::tensor_core_limit)) is an error here; the policy sends
/// such calls to `fa1` before they get here. Dense prefill whose rows are not 16-byte aligned runs through
/// aligned scratch where that pays and fits ([`super::pad_copy`]), else on its own rows.
pub fn run(call: &Call<'_>) -> Result<()> {
    if let Some(limit) = tensor_core_limit(call.spec, &call.params) {
        return Err(unsupported(format!("fa2 cannot take this call: {limit}")));
    }
    if super::pad_copy::run(call)? {
        return Ok(());
    }
    let plan = plan(call)?;
    let Some(schedule) = &plan.schedule else { return launch_dense(call, &plan, &call.params) };
    if schedule.is_empty() {
        return Ok(()); // no sequence has a query row: nothing to write
    }
    let table = call.dev.table_i32(schedule, "fa2's schedule of query tiles")?;
    let (ptr, guard) = table.device_ptr(call.stream);
    let params = AttnParams { workspace: ptr, ..call.params };
    let Fa2Plan { program, dims, .. } = &plan;
    // SAFETY: as for a dense call (`launch_dense`), per sequence: the backend checked the packed (or paged) operands against the
    // validated ragged spec and pointed `params` at the uploaded offsets and block table; the schedule
    // (`workspace`, one int2 per block of the grid's x) names sequences < B and query tiles inside them;
    // each block reads Q/O rows of its sequence, keys < its Sk_b (paged: through its block-table row, page
    // indices clamped into the pool), and writes O rows and [Hq, total_q] LSE entries of its own rows.
    let r = unsafe { launch(call.dev, call.stream, program, &program.name, *dims, &params) };
    drop(guard);
    r
}

/// Launches a dense call's `plan` with `params`: the call's own, or the padded ones of the pad-copy path.
pub fn launch_dense(call: &Call<'_>, plan: &Fa2Plan, params: &AttnParams) -> Result<()> {
    // SAFETY: `params` holds pointers the backend checked against the validated spec (lengths cover every
    // strided offset), or the pad-copy path's scratch laid out for the same spec at the padded head dims
    // (pad_copy::Scratch); the kernel reads Q/K/V rows < Sq/Sk (others are zero-filled, not read) and the
    // mask within its strides, and writes O rows < Sq and LSE entries < B·Hq·Sq only.
    unsafe { launch(call.dev, call.stream, &plan.program, &plan.program.name, plan.dims, params) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_under_one_block_per_sm_take_the_small_tile_and_the_deep_ring_when_it_still_fits() {
        const H100: usize = 227 * 1024;
        let pick = |d, sq: usize, hq: usize, b: usize| {
            choose_tile(d, d, &|bm| sq.div_ceil(bm) * hq * b, 132, H100).map(|(t, name)| (name, t.bm, t.bn, t.stages))
        };
        // Issue 4's tiny shapes (B = H = 1, D = 64): 1 to 8 blocks of 64 rows, 4-deep ring of 128 keys.
        for sq in [64, 128, 512] {
            assert_eq!(pick(64, sq, 1, 1), Some(("fa2_deep", 64, 128, 4)));
        }
        // 128 blocks of the full tile (< 132): 256 small blocks, more than the SMs: the 1-deep small tile.
        assert_eq!(pick(128, 1024, 16, 1), Some(("fa2_small", 64, 64, 1)));
        // 64 full blocks -> 128 small ones, at most one per SM: deep.
        assert_eq!(pick(128, 1024, 8, 1).map(|x| x.0), Some("fa2_deep"));
        // Full grids, and the classes above 128 whatever the grid.
        assert_eq!(pick(64, 4096, 32, 4), Some(("fa2", 128, 128, 1)));
        assert_eq!(pick(256, 64, 1, 1), Some(("fa2", 64, 64, 1)));
        assert_eq!(pick(160, 4096, 16, 4), Some(("fa2", 128, 128, 1)));
        assert_eq!(pick(192, 64, 1, 1), Some(("fa2_small", 64, 64, 1)));
        assert_eq!(pick(80, 64, 1, 1), None, "80 is not a class: calls with D = 80 run class 96");
        // The deep ring needs opt-in shared memory: 153 KB at D = 64 and 128, 117 KB at D = 96. A device
        // with less (an sm_86 part allows 99 KB per block) keeps the 1-deep small tile.
        for (d, kb) in [(64, 153), (96, 117), (128, 153)] {
            let one = |bm: usize| 64usize.div_ceil(bm);
            let (t, name) = choose_tile(d, d, &one, 132, H100).expect("tile");
            assert_eq!((name, t.smem_bytes(d, d).div_ceil(1024)), ("fa2_deep", kb));
            let (t, name) = choose_tile(d, d, &one, 84, 99 * 1024).expect("tile");
            assert_eq!((name, t.stages), ("fa2_small", 1));
        }
    }

    /// The schedule lists every query tile of every sequence with rows, heaviest first (causal: a
    /// sequence's last tiles; longer sequences before shorter), and nothing for empty sequences.
    #[test]
    fn the_ragged_schedule_runs_heavy_tiles_first_and_skips_empty_sequences() {
        use sdpa_core::{Layout, Mask, Ragged, Shape};
        let r = Ragged::new(vec![300, 0, 1, 128], vec![300, 50, 0, 1000]);
        let shape = Shape { b: 4, hq: 2, hkv: 2, sq: 300, sk: 1000, d: 64, dv: 64 };
        let spec = AttentionSpec::new(shape, DType::BF16).with_ragged(r, Layout::Bshd);
        let pairs = |spec: &AttentionSpec| -> Vec<(i32, i32)> {
            schedule(spec, 128, 64).chunks(2).map(|c| (c[0], c[1])).collect()
        };
        // Not causal: sequence 3 (1000 keys) first, then 0's three tiles (300 keys), then 2 (no key).
        assert_eq!(pairs(&spec), [(3, 0), (0, 0), (0, 1), (0, 2), (2, 0)]);
        // Causal bottom-right: sequence 3's one tile sees all 1000 keys; 0's last tile first.
        let causal = spec.clone().with_mask(Mask::CausalBottomRight);
        assert_eq!(pairs(&causal), [(3, 0), (0, 2), (0, 1), (0, 0), (2, 0)]);
        assert_eq!(blocks_of(&causal, 128), 5 * 2);
        assert!(schedule(&AttentionSpec::new(shape, DType::BF16), 128, 64).is_empty(), "dense: no schedule");
    }

    #[test]
    fn head_dims_run_the_smallest_class_above_them() {
        let c = head_dim_classes;
        assert_eq!(c(64, 64), Some((64, 64)));
        assert_eq!(c(40, 40), Some((64, 64)));
        assert_eq!(c(80, 80), Some((96, 96)));
        assert_eq!(c(8, 8), Some((32, 32)));
        assert_eq!(c(248, 256), Some((256, 256)));
        // MLA prefill runs its own pair; other unequal head dims run both at the larger class.
        assert_eq!(c(192, 128), Some((192, 128)));
        assert_eq!(c(184, 112), Some((192, 128)));
        assert_eq!(c(64, 128), Some((128, 128)));
        assert_eq!(c(128, 64), Some((128, 128)));
        // Head dims that are not multiples of 8 run their class too (padded, narrow copies; issue 21).
        assert_eq!(c(1, 1), Some((32, 32)));
        assert_eq!(c(33, 33), Some((64, 64)));
        assert_eq!(c(127, 127), Some((128, 128)));
        assert_eq!(c(255, 255), Some((256, 256)));
        assert_eq!(c(65, 31), Some((96, 96)));
        assert_eq!(c(190, 127), Some((192, 128)));
        // Above 256, or empty: not fa2's.
        for (d, dv) in [(264, 264), (257, 64), (512, 512), (0, 64), (64, 0)] {
            assert_eq!(c(d, dv), None, "D = {d}, Dv = {dv}");
        }
        // Rows that are not 16-byte aligned run the padded instantiation even at an exact class.
        let unaligned = |d, dv| HeadDims::of_rows(d, dv, false).map(|h| h.label());
        assert_eq!((unaligned(128, 128), unaligned(100, 100)), (Some("128p".into()), Some("128p".into())));
        assert_eq!(HeadDims::of_rows(128, 128, true).map(|h| h.pad), Some(false));
        let of = |d, dv| HeadDims::of(d, dv).map(|h| h.label());
        assert_eq!(
            (of(128, 128), of(80, 80), of(192, 128), of(184, 128)),
            (Some("128".into()), Some("96p".into()), Some("192_128".into()), Some("192_128p".into()))
        );
        // Q, the K ring, the V ring: D = Dv as before; 192/128 smaller than 192/192.
        let t = tile_for(192, false).expect("tile");
        assert_eq!(t.smem_bytes(192, 128), (128 * 200 + 128 * (200 + 136)) * 2);
        assert!(t.smem_bytes(224, 224) <= 227 * 1024);
        assert!(t.smem_bytes(192, 128) < t.smem_bytes(192, 192));
    }
}
