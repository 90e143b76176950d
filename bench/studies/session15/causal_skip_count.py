"""Share of a causal call's score and P·V products that sdpa-cpu's fa2 skips for query vectors above the
diagonal (session 15, `vectors_done_before` in sdpa-cpu/src/fa2/mod.rs), counted by walking the tiles as the
kernel does: items of `br` rows, key tiles of `bc` from key 0 to the item's reach, query vectors of `L` rows;
a tile starting at key j0 skips the leading vectors (never the last) whose rows all end at or before j0.
`--piece P` counts what the same rule would skip on pieces of P keys inside each tile instead (not built).
Causal top-left, Sq = Sk = S; a count of products, not a timing.

    python3 bench/studies/session15/causal_skip_count.py [--piece 16]
"""
import argparse

ap = argparse.ArgumentParser()
ap.add_argument("--piece", type=int, default=0, help="count on pieces of this many keys instead of whole tiles")
args = ap.parse_args()


def skipped_share(s, br, bc, lanes, piece=0):
    total = skipped = 0
    for r0 in range(0, s, br):
        nr = min(br, s - r0)
        nqv = -(-nr // lanes)
        reach = r0 + nr  # one past the last key any row of the item sees
        step = piece or bc
        for j0 in range(0, reach, step):
            nk = min(j0 + step, reach) - j0
            total += nk * nqv
            done = 0
            for v in range(nqv - 1):
                rows = range(r0 + v * lanes, min(r0 + (v + 1) * lanes, r0 + nr))
                if all(i + 1 <= j0 for i in rows):
                    done += 1
                else:
                    break
            skipped += nk * done
    return skipped / total


paths = [("AVX2, 48-row items", 48, 64, 8), ("AVX-512, 64-row items (S < 2048)", 64, 64, 16),
         ("AVX-512, 128-row items (S >= 2048)", 128, 64, 16)]
print("S     " + "  ".join(f"{name:>36}" for name, *_ in paths))
for s in (512, 1024, 2048, 4096):
    print(f"{s:<5} " + "  ".join(f"{100 * skipped_share(s, br, bc, l, args.piece):35.1f}%" for _, br, bc, l in paths))
