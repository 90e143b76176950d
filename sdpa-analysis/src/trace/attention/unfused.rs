//! Unfused (eager) attention: on each thread, a batched matmul producing `[.., Sq, Sk]` scores, then
//! optional scaling, masking and casts, a softmax over the last dim, optional dropout and casts, and a
//! batched matmul of those probabilities with V, all in the same `nn.Module` when the trace has modules.
//!
//! Only the outermost op of each kind is looked at (`aten::matmul`, not the `aten::bmm` inside it), and
//! ops inside a fused attention call are skipped (SDPA's math path is reported as fused/math). The shapes
//! come from `Input Dims`: B and H from the 4-d scores (a 3-d `bmm` gives B·H merged), D from the QK
//! operands, Dv from V. GQA written as transformers' `repeat_kv` (an `expand` of K/V from
//! `[B, Hkv, 1, S, D]` to `[B, Hkv, n_rep, S, D]` shortly before) gives Hkv.
//!
//! Gemma 2's eager attention caps the scores between the QK matmul and the softmax (`s / cap`, `tanh`,
//! `· cap`): a `tanh` over the scores marks the chain as softcapped (the cap itself is a Python float that
//! PyTorch records without its value, so it is read only when the trace has it). Its mask is a window built
//! from positions; the comparisons that built it ([`super::positions`]) turn an explicit mask into the causal
//! window it is, when they show one.

use super::{positions, AttentionCall, AttnBackend, Kind, MaskInfo, Part, Phase, VariantsSeen};
use crate::trace::tree::{OpTree, NONE};
use sdpa_core::{Diagonal, Shape};

/// What an op can be in the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Batched matmul (`matmul`, `bmm`, `baddbmm`).
    Gemm,
    /// A GEMM that is not batched attention (`linear`, `mm`, `addmm`): ends any chain.
    OtherGemm,
    Scale,
    Mask,
    Softmax,
    /// `tanh` over the scores: a logit softcap.
    Softcap,
    Cast,
    Dropout,
}

fn role(name: &str) -> Option<Role> {
    let op = name.strip_prefix("aten::")?;
    Some(match op {
        "matmul" | "bmm" | "baddbmm" => Role::Gemm,
        "linear" | "mm" | "addmm" | "einsum" => Role::OtherGemm,
        "mul" | "mul_" | "div" | "div_" => Role::Scale,
        "add" | "add_" | "sub" | "masked_fill" | "masked_fill_" | "where" => Role::Mask,
        "softmax" | "_softmax" | "_safe_softmax" => Role::Softmax,
        "tanh" => Role::Softcap,
        "to" | "_to_copy" | "type_as" => Role::Cast,
        "dropout" | "native_dropout" | "feature_dropout" => Role::Dropout,
        _ => return None,
    })
}

/// Ops (of any kind) allowed between two steps of a chain before it is abandoned.
const MAX_GAP: usize = 64;
/// How far back (in ops) to look for the `repeat_kv` expand.
const REPEAT_KV_LOOKBACK: usize = 400;

struct Chain {
    qk: u32,
    scores: Vec<i64>,
    d: i64,
    parts: Vec<(&'static str, u32)>,
    mask: MaskInfo,
    /// A `tanh` over the scores came before the softmax.
    softcap: bool,
    /// The cap, when a scale op next to the `tanh` recorded its literal.
    cap: Option<f64>,
    /// The literal of the last scale op over the scores (the `/ cap` before a `tanh`).
    last_scale: Option<f64>,
    softmax_seen: bool,
    since_step: usize,
    module: u32,
}

/// Finds unfused attention chains; `inside[o]` marks ops inside fused calls (skipped), `claimed[g]` GPU
/// activities already counted in a fused call (not counted again).
pub fn detect(tree: &OpTree<'_>, inside: &[bool], claimed: &[bool]) -> Vec<AttentionCall> {
    let ops = &tree.trace.ops;
    let mut out = Vec::new();
    for (t, list) in tree.thread_ops.iter().enumerate() {
        let mut gpu_index = ThreadGpu::new(tree, t as u32, claimed);
        let mut chain: Option<Chain> = None;
        let mut last_end_pos = 0usize;
        for (k, &o) in list.iter().enumerate() {
            if inside.get(o as usize).copied().unwrap_or(false) {
                continue;
            }
            let Some(r) = role(tree.name(o)) else {
                if let Some(c) = chain.as_mut() {
                    if tree.parent[o as usize] == NONE || !is_under_role(tree, o) {
                        c.since_step += 1;
                        if c.since_step > MAX_GAP {
                            chain = None;
                        }
                    }
                }
                continue;
            };
            if is_under_role(tree, o) {
                continue; // e.g. the bmm inside a matmul
            }
            let args = ops[o as usize].args.as_deref();
            let dims = |i: usize| args.and_then(|a| a.dim(i));
            let module = tree.module[o as usize];
            match (r, chain.as_mut()) {
                (Role::Gemm, Some(c)) if c.softmax_seen && same_module(c.module, module) => {
                    let (a, b) = gemm_operands(tree.name(o), &dims);
                    if let (Some(a), Some(b)) = (a, b) {
                        if a == c.scores.as_slice() && b.len() == a.len() && b[b.len() - 2] == *a.last().unwrap_or(&0) {
                            c.parts.push(("pv", o));
                            let dv = *b.last().unwrap_or(&0);
                            if let Some(call) = finish(tree, &mut gpu_index, c, o, dv, list, last_end_pos, inside) {
                                out.push(call);
                            }
                            chain = None;
                            last_end_pos = k;
                            continue;
                        }
                    }
                    chain = start(tree, o, &dims, module);
                }
                (Role::Gemm, _) | (Role::OtherGemm, _) => {
                    chain = if r == Role::Gemm { start(tree, o, &dims, module) } else { None };
                }
                (Role::Softmax, Some(c)) if !c.softmax_seen => {
                    if dims(0) == Some(c.scores.as_slice()) {
                        c.softmax_seen = true;
                        c.since_step = 0;
                        c.parts.push(("softmax", o));
                    } else {
                        chain = None;
                    }
                }
                (Role::Softcap, Some(c)) if !c.softmax_seen => {
                    if dims(0) != Some(c.scores.as_slice()) {
                        c.since_step += 1;
                        continue;
                    }
                    c.softcap = true;
                    c.cap = c.last_scale;
                    c.parts.push(("softcap", o));
                    c.since_step = 0;
                }
                (Role::Scale | Role::Mask | Role::Cast | Role::Dropout, Some(c)) => {
                    let touches_scores = (0..2).any(|i| dims(i) == Some(c.scores.as_slice()));
                    if !touches_scores {
                        c.since_step += 1;
                        continue;
                    }
                    if r == Role::Scale && !c.softmax_seen {
                        let literal = args.and_then(|a| a.concrete(1)).and_then(super::fused::parse_float);
                        c.last_scale = literal.filter(|&x| x > 0.0);
                        if c.softcap && c.cap.is_none() {
                            c.cap = c.last_scale;
                        }
                    }
                    let label = match r {
                        Role::Scale => "scale",
                        Role::Mask => "mask",
                        Role::Cast => "cast",
                        _ => "dropout",
                    };
                    if r == Role::Mask && !c.softmax_seen {
                        let other = (0..3).filter_map(&dims).find(|d| d != &c.scores.as_slice() && d.len() >= 2);
                        if let Some(m) = other {
                            let n = m.len();
                            let (sq, sk) = (c.scores[c.scores.len() - 2], c.scores[c.scores.len() - 1]);
                            if (m[n - 2] == sq || m[n - 2] == 1) && m[n - 1] == sk {
                                let values = if tree.name(o).contains("add") || tree.name(o).contains("sub") {
                                    "additive"
                                } else {
                                    "boolean"
                                };
                                c.mask = MaskInfo::Explicit { values: values.into(), dims: m.to_vec() };
                            }
                        }
                    }
                    c.parts.push((label, o));
                    c.since_step = 0;
                }
                _ => {}
            }
        }
    }
    out
}

fn same_module(a: u32, b: u32) -> bool {
    a == NONE || b == NONE || a == b
}

/// True when an ancestor of `o` is itself a chain op (then `o` is an implementation detail of it).
fn is_under_role(tree: &OpTree<'_>, o: u32) -> bool {
    let mut p = tree.parent[o as usize];
    while p != NONE {
        if role(tree.name(p)).is_some() {
            return true;
        }
        p = tree.parent[p as usize];
    }
    false
}

/// The two matrix operands of a GEMM op.
fn gemm_operands<'a>(name: &str, dims: &impl Fn(usize) -> Option<&'a [i64]>) -> (Option<&'a [i64]>, Option<&'a [i64]>) {
    if name == "aten::baddbmm" {
        (dims(1), dims(2))
    } else {
        (dims(0), dims(1))
    }
}

fn start<'a>(tree: &OpTree<'_>, o: u32, dims: &impl Fn(usize) -> Option<&'a [i64]>, module: u32) -> Option<Chain> {
    let (a, b) = gemm_operands(tree.name(o), dims);
    let (a, b) = (a?, b?);
    let n = a.len();
    if n < 3 || b.len() != n || a[..n - 2] != b[..n - 2] || a[n - 1] != b[n - 2] {
        return None;
    }
    let mut scores = a[..n - 2].to_vec();
    scores.push(a[n - 2]);
    scores.push(b[n - 1]);
    let mut mask = MaskInfo::None;
    if tree.name(o) == "aten::baddbmm" {
        if let Some(m) = dims(0).filter(|m| m.len() >= 2) {
            mask = MaskInfo::Explicit { values: "additive".into(), dims: m.to_vec() };
        }
    }
    Some(Chain {
        qk: o,
        scores,
        d: a[n - 1],
        parts: vec![("qk", o)],
        mask,
        softcap: false,
        cap: None,
        last_scale: None,
        softmax_seen: false,
        since_step: 0,
        module,
    })
}

#[allow(clippy::too_many_arguments)]
fn finish(
    tree: &OpTree<'_>,
    gpu: &mut ThreadGpu,
    c: &Chain,
    pv: u32,
    dv: i64,
    list: &[u32],
    lookback_floor: usize,
    inside: &[bool],
) -> Option<AttentionCall> {
    let ops = &tree.trace.ops;
    let s = &c.scores;
    let n = s.len();
    let (sq, sk) = (s[n - 2], s[n - 1]);
    let (b, h, merged) = match n {
        4 => (s[0], s[1], false),
        3 => (1, s[0], true),
        // Saturating: a damaged trace's dims can overflow; the plausibility check below then rejects them.
        _ => (s[..n - 3].iter().fold(1i64, |a, &x| a.saturating_mul(x)), s[n - 3], false),
    };
    let to_usize = |v: i64| (v > 0).then_some(v as usize);
    let mut notes = Vec::new();
    let qk_pos = tree.pos[c.qk as usize] as usize;
    let hkv = repeat_kv_heads(tree, list, qk_pos, lookback_floor, b, h, c.d);
    if let Some(hkv) = hkv {
        notes.push(format!("K/V expanded from {hkv} to {h} heads before the matmul (repeat_kv): GQA"));
    }
    if merged {
        notes.push("3-d bmm: batch and heads are merged (B reported as 1, H as B·H)".into());
    }
    let shape = Shape {
        b: to_usize(b)?,
        hq: to_usize(h)?,
        hkv: to_usize(hkv.unwrap_or(h))?,
        sq: to_usize(sq)?,
        sk: to_usize(sk)?,
        d: to_usize(c.d)?,
        dv: to_usize(dv)?,
    };
    let (shape, suspect) = match super::fused::checked_shape((shape, (), ()), tree.name(c.qk)) {
        Ok((s, (), ())) => (Some(s), None),
        Err(why) => (None, Some(why)),
    };
    let qk = &ops[c.qk as usize];
    let pv_op = &ops[pv as usize];
    let dtype = qk
        .args
        .as_deref()
        .and_then(|a| a.ty(if tree.name(c.qk) == "aten::baddbmm" { 1 } else { 0 }))
        .map(str::to_string);
    // Softmax in a wider dtype than the matmuls (a cast around it) doubles the score traffic.
    if let Some(&(_, sm)) = c.parts.iter().find(|(r, _)| *r == "softmax") {
        let sargs = ops[sm as usize].args.as_deref();
        let st = sargs.and_then(|a| a.ty(0));
        // `aten::softmax(x, dim, dtype)`: ScalarType 6 is float32.
        let upcast = sargs.and_then(|a| a.concrete(2)).is_some_and(|d| d.trim() == "6");
        if upcast && dtype.as_deref() != Some("float") {
            notes
                .push("softmax upcasts the scores to f32 (dtype=torch.float32): twice the score-matrix traffic".into());
        } else if st.is_some() && dtype.is_some() && st != dtype.as_deref() {
            notes.push(format!(
                "softmax runs in {} (inputs are {})",
                st.unwrap_or("?"),
                dtype.as_deref().unwrap_or("?")
            ));
        }
    }
    let (mask, variants) = mask_and_variants(tree, c, inside, &mut notes);
    let end = pv_op.ts + pv_op.dur;
    let total = gpu.sum(qk.ts, end);
    let kernels = gpu.kernels_between(tree, qk.ts, end);
    gpu.claim(qk.ts, end);
    let mut parts: Vec<Part> = c
        .parts
        .iter()
        .map(|&(role, o)| Part { role, op: tree.name(o).to_string(), gpu_us: tree.incl_gpu_us[o as usize] })
        .collect();
    let named: f64 = parts.iter().map(|p| p.gpu_us).sum();
    if total - named > 1e-6 {
        parts.push(Part { role: "other", op: "copies and layout ops in between".into(), gpu_us: total - named });
    }
    // Autograd sequence numbers of every op of the chain (and what runs inside them): the backward nodes
    // of a training step carry the same numbers.
    let (lo, hi) = (tree.pos[c.qk as usize] as usize, tree.pos[pv as usize] as usize);
    let mut seqs: Vec<i64> = list[lo..=hi.max(lo)]
        .iter()
        .map(|&o| ops[o as usize].seq)
        .filter(|&s| s != crate::trace::kineto::NO_ID)
        .collect();
    seqs.sort_unstable();
    seqs.dedup();
    Some(AttentionCall {
        kind: Kind::Unfused,
        phase: Phase::Fwd,
        backend: AttnBackend::Eager,
        op: tree.name(c.qk).to_string(),
        module: tree.module_path(c.qk).into_iter().map(str::to_string).collect(),
        shape,
        layout: super::BatchLayout::Dense,
        ragged: None,
        dtype,
        mask,
        variants,
        scale: None,
        dropout: None,
        q_bshd_strides: false,
        gpu_us: total,
        kernels,
        grid_blocks: None,
        parts,
        notes,
        suspect,
        repeat: 1,
        at: (qk.thread, qk.ts),
        seqs,
        kv: Default::default(),
    })
}

/// The backward of unfused chains in a training trace: autograd nodes (`BmmBackward0`,
/// `SoftmaxBackward0`, `MulBackward0`, ...) whose sequence numbers are those of a forward chain's ops.
pub fn backward_of(tree: &OpTree<'_>, forward: &[AttentionCall]) -> Vec<AttentionCall> {
    use std::collections::HashMap;
    let ops = &tree.trace.ops;
    let mut chain_of: HashMap<i64, usize> = HashMap::new();
    for (i, c) in forward.iter().enumerate() {
        for &s in &c.seqs {
            chain_of.entry(s).or_insert(i);
        }
    }
    if chain_of.is_empty() {
        return Vec::new();
    }
    let is_node = |o: u32| {
        let n = tree.name(o);
        n.contains("Backward") && !n.starts_with("autograd::engine")
    };
    let mut nodes: Vec<Vec<u32>> = vec![Vec::new(); forward.len()];
    for list in &tree.thread_ops {
        for &o in list {
            let s = ops[o as usize].seq;
            if s == crate::trace::kineto::NO_ID || !is_node(o) {
                continue;
            }
            let Some(&c) = chain_of.get(&s) else { continue };
            // Outermost node only: nested ones are inside its time.
            let mut p = tree.parent[o as usize];
            let mut nested = false;
            while p != NONE {
                if is_node(p) && chain_of.contains_key(&ops[p as usize].seq) {
                    nested = true;
                    break;
                }
                p = tree.parent[p as usize];
            }
            if !nested {
                nodes[c].push(o);
            }
        }
    }
    // Kernels of each chain's backward: walk up from each kernel's launcher once.
    let node_chain: HashMap<u32, usize> =
        nodes.iter().enumerate().flat_map(|(c, ns)| ns.iter().map(move |&o| (o, c))).collect();
    let mut kernels: Vec<Vec<(String, f64)>> = vec![Vec::new(); forward.len()];
    if !node_chain.is_empty() {
        for (g, act) in tree.trace.gpu.iter().enumerate() {
            let mut o = tree.gpu_op[g];
            while o != NONE {
                if let Some(&c) = node_chain.get(&o) {
                    let name = tree.trace.names.get(act.name);
                    match kernels[c].iter_mut().find(|(k, _)| k == name) {
                        Some(e) => e.1 += act.dur,
                        None => kernels[c].push((name.to_string(), act.dur)),
                    }
                    break;
                }
                o = tree.parent[o as usize];
            }
        }
    }
    let mut out = Vec::new();
    for (c, found) in nodes.into_iter().enumerate() {
        if found.is_empty() {
            continue;
        }
        let f = &forward[c];
        let parts: Vec<Part> = found
            .iter()
            .map(|&o| Part { role: "bwd", op: tree.name(o).to_string(), gpu_us: tree.incl_gpu_us[o as usize] })
            .collect();
        let kernels = std::mem::take(&mut kernels[c]);
        let first = &ops[found[0] as usize];
        out.push(AttentionCall {
            kind: Kind::Unfused,
            phase: Phase::Bwd,
            backend: AttnBackend::Eager,
            op: tree.name(found[0]).to_string(),
            module: f.module.clone(),
            shape: f.shape,
            layout: super::BatchLayout::Dense,
            ragged: None,
            dtype: f.dtype.clone(),
            mask: f.mask.clone(),
            variants: f.variants.clone(),
            scale: None,
            dropout: None,
            q_bshd_strides: false,
            gpu_us: parts.iter().map(|p| p.gpu_us).sum(),
            kernels,
            grid_blocks: None,
            parts,
            notes: vec!["backward of an unfused chain, matched through autograd sequence numbers".into()],
            suspect: f.suspect.clone(),
            repeat: 1,
            at: (first.thread, first.ts),
            seqs: Vec::new(),
            kv: Default::default(),
        });
    }
    out
}

/// The chain's mask and variants: a `tanh` softcap, and for an explicit mask whose construction shows a causal
/// window (with `Sq = Sk`, where both diagonals agree), that window: the explicit mask stays (its tensor is
/// still built and read), and the window says which pairs a fused kernel would have to compute.
fn mask_and_variants(
    tree: &OpTree<'_>,
    c: &Chain,
    inside: &[bool],
    notes: &mut Vec<String>,
) -> (MaskInfo, VariantsSeen) {
    let mask = c.mask.clone();
    let mut variants = VariantsSeen::default();
    let n = c.scores.len();
    let (sq, sk) = (c.scores[n - 2], c.scores[n - 1]);
    if let (MaskInfo::Explicit { dims, .. }, Some(&(_, sm))) = (&c.mask, c.parts.iter().find(|(r, _)| *r == "softmax"))
    {
        let thread = tree.trace.ops[sm as usize].thread;
        let ev = positions::evidence(tree, thread, tree.pos[sm as usize] as usize, sq as usize, sk as usize, |o| {
            inside.get(o as usize).copied().unwrap_or(false)
        });
        if ev.causal && sq == sk {
            notes.push(format!("the explicit mask {dims:?} was built from positions: {}", ev.describe()));
            if let Some(w) = ev.causal_window() {
                variants = VariantsSeen::causal_window(w, Diagonal::TopLeft);
            }
        }
    }
    if c.softcap {
        variants.variants.softcap = c.cap;
        variants.softcap_unrecorded = c.cap.is_none();
        let cap = c.cap.map_or("its cap not recorded".to_string(), |x| format!("cap {x}"));
        notes.push(format!("tanh between the score matmul and the softmax: a logit softcap (Gemma-2 style), {cap}"));
    }
    (mask, variants)
}

/// Hkv from a `repeat_kv` expand `[B, Hkv, 1, S, D] -> [B, Hkv, n_rep, S, D]` shortly before the QK matmul.
fn repeat_kv_heads(
    tree: &OpTree<'_>,
    list: &[u32],
    qk_pos: usize,
    floor: usize,
    b: i64,
    h: i64,
    d: i64,
) -> Option<i64> {
    let lo = qk_pos.saturating_sub(REPEAT_KV_LOOKBACK).max(floor).min(qk_pos);
    for &o in list[lo..qk_pos].iter().rev() {
        if tree.name(o) != "aten::expand" {
            continue;
        }
        let Some(args) = tree.trace.ops[o as usize].args.as_deref() else { continue };
        let Some(src) = args.dim(0) else { continue };
        if src.len() != 5 || src[2] != 1 || src[0] != b || src[4] != d {
            continue;
        }
        let target = args.concrete(1).map(parse_int_list).unwrap_or_default();
        if target.len() == 5 && target[1] == src[1] && target[1].checked_mul(target[2]) == Some(h) && target[2] > 1 {
            return Some(src[1]);
        }
    }
    None
}

fn parse_int_list(s: &str) -> Vec<i64> {
    s.trim_matches(|c| c == '[' || c == ']' || c == '(' || c == ')')
        .split(',')
        .filter_map(|x| x.trim().parse::<i64>().ok())
        .collect()
}

/// GPU activities launched from one thread, ordered by the launching op's start, with prefix sums: the
/// GPU time of everything a time window of that thread launched. Activities a fused call counted are left
/// out, and a window never reaches below the end of the last chain's, so no activity is counted twice
/// (chains end in time order on their thread).
struct ThreadGpu {
    at: Vec<(f64, usize)>,
    prefix: Vec<f64>,
    /// Activities below this index belong to finished chains.
    floor: usize,
}

impl ThreadGpu {
    fn new(tree: &OpTree<'_>, thread: u32, claimed: &[bool]) -> Self {
        let trace = tree.trace;
        let mut at: Vec<(f64, usize)> = Vec::new();
        for (g, &o) in tree.gpu_op.iter().enumerate() {
            if o != NONE && trace.ops[o as usize].thread == thread && !claimed.get(g).copied().unwrap_or(false) {
                at.push((trace.ops[o as usize].ts, g));
            }
        }
        at.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut prefix = Vec::with_capacity(at.len() + 1);
        prefix.push(0.0);
        let mut s = 0.0;
        for &(_, g) in &at {
            s += trace.gpu[g].dur;
            prefix.push(s);
        }
        ThreadGpu { at, prefix, floor: 0 }
    }

    fn range(&self, from: f64, to: f64) -> (usize, usize) {
        let lo = self.at.partition_point(|x| x.0 < from - 1e-3).max(self.floor);
        let hi = self.at.partition_point(|x| x.0 <= to + 1e-3);
        (lo, hi.max(lo))
    }

    /// Marks the window's activities as counted.
    fn claim(&mut self, from: f64, to: f64) {
        self.floor = self.range(from, to).1;
    }

    fn sum(&self, from: f64, to: f64) -> f64 {
        let (lo, hi) = self.range(from, to);
        self.prefix[hi] - self.prefix[lo]
    }

    fn kernels_between(&self, tree: &OpTree<'_>, from: f64, to: f64) -> Vec<(String, f64)> {
        let (lo, hi) = self.range(from, to);
        let mut out: Vec<(String, f64)> = Vec::new();
        for &(_, g) in &self.at[lo..hi] {
            let act = &tree.trace.gpu[g];
            let name = tree.trace.names.get(act.name);
            match out.iter_mut().find(|(n, _)| n == name) {
                Some(e) => e.1 += act.dur,
                None => out.push((name.to_string(), act.dur)),
            }
        }
        out
    }
}
