//! `sdpa run` as a user meets it: the JSON object of issue 2, checks that pass, and bad arguments that
//! fail with one line and a non-zero exit.

use std::process::Command;

fn sdpa(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sdpa")).args(args).output().expect("the sdpa binary runs")
}

#[test]
fn reference_run_prints_the_documented_json_object() {
    let out = sdpa(&[
        "run",
        "--backend",
        "reference",
        "--shape",
        "2,8,2,77,130,64",
        "--mask",
        "causal-br",
        "--check",
        "--json",
    ]);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON object");
    assert_eq!(v["backend"], "reference");
    assert_eq!(v["dtype"], "bf16");
    assert_eq!(v["mask"], "causal-br");
    let shape = &v["shape"];
    for (k, want) in [("b", 2), ("hq", 8), ("hkv", 2), ("sq", 77), ("sk", 130), ("d", 64), ("dv", 64)] {
        assert_eq!(shape[k], want, "shape.{k}");
    }
    let t = &v["time_ms"];
    let (med, min, max) = (t["median"].as_f64().unwrap(), t["min"].as_f64().unwrap(), t["max"].as_f64().unwrap());
    assert!(min > 0.0 && min <= med && med <= max);
    assert!(v["tflops"].as_f64().unwrap() > 0.0 && v["gbps"].as_f64().unwrap() > 0.0);
    assert!(v["device"].is_string());
    // `--kernel` defaults to auto; the record says so and names the kernel the backend chose.
    assert_eq!(v["kernel"], "auto");
    assert_eq!(v["auto_chose"], "unfused");
    let c = &v["check"];
    assert_eq!(c["pass"], true);
    assert!(c["rel_err"].as_f64().unwrap() < c["tolerance"].as_f64().unwrap());
    assert!(c["max_abs_err"].as_f64().is_some());
}

#[test]
fn every_dtype_layout_and_mask_checks_on_the_reference() {
    for dtype in ["f32", "f16", "bf16"] {
        for (mask, layout) in [("none", "bshd"), ("causal", "bhsd"), ("causal-br", "bshd")] {
            let out = sdpa(&[
                "run",
                "--shape",
                "1,4,1,9,13,24,16",
                "--dtype",
                dtype,
                "--mask",
                mask,
                "--layout",
                layout,
                "--check",
                "--reps",
                "2",
                "--warmup",
                "0",
            ]);
            assert!(out.status.success(), "{dtype} {mask} {layout}: {}", String::from_utf8_lossy(&out.stderr));
            assert!(String::from_utf8_lossy(&out.stdout).contains("check pass"));
        }
    }
}

#[test]
fn bad_arguments_fail_with_one_line_and_no_panic() {
    for args in [
        &["run", "--shape", "1,3,2,4,4,8"][..], // Hq not a multiple of Hkv
        &["run", "--shape", "1,0,1,4,4,8"],     // zero dim
        &["run", "--shape", "1,2,3"],           // too few numbers
        &["run", "--shape", "99999999999,99999999999,1,99999999999,4,8"], // overflow
        &["run", "--mask", "diagonal"],
        &["run", "--dtype", "f8"],
        &["run", "--backend", "tpu"],
        &["run", "--reps", "0"],
    ] {
        let out = sdpa(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
        let first = err.lines().next().unwrap_or("");
        assert!(first.starts_with("sdpa: ") || first.starts_with("error: "), "{args:?}: {err}");
    }
}

#[test]
fn records_name_the_commit_the_binary_was_built_from_wherever_it_runs() {
    // Run outside any git checkout (as the GPU bundle does on the device): the record still names the commit
    // of the code measured, the one this test binary's crate was built from.
    let dir = std::env::temp_dir().join(format!("sdpa-run-commit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sdpa"))
        .args(["run", "--backend", "reference", "--shape", "1,1,1,8,8,8", "--json"])
        .current_dir(&dir)
        .output()
        .expect("the sdpa binary runs");
    std::fs::remove_dir_all(&dir).ok();
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    match option_env!("SDPA_BUILD_COMMIT") {
        Some(built) => assert_eq!(v["commit"], built),
        // Built outside a git checkout: nothing to stamp, and the temp dir is no checkout either.
        None => assert!(v["commit"].is_null(), "{}", v["commit"]),
    }
}

/// `SDPA_CPU_SIMD` forces the CPU backend's SIMD path for measurement on any machine: the record's device
/// names the path, `sdpa devices` says it was forced, a first-call record is there, and a path that is not
/// one (or that this CPU lacks) is one clear error.
#[test]
fn the_cpu_simd_path_can_be_forced_and_a_wrong_one_is_refused() {
    let with = |simd: &str, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_sdpa")).args(args).env("SDPA_CPU_SIMD", simd).output().expect("runs")
    };
    let run = ["run", "--backend", "cpu", "--kernel", "fa2", "--shape", "1,2,2,40,56,64", "--check", "--json"];
    let out = with("scalar", &run);
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert!(v["device"].as_str().is_some_and(|d| d.contains("(scalar,")), "{}", v["device"]);
    assert_eq!(v["check"]["pass"], true);
    assert_eq!(v["first_call"]["cache"], "loaded", "the CPU compiles nothing: {}", v["first_call"]);
    assert!(v["first_call"]["since_process_start_s"].as_f64().is_some_and(|s| s > 0.0));
    let out = with("scalar", &["devices"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("simd path: scalar (forced by SDPA_CPU_SIMD)"), "{text}");
    // The AMX path's state is always printed: ready, or the reason it cannot run here.
    let amx = text.lines().find(|l| l.starts_with("cpu amx: ")).unwrap_or_else(|| panic!("no amx line: {text}"));
    assert!(amx.starts_with("cpu amx: ready") || amx.starts_with("cpu amx: unavailable: "), "{amx}");
    // Paths the CPU runs but the backend sets aside unless forced (avx512-bf16 on Intel) come with their
    // reason; the path it chooses is never one of them.
    let mut devices = Command::new(env!("CARGO_BIN_EXE_sdpa"));
    let out = devices.args(["devices", "--json"]).env_remove("SDPA_CPU_SIMD").output().expect("runs");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let chosen = format!("{}: ", v["cpu_simd_path"].as_str().expect("a path"));
    let passed = v["cpu_simd_passed_over"].as_array().expect("a list");
    assert!(passed.iter().all(|p| p.as_str().is_some_and(|p| p.contains(": ") && !p.starts_with(&chosen))), "{v}");
    let out = with("avx9000", &run);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.starts_with("sdpa: ") && err.contains("unknown simd path `avx9000`"), "{err}");
}

/// Regression: an f8e4m3 run's record lacked the descale factors it ran with (`--descale`, or the default for
/// random inputs), so records of runs at different factors could not be told apart.
#[test]
fn fp8_records_carry_their_descales() {
    let run = |extra: &[&str]| {
        let mut args =
            vec!["run", "--backend", "reference", "--shape", "1,2,2,16,24,32", "--dtype", "f8e4m3", "--json"];
        args.extend_from_slice(extra);
        let out = sdpa(&args);
        assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("stdout is one JSON object")
    };
    let v = run(&["--descale", "0.5,0.25,0.125"]);
    assert_eq!(v["dtype"], "f8e4m3");
    assert_eq!(v["descale"], serde_json::json!({"q": 0.5, "k": 0.25, "v": 0.125}));
    // The default factors are recorded too (sqrt(3)/448 for all three).
    let d = run(&[])["descale"].clone();
    let q = d["q"].as_f64().expect("a factor");
    assert!((q - 3f64.sqrt() / 448.0).abs() < 1e-6 && d["k"] == d["q"] && d["v"] == d["q"], "{d}");
    // Other dtypes write no descale.
    let out = sdpa(&["run", "--backend", "reference", "--shape", "1,2,2,16,24,32", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON object");
    assert!(v.get("descale").is_none(), "{v}");
}
