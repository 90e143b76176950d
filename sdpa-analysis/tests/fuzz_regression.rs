//! Inputs found while fuzzing (fuzz/README.md), minimised. Each test is named after what broke.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use sdpa_analysis::trace::tracelens;
use sdpa_analysis::Options;
use std::path::{Path, PathBuf};

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

/// The qwen2 TraceLens fixture with its one row's `operation_count` replaced, in a scratch directory.
fn tracelens_with_count(test: &str, counts: &[&str]) -> PathBuf {
    let src = data("tracelens/qwen2_sdpa_bf16_S2048");
    let dir = std::env::temp_dir().join(format!("sdpa-fuzz-regression-{}-{test}", std::process::id()));
    std::fs::create_dir_all(dir.join("category_data")).unwrap();
    std::fs::create_dir_all(dir.join("metadata")).unwrap();
    let csv = std::fs::read_to_string(src.join("category_data/sdpa_fwd_ops.csv")).unwrap();
    let rows = tracelens::parse_csv(&csv).unwrap();
    let col = rows[0].iter().position(|h| h == "operation_count").unwrap();
    let quote =
        |r: &[String]| r.iter().map(|c| format!("\"{}\"", c.replace('"', "\"\""))).collect::<Vec<_>>().join(",");
    let mut out = quote(&rows[0]) + "\n";
    for c in counts {
        let mut row = rows[1].clone();
        row[col] = c.to_string();
        out += &(quote(&row) + "\n");
    }
    std::fs::write(dir.join("category_data/sdpa_fwd_ops.csv"), out).unwrap();
    std::fs::copy(src.join("metadata/sdpa_fwd_metadata.json"), dir.join("metadata/sdpa_fwd_metadata.json")).unwrap();
    dir
}

fn analyze(dir: &Path) -> Result<usize, String> {
    tracelens::analyze_dir(dir, &Options::default()).map(|r| r.summary.attention_calls).map_err(|e| e.to_string())
}

/// Review of the `tracelens` target's reader, confirmed by hand: a one-row TraceLens CSV with
/// `operation_count` 9999999 (under the 10M guard) made the reader keep ten million copies of the call:
/// 93 s and 10.3 GB. A row is now one call weighted by its count, so any accepted count costs one call's
/// memory; the count over all rows together stays bounded (10M), with an error that names the row.
#[test]
fn tracelens_operation_counts_cannot_exhaust_memory() {
    let dir = tracelens_with_count("huge-count", &["9999999"]);
    let t = std::time::Instant::now();
    assert_eq!(analyze(&dir), Ok(9_999_999), "one weighted call standing for every counted call");
    assert!(t.elapsed().as_secs() < 5, "no per-call copies");
    // Bounded over all rows together, not only per row.
    let dir = tracelens_with_count("many-rows", &["6000000", "6000000"]);
    let err = analyze(&dir).unwrap_err();
    assert!(err.contains("row 3") && err.contains("implausible"), "{err}");
    // Realistic counts still read.
    let dir = tracelens_with_count("ok", &["3", "48"]);
    assert_eq!(analyze(&dir), Ok(51));
}
