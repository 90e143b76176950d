//! Bad input gets a clear error that names the file and the position, never a panic; odd but valid input
//! (unknown fields, any event order, missing args, non-object events) still parses.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use flate2::write::GzEncoder;
use flate2::Compression;
use sdpa_analysis::trace::attention::{detect, Kind};
use sdpa_analysis::trace::kineto::{parse_file, parse_file_reference};
use sdpa_analysis::trace::tree::OpTree;
use sdpa_analysis::{analyze_path, AnalysisError, Options};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

/// A scratch directory unique to one test.
fn scratch(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sdpa-analysis-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn gunzip(path: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(std::fs::File::open(path).unwrap()).read_to_end(&mut out).unwrap();
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn err_of(path: &Path) -> AnalysisError {
    match analyze_path(path, &Options::default()) {
        Ok(_) => panic!("{} should fail", path.display()),
        Err(e) => e,
    }
}

#[test]
fn truncated_gzip_names_the_file_and_offset() {
    let dir = scratch("trunc-gz");
    let full = std::fs::read(data("llama_sdpa_train_bf16_S1024.json.gz")).unwrap();
    let p = write(&dir, "cut.json.gz", &full[..full.len() / 2]);
    let e = err_of(&p);
    let msg = e.to_string();
    assert!(msg.contains("cut.json.gz") && msg.contains("truncated gzip"), "{msg}");
    assert!(std::error::Error::source(&e).is_some(), "the inflate error is kept as the source");
    // The offset is how far decoding got: more than nothing, less than the whole document.
    let whole = gunzip(&data("llama_sdpa_train_bf16_S1024.json.gz")).len() as u64;
    assert!(matches!(e, AnalysisError::Gzip { offset, .. } if offset > 0 && offset < whole), "{e:?}");
}

#[test]
fn truncated_json_reports_the_byte_offset() {
    let dir = scratch("trunc-json");
    let json = gunzip(&data("qwen2_sdpa_bf16_S2048.json.gz"));
    let cut = json.len() * 2 / 3;
    let p = write(&dir, "cut.json", &json[..cut]);
    match err_of(&p) {
        AnalysisError::Json { path, offset, message, .. } => {
            assert!(path.ends_with("cut.json"));
            assert_eq!(offset, cut as u64, "stopped at the end of the data");
            assert!(message.contains("truncated"), "{message}");
        }
        e => panic!("{e:?}"),
    }
    // Same through gzip: the JSON inside is cut, the gzip stream itself is whole.
    let p = write(&dir, "cut2.json.gz", &gzip(&json[..cut]));
    assert!(matches!(err_of(&p), AnalysisError::Json { offset, .. } if offset == cut as u64));
}

#[test]
fn garbage_and_empty_inputs_are_errors() {
    let dir = scratch("garbage");
    let cases: &[(&str, &[u8], &str)] = &[
        ("zero.json", b"", "EOF"),
        ("text.json", b"this is not json", "expected"),
        ("binary.json.gz", &[0x1f, 0x8b, 0x08, 0x00, 0xde, 0xad, 0xbe, 0xef, 0x00, 0x01, 0x02], ""),
        ("number.json", b"42", "trace object"),
        ("events-not-array.json", br#"{"traceEvents": {"a": 1}}"#, "array"),
        ("trailing.json", br#"{"traceEvents": []} xyz"#, "trailing"),
        ("empty-events.json", br#"{"traceEvents": []}"#, "no trace events"),
        ("bad-inside.json", br#"{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": tru}]}"#, ""),
    ];
    for (name, bytes, needle) in cases {
        let p = write(&dir, name, bytes);
        let msg = err_of(&p).to_string();
        assert!(msg.contains(name), "{name}: {msg}");
        assert!(msg.contains(needle), "{name}: `{needle}` in {msg}");
    }
    let missing = err_of(&dir.join("does-not-exist.json")).to_string();
    assert!(missing.contains("does-not-exist.json"), "{missing}");
}

#[test]
fn deep_nesting_does_not_overflow_the_stack() {
    // 100k nested arrays where the parser skips (an unknown field, args, dims, an event): skipped
    // iteratively, no recursion. Unterminated, it is a truncation error with its offset.
    let dir = scratch("nesting");
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let doc = format!(
        r#"{{"x": {deep}, "traceEvents": [{deep}, {{"cat": "cpu_op", "ph": "X", "name": "aten::bmm", "ts": 1, "dur": 1,
        "args": {{"Input Dims": [{deep}], "y": {deep}}}}}]}}"#
    );
    let t = parse_file(&write(&dir, "deep.json", doc.as_bytes())).unwrap();
    assert_eq!((t.stats.events, t.stats.skipped, t.ops.len()), (2, 1, 1));
    let cut = format!(r#"{{"traceEvents": [{{"args": {}"#, "[".repeat(100_000));
    match err_of(&write(&dir, "deep-cut.json", cut.as_bytes())) {
        AnalysisError::Json { offset, message, .. } => {
            assert_eq!(offset, cut.len() as u64);
            assert!(message.contains("truncated"), "{message}");
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn odd_but_valid_events_are_tolerated() {
    let dir = scratch("odd");
    // Unknown fields, fields in any order, string ids, missing args, args that are not objects, events
    // that are not objects, a metadata event without ts.
    let doc = r#"{"schemaVersion": 1, "unknown": {"x": [1, 2]}, "traceEvents": [
        7, null, "s", [1],
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "python"}},
        {"dur": 10, "ts": 100, "name": "aten::mul", "cat": "cpu_op", "ph": "X", "pid": "1", "tid": 1, "extra": {"deep": [[]]}},
        {"cat": "cpu_op", "ph": "X", "name": "aten::add", "pid": 1, "tid": 1, "ts": 120, "dur": 5, "args": null},
        {"cat": "cpu_op", "ph": "X", "name": "aten::sub", "pid": 1, "tid": 1, "ts": 130, "dur": 5, "args": 3},
        {"cat": "kernel", "ph": "X", "name": "k", "pid": 0, "tid": 7, "ts": 105, "dur": 2, "args": {"correlation": "12"}},
        {"cat": "cuda_runtime", "ph": "X", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 101, "dur": 1, "args": {"correlation": 12}}
    ], "deviceProperties": "not a list"}"#;
    let p = write(&dir, "odd.json", doc.as_bytes());
    let t = parse_file(&p).unwrap();
    assert_eq!(t.stats.events, 10);
    assert_eq!(t.stats.skipped, 4);
    assert_eq!(t.ops.len(), 3);
    let tree = OpTree::build(&t);
    assert_eq!(tree.links.by_correlation, 1, "the kernel links to aten::mul through the runtime call");
    assert_eq!(tree.incl_gpu_us[0], 2.0);
    let r = analyze_path(&p, &Options::default()).unwrap();
    assert_eq!(r.summary.total_gpu_time_us, 2.0);
    assert!(r.missing.iter().any(|m| m.contains("deviceProperties")), "{:?}", r.missing);
}

#[test]
fn event_order_does_not_matter() {
    // Reverse the events of a real trace: same attention calls.
    let dir = scratch("order");
    let json = gunzip(&data("bert_eager_fp16_S128.json.gz"));
    let mut v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    v["traceEvents"].as_array_mut().unwrap().reverse();
    let p = write(&dir, "reversed.json", &serde_json::to_vec(&v).unwrap());
    let a = parse_file(&data("bert_eager_fp16_S128.json.gz")).unwrap();
    let b = parse_file(&p).unwrap();
    let (ta, tb) = (OpTree::build(&a), OpTree::build(&b));
    let (ca, cb) = (detect(&ta), detect(&tb));
    assert_eq!(ca.len(), 4);
    assert_eq!(ca.len(), cb.len());
    for (x, y) in ca.iter().zip(&cb) {
        assert_eq!((x.kind, x.shape, &x.module), (y.kind, y.shape, &y.module));
        assert!((x.gpu_us - y.gpu_us).abs() < 1e-9);
    }
}

#[test]
fn without_shapes_the_report_degrades_and_says_so() {
    // Strip Input Dims / types / Concrete Inputs from every op of a real trace.
    let dir = scratch("noshapes");
    let json = gunzip(&data("llama_sdpa_train_bf16_S1024.json.gz"));
    let mut v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    for e in v["traceEvents"].as_array_mut().unwrap() {
        if let Some(a) = e.get_mut("args").and_then(|a| a.as_object_mut()) {
            for k in ["Input Dims", "Input type", "Concrete Inputs", "Input Strides"] {
                a.remove(k);
            }
        }
    }
    let p = write(&dir, "noshapes.json.gz", &gzip(&serde_json::to_vec(&v).unwrap()));
    let r = analyze_path(&p, &Options::default()).unwrap();
    assert_eq!(r.summary.attention_calls, 4, "fused calls are still found by name");
    assert!(r.attention_ops.iter().all(|o| o.kind == Kind::Fused && o.b.is_none() && o.efficiency.is_none()));
    assert!(r.missing.iter().any(|m| m.contains("without shapes")), "{:?}", r.missing);
}

#[test]
fn directory_of_ranks_is_one_report() {
    let dir = scratch("ranks");
    for r in 0..2 {
        std::fs::copy(data("qwen2_sdpa_bf16_S2048.json.gz"), dir.join(format!("rank{r}.json.gz"))).unwrap();
    }
    write(&dir, "notes.txt", b"ignored");
    let r = analyze_path(&dir, &Options::default()).unwrap();
    assert_eq!(r.inputs.len(), 2);
    assert_eq!(r.attention_ops.len(), 1);
    assert_eq!(r.attention_ops[0].count, 6, "3 layers on each of 2 ranks");
    let empty = scratch("ranks-empty");
    assert!(err_of(&empty).to_string().contains("no .json"));
}

#[test]
fn scanner_and_serde_reader_agree_on_every_fixture() {
    // parse_file (byte scanner + per-event slices) against parse_file_reference (serde_json over
    // io::Read, one visitor for the whole document).
    for f in [
        "bert_eager_fp16_S128.json.gz",
        "llama_sdpa_train_bf16_S1024.json.gz",
        "mistral_eager_bf16_S1024_nostack.json.gz",
        "qwen2_sdpa_bf16_S2048.json.gz",
    ] {
        let (a, b) = (parse_file(&data(f)).unwrap(), parse_file_reference(&data(f)).unwrap());
        assert_eq!(a.stats, b.stats, "{f}");
        assert_eq!(
            (a.ops.len(), a.gpu.len(), a.launches.len(), a.modules.len()),
            (b.ops.len(), b.gpu.len(), b.launches.len(), b.modules.len())
        );
        assert_eq!(
            (&a.devices, &a.flags, a.python_events, a.ops_with_shapes),
            (&b.devices, &b.flags, b.python_events, b.ops_with_shapes)
        );
        for (x, y) in a.ops.iter().zip(&b.ops) {
            assert_eq!(
                (a.names.get(x.name), x.ts, x.dur, x.ext_id, &x.args),
                (b.names.get(y.name), y.ts, y.dur, y.ext_id, &y.args)
            );
        }
        for (x, y) in a.gpu.iter().zip(&b.gpu) {
            assert_eq!(
                (a.names.get(x.name), x.ts, x.dur, x.correlation, x.grid),
                (b.names.get(y.name), y.ts, y.dur, y.correlation, y.grid)
            );
        }
    }
}

#[test]
fn mutated_traces_never_panic() {
    // Deterministic byte-level damage to a real trace: flipped bytes, cut ends, stray brackets, quotes and
    // digits. Every outcome must be a report or an error naming the file, never a panic.
    let dir = scratch("mutations");
    let json = gunzip(&data("mistral_eager_bf16_S1024_nostack.json.gz"));
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let junk = b"{}[]\",:0-e9.tfn\\ ";
    let (mut ok, mut err) = (0, 0);
    for case in 0..60 {
        let mut bytes = json.clone();
        for _ in 0..(1 + next() % 4) {
            let at = (next() % bytes.len() as u64) as usize;
            match next() % 3 {
                0 => bytes[at] = junk[(next() % junk.len() as u64) as usize],
                1 => bytes.insert(at, junk[(next() % junk.len() as u64) as usize]),
                _ => {
                    bytes.remove(at);
                }
            }
        }
        if case % 10 == 0 {
            let cut = (next() % bytes.len() as u64) as usize;
            bytes.truncate(cut);
        }
        let p = write(&dir, "m.json", &bytes);
        match analyze_path(&p, &Options::default()) {
            Ok(r) => {
                ok += 1;
                assert!(r.summary.total_gpu_time_us.is_finite());
            }
            Err(e) => {
                err += 1;
                assert!(e.to_string().contains("m.json"), "{e}");
            }
        }
    }
    assert_eq!(ok + err, 60);
    assert!(err > 0, "some mutations break the JSON");
}
