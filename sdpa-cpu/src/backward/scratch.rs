//! Per-worker scratch of the backward kernel: sized by the tiles and head dims, never by the sequence
//! length (O(threads × tile) in total), kept by each worker thread across items and calls of one shape.

use crate::fa2::lanes;
use crate::problem::round_up;
use crate::simd::SimdPath;
use std::cell::RefCell;

/// Tile sizes of the backward on one SIMD path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BwdTiles {
    /// Query rows per row tile (a multiple of the path's lanes).
    pub br: usize,
    /// Keys per key tile; key tiles lie on one grid `kt·bc` in both passes.
    pub bc: usize,
    /// Key tiles per pass-2 item: each query tile is packed once for all of them. Any value gives the same
    /// bits (each key tile still sums the query tiles in their order), so it may follow the thread count.
    pub kblock: usize,
}

impl BwdTiles {
    /// Tiles for a path: a pair's score tiles (`bc × br`) stay in L1; a pass-2 block's accumulators and
    /// widened K/V (`kblock·bc` rows of dK, dV, K, V) and the packed query tile (Q and dO, both ways round)
    /// stay within L2 at head dim 128.
    pub(crate) fn for_path(path: SimdPath) -> BwdTiles {
        match path {
            SimdPath::Amx | SimdPath::Avx512 | SimdPath::Avx512Bf16 => BwdTiles { br: 64, bc: 64, kblock: 4 },
            SimdPath::Avx2 => BwdTiles { br: 32, bc: 64, kblock: 4 },
            SimdPath::Scalar => BwdTiles { br: 16, bc: 32, kblock: 1 },
        }
    }

    /// The same tiles with pass-2 blocks no longer than leaves every thread four items of `key_tiles`.
    pub(crate) fn for_threads(self, key_tiles: usize, threads: usize) -> BwdTiles {
        BwdTiles { kblock: self.kblock.min(key_tiles / (4 * threads.max(1))).max(1), ..self }
    }
}

/// What a worker's scratch was sized for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BwdKey {
    pub path: SimdPath,
    pub tiles: BwdTiles,
    pub d: usize,
    pub dv: usize,
}

/// One worker's buffers. Query-tile buffers hold `brp` rows (the tile height rounded to the lanes),
/// key-tile buffers `bc` keys; rows of head-dim width are padded to `dp`/`dvp` (whole vectors).
#[derive(Debug)]
pub(crate) struct BwdScratch {
    /// Qᵀ scaled, `[d][brp]` (the score product).
    pub qt: Vec<f32>,
    /// Q scaled, `[brp][dp]` (dK += dSᵀ·Q).
    pub qr: Vec<f32>,
    /// dOᵀ, `[dv][brp]` (dP = dO·Vᵀ).
    pub dot: Vec<f32>,
    /// dO, `[brp][dvp]` (dV += Pᵀ·dO).
    pub dor: Vec<f32>,
    /// Sᵀ, then Pᵀ, `[bc][brp]`.
    pub st: Vec<f32>,
    /// dPᵀ, then dSᵀ (with the softcap's factor), `[bc][brp]`.
    pub dst: Vec<f32>,
    /// The capped scores before ALiBi and the mask, `[bc][brp]` (softcap only).
    pub s0: Vec<f32>,
    /// 1 where a pair is visible, `[bc][brp]` (careful re-runs only).
    pub vis: Vec<f32>,
    /// K and V rows widened to f32 (a pass-2 block or a key tile), `[kblock·bc][dp]` and `[kblock·bc][dvp]`.
    pub kp: Vec<f32>,
    pub vp: Vec<f32>,
    /// Accumulators: dK and dV of a pass-2 block (`[kblock·bc][dp]`, `[kblock·bc][dvp]`), or dQ of a row
    /// tile (`[brp][dp]`).
    pub acc_k: Vec<f32>,
    pub acc_v: Vec<f32>,
    /// Per row of the query tile: the LSE to subtract (`+inf` for a row that sees no key, and for padding,
    /// so its P is exactly 0), Delta = rowsum(dO ∘ O), ALiBi's `−slope` and diagonal.
    pub lse: Vec<f32>,
    pub delta: Vec<f32>,
    pub neg_slope: Vec<f32>,
    pub diag: Vec<f32>,
    /// (query head, position) of each row of the query tile.
    pub rows: Vec<(usize, usize)>,
    /// One widened row.
    pub rowbuf: Vec<f32>,
}

impl BwdScratch {
    fn new(key: BwdKey) -> BwdScratch {
        let l = lanes(key.path);
        let (d, dv, bc) = (key.d, key.dv, key.tiles.bc);
        let block = bc * key.tiles.kblock;
        let (dp, dvp, brp) = (round_up(d, l), round_up(dv, l), round_up(key.tiles.br, l));
        BwdScratch {
            qt: vec![0.0; d * brp],
            qr: vec![0.0; brp * dp],
            dot: vec![0.0; dv * brp],
            dor: vec![0.0; brp * dvp],
            st: vec![0.0; bc * brp],
            dst: vec![0.0; bc * brp],
            s0: vec![0.0; bc * brp],
            vis: vec![0.0; bc * brp],
            kp: vec![0.0; block * dp],
            vp: vec![0.0; block * dvp],
            acc_k: vec![0.0; block.max(brp) * dp],
            acc_v: vec![0.0; block * dvp],
            lse: vec![0.0; brp],
            delta: vec![0.0; brp],
            neg_slope: vec![0.0; brp],
            diag: vec![0.0; brp],
            rows: Vec::with_capacity(brp),
            rowbuf: vec![0.0; d.max(dv)],
        }
    }
}

thread_local! {
    /// Each worker keeps its last scratch, so items (and calls of one shape) reuse it.
    static SCRATCH: RefCell<Option<(BwdKey, BwdScratch)>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's scratch for `key` (rebuilt when the key changed).
pub(crate) fn with_scratch<R>(key: BwdKey, f: impl FnOnce(&mut BwdScratch) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut slot) => {
            if !matches!(&*slot, Some((k, _)) if *k == key) {
                *slot = Some((key, BwdScratch::new(key)));
            }
            match slot.as_mut() {
                Some((_, scr)) => f(scr),
                None => f(&mut BwdScratch::new(key)),
            }
        }
        // Re-entered on this thread (items never call back into rayon): a private scratch.
        Err(_) => f(&mut BwdScratch::new(key)),
    })
}
