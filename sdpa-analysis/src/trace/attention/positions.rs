//! Masks built from positions: what the ops that built a mask say about it.
//!
//! A mask's values are never in a trace, but the ops that compute it from query and key positions are, with
//! their literal integers in `Concrete Inputs`. FlexAttention's `create_block_mask` evaluates the `mask_mod`
//! over every (query, key) pair, and eager models build their additive masks the same way, so the
//! comparisons over `[.., Sq, Sk]` position grids that run shortly before an attention call show its shape:
//!
//! - causal: `q >= k` / `k <= q` (a comparison of two position tensors that broadcast to `[Sq, Sk]`), or
//!   `q - k >= 0` (a comparison of the difference grid with `0`);
//! - a window of `W` keys back: `q - k <= W` (`le` with `W` on the difference grid; `lt` gives `W - 1`), or
//!   transformers' `kv > q - W` (a `sub` of `W` from a position tensor, then `gt`, giving `W - 1`; `ge`, `W`).
//!
//! The direction of a difference is not recorded (`q - k` and `k - q` look alike), so a window constant is read
//! as keys before the diagonal, as every sliding-window model uses it, and only together with causal evidence.
//! Whatever is read this way is an inference, and the calls that use it say so in their notes.

use crate::trace::tree::OpTree;

/// What the position ops before a call showed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Evidence {
    /// A causal comparison was seen.
    pub causal: bool,
    /// A window of this many keys back was seen.
    pub window: Option<usize>,
    /// The ops that showed it, for notes (`aten::le(.., 256)`).
    pub ops: Vec<String>,
}

impl Evidence {
    /// A causal window (`Some(left)`) when both a causal comparison and a window constant were seen.
    pub fn causal_window(&self) -> Option<usize> {
        self.window.filter(|_| self.causal)
    }

    /// `causal`, `causal, 256 keys back`, with the ops, for notes.
    pub fn describe(&self) -> String {
        let what = match self.causal_window() {
            Some(w) => format!("causal, a window of {w} keys back"),
            None if self.causal => "causal".to_string(),
            None => "no causal comparison".to_string(),
        };
        format!("{what} (from {})", self.ops.join(", "))
    }
}

fn cmp_kind(name: &str) -> Option<&'static str> {
    Some(match name {
        "aten::le" => "le",
        "aten::lt" => "lt",
        "aten::ge" => "ge",
        "aten::gt" => "gt",
        _ => return None,
    })
}

/// Broadcast of two dims lists (numpy rules), `None` when they do not broadcast.
fn broadcast(a: &[i64], b: &[i64]) -> Option<Vec<i64>> {
    let n = a.len().max(b.len());
    let at = |d: &[i64], i: usize| if i + d.len() >= n { d[i + d.len() - n] } else { 1 };
    (0..n)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y || y == 1 => Some(x),
            (1, y) => Some(y),
            _ => None,
        })
        .collect()
}

/// True when `dims` ends in the `[Sq, Sk]` grid of every (query, key) pair.
fn is_grid(dims: &[i64], sq: usize, sk: usize) -> bool {
    dims.len() >= 2 && dims[dims.len() - 2] == sq as i64 && dims[dims.len() - 1] == sk as i64
}

fn int_type(t: Option<&str>) -> bool {
    t.is_some_and(|t| t.contains("int") || t.contains("long"))
}

/// How far back (in ops) to look for a mask's construction.
const LOOKBACK: usize = 4000;

/// Reads the position comparisons before the op at position `to` of thread `thread`'s pre-order list, back
/// to the previous attention: an op for which `boundary` holds (another call's op) or a softmax (an eager
/// call), so one call's mask is never read as the next one's.
pub fn evidence(
    tree: &OpTree<'_>,
    thread: u32,
    to: usize,
    sq: usize,
    sk: usize,
    boundary: impl Fn(u32) -> bool,
) -> Evidence {
    let mut ev = Evidence::default();
    let Some(list) = tree.thread_ops.get(thread as usize) else { return ev };
    let ops = &tree.trace.ops;
    let to = to.min(list.len());
    let mut from = to;
    while from > 0 && to - from < LOOKBACK {
        let o = list[from - 1];
        if boundary(o) || matches!(tree.name(o), "aten::softmax" | "aten::_softmax" | "aten::_safe_softmax") {
            break;
        }
        from -= 1;
    }
    let mut sub_const: Option<i64> = None;
    for &o in &list[from..to] {
        let name = tree.name(o);
        let Some(args) = ops[o as usize].args.as_deref() else { continue };
        if name == "aten::sub" && int_type(args.ty(0)) && args.ty(1) == Some("Scalar") {
            sub_const = args.concrete(1).and_then(|c| c.trim().parse::<i64>().ok()).filter(|&w| w > 0);
            continue;
        }
        let Some(kind) = cmp_kind(name) else { continue };
        let (Some(a), ty1) = (args.dim(0), args.ty(1)) else { continue };
        if ty1 == Some("Scalar") {
            // The difference grid against a literal.
            let Some(c) = args.concrete(1).and_then(|c| c.trim().parse::<i64>().ok()) else { continue };
            if !is_grid(a, sq, sk) || !int_type(args.ty(0)) {
                continue;
            }
            match (kind, c) {
                ("ge" | "le", 0) => ev.causal = true,
                ("le", w) if w > 0 => ev.window = Some(w as usize),
                ("lt", w) if w > 1 => ev.window = Some(w as usize - 1),
                _ => continue,
            }
            push_unique(&mut ev.ops, format!("{name}(.., {c})"));
        } else {
            // Two position tensors that broadcast to the grid.
            let Some(b) = args.dim(1) else { continue };
            if !int_type(args.ty(0)) || !int_type(ty1) || !broadcast(a, b).is_some_and(|d| is_grid(&d, sq, sk)) {
                continue;
            }
            match (kind, sub_const) {
                ("gt", Some(w)) if w > 1 => ev.window = Some(w as usize - 1),
                ("ge", Some(w)) => ev.window = Some(w as usize),
                ("ge" | "le", None) => ev.causal = true,
                _ => continue,
            }
            let what = sub_const.map(|w| format!("{name} after aten::sub(.., {w})")).unwrap_or(name.to_string());
            push_unique(&mut ev.ops, what);
        }
    }
    ev
}

fn push_unique(list: &mut Vec<String>, s: String) {
    if !list.contains(&s) {
        list.push(s);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast(&[2048, 1], &[2048]), Some(vec![2048, 2048]));
        assert_eq!(broadcast(&[1, 8], &[3, 1]), Some(vec![3, 8]));
        assert_eq!(broadcast(&[3], &[4]), None);
        assert!(is_grid(&[1, 1, 512, 1024], 512, 1024));
        assert!(!is_grid(&[1024, 512], 512, 1024));
    }
}
