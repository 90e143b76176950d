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
//! tile's Q and K/V loaded while the current one finishes) except for causal calls with many tiles per
//! head; the tile ([`tile_for`]: keys per tile, ring depth, consumer warpgroups) is chosen by head dim and
//! mask. `SDPA_FA3_TILE` and `SDPA_FA3_GRID` override both for tuning runs and tests.
//!
//! What it takes today ([`refuses`]): f16/bf16, D = Dv = 64 or 128, no mask or a causal one, a positive
//! scale, dense batches, operands a tensor map can describe (base and every stride of Q, K, V, O multiples
//! of 8 elements), a compute-capability 9.0 GPU. Everything else is refused with what `fa3` lacks (it never
//! falls back silently): `fa2` runs those calls. `auto` picks `fa3` where it takes the call and was
//! measured faster than `fa2` ([`super::policy::resolve_auto`]; `bench/results/gpu/fa3.md`).

use crate::checked::call::Call;
use crate::checked::launch::{launch, LaunchDims};
use crate::checked::params::{mask_suffix, AttnParams, MASK_CAUSAL, MASK_NONE};
use crate::checked::tensor_map::{kv_tensor_map, KvOperand};
use crate::error::unsupported;
use crate::sys::modules::FA3;
use crate::sys::program::{cuda_type, Program};
use cudarc::driver::sys::CUtensorMap;
use cudarc::driver::DeviceRepr;
use sdpa_core::{AttentionSpec, DType, Mask, Result};

/// Head dims (D = Dv) `fa3` is instantiated for.
pub const FA3_HEAD_DIMS: [usize; 2] = [64, 128];
/// The tiling of an entry: keys per tile, ring depth and consumer warpgroups (`BN`, `ST`, `NC` of
/// `FA3_ENTRY`); a block runs 64 query rows per consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fa3Tile {
    /// Keys per K/V tile (a multiple of 16 up to 256 with a `wgmma` width for it in fa3_wgmma.cuh: 64, 128,
    /// 176 or 192).
    pub bn: usize,
    /// K/V ring slots.
    pub stages: usize,
    /// Consumer warpgroups (2, or 3: 160 registers each instead of 240).
    pub consumers: usize,
}

impl Fa3Tile {
    /// Dynamic shared memory of a block at head dim `d` (`Fa3Smem::BYTES`): Q of every consumer, the K and V
    /// rings, the mbarriers (full and empty per consumer's Q, per K and per V slot).
    pub fn smem_bytes(&self, d: usize) -> usize {
        self.consumers * 64 * d * 2 + 2 * self.stages * self.bn * d * 2 + 8 * (2 * self.consumers + 4 * self.stages)
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

/// The tile of a call by head dim `d`, mask and key count `sk` (measured on the H100,
/// bench/results/gpu/fa3.md): 128 keys in a 2-deep ring, with three consumer warpgroups (192 query rows a
/// block) at D = 64 without a mask (1.05-1.21x two consumers), two otherwise (three lost 2-15 % at D = 64
/// causal from 8k on and below 2k; D = 128 needs the 240 registers of two). Longer key tiles (176, 192)
/// were within the card's run-to-run spread, or slower (causal D = 128: 0.67-0.87x).
pub fn tile_for(d: usize, causal: bool, _sk: usize) -> Fa3Tile {
    let consumers = if d == 64 && !causal { 3 } else { 2 };
    Fa3Tile { bn: 128, stages: 2, consumers }
}

/// The tiles [`tile_for`] can choose at head dim `d` under a causal mask or none (each compiled in
/// [`programs`]): the table changes tiles by length at most once, below 4k keys or from it on.
fn table_tiles(d: usize, causal: bool) -> Vec<Fa3Tile> {
    let mut tiles: Vec<Fa3Tile> = [1, 4096, 1 << 20].into_iter().map(|sk| tile_for(d, causal, sk)).collect();
    tiles.sort_by_key(|t| (t.bn, t.stages, t.consumers));
    tiles.dedup();
    tiles
}

/// The tile `SDPA_FA3_TILE=bn,stages[,consumers]` forces (tuning runs: `dev/fa3_bench.py --tiles`); entries of
/// tiles the table does not use are compiled on first use (not listed in [`programs`]). `None` when unset;
/// an unusable value is an error naming what is allowed.
fn forced_tile() -> Result<Option<Fa3Tile>> {
    let Ok(v) = std::env::var("SDPA_FA3_TILE") else { return Ok(None) };
    let parsed: Vec<usize> = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
    match parsed[..] {
        [bn @ (64 | 128 | 176 | 192), stages @ 1..=4] => Ok(Some(Fa3Tile { bn, stages, consumers: 2 })),
        [bn @ (64 | 128 | 176 | 192), stages @ 1..=4, consumers @ (2 | 3)] => {
            Ok(Some(Fa3Tile { bn, stages, consumers }))
        }
        _ => Err(unsupported(format!(
            "SDPA_FA3_TILE={v}: expected `bn,stages[,consumers]` with bn 64, 128, 176 or 192, 1 to 4 stages and 2 \
             or 3 consumer warpgroups"
        ))),
    }
}

/// Why `fa3` cannot run `spec` (whatever the device and pointers), or `None`.
pub fn refuses(spec: &AttentionSpec) -> Option<String> {
    let s = spec.shape;
    if !matches!(spec.dtype, DType::F16 | DType::BF16) {
        return Some(format!("fa3 takes f16 and bf16 inputs, not {} (use fa2 or fa1)", spec.dtype));
    }
    if s.d != s.dv || !FA3_HEAD_DIMS.contains(&s.d) {
        return Some(format!(
            "fa3 has head dims D = Dv = 64 or 128 only (got D = {}, Dv = {}); fa2 takes the others",
            s.d, s.dv
        ));
    }
    let kinds = spec.variants.kinds();
    if !kinds.is_empty() {
        let names: Vec<&str> = kinds.iter().map(|v| v.name()).collect();
        return Some(format!("fa3 does not implement {} yet; fa2 does", names.join(", ")));
    }
    if matches!(spec.mask, Mask::Explicit(_)) {
        return Some("fa3 does not take explicit masks yet (no mask or causal only); fa2 does".into());
    }
    if spec.ragged.is_some() {
        return Some("fa3 does not run ragged (varlen) batches or paged KV caches yet; fa2 and splitkv do".into());
    }
    if spec.scale() <= 0.0 {
        return Some(format!("fa3 needs a positive scale (got {})", spec.scale()));
    }
    None
}

/// The program of entry `{tile prefix}_{dtype}_{d}_{mask}` (`_pp0`: without ping-pong) with `tile`.
pub fn program(dtype: DType, d: usize, tile: Fa3Tile, mask_kind: i32, pingpong: bool) -> Program {
    let pp = if pingpong { "" } else { "_pp0" };
    let name = format!("{}_{}_{d}_{}{pp}", tile.prefix(), dtype.name(), mask_suffix(mask_kind));
    let Fa3Tile { bn, stages, consumers } = tile;
    let mask = super::mask_const("FA3", mask_kind);
    let line = format!("FA3_ENTRY({name}, {}, {d}, {bn}, {stages}, {mask}, {pingpong}, {consumers})", cuda_type(dtype));
    Program::entry(&FA3, name, line)
}

/// Every `fa3` instantiation a launch can ask for.
pub fn programs() -> Vec<Program> {
    let mut all = Vec::new();
    for dtype in [DType::F16, DType::BF16] {
        for d in FA3_HEAD_DIMS {
            for mask in [MASK_NONE, MASK_CAUSAL] {
                for pp in [true, false] {
                    for tile in table_tiles(d, mask == MASK_CAUSAL) {
                        all.push(program(dtype, d, tile, mask, pp));
                    }
                }
            }
        }
    }
    all
}

/// The one `fa3` program the CI compile check builds (the others differ in constants and dtype only).
pub fn compile_check_program() -> Program {
    program(DType::BF16, 128, tile_for(128, true, 4096), MASK_CAUSAL, true)
}

/// The entries' parameter: `Fa3Args` in fa3.cu (AttnParams, the scheduling section, padding to byte 384,
/// then the Q, K and V tensor maps; 768 bytes, asserted on both sides).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Fa3Args {
    p: AttnParams,
    section: i32,
    pad: [u8; ARGS_PAD],
    q: CUtensorMap,
    k: CUtensorMap,
    v: CUtensorMap,
}
const ARGS_PAD: usize = 384 - crate::checked::params::ATTN_PARAMS_SIZE - 4;
const _: () = assert!(std::mem::size_of::<Fa3Args>() == 768);
// SAFETY: plain data with C layout matching the kernel's `Fa3Args` (size asserted on both sides):
// AttnParams, padding to 384 and three opaque 128-byte tensor maps.
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
    /// The parameter with its tensor maps.
    pub args: Fa3Args,
}

/// Program, launch shape and tensor maps of `fa3` for the call, or why it cannot run it.
pub fn plan(call: &Call<'_>) -> Result<Plan> {
    let spec = call.spec;
    if let Some(why) = refuses(spec) {
        return Err(unsupported(why));
    }
    let info = call.dev.info();
    if info.compute_capability != (9, 0) {
        let (major, minor) = info.compute_capability;
        return Err(unsupported(format!(
            "fa3 runs on compute capability 9.0 (H100/H200: wgmma, TMA) only; this GPU is {major}.{minor} (use fa2)"
        )));
    }
    let s = spec.shape;
    let causal = call.params.mask_kind == MASK_CAUSAL;
    let tile = forced_tile()?.unwrap_or_else(|| tile_for(s.d, causal, s.sk));
    let smem = tile.smem_bytes(s.d);
    if smem > info.smem_per_block_optin.max(0) as usize {
        return Err(unsupported(format!(
            "fa3 needs {smem} bytes of shared memory per block, the device allows {}",
            info.smem_per_block_optin
        )));
    }
    let p = &call.params;
    if !p.qkvo_aligned_8_elements() {
        return Err(unsupported(
            "fa3 loads Q, K and V through TMA tensor maps: base pointers and strides of Q, K, V and O must be \
             multiples of 8 elements (16 bytes); use fa2",
        ));
    }
    if p.mask_kind != MASK_NONE && p.mask_kind != MASK_CAUSAL {
        return Err(unsupported("fa3 takes no mask or a causal one"));
    }
    let op = |ptr, h, sl, st| KvOperand { ptr, dtype: spec.dtype, dims: [s.b, h, sl, s.d], strides: st };
    let maps = (
        kv_tensor_map(&op(p.q, s.hq, s.sq, p.q_stride), 64),
        kv_tensor_map(&op(p.k, s.hkv, s.sk, p.k_stride), tile.bn),
        kv_tensor_map(&op(p.v, s.hkv, s.sk, p.v_stride), tile.bn),
    );
    let (Some(q), Some(k), Some(v)) = maps else {
        return Err(unsupported(
            "fa3: a TMA tensor map cannot describe this Q, K or V layout (strides must be positive multiples of \
             16 bytes below 2^40, extents below 2^32); use fa2",
        ));
    };
    let work =
        s.sq.div_ceil(tile.rows())
            .checked_mul(s.b * s.hq)
            .filter(|&x| x <= i32::MAX as usize)
            .ok_or_else(|| unsupported("fa3: more than 2^31 query tiles"))?;
    let (blocks, section) = match forced_schedule()? {
        Some((blocks, section)) => (blocks.min(work), section.unwrap_or(1)),
        None => (grid_blocks(work, s.sq.div_ceil(tile.rows()), causal, info.sm_count), 1),
    };
    let blocks = blocks.max(1); // no tile (an empty batch): one block that finds no work
    let dims = LaunchDims {
        // work <= i32::MAX, checked above
        grid: (u32::try_from(blocks).unwrap_or(u32::MAX), 1, 1),
        block: (tile.threads() as u32, 1, 1),
        smem_bytes: smem as u32,
    };
    let section = i32::try_from(section.clamp(1, s.b * s.hq)).unwrap_or(i32::MAX);
    let program = program(spec.dtype, s.d, tile, p.mask_kind, pingpong());
    Ok(Plan { program, dims, args: Fa3Args { p: *p, section, pad: [0; ARGS_PAD], q, k, v } })
}

/// Blocks of the grid for `work` query tiles, `n_mblocks` of them per head. Persistent (one block per
/// multiprocessor, each walking its share of the tiles head by head, `fa3_work`) except under a causal
/// mask with more than [`PERSISTENT_CAUSAL_MAX_MBLOCKS`] tiles per head: there the static share cannot
/// balance the tiles' weights (1 to n_mblocks key tiles, in a saw-tooth over the heads) and one block per
/// tile, which the hardware hands out as blocks finish, runs faster (H100, fa2bench causal at S = 16k,
/// D = 128: 604 TFLOPS against 431 persistent; at 8k persistent wins, 598 against 575;
/// bench/results/gpu/fa3.md).
pub fn grid_blocks(work: usize, n_mblocks: usize, causal: bool, sm_count: i32) -> usize {
    if causal && n_mblocks > PERSISTENT_CAUSAL_MAX_MBLOCKS {
        work
    } else {
        work.min(sms(sm_count))
    }
}

/// Most query tiles per head for which a causal call runs on the persistent grid ([`grid_blocks`]).
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
    let Plan { program, dims, args } = plan(call)?;
    if call.spec.shape.sq == 0 {
        return Ok(()); // no query row: nothing to write
    }
    // SAFETY: `call.params` was built from the validated spec and buffers whose lengths cover every strided
    // offset; the tensor maps describe exactly those operands (TMA reads nothing past their extents), the
    // kernel writes O rows < Sq and columns < Dv with 4-byte stores that the 8-element alignment allows,
    // and LSE entries of its own rows. It is launched only on a compute-capability 9.0 device, for which
    // its program is built as sm_90a.
    unsafe { launch(call.dev, call.stream, &program, &program.name, dims, &args) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sdpa_core::{ExplicitMask, MaskValues, Shape};

    fn spec(d: usize, dv: usize, dtype: DType) -> AttentionSpec {
        AttentionSpec::new(Shape { b: 1, hq: 8, hkv: 2, sq: 300, sk: 500, d, dv }, dtype)
    }

    #[test]
    fn fa3_refuses_what_it_lacks_with_the_reason() {
        assert_eq!(refuses(&spec(128, 128, DType::BF16)), None);
        assert_eq!(refuses(&spec(64, 64, DType::F16).with_mask(Mask::CausalBottomRight)), None);
        for (d, dv) in [(96, 96), (256, 256), (192, 128), (64, 128)] {
            let why = refuses(&spec(d, dv, DType::BF16)).expect("refused");
            assert!(why.contains("head dims"), "{why}");
        }
        assert!(refuses(&spec(128, 128, DType::F32)).expect("refused").contains("f16 and bf16"));
        let plain = spec(64, 64, DType::BF16);
        let explicit = plain.clone().with_mask(Mask::Explicit(ExplicitMask::full(MaskValues::Boolean, &plain.shape)));
        assert!(refuses(&explicit).expect("refused").contains("explicit"));
        let windowed = plain.clone().with_window(sdpa_core::variants::Window::left(64));
        assert!(refuses(&windowed).expect("refused").contains("does not implement"));
        assert!(refuses(&plain.clone().with_softcap(30.0)).expect("refused").contains("does not implement"));
        assert!(refuses(&plain.with_scale(-1.0)).expect("refused").contains("positive scale"));
    }

    #[test]
    fn causal_calls_with_many_tiles_per_head_get_one_block_per_tile() {
        // fa2bench at S = 16k (128 tiles per head): persistent without a mask, a block per tile with one.
        assert_eq!(grid_blocks(2048, 128, false, 132), 132);
        assert_eq!(grid_blocks(2048, 128, true, 132), 2048);
        // Up to 8k (64 tiles per head): persistent both ways; never more blocks than tiles.
        assert_eq!(grid_blocks(2048, 64, true, 132), 132);
        assert_eq!(grid_blocks(40, 1, true, 132), 40);
        assert_eq!(grid_blocks(40, 1, false, 0), 1);
    }

    #[test]
    fn programs_are_named_by_tile_dtype_head_dim_mask_and_turns() {
        let all = programs();
        let tiles: usize =
            FA3_HEAD_DIMS.iter().map(|&d| table_tiles(d, false).len() + table_tiles(d, true).len()).sum();
        assert_eq!(all.len(), 2 * 2 * tiles);
        assert!(all.contains(&compile_check_program()));
        let mut names: Vec<&str> = all.iter().map(|p| p.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len(), "two programs share a name");
        let p = program(DType::F16, 64, Fa3Tile { bn: 128, stages: 2, consumers: 2 }, MASK_NONE, false);
        assert_eq!(p.name, "fa3_t128x2_f16_64_none_pp0");
        assert_eq!(
            p.instantiation,
            "FA3_ENTRY(fa3_t128x2_f16_64_none_pp0, __half, 64, 128, 2, FA3_MASK_NONE, false, 2)"
        );
        let p = program(DType::BF16, 64, Fa3Tile { bn: 128, stages: 2, consumers: 3 }, MASK_CAUSAL, true);
        assert_eq!(p.name, "fa3_t128x2w3_bf16_64_causal");
        // Every tile the table picks fits the H100's 227 KB of shared memory, and so do the deepest forced
        // tiles a tuning run tries.
        for d in FA3_HEAD_DIMS {
            for causal in [false, true] {
                for t in table_tiles(d, causal) {
                    assert!(t.smem_bytes(d) <= 227 * 1024, "{t:?} at D = {d}");
                    assert!(t.rows() == 64 * t.consumers && t.threads() <= 512);
                }
            }
        }
        assert!(Fa3Tile { bn: 192, stages: 2, consumers: 2 }.smem_bytes(128) <= 227 * 1024);
        assert!(Fa3Tile { bn: 192, stages: 4, consumers: 3 }.smem_bytes(64) <= 227 * 1024);
        assert!(FA3.source.contains("#define FA3_THREADS(NC) (128 * ((NC) + 1))"), "block shape changed");
    }
}
