//! What the CLI test files share: running the built `sdpa` binary in a directory, a fresh scratch directory per
//! test named after the test file (so files running in parallel never meet), and headless chromium for the
//! HTML pages (`report_browser.rs`, `analyze_browser.rs`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `sdpa ARGS` in `cwd` and returns its output (status, stdout, stderr).
#[allow(dead_code)] // report_browser.rs runs `sdpa report` itself
pub fn sdpa(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sdpa")).args(args).current_dir(cwd).output().expect("the sdpa binary runs")
}

/// An empty directory `sdpa-<test file>-<pid>-<name>` under the system temp dir.
#[allow(dead_code)] // report_browser.rs makes its own
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

/// Debian's `chromium` (or another Chromium-based browser) on PATH, or `SDPA_CHROMIUM`.
#[allow(dead_code)]
pub fn find_browser() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("SDPA_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    for name in ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"] {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// The browser for a page test, or `None` (with a printed reason) to skip it; with `SDPA_REQUIRE_BROWSER=1`
/// (CI) a missing browser fails instead.
#[allow(dead_code)]
pub fn browser_or_skip() -> Option<PathBuf> {
    let b = find_browser();
    if b.is_none() {
        if std::env::var("SDPA_REQUIRE_BROWSER").is_ok_and(|v| v == "1") {
            panic!("chromium not found on PATH and SDPA_REQUIRE_BROWSER=1 (apt-get install chromium)");
        }
        eprintln!("skipping the browser test: no chromium on PATH (apt-get install chromium to run it)");
    }
    b
}

/// Loads `html` with `probe` (a `<script>` that leaves JSON in `<pre id="probe">` on load) in headless
/// chromium and returns that JSON.
#[allow(dead_code)]
pub fn probe_page(browser: &Path, dir: &Path, html: &str, probe: &str) -> serde_json::Value {
    let page = dir.join("probed.html");
    std::fs::write(&page, html.replace("</body>", &format!("{probe}</body>"))).expect("write the page");
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--window-size=1280,2000",
            &format!("--user-data-dir={}", dir.join("profile").display()),
            "--dump-dom",
            &format!("file://{}", page.display()),
        ])
        .output()
        .expect("chromium starts");
    let dom = String::from_utf8_lossy(&out.stdout);
    let json = dom
        .split_once("<pre id=\"probe\">")
        .and_then(|(_, rest)| rest.split_once("</pre>"))
        .map(|(json, _)| json.to_string())
        .unwrap_or_else(|| panic!("the probe did not run; chromium stderr: {}", String::from_utf8_lossy(&out.stderr)));
    serde_json::from_str(&json).expect("the probe writes JSON")
}
