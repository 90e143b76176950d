//! Bytes -> a trace file -> the kineto scanner, the serde reference reader, and the whole `analyze`
//! pipeline with its three printers. Plain bytes are also parsed gzip-compressed.
//!
//! Invariants: no panic; what the serde reader reads, the scanner reads too, with the same event count; the
//! same JSON parses the same plain and gzipped. With `SDPA_FUZZ_STRICT=1`, also the plausibility
//! invariants issue 19 asks for (finite totals, attention share within [0, 1]), which fail on main until
//! the analyzer judges plausibility.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sdpa_analysis::trace::kineto::{parse_file, parse_file_reference};
use sdpa_analysis::trace::printers;
use sdpa_analysis::{analyze_traces, Options};
use std::io::Write;

fuzz_target!(|data: &[u8]| {
    let dir = sdpa_fuzz::scratch();
    let plain = dir.join("t.json");
    std::fs::write(&plain, data).expect("write scratch trace");
    let scanned = parse_file(&plain);
    let reference = parse_file_reference(&plain);
    match (&scanned, &reference) {
        (Ok(a), Ok(b)) => assert_eq!(a.stats.events, b.stats.events, "scanner and serde reader count differently"),
        (Err(_), Err(_)) => {}
        // By design the scanner checks only the outer structure of what it skips (values outside
        // `traceEvents`, e.g. a mangled `traceEvents` key's whole array): invalid UTF-8, NUL bytes or deep
        // nesting there fail only the serde reader. The other way round, the scanner rejecting JSON that
        // serde reads, is a bug.
        (Ok(_), Err(_)) => {}
        (a, b) => {
            panic!("scanner and serde reader disagree: scanner {:?}, serde {:?}", a.as_ref().err(), b.as_ref().err())
        }
    }
    if let Ok(trace) = scanned {
        let report = analyze_traces(std::slice::from_ref(&trace), &Options::default());
        if sdpa_fuzz::strict() {
            let s = &report.summary;
            assert!(s.total_gpu_time_us.is_finite(), "GPU time {} is not finite", s.total_gpu_time_us);
            assert!((0.0..=1.0).contains(&s.attention_share), "attention share {}", s.attention_share);
        }
        let _ = printers::text::render(&report);
        let _ = printers::markdown::render(&report);
        let _ = printers::csv::render(&report);
        let _ = printers::html::report(&report);
        let diff = sdpa_analysis::trace::diff::TraceDiff::new(&report, &report);
        let _ = printers::html::diff(&diff, &report, &report);
        let _ = printers::diff::text(&diff);
        if !data.starts_with(&[0x1f, 0x8b]) && data.len() < 1 << 16 {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(data).expect("gzip in memory");
            let packed = dir.join("t.json.gz");
            std::fs::write(&packed, gz.finish().expect("gzip in memory")).expect("write scratch trace");
            let again = parse_file(&packed).expect("the same JSON gzipped must parse too");
            assert_eq!(again.stats.events, trace.stats.events, "gzip changes the event count");
        }
    }
});
