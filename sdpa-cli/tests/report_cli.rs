//! `sdpa report`: the figures in its tables are the ones the records imply (TFLOP/s from the cost model,
//! speedup against the chosen baseline, efficiency against a tabled or measured peak), it reads every
//! result shape we write, and every record file committed under `bench/results/` (by its folder rule) renders
//! without a GPU.

mod common;

use common::{sdpa, tmp};
use std::path::Path;

fn record(backend: &str, kernel: &str, device: &str, sq: usize, mask: &str, median_ms: f64) -> serde_json::Value {
    serde_json::json!({
        "backend": backend, "kernel": kernel, "device": device, "dtype": "bf16",
        "shape": {"b": 1, "hq": 16, "hkv": 16, "sq": sq, "sk": sq, "d": 128, "dv": 128},
        "mask": mask, "layout": "bhsd",
        "time_ms": {"median": median_ms, "min": median_ms * 0.9, "max": median_ms * 1.2, "reps": 30},
        // Deliberately wrong: the report recomputes both from the shape and the median.
        "tflops": 12345.0, "gbps": 0.5,
        "check": {"max_abs_err": 0.002, "rel_err": 0.004, "tolerance": 0.016, "pass": true}
    })
}

const H100: &str = "NVIDIA H100 80GB HBM3";

#[test]
fn tables_carry_recomputed_tflops_speedup_and_efficiency() {
    let dir = tmp("numbers");
    // FLOPs at S=4096, H=16, D=128, no mask: 4 * 16 * 4096^2 * 128 = 137.4 GFLOP.
    let flops = 4.0 * 16.0 * 4096.0 * 4096.0 * 128.0;
    let recs = serde_json::json!([
        record("cuda", "fa2", H100, 4096, "none", 0.5),
        record("pytorch", "flash", H100, 4096, "none", 0.75),
        record("pytorch", "cudnn", H100, 4096, "none", 0.3),
    ]);
    std::fs::write(dir.join("r.json"), recs.to_string()).unwrap();

    let out = sdpa(&["report", "r.json", "--baseline", "pytorch:flash", "--device", "h100-sxm"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let md = String::from_utf8_lossy(&out.stdout);
    let tflops = flops / 0.5e-3 / 1e12; // 274.9
    assert_eq!(format!("{tflops:.0}"), "275");
    // Detail row: median, TFLOP/s, efficiency against the H100 SXM bf16 datasheet peak (989.4), speedup.
    let eff = tflops / 989.4 * 100.0;
    let row = md.lines().find(|l| l.starts_with("| cuda | fa2 |")).expect("a detail row for cuda fa2");
    assert!(row.contains("| 0.5000 |") && row.contains("| 275 |"), "{row}");
    assert!(row.contains(&format!("| {eff:.1} % |")), "{row}");
    assert!(row.contains("| compute |") && row.contains("| 1.50x |") && row.contains("pass"), "{row}");
    let cudnn = md.lines().find(|l| l.starts_with("| pytorch | cudnn |")).unwrap();
    assert!(cudnn.contains("| 2.50x |"), "{cudnn}");
    assert!(!md.contains("12345"), "record's own TFLOPS must not leak into the tables");
    // The ratio summary: one configuration each, the baseline itself left out.
    assert!(md.contains("| cuda:fa2 | pytorch:flash | 1 | 1.500x | 1.500x | 1.500x |"), "{md}");
    assert!(md.contains("| pytorch:cudnn | pytorch:flash | 1 | 2.500x |"), "{md}");
    assert!(!md.contains("| pytorch:flash | pytorch:flash |"), "{md}");

    // `pytorch` alone means PyTorch's fastest kernel in each configuration (cudnn here).
    let out = sdpa(&["report", "r.json", "--baseline", "pytorch"], &dir);
    let md = String::from_utf8_lossy(&out.stdout);
    let row = md.lines().find(|l| l.starts_with("| cuda | fa2 |")).unwrap();
    assert!(row.contains("| 0.60x |"), "{row}");

    // Measured peaks: 767 TFLOP/s bf16 (the GEMM measured on the lent H100).
    let out = sdpa(&["report", "r.json", "--peak-tflops", "bf16=767", "--peak-gbps", "3000"], &dir);
    let md = String::from_utf8_lossy(&out.stdout);
    let row = md.lines().find(|l| l.starts_with("| cuda | fa2 |")).unwrap();
    assert!(row.contains(&format!("| {:.1} % |", tflops / 767.0 * 100.0)), "{row}");
}

#[test]
fn out_dir_gets_markdown_html_and_svg_plots() {
    let dir = tmp("files");
    let mut recs = Vec::new();
    for (s, t) in [(1024, 0.05), (2048, 0.16), (4096, 0.55)] {
        recs.push(record("cuda", "fa2", H100, s, "causal", t));
        recs.push(record("pytorch", "flash", H100, s, "causal", t * 1.3));
    }
    let file = serde_json::json!({"format": "sdpa-bench-v1", "machine": "test", "records": recs,
        "skipped": [{"backend": "cuda", "kernel": "fa1", "dtype": "bf16",
        "shape": {"b":1,"hq":16,"hkv":16,"sq":1024,"sk":1024,"d":128,"dv":128}, "mask": "causal",
        "reason": "cuda: unsupported: kernel fa1", "failed": false}]});
    std::fs::write(dir.join("f.json"), file.to_string()).unwrap();
    let out = sdpa(&["report", "f.json", "--out-dir", "rep"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let md = std::fs::read_to_string(dir.join("rep/report.md")).unwrap();
    let html = std::fs::read_to_string(dir.join("rep/report.html")).unwrap();
    assert!(md.contains("## Summary") && md.contains("## Not run") && md.contains("cuda: unsupported: kernel fa1"));
    assert!(md.contains("![TFLOP/s vs sequence length"), "{md}");
    // One seq-length plot (one family, two series) and one roofline.
    let seq = std::fs::read_to_string(dir.join("rep/plots/tflops-vs-seqlen-1.svg")).unwrap();
    assert_eq!(seq.matches("<polyline").count(), 2);
    assert_eq!(seq.matches("class=\"point\"").count(), 6);
    let roof = std::fs::read_to_string(dir.join("rep/plots/roofline-1.svg")).unwrap();
    assert!(roof.contains("bf16 peak (h100-sxm): 989 TFLOP/s"), "{roof}");
    // Self-contained: plots inline, no external resources.
    assert_eq!(html.matches("<svg").count(), 2);
    assert!(!html.contains("src=\"http") && !html.contains("href=\"http") && !html.contains("<link"));
}

#[test]
fn run_json_output_and_json_lines_are_read_too() {
    let dir = tmp("shapes");
    let one = record("cpu", "fa2", "cpu", 512, "none", 1.0);
    std::fs::write(dir.join("one.json"), serde_json::to_string_pretty(&one).unwrap()).unwrap();
    let lines = format!("{}\n{}\n", record("cpu", "unfused", "cpu", 512, "none", 2.0), one);
    std::fs::write(dir.join("lines.jsonl"), lines).unwrap();
    let out = sdpa(&["report", "one.json", "lines.jsonl"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let md = String::from_utf8_lossy(&out.stdout);
    // Default baseline on the CPU: our unfused kernel.
    assert!(md.lines().any(|l| l.starts_with("| cpu | fa2 |") && l.contains("| 2.00x |")), "{md}");

    std::fs::write(dir.join("bad.json"), "{\"records\": [{\"backend\": 1}]}").unwrap();
    let out = sdpa(&["report", "bad.json"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("bad.json") && !err.contains("panicked"), "{err}");
    let out = sdpa(&["report", "one.json", "--baseline", ":x"], &dir);
    assert!(!out.status.success());
    let out = sdpa(&["report", "one.json", "--device", "abacus"], &dir);
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown device `abacus`"));
}

/// The GPU harness's flat format (`bench/results/gpu/fa2-h100.json`): PyTorch's medians measured beside ours
/// become their own rows, and the ceilings measured in the same run are what efficiency divides by.
#[test]
fn harness_files_with_measured_ceilings_render() {
    let dir = tmp("flat");
    // 4 * 16 * 4096^2 * 128 FLOPs in 0.5 ms = 274.9 TFLOP/s; against a measured 549.8 TFLOP/s GEMM: 50.0 %.
    let flat = serde_json::json!({
        "env": {"name": "NVIDIA H100 80GB HBM3", "argv": ["harness.py"]},
        "ceilings": {"d2d_GBps": 3000.0, "gemm_bf16_TFLOPs": 549.755813888},
        "records": [{"b": 1, "hq": 16, "hkv": 16, "sq": 4096, "sk": 4096, "d": 128, "dtype": "bf16", "mask": "none",
            "kernel": "fa2", "device": "NVIDIA H100 80GB HBM3", "median_ms": 0.5, "min_ms": 0.49, "max_ms": 0.52,
            "rel_err": 0.002, "check_pass": true, "torch_flash_ms": 0.6, "torch_default_ms": 0.4}]
    });
    std::fs::write(dir.join("flat.json"), flat.to_string()).expect("write");
    let out = sdpa(&["report", "flat.json", "--baseline", "pytorch:flash"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let md = String::from_utf8_lossy(&out.stdout);
    let row = md.lines().find(|l| l.starts_with("| cuda | fa2 |")).expect("our row");
    assert!(row.contains("| 50.0 % |") && row.contains("| 1.20x |") && row.contains("pass"), "{row}");
    let default = md.lines().find(|l| l.starts_with("| pytorch | default |")).expect("PyTorch's default row");
    assert!(default.contains("| 1.50x |"), "{default}");
    assert!(md.contains("ceilings measured in the same run (bf16 550 TFLOP/s, 3000 GB/s)"), "{md}");
}

/// The folder rule of `bench/results/` (its README says the same): the topic folders that hold benchmark
/// records, and how few record files each must have for the walk to count as having found them.
const RECORD_TOPICS: [(&str, usize); 3] = [("gpu", 7), ("cpu", 5), ("candle", 2)];
/// Topic folders that hold notes and other measurements but no benchmark records (`analyze/`: `sdpa analyze`
/// against TraceLens, wall time and memory, not attention timings).
const OTHER_TOPICS: [&str; 1] = ["analyze"];

/// The record files of one topic folder: every `*.json` directly in it, except a record's `<name>-meta.json`
/// companion (the run's machine, ceilings and load, written beside `<name>.json` by the tool that made it).
/// Subfolders (`gpu/fa2-report/`) hold rendered reports, not records.
fn topic_records(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut records = Vec::new();
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
        let p = e.path();
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if !p.is_file() || !name.ends_with(".json") {
            continue;
        }
        if let Some(stem) = name.strip_suffix("-meta.json") {
            let record = dir.join(format!("{stem}.json"));
            assert!(record.is_file(), "{}: a -meta.json companion without its record", p.display());
        } else {
            records.push(p);
        }
    }
    records.sort();
    records
}

/// Every record file under `bench/results/` (H100 runs included) renders with no GPU present; the sample
/// written by `sdpa bench` on the development machine is always there.
#[test]
fn committed_results_render_without_a_gpu() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
    let results = root.join("bench/results");
    // A topic folder the rule does not name would escape the check: refuse it.
    for e in std::fs::read_dir(&results).expect("bench/results").flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if e.path().is_dir() {
            let known = RECORD_TOPICS.iter().any(|(t, _)| *t == name) || OTHER_TOPICS.contains(&name.as_str());
            assert!(known, "bench/results/{name}/: a topic folder the folder rule does not name");
        } else {
            assert!(name.ends_with(".md"), "bench/results/{name}: only notes at the top, records go in a topic folder");
        }
    }
    let mut files = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/bench_sample.json")];
    for (topic, at_least) in RECORD_TOPICS {
        let found = topic_records(&results.join(topic));
        assert!(
            found.len() >= at_least,
            "bench/results/{topic}/: {} record files, expected at least {at_least}",
            found.len()
        );
        files.extend(found);
    }
    for f in files {
        let dir =
            tmp(&format!("committed-{}", f.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()));
        let out = sdpa(&["report", f.to_str().expect("utf-8 path"), "--out-dir", "rep"], &dir);
        assert!(out.status.success(), "{}: {}", f.display(), String::from_utf8_lossy(&out.stderr));
        let md = std::fs::read_to_string(dir.join("rep/report.md")).expect("report.md");
        assert!(md.contains("## Per configuration"), "{}: no measured records", f.display());
    }
}

#[test]
fn auto_rows_name_the_kernel_the_backend_chose() {
    let dir = tmp("auto");
    let mut auto = record("cuda", "auto", H100, 1024, "causal", 0.1);
    auto["auto_chose"] = serde_json::json!("fa2");
    let recs = serde_json::json!([auto, record("cuda", "fa1", H100, 1024, "causal", 0.3)]);
    std::fs::write(dir.join("r.json"), recs.to_string()).unwrap();
    let out = sdpa(&["report", "r.json"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let md = String::from_utf8_lossy(&out.stdout);
    assert!(md.lines().any(|l| l.starts_with("| cuda | auto → fa2 |")), "{md}");
    assert!(md.lines().any(|l| l.starts_with("| cuda | fa1 |")), "{md}");
}

/// Regression (issue 19): `sdpa report bench/results` exited on `bench/results/analyze/analyze.json` (not a
/// record file) and rendered nothing. Now every record file under the folder renders, the companions
/// `NAME-meta.json` are not read as records (the folder rule), and the others are named on stderr; `--strict`
/// makes them fatal.
#[test]
fn report_of_bench_results_rendered_nothing_because_of_analyze_json() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root");
    let results = root.join("bench/results");
    let dir = tmp("whole-folder");
    let out = sdpa(&["report", results.to_str().expect("utf-8 path"), "--out-dir", "rep"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Every file under analyze/ is the tool's own timings (the folder rule), and only those are skipped.
    let timings = std::fs::read_dir(results.join("analyze"))
        .expect("bench/results/analyze")
        .filter(|e| e.as_ref().is_ok_and(|e| e.path().extension().is_some_and(|x| x == "json")))
        .count();
    assert!(timings >= 1);
    assert!(err.contains("analyze.json") && err.contains(&format!("{timings} file(s) skipped")), "{err}");
    assert!(!err.contains("-meta.json"), "companions are not records: {err}");
    let md = std::fs::read_to_string(dir.join("rep/report.md")).expect("report.md");
    for (topic, _) in RECORD_TOPICS {
        for f in topic_records(&results.join(topic)) {
            let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            assert!(md.contains(&name), "{name} is rendered");
        }
    }
    assert!(!md.contains("-meta.json"));
    let strict = sdpa(&["report", results.to_str().expect("utf-8 path"), "--strict"], &dir);
    assert!(!strict.status.success());
    assert!(String::from_utf8_lossy(&strict.stderr).contains("analyze.json"));

    // A folder with nothing readable fails; a file named on the command line must read.
    std::fs::create_dir_all(dir.join("junk")).expect("mkdir");
    std::fs::write(dir.join("junk/a.json"), "{}").expect("write");
    let out = sdpa(&["report", "junk"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("none of the 1") && !err.contains("panicked"), "{err}");
}

/// Regression (issue 19): `--peak-gbps` without `--peak-tflops` was silently taken as a bandwidth-only
/// roofline (every row "memory-bound"); it is documented as a companion of `--peak-tflops` and now refused.
#[test]
fn peak_gbps_without_peak_tflops_was_silently_misused() {
    let dir = tmp("gbps");
    std::fs::write(dir.join("r.json"), serde_json::json!([record("cuda", "fa2", H100, 1024, "none", 0.1)]).to_string())
        .expect("write");
    let out = sdpa(&["report", "r.json", "--peak-gbps", "3000"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--peak-tflops"), "{err}");
}

/// Regression (issue 19): a result file saved with a UTF-8 byte order mark was not a result file.
#[test]
fn a_result_file_with_a_utf8_bom_was_rejected() {
    let dir = tmp("bom");
    let recs = serde_json::json!([record("cuda", "fa2", H100, 1024, "none", 0.1)]).to_string();
    std::fs::write(dir.join("bom.json"), format!("\u{feff}{recs}")).expect("write");
    let out = sdpa(&["report", "bom.json"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).lines().any(|l| l.starts_with("| cuda | fa2 |")));
}
