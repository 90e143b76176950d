//! The measured part of the frontier table (`data/frontier_measured.json`) is what
//! `frontier::derive_measured` makes of the records in `bench/results/gpu/*.json`: re-derived here so the
//! table cannot drift from the records. `SDPA_WRITE_FRONTIER=1` rewrites the file instead of comparing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use sdpa_analysis::trace::frontier::{self, Series};
use std::path::Path;

#[test]
fn measured_table_matches_the_records() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = root.join("bench/results/gpu");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    names.sort();
    let mut files = Vec::new();
    for p in &names {
        let text = std::fs::read_to_string(p).unwrap();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        // Older files in other formats (the dev harness's `env` + flat records) are not benchmark records.
        if let Ok(f) = sdpa_core::parse_results(&text, &name) {
            files.push((name, f.records));
        }
    }
    assert!(files.iter().any(|(n, _)| n == "backward-h100.json"), "the backward records are read");
    let derived = frontier::derive_measured(&files);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/frontier_measured.json");
    if std::env::var_os("SDPA_WRITE_FRONTIER").is_some() {
        std::fs::write(&path, frontier::measured_json(&derived)).unwrap();
        return;
    }
    #[derive(serde::Deserialize)]
    struct File {
        series: Vec<Series>,
    }
    let stored: File = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(stored.series, derived, "data/frontier_measured.json is stale: regenerate it (see its `about`)");
    // What the records hold: PyTorch's cuDNN and flash forward, and the backward of all three backends, on the H100.
    let has = |kernel: &str, pass: &str, d: usize, mask: &str| {
        derived
            .iter()
            .any(|s| s.kernel == kernel && s.pass == pass && s.d == d && s.mask == mask && s.device == "h100-sxm")
    };
    assert!(has("PyTorch cuDNN", "fwd", 64, "causal"));
    assert!(has("PyTorch flash (FlashAttention-2)", "fwd", 128, "causal"));
    assert!(has("PyTorch memory-efficient", "bwd", 128, "causal"));
    assert!(has("PyTorch cuDNN", "bwd", 64, "causal"));
}
