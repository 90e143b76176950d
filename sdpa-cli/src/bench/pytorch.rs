//! Running `bench/pytorch_sdpa.py` on the sweep's shapes in the same invocation, so every ratio against
//! PyTorch is measured side by side on the same machine, and merging its records into ours.

use super::plan::{Case, Timing};
use anyhow::{bail, Context, Result};
use sdpa_core::record::BenchSpec;
use sdpa_core::record::{parse_results, BenchFile, Skipped};
use sdpa_core::{AttentionCost, AttentionSpec, Layout, Pass, RaggedRequest};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Whether to run PyTorch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Never.
    Off,
    /// When `import torch` works.
    Auto,
    /// Always; an error when it cannot run.
    Required,
}

/// What the script is asked to do.
#[derive(Debug)]
pub struct Request<'a> {
    pub mode: Mode,
    pub python: &'a str,
    pub script: Option<&'a Path>,
    pub kernels: Option<&'a str>,
    pub threads: Option<usize>,
    /// Timing flags given on the command line (the spec's per-sweep values apply otherwise).
    pub warmup: Option<usize>,
    pub reps: Option<usize>,
    pub max_time_s: Option<f64>,
    pub check: bool,
    pub seed: u64,
    pub out_path: &'a Path,
}

fn find_script(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = explicit {
        return Some(p.to_path_buf());
    }
    let here = PathBuf::from("bench").join("pytorch_sdpa.py");
    if here.is_file() {
        return Some(here);
    }
    // The repository this binary was built from.
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("bench").join("pytorch_sdpa.py");
    built.is_file().then_some(built)
}

fn torch_importable(python: &str) -> std::result::Result<(), String> {
    match Command::new(python).args(["-c", "import torch"]).stdout(Stdio::null()).stderr(Stdio::piped()).output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            Err(err.lines().last().unwrap_or("import torch failed").trim().to_string())
        }
        Err(e) => Err(format!("cannot start `{python}`: {e}")),
    }
}

/// Runs the script once per device with the cases of that device; merges what it wrote into `file`.
pub fn run(req: &Request<'_>, cases: &[(String, Case, Timing)], file: &mut BenchFile) -> Result<()> {
    if req.mode == Mode::Off || cases.is_empty() {
        return Ok(());
    }
    if let Err(why) = torch_importable(req.python) {
        if req.mode == Mode::Required {
            bail!("the PyTorch comparison was asked for but `{} -c \"import torch\"` fails: {why}", req.python);
        }
        eprintln!("sdpa bench: PyTorch comparison skipped: torch is not importable by {} ({why})", req.python);
        return Ok(());
    }
    let Some(script) = find_script(req.script) else {
        let msg = "bench/pytorch_sdpa.py not found (run from the repository root or pass --pytorch-script)";
        if req.mode == Mode::Required {
            bail!("{msg}");
        }
        eprintln!("sdpa bench: PyTorch comparison skipped: {msg}");
        return Ok(());
    };
    let mut devices: Vec<&str> = cases.iter().map(|(d, _, _)| d.as_str()).collect();
    devices.dedup();
    devices.sort_unstable();
    devices.dedup();
    let single_device = devices.len() == 1;
    let mut errors = Vec::new();
    for dev in devices {
        let sweeps: Vec<BenchSpec> =
            cases.iter().filter(|(d, _, _)| d == dev).map(|(_, c, t)| case_spec(c, t)).collect();
        let stem = req.out_path.with_extension("");
        let spec_path = PathBuf::from(format!("{}.pytorch-{dev}.spec.json", stem.display()));
        let out_path = PathBuf::from(format!("{}.pytorch-{dev}.json", stem.display()));
        std::fs::write(&spec_path, serde_json::to_string_pretty(&sweeps)? + "\n")
            .with_context(|| format!("cannot write {}", spec_path.display()))?;
        let mut cmd = Command::new(req.python);
        cmd.arg(&script)
            .arg("--spec")
            .arg(&spec_path)
            .arg("--device")
            .arg(dev)
            .arg("--out")
            .arg(&out_path)
            .arg("--seed")
            .arg(req.seed.to_string());
        if let Some(w) = req.warmup {
            cmd.arg("--warmup").arg(w.to_string());
        }
        if let Some(r) = req.reps {
            cmd.arg("--reps").arg(r.to_string());
        }
        if let Some(t) = req.max_time_s {
            cmd.arg("--max-time").arg(t.to_string());
        }
        if let Some(k) = req.kernels {
            cmd.arg("--kernels").arg(k);
        }
        if let Some(t) = req.threads {
            cmd.arg("--threads").arg(t.to_string());
        }
        if !req.check {
            cmd.arg("--no-check");
        }
        eprintln!("sdpa bench: timing PyTorch on {dev} ({} shapes): {}", sweeps.len(), script.display());
        let status = cmd.stdin(Stdio::null()).status();
        let outcome = match status {
            Ok(s) if s.success() => match std::fs::read_to_string(&out_path) {
                Ok(text) => parse_results(&text, &out_path.display().to_string()).map_err(|e| e.to_string()),
                Err(e) => Err(format!("cannot read {}: {e}", out_path.display())),
            },
            Ok(s) => Err(format!("{} exited with {s}", script.display())),
            Err(e) => Err(format!("cannot start {}: {e}", req.python)),
        };
        match outcome {
            // A bandwidth the script measured (for paged decoding) holds for every record only when they all
            // ran on its device.
            Ok(theirs) => merge(file, theirs, single_device),
            Err(why) => {
                for (_, c, _) in cases.iter().filter(|(d, _, _)| d == dev) {
                    file.skipped.push(Skipped {
                        backend: "pytorch".into(),
                        kernel: "all".into(),
                        dtype: c.dtype,
                        shape: c.shape,
                        mask: c.mask.name().into(),
                        layout: Some(c.layout.name().into()),
                        variants: c.spec().recorded_variants(),
                        reason: match c.pass {
                            Pass::Fwd => why.clone(),
                            p => format!("[{p}] {why}"),
                        },
                        failed: true,
                    });
                }
                errors.push(format!("{dev}: {why}"));
            }
        }
    }
    if !errors.is_empty() && req.mode == Mode::Required {
        bail!("PyTorch timing failed: {}", errors.join("; "));
    }
    for e in errors {
        eprintln!("sdpa bench: PyTorch timing failed: {e}");
    }
    Ok(())
}

/// A one-configuration sweep for the script, with its sweep's timing.
fn case_spec(c: &Case, t: &Timing) -> BenchSpec {
    BenchSpec {
        warmup: t.warmup,
        reps: t.reps,
        max_time_s: t.max_time_s,
        dtypes: vec![c.dtype],
        shapes: vec![c.shape],
        masks: vec![c.mask.name().to_string()],
        layouts: vec![c.layout],
        // Plain cases name no variants, so the script's spec reads as before variants existed.
        variants: if c.variants.is_plain() { Vec::new() } else { vec![c.variants.clone()] },
        // The lengths and pages, resolved against the shape (whose Sq/Sk are their bounds) as ours were.
        batches: c.ragged.as_ref().map(RaggedRequest::of).into_iter().collect(),
        // The forward names no pass, so the script's spec reads as before backward passes existed.
        passes: if c.pass == Pass::Fwd { Vec::new() } else { vec![c.pass] },
        ..Default::default()
    }
}

/// Adds the script's records, with TFLOPS and GB/s recomputed by our cost model so both sides use the
/// same FLOP and byte counts (a window counts the work it leaves, a backward its own five products), and the
/// ceilings it measured when asked.
fn merge(file: &mut BenchFile, theirs: BenchFile, take_ceilings: bool) {
    if take_ceilings && file.ceilings.is_none() {
        file.ceilings = theirs.ceilings;
    }
    for mut r in theirs.records {
        if let Ok(mask) = super::plan::parse_mask(&r.mask, &r.shape) {
            let spec = AttentionSpec::new(r.shape, r.dtype);
            let spec = match &r.ragged {
                Some(g) => spec.with_ragged(g.clone(), Layout::Bshd),
                None => spec,
            };
            let spec = spec.with_mask(mask).with_variants(r.variants.clone());
            if spec.validate().is_ok() {
                let cost = AttentionCost::of_pass(&spec, r.pass);
                r.tflops = cost.tflops(r.time_ms.median);
                r.gbps = cost.gbps(r.time_ms.median);
            }
        }
        if r.layout.is_none() {
            r.layout = Some(Layout::Bhsd.name().to_string());
        }
        file.records.push(r);
    }
    file.skipped.extend(theirs.skipped);
}
