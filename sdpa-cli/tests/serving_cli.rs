//! Serving layouts on the command line (issue 23): `--seqlens-q`, `--seqlens-k` and `--page-size` on `sdpa run`
//! and `sdpa bench` (checked against the f64 reference, which implements ragged and paged batches), a bench
//! spec's `batches`, clear errors for bad lists, the PyTorch case spec naming the lengths, and the report's
//! "Serving layouts" table.

mod common;

use common::{sdpa, tmp};
use std::path::Path;

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn read_json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).expect("result file")).expect("result JSON")
}

/// The issue's example: three cached sequences (1, 4097 and 333 tokens, 16-token pages in shuffled order)
/// each decoding one token, checked against the reference; the output says the layout.
#[test]
fn the_issue_example_decodes_three_cached_sequences_and_checks() {
    let dir = tmp("example");
    let out = sdpa(
        &[
            "run",
            "--backend",
            "reference",
            "--dtype",
            "f32",
            "--shape",
            "3,8,2,1,0,128",
            "--seqlens-k",
            "1,4097,333",
            "--page-size",
            "16",
            "--check",
            "--warmup",
            "0",
            "--reps",
            "2",
        ],
        &dir,
    );
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert!(text.contains("Sq=1 Sk=4097"), "the bound 0 becomes the longest length: {text}");
    assert!(text.contains("bshd [paged (page 16, 279 pages) 3 seqs, 3 q tokens, 4431 cached]"), "{text}");
    assert!(text.contains("check pass"), "{text}");

    // JSON records carry the batch; a packed (varlen) batch with Sq_b != Sk_b both ways, a causal mask and a
    // sequence of length 0, in the BHSD layout when asked.
    let out = sdpa(
        &[
            "run",
            "--backend",
            "reference",
            "--dtype",
            "bf16",
            "--shape",
            "4,4,2,0,0,16",
            "--seqlens-q",
            "5,17,0,1",
            "--seqlens-k",
            "9,3,4,1",
            "--mask",
            "causal-br",
            "--layout",
            "bhsd",
            "--check",
            "--reps",
            "2",
            "--json",
        ],
        &dir,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let rec: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(rec["ragged"]["seqlens_q"], serde_json::json!([5, 17, 0, 1]));
    assert_eq!(rec["ragged"]["seqlens_k"], serde_json::json!([9, 3, 4, 1]));
    assert!(rec["ragged"].get("pages").is_none());
    assert_eq!(rec["layout"], "bhsd");
    assert_eq!((rec["shape"]["sq"].as_u64(), rec["shape"]["sk"].as_u64()), (Some(17), Some(9)));
    assert_eq!(rec["check"]["pass"], true, "{rec}");
}

/// The same example and a causal varlen prefill on the CPU backend, every kernel checked against the reference.
#[test]
fn the_cpu_backend_runs_the_example_with_every_kernel() {
    let dir = tmp("cpu");
    let cases: [&[&str]; 2] = [
        &["--shape", "3,8,2,1,0,128", "--seqlens-k", "1,4097,333", "--page-size", "16"],
        &["--shape", "3,4,2,0,0,64", "--seqlens-q", "70,1,33", "--seqlens-k", "70,1,90", "--mask", "causal-br"],
    ];
    for flags in cases {
        for kernel in ["unfused", "fa2", "splitkv", "auto"] {
            let mut args =
                vec!["run", "--backend", "cpu", "--threads", "2", "--dtype", "bf16", "--check", "--reps", "2"];
            args.extend_from_slice(&["--kernel", kernel]);
            args.extend_from_slice(flags);
            let out = sdpa(&args, &dir);
            let text = stdout(&out);
            assert!(out.status.success(), "{kernel} {flags:?}: {text}\n{}", stderr(&out));
            assert!(text.contains("check pass"), "{kernel} {flags:?}: {text}");
        }
    }
}

/// Bad lists fail before anything runs, naming the flag and the item.
#[test]
fn bad_length_lists_are_refused_clearly() {
    let dir = tmp("errors");
    let cases: [(&[&str], &str); 6] = [
        (&["--shape", "3,8,2,1,0,64", "--seqlens-k", "1,x,3"], "length 2 of `1,x,3` is `x`"),
        (&["--shape", "3,8,2,1,0,64", "--seqlens-k", "1,,3"], "empty"),
        (&["--shape", "3,8,2,1,0,64", "--seqlens-k", "1,-2,3"], "not a whole number"),
        (&["--shape", "3,8,2,1,0,64", "--seqlens-k", "1,2"], "--seqlens-k lists 2 lengths but the shape has B = 3"),
        (&["--shape", "3,8,2,1,100,64", "--seqlens-k", "1,2,101"], "more than the shape's bound 100"),
        (&["--shape", "3,8,2,1,0,64", "--seqlens-k", "1,2,3", "--page-size", "0"], "--page-size must be in 1..=256"),
    ];
    for (flags, want) in cases {
        let mut args = vec!["run", "--backend", "reference", "--reps", "1"];
        args.extend_from_slice(flags);
        let out = sdpa(&args, &dir);
        assert!(!out.status.success(), "{flags:?} was accepted");
        assert!(stderr(&out).contains(want), "{flags:?}: {}", stderr(&out));
    }
    // Without --seqlens-k the shape's Sk is every sequence's: 0 there cannot be.
    let out = sdpa(&["run", "--backend", "reference", "--shape", "2,2,2,0,0,8", "--seqlens-q", "3,4"], &dir);
    assert!(stderr(&out).contains("without --seqlens-k"), "{}", stderr(&out));
    // Explicit masks do not combine with ragged batches (the core's validation says so).
    let out = sdpa(
        &[
            "bench",
            "--backend",
            "reference",
            "--shape",
            "2,2,2,4,4,8",
            "--seqlens-k",
            "3,4",
            "--mask",
            "bool",
            "--dry-run",
        ],
        &dir,
    );
    assert!(!out.status.success() && stderr(&out).contains("explicit mask"), "{}", stderr(&out));
}

/// A spec's `batches` are swept like the other lists (each resolved against each shape, BSHD by default),
/// every record checked and carrying its batch; the flags' batch replaces the spec's.
#[test]
fn a_spec_with_batches_sweeps_them() {
    let dir = tmp("batches");
    let spec = r#"{"backends": ["reference"], "kernels": ["auto"], "dtypes": ["f32"], "masks": ["none", "causal"],
        "shapes": [{"b": 3, "hq": 2, "hkv": 1, "sq": 0, "sk": 0, "d": 8, "dv": 8}],
        "batches": [{"seqlens_q": [6, 8, 0], "seqlens_k": [6, 8, 0]},
                    {"seqlens_q": [1, 1, 1], "seqlens_k": [7, 33, 2], "page_size": 4}],
        "reps": 2, "warmup": 0}"#;
    std::fs::write(dir.join("spec.json"), spec).expect("write");
    let out = sdpa(&["bench", "--spec", "spec.json", "--dry-run"], &dir);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(text.contains("# spec.json: 4 configurations"), "{text}");
    assert!(text.contains("bshd B=3 Hq=2 Hkv=1 Sq=8 Sk=8 D=8 [varlen 3 seqs, 14 q / 14 k tokens]"), "{text}");
    assert!(text.contains("Sq=1 Sk=33 D=8 [paged (page 4, 12 pages) 3 seqs, 3 q tokens, 42 cached]"), "{text}");

    let out = sdpa(&["bench", "--spec", "spec.json", "--no-pytorch", "--quiet", "--out", "r.json"], &dir);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = read_json(&dir.join("r.json"));
    let recs = v["records"].as_array().expect("records");
    assert_eq!(recs.len(), 4);
    assert!(recs.iter().all(|r| r["check"]["pass"] == true && r["layout"] == "bshd"), "{v}");
    let paged = recs.iter().filter(|r| r["ragged"]["pages"]["page_size"] == 4).count();
    assert_eq!(paged, 2);

    // The flags' batch in place of the spec's.
    let out =
        sdpa(&["bench", "--spec", "spec.json", "--seqlens-k", "2,3,4", "--seqlens-q", "1,1,1", "--dry-run"], &dir);
    let text = stdout(&out);
    assert!(
        text.contains("# spec.json: 2 configurations") && text.contains("[varlen 3 seqs, 3 q / 9 k tokens]"),
        "{text}"
    );
    // The serving preset, one device's sweeps at a time.
    let out = sdpa(&["bench", "--preset", "serving", "--sweeps", "cpu", "--dry-run"], &dir);
    let text = stdout(&out);
    assert!(
        out.status.success() && !text.contains("\ncuda ") && text.contains("[paged (page 16, 2052 pages) 8 seqs"),
        "{text}"
    );
    let out = sdpa(&["bench", "--preset", "serving", "--sweeps", "nope", "--dry-run"], &dir);
    assert!(stderr(&out).contains("matches none of preset serving's sweeps (serving-varlen-cuda"), "{}", stderr(&out));
    // A batch whose lists do not fit the shape names the sweep.
    std::fs::write(dir.join("bad.json"), spec.replace("[6, 8, 0]}", "[6, 8]}")).expect("write");
    let out = sdpa(&["bench", "--spec", "bad.json", "--dry-run"], &dir);
    assert!(!out.status.success() && stderr(&out).contains("--seqlens-k lists 2 lengths"), "{}", stderr(&out));
}

/// The case spec handed to the PyTorch script names the batch, and its ragged records come back with it.
#[test]
fn the_pytorch_case_names_the_lengths_and_its_records_keep_them() {
    let dir = tmp("pytorch");
    // The stand-in script echoes each case's batch into a record (as bench/pytorch_sdpa.py does).
    let py = common::pytorch_stub(
        &dir,
        r#"
recs = []
for s in specs:
    b = s["batches"][0]
    ragged = {"seqlens_q": b.get("seqlens_q"), "seqlens_k": b["seqlens_k"]}
    recs.append({"backend": "pytorch", "kernel": "varlen_attn", "device": "cpu model", "dtype": s["dtypes"][0],
                 "shape": s["shapes"][0], "mask": s["masks"][0], "layout": s["layouts"][0],
                 "time_ms": {"median": 2.0, "min": 1.0, "max": 3.0, "reps": 3}, "tflops": 0, "gbps": 0,
                 "ragged": ragged})
json.dump({"format": "sdpa-bench-v1", "records": recs, "skipped": []}, open(arg("--out"), "w"))
"#,
    );
    let out = sdpa(
        &[
            "bench",
            "--backend",
            "reference,cpu",
            "--kernel",
            "auto",
            "--dtype",
            "f32",
            "--mask",
            "none",
            "--shape",
            "2,2,2,0,0,8",
            "--seqlens-q",
            "3,5",
            "--seqlens-k",
            "3,5",
            "--reps",
            "2",
            "--with-pytorch",
            "--python",
            py.to_str().expect("utf-8 path"),
            "--pytorch-script",
            "stub.py",
            "--out",
            "r.json",
        ],
        &dir,
    );
    // The CPU backend may not run ragged batches yet: that configuration is then skipped, not failed.
    assert!(out.status.success(), "{}", stderr(&out));
    let spec = read_json(&dir.join("r.pytorch-cpu.spec.json"));
    assert_eq!(spec[0]["batches"][0]["seqlens_q"], serde_json::json!([3, 5]), "{spec}");
    assert_eq!(spec[0]["shapes"][0]["sq"], 5, "the shape's bounds are resolved: {spec}");
    let v = read_json(&dir.join("r.json"));
    let theirs: Vec<&serde_json::Value> =
        v["records"].as_array().expect("records").iter().filter(|r| r["backend"] == "pytorch").collect();
    assert_eq!(theirs.len(), 1);
    assert_eq!(theirs[0]["ragged"]["seqlens_k"], serde_json::json!([3, 5]));
    // Merged TFLOP/s use the batch's own work: 2 heads x (9 + 25) pairs x 2 x (8 + 8) FLOPs in 2 ms.
    let want = 2.0 * 2.0 * 34.0 * 16.0 / 2e-3 / 1e12;
    let got = theirs[0]["tflops"].as_f64().expect("tflops");
    assert!((got - want).abs() < want * 1e-9, "{got} vs {want}");
}

/// The report's "Serving layouts" table: each ragged record with its TFLOP/s, the ratio to the dense call of
/// the same work, to the best PyTorch record of the same batch, paged against packed, and GB/s against the
/// measured bandwidth.
#[test]
fn the_report_pairs_ragged_records_with_dense_pytorch_and_packed() {
    let dir = tmp("report");
    let shape = |b: usize, sq: usize, sk: usize| serde_json::json!({"b": b, "hq": 2, "hkv": 2, "sq": sq, "sk": sk, "d": 8, "dv": 8});
    let rec = |backend: &str, kernel: &str, shape: serde_json::Value, ms: f64, ragged: serde_json::Value| {
        serde_json::json!({"backend": backend, "kernel": kernel, "device": "cpu model", "dtype": "f32",
            "shape": shape, "mask": "none", "layout": "bshd",
            "time_ms": {"median": ms, "min": ms, "max": ms, "reps": 3}, "tflops": 0.0, "gbps": 0.0,
            "ragged": ragged})
    };
    // 6² + 8² = 10²: B=1 S=10 is the dense call with the same work.
    let varlen = serde_json::json!({"seqlens_q": [6, 8], "seqlens_k": [6, 8]});
    let paged = serde_json::json!({"seqlens_q": [1, 1], "seqlens_k": [30, 10],
        "pages": {"page_size": 4, "num_pages": 11, "max_pages": 8}});
    let packed = serde_json::json!({"seqlens_q": [1, 1], "seqlens_k": [30, 10]});
    let records = vec![
        rec("cpu", "fa2", shape(2, 8, 8), 1.0, varlen.clone()),
        rec("cpu", "fa2", shape(1, 10, 10), 0.8, serde_json::Value::Null),
        rec("pytorch", "nested", shape(2, 8, 8), 3.0, varlen.clone()),
        rec("pytorch", "padded+mask", shape(2, 8, 8), 2.0, varlen),
        rec("cpu", "splitkv", shape(2, 1, 30), 0.5, paged),
        rec("cpu", "splitkv", shape(2, 1, 30), 0.4, packed),
        rec("cpu", "splitkv", shape(2, 1, 20), 0.45, serde_json::Value::Null),
    ];
    let file = serde_json::json!({"format": "sdpa-bench-v1", "records": records, "skipped": []});
    std::fs::write(dir.join("r.json"), file.to_string()).expect("write");
    let out = sdpa(&["report", "r.json", "--out-dir", "rep", "--peak-tflops", "1", "--peak-gbps", "0.002"], &dir);
    assert!(out.status.success(), "{}", stderr(&out));
    let md = std::fs::read_to_string(dir.join("rep/report.md")).expect("report.md");
    let table = md.split("## Serving layouts").nth(1).expect("a Serving layouts section");
    let line = |needle: &str| table.lines().find(|l| l.contains(needle) && l.starts_with("| cpu")).unwrap_or("");
    let v = line("varlen 2 seqs, 14 q");
    assert!(v.contains("| cpu:fa2 |") && v.contains("0.800x (B=1 Sq=10 Sk=10 bshd)"), "{v}");
    assert!(v.contains("2.00x (padded+mask)"), "the best PyTorch record, 2 ms over our 1 ms: {v}");
    let p = line("paged 4 (11 pages)");
    // Paged: 0.4 / 0.5 against packed; the dense B=2 Sk=20 call has the same work: 0.45 / 0.5.
    assert!(p.contains("0.800x |") && p.contains("0.900x (B=2 Sq=1 Sk=20 bshd)"), "{p}");
    // Bytes: (2 q tokens x 2 heads + 40 keys x 2 heads) x 16 x 4 B = 5376 B in 0.5 ms = 0.0108 GB/s.
    assert!(p.contains("537.6 %"), "GB/s against the 0.002 GB/s given: {p}");
    let html = std::fs::read_to_string(dir.join("rep/report.html")).expect("report.html");
    assert!(html.contains("<h2>Serving layouts</h2>"));
}
