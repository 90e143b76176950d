//! `cargo xtask bench`: the main job. Builds the `sdpa` binary in release mode, runs `sdpa bench` on a
//! preset (the quick sweep by default: CPU, plus the GPU when one is present, plus PyTorch side by side when
//! torch is importable), writes the records under `target/bench/`, and renders `report.md` and
//! `report.html` (with SVG plots) there with `sdpa report`.

use crate::project_root;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

const HELP: &str = "\
cargo xtask bench [options] [-- <extra sdpa bench flags>]

  --preset NAMES   comma-separated presets to run (default: quick); see `sdpa bench --help`
  --full           the full sweeps: seed, decode and fa2bench (fa2bench needs a GPU)
  --out-dir DIR    where records and the report go (default: target/bench)
  --baseline B     report speedups against B (e.g. pytorch:flash; default: PyTorch's best, else unfused)
  --device KEY     report efficiency against this hardware-table entry (e.g. zen5-2c, h100-sxm)
  --no-build       use the sdpa binary already built in release mode
  -h, --help       this text

Extra flags after `--` go to every `sdpa bench` call, e.g. `-- --backend cpu --threads 2`.
";

struct Opts {
    presets: Vec<String>,
    out_dir: PathBuf,
    baseline: Option<String>,
    device: Option<String>,
    build: bool,
    extra: Vec<String>,
}

fn parse(args: &[String]) -> Result<Option<Opts>> {
    let mut o = Opts {
        presets: vec!["quick".into()],
        out_dir: project_root().join("target").join("bench"),
        baseline: None,
        device: None,
        build: true,
        extra: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-h" | "--help" => {
                print!("{HELP}");
                return Ok(None);
            }
            "--preset" => {
                let v = it.next().context("--preset needs a value")?;
                o.presets = v.split(',').map(str::trim).filter(|p| !p.is_empty()).map(String::from).collect();
                if o.presets.is_empty() {
                    bail!("--preset needs at least one name");
                }
            }
            "--full" => o.presets = vec!["seed".into(), "decode".into(), "fa2bench".into()],
            "--out-dir" => o.out_dir = PathBuf::from(it.next().context("--out-dir needs a value")?),
            "--baseline" => o.baseline = Some(it.next().context("--baseline needs a value")?.clone()),
            "--device" => o.device = Some(it.next().context("--device needs a value")?.clone()),
            "--no-build" => o.build = false,
            "--" => o.extra.extend(it.by_ref().cloned()),
            other => bail!("unknown option `{other}`\n{HELP}"),
        }
    }
    Ok(Some(o))
}

/// The release binary cargo builds (honouring CARGO_TARGET_DIR).
fn sdpa_binary() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| project_root().join("target"), PathBuf::from);
    let target = if target.is_absolute() { target } else { project_root().join(target) };
    target.join("release").join(format!("sdpa{}", std::env::consts::EXE_SUFFIX))
}

fn run_checked(cmd: &mut Command, what: &str) -> Result<bool> {
    let status = cmd.status().with_context(|| format!("cannot start {what}"))?;
    Ok(status.success())
}

pub fn run(args: &[String]) -> Result<()> {
    let Some(o) = parse(args)? else { return Ok(()) };
    let root = project_root();
    if o.build {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        eprintln!("xtask bench: building sdpa (release)");
        let ok = run_checked(
            Command::new(cargo).args(["build", "--release", "--quiet", "-p", "sdpa-cli"]).current_dir(&root),
            "cargo build",
        )?;
        if !ok {
            bail!("cargo build --release -p sdpa-cli failed");
        }
    }
    let sdpa = sdpa_binary();
    if !sdpa.is_file() {
        bail!("{} not found (drop --no-build to build it)", sdpa.display());
    }
    std::fs::create_dir_all(&o.out_dir).with_context(|| format!("cannot create {}", o.out_dir.display()))?;
    let started = std::time::Instant::now();
    let mut files = Vec::new();
    let mut failures = Vec::new();
    for preset in &o.presets {
        let out = o.out_dir.join(format!("{preset}.json"));
        remove_stale(&o.out_dir, preset)?;
        eprintln!("xtask bench: sdpa bench --preset {preset} -> {}", out.display());
        let ok = run_checked(
            Command::new(&sdpa)
                .args(["bench", "--preset", preset, "--out"])
                .arg(&out)
                .args(&o.extra)
                .current_dir(&root),
            "sdpa bench",
        )?;
        if out.is_file() {
            files.push(out);
        }
        if !ok {
            failures.push(preset.clone());
        }
    }
    if files.is_empty() {
        bail!("no benchmark records were written");
    }
    let mut report = Command::new(&sdpa);
    report.arg("report").args(&files).arg("--out-dir").arg(&o.out_dir).current_dir(&root);
    if let Some(b) = &o.baseline {
        report.args(["--baseline", b]);
    }
    if let Some(d) = &o.device {
        report.args(["--device", d]);
    }
    if !run_checked(&mut report, "sdpa report")? {
        bail!("sdpa report failed");
    }
    eprintln!(
        "xtask bench: done in {:.0} s: {} and {}",
        started.elapsed().as_secs_f64(),
        o.out_dir.join("report.md").display(),
        o.out_dir.join("report.html").display()
    );
    if !failures.is_empty() {
        bail!("sdpa bench reported failures for preset(s) {} (see the report's FAIL marks)", failures.join(", "));
    }
    Ok(())
}

/// Earlier runs of the same preset leave PyTorch side files; drop them so a report never mixes runs.
fn remove_stale(dir: &Path, preset: &str) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name == format!("{preset}.json") || name.starts_with(&format!("{preset}.pytorch-")) {
            std::fs::remove_file(e.path()).with_context(|| format!("cannot remove {}", e.path().display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_select_presets_and_pass_the_rest_through() {
        let o = parse(&args(&[])).unwrap().unwrap();
        assert_eq!(o.presets, ["quick"]);
        assert!(o.out_dir.ends_with("target/bench"));
        let o = parse(&args(&["--full", "--no-build", "--", "--backend", "cpu"])).unwrap().unwrap();
        assert_eq!(o.presets, ["seed", "decode", "fa2bench"]);
        assert!(!o.build);
        assert_eq!(o.extra, ["--backend", "cpu"]);
        let o = parse(&args(&["--preset", "decode,seed", "--device", "zen5-2c"])).unwrap().unwrap();
        assert_eq!(o.presets, ["decode", "seed"]);
        assert_eq!(o.device.as_deref(), Some("zen5-2c"));
        assert!(parse(&args(&["--preset"])).is_err());
        assert!(parse(&args(&["--fast"])).is_err());
    }
}
