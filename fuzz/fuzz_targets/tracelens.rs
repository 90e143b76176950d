//! Bytes -> the TraceLens directory contract (`category_data/sdpa_fwd_ops.csv` and
//! `metadata/sdpa_fwd_metadata.json`, split at `\n%%META%%\n`; no separator: no metadata file) -> the
//! report, its printers and the findings file. Also the CSV and Python-literal readers on their own.
//!
//! Invariants: no panic; with `SDPA_FUZZ_STRICT=1`, the attention share stays within [0, 1].
#![no_main]

use libfuzzer_sys::fuzz_target;
use sdpa_analysis::trace::{printers, tracelens};
use sdpa_analysis::Options;

fuzz_target!(|data: &[u8]| {
    let (csv, meta) = sdpa_fuzz::split_tracelens(data);
    if let Ok(text) = std::str::from_utf8(csv) {
        if let Ok(rows) = tracelens::parse_csv(text) {
            for cell in rows.iter().flatten().take(64) {
                let _ = tracelens::parse_py_dims(cell);
                let _ = tracelens::parse_py_strs(cell);
            }
        }
    }
    let dir = sdpa_fuzz::scratch().join("tl");
    let (data_dir, meta_dir) = (dir.join("category_data"), dir.join("metadata"));
    std::fs::create_dir_all(&data_dir).expect("scratch");
    std::fs::create_dir_all(&meta_dir).expect("scratch");
    std::fs::write(data_dir.join("sdpa_fwd_ops.csv"), csv).expect("scratch");
    let meta_path = meta_dir.join("sdpa_fwd_metadata.json");
    match meta {
        Some(m) => std::fs::write(&meta_path, m).expect("scratch"),
        None => {
            let _ = std::fs::remove_file(&meta_path);
        }
    }
    if let Ok(report) = tracelens::analyze_dir(&dir, &Options::default()) {
        if sdpa_fuzz::strict() {
            let s = report.summary.attention_share;
            assert!((0.0..=1.0).contains(&s), "attention share {s}");
        }
        let _ = printers::text::render(&report);
        let _ = printers::markdown::render(&report);
        let _ = printers::csv::render(&report);
        let _ = tracelens::write_findings(&dir, &report);
    }
});
