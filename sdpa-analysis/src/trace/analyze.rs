//! The pipeline: parse each trace file, build its op tree, detect attention, then group, model and judge
//! all calls together (a directory of per-rank files gives one report).

use crate::error::{AnalysisError, Result};
use crate::trace::attention::{self, AttentionCall, Kind};
use crate::trace::findings;
use crate::trace::kineto::{parse_file_with_progress, Progress, Trace};
use crate::trace::report::{self, DeviceInfo, Summary, TraceInfo, TraceReport};
use crate::trace::tree::OpTree;
use sdpa_core::BenchRecord;
use std::path::{Path, PathBuf};

/// Analysis options.
#[derive(Clone, Default)]
pub struct Options {
    /// Hardware-table key or device name that overrides the trace's `deviceProperties`.
    pub device: Option<String>,
    /// Our benchmark records, for measured Path A speedups.
    pub bench: Vec<BenchRecord>,
    /// Called with (file bytes read, file size) while each trace file is parsed.
    pub progress: Option<Progress>,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("device", &self.device)
            .field("bench", &self.bench.len())
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// Trace files under a path: the file itself, or the `.json` / `.json.gz` files of a directory (sorted).
pub fn trace_files(path: &Path) -> Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(path).map_err(|e| AnalysisError::io(path, "cannot open", e))?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let rd = std::fs::read_dir(path).map_err(|e| AnalysisError::io(path, "cannot list directory", e))?;
    let mut files = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| AnalysisError::io(path, "cannot list directory", e))?;
        let p = entry.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if p.is_file() && (name.ends_with(".json") || name.ends_with(".json.gz")) {
            files.push(p);
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(AnalysisError::invalid(path, "directory holds no .json or .json.gz trace files"));
    }
    Ok(files)
}

/// Analyses a trace file or a directory of per-rank trace files.
pub fn analyze_path(path: &Path, opts: &Options) -> Result<TraceReport> {
    let files = trace_files(path)?;
    let mut traces = Vec::with_capacity(files.len());
    for f in &files {
        let t = parse_file_with_progress(f, opts.progress.clone())?;
        if t.stats.events == 0 {
            return Err(AnalysisError::invalid(
                f,
                "no trace events (an empty traceEvents list, or not a PyTorch profiler trace)",
            ));
        }
        traces.push(t);
    }
    Ok(analyze_traces(&traces, opts))
}

/// Analyses parsed traces as one run.
pub fn analyze_traces(traces: &[Trace], opts: &Options) -> TraceReport {
    let mut calls: Vec<AttentionCall> = Vec::new();
    let mut total_gpu = 0.0;
    let mut info = TraceInfo::default();
    let mut missing: Vec<String> = Vec::new();
    for t in traces {
        let tree = OpTree::build(t);
        calls.extend(attention::detect(&tree));
        total_gpu += t.gpu.iter().fold(0.0, |a, g| a + g.dur);
        info.events += t.stats.events;
        info.bytes += t.stats.bytes;
        info.cpu_ops += t.ops.len() as u64;
        info.gpu_activities += t.gpu.len() as u64;
        info.links.by_correlation += tree.links.by_correlation;
        info.links.by_external_id += tree.links.by_external_id;
        info.links.by_flow += tree.links.by_flow;
        info.links.unlinked += tree.links.unlinked;
        info.links.graph_kernels += tree.links.graph_kernels;
        for m in missing_in(t, &tree) {
            if !missing.contains(&m) {
                missing.push(m);
            }
        }
    }
    let first = traces.first();
    let dev = first.and_then(|t| t.devices.first());
    let device =
        DeviceInfo::resolve(dev.map(|d| d.name.as_str()), dev.and_then(|d| d.num_sms), opts.device.as_deref(), "trace");
    if device.key.is_none() {
        let what = match (&opts.device, dev) {
            (Some(k), _) => format!("--device `{k}` is not in the hardware table"),
            (None, Some(d)) => format!("device `{}` is not in the hardware table", d.name),
            (None, None) => "the trace has no deviceProperties".to_string(),
        };
        missing
            .push(format!("{what}: efficiency and bound are not computed; pass --device (e.g. h100-sxm, a100-80gb)"));
    }
    build_report(
        traces.iter().map(|t| t.path.display().to_string()).collect(),
        device,
        &calls,
        total_gpu,
        missing,
        info,
        opts,
    )
}

pub(crate) fn build_report(
    inputs: Vec<String>,
    device: DeviceInfo,
    calls: &[AttentionCall],
    total_gpu: f64,
    missing: Vec<String>,
    info: TraceInfo,
    opts: &Options,
) -> TraceReport {
    let ops = report::group(calls, total_gpu, device.hardware());
    // fold from +0.0: an empty float sum is -0.0, which prints as "-0.0".
    let fused = calls.iter().filter(|c| c.kind == Kind::Fused).fold(0.0, |a, c| a + c.gpu_us);
    let unfused = calls.iter().filter(|c| c.kind == Kind::Unfused).fold(0.0, |a, c| a + c.gpu_us);
    let attention = fused + unfused;
    let summary = Summary {
        total_gpu_time_us: total_gpu,
        attention_time_us: attention,
        attention_share: if total_gpu > 0.0 { attention / total_gpu } else { 0.0 },
        fused_time_us: fused,
        unfused_time_us: unfused,
        attention_calls: calls.len(),
        fused_kernels_in_use: calls.iter().any(|c| c.kind == Kind::Fused && c.backend.is_fused_kernel()),
    };
    let findings = findings::findings(&ops, &summary, &device, &missing, &opts.bench);
    TraceReport { inputs, device, summary, attention_ops: ops, findings, missing, trace: info }
}

fn missing_in(t: &Trace, tree: &OpTree<'_>) -> Vec<String> {
    let mut m = Vec::new();
    let name = t.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if t.ops.is_empty() && !t.gpu.is_empty() {
        m.push(format!(
            "{name}: no CPU ops: kernels cannot be tied to ops, attention is found from kernel names only and \
             shapes are unknown"
        ));
    } else if !t.ops.is_empty() && t.ops_with_shapes == 0 {
        m.push(format!(
            "{name}: recorded without shapes (record_shapes=False): shapes, FLOPs and efficiency are unknown, and \
             unfused attention (recognised by its shapes) cannot be detected"
        ));
    }
    if t.python_events == 0 && !t.ops.is_empty() {
        m.push(format!(
            "{name}: recorded without Python stacks or modules (with_stack/with_modules off): module paths are \
             unknown; unfused chains are matched by op order on each thread"
        ));
    } else if t.modules.is_empty() && t.python_events > 0 {
        m.push(format!("{name}: Python frames but no nn.Module frames (with_modules off): module paths are unknown"));
    }
    if t.gpu.is_empty() {
        m.push(format!("{name}: no GPU kernels in the trace: GPU time is zero"));
    }
    if tree.links.unlinked > 0 {
        m.push(format!(
            "{name}: {} GPU activities could not be tied to a launching op (no matching correlation, External id \
             or flow)",
            tree.links.unlinked
        ));
    }
    m
}
