//! The bounded face of the `trace_parse` and `tracelens` fuzz targets (fuzz/README.md): the committed
//! seeds, cut from the real fixtures, mutated a bounded number of times (byte flips, truncations, splices,
//! huge numbers, deep nesting, a BOM) through the same entry points. Every outcome is a report or an error
//! that names the file, never a panic. A few seconds in CI; the coverage-guided search is `cargo fuzz`.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

#[path = "../../fuzz/bounded/mutate.rs"]
mod mutate;

use mutate::{apply, edits, scratch, seeds, Edit};
use proptest::prelude::*;
use proptest::sample::Index;
use sdpa_analysis::trace::kineto::parse_file_reference;
use sdpa_analysis::trace::{printers, tracelens};
use sdpa_analysis::{analyze_path, Options};
use std::sync::OnceLock;

fn trace_seeds() -> &'static Vec<Vec<u8>> {
    static S: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    S.get_or_init(|| seeds("trace_parse").into_iter().map(|(_, b)| b).collect())
}

fn tracelens_seeds() -> &'static Vec<Vec<u8>> {
    static S: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    S.get_or_init(|| seeds("tracelens").into_iter().map(|(_, b)| b).collect())
}

fn check_trace(bytes: &[u8], name: &str) {
    let dir = scratch("trace");
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    match analyze_path(&p, &Options::default()) {
        Ok(r) => {
            let _ = (printers::text::render(&r), printers::markdown::render(&r), printers::csv::render(&r));
            // The page and the comparison read every field too (timeline, bands, NaN-free axes).
            let d = sdpa_analysis::trace::diff::TraceDiff::new(&r, &r);
            let _ = (printers::html::report(&r), printers::html::diff(&d, &r, &r), printers::diff::markdown(&d));
        }
        Err(e) => assert!(e.to_string().contains(name), "the error names the file: {e}"),
    }
    let _ = parse_file_reference(&p);
}

proptest! {
    // A fixed seed: CI must not pass or fail by chance. The open-ended search is the cargo-fuzz targets'
    // (fuzz/README.md); a bug they find gets a named regression test.
    #![proptest_config(ProptestConfig {
        cases: 768,
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5d_9a_19),
        ..ProptestConfig::default()
    })]

    /// fuzz `trace_parse`, bounded.
    #[test]
    fn mutated_traces_give_a_report_or_an_error(seed in any::<Index>(), e in edits(6), gz in any::<bool>()) {
        let pool = trace_seeds();
        let mut bytes = apply(&pool[seed.index(pool.len())], pool, &e);
        if gz && !bytes.starts_with(&[0x1f, 0x8b]) {
            use std::io::Write;
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            enc.write_all(&bytes).unwrap();
            bytes = enc.finish().unwrap();
            // And sometimes a damaged stream.
            if let Some(Edit::Flip(i, b)) = e.first() {
                let k = i.index(bytes.len());
                bytes[k] = *b;
            }
        }
        check_trace(&bytes, if gz { "m.json.gz" } else { "m.json" });
    }

    /// fuzz `tracelens`, bounded: the CSV and the metadata JSON (joined by `\n%%META%%\n` in the seeds).
    #[test]
    fn mutated_tracelens_inputs_give_a_report_or_an_error(seed in any::<Index>(), e in edits(6)) {
        let pool = tracelens_seeds();
        let bytes = apply(&pool[seed.index(pool.len())], pool, &e);
        let sep: &[u8] = b"\n%%META%%\n";
        let (csv, meta) = match bytes.windows(sep.len()).position(|w| w == sep) {
            Some(i) => (&bytes[..i], Some(&bytes[i + sep.len()..])),
            None => (&bytes[..], None),
        };
        let dir = scratch("tracelens");
        std::fs::create_dir_all(dir.join("category_data")).unwrap();
        std::fs::create_dir_all(dir.join("metadata")).unwrap();
        std::fs::write(dir.join("category_data/sdpa_fwd_ops.csv"), csv).unwrap();
        let meta_path = dir.join("metadata/sdpa_fwd_metadata.json");
        match meta {
            Some(m) => std::fs::write(&meta_path, m).unwrap(),
            None => {
                let _ = std::fs::remove_file(&meta_path);
            }
        }
        if let Ok(r) = tracelens::analyze_dir(&dir, &Options::default()) {
            let _ = (printers::text::render(&r), printers::markdown::render(&r), printers::csv::render(&r));
        }
    }
}

#[test]
fn deeply_nested_and_bom_traces_do_not_crash() {
    // The extremes the random edits reach only rarely: 100k-deep nesting (no recursion may overflow the
    // stack) inside and around a trace, and a BOM in front of a real one.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    check_trace(deep.as_bytes(), "deep.json");
    let inside = format!("{{\"x\":{deep},\"traceEvents\":[]}}");
    check_trace(inside.as_bytes(), "inside.json");
    let seed = &trace_seeds()[0];
    check_trace(&apply(seed, &[], &[Edit::Bom]), "bom.json");
}
