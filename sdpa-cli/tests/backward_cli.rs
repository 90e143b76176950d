//! The backward pass through the CLI (issue 24): `sdpa run --pass bwd|fwd+bwd` checks dQ, dK and dV against
//! the f64 reference and says so; `sdpa bench --pass` writes records that carry their pass, skips what has no
//! backward with the reason (paged caches, backends without one), hands PyTorch its pass; `sdpa report`
//! renders a Backward table from such records. Tiny shapes on the reference backend; the CPU backend's answer
//! (a record, or "unsupported" until its kernel lands) is accepted either way.

mod common;

use common::{sdpa, tmp};
use std::path::Path;

fn read_json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).expect("result file")).expect("result JSON")
}

/// A command line as its words (the tests' paths hold no spaces).
fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn run_checks_the_three_gradients_and_names_the_pass() {
    let dir = tmp("run");
    let base = ["run", "--backend", "reference", "--shape", "1,4,2,13,19,8,4", "--mask", "causal-br", "--dtype", "f32"];
    let out = sdpa(&[&base[..], &["--pass", "bwd", "--check", "--reps", "2"]].concat(), &dir);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("pass=bwd (deterministic)"), "{stdout}");
    let check = stdout.lines().find(|l| l.trim_start().starts_with("check pass:")).expect("a check line");
    assert!(check.contains("dQ ") && check.contains("dK ") && check.contains("dV "), "{check}");
    assert!(check.contains("(worst)"), "{check}");

    let out = sdpa(&[&base[..], &["--pass", "fwd+bwd", "--check", "--reps", "2", "--json"]].concat(), &dir);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rec: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON record");
    assert_eq!(rec["pass"], "fwd+bwd");
    assert_eq!(rec["deterministic"], true);
    assert_eq!(rec["check"]["pass"], true);
    assert_eq!(rec["shape"]["dv"], 4);

    // The forward's record names no pass (older readers see what they always saw).
    let out = sdpa(&[&base[..], &["--reps", "1", "--json"]].concat(), &dir);
    let rec: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON record");
    assert!(rec.get("pass").is_none() && rec.get("deterministic").is_none(), "{rec}");
}

#[test]
fn run_refuses_what_has_no_backward_with_the_reason() {
    let dir = tmp("refuse");
    // --deterministic belongs to the backward.
    let out = sdpa(&["run", "--backend", "reference", "--shape", "1,2,2,8,8,8", "--deterministic"], &dir);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--pass bwd"), "{}", text(&out.stderr));
    // A paged KV cache has no backward (training keeps no cache).
    let paged = ["run", "--backend", "reference", "--shape", "2,2,2,1,0,8", "--seqlens-k", "5,9", "--page-size", "4"];
    let out = sdpa(&[&paged[..], &["--pass", "bwd"]].concat(), &dir);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("paged"), "{}", text(&out.stderr));
    // Unknown passes are refused by name.
    let out = sdpa(&["run", "--pass", "backwards"], &dir);
    assert!(!out.status.success() && text(&out.stderr).contains("fwd+bwd"), "{}", text(&out.stderr));
}

#[test]
fn bench_records_carry_their_pass_and_skips_name_it() {
    let dir = tmp("bench");
    let line = concat!(
        "bench --backend reference,cpu --kernel auto --dtype f32 --shape 1,2,1,16,24,8 --mask none,causal ",
        "--pass fwd,bwd,fwd+bwd --reps 2 --warmup 0 --no-pytorch --out b.json"
    );
    let out = sdpa(&words(line), &dir);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v = read_json(&dir.join("b.json"));
    let recs = v["records"].as_array().expect("records");
    let skipped = v["skipped"].as_array().expect("skipped");
    // 2 masks x 3 passes x 2 backends, each measured or listed.
    assert_eq!(recs.len() + skipped.len(), 12);
    let pass_of = |r: &serde_json::Value| r.get("pass").and_then(|p| p.as_str()).unwrap_or("fwd").to_string();
    let reference: Vec<_> = recs.iter().filter(|r| r["backend"] == "reference").collect();
    assert_eq!(reference.len(), 6);
    for want in ["fwd", "bwd", "fwd+bwd"] {
        assert_eq!(reference.iter().filter(|r| pass_of(r) == want).count(), 2, "{want}");
    }
    for r in recs.iter().filter(|r| pass_of(r) != "fwd") {
        assert_eq!(r["check"]["pass"], true, "{r}");
        assert!(r["deterministic"].is_boolean(), "{r}");
    }
    // The CPU backend's backward: a checked record, or (before its kernel) a skip that names the pass and why.
    for r in recs.iter().filter(|r| r["backend"] == "cpu" && pass_of(r) != "fwd") {
        assert_eq!(r["check"]["pass"], true, "{r}");
    }
    for s in skipped {
        let reason = s["reason"].as_str().unwrap_or_default();
        assert_eq!(s["failed"], false, "{s}");
        assert!(reason.starts_with("[bwd]") || reason.starts_with("[fwd+bwd]"), "{reason}");
        assert!(reason.contains("backward"), "{reason}");
    }

    // The records read back, and the report gives them a Backward table.
    let out = sdpa(&["report", "b.json"], &dir);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let md = text(&out.stdout);
    assert!(md.contains("## Backward"), "{md}");
    let rows: Vec<&str> = md.lines().filter(|l| l.contains("| reference:auto |") && l.contains(" · bwd · ")).collect();
    assert_eq!(rows.len(), 2, "{md}");
}

#[test]
fn bench_skips_the_backward_of_a_paged_cache() {
    let dir = tmp("paged");
    let line = concat!(
        "bench --backend reference --kernel auto --dtype f32 --shape 2,2,2,1,0,8 --seqlens-k 5,9 --page-size 4 ",
        "--pass bwd --reps 1 --no-pytorch --out p.json"
    );
    let out = sdpa(&words(line), &dir);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v = read_json(&dir.join("p.json"));
    assert_eq!(v["records"].as_array().map(Vec::len), Some(0));
    let s = &v["skipped"][0];
    let reason = s["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("[bwd]") && reason.contains("paged"), "{reason}");
    assert_eq!(s["failed"], false);
}

/// PyTorch is asked for the case's pass, and its backward records come back with the backward's FLOPs.
#[test]
fn the_pytorch_case_names_its_pass_and_its_records_count_the_backward() {
    let dir = tmp("pytorch");
    let py = common::pytorch_stub(
        &dir,
        r#"
one = lambda err: {"max_abs_err": 0, "rel_err": err, "tolerance": 1e-5, "pass": True}
grads = {"dq": one(1e-7), "dk": one(2e-7), "dv": one(1e-7), "pass": True}
recs = [dict(backend="pytorch", kernel="flash", device="cpu model", dtype=s["dtypes"][0], shape=s["shapes"][0],
             mask=s["masks"][0], layout=s["layouts"][0], time_ms=dict(median=2.0, min=1.0, max=3.0, reps=3),
             tflops=0, gbps=0, grad_check=grads, **{"pass": p for p in s.get("passes", [])})
        for s in specs]
json.dump({"format": "sdpa-bench-v1", "records": recs, "skipped": []}, open(arg("--out"), "w"))
"#,
    );
    let py = py.to_str().expect("utf-8 path");
    let line = format!(
        "bench --backend reference,cpu --kernel auto --dtype f32 --shape 1,2,2,16,16,8 --mask none --pass fwd,bwd \
         --reps 1 --with-pytorch --python {py} --pytorch-script stub.py --out r.json"
    );
    let out = sdpa(&words(&line), &dir);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v = read_json(&dir.join("r.json"));
    let torch: Vec<&serde_json::Value> =
        v["records"].as_array().expect("records").iter().filter(|r| r["backend"] == "pytorch").collect();
    assert_eq!(torch.len(), 2, "{v}");
    let fwd = torch.iter().find(|r| r.get("pass").is_none()).expect("the forward's record");
    let bwd = torch.iter().find(|r| r["pass"] == "bwd").expect("the backward's record");
    // Same time, 2.5x the work (D = Dv): the merge recounted the FLOPs for the backward.
    let (f, b) = (fwd["tflops"].as_f64().unwrap(), bwd["tflops"].as_f64().unwrap());
    assert!((b / f - 2.5).abs() < 1e-9, "{f} {b}");
}

/// A hand-built file of our backward records and PyTorch's: the Backward table pairs each with PyTorch's
/// kernels of the same pass and file, and the summary states the median and worst ratio.
#[test]
fn the_report_holds_the_backward_against_pytorchs() {
    let dir = tmp("report");
    let rec = |backend: &str, kernel: &str, pass: &str, sq: usize, ms: f64| {
        serde_json::json!({
            "backend": backend, "kernel": kernel, "pass": pass, "device": "NVIDIA H100 80GB HBM3", "dtype": "bf16",
            "shape": {"b": 16384 / sq, "hq": 16, "hkv": 16, "sq": sq, "sk": sq, "d": 128, "dv": 128},
            "mask": "causal", "layout": "bhsd", "deterministic": backend == "cuda",
            "time_ms": {"median": ms, "min": ms, "max": ms, "reps": 10}, "tflops": 0.0, "gbps": 0.0,
            "check": {"max_abs_err": 0.01, "rel_err": 0.005, "tolerance": 0.032, "pass": true}
        })
    };
    let recs = serde_json::json!({"format": "sdpa-bench-v1", "records": [
        rec("cuda", "fa2", "fwd", 1024, 1.0),
        rec("cuda", "fa2", "bwd", 1024, 2.0),
        rec("pytorch", "flash", "bwd", 1024, 3.0),
        rec("pytorch", "cudnn", "bwd", 1024, 1.0),
        rec("cuda", "fa2", "bwd", 2048, 4.0),
        rec("pytorch", "flash", "bwd", 2048, 4.0),
        rec("cuda", "fa2", "fwd+bwd", 2048, 5.0),
    ], "skipped": []});
    std::fs::write(dir.join("r.json"), recs.to_string()).expect("write");
    let out = sdpa(&["report", "r.json", "--out-dir", "rep"], &dir);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let md = std::fs::read_to_string(dir.join("rep").join("report.md")).expect("report.md");
    let section = md.split("## Backward").nth(1).expect("a Backward section");
    let section = section.split("\n## ").next().unwrap_or_default();
    let row = |sq: &str, pass: &str| {
        section
            .lines()
            .find(|l| l.contains(&format!("Sq={sq} ")) && l.contains(&format!(" | {pass} | cuda:fa2 |")))
            .unwrap_or_else(|| panic!("a {pass} row at Sq={sq} in {section}"))
            .to_string()
    };
    let r = row("1024", "bwd");
    assert!(r.contains("| 1.50x | 0.50x | 0.50x (cudnn) |") && r.contains("pass") && r.contains("| yes |"), "{r}");
    assert!(row("2048", "bwd").contains("| 1.00x | - |"), "{section}");
    assert!(row("2048", "fwd+bwd").contains("| - | - | - |"), "{section}");
    // The summary: median of 1.5x and 1.0x against flash, one configuration against cuDNN.
    assert!(section.contains("| bwd | bf16 | cuda:fa2 | pytorch:flash | 2 | 1.250x | 1.000x |"), "{section}");
    assert!(section.contains("| bwd | bf16 | cuda:fa2 | pytorch:cudnn | 1 | 0.500x | 0.500x |"), "{section}");
    // The forward's group stays apart: its speedup is not against a backward.
    let html = std::fs::read_to_string(dir.join("rep").join("report.html")).expect("report.html");
    assert!(html.contains("<h2>Backward</h2>"));
}

#[test]
fn the_backward_preset_plans_both_grids() {
    let dir = tmp("preset");
    let out = sdpa(&["bench", "--preset", "backward", "--dry-run", "--no-pytorch"], &dir);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    // GPU: 12 shapes x 2 masks x 2 passes; CPU: 4 shapes x 2 masks x 2 dtypes x 2 passes.
    assert!(stdout.starts_with("# preset backward: 80 configurations"), "{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.starts_with("cuda fa2 bf16") && l.ends_with(" bwd")).count(), 24);
    assert_eq!(stdout.lines().filter(|l| l.starts_with("cpu fa2 ") && l.ends_with(" fwd+bwd")).count(), 16);
}
