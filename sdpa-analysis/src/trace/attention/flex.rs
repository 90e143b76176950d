//! FlexAttention calls, after [`super::fused`] found them.
//!
//! `torch.compile(flex_attention)` runs as Inductor-generated Triton kernels: a template kernel
//! (`triton_tem_fused_flex_attention_0` forward, `..._flex_attention_backward_N` backward; `flex_decoding` for
//! short queries) launched under a CPU op of the same name whose inputs are the kernel's arguments (Q, K, V
//! `[B, H, S, D]` first, then the LSE, the `BlockMask`'s block counts and indices, the output), inside a
//! `Torch-Compiled Region` and, with autograd, a `CompiledFunction` whose backward is `CompiledFunctionBackward`
//! (same sequence number). The backward also runs a small reduction (`triton_red_..._flex_attention_backward`:
//! the row sums of dO·O) before its template; it belongs to the same call.
//!
//! The `score_mod` (softcap, ALiBi, ...) and the `mask_mod` are compiled into the kernel, so the trace cannot
//! show them in the call. The mask's construction can show, though: `create_block_mask` evaluates the
//! `mask_mod` over every (query, key) pair with ordinary ops just before the call when a model builds its
//! masks per forward ([`super::positions`]). A causal or windowed mask read there sets the call's mask and
//! window (and so its FLOPs); otherwise the mask stays a `BlockMask` whose contents are unknown, costed as
//! full attention, an upper bound the call notes.

use super::positions;
use super::signature::flex_phase;
use super::{AttentionCall, AttnBackend, MaskInfo, Phase, VariantsSeen};
use crate::trace::kineto::{OpArgs, NO_ID};
use crate::trace::tree::{OpTree, NONE};
use sdpa_core::Diagonal;

const INSIDE: &str = "FlexAttention: the score_mod and mask_mod are compiled into the Triton kernel; a softcap or \
                      ALiBi inside it does not show in the trace";
const UPPER_BOUND: &str = "FlexAttention BlockMask whose contents the trace does not show (built before the \
                           profiled span or reused): FLOPs count every pair, an upper bound, so efficiency is \
                           overstated for sparse masks";

/// Dims of the `BlockMask`'s `kv_indices`: the first 4-d integer tensor among the kernel's inputs.
fn block_dims(args: &OpArgs) -> Option<Vec<i64>> {
    (3..args.dims.len())
        .find(|&i| args.ty(i).is_some_and(|t| t == "int") && args.dim(i).is_some_and(|d| d.len() == 4))
        .and_then(|i| args.dim(i))
        .map(<[i64]>::to_vec)
}

/// The autograd sequence number of the `CompiledFunction` (forward) or `CompiledFunctionBackward` above `o`.
fn autograd_seq(tree: &OpTree<'_>, mut o: u32) -> Option<i64> {
    while o != NONE {
        let s = tree.trace.ops[o as usize].seq;
        if s != NO_ID {
            return Some(s);
        }
        o = tree.parent[o as usize];
    }
    None
}

/// Refines the Flex calls among `calls` (`roots[k]` is the op of `calls[k]`; later calls have no root):
/// folds the backward's helper kernels into its template call, reads masks from their construction, and
/// gives each backward call its forward's mask. Calls folded away are removed.
/// `inside[o]` marks the ops of fused calls (where a mask's construction for this call cannot be).
pub(crate) fn refine(tree: &OpTree<'_>, roots: &[u32], inside: &[bool], calls: &mut Vec<AttentionCall>) {
    let ops = &tree.trace.ops;
    let is_flex = |c: &AttentionCall| c.backend == AttnBackend::Flex;
    let mut drop = vec![false; calls.len()];
    // A helper kernel (not a template, no Q/K/V) joins the template that runs right after it on its thread, under
    // the same parent and in the same pass; anything else (a template whose Q/K/V this reader cannot place)
    // stays a call of its own.
    let thread_of = |k: usize| ops[roots[k] as usize].thread;
    for k in 0..roots.len().min(calls.len()) {
        let name = tree.name(roots[k]);
        if !is_flex(&calls[k]) || calls[k].shape.is_some() || name.starts_with("triton_tem_") {
            continue;
        }
        let Some(phase) = flex_phase(name) else { continue };
        let next = (k + 1..roots.len().min(calls.len())).find(|&j| thread_of(j) == thread_of(k) && is_flex(&calls[j]));
        let into = next.filter(|&j| {
            calls[j].shape.is_some()
                && calls[j].phase == phase
                && tree.parent[roots[j] as usize] == tree.parent[roots[k] as usize]
        });
        if let Some(j) = into {
            let helper = std::mem::take(&mut calls[k].kernels);
            calls[j].gpu_us += calls[k].gpu_us;
            for (name, us) in helper {
                match calls[j].kernels.iter_mut().find(|(n, _)| *n == name) {
                    Some(e) => e.1 += us,
                    None => calls[j].kernels.push((name, us)),
                }
            }
            drop[k] = true;
        }
    }
    // Forward calls: the mask from its construction since the previous attention call on the thread.
    let mut by_seq: Vec<(i64, MaskInfo, VariantsSeen, Vec<String>)> = Vec::new();
    for k in 0..roots.len().min(calls.len()) {
        let root = roots[k];
        if drop[k] || !is_flex(&calls[k]) {
            continue;
        }
        let args = ops[root as usize].args.as_deref();
        if let Some(dims) = args.and_then(block_dims) {
            calls[k].mask = MaskInfo::BlockMask { dims };
        }
        if calls[k].phase != Phase::Fwd {
            continue;
        }
        if let Some(s) = calls[k].shape {
            let thread = ops[root as usize].thread;
            let to = tree.pos[root as usize] as usize;
            let ev = positions::evidence(tree, thread, to, s.sq, s.sk, |o| inside[o as usize]);
            if ev.causal {
                calls[k].mask = MaskInfo::CausalTopLeft;
                if let Some(w) = ev.causal_window() {
                    calls[k].variants = VariantsSeen::causal_window(w, Diagonal::TopLeft);
                }
                calls[k]
                    .notes
                    .push(format!("mask read from the create_block_mask ops before the call: {}", ev.describe()));
            }
        }
        if let Some(seq) = autograd_seq(tree, root) {
            by_seq.push((seq, calls[k].mask.clone(), calls[k].variants.clone(), calls[k].notes.clone()));
        }
    }
    // Backward calls: the forward's mask (same autograd sequence number).
    for k in 0..roots.len().min(calls.len()) {
        if drop[k] || !is_flex(&calls[k]) || calls[k].phase != Phase::Bwd {
            continue;
        }
        let fwd = autograd_seq(tree, roots[k]).and_then(|s| by_seq.iter().find(|f| f.0 == s));
        if let Some((_, mask, variants, notes)) = fwd {
            if !matches!(mask, MaskInfo::BlockMask { .. }) {
                calls[k].mask = mask.clone();
                calls[k].variants = variants.clone();
                for n in notes {
                    if !calls[k].notes.contains(n) {
                        calls[k].notes.push(n.clone());
                    }
                }
                calls[k].notes.push("mask of the forward call with the same autograd sequence number".into());
            }
        }
    }
    for c in calls.iter_mut().filter(|c| is_flex(c)) {
        if matches!(c.mask, MaskInfo::BlockMask { .. } | MaskInfo::Unknown) {
            c.notes.push(UPPER_BOUND.into());
        }
        c.notes.push(INSIDE.into());
    }
    let mut k = 0;
    calls.retain(|_| {
        k += 1;
        !drop.get(k - 1).copied().unwrap_or(false)
    });
}
