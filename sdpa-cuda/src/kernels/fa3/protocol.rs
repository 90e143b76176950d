//! Models of `fa3`'s device-side bookkeeping, checked without a GPU: the key-tile ranges a work tile and
//! each consumer warpgroup take under a band (against sdpa-core's band, by brute force), and the protocol of
//! the K/V ring, the Q buffers, the work-tile ring and the ping-pong turns, run under random interleavings
//! for deadlocks and miscounts (plain, variant and per-tile-turn entries; 2 and 3 consumers; rings 1 to 4);
//! for ragged batches, the work tiles over (sequence, head, query tile), each sequence's key ranges and the
//! ring across tiles of different sequences, and the paged entries' boxes (page and slot of every key).

use super::*;
use sdpa_core::Shape;

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
                    let spec = AttentionSpec::new(Shape { b: 1, hq: 1, hkv: 1, sq, sk, d: 64, dv: 64 }, DType::BF16)
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

/// One step of the protocol between the producer's thread, the consumer warpgroups and (FP8) the transposing
/// warps, as fa3.cu issues them (barrier arrivals and waits only; what the copies and products do is not
/// modelled). Kinds of mbarrier pairs: K (0) and V (1) ring slots, each consumer's Q buffer (2), the work-tile
/// ring (3), FP8's staged V tiles (4).
#[derive(Debug, Clone, Copy)]
enum Op {
    /// Producer: wait until the consumers released use `u` of slot `s` of kind `k` (`(k, s, u)`).
    WaitEmpty(usize, usize, usize),
    /// Producer: fill use `u` of a slot (its `full` barrier completes).
    Fill(usize, usize, usize),
    /// Consumer (or the transposing warps): wait until use `u` of a slot landed.
    WaitFull(usize, usize, usize),
    /// Consumer (or the transposing warps): arrive on the `empty` barrier of use `u` of a slot.
    Release(usize, usize, usize),
    /// `bar.sync b, 256` (a turn begins) and `bar.arrive b, 256` (a turn is handed on).
    Sync(usize),
    Arrive(usize),
}

/// The ops of one block running `tiles` with ring depth `st`, `nc` consumers, ping-pong or not, and the
/// turns restarted at every work tile or not (`tt`: FA3_XO_TILE_TURNS): the producer's, then each
/// consumer's, in program order. The work-tile ring carries the tiles and then the end (-1).
fn protocol(tiles: &[ModelTile], st: usize, nc: usize, pp: bool, tt: bool) -> Vec<Vec<Op>> {
    protocol_staged(tiles, st, nc, pp, tt, 0)
}

/// [`protocol`] with `sv` staged V tiles (FP8's transpose in the kernel, `Fa3Smem::SV`; 0: none): the
/// producer loads V into the staging ring, and a last agent, the transposing warps, takes the work tiles as
/// the consumers do and moves each staged tile into the V ring once the consumers released its slot.
fn protocol_staged(tiles: &[ModelTile], st: usize, nc: usize, pp: bool, tt: bool, sv: usize) -> Vec<Vec<Op>> {
    let mut prod = Vec::new();
    // The consumers' ops, then the transposing warps' (which take the work-tile ring too).
    let mut cons = vec![Vec::new(); nc + usize::from(sv > 0)];
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
            if sv == 0 {
                load(&mut prod, 1, j);
            } else {
                // fa3_produce_tile's load_v into the staging ring; the transposing warps fill the V slot.
                let (s, u) = ((ring + j) % sv, (ring + j) / sv);
                if u > 0 {
                    prod.push(Op::WaitEmpty(4, s, u - 1));
                }
                prod.push(Op::Fill(4, s, u));
                let (sj, uj) = at(j);
                let vt = &mut cons[nc];
                vt.push(Op::WaitFull(4, s, u));
                if uj > 0 {
                    vt.push(Op::WaitEmpty(1, sj, uj - 1));
                }
                vt.extend([Op::Fill(1, sj, uj), Op::Release(4, s, u)]);
            }
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
                ops.extend([Op::WaitFull(0, s, u), Op::Release(0, s, u), Op::WaitFull(1, s, u), Op::Release(1, s, u)]);
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
    // The end (-1); then fa3_end_turns: warpgroup 0 takes the last hand-over (none left with the turns restarted
    // per tile).
    sched(&mut prod, &mut cons, tiles.len());
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
fn run_protocol(ops: &[Vec<Op>], st: usize, seed: u64) -> Result<(), String> {
    run_protocol_staged(ops, st, 0, seed)
}

/// [`run_protocol`] for [`protocol_staged`]'s ops with `sv` staged V tiles: the last agent is then the
/// transposing warps, which alone release the staging ring and count among those that release the work-tile
/// ring.
fn run_protocol_staged(ops: &[Vec<Op>], st: usize, sv: usize, mut seed: u64) -> Result<(), String> {
    let vt = usize::from(sv > 0);
    let nc = ops.len() - 1 - vt;
    let slots = |k: usize| match k {
        2 => nc,
        3 => MODEL_SCHED,
        4 => sv,
        _ => st,
    };
    let mut full: Vec<Vec<usize>> = (0..5).map(|k| vec![0; slots(k)]).collect();
    let mut empty = full.clone();
    let mut pending: Vec<Vec<Vec<bool>>> = (0..5).map(|k| vec![vec![false; nc + vt]; slots(k)]).collect();
    let (mut arrivals, mut syncs) = ([0usize; 8], [0usize; 8]);
    let mut pc = vec![0usize; ops.len()];
    loop {
        let ready =
            |a: usize, full: &Vec<Vec<usize>>, empty: &Vec<Vec<usize>>, arrivals: &[usize; 8], syncs: &[usize; 8]| {
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
                // A Q buffer has one consumer, a staged V tile the transposing warps; the K/V slots take every
                // consumer, the work-tile ring every consumer and the transposing warps.
                let need = match k {
                    2 | 4 => 1,
                    3 => nc + vt,
                    _ => nc,
                };
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
    for k in 0..5 {
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
/// (FA3_XO_TILE_TURNS, `SDPA_FA3_AB=tile-turns`); and one consumer without turns.
#[test]
fn the_plain_and_tile_turn_rings_neither_deadlock_nor_miscount() {
    let mut runs = 0;
    for (sq, sk) in [(77, 300), (300, 77), (129, 129), (513, 1000), (700, 200), (1000, 650)] {
        let (sq, sk) = (sq as i64, sk as i64);
        for causal in [None, Some(0), Some(sk - sq)] {
            // One consumer: the measurement tile `SDPA_FA3_TILE=bn,stages,1` (no turns: nothing to take them with).
            for nc in [1i64, 2, 3] {
                for bn in [64i64, 128, 176] {
                    let all: Vec<_> = (0..(sq + 64 * nc - 1) / (64 * nc))
                        .rev()
                        .map(|mb| plain_model_tile(causal, sq, sk, bn, 64 * nc * mb, nc))
                        .collect();
                    for tiles in model_sequences(&all, 8) {
                        for st in 1..=4 {
                            for (pp, tt) in [(true, false), (true, true), (false, false)] {
                                if pp && nc == 1 {
                                    continue;
                                }
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

/// Runs FP8's staged-V protocol over sequences of `all`'s work tiles (`nc` consumers, ping-pong) at ring depths
/// 1 to `st_max` and one or two staged slots, under four interleavings each; panics naming `what` and the
/// configuration on the first deadlock or miscount. Returns the runs made.
fn run_staged_sequences(all: &[ModelTile], nc: usize, st_max: usize, what: &str) -> usize {
    let mut runs = 0;
    for tiles in model_sequences(all, 8) {
        for st in 1..=st_max {
            for sv in 1..=2 {
                let ops = protocol_staged(&tiles, st, nc, true, false, sv);
                for seed in 0..4 {
                    if let Err(e) = run_protocol_staged(&ops, st, sv, seed) {
                        panic!("{what} NC {nc} ST {st} SV {sv} tiles {tiles:?}: {e}");
                    }
                    runs += 1;
                }
            }
        }
    }
    runs
}

/// FP8's transpose in the kernel, simulated as the plain entries are
/// (`the_plain_and_tile_turn_rings_neither_deadlock_nor_miscount`): the producer loads V into one or two staged
/// slots, the transposing warps take the work tiles and fill the V ring once its slot is released, beside no
/// mask and causal masks of both alignments, two or three consumers, 128-key tiles, ring depths 1 to 4,
/// ping-pong (every FP8 entry has it).
#[test]
fn the_fp8_staged_v_ring_neither_deadlocks_nor_miscounts() {
    let mut runs = 0;
    for (sq, sk) in [(77, 300), (300, 77), (129, 129), (513, 1000), (700, 200), (1000, 650)] {
        let (sq, sk) = (sq as i64, sk as i64);
        for causal in [None, Some(0), Some(sk - sq)] {
            for nc in [2i64, 3] {
                let all: Vec<_> = (0..(sq + 64 * nc - 1) / (64 * nc))
                    .rev()
                    .map(|mb| plain_model_tile(causal, sq, sk, 128, 64 * nc * mb, nc))
                    .collect();
                runs += run_staged_sequences(&all, nc as usize, 4, &format!("Sq {sq} Sk {sk} causal {causal:?}"));
            }
        }
    }
    assert!(runs > 2000, "{runs}");
}

/// FP8's transpose in the kernel under a band (session 24's FP8 variant entries): the staged-V ring of
/// `the_fp8_staged_v_ring_neither_deadlocks_nor_miscounts` with the work tiles of windows (key ranges that start
/// past the first tile, so consumers release leading tiles unread; rows with no key), two consumers (FP8's
/// variant tile), 128-key tiles, ring depths 1 to 3, one or two staged slots, ping-pong.
#[test]
fn the_fp8_staged_v_ring_under_a_band_neither_deadlocks_nor_miscounts() {
    use sdpa_core::variants::{Diagonal, Window};
    let mut runs = 0;
    for (sq, sk) in [(300, 200), (513, 1000), (1000, 650), (2000, 1000)] {
        for (left, right, mask) in [
            (Some(5), Some(0), Mask::CausalBottomRight),
            (Some(150), Some(0), Mask::None),
            (Some(64), Some(64), Mask::None),
            (Some(600), Some(0), Mask::None),
            (Some(2), Some(0), Mask::None),
        ] {
            let spec = AttentionSpec::new(Shape { b: 1, hq: 1, hkv: 1, sq, sk, d: 128, dv: 128 }, DType::F8E4M3)
                .with_mask(mask)
                .with_window(Window { left, right })
                .with_diagonal(Diagonal::BottomRight);
            let (lo, hi) = spec.band().clamped(sq, sk);
            let nc = 2i64;
            let all: Vec<_> = (0..(sq as i64 + 64 * nc - 1) / (64 * nc))
                .rev()
                .map(|mb| model_tile(lo, hi, sq as i64, sk as i64, 128, 64 * nc * mb, nc))
                .collect();
            runs += run_staged_sequences(&all, nc as usize, 3, &format!("Sq {sq} Sk {sk} window {left:?},{right:?}"));
        }
    }
    assert!(runs > 1000, "{runs}");
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

/// The plain entries' key ranges for one sequence of `sq` rows and `sk` keys (no mask, or causal with that
/// offset), checked by brute force as `model_check` checks the band's: every key a row sees lies in a tile
/// its warpgroup computes, and the tiles its unmasked loop runs (1 .. j_plain, `fa3_consume_tile`) and those
/// a warp's `edge` test passes are wholly visible to the rows concerned, so no key at or past Sk (for a
/// ragged batch: the next sequence's, which TMA loads) reaches a row unmasked.
fn plain_check(causal: Option<i64>, sq: i64, sk: i64, bn: i64, nc: i64) -> usize {
    let visible = |i: i64, k: i64| k < sk && causal.is_none_or(|co| k <= i + co);
    let mut checked = 0;
    for m0 in (0..sq).step_by(64 * nc as usize) {
        let (n, wgs) = plain_model_tile(causal, sq, sk, bn, m0, nc);
        for (wgi, range) in wgs.iter().enumerate() {
            let Some((ja, je)) = *range else { continue };
            let r0 = m0 + 64 * wgi as i64;
            let r1 = (r0 + 63).min(sq - 1);
            assert!(0 <= ja && ja <= je && je <= n);
            for i in r0..=r1 {
                for k in 0..sk {
                    if visible(i, k) {
                        assert!(k < je * bn, "row {i} key {k} past the computed tiles ({je} of {bn})");
                    }
                }
            }
            let mut j_mask = sk / bn;
            if let Some(co) = causal {
                j_mask = j_mask.min(((r0 + co + 1) / bn).max(0));
            }
            let j_plain = j_mask.min(je).max(1);
            for j in 1..j_plain {
                for i in r0..=r1 {
                    for k in j * bn..(j + 1) * bn {
                        assert!(visible(i, k), "unmasked tile {j}: row {i} key {k}");
                    }
                }
                checked += 1;
            }
            for w0 in (r0..=r1).step_by(16) {
                for j in 0..je {
                    let n0 = j * bn;
                    let edge = n0 + bn > sk || causal.is_some_and(|co| n0 + bn - 1 > w0 + co);
                    if !edge {
                        for i in w0..(w0 + 16).min(sq) {
                            assert!((n0..n0 + bn).all(|k| visible(i, k)), "warp tile {j} row {i}");
                        }
                    }
                    checked += 1;
                }
            }
        }
    }
    checked
}

/// Ragged batches (`FA3_SERVE_VARLEN`): the work tiles the kernel enumerates (fa2's schedule of (sequence,
/// query tile) pairs times the heads: work tile w is entry w / Hq, head w % Hq, `fa3_varlen_tile`) are every
/// (sequence, head, query tile) with rows exactly once and none of a sequence without rows, heaviest first
/// (by the key tiles the kernel loads); each tile's key ranges, by the dense models on its sequence's own
/// lengths, causal offset (its diagonal) and band, hold every key its rows see and mask every key past the
/// sequence's end; and blocks running tiles of different sequences in turn keep the ring and the turns
/// (`run_protocol`: sequences with no key give tiles with no key tile, short ones consumers with no rows).
#[test]
fn ragged_work_tiles_cover_each_sequence_once_and_keep_the_ring_and_turns() {
    use sdpa_core::variants::{Diagonal, Window};
    use sdpa_core::{Layout, Ragged};
    let batches: [(Vec<usize>, Vec<usize>); 3] = [
        (vec![0, 1, 77, 300, 129, 64, 513], vec![5, 1, 300, 77, 0, 4096, 1000]),
        (vec![1, 1, 1, 200], vec![0, 700, 129, 130]),
        (vec![257, 0, 0, 31], vec![257, 0, 9, 31]),
    ];
    let (mut runs, mut checked) = (0usize, 0usize);
    for (q, k) in batches {
        let r = Ragged::new(q.clone(), k.clone());
        let (max_q, max_k) = (r.max_q().max(1), r.max_k().max(1));
        for (mask, window) in [
            (Mask::None, None),
            (Mask::CausalTopLeft, None),
            (Mask::CausalBottomRight, None),
            (Mask::CausalBottomRight, Some(Window { left: Some(40), right: Some(0) })),
            (Mask::None, Some(Window { left: Some(100), right: Some(7) })),
        ] {
            for (d, hq) in [(64, 4), (256, 3)] {
                let shape = Shape { b: q.len(), hq, hkv: 1, sq: max_q, sk: max_k, d, dv: d };
                let mut spec = AttentionSpec::new(shape, DType::BF16).with_mask(mask);
                if let Some(w) = window {
                    spec = spec.with_window(w).with_diagonal(Diagonal::BottomRight);
                }
                let spec = spec.with_ragged(r.clone(), Layout::Bshd);
                let variant = !spec.variants.is_plain();
                let tile =
                    if variant { variant_tile_for(d, d) } else { ragged_tile_for(d, d, mask.is_causal(), max_k) };
                let (rows, bn, nc) = (tile.rows() as i64, tile.bn as i64, tile.consumers as i64);
                let pairs: Vec<(usize, i64)> = super::super::fa2::schedule(&spec, tile.rows(), tile.bn)
                    .chunks(2)
                    .map(|c| (c[0] as usize, c[1] as i64))
                    .collect();
                // The kernel's tile of each work index, and its model.
                let mut seen = std::collections::HashSet::new();
                let mut tiles = Vec::new();
                for w in 0..pairs.len() * hq {
                    let ((b, mb), h) = (pairs[w / hq], w % hq);
                    assert!(seen.insert((b, h, mb)), "work tile ({b}, {h}, {mb}) twice");
                    let (sq, sk) = (q[b] as i64, k[b] as i64);
                    assert!(mb * rows < sq, "a tile past sequence {b}'s rows");
                    let model = if variant {
                        let (lo, hi) = spec.band_for(q[b], k[b]).clamped(q[b], k[b]);
                        model_tile(lo, hi, sq, sk, bn, mb * rows, nc)
                    } else {
                        let diag = if mask == Mask::CausalBottomRight { sk - sq } else { 0 };
                        plain_model_tile(mask.is_causal().then_some(diag), sq, sk, bn, mb * rows, nc)
                    };
                    tiles.push(model);
                }
                let expected: usize = q.iter().map(|&x| x.div_ceil(tile.rows())).sum::<usize>() * hq;
                assert_eq!(seen.len(), expected, "every (sequence, head, query tile) once");
                assert!(
                    tiles.windows(2).all(|t| t[0].0 >= t[1].0),
                    "heaviest first: {:?}",
                    tiles.iter().map(|t| t.0).collect::<Vec<_>>()
                );
                // Each sequence's key ranges, as a dense call of its own lengths.
                for (&sq, &sk) in q.iter().zip(&k) {
                    let (sqi, ski) = (sq as i64, sk as i64);
                    if variant {
                        let band = spec.band_for(sq, sk);
                        let (lo, hi) = band.clamped(sq, sk);
                        let keys = |lo: i64, hi: i64, sk: i64, a: i64, b: i64| {
                            ((a + lo).clamp(0, sk), (b + hi + 1).clamp(0, sk))
                        };
                        checked += model_check(&band, lo, hi, sqi, ski, bn, nc, &keys);
                    } else {
                        let diag = if mask == Mask::CausalBottomRight { ski - sqi } else { 0 };
                        checked += plain_check(mask.is_causal().then_some(diag), sqi, ski, bn, nc);
                    }
                }
                // Blocks running the tiles of several sequences in turn.
                for seq in model_sequences(&tiles, 10) {
                    for st in 1..=3 {
                        let ops = protocol(&seq, st, nc as usize, true, false);
                        for seed in 0..3 {
                            if let Err(e) = run_protocol(&ops, st, seed) {
                                panic!("{q:?} {k:?} {mask:?} {window:?} D {d} ST {st} tiles {seq:?}: {e}");
                            }
                            runs += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(runs > 500 && checked > 1000, "{runs} {checked}");
}

/// The paged entries' boxes (fa3.cu `fa3_produce_tile`'s `boxes` with FA3_SERVE_PAGED), by brute force:
/// for every key tile of a sequence, box i of min(BN, page size) keys starts at slot key % page size of page
/// column key / page size and stays inside that page, the boxes of a tile fill its BN rows once each in key
/// order, and each key below the sequence's length lands in its tile row from its own page and slot (keys
/// past it read a clamped column, masked by the kernel).
#[test]
fn paged_boxes_load_each_key_from_its_own_page_and_slot() {
    let mut checked = 0usize;
    for bn in [64usize, 80, 112, 128] {
        for ps in (8..=512).step_by(8).filter(|&ps| pages_fit(bn, ps)) {
            let pb = bn.min(ps);
            for sk in [1usize, 7, 79, 128, 129, 300, 1000] {
                let max_pages = sk.div_ceil(ps);
                for t in 0..sk.div_ceil(bn) {
                    let mut rows = vec![None; bn];
                    for i in (0..bn).step_by(pb) {
                        let key = t * bn + i;
                        let (column, slot) = ((key / ps).min(max_pages - 1), key % ps);
                        assert!(slot + pb <= ps, "BN {bn} page {ps}: a box of {pb} from slot {slot} leaves its page");
                        for r in 0..pb {
                            assert!(rows[i + r].is_none(), "row {} twice", i + r);
                            rows[i + r] = Some((column, slot + r));
                        }
                    }
                    for (r, got) in rows.iter().enumerate() {
                        let key = t * bn + r;
                        let got = got.unwrap_or_else(|| panic!("BN {bn} page {ps}: row {r} not loaded"));
                        if key < sk {
                            assert_eq!(got, (key / ps, key % ps), "BN {bn} page {ps} key {key}");
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 10_000, "{checked}");
}
