//! `sdpa cache` and `sdpa cache --clear` on a cache directory given by `SDPA_CUDA_CACHE`: what they print, and
//! that clearing removes the kernel images and temporary files but no other file. No GPU is needed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const KEY: &str = "0123456789abcdef0123456789abcdef";

/// Runs `sdpa ARGS` with the cache at `dir` and the bound from `max` (unset when `None`).
fn sdpa_cache(args: &[&str], dir: &Path, max: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sdpa"));
    cmd.args(args).env("SDPA_CUDA_CACHE", dir);
    match max {
        Some(m) => cmd.env("SDPA_CUDA_CACHE_MAX", m),
        None => cmd.env_remove("SDPA_CUDA_CACHE_MAX"),
    };
    let out = cmd.output().expect("the sdpa binary runs");
    assert!(out.status.success(), "sdpa {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// An empty directory of this test's own (`common::tmp` is not used: its `sdpa` helper cannot set the
/// environment, and an unused helper is a warning in this file).
fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sdpa-cache_cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn cache_reports_and_clear_keeps_unrelated_files() {
    let dir = tmp("cache");
    std::fs::write(dir.join(format!("fa2_bf16_128_causal-{KEY}.cubin")), vec![1u8; 1000]).expect("write");
    std::fs::write(dir.join(format!("splitkv_f16_64-{KEY}.cubin")), vec![1u8; 24]).expect("write");
    std::fs::write(dir.join("README.txt"), "mine").expect("write");

    let text = stdout(&sdpa_cache(&["cache"], &dir, Some("512M")));
    assert!(text.contains(&format!("cache: {}", dir.display())), "{text}");
    assert!(text.contains("files: 2 (1.0 KiB)"), "{text}");
    assert!(text.contains("bound: 512.0 MiB (SDPA_CUDA_CACHE_MAX=512M)"), "{text}");

    let garbage = stdout(&sdpa_cache(&["cache"], &dir, Some("lots")));
    assert!(garbage.contains("bound: 1.0 GiB (default;"), "{garbage}");
    assert!(garbage.contains("\"lots\" does not parse"), "{garbage}");

    let json: serde_json::Value =
        serde_json::from_slice(&sdpa_cache(&["cache", "--json"], &dir, None).stdout).expect("one JSON object");
    assert_eq!(json["files"], 2);
    assert_eq!(json["bytes"], 1024);
    assert_eq!(json["bound_bytes"], 1u64 << 30);
    assert_eq!(json["bound_source"], "default");
    assert_eq!(json["disabled"], false);

    let cleared = stdout(&sdpa_cache(&["cache", "--clear"], &dir, None));
    assert!(cleared.contains("removed 2 files (1.0 KiB)"), "{cleared}");
    assert!(dir.join("README.txt").exists(), "an unrelated file survives --clear");
    assert!(!dir.join(format!("splitkv_f16_64-{KEY}.cubin")).exists());

    let after = stdout(&sdpa_cache(&["cache"], &dir, None));
    assert!(after.contains("files: 0 (0 B)"), "{after}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cache_disabled_says_so() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sdpa"));
    let out = cmd.args(["cache", "--clear"]).env("SDPA_CUDA_CACHE", "off").output().expect("the sdpa binary runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout(&out).contains("disabled (SDPA_CUDA_CACHE=off)"), "{}", stdout(&out));
}
