//! What the CLI test files share: running the built `sdpa` binary in a directory, and a fresh scratch
//! directory per test named after the test file, so files running in parallel never meet.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `sdpa ARGS` in `cwd` and returns its output (status, stdout, stderr).
pub fn sdpa(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sdpa")).args(args).current_dir(cwd).output().expect("the sdpa binary runs")
}

/// An empty directory `sdpa-<test file>-<pid>-<name>` under the system temp dir.
pub fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sdpa-{}-{}-{name}", env!("CARGO_CRATE_NAME"), std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// A stand-in Python interpreter in `dir` for the PyTorch plumbing tests (CI has no torch): `-c "import
/// torch"` succeeds, anything else runs python3 (a stand-in script, then).
// Not every test file that shares this module times PyTorch.
#[allow(dead_code)]
pub fn fake_python(dir: &Path) -> PathBuf {
    let py = dir.join("fake-python");
    std::fs::write(&py, "#!/bin/sh\nif [ \"$1\" = \"-c\" ]; then exit 0; fi\nexec python3 \"$@\"\n").expect("write");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    py
}

/// A stand-in for `bench/pytorch_sdpa.py` in `dir/stub.py`: `body` runs with `specs` (the case specs `sdpa bench`
/// wrote) and `arg(flag)` in scope, and writes the result file itself. Returns the stand-in interpreter.
#[allow(dead_code)]
pub fn pytorch_stub(dir: &Path, body: &str) -> PathBuf {
    let head = "import json, sys\na = sys.argv[1:]\narg = lambda k: a[a.index(k) + 1]\nspecs = json.load(open(arg(\"--spec\")))\n";
    std::fs::write(dir.join("stub.py"), format!("{head}{body}")).expect("write");
    fake_python(dir)
}
