//! Regression tests for issue 19 ("hostile input: no panic, no abort, nothing lost"): each input below once
//! panicked, aborted on allocation, hung, lost finished work or was silently replaced by defaults. Each
//! must now end with a clean one-line error (exit 1, never 101 for a panic or 134 for an abort), or, for
//! sweeps, skip what cannot run and keep the rest.

mod common;

use common::{sdpa, tmp};

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit code 1 with `want` in the one-line error.
fn clean_error(o: &std::process::Output, want: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "expected a clean error, got {:?}: {err}", o.status);
    assert!(err.contains(want), "error should mention `{want}`: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Shapes whose element counts fit usize but whose bytes do not once panicked in `Vec` ("capacity
/// overflow"), exit 101.
#[test]
fn shapes_too_big_to_address_are_size_errors_not_panics() {
    let dir = tmp("overflow");
    for shape in [
        "18446744073709551615,1,1,1,1,1",
        "9223372036854775807,1,1,1,1,1",
        "4611686018427387904,1,1,1,1,1",
        "1,1,1,1,1,4611686018427387904",
    ] {
        let o = sdpa(&["run", "--backend", "cpu", &format!("--shape={shape}")], &dir);
        clean_error(&o, "size overflow");
        // The error echoes the shape as typed (Dv once appended itself: `...,D,D`).
        assert!(stderr(&o).contains(&format!("shape {shape}:")), "{}", stderr(&o));
    }
}

/// Inputs larger than the machine once aborted the process ("memory allocation of 68719476736 bytes
/// failed", SIGABRT); they are now refused before anything is allocated, naming what needs how much.
#[test]
fn inputs_larger_than_the_host_are_refused_before_allocating() {
    let dir = tmp("oom");
    for (backend, shape) in [
        ("cpu", "1,1,1,1,68719476736,64"),
        ("reference", "1,1,1,3037000500,3037000500,1"),
        ("cpu", "1,1,1,3037000500,3037000500,64"),
    ] {
        let o = sdpa(&["run", "--backend", backend, "--shape", shape], &dir);
        clean_error(&o, "not enough memory");
        assert!(stderr(&o).contains("available"), "{}", stderr(&o));
    }
}

/// A head dim beyond the backend's limit was allocated (504 MB, 1.7 s) before being refused.
#[test]
fn a_head_dim_beyond_the_backend_is_refused_before_inputs_exist() {
    let o = sdpa(&["run", "--backend", "cpu", "--shape", "1,8,8,64,64,100000"], &tmp("headdim"));
    clean_error(&o, "head dim 100000");
}

/// `--reps 4294967296` aborted on allocating its samples; `--threads 100000` hung past 60 s.
#[test]
fn counts_beyond_any_use_are_refused() {
    let dir = tmp("counts");
    clean_error(&sdpa(&["run", "--backend", "cpu", "--reps", "4294967296"], &dir), "--reps 4294967296");
    clean_error(&sdpa(&["run", "--backend", "cpu", "--threads", "100000"], &dir), "--threads 100000");
    clean_error(&sdpa(&["bench", "--backend", "cpu", "--reps", "4294967296", "--dry-run"], &dir), "--reps");
    clean_error(&sdpa(&["bench", "--backend", "cpu", "--threads", "100000", "--dry-run"], &dir), "--threads");
}

/// A sweep with an impossible configuration in the middle aborted on it and wrote no `--out` file, losing
/// the record it had finished. Now the impossible one is skipped with its reason and the others are kept.
#[test]
fn a_sweep_with_an_impossible_configuration_keeps_the_others() {
    let dir = tmp("sweep");
    let spec = r#"{"backends":["cpu"],"kernels":["fa2"],"dtypes":["f32"],"shapes":[
        {"b":1,"hq":2,"hkv":2,"sq":40,"sk":40,"d":16,"dv":16},
        {"b":1,"hq":1,"hkv":1,"sq":1,"sk":68719476736,"d":64,"dv":64},
        {"b":1,"hq":2,"hkv":2,"sq":33,"sk":65,"d":16,"dv":16}]}"#;
    std::fs::write(dir.join("spec.json"), spec).unwrap();
    let o = sdpa(&["bench", "--spec", "spec.json", "--no-pytorch", "--reps", "2", "--out", "out.json"], &dir);
    assert!(o.status.success(), "{}", stderr(&o));
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("out.json")).unwrap()).unwrap();
    let sq: Vec<u64> = file["records"].as_array().unwrap().iter().map(|r| r["shape"]["sq"].as_u64().unwrap()).collect();
    assert_eq!(sq, [40, 33], "both possible configurations are measured, in order");
    let skipped = file["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 1);
    assert!(skipped[0]["reason"].as_str().unwrap().contains("not enough memory"), "{skipped:?}");
}

/// `{}` and `"shapes": []` were silently replaced by the quick preset's shapes; `"reps": 0` was accepted
/// though `--reps 0` is an error.
#[test]
fn spec_files_without_shapes_or_with_zero_reps_are_errors() {
    let dir = tmp("specs");
    for (name, text, want) in [
        ("empty.json", "{}", "no shapes"),
        ("noshapes.json", r#"{"shapes": []}"#, "no shapes"),
        ("reps0.json", r#"{"shapes":[{"b":1,"hq":1,"hkv":1,"sq":8,"sk":8,"d":8,"dv":8}],"reps":0}"#, "`reps`"),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
        clean_error(&sdpa(&["bench", "--spec", name, "--dry-run"], &dir), want);
    }
}

/// `--dry-run --no-pytorch` still listed a PyTorch configuration.
#[test]
fn a_dry_run_without_pytorch_lists_no_pytorch_configuration() {
    let dir = tmp("dry");
    let args = ["bench", "--dry-run", "--backend", "cpu", "--shape", "1,1,1,8,8,8"];
    let with = sdpa(&args, &dir);
    assert!(String::from_utf8_lossy(&with.stdout).contains("pytorch (cpu)"), "the default plan names PyTorch");
    let without = sdpa(&[&args[..], &["--no-pytorch"]].concat(), &dir);
    assert!(without.status.success());
    assert!(
        !String::from_utf8_lossy(&without.stdout).contains("pytorch"),
        "{}",
        String::from_utf8_lossy(&without.stdout)
    );
}

/// Planning grew quadratically (360,000 configurations ran past 60 s); sweeps above the limit are now
/// refused at once, and one just under it plans (the limit keeps files and reports readable).
#[test]
fn sweeps_beyond_the_limit_are_refused_and_big_ones_plan() {
    let dir = tmp("size");
    let shapes = |n: usize| -> String {
        (1..=n)
            .map(|s| format!(r#"{{"b":1,"hq":1,"hkv":1,"sq":{s},"sk":{s},"d":8,"dv":8}}"#))
            .collect::<Vec<_>>()
            .join(",")
    };
    let spec = |n: usize| {
        format!(
            r#"{{"backends":["cpu","reference"],"kernels":["fa2","unfused","auto"],"dtypes":["f32","bf16"],
            "masks":["none","causal"],"shapes":[{}]}}"#,
            shapes(n)
        )
    };
    std::fs::write(dir.join("huge.json"), spec(15_000)).unwrap();
    clean_error(&sdpa(&["bench", "--spec", "huge.json", "--dry-run"], &dir), "more than 100000 configurations");
    std::fs::write(dir.join("big.json"), spec(1_200)).unwrap();
    let o = sdpa(&["bench", "--spec", "big.json", "--dry-run", "--no-pytorch"], &dir);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("# big.json: 28800 configurations"));
}
