//! The op tree: CPU operators nested by time containment on each (pid, tid), `nn.Module` frames over them,
//! and every GPU activity linked to the operator that launched it.
//!
//! Linking order, most to least reliable: the activity's `correlation` id matched to a runtime call (which
//! also covers CUDA graph launches: every kernel of a replayed graph carries the `cudaGraphLaunch`'s
//! correlation), then the `External id` shared with the operator, then the `ac2g` flow arrows. The
//! innermost operator on the launching thread at the runtime call's time is the launcher.

use crate::trace::kineto::{GpuKind, Trace, NO_ID};
use std::collections::HashMap;

/// Marks "none" in index vectors.
pub const NONE: u32 = u32::MAX;

/// Slack for time comparisons, µs (traces print microseconds with 3 decimals).
const EPS: f64 = 1e-3;

/// How GPU activities were tied to operators.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct LinkStats {
    /// Through the runtime call's `correlation`.
    pub by_correlation: u64,
    /// Through `External id`.
    pub by_external_id: u64,
    /// Through `ac2g` flow arrows.
    pub by_flow: u64,
    /// Not tied to any operator.
    pub unlinked: u64,
    /// Kernels launched by `cudaGraphLaunch` (attributed to the op that replayed the graph).
    pub graph_kernels: u64,
}

/// The tree over one [`Trace`].
#[derive(Debug)]
pub struct OpTree<'t> {
    /// The trace.
    pub trace: &'t Trace,
    /// Parent operator of each op, or [`NONE`].
    pub parent: Vec<u32>,
    /// Innermost `nn.Module` frame around each op, or [`NONE`].
    pub module: Vec<u32>,
    /// Enclosing module frame of each module frame, or [`NONE`].
    pub module_parent: Vec<u32>,
    /// Per thread: its ops in pre-order (start time, longer first).
    pub thread_ops: Vec<Vec<u32>>,
    /// Position of each op in its thread's `thread_ops`.
    pub pos: Vec<u32>,
    /// Launching op of each GPU activity, or [`NONE`].
    pub gpu_op: Vec<u32>,
    /// GPU time (µs) of the activities launched by each op and its descendants.
    pub incl_gpu_us: Vec<f64>,
    /// Linking counters.
    pub links: LinkStats,
}

impl<'t> OpTree<'t> {
    /// Builds the tree and links the GPU activities.
    pub fn build(trace: &'t Trace) -> Self {
        let n_threads = trace.threads.len();
        let mut by_thread_ops: Vec<Vec<u32>> = vec![Vec::new(); n_threads];
        let mut by_thread_mods: Vec<Vec<u32>> = vec![Vec::new(); n_threads];
        let mut by_thread_launches: Vec<Vec<u32>> = vec![Vec::new(); n_threads];
        for (i, op) in trace.ops.iter().enumerate() {
            by_thread_ops[op.thread as usize].push(i as u32);
        }
        for (i, m) in trace.modules.iter().enumerate() {
            by_thread_mods[m.thread as usize].push(i as u32);
        }
        for (i, l) in trace.launches.iter().enumerate() {
            by_thread_launches[l.thread as usize].push(i as u32);
        }
        let ops = &trace.ops;
        let mods = &trace.modules;
        let nested_order =
            |a_ts: f64, a_dur: f64, b_ts: f64, b_dur: f64| a_ts.total_cmp(&b_ts).then_with(|| b_dur.total_cmp(&a_dur));
        for v in &mut by_thread_ops {
            v.sort_by(|&a, &b| {
                let (a, b) = (&ops[a as usize], &ops[b as usize]);
                nested_order(a.ts, a.dur, b.ts, b.dur)
            });
        }
        for v in &mut by_thread_mods {
            v.sort_by(|&a, &b| {
                let (a, b) = (&mods[a as usize], &mods[b as usize]);
                nested_order(a.ts, a.dur, b.ts, b.dur)
            });
        }
        for v in &mut by_thread_launches {
            v.sort_by(|&a, &b| trace.launches[a as usize].ts.total_cmp(&trace.launches[b as usize].ts));
        }

        let mut parent = vec![NONE; ops.len()];
        let mut module = vec![NONE; ops.len()];
        let mut module_parent = vec![NONE; mods.len()];
        let mut pos = vec![0u32; ops.len()];
        let mut launch_op = vec![NONE; trace.launches.len()];

        for t in 0..n_threads {
            // Module frames nest among themselves.
            let mut mstack: Vec<u32> = Vec::new();
            for &m in &by_thread_mods[t] {
                let e = &mods[m as usize];
                pop_until_contains(&mut mstack, e.ts, e.ts + e.dur, |i| {
                    let x = &mods[i as usize];
                    (x.ts, x.ts + x.dur)
                });
                module_parent[m as usize] = mstack.last().copied().unwrap_or(NONE);
                mstack.push(m);
            }
            // Ops nest among themselves; each op's module is the innermost frame containing its start.
            let tm = &by_thread_mods[t];
            let mut mi = 0usize;
            mstack.clear();
            let mut ostack: Vec<u32> = Vec::new();
            for (k, &o) in by_thread_ops[t].iter().enumerate() {
                let e = &ops[o as usize];
                pos[o as usize] = k as u32;
                pop_until_contains(&mut ostack, e.ts, e.ts + e.dur, |i| {
                    let x = &ops[i as usize];
                    (x.ts, x.ts + x.dur)
                });
                parent[o as usize] = ostack.last().copied().unwrap_or(NONE);
                ostack.push(o);
                while mi < tm.len() && mods[tm[mi] as usize].ts <= e.ts + EPS {
                    let m = &mods[tm[mi] as usize];
                    pop_until_contains(&mut mstack, m.ts, m.ts + m.dur, |i| {
                        let x = &mods[i as usize];
                        (x.ts, x.ts + x.dur)
                    });
                    mstack.push(tm[mi]);
                    mi += 1;
                }
                while let Some(&top) = mstack.last() {
                    let m = &mods[top as usize];
                    if m.ts + m.dur + EPS >= e.ts {
                        break;
                    }
                    mstack.pop();
                }
                module[o as usize] = mstack.last().copied().unwrap_or(NONE);
            }
            // Each runtime call belongs to the innermost op around it.
            let to = &by_thread_ops[t];
            let mut oi = 0usize;
            ostack.clear();
            for &l in &by_thread_launches[t] {
                let ts = trace.launches[l as usize].ts;
                while oi < to.len() && ops[to[oi] as usize].ts <= ts + EPS {
                    let e = &ops[to[oi] as usize];
                    pop_until_contains(&mut ostack, e.ts, e.ts + e.dur, |i| {
                        let x = &ops[i as usize];
                        (x.ts, x.ts + x.dur)
                    });
                    ostack.push(to[oi]);
                    oi += 1;
                }
                while let Some(&top) = ostack.last() {
                    let x = &ops[top as usize];
                    if x.ts + x.dur + EPS >= ts {
                        break;
                    }
                    ostack.pop();
                }
                launch_op[l as usize] = ostack.last().copied().unwrap_or(NONE);
            }
        }

        // GPU activity -> launching op.
        let mut links = LinkStats::default();
        let corr: HashMap<i64, u32> =
            trace.launches.iter().enumerate().map(|(i, l)| (l.correlation, i as u32)).collect();
        let mut ext: Option<HashMap<i64, u32>> = None;
        let mut flows: Option<(FlowEnds, FlowStarts)> = None;
        let mut gpu_op = vec![NONE; trace.gpu.len()];
        for (g, act) in trace.gpu.iter().enumerate() {
            if act.correlation != NO_ID {
                if let Some(&l) = corr.get(&act.correlation) {
                    let op = launch_op[l as usize];
                    if op != NONE {
                        gpu_op[g] = op;
                        links.by_correlation += 1;
                        if act.kind == GpuKind::Kernel
                            && trace.names.get(trace.launches[l as usize].name).contains("GraphLaunch")
                        {
                            links.graph_kernels += 1;
                        }
                        continue;
                    }
                }
            }
            if act.ext_id != NO_ID {
                let map = ext.get_or_insert_with(|| {
                    trace
                        .ops
                        .iter()
                        .enumerate()
                        .filter(|(_, o)| o.ext_id != NO_ID)
                        .map(|(i, o)| (o.ext_id, i as u32))
                        .collect()
                });
                if let Some(&op) = map.get(&act.ext_id) {
                    gpu_op[g] = op;
                    links.by_external_id += 1;
                    continue;
                }
            }
            let (ends, starts) = flows.get_or_insert_with(|| {
                let ends = trace.flow_ends.iter().map(|f| ((f.thread, f.ts.to_bits()), f.id)).collect();
                let starts = trace.flow_starts.iter().map(|f| (f.id, (f.thread, f.ts))).collect();
                (ends, starts)
            });
            let via_flow =
                ends.get(&(act.thread, act.ts.to_bits())).and_then(|id| starts.get(id)).and_then(|&(t, ts)| {
                    let ls = by_thread_launches.get(t as usize)?;
                    let k = ls.partition_point(|&l| trace.launches[l as usize].ts < ts - EPS);
                    let l = *ls.get(k)?;
                    ((trace.launches[l as usize].ts - ts).abs() <= EPS).then_some(launch_op[l as usize])
                });
            match via_flow {
                Some(op) if op != NONE => {
                    gpu_op[g] = op;
                    links.by_flow += 1;
                }
                _ => links.unlinked += 1,
            }
        }

        let mut incl_gpu_us = vec![0.0f64; ops.len()];
        for (g, act) in trace.gpu.iter().enumerate() {
            let mut o = gpu_op[g];
            while o != NONE {
                incl_gpu_us[o as usize] += act.dur;
                o = parent[o as usize];
            }
        }

        OpTree { trace, parent, module, module_parent, thread_ops: by_thread_ops, pos, gpu_op, incl_gpu_us, links }
    }

    /// Name of op `o`.
    pub fn name(&self, o: u32) -> &'t str {
        self.trace.names.get(self.trace.ops[o as usize].name)
    }

    /// True when `anc` is `o` or one of its ancestors.
    pub fn is_within(&self, mut o: u32, anc: u32) -> bool {
        while o != NONE {
            if o == anc {
                return true;
            }
            o = self.parent[o as usize];
        }
        false
    }

    /// The ops of `root`'s subtree (root first), in pre-order.
    pub fn subtree(&self, root: u32) -> impl Iterator<Item = u32> + '_ {
        let t = self.trace.ops[root as usize].thread as usize;
        let list = &self.thread_ops[t];
        let start = self.pos[root as usize] as usize;
        list[start..].iter().copied().take_while(move |&o| self.is_within(o, root))
    }

    /// The `nn.Module` path of op `o`, outermost first, without the `nn.Module: ` prefix.
    pub fn module_path(&self, o: u32) -> Vec<&'t str> {
        let mut out = Vec::new();
        let mut m = self.module[o as usize];
        while m != NONE {
            let name = self.trace.names.get(self.trace.modules[m as usize].name);
            out.push(name.strip_prefix("nn.Module: ").unwrap_or(name));
            m = self.module_parent[m as usize];
        }
        out.reverse();
        out
    }
}

/// Flow end points keyed by (thread, start-time bits) -> flow id.
type FlowEnds = HashMap<(u32, u64), i64>;
/// Flow start points: id -> (thread, time).
type FlowStarts = HashMap<i64, (u32, f64)>;

/// Pops frames that do not contain `[start, end]`.
fn pop_until_contains(stack: &mut Vec<u32>, start: f64, end: f64, span: impl Fn(u32) -> (f64, f64)) {
    while let Some(&top) = stack.last() {
        let (s, e) = span(top);
        if s <= start + EPS && end <= e + EPS {
            break;
        }
        stack.pop();
    }
}
