//! Windows, softcap and ALiBi from the command line (issue 22): `sdpa run` flags that reach the spec and the
//! record (with the diagonal written out and TFLOP/s counting the work the window leaves), bad values refused
//! with one clear line, `sdpa bench` sweeping a spec's `variants` list (and the flags in its place, and the
//! `variants` preset), the PyTorch script handed the same variants, and `sdpa report` keeping calls with
//! different variants apart.

mod common;

use common::{sdpa, tmp};
use std::path::Path;

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn read_json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).expect("result file")).expect("result JSON")
}

/// Visible (query, key) pairs of one head, counted key by key from the definition (not the cost model's
/// closed form): key j takes part in row i iff diag(i) - left <= j <= diag(i) + right, and j <= diag(i) when
/// causal.
fn pairs(sq: i64, sk: i64, causal: bool, left: Option<i64>, right: Option<i64>, br: bool) -> f64 {
    let off = if br { sk - sq } else { 0 };
    let mut n = 0;
    for i in 0..sq {
        for j in 0..sk {
            let d = i + off;
            let ok = (!causal || j <= d) && left.is_none_or(|l| j >= d - l) && right.is_none_or(|r| j <= d + r);
            n += i64::from(ok);
        }
    }
    n as f64
}

/// FLOPs a record's TFLOP/s and median time imply.
fn flops_of(v: &serde_json::Value) -> f64 {
    v["tflops"].as_f64().expect("tflops") * v["time_ms"]["median"].as_f64().expect("median") * 1e9
}

#[test]
fn run_checks_every_variant_on_the_reference_and_records_it() {
    let dir = tmp("run");
    std::fs::write(dir.join("slopes.txt"), "0.5, 0.25\n0.125 0.0625\n").expect("write");
    // (flags, mask, shape Sq/Sk, window (left, right) for the FLOP count, bottom-right, the JSON variants).
    type Case<'a> = (&'a [&'a str], &'a str, (i64, i64), Option<(Option<i64>, Option<i64>)>, bool, serde_json::Value);
    let cases: Vec<Case> = vec![
        (
            &["--window", "8,0"],
            "causal",
            (77, 77),
            Some((Some(8), Some(0))),
            false,
            serde_json::json!({"window": {"left": 8, "right": 0}, "diagonal": "top-left"}),
        ),
        // FlashAttention's convention: bottom-right, here through the mask; Sq < Sk.
        (
            &["--window", "5,3"],
            "causal-br",
            (40, 77),
            Some((Some(5), Some(3))),
            true,
            serde_json::json!({"window": {"left": 5, "right": 3}, "diagonal": "bottom-right"}),
        ),
        // One-sided windows with the diagonal named, no mask; -1 is unbounded; Sq > Sk leaves rows empty.
        (
            &["--window=-1,2", "--diagonal", "tl"],
            "none",
            (77, 40),
            Some((None, Some(2))),
            false,
            serde_json::json!({"window": {"left": null, "right": 2}, "diagonal": "top-left"}),
        ),
        (
            &["--window", "3,-1", "--diagonal", "br"],
            "none",
            (77, 40),
            Some((Some(3), None)),
            true,
            serde_json::json!({"window": {"left": 3, "right": null}, "diagonal": "bottom-right"}),
        ),
        (&["--softcap", "2"], "none", (33, 47), None, false, serde_json::json!({"softcap": 2.0})),
        (
            &["--alibi", "--diagonal", "br"],
            "none",
            (33, 300),
            None,
            true,
            serde_json::json!({"alibi": "standard", "diagonal": "bottom-right"}),
        ),
        (
            &["--alibi-slopes", "slopes.txt"],
            "causal",
            (33, 47),
            None,
            false,
            serde_json::json!({"alibi": {"slopes": [0.5, 0.25, 0.125, 0.0625]}, "diagonal": "top-left"}),
        ),
        (
            &["--window", "16,0", "--softcap", "30", "--alibi"],
            "causal-br",
            (50, 90),
            Some((Some(16), Some(0))),
            true,
            serde_json::json!({"window": {"left": 16, "right": 0}, "softcap": 30.0, "alibi": "standard",
                "diagonal": "bottom-right"}),
        ),
    ];
    for (flags, mask, (sq, sk), window, br, want) in cases {
        let shape = format!("1,4,2,{sq},{sk},16");
        let mut args = vec!["run", "--backend", "reference", "--shape", &shape, "--mask", mask, "--check", "--json"];
        args.extend_from_slice(flags);
        // A big scale puts logits far beyond the cap (|x| up to about 1e3 here).
        if flags.contains(&"--softcap") {
            args.extend_from_slice(&["--scale", "100"]);
        }
        let out = sdpa(&args, &dir);
        assert!(out.status.success(), "{flags:?}: {}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
        assert_eq!(v["variants"], want, "{flags:?}");
        assert_eq!(v["check"]["pass"], true, "{flags:?}: {v}");
        // TFLOP/s counts the pairs the causal mask and the window leave: 2 · B·Hq · pairs · (D + Dv).
        let (left, right) = window.unwrap_or((None, None));
        let want_flops = 2.0 * 4.0 * pairs(sq, sk, mask != "none", left, right, br) * 32.0;
        let got = flops_of(&v);
        assert!((got - want_flops).abs() <= 1e-6 * want_flops.max(1.0), "{flags:?}: {got} vs {want_flops}");
    }
    // The human line names the variants.
    let out =
        sdpa(&["run", "--shape", "1,2,2,16,16,8", "--mask", "causal", "--window", "4,0", "--softcap", "50"], &dir);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("mask=causal window 4,0 tl · softcap 50"), "{text}");
}

#[test]
fn bad_variant_flags_are_refused_with_one_clear_line() {
    let dir = tmp("bad");
    std::fs::write(dir.join("two.txt"), "0.5 0.25").expect("write");
    std::fs::write(dir.join("junk.txt"), "0.5 half").expect("write");
    std::fs::write(dir.join("empty.txt"), " \n").expect("write");
    let cases: &[(&[&str], &str)] = &[
        (&["--window", "5"], "must be L,R"),
        (&["--window", "-5,0"], "not a count of keys or -1"),
        (&["--window", "a,b"], "not a count of keys"),
        (&["--window", "-1,-1", "--mask", "causal"], "unbounded on both sides"),
        (&["--softcap", "0"], "--softcap must be a finite number above 0"),
        (&["--softcap", "-3"], "above 0"),
        (&["--softcap", "nan"], "above 0"),
        (&["--softcap", "inf"], "above 0"),
        (&["--softcap", "big"], "invalid value 'big'"),
        (&["--alibi", "--alibi-slopes", "two.txt"], "cannot be used with"),
        (&["--alibi-slopes", "missing.txt", "--mask", "causal"], "cannot read ALiBi slopes"),
        (&["--alibi-slopes", "junk.txt", "--mask", "causal"], "slope 2 `half` is not a number"),
        (&["--alibi-slopes", "empty.txt", "--mask", "causal"], "no slopes"),
        (&["--alibi-slopes", "/dev/zero", "--mask", "causal"], "larger than 4 MiB"),
        // Four query heads, two slopes.
        (&["--alibi-slopes", "two.txt", "--mask", "causal"], "2 ALiBi slopes given for Hq = 4"),
        // No diagonal named: the mask is not causal and --diagonal is missing.
        (&["--window", "4,0"], "give --diagonal tl"),
        (&["--alibi", "--mask", "none"], "give --diagonal tl"),
        // A diagonal that contradicts the causal mask's.
        (&["--window", "4,0", "--mask", "causal", "--diagonal", "br"], "contradicts the mask `causal`"),
        (&["--alibi", "--mask", "causal-br", "--diagonal", "tl"], "contradicts the mask `causal-br`"),
        (&["--diagonal", "br"], "give --window, --alibi or --alibi-slopes with it"),
        (&["--diagonal", "middle", "--window", "1,1"], "unknown diagonal `middle`"),
    ];
    for (flags, want) in cases {
        let mut args = vec!["run", "--backend", "reference", "--shape", "1,4,2,16,16,8"];
        args.extend_from_slice(flags);
        let out = sdpa(&args, &dir);
        let err = stderr(&out);
        assert!(!out.status.success(), "{flags:?} was accepted");
        assert!(err.contains(want), "{flags:?}: {err}");
        assert!(!err.contains("panicked"), "{flags:?}: {err}");
    }
}

#[test]
fn bench_sweeps_a_spec_variants_list_and_its_records_carry_them() {
    let dir = tmp("bench");
    let spec = serde_json::json!({
        "backends": ["reference"], "kernels": ["unfused"], "dtypes": ["bf16"], "masks": ["causal", "causal-br"],
        "shapes": [{"b": 1, "hq": 2, "hkv": 1, "sq": 24, "sk": 40, "d": 8, "dv": 8}],
        "variants": [{}, {"window": {"left": 4, "right": 0}}, {"softcap": 20.0}, {"alibi": "standard"},
                     {"window": {"left": 6, "right": 0}, "softcap": 20.0, "alibi": {"slopes": [0.5, 0.25]}}],
        "reps": 2, "warmup": 0
    });
    std::fs::write(dir.join("spec.json"), spec.to_string()).expect("write");
    let out = sdpa(&["bench", "--spec", "spec.json", "--no-pytorch", "--quiet", "--out", "b.json"], &dir);
    assert!(out.status.success(), "{}", stderr(&out));
    let v = read_json(&dir.join("b.json"));
    let recs = v["records"].as_array().expect("records");
    assert_eq!(recs.len(), 2 * 5, "{v}");
    assert!(recs.iter().all(|r| r["check"]["pass"] == true), "{v}");
    // Plain records carry no variants; the others carry theirs with the mask's diagonal written out.
    assert_eq!(recs.iter().filter(|r| r.get("variants").is_none()).count(), 2);
    let win = recs
        .iter()
        .find(|r| r["mask"] == "causal-br" && r["variants"]["window"]["left"] == 4)
        .expect("a windowed bottom-right record");
    assert_eq!(win["variants"]["diagonal"], "bottom-right");
    assert!(win["variants"].get("softcap").is_none());
    let all = recs.iter().find(|r| r["mask"] == "causal" && r["variants"]["window"]["left"] == 6).expect("all three");
    assert_eq!(all["variants"]["alibi"]["slopes"], serde_json::json!([0.5, 0.25]));
    assert_eq!(all["variants"]["diagonal"], "top-left");
    let w = |r: &serde_json::Value| flops_of(r) / (2.0 * 2.0 * 16.0);
    assert!((w(win) - pairs(24, 40, true, Some(4), Some(0), true)).abs() < 1e-6, "{win}");

    // The flags stand in for the spec's list: one set of variants per case; --dry-run names them.
    let out = sdpa(
        &["bench", "--spec", "spec.json", "--window", "3,0", "--softcap", "10", "--dry-run", "--no-pytorch"],
        &dir,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("2 configurations"), "{text}");
    assert!(text.contains("reference unfused bf16 causal [window 3,0 tl · softcap 10] bhsd"), "{text}");
    assert!(text.contains("causal-br [window 3,0 br · softcap 10]"), "{text}");

    // A window a non-causal mask cannot place is refused before anything runs, naming the sweep.
    let out = sdpa(&["bench", "--spec", "spec.json", "--mask", "none", "--dry-run"], &dir);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("variants window 4,0") && err.contains("give --diagonal tl"), "{err}");
    // So is a bad variants object in the spec, with serde's reason.
    std::fs::write(
        dir.join("bad.json"),
        r#"{"shapes":[{"b":1,"hq":2,"hkv":1,"sq":4,"sk":4,"d":8,"dv":8}],"variants":[{"alibi":"bloom"}]}"#,
    )
    .expect("write");
    let out = sdpa(&["bench", "--spec", "bad.json", "--dry-run"], &dir);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("bloom"), "{}", stderr(&out));
}

#[test]
fn the_variants_preset_plans_the_issues_cases() {
    let dir = tmp("preset");
    let out = sdpa(&["bench", "--preset", "variants", "--dry-run"], &dir);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    let ours: Vec<&&str> = lines.iter().filter(|l| !l.starts_with("pytorch")).collect();
    // GPU: 2 lengths x 5 variants x 2 kernels; CPU: 2 dtypes x 4 variants x fa2.
    assert_eq!(ours.len(), 20 + 8, "{text}");
    for want in [
        "cuda fa2 bf16 causal [window 4096,0 tl] bhsd B=1 Hq=16 Hkv=16 Sq=32768",
        "cuda auto bf16 causal [window 4096,0 tl · softcap 50] bhsd",
        "cuda fa2 bf16 causal [alibi standard tl] bhsd B=1 Hq=16 Hkv=16 Sq=8192",
        "cuda fa2 bf16 causal bhsd B=1 Hq=16 Hkv=16 Sq=8192",
        "cpu fa2 f32 causal [window 1024,0 tl] bhsd B=1 Hq=4 Hkv=4 Sq=16384",
        "cpu fa2 bf16 causal [softcap 50] bhsd",
    ] {
        assert!(text.contains(want), "missing `{want}`:\n{text}");
    }
    // PyTorch runs every case once per device, variants included.
    assert_eq!(lines.iter().filter(|l| l.starts_with("pytorch (cuda)")).count(), 10, "{text}");
    assert_eq!(lines.iter().filter(|l| l.starts_with("pytorch (cpu)")).count(), 8, "{text}");
}

/// The PyTorch plumbing with a stand-in for the script (CI has no torch): the spec handed to it carries each
/// case's variants, and the records it writes back keep them, with TFLOP/s recomputed on the window's work.
#[test]
fn the_pytorch_script_gets_the_variants_and_its_records_keep_them() {
    let dir = tmp("pytorch");
    let py = common::fake_python(&dir);
    let script = r#"
import json, sys
a = sys.argv[1:]
arg = lambda k: a[a.index(k) + 1]
recs = []
for s in json.load(open(arg("--spec"))):
    v = (s.get("variants") or [{}])[0]
    rec = {"backend": "pytorch", "kernel": "flex" if v else "default", "device": "cpu model", "dtype": s["dtypes"][0],
           "shape": s["shapes"][0], "mask": s["masks"][0], "layout": s["layouts"][0],
           "time_ms": {"median": 2.0, "min": 1.0, "max": 3.0, "reps": 3}, "tflops": 1e9, "gbps": 1e9}
    if v:
        rec["variants"] = v
    recs.append(rec)
json.dump({"format": "sdpa-bench-v1", "records": recs, "skipped": []}, open(arg("--out"), "w"))
"#;
    std::fs::write(dir.join("stub.py"), script).expect("write");
    let spec = serde_json::json!({
        "backends": ["reference", "cpu"], "kernels": ["unfused"], "dtypes": ["f32"], "masks": ["causal"],
        "shapes": [{"b": 1, "hq": 2, "hkv": 2, "sq": 32, "sk": 32, "d": 8, "dv": 8}],
        "variants": [{}, {"window": {"left": 3, "right": 0}}], "reps": 2, "warmup": 0
    });
    std::fs::write(dir.join("spec.json"), spec.to_string()).expect("write");
    let args = [
        "bench",
        "--spec",
        "spec.json",
        "--python",
        py.to_str().expect("utf-8"),
        "--pytorch-script",
        "stub.py",
        "--with-pytorch",
        "--quiet",
        "--out",
        "p.json",
    ];
    let out = sdpa(&args, &dir);
    assert!(out.status.success(), "{}", stderr(&out));
    let handed = read_json(&dir.join("p.pytorch-cpu.spec.json"));
    let handed = handed.as_array().expect("array");
    assert_eq!(handed.len(), 2, "{handed:?}");
    assert!(handed[0].get("variants").is_none(), "a plain case names no variants: {:?}", handed[0]);
    assert_eq!(
        handed[1]["variants"],
        serde_json::json!([{"window": {"left": 3, "right": 0}}]),
        "the case's variants as the spec gave them"
    );
    let v = read_json(&dir.join("p.json"));
    let flex = v["records"]
        .as_array()
        .expect("records")
        .iter()
        .find(|r| r["backend"] == "pytorch" && r["kernel"] == "flex")
        .expect("the windowed PyTorch record")
        .clone();
    assert_eq!(flex["variants"]["window"]["left"], 3);
    let want = 2.0 * 2.0 * pairs(32, 32, true, Some(3), Some(0), false) * 16.0 / 2e-3 / 1e12;
    let got = flex["tflops"].as_f64().expect("tflops");
    assert!((got - want).abs() < 1e-12, "{got} vs {want}");

    // The report pairs each call with the PyTorch record of the same variants.
    let out = sdpa(&["report", "p.json", "--baseline", "pytorch"], &dir);
    assert!(out.status.success(), "{}", stderr(&out));
    let md = String::from_utf8_lossy(&out.stdout);
    assert!(md.contains("### cpu · f32 · causal + window 3,0 tl · B=1"), "{md}");
    assert!(md.contains("| cpu | f32 | causal | window 3,0 tl |"), "{md}");
    assert!(md.contains("| cpu | f32 | causal | - |"), "{md}");
}

#[test]
fn reports_keep_variants_apart_and_compare_them_with_plain_attention() {
    let dir = tmp("report");
    // Hand-made records: our fa2 and PyTorch, plain and windowed, at one shape; the windowed call is 4x
    // faster than ours plain and 2x faster than PyTorch's windowed call.
    let rec_at = |s: usize, backend: &str, kernel: &str, ms: f64, variants: Option<serde_json::Value>| {
        let mut r = serde_json::json!({"backend": backend, "kernel": kernel, "device": "NVIDIA H100 80GB HBM3",
            "dtype": "bf16", "shape": {"b": 1, "hq": 16, "hkv": 16, "sq": s, "sk": s, "d": 128, "dv": 128},
            "mask": "causal", "layout": "bhsd", "time_ms": {"median": ms, "min": ms, "max": ms, "reps": 3},
            "tflops": 0.0, "gbps": 0.0});
        if let Some(v) = variants {
            r["variants"] = v;
        }
        r
    };
    let rec = |backend: &str, kernel: &str, ms: f64, variants: Option<serde_json::Value>| {
        rec_at(32768, backend, kernel, ms, variants)
    };
    let win = serde_json::json!({"window": {"left": 4096, "right": 0}, "diagonal": "top-left"});
    // A PyTorch record that leaves the causal mask's diagonal implicit groups with ours all the same.
    let win_implicit = serde_json::json!({"window": {"left": 4096, "right": 0}});
    let cap = serde_json::json!({"softcap": 50.0, "diagonal": "top-left"});
    let records = serde_json::json!({"format": "sdpa-bench-v1", "records": [
        rec("cuda", "fa2", 12.0, None),
        rec("cuda", "fa2", 3.0, Some(win.clone())),
        rec("cuda", "fa2", 13.0, Some(cap.clone())),
        rec("pytorch", "cudnn", 7.0, None),
        rec("pytorch", "flex", 6.0, Some(win_implicit)),
        rec("pytorch", "flex", 26.0, Some(cap)),
        // A second length, so the windowed calls make a TFLOP/s-against-length line.
        rec_at(8192, "cuda", "fa2", 1.0, None),
        rec_at(8192, "cuda", "fa2", 0.5, Some(win.clone())),
    ]});
    std::fs::write(dir.join("r.json"), records.to_string()).expect("write");
    let out = sdpa(&["report", "r.json", "--out-dir", "rep"], &dir);
    assert!(out.status.success(), "{}", stderr(&out));
    let md = std::fs::read_to_string(dir.join("rep/report.md")).expect("report.md");
    // Three configurations, never merged: plain, windowed, softcapped.
    assert!(md.contains("### NVIDIA H100 80GB HBM3 · bf16 · causal · B=1"), "{md}");
    assert!(md.contains("### NVIDIA H100 80GB HBM3 · bf16 · causal + window 4096,0 tl · B=1"), "{md}");
    assert!(md.contains("### NVIDIA H100 80GB HBM3 · bf16 · causal + softcap 50 · B=1"), "{md}");
    // The windowed call against PyTorch's windowed call (6 / 3 ms), not against cuDNN's plain one.
    let section = md
        .split("### NVIDIA H100 80GB HBM3 · bf16 · causal + window 4096,0 tl · B=1 Hq=16 Hkv=16 Sq=32768")
        .nth(1)
        .expect("window section");
    let section = section.split("###").next().expect("section");
    assert!(section.contains("pytorch:best (6"), "{section}");
    assert!(section.contains("| cuda | fa2 | 3.000 |") && section.contains("2.00x"), "{section}");
    // The speedup summary pools ratios per variants, never across them.
    assert!(md.contains("| bf16 | window 4096,0 tl | cuda:fa2 | pytorch:best | 1 | 2.000x |"), "{md}");
    assert!(md.contains("| bf16 | softcap 50 | cuda:fa2 | pytorch:best | 1 | 2.000x |"), "{md}");
    assert!(md.contains("| bf16 | - | cuda:fa2 | pytorch:best | 1 | 0.583x |"), "{md}");
    // The variants table: time against the same kernel without variants (3 / 12, 13 / 12).
    let table = md.split("## Variants against plain attention").nth(1).expect("variants table");
    assert!(table.contains("0.250x") && table.contains("1.083x"), "{table}");
    assert!(table.contains("2.00x vs pytorch:best"), "{table}");
    // TFLOP/s on the work done: the window's pairs, not Sk².
    let pairs = 32768.0 * 4097.0 - 4096.0 * 4097.0 / 2.0;
    let tf = 2.0 * 16.0 * pairs * 256.0 / 3e-3 / 1e12;
    assert!(section.contains(&format!("| {tf:.0} |")), "{tf:.0}: {section}");
    // The TFLOP/s-against-length plots: one per variant (never a line through plain and windowed calls),
    // the legend naming the variants.
    let html = std::fs::read_to_string(dir.join("rep/report.html")).expect("report.html");
    assert!(html.contains("cuda:fa2 · window 4096,0 tl</text>"), "no legend entry with the variants");
    assert!(html.contains("cuda:fa2</text>"), "no plain legend entry");
    let plots = std::fs::read_dir(dir.join("rep/plots")).expect("plots").count();
    assert_eq!(plots, 2 + 1, "a plain and a windowed length plot, one roofline");
}

/// The CPU backend's kernels honour every variant end to end (issue 22, part 1: until its kernels land the
/// backend refuses variants as unsupported and this test fails).
#[test]
fn cpu_kernels_check_every_variant_end_to_end() {
    let dir = tmp("cpu");
    let cases: &[(&[&str], &str, &str)] = &[
        (&["--window", "7,0"], "causal", "1,4,2,70,70,24"),
        (&["--window", "3,2", "--diagonal", "br"], "none", "1,4,2,50,90,24"),
        (&["--softcap", "5", "--scale", "50"], "causal-br", "1,4,2,33,47,24"),
        (&["--alibi"], "causal", "1,4,2,33,300,24"),
        (&["--window", "16,0", "--softcap", "30", "--alibi"], "causal-br", "1,4,2,1,200,24"),
    ];
    for kernel in ["auto", "fa2", "splitkv", "unfused"] {
        for (flags, mask, shape) in cases {
            let mut args =
                vec!["run", "--backend", "cpu", "--kernel", kernel, "--shape", shape, "--mask", mask, "--dtype", "f32"];
            args.extend_from_slice(&["--check", "--json", "--reps", "1", "--warmup", "0", "--threads", "2"]);
            args.extend_from_slice(flags);
            let out = sdpa(&args, &dir);
            assert!(out.status.success(), "{kernel} {flags:?}: {}", stderr(&out));
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
            assert_eq!(v["check"]["pass"], true, "{kernel} {flags:?}: {v}");
            assert!(v["variants"].is_object(), "{kernel} {flags:?}: {v}");
        }
    }
}
