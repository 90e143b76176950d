//! Attention ops that run several attention calls inside them: context parallelism (PyTorch's
//! `context_parallel`, ring attention) runs one outer `aten::scaled_dot_product_attention` whose inputs are
//! DTensors with the GLOBAL sequence, and inside it one backend call per ring step on the LOCAL chunks
//! (`aten::_scaled_dot_product_flash_attention` over `[B, H, S/N, D]`), with the K/V exchange between them.
//! Costing the outer op as the global problem would charge one rank with the whole run's work; the steps are
//! the calls that ran.
//!
//! A root is replaced by the attention ops below it when it holds two or more of them side by side, or one
//! whose shape is a local part of the root's (same batch, heads and head dims; shorter Sq or Sk). A plain
//! SDPA -> backend op -> kernel chain keeps its root.

use super::fused::extract_shape;
use super::signature::Signature;
use super::BatchLayout;
use crate::trace::tree::{OpTree, NONE};
use sdpa_core::Shape;

/// A root after splitting, with the note that says where it came from (`None`: the root as it was).
pub(crate) struct Step {
    /// The op that is the call.
    pub root: u32,
    /// Why it stands for a part of its enclosing op.
    pub note: Option<String>,
}

/// Splits each root into the attention calls that ran inside it, where it holds several.
pub(crate) fn split(
    tree: &OpTree<'_>,
    roots: Vec<u32>,
    sig_of: &mut impl FnMut(u32) -> Option<Signature>,
) -> Vec<Step> {
    let mut out = Vec::with_capacity(roots.len());
    for root in roots {
        let (inner, split) = descend(tree, root, sig_of);
        if !split {
            out.push(Step { root, note: None });
            continue;
        }
        let outer = dense_shape(tree, root, sig_of).or_else(|| {
            // An autograd node has no inputs of its own: the global shape is on the backend op below it.
            kids(tree, root, sig_of).first().and_then(|&k| dense_shape(tree, k, sig_of))
        });
        let n = inner.len();
        for r in inner {
            let local = dense_shape(tree, r, sig_of);
            let note = match (outer, local) {
                (Some(g), Some(l)) if g != l => format!(
                    "one step of a context-parallel call: `{}` above it records the global shape {g}, this step \
                     ran on the local shape {l}; the K/V exchange and the merge between steps are not attention \
                     time (see ranks)",
                    tree.name(root)
                ),
                _ => format!("one of {n} attention calls inside `{}`", tree.name(root)),
            };
            out.push(Step { root: r, note: Some(note) });
        }
    }
    out
}

/// The calls inside `x`, and whether that is a split (`false`: `x` itself).
fn descend(tree: &OpTree<'_>, x: u32, sig_of: &mut impl FnMut(u32) -> Option<Signature>) -> (Vec<u32>, bool) {
    let ks = kids(tree, x, sig_of);
    match ks.len() {
        0 => (vec![x], false),
        1 => {
            let (inner, split) = descend(tree, ks[0], sig_of);
            if split {
                return (inner, true);
            }
            let y = inner[0];
            match (dense_shape(tree, x, sig_of), dense_shape(tree, y, sig_of)) {
                (Some(g), Some(l)) if is_local_part(&g, &l) => (vec![y], true),
                _ => (vec![x], false),
            }
        }
        _ => {
            let mut all = Vec::new();
            for k in ks {
                all.extend(descend(tree, k, sig_of).0);
            }
            (all, true)
        }
    }
}

/// The attention ops right below `x`: in its subtree, with no attention op between them and `x`.
fn kids(tree: &OpTree<'_>, x: u32, sig_of: &mut impl FnMut(u32) -> Option<Signature>) -> Vec<u32> {
    let mut out = Vec::new();
    for o in tree.subtree(x).skip(1) {
        if sig_of(o).is_none() {
            continue;
        }
        let mut p = tree.parent[o as usize];
        let mut nested = false;
        while p != NONE && p != x {
            if sig_of(p).is_some() {
                nested = true;
                break;
            }
            p = tree.parent[p as usize];
        }
        if !nested {
            out.push(o);
        }
    }
    out
}

/// The dense shape op `o` records in its own inputs.
fn dense_shape(tree: &OpTree<'_>, o: u32, sig_of: &mut impl FnMut(u32) -> Option<Signature>) -> Option<Shape> {
    let sig = sig_of(o)?;
    let args = tree.trace.ops[o as usize].args.as_deref()?;
    let (s, packing, _) = extract_shape(&sig, args)?;
    (packing.layout == BatchLayout::Dense).then_some(s)
}

/// `l` is a chunk of `g`: the same batch, heads and head dims, no longer sequences, and not all of it.
fn is_local_part(g: &Shape, l: &Shape) -> bool {
    g.b == l.b
        && g.hq == l.hq
        && g.hkv == l.hkv
        && g.d == l.d
        && g.dv == l.dv
        && l.sq <= g.sq
        && l.sk <= g.sk
        && (l.sq, l.sk) != (g.sq, g.sk)
}
