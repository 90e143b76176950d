//! `cargo xtask gpu-bundle`: release binaries for the GPU machine in one folder, `gpu-bundle/` (git-ignored):
//! the `sdpa` CLI, every sdpa-cuda test binary (`cargo test --release --no-run`), the `cuda_kernels`
//! benchmark driver, the Python of `bench/gpu/` (the PyTorch side-by-side script `bench_cuda.py` and the
//! `cuda_driver.py` it imports), and `run-gpu.sh`, which runs all of it there and writes JSON under `$OUT`.
//! Debug info is stripped so the folder stays well under the 64 MiB a device call carries.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The script the bundle runs on the GPU machine.
const RUN_GPU_SH: &str = include_str!("gpu_bundle_run.sh");

/// One built executable: cargo's target name and the path of the file.
#[derive(Debug)]
struct Artifact {
    name: String,
    kinds: String,
    path: PathBuf,
}

/// Value of `"key":"..."` after position `from` in a cargo JSON message (paths and names have no quotes).
fn json_str(line: &str, key: &str, from: usize) -> Option<String> {
    let pat = format!("\"{key}\":\"");
    let start = line[from..].find(&pat)? + from + pat.len();
    let end = line[start..].find('"')? + start;
    Some(line[start..end].to_string())
}

/// Runs a cargo command with `--message-format=json-render-diagnostics` and returns its executables.
fn cargo_artifacts(root: &Path, args: &[&str]) -> Result<Vec<Artifact>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("xtask gpu-bundle: cargo {}", args.join(" "));
    let out = Command::new(&cargo)
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .current_dir(root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {cargo}"))?;
    if !out.status.success() {
        bail!("cargo {} failed ({})", args.join(" "), out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut found = Vec::new();
    for line in text.lines().filter(|l| l.contains("\"reason\":\"compiler-artifact\"")) {
        let Some(exe) = json_str(line, "executable", 0) else { continue };
        let target = line.find("\"target\":{").unwrap_or(0);
        let name = json_str(line, "name", target).unwrap_or_else(|| "unknown".into());
        let kinds =
            line[target..].split("\"kind\":[").nth(1).and_then(|s| s.split(']').next()).unwrap_or("").to_string();
        found.push(Artifact { name, kinds, path: PathBuf::from(exe) });
    }
    Ok(found)
}

fn copy_stripped(from: &Path, to: &Path) -> Result<u64> {
    std::fs::copy(from, to).with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    // Line tables help nobody on the device and double the size; a missing `strip` only costs size.
    let _ = Command::new("strip").arg("--strip-debug").arg(to).status();
    Ok(std::fs::metadata(to).map(|m| m.len()).unwrap_or(0))
}

/// Builds the bundle. `args`: optional `--out DIR` (default `gpu-bundle` at the repository root).
pub fn run(args: &[String]) -> Result<()> {
    let root = crate::project_root();
    let out = match args.iter().position(|a| a == "--out") {
        Some(i) => PathBuf::from(args.get(i + 1).context("--out needs a directory")?),
        None => root.join("gpu-bundle"),
    };
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("clearing {}", out.display()))?;
    }
    std::fs::create_dir_all(out.join("tests"))?;

    let mut total = 0u64;
    let cli = cargo_artifacts(&root, &["build", "--release", "-p", "sdpa-cli", "--bin", "sdpa"])?;
    let sdpa = cli.iter().find(|a| a.name == "sdpa").context("cargo built no `sdpa` executable")?;
    total += copy_stripped(&sdpa.path, &out.join("sdpa"))?;

    let tests = cargo_artifacts(&root, &["test", "--release", "-p", "sdpa-cuda", "--no-run"])?;
    let mut n_tests = 0;
    for t in tests.iter().filter(|a| a.kinds.contains("\"test\"") || a.kinds.contains("\"lib\"")) {
        let name = if t.kinds.contains("\"lib\"") { format!("unit_{}", t.name) } else { t.name.clone() };
        total += copy_stripped(&t.path, &out.join("tests").join(name))?;
        n_tests += 1;
    }
    if n_tests == 0 {
        bail!("cargo test --no-run produced no test executables");
    }

    let bench = cargo_artifacts(&root, &["bench", "-p", "sdpa-cuda", "--bench", "cuda_kernels", "--no-run"])?;
    let driver = bench.iter().find(|a| a.name == "cuda_kernels").context("no cuda_kernels benchmark executable")?;
    total += copy_stripped(&driver.path, &out.join("cuda_kernels"))?;

    for entry in std::fs::read_dir(root.join("bench/gpu")).context("reading bench/gpu")?.flatten() {
        let p = entry.path();
        if p.extension().is_some_and(|e| e == "py") {
            if let Some(name) = p.file_name() {
                std::fs::copy(&p, out.join(name))?;
            }
        }
    }
    let script = out.join("run-gpu.sh");
    std::fs::write(&script, RUN_GPU_SH)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    }
    let mib = total as f64 / (1 << 20) as f64;
    eprintln!(
        "xtask gpu-bundle: {} ({mib:.1} MiB: sdpa, {n_tests} test binaries, cuda_kernels, run-gpu.sh)",
        out.display()
    );
    if mib > 60.0 {
        bail!("the bundle is {mib:.1} MiB, over what one device call carries (64 MiB with the tree)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::json_str;

    #[test]
    fn reads_cargo_messages() {
        let line = r#"{"reason":"compiler-artifact","target":{"kind":["test"],"name":"gpu_kernels"},"executable":"/t/gpu_kernels-1"}"#;
        assert_eq!(json_str(line, "executable", 0).as_deref(), Some("/t/gpu_kernels-1"));
        let t = line.find("\"target\":{").unwrap_or(0);
        assert_eq!(json_str(line, "name", t).as_deref(), Some("gpu_kernels"));
    }
}
