//! Stamps the binary with the commit it is built from (`SDPA_BUILD_COMMIT`), so records written by a binary
//! carried to another machine (the GPU bundle) name the code that was measured, not whatever checkout
//! happens to be in the directory it runs from.

use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|c| !c.is_empty());
    if let Some(c) = commit {
        println!("cargo:rustc-env=SDPA_BUILD_COMMIT={c}");
    }
    // HEAD's reflog grows on every commit, checkout and reset: re-stamp then. Outside a git checkout these
    // paths do not exist and cargo re-runs this script on each build, which costs one failed `git` call.
    println!("cargo:rerun-if-changed=../.git/HEAD");
    println!("cargo:rerun-if-changed=../.git/logs/HEAD");
}
