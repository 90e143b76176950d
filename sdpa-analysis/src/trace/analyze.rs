//! The pipeline: parse each trace file, build its op tree, detect attention, then group, model and judge
//! all calls together (a directory of per-rank files gives one report, read one file at a time, with each
//! rank's attention time and communication overlap in [`crate::trace::ranks`]; a rank file that cannot be
//! read is reported and the others analysed, unless [`Options::strict`]).

use crate::error::{AnalysisError, Result};
use crate::trace::attention::{self, AttentionCall, Kind};
use crate::trace::findings;
use crate::trace::kineto::{parse_file_with_progress, DeviceProps, Progress, Trace};
use crate::trace::ranks::{self, RankStats};
use crate::trace::report::{self, DeviceInfo, KernelTime, Summary, Suspect, TraceInfo, TraceReport};
use crate::trace::timeline::Timeline;
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
    /// For a directory: fail on the first file that cannot be read, instead of reporting it and analysing
    /// the others.
    pub strict: bool,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("device", &self.device)
            .field("bench", &self.bench.len())
            .field("progress", &self.progress.is_some())
            .field("strict", &self.strict)
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
///
/// A single file that cannot be read is an error. In a directory, every file that can be read is analysed
/// and each one that cannot is named in the report's `unreadable` and `missing`; it is an error only when
/// no file could be read, or with [`Options::strict`]. Files are read one at a time: each is parsed, analysed
/// and dropped before the next, so a directory of large rank files needs the memory of one.
pub fn analyze_path(path: &Path, opts: &Options) -> Result<TraceReport> {
    let files = trace_files(path)?;
    let is_dir = path.is_dir();
    let mut run = Run::default();
    let mut unreadable: Vec<AnalysisError> = Vec::new();
    for f in &files {
        match read_trace(f, opts) {
            Ok(t) => run.add(&t),
            Err(e) if is_dir && !opts.strict => unreadable.push(e),
            Err(e) => return Err(e),
        }
    }
    if run.inputs.is_empty() {
        let why: Vec<String> = unreadable.iter().map(|e| e.to_string()).collect();
        return Err(AnalysisError::invalid(
            path,
            format!("none of the {} trace files could be read: {}", files.len(), why.join("; ")),
        ));
    }
    Ok(run.finish(unreadable.iter().map(|e| e.to_string()).collect(), opts))
}

fn read_trace(f: &Path, opts: &Options) -> Result<Trace> {
    let t = parse_file_with_progress(f, opts.progress.clone())?;
    if t.stats.events == 0 {
        return Err(AnalysisError::invalid(f, "no trace events (an empty traceEvents list)"));
    }
    Ok(t)
}

/// Analyses parsed traces as one run.
pub fn analyze_traces(traces: &[Trace], opts: &Options) -> TraceReport {
    let mut run = Run::default();
    for t in traces {
        run.add(t);
    }
    run.finish(Vec::new(), opts)
}

/// What the traces of one run add up to, gathered one trace at a time (nothing of a trace is kept but what
/// its analysis found).
#[derive(Default)]
struct Run {
    inputs: Vec<String>,
    calls: Vec<AttentionCall>,
    total_gpu: f64,
    info: TraceInfo,
    missing: Vec<String>,
    suspect: Vec<Suspect>,
    cache_writes: Vec<KernelTime>,
    /// The first trace's first device (the one efficiency is measured against).
    device: Option<DeviceProps>,
    ranks: Vec<RankStats>,
    /// Launch gaps of each trace's decode loop.
    decode_gaps: Vec<crate::trace::decode::DecodeGaps>,
    /// The input (index into `inputs`) each call came from: the timeline's rows per file.
    call_inputs: Vec<usize>,
}

impl Run {
    fn add(&mut self, t: &Trace) {
        let name = t.path.display().to_string();
        for i in &t.implausible {
            self.suspect.push(Suspect {
                input: Some(name.clone()),
                what: i.what.to_string(),
                count: i.count,
                example: i.example.clone(),
                effect: "events left out of GPU time, the op tree and attention".into(),
            });
        }
        let tree = OpTree::build(t);
        let calls = attention::detect(&tree);
        self.decode_gaps.extend(crate::trace::decode::gaps(t, &calls));
        self.ranks.push(RankStats::of(t, &tree, &calls));
        self.calls.extend(calls);
        self.call_inputs.resize(self.calls.len(), self.inputs.len());
        attention::cache_write::merge(&mut self.cache_writes, attention::cache_write::cache_writes(&tree));
        self.total_gpu += t.gpu.iter().fold(0.0, |a, g| a + g.dur);
        let info = &mut self.info;
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
            if !self.missing.contains(&m) {
                self.missing.push(m);
            }
        }
        if self.inputs.is_empty() {
            self.device = t.devices.first().cloned();
        }
        self.inputs.push(name);
    }

    /// The report, with the errors of the files of the same directory that could not be read.
    fn finish(self, unreadable: Vec<String>, opts: &Options) -> TraceReport {
        let mut missing: Vec<String> =
            unreadable.iter().map(|e| format!("{e} (this file is left out; the report covers the others)")).collect();
        missing.extend(self.missing);
        let dev = self.device.as_ref();
        let device = DeviceInfo::resolve(
            dev.map(|d| d.name.as_str()),
            dev.and_then(|d| d.num_sms),
            opts.device.as_deref(),
            "trace",
        );
        if device.key.is_none() {
            let what = match (&opts.device, dev) {
                (Some(k), _) => format!("--device `{k}` is not in the hardware table"),
                (None, Some(d)) => format!("device `{}` is not in the hardware table", d.name),
                (None, None) => "the trace has no deviceProperties".to_string(),
            };
            missing.push(format!(
                "{what}: efficiency and bound are not computed; pass --device (e.g. h100-sxm, a100-80gb)"
            ));
        }
        let causal = self.calls.iter().any(|c| c.mask.causal() == Some(true));
        let mut report = build_report(
            self.inputs,
            device,
            &self.calls,
            self.total_gpu,
            missing,
            self.suspect,
            self.info,
            self.cache_writes,
            opts,
            &self.call_inputs,
        );
        report.unreadable = unreadable;
        crate::trace::decode::attach_gaps(&mut report, self.decode_gaps);
        if let Some(r) = ranks::report(self.ranks, causal) {
            report.findings.extend(ranks::findings(&r));
            // The same order as `findings::findings`: most severe first, then the most time at stake.
            report.findings.sort_by(|a, b| {
                a.severity.cmp(&b.severity).then(b.time_us.unwrap_or(0.0).total_cmp(&a.time_us.unwrap_or(0.0)))
            });
            report.ranks = Some(r);
        }
        report
    }
}

#[allow(clippy::too_many_arguments)] // one call per input kind (traces, TraceLens); a struct would only rename them
pub(crate) fn build_report(
    inputs: Vec<String>,
    device: DeviceInfo,
    calls: &[AttentionCall],
    total_gpu: f64,
    mut missing: Vec<String>,
    mut suspect: Vec<Suspect>,
    info: TraceInfo,
    cache_writes: Vec<KernelTime>,
    opts: &Options,
    call_inputs: &[usize],
) -> TraceReport {
    // fold from +0.0: an empty float sum is -0.0, which prints as "-0.0".
    let time = |k: Kind| calls.iter().filter(|c| c.kind == k).fold(0.0, |a, c| a + c.gpu_us * c.repeat as f64);
    let (fused, unfused) = (time(Kind::Fused), time(Kind::Unfused));
    let attention = fused + unfused;
    // Every GPU activity is counted once, by one call at most, so attention cannot exceed the GPU time it is
    // part of; the TraceLens reader checks its metadata the same way. Should an input still manage it, the
    // share is taken against attention itself and the report says why, rather than printing "192292.7 %".
    let total_gpu = if attention > total_gpu * (1.0 + 1e-9) {
        missing.push(format!(
            "attention kernel time ({attention:.1} µs) exceeds the total GPU time ({total_gpu:.1} µs): the input \
             counts some GPU time twice or is inconsistent; shares are relative to attention alone"
        ));
        attention
    } else {
        total_gpu
    };
    let (ops, op_of_call) = report::group_indexed(calls, total_gpu, device.hardware());
    let timeline = Timeline::build(calls, &op_of_call, call_inputs, &inputs);
    for c in calls {
        if let Some(why) = &c.suspect {
            let effect = "shape left out: no FLOPs, efficiency or replay";
            Suspect::tally(&mut suspect, None, "attention shape", why, effect, c.repeat);
        }
    }
    for o in &ops {
        if let Some(why) = o.suspect.as_deref().filter(|w| w.starts_with("achieved rate")) {
            let example = format!("{} {}: {why}", o.backend.name(), o.shape_label());
            let effect = "FLOPs, efficiency and replay left out";
            Suspect::tally(&mut suspect, None, "achieved rate", &example, effect, o.count as u64);
        }
    }
    let summary = Summary {
        total_gpu_time_us: total_gpu,
        attention_time_us: attention,
        attention_share: if total_gpu > 0.0 { attention / total_gpu } else { 0.0 },
        fused_time_us: fused,
        unfused_time_us: unfused,
        attention_calls: calls.iter().map(|c| c.repeat as usize).sum(),
        fused_kernels_in_use: calls.iter().any(|c| c.kind == Kind::Fused && c.backend.is_fused_kernel()),
        cache_write_time_us: cache_writes.iter().fold(0.0, |a, k| a + k.total_us),
        cache_write_kernels: cache_writes,
    };
    let findings = findings::findings(&ops, &summary, &device, &missing, &opts.bench);
    TraceReport {
        inputs,
        device,
        summary,
        attention_ops: ops,
        findings,
        missing,
        suspect,
        unreadable: Vec::new(),
        trace: info,
        ranks: None,
        decode_gaps: Vec::new(),
        timeline,
    }
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
