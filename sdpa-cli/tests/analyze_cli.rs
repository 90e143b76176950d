//! `sdpa analyze` as a performance engineer meets it: a real trace in, findings out; our own benchmark
//! results from `sdpa bench` fed back with `--bench-results` replace the seed's speedup range with a
//! measured one; bad input fails with one clear line.

mod common;

use common::{sdpa, tmp};
use std::path::PathBuf;

/// A real profiler trace of BERT with eager (unfused) attention, fp16, S = 128, recorded on an H100.
fn bert_trace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sdpa-analysis/tests/data/bert_eager_fp16_S128.json.gz")
}

fn json(o: &std::process::Output) -> serde_json::Value {
    assert!(o.status.success(), "stderr: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("sdpa analyze --json prints one JSON object")
}

fn path_a(report: &serde_json::Value) -> serde_json::Value {
    report["findings"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["path"] == "A"))
        .cloned()
        .expect("the eager trace has a Path A finding")
}

#[test]
fn bench_results_from_sdpa_bench_turn_the_seed_range_into_a_measured_speedup() {
    let dir = tmp("loop");
    let trace = bert_trace();
    let trace = trace.to_str().expect("utf-8 path");

    // Without records: the seed's range, labelled as such.
    let before = path_a(&json(&sdpa(&["analyze", trace, "--json"], &dir)));
    let source = before["expected_speedup"]["source"].as_str().unwrap_or_default().to_string();
    assert!(source.starts_with("seed range"), "{source}");

    // The trace's shape (B=32, H=12, S=128, D=64, fp16, no mask) on our CPU kernels, as `sdpa bench` writes it.
    let bench = sdpa(
        &[
            "bench",
            "--backend",
            "cpu",
            "--kernel",
            "unfused,fa2",
            "--dtype",
            "f16",
            "--shape",
            "32,12,12,128,128,64",
            "--mask",
            "none",
            "--reps",
            "2",
            "--warmup",
            "1",
            "--no-pytorch",
            "--out",
            "res.json",
        ],
        &dir,
    );
    assert!(bench.status.success(), "stderr: {}", String::from_utf8_lossy(&bench.stderr));

    let after = path_a(&json(&sdpa(&["analyze", trace, "--json", "--bench-results", "res.json"], &dir)));
    let speedup = &after["expected_speedup"];
    let source = speedup["source"].as_str().unwrap_or_default();
    assert!(source.starts_with("measured: our unfused"), "{source}");
    assert!(source.contains("fa2"), "names the fused kernel: {source}");
    let (low, high) = (speedup["low"].as_f64().unwrap_or(0.0), speedup["high"].as_f64().unwrap_or(0.0));
    assert!(low > 0.0 && low == high, "one measured ratio, not a range: {speedup}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn unreadable_bench_results_fail_with_the_file_name() {
    let dir = tmp("bad");
    std::fs::write(dir.join("cut.json"), "{\"format\": \"sdpa-bench-v1\", \"records\": [{\"backend\"").expect("write");
    let trace = bert_trace();
    let out = sdpa(&["analyze", trace.to_str().expect("utf-8 path"), "--bench-results", "cut.json"], &dir);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cut.json") && !err.contains("panicked"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Regression (issue 19): `sdpa analyze DIR` exited on one corrupt rank file with no partial report. Now it
/// analyses the good files, names each bad one on stderr and in the report, and fails only when nothing
/// could be read, or with `--strict`.
#[test]
fn analyze_dir_with_a_corrupt_rank_file_reports_it_and_analyses_the_others() {
    let dir = tmp("ranks");
    std::fs::create_dir_all(dir.join("ranks")).expect("mkdir");
    std::fs::copy(bert_trace(), dir.join("ranks/rank0.json.gz")).expect("copy");
    std::fs::write(dir.join("ranks/rank1.json"), "{\"traceEvents\": [{\"ph\": ").expect("write");
    let out = sdpa(&["analyze", "ranks", "--json"], &dir);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let report = json(&out);
    assert!(err.contains("rank1.json") && err.contains("warning"), "{err}");
    assert_eq!(report["inputs"].as_array().map(Vec::len), Some(1));
    assert_eq!(report["unreadable"].as_array().map(Vec::len), Some(1), "{}", report["unreadable"]);
    assert!(report["summary"]["attention_calls"].as_u64().unwrap_or(0) > 0);

    let strict = sdpa(&["analyze", "ranks", "--strict"], &dir);
    assert!(!strict.status.success());
    assert!(String::from_utf8_lossy(&strict.stderr).contains("rank1.json"));

    std::fs::remove_file(dir.join("ranks/rank0.json.gz")).expect("rm");
    let none = sdpa(&["analyze", "ranks"], &dir);
    let err = String::from_utf8_lossy(&none.stderr);
    assert!(!none.status.success() && err.contains("could be read") && !err.contains("panicked"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Regression (issue 19): `[1,2,3]` was analysed as an empty trace and printed a report of nothing; a kernel
/// `dur` of 1.7e308 printed "GPU time inf µs; attention inf µs = NaN %".
#[test]
fn non_trace_json_is_an_error_and_absurd_durations_are_suspect() {
    let dir = tmp("hostile");
    std::fs::write(dir.join("numbers.json"), "[1,2,3]").expect("write");
    let out = sdpa(&["analyze", "numbers.json"], &dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("not a PyTorch profiler trace"), "{err}");

    let doc = r#"{"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 1.7e308},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 2, "dur": 3}]}"#;
    std::fs::write(dir.join("huge.json"), doc).expect("write");
    let out = sdpa(&["analyze", "huge.json"], &dir);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("GPU time 3.0 µs") && !text.contains("inf µs") && !text.contains("NaN"), "{text}");
    assert!(text.contains("suspect: 1 implausible values left out"), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}

fn fixture(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sdpa-analysis/tests/fixtures").join(name);
    p.to_str().expect("utf-8 path").to_string()
}

#[test]
fn diff_of_the_eager_and_sdpa_traces_prints_path_a_realised_in_every_format() {
    let dir = tmp("diff");
    let (before, after) =
        (fixture("diff_before_eager_bf16_S1024.json.gz"), fixture("diff_after_sdpa_bf16_S1024.json.gz"));
    let out = sdpa(&["analyze", "--diff", &before, &after, "--json", "--md", "d.md", "--html", "d.html"], &dir);
    let d = json(&out);
    assert_eq!(d["path_a_realised"], 1);
    assert_eq!(d["matched"][0]["change"], "fused");
    assert_eq!(d["matched"][0]["before"]["count"], 4);
    // The delta is the two analyses' attention times apart.
    let single = |p: &str| {
        json(&sdpa(&["analyze", p, "--json"], &dir))["summary"]["attention_time_us"]
            .as_f64()
            .expect("as the test set it up")
    };
    let delta = d["attention_delta_us"].as_f64().expect("as the test set it up");
    assert!((delta - (single(&after) - single(&before))).abs() < 1e-6, "{delta}");
    let md = std::fs::read_to_string(dir.join("d.md")).expect("as the test set it up");
    assert!(md.contains("Path A realised (now fused)"), "{md}");
    let page = std::fs::read_to_string(dir.join("d.html")).expect("as the test set it up");
    assert!(page.starts_with("<!DOCTYPE html>") && page.contains("class=\"plot timeline\""));
    let text = sdpa(&["analyze", "--diff", &before, &after], &dir);
    assert!(text.status.success());
    assert!(String::from_utf8_lossy(&text.stdout).contains("Path A realised 1, regressed 0"));
}

#[test]
fn diff_refuses_a_trace_path_beside_it_and_names_a_missing_input() {
    let dir = tmp("diff-bad");
    let before = fixture("diff_before_eager_bf16_S1024.json.gz");
    let out = sdpa(&["analyze", &before, "--diff", &before, &before], &dir);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot be used with"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = sdpa(&["analyze", "--diff", &before, "nope.json.gz"], &dir);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("sdpa: ") && err.contains("nope.json.gz"), "{err}");
}

#[test]
fn html_writes_the_page_beside_the_summary() {
    let dir = tmp("html");
    let out = sdpa(&["analyze", bert_trace().to_str().expect("as the test set it up"), "--html", "page.html"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("findings:"));
    let page = std::fs::read_to_string(dir.join("page.html")).expect("as the test set it up");
    assert!(page.contains("BertSelfAttention") && page.contains("class=\"plot efficiency\""));
}
