//! Helpers the fuzz targets share: a scratch directory per process (the trace and TraceLens readers take
//! paths, not bytes) and the TraceLens input split.

use std::path::PathBuf;

/// A scratch directory unique to this fuzzing process, created once (in /dev/shm when it exists, so the
/// files the readers open never touch the disk).
pub fn scratch() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let base =
            if std::path::Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
        let d = base.join(format!("sdpa-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("scratch directory");
        d
    })
    .clone()
}

/// Separates the CSV from the metadata JSON in a `tracelens` input.
pub const TRACELENS_SPLIT: &[u8] = b"\n%%META%%\n";

/// Splits a `tracelens` input into (CSV, metadata JSON); without the separator all of it is the CSV and
/// the metadata file is absent.
pub fn split_tracelens(data: &[u8]) -> (&[u8], Option<&[u8]>) {
    match data.windows(TRACELENS_SPLIT.len()).position(|w| w == TRACELENS_SPLIT) {
        Some(i) => (&data[..i], Some(&data[i + TRACELENS_SPLIT.len()..])),
        None => (data, None),
    }
}

/// True when `SDPA_FUZZ_STRICT=1`: also check the invariants that fail on main until issue 19's
/// plausibility and memory-estimate work lands.
pub fn strict() -> bool {
    static STRICT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *STRICT.get_or_init(|| std::env::var("SDPA_FUZZ_STRICT").is_ok_and(|v| v == "1"))
}
