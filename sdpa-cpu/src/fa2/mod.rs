//! The fused tiled kernel (`fa2`) and its split-KV variant (`splitkv`).
//!
//! Work items are (batch, kv head, tile of query rows); the rows of a tile are (query head, position)
//! pairs of one GQA group, head-major, so the query heads that share a kv head read each K/V tile once and
//! K/V are never copied per query head. Each item walks its key range in tiles: scores by a SIMD
//! micro-kernel, softcap and ALiBi on the tile in registers (`variants`), mask, online softmax, P·V into an
//! f32 accumulator, then one normalisation at the end. An item visits only the keys some row of it sees by
//! position (the key band: causal mask and window, [`key_span`]), so key tiles outside the band are never
//! touched and the work grows with the window, not with Sk; tiles every row sees whole need no band mask.
//! Scratch is per worker and sized by the tile, never by the sequence length.
//!
//! One item kernel, [`process`], generic over the SIMD path; on CPUs with AVX512_BF16, bf16 inputs with an
//! even head dim take its pair-product variant instead ([`bf16dot`], the same item structure with
//! `vdpbf16ps`), and on the AMX path bf16 inputs take the tile kernel (`crate::amx::kernel`), both sharing
//! this module's tiles, scratch, key range and row finishing.

use crate::aligned::Aligned;
use crate::element::{widen_with, CpuElement};
use crate::micro;
use crate::nonfinite::{self, ProbTile};
use crate::problem::{round_up, MaskSel, Problem, SharedMut};
use crate::simd::{dispatch, Simd, SimdKernel, SimdPath};
use crate::transpose;
use rayon::prelude::*;
use sdpa_core::softmax::merge_normalized;

#[cfg(target_arch = "x86_64")]
mod bf16dot;
mod staged;
pub(crate) use staged::{worker_bytes as staged_worker_bytes, StagePlan};

/// Tile sizes of one SIMD path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tiles {
    /// Query rows per work item (a multiple of the path's query micro-tile).
    pub br: usize,
    /// Keys per inner tile.
    pub bc: usize,
}

impl Tiles {
    /// Tiles for a path and the keys one row sees (`Problem::row_keys`). Long key ranges get taller query
    /// tiles on AVX-512: each query tile streams all of its kv head's K and V once, so taller tiles halve
    /// that traffic (from L3 or memory, where other work on a shared machine competes), at a few percent of
    /// in-cache speed. A window keeps its keys in cache, and there a shorter tile wastes less: an item
    /// visits the window plus its own height. AVX2 takes 48 rows whatever the keys, a multiple of its P·V
    /// tile's 6 rows and of its 8 lanes: 96 rows at Sk = 4096 took 13-31 % longer on the device host's Xeon
    /// (bench/results/cpu/avx2.md).
    pub(crate) fn for_path(path: SimdPath, sk: usize) -> Tiles {
        match path {
            SimdPath::Avx512 | SimdPath::Avx512Bf16 => Tiles { br: if sk >= 2048 { 128 } else { 64 }, bc: 64 },
            SimdPath::Amx => amx_tiles(sk),
            SimdPath::Avx2 => Tiles { br: 48, bc: 64 },
            SimdPath::Scalar => Tiles { br: 16, bc: 32 },
        }
    }
}

/// The AMX path's tiles (multiples of 32: two tiles of rows, one tile row of bf16 keys). Long key ranges
/// take taller items, as on AVX-512: each item packs every key block of its range once for all of its
/// rows. Key blocks are longer than AVX-512's: each block costs a fixed share (the output rows loaded into
/// and stored from the product tiles, the hand-overs between tiles and vectors, the per-row softmax
/// state) that longer blocks spread. 128 × 256 was the fastest of six shapes at S = 4096 and 16 threads on
/// the device host (`bench/results/cpu/amx.md`); shorter key ranges keep 64 × 128, unmeasured.
/// `SDPA_CPU_AMX_TILES=BRxBC` replaces them (for measurement; read once; a value that is not two multiples
/// of 32 in 32..=512 is reported on stderr and ignored).
fn amx_tiles(sk: usize) -> Tiles {
    forced_amx_tiles().unwrap_or(if sk >= 2048 { Tiles { br: 128, bc: 256 } } else { Tiles { br: 64, bc: 128 } })
}

/// The tiles `SDPA_CPU_AMX_TILES` names, if it does (then no rule of the call changes them).
fn forced_amx_tiles() -> Option<Tiles> {
    static FORCED: std::sync::OnceLock<Option<Tiles>> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| {
        let v = std::env::var("SDPA_CPU_AMX_TILES").ok()?;
        let parsed = v.split_once('x').and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)));
        match parsed {
            Some((br, bc)) if [br, bc].iter().all(|&x: &usize| x % 32 == 0 && (32..=512).contains(&x)) => {
                Some(Tiles { br, bc })
            }
            _ => {
                eprintln!("sdpa-cpu: SDPA_CPU_AMX_TILES={v} ignored (expected BRxBC, multiples of 32 in 32..=512)");
                None
            }
        }
    })
}

/// Items per thread from which the AMX path takes 256-row items instead of 128 at long key ranges.
const AMX_TALL_ITEMS_PER_THREAD: usize = 16;

/// The AMX rule of the call: with at least [`AMX_TALL_ITEMS_PER_THREAD`] items of 256 rows per thread,
/// 256-row items. Each item packs every key block of its kv head (K and V read from L3 or memory, 11-17 % of
/// a 2-thread call at S = 4096), so taller items halve that repeat. Measured on the device host (Intel Xeon,
/// bf16, B = 1, H = 16, S = 4096, D = 64 and 128, causal and not; session 10, rounds interleaved with
/// PyTorch, `bench/results/cpu/amx.md`): 256 x 256 ran 6-13 % faster than 128 x 256 at 2 threads (128 items
/// per thread) and 6-8 % faster at 16 (16 items per thread; session 8's one noisy pass had it 5 % behind).
/// Fewer items per thread (larger thread counts, short calls) were not measured and keep 128-row items,
/// which balance better.
fn amx_call_tiles<T: CpuElement>(ps: &[Problem<'_, T>], sk: usize, threads: usize) -> Tiles {
    let t = amx_tiles(sk);
    if t.br != 128 || forced_amx_tiles().is_some() {
        return t;
    }
    let tall: usize = ps.iter().map(|p| row_tile_count(p, 256)).sum();
    if tall >= AMX_TALL_ITEMS_PER_THREAD * threads.max(1) {
        Tiles { br: 256, ..t }
    } else {
        t
    }
}

/// f32 lanes of a path's vectors.
pub(crate) fn lanes(path: SimdPath) -> usize {
    match path {
        SimdPath::Amx | SimdPath::Avx512 | SimdPath::Avx512Bf16 => 16,
        SimdPath::Avx2 => 8,
        SimdPath::Scalar => 1,
    }
}

/// One work item of a bf16 call for the kernels that read bf16 directly (`bf16dot`, the AMX kernel): the
/// call, its operands, the tiles, the item and where its rows go.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct Bf16Item<'p, 'a, T> {
    pub p: &'p Problem<'a, T>,
    pub q: &'p [half::bf16],
    pub k: &'p [half::bf16],
    pub v: &'p [half::bf16],
    pub tiles: Tiles,
    pub item: Item,
    pub sink: Sink,
}

/// Rows `r0 .. r0 + nr` of kv head `kvh`'s group in batch `b` of part `pi` (a sequence of a ragged
/// batch, `Problem::parts`), keys `k_lo .. k_hi`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Item {
    pub pi: usize,
    pub b: usize,
    pub kvh: usize,
    pub r0: usize,
    pub nr: usize,
    pub k_lo: usize,
    pub k_hi: usize,
    /// First row of this item's slots in the split-KV partial buffers.
    pub slot: usize,
}

/// Where an item's finished rows go.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Sink {
    /// The call's output (and LSE), in the output dtype.
    Output,
    /// Split-KV partials: normalised f32 rows of width Dv and their LSE, at the item's slots.
    Partial { o: SharedMut<f32>, lse: SharedMut<f32> },
}

/// Per-worker scratch, sized by the tile (O(threads × tile) in total); the vector tiles start on a cache
/// line ([`Aligned`]).
#[derive(Debug)]
pub(crate) struct Scratch {
    pub(crate) qt: Aligned<f32>,
    pub(crate) qrow: Aligned<f32>,
    pub(crate) st: Aligned<f32>,
    pub(crate) kp: Aligned<f32>,
    pub(crate) vp: Aligned<f32>,
    pub(crate) o: Aligned<f32>,
    /// The accumulator transposed, `Oᵀ[column][row]`, where [`transposed_pv`] holds.
    pub(crate) ot: Aligned<f32>,
    pub(crate) m: Vec<f32>,
    pub(crate) l: Vec<f32>,
    pub(crate) alpha: Vec<f32>,
    pub(crate) rowbuf: Vec<f32>,
    pub(crate) rows: Vec<(usize, usize)>,
    /// ALiBi's `−slope` and diagonal of each row (`ScoreMods::row_consts`).
    pub(crate) neg_slope: Vec<f32>,
    pub(crate) diag: Vec<f32>,
    /// bf16 pairs for the AVX512_BF16 kernel: Qᵀ by dim pairs, Pᵀ by key pairs, V interleaved by key pairs.
    pub(crate) qt2: Vec<u32>,
    pub(crate) pb: Vec<u32>,
    pub(crate) v2: Vec<u32>,
    /// The AMX kernel's packed operands and aligned accumulator (path `Amx` only).
    #[cfg(target_arch = "x86_64")]
    pub(crate) amx: Option<Box<crate::amx::kernel::Buffers>>,
}

impl Scratch {
    /// Empty online-softmax state for `lanes` rows and a zero accumulator of `acc` values.
    pub(crate) fn reset_state(&mut self, lanes: usize, acc: usize) {
        self.m[..lanes].fill(f32::NEG_INFINITY);
        self.l[..lanes].fill(0.0);
        self.o[..acc].fill(0.0);
    }

    /// `packs`: K/V tiles are widened to f32 (non-f32 inputs); `pairs`: the AVX512_BF16 kernel runs.
    pub(crate) fn new(path: SimdPath, tiles: Tiles, d: usize, dv: usize, packs: bool, pairs: bool) -> Scratch {
        let l = lanes(path);
        let (dp, br) = (round_up(d, l), round_up(tiles.br, l));
        // The AMX kernel's accumulator rows are padded to whole tiles (32 columns, 32 rows).
        let (dvp, br) =
            if path == SimdPath::Amx { (round_up(dv, 32), round_up(br, 32)) } else { (round_up(dv, l), br) };
        Scratch {
            qt: Aligned::new(d * br),
            qrow: Aligned::new(4 * dp),
            st: Aligned::new(tiles.bc * br),
            kp: Aligned::new(if packs { tiles.bc * dp } else { 0 }),
            vp: Aligned::new(if packs { tiles.bc * dvp } else { 0 }),
            o: Aligned::new(br * dvp),
            ot: Aligned::new(if transposed_pv(l, dv) { dv * br } else { 0 }),
            m: vec![0.0; br],
            l: vec![0.0; br],
            alpha: vec![0.0; br],
            rowbuf: vec![0.0; (transpose::BLOCK * d).max(dv)],
            rows: Vec::with_capacity(br),
            neg_slope: vec![0.0; br],
            diag: vec![0.0; br],
            qt2: if pairs { vec![0; d.div_ceil(2) * br] } else { Vec::new() },
            pb: if pairs { vec![0; tiles.bc.div_ceil(2) * br] } else { Vec::new() },
            v2: if pairs { vec![0; tiles.bc.div_ceil(2) * dvp] } else { Vec::new() },
            #[cfg(target_arch = "x86_64")]
            amx: (path == SimdPath::Amx).then(|| Box::new(crate::amx::kernel::Buffers::new(tiles, d, dv))),
        }
    }
}

/// What a worker's scratch was sized for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ScratchKey {
    pub path: SimdPath,
    pub tiles: Tiles,
    pub d: usize,
    pub dv: usize,
    pub packs: bool,
    pub pairs: bool,
}

thread_local! {
    /// Each worker thread keeps its last scratch: items of one call (and calls of one shape) reuse it
    /// instead of allocating and zeroing a few hundred KiB per item.
    static SCRATCH: std::cell::RefCell<Option<(ScratchKey, Scratch)>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with this thread's scratch for `key` (rebuilt when the key changed).
fn with_scratch<R>(key: ScratchKey, f: impl FnOnce(&mut Scratch) -> R) -> R {
    let fresh = || Scratch::new(key.path, key.tiles, key.d, key.dv, key.packs, key.pairs);
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut slot) => {
            if !matches!(&*slot, Some((k, _)) if *k == key) {
                *slot = Some((key, fresh()));
            }
            match slot.as_mut() {
                Some((_, scr)) => f(scr),
                None => f(&mut fresh()),
            }
        }
        // Re-entered on this thread (not expected: items never call back into rayon): a private scratch.
        Err(_) => f(&mut fresh()),
    })
}

struct ItemRun<'p, 'a, T> {
    p: &'p Problem<'a, T>,
    tiles: Tiles,
    item: Item,
    scr: &'p mut Scratch,
    sink: Sink,
    careful: bool,
}

impl<T: CpuElement> SimdKernel for ItemRun<'_, '_, T> {
    type Output = bool;
    #[inline(always)]
    fn run<S: Simd>(self, s: S) -> bool {
        process::<S, T>(s, self.p, self.tiles, self.item, self.scr, self.sink, self.careful)
    }
}

/// Runs one work item on SIMD path `path`; again in careful mode when its accumulators came out
/// non-finite (see `nonfinite`).
pub(crate) fn run_item<T: CpuElement>(
    path: SimdPath,
    p: &Problem<'_, T>,
    tiles: Tiles,
    item: Item,
    scr: &mut Scratch,
    sink: Sink,
) {
    #[cfg(target_arch = "x86_64")]
    if item.nr * 4 > 16 {
        if let (Some(q), Some(k), Some(v)) = (T::as_bf16(p.q), T::as_bf16(p.k), T::as_bf16(p.v)) {
            let job = Bf16Item { p, q, k, v, tiles, item, sink };
            let amx = uses_amx(p, path) && scr.amx.is_some();
            if amx || uses_pairs(p, path) {
                for careful in [false, true] {
                    // SAFETY: `uses_amx` checked the CPU and the permission (`amx::status`), and the scratch
                    // was built for the AMX path with this call's tiles (its key), whose key blocks are
                    // multiples of 32 (`amx_tiles`); `uses_pairs` checked AVX-512 with AVX512_BF16.
                    let done = unsafe {
                        if amx {
                            crate::amx::kernel::process_hw(job, scr, careful)
                        } else {
                            bf16dot::process(job, scr, careful)
                        }
                    };
                    if done {
                        return;
                    }
                }
                return;
            }
        }
    }
    for careful in [false, true] {
        if dispatch(path, ItemRun { p, tiles, item, scr: &mut *scr, sink, careful }) {
            return;
        }
    }
}

/// Whether items of this call may take the AVX512_BF16 kernel: bf16 inputs, an even head dim (K is read
/// in pairs straight from memory), K/V not in pages (it reads key tiles in place), and a CPU with the
/// instructions.
pub(crate) fn uses_pairs<T: CpuElement>(p: &Problem<'_, T>, path: SimdPath) -> bool {
    path == SimdPath::Avx512Bf16
        && T::as_bf16(p.q).is_some()
        && p.d.is_multiple_of(2)
        && p.pages.is_none()
        && path.is_supported()
}

/// Whether items of this call take the AMX kernel: bf16 inputs, K/V not in pages (key blocks are packed
/// from rows in place), and the AMX path, supported here. Decoding items (a few rows) stay on the vector
/// kernel, whose dot products suit them.
pub(crate) fn uses_amx<T: CpuElement>(p: &Problem<'_, T>, path: SimdPath) -> bool {
    path == SimdPath::Amx && T::as_bf16(p.q).is_some() && p.pages.is_none() && path.is_supported()
}

/// One work item. Returns false, having sent nothing, when not `careful` and an accumulator came out
/// non-finite (the caller runs the item again with `careful`); true once its rows went to the sink.
#[inline(always)]
fn process<S: Simd, T: CpuElement>(
    s: S,
    p: &Problem<'_, T>,
    t: Tiles,
    it: Item,
    scr: &mut Scratch,
    sink: Sink,
    careful: bool,
) -> bool {
    let lanes = S::LANES;
    let (d, dv) = (p.d, p.dv);
    let (dp, dvp) = (round_up(d, lanes), round_up(dv, lanes));
    let nr = it.nr;
    let nqv = nr.div_ceil(lanes);
    let brp = nqv * lanes;
    // A few rows (decoding) leave most lanes of a query vector empty: dot products along D instead.
    let dot = nr * 4 <= lanes;

    scr.rows.clear();
    scr.rows.extend((0..nr).map(|r| p.row(it.kvh, it.r0 + r)));

    // Q tile, scaled once here so the scores need no multiply: decoding rows as they are, tiles transposed
    // a block of rows at a time (widened into `rowbuf` first). The buffers are sliced once: indexed through
    // `scr` inside the loop, their pointers were reloaded at every element (a store might alias `scr` for all
    // the compiler knows), which took 8 % of an in-cache call at S = 512 (AVX-512, D = 32).
    let (rowbuf, qrow, qt) = (&mut scr.rowbuf[..], &mut scr.qrow[..], &mut scr.qt[..]);
    for (blk, rows) in scr.rows.chunks(transpose::BLOCK).enumerate() {
        for (k, &(h, i)) in rows.iter().enumerate() {
            widen_with(s, p.q, p.q_st.offset(it.b, h, i), &mut rowbuf[k * d..(k + 1) * d]);
        }
        if dot {
            for (k, src) in rowbuf.chunks_exact(d).take(rows.len()).enumerate() {
                let r = blk * transpose::BLOCK + k;
                let dst = &mut qrow[r * dp..(r + 1) * dp];
                for (x, &y) in dst.iter_mut().zip(src) {
                    *x = y * p.scale;
                }
                dst[d..].fill(0.0);
            }
        } else {
            let r0 = blk * transpose::BLOCK;
            transpose::transpose_rows(rowbuf, d, rows.len(), d, p.scale, &mut qt[r0..], brp);
        }
    }
    if !dot && nr < brp {
        for c in 0..d {
            scr.qt[c * brp + nr..(c + 1) * brp].fill(0.0);
        }
    }

    let KeyLoop { span, explicit, .. } = KeyLoop::start(p, it, scr, brp, nr * dvp);
    // The careful re-run keeps the row-major accumulator its repairs address.
    let tpv = !dot && !careful && transposed_pv(lanes, dv);
    let how = micro::SoftmaxExp::for_output::<T>();
    if tpv {
        scr.ot[..dv * brp].fill(0.0);
    }
    let (kf, vf) = (T::as_f32(p.k), T::as_f32(p.v));
    // The item's head staged in the worker's buffer, where the call stages (`staged`).
    let staged = match p.stage {
        Some(plan) if span.hi > span.lo => {
            staged::with_head_stage(|h| h.rows(s, p, plan, it.b, it.kvh, span.lo, span.hi))
        }
        _ => None,
    };
    let staged_k = staged.and_then(|r| r.k.map(|k| (k, r.ks)));
    let staged_v = staged.and_then(|r| r.v.map(|v| (v, r.vs)));
    let mut j0 = span.lo;
    while j0 < span.hi {
        let j1 = (j0 + t.bc).min(span.hi);
        let nk = j1 - j0;
        // f32 tiles are read in place unless they cross a page; the rest are gathered (and widened) into
        // scratch, key by key through the block table when paged.
        let in_place = p.contiguous(j0, j1);
        let (kptr, ks) = match (staged_k, kf) {
            // SAFETY (the offset): the staging holds the head's keys j0..j1 at their own rows.
            (Some((k, ks)), _) => (unsafe { k.add(j0 * ks) }, ks),
            (None, Some(kf)) if in_place => (kf[p.k_row(it.b, it.kvh, j0)..].as_ptr(), p.k_st.s),
            _ => {
                // At stride d, not dp: the score kernels broadcast K one value at a time (no alignment to
                // keep), and d-long rows back to back widen in one call whatever d is.
                let rows = TileRows { stride: p.k_st.s, in_place, nk };
                widen_tile(s, p.k, rows, |j| p.k_row(it.b, it.kvh, j0 + j), d, &mut scr.kp, d);
                (scr.kp.as_ptr(), d)
            }
        };
        let st = scr.st.as_mut_ptr();
        // Decoding keeps each row's scores along the keys (`st[r*bc + j]`); tiles keep Sᵀ (`st[j*brp + r]`).
        let (key_stride, row_stride) = if dot { (1, t.bc) } else { (brp, 1) };
        // An edge tile's products go by pieces (`splits_edge_tile`), each leaving out the `done(ja)` query
        // vectors above all of its keys, rounded to whole register tiles of the rest (`tail_start`).
        let rows = &scr.rows;
        let split = splits_edge_tile(p, &span, rows, lanes, j0, j1, !dot && !careful && !explicit);
        let piece = if split { SKIP_PIECE } else { nk };
        let done = |ja: usize| if split { vectors_done_before(p, rows, lanes, ja) } else { 0 };
        if dot {
            for r in 0..nr {
                // SAFETY: `qrow` row r holds dp values; K rows j0..j1 exist (d values each, stride ks);
                // `st` holds bc·br >= nr·bc values.
                unsafe {
                    micro::dot_scores(s, d, scr.qrow.as_ptr().add(r * dp), kptr, ks, nk, st.add(r * t.bc), 1, None)
                };
            }
        } else {
            let qt = scr.qt.as_ptr();
            for ja in (j0..j1).step_by(piece) {
                let (n, v, o) = ((j1 - ja).min(piece), tail_start(nqv, done(ja), S::QK_QVECS), ja - j0);
                let r = v * lanes;
                // SAFETY: `qt` holds d rows of brp values; K rows as above; `st` holds bc·br >= nk·brp values;
                // v < nqv (never the last vector).
                unsafe {
                    micro::scores(s, d, kptr.add(o * ks), ks, n, qt.add(r), brp, nqv - v, st.add(o * brp + r), brp)
                };
            }
        }
        if !p.mods.is_plain() {
            let rows = if dot { nr } else { brp };
            // SAFETY: every (key, row) index of this tile, padding rows included, is inside `st`.
            unsafe { p.mods.apply(s, &scr.neg_slope, &scr.diag, j0, nk, rows, st, key_stride, row_stride) };
        }
        if explicit || span.needs_mask(j0, j1) {
            // SAFETY: every (key, row) index of this tile is inside `st`, owned by this worker.
            unsafe { p.apply_mask(it.b, &scr.rows, j0, j1, st, key_stride, row_stride) };
        }
        // SAFETY: the tile's scores are inside `st`; the statistics hold br >= brp values.
        unsafe {
            if dot {
                micro::online_softmax_rows(s, how, st, t.bc, nk, nr, &mut scr.m, &mut scr.l, &mut scr.alpha);
            } else {
                micro::online_softmax(s, how, st, brp, nk, nqv, &mut scr.m, &mut scr.l, &mut scr.alpha);
            }
        }
        let (vptr, vs) = match (staged_v, vf) {
            // SAFETY (the offset): as for K.
            (Some((v, vs)), _) => (unsafe { v.add(j0 * vs) }, vs),
            (None, Some(vf)) if in_place && !(S::PV_COPIES_ALIASED_V && aliased_rows(p.v_st.s)) => {
                (vf[p.v_row(it.b, it.kvh, j0)..].as_ptr(), p.v_st.s)
            }
            _ => {
                // The transposed P·V broadcasts V one value at a time, so its rows need no padding: at
                // stride dv, rows back to back widen in one call.
                let vsp = if tpv { dv } else { dvp };
                let rows = TileRows { stride: p.v_st.s, in_place, nk };
                widen_tile(s, p.v, rows, |j| p.v_row(it.b, it.kvh, j0 + j), dv, &mut scr.vp, vsp);
                (scr.vp.as_ptr(), vsp)
            }
        };
        // Careful mode: V rows with NaN or inf leave the tile product and come back only where attended.
        // SAFETY: V rows j0..j1 hold dv values at stride vs.
        let screened = unsafe { nonfinite::ScreenedV::new(careful, vptr, vs, nk, dv, dvp) };
        let (vptr, vs) = screened.tile(vptr, vs, dvp);
        let o = scr.o.as_mut_ptr();
        // SAFETY: P holds nk keys by nr rows at (key_stride, row_stride) inside `st`; V rows j0..j1 hold dv
        // values at stride vs; `o` holds nr rows of dvp values; alpha holds brp values.
        unsafe {
            // Piece by piece as the scores. A skipped row's P is 0 there and its alpha 1 (or 0 on a row that
            // has seen no key yet, whose accumulator is still +0), so leaving its accumulator as it is gives
            // the same result (a -0.0 may stay -0.0 where the product made it +0.0). The first piece rescales
            // every row a later one reaches (they skip at least as many), which then accumulate onto it:
            // alpha once per tile.
            let (ot, al) = (scr.ot.as_mut_ptr(), scr.alpha.as_mut_ptr());
            for ja in (j0..j1).step_by(piece) {
                let (n, k) = ((j1 - ja).min(piece), ja - j0);
                // Pairs of row vectors (pv_transposed's tiles), or whole row tiles of `pv`.
                let r = if tpv {
                    tail_start(nqv, done(ja), 2) * lanes
                } else {
                    tail_start(nr, done(ja) * lanes, S::PV_ROWS)
                };
                let (pt, vk) = (st.add(k * key_stride + r * row_stride), vptr.add(k * vs));
                if tpv {
                    // SAFETY (as above, and): `ot` holds dv rows of brp values; r < brp.
                    micro::pv_transposed(s, n, pt, brp, vk, vs, dv, nqv - r / lanes, ot.add(r), brp, al.add(r));
                    if ja == j0 && piece < nk {
                        // Its alpha has no rescale to pass the later pieces.
                        std::slice::from_raw_parts_mut(al.add(r), brp - r).fill(1.0);
                    }
                } else {
                    let rescale = (ja == j0).then(|| al.add(r).cast_const());
                    micro::pv(s, n, pt, key_stride, row_stride, vk, vs, nr - r, dv, o.add(r * dvp), dvp, rescale, None);
                }
            }
        }
        let prob = ProbTile { pt: st, ps: key_stride, pr: row_stride };
        // SAFETY: P and `o` as for the product above.
        unsafe { screened.add_back(p, it.b, &scr.rows, j0, prob, o, dvp) };
        j0 = j1;
    }
    if tpv {
        transpose::transpose_rows(&scr.ot[..], brp, dv, nr, 1.0, &mut scr.o[..], dvp);
    }
    end_item(s, p, it, scr, dvp, sink, careful)
}

/// Keys per piece of a tile that crosses the band's edge (see [`vectors_done_before`]): a multiple of every
/// path's score tile (`Simd::QK_KEYS`: 4, 6, 12), and long enough that the extra P·V calls reload their
/// accumulators once per 12 keys, on the few tiles that cross the edge.
pub(crate) const SKIP_PIECE: usize = 12;

/// Whether key tile `j0..j1` of an item goes by pieces of [`SKIP_PIECE`] keys, leaving out the query vectors
/// each piece's keys are all above ([`vectors_done_before`]): a tile that crosses the band's edge (`span`),
/// on a kernel that may (`may`: the tiled products, not decoding's dot products, not careful mode's re-run,
/// not under an explicit mask, which masks every tile), where the last piece would leave something out (so
/// a window's lower edge or a GQA item across two heads' rows stays whole), unless
/// [`whole_edge_tiles`] says otherwise.
pub(crate) fn splits_edge_tile<T: CpuElement>(
    p: &Problem<'_, T>,
    span: &KeySpan,
    rows: &[(usize, usize)],
    lanes: usize,
    j0: usize,
    j1: usize,
    may: bool,
) -> bool {
    let last_piece = j0 + (j1 - j0 - 1) / SKIP_PIECE * SKIP_PIECE;
    let split =
        may && span.needs_mask(j0, j1) && !whole_edge_tiles() && vectors_done_before(p, rows, lanes, last_piece) > 0;
    #[cfg(test)]
    if split {
        tests::SPLIT_TILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    split
}

/// Whether tiles that cross the band's edge go whole, every query vector through every product:
/// `SDPA_CPU_CAUSAL_SKIP=0`, a measurement switch (read once) that brings back the kernel before the skip for
/// an A/B on one machine. The unit tests flip [`tests::WHOLE_EDGE_TILES`] instead, to compare both sides bit
/// for bit in one process.
fn whole_edge_tiles() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    #[cfg(test)]
    if tests::WHOLE_EDGE_TILES.load(std::sync::atomic::Ordering::Relaxed) {
        return true;
    }
    *OFF.get_or_init(|| std::env::var("SDPA_CPU_CAUSAL_SKIP").is_ok_and(|v| v.trim() == "0"))
}

/// Where the computed part of `total` units (rows or vectors) starts when the first `skip` may be left out:
/// the rest rounded up to whole tiles of `unit`, so that the kernels' register tiles stay full.
pub(crate) fn tail_start(total: usize, skip: usize, unit: usize) -> usize {
    total - (total - skip.min(total)).next_multiple_of(unit).min(total)
}

/// How many query vectors at the front of an item (`lanes` rows each, in `rows`' order) hold only rows
/// whose band ends at or before key `j0`: rows above a causal diagonal, for keys from `j0` on. Those keys'
/// products skip them: the band mask writes -inf over whatever their scores hold, so their P is 0, and their
/// accumulator rows are left as they are. The last vector is never counted: it holds the item's padding
/// lanes, which no mask writes.
pub(crate) fn vectors_done_before<T: CpuElement>(
    p: &Problem<'_, T>,
    rows: &[(usize, usize)],
    lanes: usize,
    j0: usize,
) -> usize {
    let nqv = rows.len().div_ceil(lanes);
    rows.chunks(lanes)
        .take(nqv.saturating_sub(1))
        .take_while(|v| v.iter().all(|&(_, i)| p.key_range(i).end <= j0))
        .count()
}

/// Whether [`process`] accumulates P·V transposed ([`micro::pv_transposed`]): on 16-lane paths, for head
/// dims below 64 that no vector width divides, whose row-major tiles would pad every output row to the
/// next multiple of 16 (D = 40: 48 columns, a sixth of the P·V products wasted). Wider head dims waste a
/// smaller share and keep the row-major tiles, measured on those.
pub(crate) fn transposed_pv(lanes: usize, dv: usize) -> bool {
    lanes == 16 && !dv.is_multiple_of(16) && dv < 64
}

/// A key tile's `nk` rows in a K or V operand: `stride` apart when `in_place` (the tile crosses no page).
#[derive(Clone, Copy)]
struct TileRows {
    stride: usize,
    in_place: bool,
    nk: usize,
}

/// Widens a tile's rows (row `j` at `row_of(j)`, through the block table when paged) of `n` values into
/// `dst` at row stride `ds`. Rows back to back in the source (`stride == n`) and in `dst` (`ds == n`) go in
/// one call: a call per row pays a fixed setup per row (the widening, copies and calls together were 9 % of
/// an in-cache bf16 call at D = 32; one call per tile made that call 10 % faster).
#[inline(always)]
fn widen_tile<S: Simd, T: CpuElement>(
    s: S,
    src: &[T],
    rows: TileRows,
    row_of: impl Fn(usize) -> usize,
    n: usize,
    dst: &mut [f32],
    ds: usize,
) {
    let nk = rows.nk;
    if rows.in_place && rows.stride == n && ds == n {
        widen_with(s, src, row_of(0), &mut dst[..nk * n]);
    } else {
        for j in 0..nk {
            widen_with(s, src, row_of(j), &mut dst[j * ds..j * ds + n]);
        }
    }
}

/// What an item kernel knows before its key loop, computed the same way by [`process`] and [`bf16dot`].
pub(crate) struct KeyLoop {
    /// The keys the item visits ([`key_span`]).
    pub span: KeySpan,
    /// Whether the mask is explicit (every tile is masked).
    pub explicit: bool,
    /// Offset of key 0 of the item's kv head in K (K/V not paged).
    pub kbase: usize,
    /// Offset of key 0 of the item's kv head in V (K/V not paged).
    pub vbase: usize,
}

impl KeyLoop {
    /// The loop's bounds and offsets for item `it` (whose rows are in `scr.rows`), with the online softmax
    /// state reset for `brp` rows and `o_len` accumulator values and ALiBi's row constants in `scr`.
    #[inline(always)]
    pub(crate) fn start<T: CpuElement>(
        p: &Problem<'_, T>,
        it: Item,
        scr: &mut Scratch,
        brp: usize,
        o_len: usize,
    ) -> Self {
        let span = key_span(p, scr.rows.iter().map(|&(_, i)| i), it.k_lo, it.k_hi);
        let explicit = matches!(p.mask, MaskSel::Explicit { .. });
        scr.reset_state(brp, o_len);
        p.mods.row_consts(&scr.rows, &mut scr.neg_slope[..brp], &mut scr.diag[..brp]);
        KeyLoop { span, explicit, kbase: p.k_st.offset(it.b, it.kvh, 0), vbase: p.v_st.offset(it.b, it.kvh, 0) }
    }
}

/// The end of an item: false, having sent nothing, when not `careful` and an accumulator came out
/// non-finite (the caller runs the item again carefully, see `nonfinite`); otherwise its rows go to the
/// sink ([`finish_rows`]) and true.
#[inline(always)]
pub(crate) fn end_item<S: Simd, T: CpuElement>(
    s: S,
    p: &Problem<'_, T>,
    it: Item,
    scr: &mut Scratch,
    dvp: usize,
    sink: Sink,
    careful: bool,
) -> bool {
    if !careful && !nonfinite::all_finite(s, &scr.o[..it.nr * dvp]) {
        return false;
    }
    finish_rows(p, it, scr, dvp, sink);
    true
}

/// The keys a set of rows visits, within bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeySpan {
    /// First key any row sees.
    pub lo: usize,
    /// One past the last key any row sees (`hi <= lo`: none).
    pub hi: usize,
    /// Keys `in_lo..in_hi` are seen by every row: tiles inside need no band mask.
    pub in_lo: usize,
    pub in_hi: usize,
}

impl KeySpan {
    /// Whether tile `j0..j1` holds a key some row does not see by position.
    #[inline(always)]
    pub(crate) fn needs_mask(&self, j0: usize, j1: usize) -> bool {
        j0 < self.in_lo || j1 > self.in_hi
    }

    /// Keys visited.
    pub(crate) fn len(&self) -> usize {
        self.hi.saturating_sub(self.lo)
    }
}

/// The union of the key ranges of query positions `rows` (`Problem::key_range`: the band of the causal
/// mask and the window), clamped to `k_lo..k_hi`, and their intersection. Rows that see no key add
/// nothing to the union.
pub(crate) fn key_span<T: CpuElement>(
    p: &Problem<'_, T>,
    rows: impl IntoIterator<Item = usize>,
    k_lo: usize,
    k_hi: usize,
) -> KeySpan {
    let (mut lo, mut hi, mut in_lo, mut in_hi) = (usize::MAX, 0, 0, usize::MAX);
    for i in rows {
        let keys = p.key_range(i);
        in_lo = in_lo.max(keys.start);
        in_hi = in_hi.min(keys.end);
        if !keys.is_empty() {
            lo = lo.min(keys.start);
            hi = hi.max(keys.end);
        }
    }
    let (lo, hi) = (lo.max(k_lo), hi.min(k_hi));
    KeySpan { lo: lo.min(hi), hi, in_lo, in_hi }
}

/// Normalises one accumulated output row by its softmax sum `l` and returns its LSE from the running max
/// `m`: a row no key took part in (`l == 0`) becomes zeros with LSE = -inf, the documented convention.
#[inline]
pub(crate) fn normalize_row(row: &mut [f32], m: f32, l: f32) -> f32 {
    if l == 0.0 {
        row.fill(0.0);
        f32::NEG_INFINITY
    } else {
        let inv = 1.0 / l;
        row.iter_mut().for_each(|x| *x *= inv);
        m + l.ln()
    }
}

/// Normalises the item's accumulated rows (`o` at row stride `dvp`) and sends them to the sink.
pub(crate) fn finish_rows<T: CpuElement>(p: &Problem<'_, T>, it: Item, scr: &mut Scratch, dvp: usize, sink: Sink) {
    let dv = p.dv;
    for r in 0..it.nr {
        let (h, i) = scr.rows[r];
        let row = &mut scr.o[r * dvp..r * dvp + dv];
        let lse = normalize_row(row, scr.m[r], scr.l[r]);
        match sink {
            // SAFETY: row (b, h, i) belongs to this item only.
            Sink::Output => unsafe { p.write_row(it.b, h, i, row, lse) },
            Sink::Partial { o, lse: l } => {
                let slot = it.slot + r;
                // SAFETY: the partial buffers hold a slot for every row of every item; slots are disjoint.
                unsafe {
                    std::ptr::copy_nonoverlapping(row.as_ptr(), o.0.add(slot * dv), dv);
                    *l.0.add(slot) = lse;
                }
            }
        }
    }
}

/// Rows of a kv head's group that one row tile may span: all of them, or one query head's when a window
/// bounds the keys from below and a head fills a tile (a tile across a head boundary would hold the last
/// positions of one head and the first of the next, and visit the keys of both windows and all between).
fn tile_segment<T: CpuElement>(p: &Problem<'_, T>, br: usize) -> usize {
    if p.band.lo.is_some() && p.sq > br {
        p.sq
    } else {
        p.group_rows()
    }
}

/// The row tiles of a call: (batch, kv head, first row, rows).
pub(crate) fn row_tiles<T: CpuElement>(p: &Problem<'_, T>, br: usize) -> Vec<(usize, usize, usize, usize)> {
    let (rows, seg) = (p.group_rows(), tile_segment(p, br));
    let mut v = Vec::with_capacity(row_tile_count(p, br));
    for b in 0..p.b {
        for kvh in 0..p.hkv() {
            for s0 in (0..rows).step_by(seg) {
                let s1 = (s0 + seg).min(rows);
                let mut r0 = s0;
                while r0 < s1 {
                    let nr = br.min(s1 - r0);
                    v.push((b, kvh, r0, nr));
                    r0 += nr;
                }
            }
        }
    }
    debug_assert_eq!(v.len(), row_tile_count(p, br));
    v
}

/// Number of row tiles `fa2` would run (what `auto` weighs against the thread count).
pub(crate) fn row_tile_count<T: CpuElement>(p: &Problem<'_, T>, br: usize) -> usize {
    let (rows, seg) = (p.group_rows(), tile_segment(p, br));
    p.b * p.hkv() * (rows / seg * seg.div_ceil(br) + (rows % seg).div_ceil(br))
}

/// The scratch a call's items need: `packs` when K/V tiles are widened or gathered (non-f32 inputs, or
/// pages a tile may cross).
fn scratch_key<T: CpuElement>(ps: &[Problem<'_, T>], path: SimdPath, tiles: Tiles) -> Option<ScratchKey> {
    let p = ps.first()?;
    let packs = T::as_f32(p.k).is_none() || p.pages.is_some() || copies_v(p, path);
    Some(ScratchKey { path, tiles, d: p.d, dv: p.dv, packs, pairs: uses_pairs(p, path) })
}

/// Whether rows `stride` f32 apart fall a multiple of 512 bytes apart (power-of-two head dims, packed).
fn aliased_rows(stride: usize) -> bool {
    (stride * 4).is_multiple_of(512)
}

/// Whether `fa2` items copy their f32 V tiles into scratch on this path (`Simd::PV_COPIES_ALIASED_V`: AVX2,
/// V rows a multiple of 512 bytes apart) rather than reading them in place; the scratch then holds a V tile.
fn copies_v<T: CpuElement>(p: &Problem<'_, T>, path: SimdPath) -> bool {
    path == SimdPath::Avx2 && T::as_f32(p.v).is_some() && aliased_rows(p.v_st.s)
}

/// Tiles for all parts of a call on `threads` threads (sized by the longest key range of any of them). The
/// AMX path's only where its items take the tile kernel (bf16, not paged: [`uses_amx`]); its f32, f16 and
/// paged calls run the AVX-512 kernels with their own tiles, as on `avx512-bf16`.
pub(crate) fn tiles_of<T: CpuElement>(ps: &[Problem<'_, T>], path: SimdPath, threads: usize) -> Tiles {
    let Some(p) = ps.first() else { return Tiles::for_path(path, 0) };
    let sk = ps.iter().map(Problem::row_keys).max().unwrap_or(0);
    if path != SimdPath::Amx {
        Tiles::for_path(path, sk)
    } else if !uses_amx(p, path) {
        Tiles::for_path(SimdPath::Avx512Bf16, sk)
    } else {
        amx_call_tiles(ps, sk, threads)
    }
}

/// A row tile of some part with the keys its rows see: (part, batch, kv head, first row, rows, span).
pub(crate) type RowTile = (usize, usize, usize, usize, usize, KeySpan);

/// The row tiles of every part, each with its key span.
pub(crate) fn all_row_tiles<T: CpuElement>(ps: &[Problem<'_, T>], br: usize) -> Vec<RowTile> {
    let mut v = Vec::new();
    for (pi, p) in ps.iter().enumerate() {
        for (b, kvh, r0, nr) in row_tiles(p, br) {
            let span = key_span(p, (r0..r0 + nr).map(|r| p.row(kvh, r).1), 0, p.sk);
            v.push((pi, b, kvh, r0, nr, span));
        }
    }
    v
}

/// `fa2`: one work item per row tile of every part, over the current rayon pool. A ragged batch's items
/// go heaviest first (rows × keys visited), so long sequences start early and short ones fill the gaps.
pub(crate) fn run_fa2<T: CpuElement>(ps: &[Problem<'_, T>], path: SimdPath) {
    let tiles = tiles_of(ps, path, rayon::current_num_threads());
    let ps = &staged::planned(ps, path, tiles)[..];
    let Some(key) = scratch_key(ps, path, tiles) else { return };
    let mut items: Vec<(usize, Item)> = all_row_tiles(ps, tiles.br)
        .into_iter()
        .map(|(pi, b, kvh, r0, nr, span)| {
            (nr * (span.len() + 16), Item { pi, b, kvh, r0, nr, k_lo: 0, k_hi: ps[pi].sk, slot: 0 })
        })
        .collect();
    if ps.len() > 1 {
        items.sort_by_key(|&(w, _)| std::cmp::Reverse(w));
    }
    items.par_iter().with_max_len(1).for_each(|&(_, item)| {
        with_scratch(key, |scr| run_item(path, &ps[item.pi], tiles, item, scr, Sink::Output));
    });
    amx_report(path);
}

/// The AMX kernel's phase shares of the call just run, when asked for (`amx::profile`).
fn amx_report(path: SimdPath) {
    #[cfg(target_arch = "x86_64")]
    if path == SimdPath::Amx {
        crate::amx::profile::report();
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = path;
}

/// How many key chunks `splitkv` cuts each row tile into: enough items to keep every thread busy, each
/// chunk at least two key tiles long.
pub(crate) fn split_count(row_tiles: usize, sk: usize, bc: usize, threads: usize) -> usize {
    let want = (4 * threads).div_ceil(row_tiles.max(1));
    let most = sk.div_ceil(2 * bc).max(1);
    want.clamp(1, most)
}

/// `splitkv`: each row tile's keys (those its rows see: the band) are cut into chunks run as separate
/// items; the normalised partial rows and their LSE are merged with sdpa-core's `merge_normalized`. The
/// chunks are about equally long across all row tiles of all parts (enough of them for four items per
/// thread, each at least two key tiles), so a ragged batch splits its long sequences more than its short
/// ones and the items stay balanced.
pub(crate) fn run_splitkv<T: CpuElement>(ps: &[Problem<'_, T>], path: SimdPath, threads: usize) {
    let tiles = tiles_of(ps, path, threads);
    let ps = &staged::planned(ps, path, tiles)[..];
    let Some(key) = scratch_key(ps, path, tiles) else { return };
    let rt = all_row_tiles(ps, tiles.br);
    let total: usize = rt.iter().map(|t| t.5.len()).sum();
    let target = total.div_ceil(4 * threads).max(2 * tiles.bc);
    let mut items = Vec::new();
    // Per row tile: its first slot and its number of chunks.
    let mut layout = Vec::with_capacity(rt.len());
    let mut slot = 0;
    for &(pi, b, kvh, r0, nr, span) in &rt {
        let splits = span.len().div_ceil(target).clamp(1, span.len().div_ceil(2 * tiles.bc).max(1));
        // Chunks of whole key tiles, so no tile is cut short but the span's last.
        let chunk = round_up(span.len().div_ceil(splits), tiles.bc);
        layout.push((slot, splits));
        for sidx in 0..splits {
            let k_lo = (span.lo + sidx * chunk).min(span.hi);
            let k_hi = (span.lo + (sidx + 1) * chunk).min(span.hi);
            items.push(Item { pi, b, kvh, r0, nr, k_lo, k_hi, slot: slot + sidx * tiles.br });
        }
        slot += splits * tiles.br;
    }
    let dv = key.dv;
    let mut part_o = vec![0.0f32; slot * dv];
    let mut part_lse = vec![f32::NEG_INFINITY; slot];
    let sink = Sink::Partial { o: SharedMut(part_o.as_mut_ptr()), lse: SharedMut(part_lse.as_mut_ptr()) };
    items.par_iter().with_max_len(1).for_each(|&item| {
        with_scratch(key, |scr| run_item(path, &ps[item.pi], tiles, item, scr, sink));
    });
    amx_report(path);
    let (part_o, part_lse) = (&part_o, &part_lse);
    rt.par_iter().zip(&layout).for_each_init(
        || (vec![0.0f32; dv], Vec::new()),
        |(out, parts), (&(pi, b, kvh, r0, nr, _), &(slot0, splits))| {
            let p = &ps[pi];
            for r in 0..nr {
                parts.clear();
                for sidx in 0..splits {
                    let slot = slot0 + sidx * tiles.br + r;
                    parts.push((&part_o[slot * dv..(slot + 1) * dv], part_lse[slot]));
                }
                let lse = merge_normalized(parts, out);
                let (h, i) = p.row(kvh, r0 + r);
                // SAFETY: each row tile (and so each row) is merged by exactly one task.
                unsafe { p.write_row(b, h, i, out, lse) };
            }
        },
    );
}

#[cfg(test)]
pub(crate) mod tests {
    use super::tail_start;
    use crate::SimdPath;
    use crate::{supported_paths, CpuBackend};
    use sdpa_core::{
        Alibi, AttentionSpec, DType, HostBackend, HostInputs, HostOutput, Kernel, Mask, RunOptions, Shape, Window,
    };
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// Held by every test of this crate's library that runs `fa2`: they flip process-wide switches
    /// ([`WHOLE_EDGE_TILES`], `staged::tests::UNSTAGED`) and count what the kernels did ([`SPLIT_TILES`],
    /// `staged::tests::STAGED_ROWS`), so none may run while another does.
    pub(crate) static FA2_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// Set by [`causal_skip_changes_no_bit`] while it runs the whole-tile side.
    pub(super) static WHOLE_EDGE_TILES: AtomicBool = AtomicBool::new(false);
    /// Edge tiles split into pieces so far, by any test: shows that the shapes reach the skip.
    pub(super) static SPLIT_TILES: AtomicUsize = AtomicUsize::new(0);

    /// Causal calls with the skip and with whole edge tiles agree bit for bit (O and LSE), on shapes that
    /// reach it on every path: AVX2's 48-row items, AVX-512's 64-row items and 128-row ones past 2048 keys,
    /// P·V transposed below D = 64 and row tiles above it, a GQA item across two heads' rows, Sq != Sk both
    /// ways (bottom-right with rows that see no key). A causal call against the same pattern as an explicit
    /// mask would not do: its tiles end elsewhere, so the softmax sums its terms in another order.
    #[test]
    fn causal_skip_changes_no_bit() {
        let _alone = FA2_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        if super::whole_edge_tiles() {
            eprintln!("skipped: SDPA_CPU_CAUSAL_SKIP=0 in the environment takes every edge tile whole");
            return;
        }
        let shapes = [
            Shape { b: 1, hq: 3, hkv: 1, sq: 159, sk: 200, d: 64, dv: 64 },
            Shape { b: 1, hq: 2, hkv: 2, sq: 130, sk: 97, d: 40, dv: 24 },
            Shape { b: 1, hq: 2, hkv: 1, sq: 150, sk: 2100, d: 8, dv: 8 },
            Shape { b: 2, hq: 2, hkv: 1, sq: 77, sk: 77, d: 128, dv: 96 },
        ];
        // The masks, and on the first shape a window with a softcap and ALiBi (the modifiers act on scores the
        // band mask then overwrites, left-out ones included).
        let specs = |shape: Shape, dtype| {
            let mut v: Vec<AttentionSpec> = [Mask::CausalTopLeft, Mask::CausalBottomRight]
                .into_iter()
                .map(|m| AttentionSpec::new(shape, dtype).with_mask(m))
                .collect();
            if shape == shapes[0] {
                let causal = AttentionSpec::new(shape, dtype).with_mask(Mask::CausalBottomRight);
                v.push(causal.clone().with_window(Window::left(50)).with_softcap(20.0));
                v.push(causal.with_alibi(Alibi::Standard));
            }
            v
        };
        // Restores the skip even when a run panics, so that no other test loses it.
        struct Whole;
        impl Drop for Whole {
            fn drop(&mut self) {
                WHOLE_EDGE_TILES.store(false, Ordering::Relaxed);
            }
        }
        let opts = RunOptions { kernel: Kernel::Fa2, lse: true, ..Default::default() };
        let mut checked = 0;
        for path in supported_paths() {
            let be = CpuBackend::with_simd(path, Some(2)).expect("a supported path builds");
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                let mut split = false;
                for spec in shapes.into_iter().flat_map(|shape| specs(shape, dtype)) {
                    let inputs = HostInputs::random(&spec, 29).expect("valid spec");
                    let label = format!("{path} {dtype} {} {:?} {:?}", spec.shape, spec.mask, spec.variants);
                    let run = |whole: bool| {
                        WHOLE_EDGE_TILES.store(whole, Ordering::Relaxed);
                        let _restore = Whole;
                        be.run_host(&spec, &opts, &inputs).unwrap_or_else(|e| panic!("{label}: {e}")).output
                    };
                    let before = SPLIT_TILES.load(Ordering::Relaxed);
                    let a = run(false);
                    split |= SPLIT_TILES.load(Ordering::Relaxed) > before;
                    let b = run(true);
                    // `==` takes -0 and +0 as equal (a skipped row may keep -0 where a product made +0);
                    // NaN, the poison of an element left unwritten, fails.
                    assert_same_output(&label, &a, &b, |u, v| u == v);
                    checked += 1;
                }
                // Every kernel splits but the AMX one (bf16 and f16 on that path), which takes whole tiles.
                // (The count is global: no other test that runs fa2 runs meanwhile, `FA2_TESTS`.)
                let amx = path == SimdPath::Amx && dtype != DType::F32;
                assert!(split || amx, "{path} {dtype}: no edge tile was split");
            }
        }
        assert!(checked >= 36, "{checked}");
    }

    /// Asserts that two runs' O and LSE (requested) agree element by element under `eq`.
    pub(crate) fn assert_same_output(label: &str, a: &HostOutput, b: &HostOutput, eq: fn(f32, f32) -> bool) {
        let same = |what: &str, x: &[f32], y: &[f32]| {
            let at = x.iter().zip(y).position(|(u, v)| !eq(*u, *v));
            assert!(at.is_none(), "{label}: {what}[{at:?}] {:?} against {:?}", at.map(|i| x[i]), at.map(|i| y[i]));
        };
        same("O", &a.o.to_f32_vec(), &b.o.to_f32_vec());
        same("LSE", a.lse.as_deref().expect("lse"), b.lse.as_deref().expect("lse"));
    }

    #[test]
    fn skipped_rows_round_down_to_whole_tiles_of_the_rest() {
        // 12 vectors, 5 skippable, pairs: 7 left -> 8 computed from vector 4.
        assert_eq!(tail_start(12, 5, 2), 4);
        assert_eq!(tail_start(12, 4, 2), 4);
        // 48 rows, 16 skippable, six-row tiles: 32 left -> 36 computed from row 12.
        assert_eq!(tail_start(48, 16, 6), 12);
        // Nothing skippable, or a rest that rounds up past the total: everything.
        assert_eq!(tail_start(48, 0, 6), 0);
        assert_eq!(tail_start(5, 2, 4), 1);
        assert_eq!(tail_start(3, 1, 4), 0);
        // Everything skippable (callers never ask: the last vector is never done): nothing.
        assert_eq!(tail_start(3, 9, 4), 3);
        // What the pieces rely on: the start never passes `skip`, grows with it, and leaves whole tiles.
        for unit in 1..=8 {
            for total in 1..=40 {
                let mut last = 0;
                for skip in 0..total {
                    let start = tail_start(total, skip, unit);
                    assert!(start <= skip && start >= last, "{total} {skip} {unit}");
                    assert!(start == 0 || (total - start).is_multiple_of(unit), "{total} {skip} {unit}");
                    last = start;
                }
            }
        }
    }
}
