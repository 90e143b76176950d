//! `sdpa bench` as a user meets it: sweeps over the reference that write checked records, backends and
//! kernels that cannot run listed as skipped with the reason (the sweep goes on), presets and spec files
//! (ours and the analyzer's replay format), and bad input that fails before anything runs.

mod common;

use common::{sdpa, tmp};
use std::path::Path;

fn read_json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).expect("result file")).expect("result JSON")
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_reference_sweep_writes_checked_records_and_lists_what_did_not_run() {
    let dir = tmp("sweep");
    let out = sdpa(
        &[
            "bench",
            "--backend",
            "reference,cuda",
            "--kernel",
            "unfused,fa2",
            "--dtype",
            "f32,bf16",
            "--shape",
            "1,4,2,17,33,16",
            "--shape",
            "1,2,2,32,32,8;1,2,2,64,64,8",
            "--mask",
            "none,causal-br",
            "--layout",
            "bshd",
            "--reps",
            "3",
            "--warmup",
            "1",
            "--no-pytorch",
            "--out",
            "res.json",
        ],
        &dir,
    );
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let v = read_json(&dir.join("res.json"));
    assert_eq!(v["format"], "sdpa-bench-v1");
    assert!(v["machine"].as_str().is_some_and(|m| !m.is_empty()));
    assert!(v["date"].as_str().is_some_and(|d| d.ends_with('Z')));
    let recs = v["records"].as_array().unwrap();
    let skipped = v["skipped"].as_array().unwrap();
    // 2 dtypes x 3 shapes x 2 masks = 12 cases; x 2 backends x 2 kernels = 48 configurations, each either
    // measured or listed with its reason.
    assert_eq!(recs.len() + skipped.len(), 48);
    let reference: Vec<_> = recs.iter().filter(|r| r["backend"] == "reference").collect();
    assert_eq!(reference.len(), 12, "every case ran on the reference's unfused kernel");
    for r in &reference {
        assert_eq!(r["kernel"], "unfused");
        assert_eq!(r["layout"], "bshd");
        assert_eq!(r["check"]["pass"], true, "{r}");
        let t = &r["time_ms"];
        assert!(t["reps"].as_u64().unwrap() >= 1);
        assert!(t["min"].as_f64().unwrap() <= t["median"].as_f64().unwrap());
        assert!(r["tflops"].as_f64().unwrap() > 0.0 && r["machine"].is_string() && r["date"].is_string());
    }
    // The reference has no fa2: skipped as unsupported, not failed.
    let fa2 = skipped.iter().filter(|s| s["backend"] == "reference" && s["kernel"] == "fa2").count();
    assert_eq!(fa2, 12);
    assert!(skipped.iter().all(|s| s["failed"] == false && !s["reason"].as_str().unwrap().is_empty()));
    // This machine has no GPU in CI; where one is present the cuda records carry their own checks.
    for r in recs.iter().filter(|r| r["backend"] == "cuda") {
        assert_eq!(r["check"]["pass"], true, "{r}");
    }
}

#[test]
fn explicit_masks_and_f16_run_and_check() {
    let dir = tmp("masks");
    let out = sdpa(
        &[
            "bench",
            "--backend",
            "reference",
            "--kernel",
            "unfused",
            "--dtype",
            "f16",
            "--shape",
            "2,2,1,9,21,8",
            "--mask",
            "bool,additive",
            "--reps",
            "2",
            "--no-pytorch",
            "--out",
            "m.json",
            "--quiet",
        ],
        &dir,
    );
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let v = read_json(&dir.join("m.json"));
    let masks: Vec<&str> = v["records"].as_array().unwrap().iter().map(|r| r["mask"].as_str().unwrap()).collect();
    assert_eq!(masks, ["bool", "additive"]);
    assert!(v["records"].as_array().unwrap().iter().all(|r| r["check"]["pass"] == true));
}

#[test]
fn presets_expand_to_the_documented_grids() {
    let dir = tmp("presets");
    let out = sdpa(&["bench", "--preset", "fa2bench", "--dry-run"], &dir);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("cuda ")).collect();
    // D 64/128 x S 512..16k x causal and not x bf16/f16, one kernel.
    assert_eq!(lines.len(), 2 * 6 * 2 * 2, "{text}");
    assert!(lines.iter().any(|l| l.contains("bf16 causal bhsd B=1 Hq=32 Hkv=32 Sq=16384 Sk=16384 D=64")));
    assert!(lines.iter().any(|l| l.contains("f16 none bhsd B=32 Hq=16 Hkv=16 Sq=512 Sk=512 D=128")));
    for preset in ["quick", "decode", "seed", "headdims"] {
        let out = sdpa(&["bench", "--preset", preset, "--dry-run"], &dir);
        assert!(out.status.success(), "{preset}: {}", stderr(&out));
    }
    // Flags override the preset's lists.
    let out = sdpa(&["bench", "--preset", "fa2bench", "--dtype", "bf16", "--mask", "causal", "--dry-run"], &dir);
    let n = String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("cuda ")).count();
    assert_eq!(n, 12);
}

#[test]
fn spec_files_in_our_format_and_the_analyzers_replay_format_are_accepted() {
    let dir = tmp("spec");
    let ours = r#"[{"backends":["reference"],"kernels":["unfused"],"dtypes":["f32"],"masks":["causal"],
        "shapes":[{"b":1,"hq":2,"hkv":1,"sq":8,"sk":12,"d":8,"dv":4}]},
        {"backends":["reference"],"kernels":["unfused"],"dtypes":["bf16"],
        "shapes":[{"b":1,"hq":1,"hkv":1,"sq":5,"sk":5,"d":8,"dv":8}]}]"#;
    std::fs::write(dir.join("ours.json"), ours).unwrap();
    let out = sdpa(&["bench", "--spec", "ours.json", "--no-pytorch", "--reps", "2", "--out", "o.json"], &dir);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let v = read_json(&dir.join("o.json"));
    assert_eq!(v["records"].as_array().unwrap().len(), 2);
    assert_eq!(v["records"][0]["shape"]["dv"], 4);

    // What `sdpa analyze` writes for a finding: {command, spec} with one dtype, mask and layout.
    let replay = r#"{"command":"sdpa bench ...","spec":{"backends":["cuda"],"kernels":["unfused","fa2"],
        "dtype":"bf16","shapes":[{"b":2,"hq":16,"hkv":8,"sq":1024,"sk":1024,"d":64,"dv":64}],
        "mask":"causal","layout":"bshd"}}"#;
    std::fs::write(dir.join("replay.json"), replay).unwrap();
    let out = sdpa(&["bench", "--spec", "replay.json", "--dry-run"], &dir);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("cuda unfused bf16 causal bshd B=2 Hq=16 Hkv=8 Sq=1024 Sk=1024 D=64"), "{text}");
    assert!(text.contains("cuda fa2 bf16 causal bshd"), "{text}");

    // A whole `sdpa analyze --json` report: every finding's replay; findings without one carry null.
    let findings = format!(
        r#"{{"inputs":["t.json.gz"],"findings":[{{"title":"share","replay":null}},
        {{"title":"unfused","replay":{replay}}}]}}"#
    );
    std::fs::write(dir.join("findings.json"), findings).expect("write");
    let out = sdpa(&["bench", "--spec", "findings.json", "--dry-run"], &dir);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("cuda ")).count(), 2);
}

#[test]
fn bad_input_fails_with_one_clear_line_before_running_anything() {
    let dir = tmp("bad");
    std::fs::write(dir.join("broken.json"), "{\"shapes\": [").unwrap();
    std::fs::write(dir.join("wrongtype.json"), r#"{"dtypes":["f64"]}"#).unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["bench", "--backend", "tpu"], "unknown backend `tpu`"),
        (&["bench", "--kernel", "fa9"], "unknown kernel `fa9`"),
        (&["bench", "--backend", "reference", "--shape", "1,3,2,8,8,8"], "shape 1,3,2,8,8,8"),
        (&["bench", "--shape", "1,2,3"], "must be B,Hq,Hkv,Sq,Sk,D"),
        (&["bench", "--mask", "diagonal"], "unknown mask `diagonal`"),
        (&["bench", "--preset", "everything"], "unknown preset `everything`"),
        (&["bench", "--spec", "missing.json"], "cannot read spec file"),
        (&["bench", "--spec", "broken.json"], "broken.json"),
        (&["bench", "--spec", "wrongtype.json"], "wrongtype.json"),
        (&["bench", "--reps", "0"], "--reps must be at least 1"),
    ];
    for (args, want) in cases {
        let out = sdpa(args, &dir);
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(err.contains(want), "{args:?}: expected `{want}` in: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    assert!(!dir.join("target").exists(), "nothing is written when the input is bad");
}

#[test]
fn the_cpu_backend_sweeps_every_kernel_dtype_mask_and_layout_with_checks() {
    let dir = tmp("cpu");
    let out = sdpa(
        &[
            "bench",
            "--backend",
            "cpu",
            "--kernel",
            "unfused,fa2,splitkv,auto",
            "--dtype",
            "f32,f16,bf16",
            "--shape",
            "2,4,2,19,37,24,16",
            "--mask",
            "none,causal,causal-br,additive",
            "--layout",
            "bhsd,bshd",
            "--reps",
            "2",
            "--warmup",
            "0",
            "--threads",
            "2",
            "--no-pytorch",
            "--quiet",
            "--out",
            "cpu.json",
        ],
        &dir,
    );
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let v = read_json(&dir.join("cpu.json"));
    let recs = v["records"].as_array().expect("records");
    let skipped = v["skipped"].as_array().expect("skipped");
    assert_eq!(recs.len() + skipped.len(), 4 * 3 * 4 * 2);
    // Nothing failed; whatever did not run says why (a kernel without explicit masks, say).
    assert!(skipped.iter().all(|s| s["failed"] == false), "{skipped:?}");
    assert!(recs.len() >= 3 * 4 * 2, "at least one kernel per case ran: {} records", recs.len());
    for r in recs {
        assert_eq!(r["check"]["pass"], true, "{r}");
        assert_eq!(r["threads"], 2);
    }
}

/// The PyTorch side-by-side plumbing, with a stand-in for the script (CI has no torch): `sdpa bench` writes
/// a spec of the sweep's CPU cases, runs the script with the sweep's flags, and merges what it wrote, with
/// TFLOP/s recomputed by our cost model. The real script is exercised by its own self-test.
#[test]
fn pytorch_records_are_merged_from_the_script_run_on_the_same_cases() {
    let dir = tmp("pytorch");
    let py = common::fake_python(&dir);
    // The stand-in script: one 2 ms "flash" record per case (with a wrong tflops), one case not run.
    let script = r#"
import json, sys
a = sys.argv[1:]
arg = lambda k: a[a.index(k) + 1]
specs = json.load(open(arg("--spec")))
recs, skipped = [], []
for s in specs:
    shape = s["shapes"][0]
    rec = {"backend": "pytorch", "kernel": "flash", "device": "cpu model", "dtype": s["dtypes"][0], "shape": shape,
           "mask": s["masks"][0], "layout": s["layouts"][0], "time_ms": {"median": 2.0, "min": 1.0, "max": 3.0, "reps": 3},
           "tflops": 1e9, "gbps": 1e9}
    recs.append(rec)
skipped.append({"backend": "pytorch", "kernel": "efficient", "dtype": "f32", "shape": specs[0]["shapes"][0],
                "mask": "none", "reason": "No available kernel", "failed": False})
json.dump({"format": "sdpa-bench-v1", "records": recs, "skipped": skipped,
           "command": " ".join(a)}, open(arg("--out"), "w"))
"#;
    std::fs::write(dir.join("stub.py"), script).expect("write");
    let out = sdpa(
        &[
            "bench",
            "--backend",
            "reference,cpu",
            "--kernel",
            "unfused",
            "--dtype",
            "f32",
            "--shape",
            "1,2,2,16,16,8",
            "--shape",
            "1,2,1,8,24,8",
            "--mask",
            "causal",
            "--reps",
            "2",
            "--python",
            py.to_str().expect("utf-8"),
            "--pytorch-script",
            "stub.py",
            "--with-pytorch",
            "--quiet",
            "--out",
            "p.json",
        ],
        &dir,
    );
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let v = read_json(&dir.join("p.json"));
    let recs = v["records"].as_array().expect("records");
    let torch: Vec<_> = recs.iter().filter(|r| r["backend"] == "pytorch").collect();
    // Two cases on the CPU (the reference's are not sent), one record each.
    assert_eq!(torch.len(), 2, "{v}");
    assert_eq!(recs.iter().filter(|r| r["backend"] == "cpu").count(), 2);
    // FLOPs of 1x2 heads x 136 causal pairs x (8+8) x 2 over 2 ms, not the script's 1e9.
    let want = 2.0 * 2.0 * 136.0 * 16.0 / 2e-3 / 1e12;
    let got = torch[0]["tflops"].as_f64().expect("tflops");
    assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    assert!(v["skipped"].as_array().expect("skipped").iter().any(|s| s["reason"] == "No available kernel"));
    // The spec handed to the script lists exactly the CPU cases.
    let spec = read_json(&dir.join("p.pytorch-cpu.spec.json"));
    assert_eq!(spec.as_array().expect("array").len(), 2);
    assert_eq!(spec[1]["shapes"][0]["hkv"], 1);
    assert_eq!(spec[0]["masks"][0], "causal");

    // A script that fails: the configurations are listed as failed and --with-pytorch makes it an error.
    std::fs::write(dir.join("broken.py"), "import sys\nsys.exit(3)\n").expect("write");
    let out = sdpa(
        &[
            "bench",
            "--backend",
            "cpu",
            "--kernel",
            "unfused",
            "--dtype",
            "f32",
            "--shape",
            "1,2,2,16,16,8",
            "--python",
            py.to_str().expect("utf-8"),
            "--pytorch-script",
            "broken.py",
            "--with-pytorch",
            "--quiet",
            "--out",
            "b.json",
        ],
        &dir,
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("PyTorch timing failed"), "{}", stderr(&out));
    let v = read_json(&dir.join("b.json"));
    assert!(v["skipped"].as_array().expect("skipped").iter().any(|s| s["backend"] == "pytorch" && s["failed"] == true));
}
