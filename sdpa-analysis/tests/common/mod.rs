//! What the test files of sdpa-analysis share.

#![allow(clippy::unwrap_used, dead_code)] // tests: a failed unwrap is a failed test; not every file uses all

use std::path::Path;

/// Copies a fixture directory to a scratch place (analyses of the TraceLens contract write into it).
pub fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), to).unwrap();
        }
    }
}
