//! Fused attention: every outermost attention operator (SDPA, its backend ops, flash-attn, their backward
//! ops and autograd nodes) with the kernels its subtree launched. Attention kernels that no attention
//! operator launched (CUDA graph replays, traces without CPU ops) are reported from the kernel alone.

use super::ragged::{BatchLayout, Ragged};
use super::signature::{
    kernel_backend, kernel_layout, signature, AttnBackend, CausalArg, Phase, QkvLayout, RaggedArgs, Signature,
};
use super::{AttentionCall, Kind, MaskInfo, VariantsSeen};
use crate::trace::kineto::{GpuKind, OpArgs, NO_ID};
use crate::trace::tree::{OpTree, NONE};
use sdpa_core::{Diagonal, Shape, Window};
use std::collections::HashMap;

/// Fused calls, and for every op whether it lies inside one (the unfused detector skips those).
#[derive(Debug, Default)]
pub struct FusedResult {
    /// The calls.
    pub calls: Vec<super::AttentionCall>,
    /// Per op: inside a fused attention subtree.
    pub inside: Vec<bool>,
    /// Per GPU activity: counted in one of the calls (the unfused detector must not count it again).
    pub claimed: Vec<bool>,
}

/// Finds the fused attention calls of a tree.
pub fn detect(tree: &OpTree<'_>) -> FusedResult {
    let trace = tree.trace;
    let ops = &trace.ops;
    let mut sig_cache: HashMap<u32, Option<Signature>> = HashMap::new();
    let mut sig_of = |o: u32| -> Option<Signature> {
        let name = ops[o as usize].name;
        *sig_cache.entry(name).or_insert_with(|| signature(trace.names.get(name)))
    };

    let mut inside = vec![false; ops.len()];
    let mut roots: Vec<u32> = Vec::new();
    for list in &tree.thread_ops {
        for &o in list {
            let p = tree.parent[o as usize];
            if p != NONE && inside[p as usize] {
                inside[o as usize] = true;
            } else if sig_of(o).is_some() {
                inside[o as usize] = true;
                roots.push(o);
            }
        }
    }

    // A context-parallel op holds one call per ring step: those are the calls.
    let steps = super::steps::split(tree, roots, &mut sig_of);
    let roots: Vec<u32> = steps.iter().map(|s| s.root).collect();
    let mut calls = Vec::with_capacity(roots.len());
    let mut call_of_root: HashMap<u32, usize> = HashMap::with_capacity(roots.len());
    let mut fwd_module_by_seq: HashMap<i64, Vec<String>> = HashMap::new();
    for (&root, step) in roots.iter().zip(&steps) {
        let mut call = describe(tree, root, &mut sig_of);
        call.notes.extend(step.note.clone());
        if call.phase == Phase::Fwd {
            let seq = tree.subtree(root).map(|o| ops[o as usize].seq).find(|&s| s != NO_ID);
            if let Some(seq) = seq {
                fwd_module_by_seq.insert(seq, call.module.clone());
            }
        }
        call.at = (ops[root as usize].thread, ops[root as usize].ts);
        call_of_root.insert(root, calls.len());
        calls.push(call);
    }
    // Backward calls run on the autograd thread, outside any module frame: take the module of the forward
    // call with the same autograd sequence number.
    for (k, &root) in roots.iter().enumerate() {
        if calls[k].phase == Phase::Bwd && calls[k].module.is_empty() {
            let seq = tree.subtree(root).map(|o| ops[o as usize].seq).find(|&s| s != NO_ID);
            if let Some(m) = seq.and_then(|s| fwd_module_by_seq.get(&s)) {
                calls[k].module = m.clone();
                calls[k].notes.push("module taken from the forward call with the same autograd sequence number".into());
            }
        }
    }

    // Kernels -> the call whose subtree launched them.
    let mut orphans: Vec<usize> = Vec::new();
    let mut claimed = vec![false; trace.gpu.len()];
    let mut main_kernel: Vec<(f64, Option<i64>)> = vec![(0.0, None); calls.len()];
    for (g, act) in trace.gpu.iter().enumerate() {
        let mut o = tree.gpu_op[g];
        let mut hit = None;
        while o != NONE {
            if let Some(&c) = call_of_root.get(&o) {
                hit = Some(c);
                break;
            }
            o = tree.parent[o as usize];
        }
        let name = trace.names.get(act.name);
        match hit {
            Some(c) => {
                claimed[g] = true;
                let call = &mut calls[c];
                call.gpu_us += act.dur;
                call.kv.widen(act.ts, act.ts + act.dur);
                add_kernel(&mut call.kernels, name, act.dur);
                if act.kind == GpuKind::Kernel && kernel_backend(name).is_some() && act.dur > main_kernel[c].0 {
                    main_kernel[c] = (act.dur, act.grid.map(grid_blocks));
                }
            }
            None => {
                if act.kind == GpuKind::Kernel && kernel_backend(name).is_some() {
                    claimed[g] = true;
                    orphans.push(g);
                }
            }
        }
    }
    for (c, call) in calls.iter_mut().enumerate() {
        call.grid_blocks = main_kernel[c].1;
        refine_backend(call);
        if call.ragged.is_none() {
            // An op without shapes still shows its layout through a serving kernel's name.
            if let Some(l) = call.kernels.iter().find_map(|(k, _)| kernel_layout(k)) {
                call.layout = l;
            }
        }
    }
    for (call, &root) in calls.iter_mut().zip(&roots) {
        note_windowed_mask(tree, root, &inside, call);
        note_converted_kv(tree, root, call, &mut sig_of);
    }
    super::flex::refine(tree, &roots, &inside, &mut calls);
    for g in orphans {
        calls.push(orphan_call(tree, g));
    }
    FusedResult { calls, inside, claimed }
}

/// A fused call given an explicit mask that its construction shows to be a causal window: the kernel computes
/// every pair (it cannot know the mask's shape), where a windowed kernel would skip the tiles outside.
fn note_windowed_mask(tree: &OpTree<'_>, root: u32, inside: &[bool], call: &mut AttentionCall) {
    let (MaskInfo::Explicit { dims, .. }, Some(s), Phase::Fwd) = (&call.mask, call.shape, call.phase) else { return };
    if s.sq != s.sk {
        return;
    }
    let thread = tree.trace.ops[root as usize].thread;
    let ev = super::positions::evidence(tree, thread, tree.pos[root as usize] as usize, s.sq, s.sk, |o| {
        o != root && inside[o as usize]
    });
    if let Some(w) = ev.causal_window() {
        let band = sdpa_core::KeyBand { lo: Some(-(w as i128)), hi: Some(0) };
        let ratio = (s.sq as f64 * s.sk as f64) / band.pairs(s.sq, s.sk).max(1) as f64;
        call.notes.push(format!(
            "the explicit mask {dims:?} was built from positions: {}; the kernel computes all Sq·Sk pairs, {ratio:.1}x \
             the window's: a windowed kernel (flash-attn window_size=({w}, 0), a FlexAttention block mask, sdpa \
             --window {w},0) skips the tiles outside it",
            ev.describe()
        ));
    }
}

/// Blocks of a recorded grid; saturating, as a damaged trace's grid can hold any integers.
fn grid_blocks(g: [i64; 3]) -> i64 {
    g[0].max(1).saturating_mul(g[1].max(1)).saturating_mul(g[2].max(1))
}

fn add_kernel(list: &mut Vec<(String, f64)>, name: &str, us: f64) {
    match list.iter_mut().find(|(n, _)| n == name) {
        Some(e) => e.1 += us,
        None => list.push((name.to_string(), us)),
    }
}

/// The backend the kernels show wins over "unknown"; a kernel that contradicts the op name is noted.
pub(crate) fn refine_backend(call: &mut AttentionCall) {
    let from_kernels = call.kernels.iter().find_map(|(k, _)| kernel_backend(k));
    match (call.backend, from_kernels) {
        (AttnBackend::Unknown, Some(b)) => call.backend = b,
        // SDPA with no fused kernel underneath ran the math path (GEMMs + softmax).
        (AttnBackend::Unknown, None)
            if call.kernels.iter().any(|(k, _)| k.to_ascii_lowercase().contains("softmax")) =>
        {
            call.backend = AttnBackend::Math;
            call.notes.push("no fused attention kernel launched; GEMM + softmax kernels: the math path".into());
        }
        (op, Some(k)) if op != k && op != AttnBackend::Math => {
            call.notes.push(format!("the op says {} but its kernels look like {}", op.name(), k.name()));
        }
        _ => {}
    }
}

fn describe(tree: &OpTree<'_>, root: u32, sig_of: &mut impl FnMut(u32) -> Option<Signature>) -> AttentionCall {
    let ops = &tree.trace.ops;
    let root_sig = sig_of(root);
    let phase = root_sig.map(|s| s.phase).unwrap_or(Phase::Fwd);
    let mut backend = AttnBackend::Unknown;
    let mut shape = None;
    let mut dtype = None;
    let mut mask = None;
    let mut scale = None;
    let mut dropout = None;
    let mut variants = VariantsSeen::default();
    let mut q_bshd = false;
    let mut notes = Vec::new();
    let mut suspect = None;
    let mut layout = BatchLayout::Dense;
    let mut ragged = None;
    let mut varlen_flash = false;
    let mut kv_cache_dtype = None;
    let subtree: Vec<u32> = tree.subtree(root).collect();
    for &o in &subtree {
        let Some(sig) = sig_of(o) else { continue };
        if sig.backend != AttnBackend::Unknown {
            backend = sig.backend; // the deepest named backend wins
        }
        let Some(args) = ops[o as usize].args.as_deref() else { continue };
        // The outermost shape wins, except that a packed batch found below a dense reading replaces it: an op
        // above the packed call (a nested tensor's SDPA) may record the padded view, not the batch that ran.
        let packed_below = shape.is_some() && layout == BatchLayout::Dense;
        if (shape.is_none() || packed_below) && suspect.is_none() {
            match extract_shape(&sig, args)
                .map(|x| checked_shape(x, tree.name(o)).and_then(|x| checked_packing(x, tree.name(o))))
                .filter(|x| !packed_below || x.as_ref().is_ok_and(|(_, p, _)| p.layout != BatchLayout::Dense))
            {
                Some(Ok((s, packing, note))) => {
                    shape = Some(s);
                    q_bshd = packing.bshd;
                    layout = packing.layout;
                    ragged = packing.ragged;
                    // PyTorch's flash kernel is FlashAttention-2, whose causal mask is aligned bottom-right in
                    // each sequence; only the dense SDPA path (which refuses Sq != Sk with is_causal) makes that
                    // the same as PyTorch's top-left.
                    varlen_flash = layout != BatchLayout::Dense && sig.backend == AttnBackend::Flash;
                    dtype = args.ty(sig.qkv[0]).map(str::to_string);
                    kv_cache_dtype = cache_dtype_of(&sig, args);
                    if let Some(n) = note {
                        notes.push(n);
                    }
                }
                Some(Err(why)) => suspect = Some(why),
                None => {}
            }
        }
        if mask.is_none() {
            mask = extract_mask(&sig, args);
        }
        if scale.is_none() {
            scale = sig.scale.and_then(|i| args.concrete(i)).and_then(parse_float);
        }
        if dropout.is_none() {
            dropout = sig.dropout.and_then(|i| args.concrete(i)).and_then(parse_float);
        }
        if variants.is_plain() {
            variants = extract_variants(&sig, args);
        }
    }
    let module = tree.module_path(root).into_iter().map(str::to_string).collect();
    if varlen_flash && mask == Some(MaskInfo::CausalTopLeft) {
        mask = Some(MaskInfo::CausalBottomRight);
    }
    if backend == AttnBackend::Vllm && layout == BatchLayout::Paged && mask.is_none() {
        // vLLM's paged decode ops take no mask: each sequence's one query sees its whole cache.
        mask = Some(MaskInfo::None);
    }
    AttentionCall {
        kind: Kind::Fused,
        phase,
        backend,
        op: tree.name(root).to_string(),
        module,
        shape,
        layout,
        ragged,
        dtype,
        mask: mask.unwrap_or(MaskInfo::Unknown),
        variants,
        scale,
        dropout,
        q_bshd_strides: q_bshd,
        gpu_us: 0.0,
        kernels: Vec::new(),
        grid_blocks: None,
        parts: Vec::new(),
        notes,
        suspect,
        repeat: 1,
        at: (0, 0.0),
        seqs: Vec::new(),
        kv: crate::trace::decode::KvFacts { cache_dtype: kv_cache_dtype, ..Default::default() },
    }
}

/// The element type of the K/V a call reads when it is not Q's: K's own type (a 1-byte vLLM cache is
/// `unsigned char`), or vLLM's `kv_cache_dtype` argument when it names FP8 (`fp8`, `fp8_e4m3`, `fp8_e5m2`).
fn cache_dtype_of(sig: &Signature, args: &OpArgs) -> Option<String> {
    if let QkvLayout::VllmPaged(v) = sig.layout {
        // `kv_cache_dtype` follows `alibi_slopes`, ten places after the query (csrc/torch_bindings.cpp).
        if let Some(t) = args.concrete(v.query + 10).filter(|t| crate::trace::decode::is_fp8_name(t)) {
            return Some(t.trim_matches(|c| c == '"' || c == '\'').to_string());
        }
    }
    let (q, k) = (args.ty(sig.qkv[0])?, args.ty(sig.qkv[1])?);
    (q != k).then(|| k.to_string())
}

/// A dense decode call whose K or V was converted from an FP8 store right before it
/// ([`crate::trace::decode::converted_kv`]).
fn note_converted_kv(
    tree: &OpTree<'_>,
    root: u32,
    call: &mut AttentionCall,
    sig_of: &mut impl FnMut(u32) -> Option<Signature>,
) {
    if call.phase != Phase::Fwd || !call.shape.is_some_and(|s| crate::trace::perf::is_decode(&s)) {
        return;
    }
    let Some(sig) = sig_of(root) else { return };
    let Some(args) = tree.trace.ops[root as usize].args.as_deref() else { return };
    let dims: Vec<&[i64]> = [sig.qkv[1], sig.qkv[2]].iter().filter_map(|&i| args.dim(i)).collect();
    if let Some((stored, us)) = crate::trace::decode::converted_kv(tree, root, &dims) {
        call.kv.stored_dtype = Some(stored);
        call.kv.convert_us = us;
        call.notes.push("K/V converted from an FP8 store right before the call".into());
    }
}

/// An extracted shape that lies within [`crate::trace::plausible::shape`]'s bounds, or why it does not
/// (naming the op it came from).
pub(crate) fn checked_shape<T, U>((s, a, b): (Shape, T, U), op: &str) -> Result<(Shape, T, U), String> {
    match crate::trace::plausible::shape(&s) {
        Ok(()) => Ok((s, a, b)),
        Err(why) => Err(format!("attention shape {s} of `{op}`: {why}")),
    }
}

/// A packed batch whose counts lie within [`crate::trace::plausible::ragged`]'s bounds, or why they do not.
fn checked_packing<U>((s, p, n): (Shape, Packing, U), op: &str) -> Result<(Shape, Packing, U), String> {
    match p.ragged.map(|r| crate::trace::plausible::ragged(&r)) {
        Some(Err(why)) => Err(format!("{} batch of `{op}`: {why}", p.layout.name())),
        _ => Ok((s, p, n)),
    }
}

fn orphan_call(tree: &OpTree<'_>, g: usize) -> AttentionCall {
    let trace = tree.trace;
    let act = &trace.gpu[g];
    let name = trace.names.get(act.name);
    let lower = name.to_ascii_lowercase();
    let bwd = lower.contains("bwd") || lower.contains("bprop") || lower.contains("backward");
    let op = tree.gpu_op[g];
    let module = if op != NONE { tree.module_path(op).into_iter().map(str::to_string).collect() } else { Vec::new() };
    AttentionCall {
        kind: Kind::Fused,
        phase: if bwd { Phase::Bwd } else { Phase::Fwd },
        backend: kernel_backend(name).unwrap_or(AttnBackend::Unknown),
        op: if op != NONE { tree.name(op).to_string() } else { "(no launching op)".into() },
        module,
        shape: None,
        layout: kernel_layout(name).unwrap_or_default(),
        ragged: None,
        dtype: None,
        mask: MaskInfo::Unknown,
        variants: VariantsSeen::default(),
        scale: None,
        dropout: None,
        q_bshd_strides: false,
        gpu_us: act.dur,
        kernels: vec![(name.to_string(), act.dur)],
        grid_blocks: act.grid.map(grid_blocks),
        parts: Vec::new(),
        notes: vec![
            "attention kernel with no attention op above it (CUDA graph replay, no CPU ops, or a serving library's \
             op this reader has no signature for): shape unknown"
                .into(),
        ],
        suspect: None,
        repeat: 1,
        at: (act.thread, act.ts),
        seqs: Vec::new(),
        kv: Default::default(),
    }
}

/// Parses PyTorch's printing of a float (`0.125`, `0.`, `1e-3`).
pub(crate) fn parse_float(s: &str) -> Option<f64> {
    let t = s.trim();
    let t = t.strip_suffix('.').map(|x| format!("{x}.0")).unwrap_or_else(|| t.to_string());
    t.parse::<f64>().ok().filter(|v| v.is_finite())
}

fn parse_bool(s: &str) -> Option<bool> {
    match s.trim() {
        "True" | "true" | "1" => Some(true),
        "False" | "false" | "0" => Some(false),
        _ => None,
    }
}

/// flash-attn's window, softcap and ALiBi arguments, on its (bottom-right) diagonal: a negative window side
/// is unbounded (`(-1, -1)`: no window), a cap of `0.0` is off, an `alibi_slopes` tensor turns ALiBi on.
pub(crate) fn extract_variants(sig: &Signature, args: &OpArgs) -> VariantsSeen {
    let mut seen = VariantsSeen::default();
    let v = &mut seen.variants;
    if let Some([l, r]) = sig.window {
        let side = |i: usize| {
            args.concrete(i).and_then(|s| s.trim().parse::<i64>().ok()).filter(|&x| x >= 0).map(|x| x as usize)
        };
        let w = Window { left: side(l), right: side(r) };
        if w.left.is_some() || w.right.is_some() {
            v.window = Some(w);
        }
    }
    v.softcap = sig.softcap.and_then(|i| args.concrete(i)).and_then(parse_float).filter(|&c| c > 0.0);
    seen.alibi_unrecorded = sig.alibi.and_then(|i| args.dim(i)).is_some_and(|d| !d.is_empty());
    if seen.variants.window.is_some() || seen.alibi_unrecorded {
        seen.variants.diagonal = Some(Diagonal::BottomRight);
    }
    seen
}

pub(crate) fn extract_mask(sig: &Signature, args: &OpArgs) -> Option<MaskInfo> {
    if let Some(d) = sig.mask.and_then(|i| args.dim(i)).filter(|d| !d.is_empty()) {
        let values = if args.ty(sig.mask.unwrap_or(0)) == Some("bool") { "boolean" } else { "additive" };
        return Some(MaskInfo::Explicit { values: values.into(), dims: d.to_vec() });
    }
    match sig.causal {
        CausalArg::TopLeft(i) => {
            args.concrete(i).and_then(parse_bool).map(|c| if c { MaskInfo::CausalTopLeft } else { MaskInfo::None })
        }
        CausalArg::BottomRight(i) => {
            args.concrete(i).and_then(parse_bool).map(|c| if c { MaskInfo::CausalBottomRight } else { MaskInfo::None })
        }
        CausalArg::CustomMaskType(i) => match args.concrete(i).map(str::trim) {
            Some("0") => Some(MaskInfo::None),
            Some("1") => Some(MaskInfo::CausalTopLeft),
            Some("2") => Some(MaskInfo::CausalBottomRight),
            _ => None,
        },
        CausalArg::None => None,
    }
}

fn pos(v: i64) -> Option<usize> {
    (v > 0).then_some(v as usize)
}

/// How the operands of a call are laid out, besides its shape.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Packing {
    /// Q is a `[B, S, H, D]` tensor (viewed as BHSD, or passed so).
    pub bshd: bool,
    /// Dense, varlen or paged.
    pub layout: BatchLayout,
    /// A varlen or paged batch's sequences.
    pub ragged: Option<Ragged>,
}

fn dense(bshd: bool) -> Packing {
    Packing { bshd, ..Packing::default() }
}

/// A non-negative count from dims or scalars (zero-length batches exist; negative values do not).
fn count(v: i64) -> Option<usize> {
    usize::try_from(v).ok()
}

/// An integer scalar of `Concrete Inputs`.
fn concrete_int(args: &OpArgs, i: usize) -> Option<i64> {
    args.concrete(i).and_then(|s| s.trim().parse::<i64>().ok())
}

/// Shape from Q/K/V dims; also how the operands are laid out, and a note.
pub(crate) fn extract_shape(sig: &Signature, args: &OpArgs) -> Option<(Shape, Packing, Option<String>)> {
    let [qi, ki, vi] = sig.qkv;
    let (q, k, v) = (args.dim(qi)?, args.dim(ki)?, args.dim(vi)?);
    if let Some(r) = sig.varlen_when_given {
        // The offsets are a 1-d tensor when given; an absent optional tensor is recorded with no dims.
        if args.dim(r.cu_q).is_some_and(|d| d.len() == 1) {
            return packed(r, args, q, k, v);
        }
    }
    match sig.layout {
        QkvLayout::Bhsd => {
            let (b, q, k, v) = match (q.len(), k.len(), v.len()) {
                (4, 4, 4) => (q[0], &q[1..], &k[1..], &v[1..]),
                (3, 3, 3) => (1, q, k, v),
                _ => return None,
            };
            let shape = Shape {
                b: pos(b)?,
                hq: pos(q[0])?,
                hkv: pos(k[0])?,
                sq: pos(q[1])?,
                sk: pos(k[1])?,
                d: pos(q[2])?,
                dv: pos(v[2])?,
            };
            let bshd = args.stride(qi).filter(|s| s.len() == 4).is_some_and(|s| s[1] < s[2]);
            Some((shape, dense(bshd), None))
        }
        QkvLayout::Bshd => {
            if q.len() != 4 || k.len() != 4 || v.len() != 4 {
                return None;
            }
            let shape = Shape {
                b: pos(q[0])?,
                hq: pos(q[2])?,
                hkv: pos(k[2])?,
                sq: pos(q[1])?,
                sk: pos(k[1])?,
                d: pos(q[3])?,
                dv: pos(v[3])?,
            };
            Some((shape, dense(true), None))
        }
        QkvLayout::Varlen(r) => packed(r, args, q, k, v),
        QkvLayout::VllmPaged(a) => {
            // Q `[num_seqs, Hq, D]`, one query per sequence; V's cache `[num_blocks, Hkv, Dv, block_size]`.
            let vc = args.dim(a.value_cache)?;
            if q.len() != 3 || vc.len() != 4 {
                return None;
            }
            let seqs = pos(q[0])?;
            let hkv = concrete_int(args, a.num_kv_heads).and_then(pos).or_else(|| pos(vc[1]))?;
            let page = concrete_int(args, a.block_size).and_then(pos).or_else(|| pos(vc[3]));
            let max_k = pos(concrete_int(args, a.max_seq_len)?)?;
            let shape = Shape { b: seqs, hq: pos(q[1])?, hkv, sq: 1, sk: max_k, d: pos(q[2])?, dv: pos(vc[2])? };
            let ragged = Ragged { sequences: seqs, total_q: seqs, max_q: 1, total_k: None, max_k, page_size: page };
            Some((shape, Packing { bshd: true, layout: BatchLayout::Paged, ragged: Some(ragged) }, None))
        }
        QkvLayout::None => None,
    }
}

/// A packed batch: Q `[total_q, Hq, D]` (PyTorch's efficient kernel takes `[1, total_q, Hq, D]`), K and V
/// `[total_k, Hkv, D]`, or pages `[num_pages, page_size, Hkv, D]` when a block table is passed.
fn packed(r: RaggedArgs, args: &OpArgs, q: &[i64], k: &[i64], v: &[i64]) -> Option<(Shape, Packing, Option<String>)> {
    let unit_batch = |d: &[i64]| -> Vec<i64> {
        if d.len() == 4 && d[0] == 1 {
            d[1..].to_vec()
        } else {
            d.to_vec()
        }
    };
    let q = unit_batch(q);
    let offsets = args.dim(r.cu_q)?;
    let sequences = pos(offsets.first()?.checked_sub(1)?)?;
    let max_q = count(concrete_int(args, r.max_q)?)?;
    let max_k = count(concrete_int(args, r.max_k)?)?;
    let paged = r.block_table.and_then(|i| args.dim(i)).is_some_and(|d| d.len() == 2);
    let (k, v, total_k, page_size, layout) = if paged {
        if k.len() != 4 || v.len() != 4 {
            return None;
        }
        (&k[1..], &v[1..], None, pos(k[1]), BatchLayout::Paged)
    } else {
        if k.len() < 3 || v.len() < 3 {
            return None;
        }
        let (k, v) = (&k[k.len() - 3..], &v[v.len() - 3..]);
        (k, v, Some(count(k[0])?), None, BatchLayout::Varlen)
    };
    if q.len() != 3 {
        return None;
    }
    let shape = Shape {
        b: sequences,
        hq: pos(q[1])?,
        hkv: pos(k[1])?,
        sq: (max_q > 0).then_some(max_q)?,
        sk: (max_k > 0).then_some(max_k)?,
        d: pos(q[2])?,
        dv: pos(v[2])?,
    };
    let ragged = Ragged { sequences, total_q: count(q[0])?, max_q, total_k, max_k, page_size };
    let note = format!("{} batch: Sq and Sk in the shape are the longest lengths", layout.name());
    Some((shape, Packing { bshd: true, layout, ragged: Some(ragged) }, Some(note)))
}
