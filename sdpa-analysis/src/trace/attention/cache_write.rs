//! The "write to cache" step of serving: the kernels that copy each step's new keys and values into the pages
//! of a paged KV cache (vLLM's `reshape_and_cache`, FlashInfer's `AppendPagedKVCacheKernel`). It is not
//! attention and is not counted as attention time, but paged attention brings it along, so the report names it
//! beside attention (attention-adjacent time).

use super::signature::{is_cache_write_kernel, is_cache_write_op};
use crate::trace::kineto::GpuKind;
use crate::trace::report::KernelTime;
use crate::trace::tree::{OpTree, NONE};

/// The cache-write kernels of a trace with their total GPU time, largest first: kernels named as such, and any
/// kernel launched under a cache-write op.
pub fn cache_writes(tree: &OpTree<'_>) -> Vec<KernelTime> {
    let trace = tree.trace;
    let mut out: Vec<KernelTime> = Vec::new();
    for (g, act) in trace.gpu.iter().enumerate() {
        if act.kind != GpuKind::Kernel {
            continue;
        }
        let name = trace.names.get(act.name);
        if !is_cache_write_kernel(name) && !under_cache_write_op(tree, tree.gpu_op[g]) {
            continue;
        }
        match out.iter_mut().find(|k| k.name == name) {
            Some(k) => k.total_us += act.dur,
            None => out.push(KernelTime { name: name.to_string(), total_us: act.dur }),
        }
    }
    out.sort_by(|a, b| b.total_us.total_cmp(&a.total_us));
    out
}

fn under_cache_write_op(tree: &OpTree<'_>, mut o: u32) -> bool {
    while o != NONE {
        if is_cache_write_op(tree.name(o)) {
            return true;
        }
        o = tree.parent[o as usize];
    }
    false
}

/// Adds `more` into `into`, by kernel name, largest first.
pub fn merge(into: &mut Vec<KernelTime>, more: Vec<KernelTime>) {
    for k in more {
        match into.iter_mut().find(|x| x.name == k.name) {
            Some(x) => x.total_us += k.total_us,
            None => into.push(k),
        }
    }
    into.sort_by(|a, b| b.total_us.total_cmp(&a.total_us));
}
