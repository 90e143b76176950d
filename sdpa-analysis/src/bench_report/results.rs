//! Result files: what `sdpa bench` and `bench/pytorch_sdpa.py` write, and the liberal reader `sdpa report`
//! uses (a bench file, a JSON array of records, one record as `sdpa run --json` prints it, or JSON lines).

use super::ReportError;
use sdpa_core::{BenchRecord, DType, Shape};
use serde::{Deserialize, Serialize};

/// The format tag written into every bench file.
pub const BENCH_FORMAT: &str = "sdpa-bench-v1";

/// One benchmark run: its records, the configurations it could not run, and where it ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchFile {
    /// Always [`BENCH_FORMAT`].
    #[serde(default)]
    pub format: String,
    /// The command line that produced the file.
    #[serde(default)]
    pub command: Option<String>,
    /// Machine description (CPU model, threads, host).
    #[serde(default)]
    pub machine: Option<String>,
    /// Git commit measured.
    #[serde(default)]
    pub commit: Option<String>,
    /// UTC date-time of the run (RFC 3339).
    #[serde(default)]
    pub date: Option<String>,
    /// One record per configuration that ran.
    #[serde(default)]
    pub records: Vec<BenchRecord>,
    /// Configurations that did not run, with the reason.
    #[serde(default)]
    pub skipped: Vec<Skipped>,
}

impl BenchFile {
    /// An empty file stamped with the format tag.
    pub fn new() -> Self {
        BenchFile {
            format: BENCH_FORMAT.to_string(),
            command: None,
            machine: None,
            commit: None,
            date: None,
            records: Vec::new(),
            skipped: Vec::new(),
        }
    }
}

impl Default for BenchFile {
    fn default() -> Self {
        Self::new()
    }
}

/// A configuration a sweep asked for but could not run (backend unavailable, kernel unsupported for the
/// shape, a runtime failure), kept so reports say what is missing instead of silently dropping it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    /// Backend name.
    pub backend: String,
    /// Kernel name.
    pub kernel: String,
    /// Element type.
    pub dtype: DType,
    /// Logical sizes.
    pub shape: Shape,
    /// Mask name as in records.
    pub mask: String,
    /// Layout name.
    #[serde(default)]
    pub layout: Option<String>,
    /// Why it did not run.
    pub reason: String,
    /// True when it was attempted and failed (an error, not an unavailable backend or unsupported case).
    #[serde(default)]
    pub failed: bool,
}

/// Reads results from the text of one file, whatever of the accepted shapes it has. `name` is used in
/// error messages.
pub fn parse_results(text: &str, name: &str) -> Result<BenchFile, ReportError> {
    let bad = |detail: String| ReportError::Parse { file: name.to_string(), detail };
    let trimmed = text.trim_start();
    if trimmed.is_empty() {
        return Err(bad("the file is empty".to_string()));
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Array(items)) => {
            let mut file = BenchFile::new();
            for (i, item) in items.into_iter().enumerate() {
                file.records.push(serde_json::from_value(item).map_err(|e| bad(format!("record {i}: {e}")))?);
            }
            Ok(file)
        }
        Ok(v @ serde_json::Value::Object(_)) => {
            if v.get("records").is_some() || v.get("skipped").is_some() {
                let mut f: BenchFile = serde_json::from_value(v).map_err(|e| bad(e.to_string()))?;
                if f.format.is_empty() {
                    f.format = BENCH_FORMAT.to_string();
                }
                Ok(f)
            } else {
                let r: BenchRecord = serde_json::from_value(v).map_err(|e| bad(format!("not a record: {e}")))?;
                let mut f = BenchFile::new();
                f.records.push(r);
                Ok(f)
            }
        }
        Ok(_) => Err(bad("expected a JSON object or array".to_string())),
        // JSON lines: one record per non-empty line.
        Err(whole) => {
            let mut f = BenchFile::new();
            for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
                let r: BenchRecord = serde_json::from_str(line).map_err(|e| {
                    if i == 0 {
                        bad(whole.to_string())
                    } else {
                        bad(format!("line {}: {e}", i + 1))
                    }
                })?;
                f.records.push(r);
            }
            Ok(f)
        }
    }
}
