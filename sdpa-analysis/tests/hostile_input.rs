//! Regressions from issue 19 (hostile but realistic input against the analyzer): each test is named after
//! what broke and says how, so it fails if the old behaviour comes back.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::copy_dir;

use flate2::write::GzEncoder;
use flate2::Compression;
use sdpa_analysis::trace::kineto::{parse_file, parse_file_reference};
use sdpa_analysis::trace::printers;
use sdpa_analysis::trace::tracelens;
use sdpa_analysis::{analyze_path, AnalysisError, Options, TraceReport};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

/// A fresh scratch directory unique to one test.
fn scratch(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sdpa-hostile-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn gunzip(path: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(std::fs::File::open(path).unwrap()).read_to_end(&mut out).unwrap();
    out
}

/// A trace on an H100 with these events.
fn trace(events: &str) -> String {
    format!(
        r#"{{"deviceProperties": [{{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}}], "traceEvents": [{events}]}}"#
    )
}

fn analyze(test: &str, events: &str) -> TraceReport {
    let dir = scratch(test);
    analyze_path(&write(&dir, "t.json", trace(events).as_bytes()), &Options::default()).unwrap()
}

/// One op launching one kernel of `kernel_us`, correlation `corr`, at time `ts`.
fn op_with_kernel(name: &str, args: &str, kernel: &str, kernel_us: &str, ts: u32, corr: u32) -> String {
    format!(
        r#"{{"ph": "X", "cat": "cpu_op", "name": "{name}", "pid": 1, "tid": 1, "ts": {ts}, "dur": 50, "args": {args}}},
           {{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": {}, "dur": 5, "args": {{"correlation": {corr}}}}},
           {{"ph": "X", "cat": "kernel", "name": "{kernel}", "pid": 0, "tid": 7, "ts": {}, "dur": {kernel_us}, "args": {{"correlation": {corr}}}}}"#,
        ts + 10,
        ts + 100
    )
}

/// SDPA's flash backend on Q, K, V of `[b, h, s, d]`.
fn flash_args(b: &str, h: u32, s: u32, d: u32) -> String {
    format!(
        r#"{{"Input Dims": [[{b}, {h}, {s}, {d}], [{b}, {h}, {s}, {d}], [{b}, {h}, {s}, {d}], [], [], [], []],
        "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar", "Scalar", "Scalar"],
        "Concrete Inputs": ["", "", "", "0.", "True", "False", ""]}}"#
    )
}

const FLASH_OP: &str = "aten::_scaled_dot_product_flash_attention";
const FLASH_KERNEL: &str = "void pytorch_flash::flash_fwd_kernel<>";

/// Regression: a kernel `dur` of 1.7e308 printed "GPU time inf µs; attention inf µs = NaN %"; inf, NaN and
/// negative durations were dropped without a word. Now each is counted as suspect and left out of the sums.
#[test]
fn kernel_duration_of_1e308_was_summed_into_inf_gpu_time() {
    let args = flash_args("2", 8, 1024, 64);
    let events = [
        op_with_kernel(FLASH_OP, &args, FLASH_KERNEL, "100", 100, 1),
        op_with_kernel(FLASH_OP, &args, FLASH_KERNEL, "1.7e308", 1000, 2),
        op_with_kernel(FLASH_OP, &args, FLASH_KERNEL, "\"inf\"", 2000, 3),
        op_with_kernel(FLASH_OP, &args, FLASH_KERNEL, "\"NaN\"", 3000, 4),
        op_with_kernel(FLASH_OP, &args, FLASH_KERNEL, "-5", 4000, 5),
    ]
    .join(",\n");
    let r = analyze("dur-1e308", &events);
    assert_eq!(r.summary.total_gpu_time_us, 100.0, "only the plausible kernel");
    assert_eq!(r.summary.attention_time_us, 100.0);
    assert!(r.summary.attention_share <= 1.0 && r.summary.attention_share.is_finite());
    let s = r.suspect.iter().find(|s| s.what == "GPU activity duration").expect("the durations are suspect");
    assert_eq!(s.count, 4, "{s:?}");
    assert!(s.example.contains("longer than a day"), "{}", s.example);
    let text = printers::text::render(&r);
    assert!(text.contains("suspect: 4 implausible values") && !text.contains("inf µs"), "{text}");
    assert!(printers::markdown::render(&r).contains("- Suspect: "));
}

/// Regression: a timestamp of 1e300 (or "inf") was taken as is, so the op tree compared meaningless times.
#[test]
fn timestamps_beyond_2_pow_53_microseconds_were_accepted() {
    let args = flash_args("2", 8, 1024, 64);
    let events = format!(
        r#"{},
        {{"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1, "ts": 1e300, "dur": 1}},
        {{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": "-inf", "dur": 1}}"#,
        op_with_kernel(FLASH_OP, &args, FLASH_KERNEL, "100", 100, 1)
    );
    let r = analyze("ts-1e300", &events);
    let s = r.suspect.iter().find(|s| s.what == "timestamp").expect("the timestamps are suspect");
    assert_eq!(s.count, 2);
    assert_eq!(r.trace.cpu_ops, 1, "only the SDPA op is in the tree");
}

/// Regression: `Input Dims` of 2^62 gave 8e85 TFLOP/s, 8e84 % efficiency and a replay command with that
/// shape. Now the shape is suspect: no FLOPs, no efficiency, no replay; the call's time still counts.
#[test]
fn input_dims_of_2_pow_62_gave_8e84_percent_efficiency_and_a_replay() {
    let args = flash_args("4611686018427387904", 8, 1024, 64);
    let r = analyze("dims-2-62", &op_with_kernel(FLASH_OP, &args, FLASH_KERNEL, "100", 100, 1));
    let op = &r.attention_ops[0];
    assert_eq!((op.b, op.flops, op.efficiency, op.tflops), (None, None, None, None));
    assert_eq!(op.total_us, 100.0, "the kernel time is plausible and counts");
    assert!(r.findings.iter().all(|f| f.replay.is_none()), "no replay of an impossible shape");
    let s = r.suspect.iter().find(|s| s.what == "attention shape").expect("the shape is suspect");
    assert!(s.example.contains("above 2^31"), "{}", s.example);
    // Dims whose product overflows (a 5-d eager matmul with three 2^40 batch dims) panicked in debug builds
    // ("attempt to multiply with overflow"); now they are suspect too.
    let big = "1099511627776, 1099511627776, 1099511627776";
    let qk =
        format!(r#"{{"Input Dims": [[{big}, 64, 32], [{big}, 32, 64]], "Input type": ["c10::Half", "c10::Half"]}}"#);
    let sm = format!(r#"{{"Input Dims": [[{big}, 64, 64], [], []], "Input type": ["c10::Half", "Scalar", ""]}}"#);
    let pv =
        format!(r#"{{"Input Dims": [[{big}, 64, 64], [{big}, 64, 32]], "Input type": ["c10::Half", "c10::Half"]}}"#);
    let events = [
        op_with_kernel("aten::matmul", &qk, "gemm", "10", 100, 1),
        op_with_kernel("aten::softmax", &sm, "softmax", "10", 200, 2),
        op_with_kernel("aten::matmul", &pv, "gemm", "10", 300, 3),
    ]
    .join(",\n");
    let r = analyze("dims-overflow", &events);
    assert_eq!(r.attention_ops.len(), 1);
    assert!(r.attention_ops[0].b.is_none());
    assert!(r.suspect.iter().any(|s| s.what == "attention shape"), "{:?}", r.suspect);
}

/// Regression: a plausible shape in an implausible time gave rates far above any GPU; now the rate is
/// suspect and neither efficiency nor replay is derived from it.
#[test]
fn rates_far_above_the_device_peak_were_reported_as_efficiency() {
    // 8.8 TFLOP of causal attention in 10 µs: 8.8e5 TFLOP/s, nearly 900x the H100's peak, while its
    // 134 MB move at 13 TB/s (4x HBM, within the bound): the FLOP rate alone gives it away.
    let args = flash_args("1", 8, 65536, 128);
    let r = analyze("rate", &op_with_kernel(FLASH_OP, &args, FLASH_KERNEL, "10", 100, 1));
    let op = &r.attention_ops[0];
    assert_eq!((op.efficiency, op.tflops), (None, None));
    assert!(op.suspect.as_deref().is_some_and(|s| s.contains("TFLOP/s is more than 100x")), "{:?}", op.suspect);
    // 0.001 µs: the bandwidth is absurd too.
    let r = analyze("rate-bw", &op_with_kernel(FLASH_OP, &args, FLASH_KERNEL, "0.001", 100, 1));
    assert!(r.attention_ops[0].suspect.is_some());
    assert!(r.findings.iter().all(|f| f.replay.is_none()));
    assert!(r.suspect.iter().any(|s| s.what == "achieved rate" && s.count == 1), "{:?}", r.suspect);
}

/// Regression: a grid of 2^62 x 2^62 blocks overflowed the block count (a panic in debug builds).
#[test]
fn a_grid_of_2_pow_62_blocks_overflowed() {
    let args = flash_args("2", 8, 1024, 64);
    let ev = op_with_kernel(FLASH_OP, &args, FLASH_KERNEL, "100", 100, 1).replace(
        r#""correlation": 1}}"#,
        r#""correlation": 1, "grid": [4611686018427387904, 4611686018427387904, 2]}}"#,
    );
    assert!(ev.contains("grid"));
    let r = analyze("grid", &ev);
    assert_eq!(r.attention_ops[0].grid_blocks, Some(i64::MAX));
    // With numSms of 2^62 the finding's "two waves" test overflowed as well.
    let dir = scratch("grid-sms");
    let doc = trace(&ev).replace(r#""numSms": 132"#, r#""numSms": 4611686018427387904"#);
    let r = analyze_path(&write(&dir, "t.json", doc.as_bytes()), &Options::default()).unwrap();
    assert!(r.findings.iter().any(|f| f.path == "B"), "the below-band finding with its grid check is built");
}

/// Regression: a varlen flash-attn call whose `cu_seqlens_q` has i64::MIN entries overflowed computing B
/// (a panic in debug builds); now the shape is unknown.
#[test]
fn varlen_cu_seqlens_of_i64_min_overflowed() {
    let args = r#"{"Input Dims": [[4096, 16, 128], [4096, 16, 128], [4096, 16, 128], [-9223372036854775808], [3], [], [], [], [], []],
        "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "int", "int", "", "", "", "", ""],
        "Concrete Inputs": ["", "", "", "", "", "2048", "2048", "0.0", "0.088", "True"]}"#;
    let r =
        analyze("varlen", &op_with_kernel("flash_attn::_flash_attn_varlen_forward", args, FLASH_KERNEL, "100", 100, 1));
    assert_eq!(r.attention_ops.len(), 1);
    assert_eq!(r.attention_ops[0].b, None);
    // The same call with a real cu_seqlens (B + 1 = 3 entries) has its shape.
    let ok = args.replace("[-9223372036854775808]", "[3]");
    let r = analyze(
        "varlen-ok",
        &op_with_kernel("flash_attn::_flash_attn_varlen_forward", &ok, FLASH_KERNEL, "100", 100, 1),
    );
    assert_eq!((r.attention_ops[0].b, r.attention_ops[0].sq), (Some(2), Some(2048)));
}

/// Regression: an SDPA call between an eager chain's matmuls had its kernel counted twice, by the fused
/// call and by the unfused chain's time window, so attention could exceed the GPU time.
#[test]
fn a_fused_kernel_inside_an_eager_window_was_counted_twice() {
    let qk = r#"{"Input Dims": [[2, 4, 256, 64], [2, 4, 64, 256]], "Input type": ["c10::Half", "c10::Half"]}"#;
    let sm = r#"{"Input Dims": [[2, 4, 256, 256], [], []], "Input type": ["c10::Half", "Scalar", ""]}"#;
    let pv = r#"{"Input Dims": [[2, 4, 256, 256], [2, 4, 256, 64]], "Input type": ["c10::Half", "c10::Half"]}"#;
    let sdpa = flash_args("2", 4, 256, 64);
    let events = [
        op_with_kernel("aten::matmul", qk, "gemm", "10", 100, 1),
        op_with_kernel(FLASH_OP, &sdpa, FLASH_KERNEL, "1000", 200, 2),
        op_with_kernel("aten::softmax", sm, "softmax", "10", 300, 3),
        op_with_kernel("aten::matmul", pv, "gemm", "10", 400, 4),
    ]
    .join(",\n");
    let r = analyze("twice", &events);
    assert_eq!(r.summary.total_gpu_time_us, 1030.0);
    assert_eq!((r.summary.fused_time_us, r.summary.unfused_time_us), (1000.0, 30.0));
    assert!(r.summary.attention_share <= 1.0, "{}", r.summary.attention_share);
}

/// The qwen2 TraceLens directory in a scratch place, with its CSV's rows passed through `edit`.
fn tracelens_dir(test: &str, edit: impl Fn(&str) -> String) -> PathBuf {
    let dir = scratch(test);
    copy_dir(&data("tracelens/qwen2_sdpa_bf16_S2048"), &dir);
    let csv = dir.join("category_data/sdpa_fwd_ops.csv");
    let text = std::fs::read_to_string(&csv).unwrap();
    std::fs::write(&csv, edit(&text)).unwrap();
    dir
}

/// Regression: 60,000 TraceLens rows gave "attention = 192292.7 % of GPU time": the rows' kernel time was
/// divided by the metadata's GPU busy time of a run they do not describe. Now that case is named in
/// `missing` and no share exceeds 100 %.
#[test]
fn tracelens_rows_beyond_the_metadata_busy_time_gave_192292_percent() {
    let dir = tracelens_dir("tl-share", |text| {
        let (header, row) = text.split_once('\n').unwrap();
        let row = row.trim_end();
        // 2,000 copies keep the test light; the metadata says 1.6 ms of busy time, the rows 309 ms.
        format!("{header}\n{}\n", vec![row; 2000].join("\n"))
    });
    let r = tracelens::analyze_dir(&dir, &Options::default()).unwrap();
    assert!(r.summary.attention_share <= 1.0, "{}", r.summary.attention_share);
    assert!(r.attention_ops.iter().all(|o| o.share_of_gpu <= 1.0));
    assert!(r.missing.iter().any(|m| m.contains("do not describe the same run")), "{:?}", r.missing);
    assert!(!printers::text::render(&r).contains("192292"));
}

/// Regression: each TraceLens row was cloned once per `operation_count` (180,000 calls took 845 MB; the
/// accepted ten million would have aborted on allocation). A row is now one weighted call; the total count
/// over all rows stays bounded.
#[test]
fn tracelens_operation_count_was_cloned_into_millions_of_calls() {
    // The qwen2 row has operation_count 3 (column 11) and a kernel time sum of 154.56 µs.
    let set_count =
        |text: &str, n: &str| text.replacen(",152,3,327.48900000000003,", &format!(",152,{n},327.48900000000003,"), 1);
    let dir = tracelens_dir("tl-count", |text| {
        assert!(text.contains(",152,3,327.48900000000003,"), "the fixture's row changed");
        set_count(text, "10000000")
    });
    let r = tracelens::analyze_dir(&dir, &Options::default()).unwrap();
    assert_eq!((r.attention_ops[0].count, r.summary.attention_calls), (10_000_000, 10_000_000));
    assert!((r.attention_ops[0].total_us - 154.5615234375).abs() < 1e-6, "the row's sum, not count x sum");
    assert!((r.attention_ops[0].mean_us - 154.5615234375e-7).abs() < 1e-12);
    let two = tracelens_dir("tl-count-2", |text| {
        let (header, row) = text.split_once('\n').unwrap();
        let row = set_count(row.trim_end(), "6000000");
        format!("{header}\n{row}\n{row}\n")
    });
    let e = tracelens::analyze_dir(&two, &Options::default()).unwrap_err().to_string();
    assert!(e.contains("operation_count 6000000 is implausible"), "{e}");
}

/// Regression: a TraceLens CSV without `Kernel Time (µs)_sum` silently fell back to the ops' CPU time
/// (327.5 µs instead of 154.6 µs) with `missing: []`.
#[test]
fn tracelens_without_the_kernel_time_column_fell_back_silently() {
    let dir = tracelens_dir("tl-cpu-time", |text| text.replacen("Kernel Time (µs)_sum", "renamed", 1));
    let r = tracelens::analyze_dir(&dir, &Options::default()).unwrap();
    assert!((r.attention_ops[0].total_us - 327.489).abs() < 1e-6, "{}", r.attention_ops[0].total_us);
    let m = r.missing.iter().find(|m| m.contains("Kernel Time (µs)_sum")).expect("the fallback is named");
    assert!(m.contains("total_duration_us"), "{m}");
}

/// Regression: a UTF-8 byte order mark was rejected everywhere ("expected a trace object ..., found `ï`",
/// "no `name` column", "invalid JSON" for the metadata).
#[test]
fn a_utf8_bom_was_rejected() {
    let dir = scratch("bom");
    let json = gunzip(&data("qwen2_sdpa_bf16_S2048.json.gz"));
    let with_bom = [b"\xEF\xBB\xBF".as_slice(), &json].concat();
    let plain = analyze_path(&data("qwen2_sdpa_bf16_S2048.json.gz"), &Options::default()).unwrap();
    for (name, bytes) in [("bom.json", with_bom.clone()), ("bom.json.gz", gzip(&with_bom))] {
        let p = write(&dir, name, &bytes);
        let r = analyze_path(&p, &Options::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(r.summary.attention_time_us, plain.summary.attention_time_us, "{name}");
        assert_eq!(parse_file_reference(&p).unwrap().stats.events, plain.trace.events, "{name}: reference reader");
    }
    let tl = tracelens_dir("bom-tl", |text| format!("\u{feff}{text}"));
    let meta = tl.join("metadata/sdpa_fwd_metadata.json");
    let m = std::fs::read_to_string(&meta).unwrap();
    std::fs::write(&meta, format!("\u{feff}{m}")).unwrap();
    let r = tracelens::analyze_dir(&tl, &Options::default()).unwrap();
    assert_eq!(r.device.key.as_deref(), Some("h100-sxm"), "the metadata was read");
    assert_eq!(r.attention_ops.len(), 1);
}

/// Regression: JSON that is not a trace (`[1,2,3]`, `[{}]`, a 100k-deep nested array, `{}`, a TraceLens
/// metadata file) was accepted as an empty trace. Now each is an error that says so.
#[test]
fn non_trace_json_was_accepted_as_an_empty_trace() {
    let dir = scratch("not-trace");
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let meta = std::fs::read(data("tracelens/qwen2_sdpa_bf16_S2048/metadata/sdpa_fwd_metadata.json")).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("numbers.json", b"[1,2,3]".to_vec()),
        ("empty-object-in-array.json", b"[{}]".to_vec()),
        ("deep.json", deep.into_bytes()),
        ("empty-object.json", b"{}".to_vec()),
        ("object.json", br#"{"schemaVersion": 1, "events": []}"#.to_vec()),
        ("metadata.json", meta),
        ("objects-without-events.json", br#"{"traceEvents": [{"a": 1}, {"name": "x"}]}"#.to_vec()),
    ];
    for (name, bytes) in cases {
        let p = write(&dir, name, &bytes);
        for e in [analyze_path(&p, &Options::default()).map(|_| ()), parse_file_reference(&p).map(|_| ())] {
            let msg = e.unwrap_err().to_string();
            assert!(msg.contains(name) && msg.contains("not a PyTorch profiler trace"), "{name}: {msg}");
        }
    }
    // Real traces are untouched: every fixture here and in the shared fixtures still reads.
    let shared = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/traces");
    let mut fixtures: Vec<PathBuf> = std::fs::read_dir(data("")).unwrap().flatten().map(|e| e.path()).collect();
    fixtures.extend(std::fs::read_dir(&shared).into_iter().flatten().flatten().map(|e| e.path()));
    let traces: Vec<&PathBuf> = fixtures.iter().filter(|p| p.to_string_lossy().ends_with(".json.gz")).collect();
    assert!(traces.len() >= 4);
    for f in traces {
        let r = analyze_path(f, &Options::default()).unwrap_or_else(|e| panic!("{e}"));
        assert!(r.summary.attention_calls > 0 && r.suspect.is_empty(), "{}: {:?}", f.display(), r.suspect);
    }
}

/// Regression: a 1-byte `.gz` (or an empty one, or one that starts like gzip and is not) was reported as
/// a JSON error, sending the user to look at JSON that was never there.
#[test]
fn a_one_byte_gz_was_reported_as_bad_json() {
    let dir = scratch("gz");
    let full = std::fs::read(data("qwen2_sdpa_bf16_S2048.json.gz")).unwrap();
    for (name, bytes) in
        [("one.json.gz", vec![0x1f]), ("zero.json.gz", vec![]), ("half-magic.json.gz", vec![0x1f, 0x00, 0x01])]
    {
        let p = write(&dir, name, &bytes);
        let e = analyze_path(&p, &Options::default()).unwrap_err();
        assert!(matches!(e, AnalysisError::Gzip { .. }), "{name}: {e:?}");
        assert!(e.to_string().contains(name) && e.to_string().contains("gzip"), "{e}");
    }
    let cut = write(&dir, "cut.json.gz", &full[..20]);
    assert!(matches!(analyze_path(&cut, &Options::default()), Err(AnalysisError::Gzip { .. })));
    // A plain JSON trace named .gz is still read: the content decides.
    let plain = write(&dir, "plain.json.gz", &gunzip(&data("qwen2_sdpa_bf16_S2048.json.gz")));
    assert!(analyze_path(&plain, &Options::default()).is_ok());
}

/// Regression: `sdpa analyze DIR` stopped at the first corrupt rank file with no report. Now the good
/// files are analysed and each bad one is named; only a directory with nothing readable (or `strict`) fails.
#[test]
fn one_corrupt_rank_file_lost_the_whole_directory() {
    let dir = scratch("ranks");
    for r in 0..2 {
        std::fs::copy(data("qwen2_sdpa_bf16_S2048.json.gz"), dir.join(format!("rank{r}.json.gz"))).unwrap();
    }
    write(&dir, "rank2.json", b"{\"traceEvents\": [");
    write(&dir, "rank3.json", b"[1,2,3]");
    let r = analyze_path(&dir, &Options::default()).unwrap();
    assert_eq!(r.inputs.len(), 2);
    assert_eq!(r.attention_ops[0].count, 6, "3 layers on each of the 2 good ranks");
    assert_eq!(r.unreadable.len(), 2, "{:?}", r.unreadable);
    assert!(r.unreadable[0].contains("rank2.json") && r.unreadable[1].contains("rank3.json"));
    assert!(r.missing.iter().filter(|m| m.contains("left out")).count() == 2, "{:?}", r.missing);
    assert!(printers::text::render(&r).contains("unreadable (left out)"));

    let strict = Options { strict: true, ..Options::default() };
    assert!(analyze_path(&dir, &strict).unwrap_err().to_string().contains("rank2.json"));

    let bad = scratch("ranks-bad");
    write(&bad, "a.json", b"[1,2,3]");
    write(&bad, "b.json.gz", &[0x1f]);
    let e = analyze_path(&bad, &Options::default()).unwrap_err().to_string();
    assert!(e.contains("none of the 2 trace files could be read") && e.contains("a.json") && e.contains("b.json.gz"));
    // A single file named directly is still an error of its own.
    assert!(parse_file(&bad.join("a.json")).is_err());
}
