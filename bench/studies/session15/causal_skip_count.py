"""Share of a causal call's score and P·V products that sdpa-cpu's fa2 skips above the diagonal (session 15,
`vectors_done_before` and `tail_start` in sdpa-cpu/src/fa2/mod.rs), counted by walking the tiles as the
kernel does: items of `br` rows, key tiles of 64 from key 0 to the item's reach, query vectors of `lanes`
rows; a tile that crosses the band's edge goes by pieces of 12 keys (`SKIP_PIECE`), each leaving out the
leading vectors (never the last) whose rows all end at or before the piece's first key, rounded down to
whole register tiles of the rest (scores: pairs of vectors; P·V: `PV_ROWS` rows). Scores and P·V weigh the
same (D = Dv). Causal top-left, Sq = Sk = S; a count of products, not a timing.
`--piece 64` counts whole tiles only (this session's first version).

    python3 bench/studies/session15/causal_skip_count.py [--piece 64]
"""
import argparse

ap = argparse.ArgumentParser()
ap.add_argument("--piece", type=int, default=12, help="keys per piece on tiles that cross the edge")
args = ap.parse_args()
BC = 64


def tail_start(total, skip, unit):
    rest = total - min(skip, total)
    return total - min(-(-rest // unit) * unit, total)


def skipped_share(s, br, lanes, pv_rows, piece):
    total = skipped = 0
    for r0 in range(0, s, br):
        nr = min(br, s - r0)
        nqv = -(-nr // lanes)
        reach = r0 + nr  # one past the last key any row of the item sees
        for j0 in range(0, reach, BC):
            j1 = min(j0 + BC, reach)
            edge = j1 > r0 + 1  # the tile reaches a key the item's first row does not see
            step = piece if edge else j1 - j0
            for ja in range(j0, j1, step):
                nk = min(ja + step, j1) - ja
                done = 0
                if edge:
                    for v in range(nqv - 1):
                        rows = range(r0 + v * lanes, min(r0 + (v + 1) * lanes, r0 + nr))
                        if all(i + 1 <= ja for i in rows):
                            done += 1
                        else:
                            break
                total += 2 * nk * nr
                skipped += nk * (tail_start(nqv, done, 2) * lanes) * nr / (nqv * lanes)  # score lanes, real rows' share
                skipped += nk * tail_start(nr, done * lanes, pv_rows)
    return skipped / total


paths = [("AVX2, 48-row items", 48, 8, 6), ("AVX-512, 64-row items (S < 2048)", 64, 16, 8),
         ("AVX-512, 128-row items (S >= 2048)", 128, 16, 8)]
print("S     " + "  ".join(f"{name:>36}" for name, *_ in paths))
for s in (512, 1024, 2048, 4096):
    print(f"{s:<5} " + "  ".join(f"{100 * skipped_share(s, br, l, pv, args.piece):35.1f}%" for _, br, l, pv in paths))
