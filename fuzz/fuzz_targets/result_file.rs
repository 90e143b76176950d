//! Bytes -> `sdpa_core::record::parse_results` (every accepted shape of a result file) -> the `sdpa report`
//! model, its markdown and HTML pages and SVG plots.
//!
//! Invariants: no panic; a file that parses serialises and parses back to the same records.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sdpa_analysis::results::{page, ReportOptions, ResultsReport};
use sdpa_core::record::parse_results;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(file) = parse_results(text, "fuzz.json") else { return };
    let json = serde_json::to_string(&file).expect("a parsed file serialises");
    let back = parse_results(&json, "round-trip.json").expect("what parse_results returns reads back");
    assert_eq!(back.records.len(), file.records.len(), "records lost in a round trip");
    assert_eq!(back.skipped.len(), file.skipped.len(), "skipped entries lost in a round trip");
    if let Ok(report) = ResultsReport::build(&[("fuzz.json".to_string(), file)], &ReportOptions::default()) {
        let _ = page::markdown(&report, true);
        let _ = page::html(&report);
        let _ = page::svg_files(&report);
    }
});
