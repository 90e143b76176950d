//! Result files: what `sdpa bench` and `bench/pytorch_sdpa.py` write, and the liberal reader every tool
//! uses (a bench file, a JSON array of records, one record as `sdpa run --json` prints it, JSON lines, or the
//! GPU helpers' flat harness format).

use super::{BenchRecord, TimeStats};
use crate::backend::F32Math;
use crate::check::{tolerance, CheckReport};
use crate::dtype::DType;
use crate::error::SdpaError;
use crate::spec::Shape;
use crate::variants::Variants;
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
    /// Ceilings measured in the same run (a dense GEMM, a device-to-device copy), when it measured them;
    /// reports divide by these before falling back to the datasheet table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceilings: Option<MeasuredPeak>,
    /// Kernel programs each backend compiled or loaded before the sweep timed anything.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warm_ups: Vec<super::WarmUp>,
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
            ceilings: None,
            warm_ups: Vec::new(),
        }
    }
}

impl Default for BenchFile {
    fn default() -> Self {
        Self::new()
    }
}

/// Peak rates measured on the machine (e.g. a GEMM and a copy in the same run), per dtype.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct MeasuredPeak {
    /// f32 TFLOP/s.
    pub f32_tflops: Option<f64>,
    /// f16 TFLOP/s.
    pub f16_tflops: Option<f64>,
    /// bf16 TFLOP/s.
    pub bf16_tflops: Option<f64>,
    /// Memory bandwidth, GB/s.
    pub gbps: Option<f64>,
}

impl MeasuredPeak {
    /// Parses `767` (every dtype) or `bf16=767,f16=664,f32=52` into the TFLOP/s fields.
    pub fn set_tflops(&mut self, s: &str) -> Result<(), String> {
        let num = |v: &str| -> Result<f64, String> {
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| format!("peak `{v}` is not a positive number"))
        };
        for part in s.split(',').filter(|p| !p.trim().is_empty()) {
            match part.split_once('=') {
                None => {
                    let x = num(part)?;
                    (self.f32_tflops, self.f16_tflops, self.bf16_tflops) = (Some(x), Some(x), Some(x));
                }
                Some((dt, v)) => {
                    let x = Some(num(v)?);
                    match dt.trim().parse::<DType>()? {
                        DType::F32 => self.f32_tflops = x,
                        DType::F16 => self.f16_tflops = x,
                        DType::BF16 => self.bf16_tflops = x,
                        DType::F8E4M3 => return Err("no measured peak is kept for f8e4m3 (f32, f16, bf16)".into()),
                    }
                }
            }
        }
        Ok(())
    }

    /// The TFLOP/s for a dtype, when measured.
    pub fn tflops(&self, dt: DType) -> Option<f64> {
        match dt {
            DType::F32 => self.f32_tflops,
            DType::F16 => self.f16_tflops,
            DType::BF16 => self.bf16_tflops,
            DType::F8E4M3 => None,
        }
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
    /// Window, softcap and ALiBi, as in records (absent: plain attention).
    #[serde(default, skip_serializing_if = "Variants::is_plain")]
    pub variants: Variants,
    /// Why it did not run.
    pub reason: String,
    /// True when it was attempted and failed (an error, not an unavailable backend or unsupported case).
    #[serde(default)]
    pub failed: bool,
}

/// Reads results from the text of one file, whatever of the accepted shapes it has. `name` is used in
/// error messages.
pub fn parse_results(text: &str, name: &str) -> Result<BenchFile, SdpaError> {
    let bad = |detail: String| SdpaError::ResultFile { file: name.to_string(), detail };
    // A UTF-8 byte order mark (Windows editors, PowerShell's `Out-File`) is not JSON and not whitespace.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let trimmed = text.trim_start();
    if trimmed.is_empty() {
        return Err(bad("the file is empty".to_string()));
    }
    // Python's json.dump writes NaN and Infinity unless told not to. They are not JSON; read them as null,
    // and a record left without a median becomes a "not run" entry instead of failing the whole file.
    let cleaned = non_finite_to_null(text);
    let text = cleaned.as_deref().unwrap_or(text);
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Array(items)) => {
            let mut file = BenchFile::new();
            for (i, item) in items.into_iter().enumerate() {
                match unmeasured(&item) {
                    Some(skip) => file.skipped.push(skip),
                    None => {
                        file.records.push(serde_json::from_value(item).map_err(|e| bad(format!("record {i}: {e}")))?)
                    }
                }
            }
            Ok(file)
        }
        Ok(v @ serde_json::Value::Object(_)) => {
            if is_flat(&v) {
                return from_flat(&v).map_err(bad);
            }
            if v.get("records").is_some() || v.get("skipped").is_some() {
                let mut v = v;
                let mut moved = Vec::new();
                if let Some(serde_json::Value::Array(recs)) = v.get_mut("records") {
                    recs.retain(|r| match unmeasured(r) {
                        Some(skip) => {
                            moved.push(skip);
                            false
                        }
                        None => true,
                    });
                }
                let mut f: BenchFile = serde_json::from_value(v).map_err(|e| bad(e.to_string()))?;
                f.skipped.extend(moved);
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

/// The GPU helpers' harness format (`bench/results/gpu/fa2-h100.json`): `{env, ceilings, records}` with flat
/// records (`b, hq, hkv, sq, sk, d, dtype, mask, kernel, median_ms, min_ms, max_ms, rel_err, check_pass`)
/// that also carry PyTorch's medians measured in the same run (`torch_flash_ms`, `torch_default_ms`).
fn is_flat(v: &serde_json::Value) -> bool {
    v.get("records")
        .and_then(|r| r.as_array())
        .and_then(|r| r.first())
        .is_some_and(|r| r.get("shape").is_none() && r.get("median_ms").is_some())
}

fn from_flat(v: &serde_json::Value) -> Result<BenchFile, String> {
    let text = |x: Option<&serde_json::Value>| x.and_then(|s| s.as_str()).map(String::from);
    let mut f = BenchFile::new();
    let env = v.get("env");
    f.command = env
        .and_then(|e| e.get("argv"))
        .and_then(|a| a.as_array())
        .map(|a| a.iter().filter_map(|s| s.as_str()).collect::<Vec<_>>().join(" "));
    f.machine = text(env.and_then(|e| e.get("name")));
    if let Some(c) = v.get("ceilings") {
        let num = |k: &str| c.get(k).and_then(|x| x.as_f64()).filter(|x| x.is_finite() && *x > 0.0);
        let peak = MeasuredPeak {
            f32_tflops: num("gemm_f32_TFLOPs"),
            f16_tflops: num("gemm_f16_TFLOPs"),
            bf16_tflops: num("gemm_bf16_TFLOPs"),
            gbps: num("d2d_GBps"),
        };
        if peak != MeasuredPeak::default() {
            f.ceilings = Some(peak);
        }
    }
    let records = v.get("records").and_then(|r| r.as_array()).ok_or("records is not an array")?;
    for (i, r) in records.iter().enumerate() {
        let e = |what: &str| format!("record {i}: {what}");
        let n = |k: &str| r.get(k).and_then(|x| x.as_u64()).map(|x| x as usize);
        let need = |k: &str| n(k).ok_or_else(|| e(&format!("missing `{k}`")));
        let d = need("d")?;
        let shape = Shape {
            b: need("b")?,
            hq: need("hq")?,
            hkv: need("hkv")?,
            sq: need("sq")?,
            sk: need("sk")?,
            d,
            dv: n("dv").unwrap_or(d),
        };
        let dtype: DType =
            text(r.get("dtype")).ok_or_else(|| e("missing `dtype`"))?.parse().map_err(|m: String| e(&m))?;
        let ms = |k: &str| r.get(k).and_then(|x| x.as_f64()).filter(|x| x.is_finite() && *x > 0.0);
        let median = ms("median_ms").ok_or_else(|| e("missing `median_ms`"))?;
        let f32_math = text(r.get("f32_math"));
        let fm: F32Math = f32_math.as_deref().and_then(|m| m.parse().ok()).unwrap_or_default();
        let tol = tolerance(dtype, fm);
        let check = r.get("rel_err").and_then(|x| x.as_f64()).map(|rel| CheckReport {
            // Not recorded by the harness.
            max_abs_err: f64::NAN,
            rel_err: rel,
            tolerance: tol,
            nan_mismatches: 0,
            lse_max_abs_err: None,
            rows_checked: 0,
            pass: r.get("check_pass").and_then(|p| p.as_bool()).unwrap_or(rel <= tol),
        });
        let device = text(r.get("device")).unwrap_or_else(|| f.machine.clone().unwrap_or_default());
        let base = BenchRecord {
            backend: text(r.get("backend")).unwrap_or_else(|| "cuda".to_string()),
            kernel: text(r.get("kernel")).ok_or_else(|| e("missing `kernel`"))?,
            auto_chose: None,
            device,
            dtype,
            shape,
            mask: text(r.get("mask")).unwrap_or_else(|| "none".to_string()),
            variants: Default::default(),
            ragged: None,
            pass: Default::default(),
            deterministic: None,
            grad_check: None,
            layout: text(r.get("layout")),
            f32_math: if dtype == DType::F32 { f32_math } else { None },
            // The FP8 helper's records carry `{q, k, v}` (sdpa-cuda/dev/fa3_fp8_bench.py).
            descale: if dtype == DType::F8E4M3 { r.get("descale").and_then(descale_of) } else { None },
            threads: None,
            time_ms: TimeStats {
                median,
                min: ms("min_ms").unwrap_or(median),
                max: ms("max_ms").unwrap_or(median),
                reps: n("reps").unwrap_or(0),
            },
            tflops: r.get("tflops").and_then(|x| x.as_f64()).unwrap_or(0.0),
            gbps: r.get("gbps").and_then(|x| x.as_f64()).unwrap_or(0.0),
            check,
            peak_mem_bytes: None,
            commit: text(r.get("commit")),
            date: text(r.get("date")),
            first_call: None,
            gpus: None,
            machine: None,
        };
        // PyTorch measured beside it in the same run: medians only.
        for (key, kernel) in [("torch_flash_ms", "flash"), ("torch_default_ms", "default"), ("torch_cudnn_ms", "cudnn")]
        {
            if let Some(t) = ms(key) {
                let mut p = base.clone();
                p.backend = "pytorch".to_string();
                p.kernel = kernel.to_string();
                p.time_ms = TimeStats { median: t, min: t, max: t, reps: 0 };
                // The same call's work in PyTorch's time: the rates scale with 1 / time (the flat format
                // records only our kernel's rates; copying them would give PyTorch our speed).
                p.tflops = base.tflops * median / t;
                p.gbps = base.gbps * median / t;
                p.check = None;
                f.records.push(p);
            }
        }
        f.records.push(base);
    }
    Ok(f)
}

/// A flat record's `descale` (`{"q": .., "k": .., "v": ..}`), when it holds three valid factors.
fn descale_of(v: &serde_json::Value) -> Option<crate::fp8::Descale> {
    let d: crate::fp8::Descale = serde_json::from_value(v.clone()).ok()?;
    d.validate().is_ok().then_some(d)
}

/// `text` with every NaN / Infinity / -Infinity outside strings replaced by null, or `None` when it has none.
fn non_finite_to_null(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let mut out: Option<String> = None;
    let (mut i, mut last, mut in_str, mut esc) = (0, 0, false, false);
    while i < b.len() {
        let c = b[i];
        if in_str {
            if esc {
                esc = false;
            } else if c == b'\\' {
                esc = true;
            } else if c == b'"' {
                in_str = false;
            }
            i += 1;
            continue;
        }
        if c == b'"' {
            in_str = true;
            i += 1;
            continue;
        }
        let token = ["-Infinity", "Infinity", "NaN"].into_iter().find(|t| b[i..].starts_with(t.as_bytes()));
        match token {
            Some(t) => {
                let o = out.get_or_insert_with(String::new);
                o.push_str(&text[last..i]);
                o.push_str("null");
                i += t.len();
                last = i;
            }
            None => i += 1,
        }
    }
    out.map(|mut o| {
        o.push_str(&text[last..]);
        o
    })
}

/// A record without a finite median (NaN in the file) as a "not run" entry, when it names its configuration.
fn unmeasured(r: &serde_json::Value) -> Option<Skipped> {
    let median = r.get("time_ms").and_then(|t| t.get("median"));
    if median.is_some_and(|m| m.as_f64().is_some_and(f64::is_finite)) {
        return None;
    }
    let text = |k: &str| r.get(k).and_then(|x| x.as_str()).map(String::from);
    Some(Skipped {
        backend: text("backend")?,
        kernel: text("kernel")?,
        dtype: serde_json::from_value(r.get("dtype")?.clone()).ok()?,
        shape: serde_json::from_value(r.get("shape")?.clone()).ok()?,
        mask: text("mask").unwrap_or_else(|| "none".to_string()),
        layout: text("layout"),
        variants: r.get("variants").and_then(|v| serde_json::from_value(v.clone()).ok()).unwrap_or_default(),
        reason: "no valid time in the result file (NaN or missing median)".to_string(),
        failed: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_outside_strings_becomes_null_and_unmeasured_records_become_not_run() {
        assert_eq!(non_finite_to_null(r#"{"a": "NaN", "b": 1}"#), None);
        assert_eq!(
            non_finite_to_null(r#"{"a": NaN, "s": "x\"NaN", "b": [-Infinity, Infinity]}"#).as_deref(),
            Some(r#"{"a": null, "s": "x\"NaN", "b": [null, null]}"#)
        );
        let text = r#"[{"backend":"pytorch","kernel":"fused","device":"cpu","dtype":"f32",
            "shape":{"b":1,"hq":8,"hkv":8,"sq":16384,"sk":16384,"d":64,"dv":64},"mask":"none",
            "time_ms":{"median":NaN,"min":NaN,"max":NaN},"tflops":0.0,"gbps":0.0},
            {"backend":"cpu","kernel":"fa2","device":"cpu","dtype":"f32",
            "shape":{"b":1,"hq":8,"hkv":8,"sq":512,"sk":512,"d":64,"dv":64},"mask":"none",
            "time_ms":{"median":1.0,"min":1.0,"max":1.0},"tflops":0.0,"gbps":0.0}]"#;
        let f = parse_results(text, "t.json").unwrap();
        assert_eq!((f.records.len(), f.skipped.len()), (1, 1));
        assert_eq!(f.skipped[0].shape.sq, 16384);
    }

    /// Regression (issue 19): a result file saved with a UTF-8 byte order mark was "expected value at line
    /// 1 column 1"; the same file without it reads fine.
    #[test]
    fn a_utf8_bom_is_accepted() {
        let rec = r#"{"backend":"cpu","kernel":"fa2","device":"cpu","dtype":"f32",
            "shape":{"b":1,"hq":8,"hkv":8,"sq":512,"sk":512,"d":64,"dv":64},"mask":"none",
            "time_ms":{"median":1.0,"min":1.0,"max":1.0},"tflops":0.0,"gbps":0.0}"#;
        for text in
            [format!("\u{feff}{rec}"), format!("\u{feff}[{rec}]"), format!("\u{feff}{}\n", rec.replace('\n', ""))]
        {
            let f = parse_results(&text, "bom.json").unwrap_or_else(|e| panic!("{e}: {text}"));
            assert_eq!(f.records.len(), 1);
        }
    }

    /// The FP8 helper's flat records (bench/results/gpu/fp8-h100.json) carry their descales; a malformed
    /// or non-FP8 one is dropped, not an error.
    #[test]
    fn flat_fp8_records_keep_their_descales() {
        let text = r#"{"env":{"name":"h100"},"records":[
            {"kernel":"fa3","dtype":"f8e4m3","b":1,"hq":8,"hkv":8,"sq":512,"sk":512,"d":64,"median_ms":1.0,
             "descale":{"k":0.25,"q":0.5,"v":0.125}},
            {"kernel":"fa3","dtype":"f8e4m3","b":1,"hq":8,"hkv":8,"sq":512,"sk":512,"d":64,"median_ms":1.0,
             "descale":{"q":0.5,"k":-1.0,"v":0.125}},
            {"kernel":"fa3","dtype":"bf16","b":1,"hq":8,"hkv":8,"sq":512,"sk":512,"d":64,"median_ms":1.0,
             "descale":{"q":0.5,"k":0.25,"v":0.125}}]}"#;
        let f = parse_results(text, "fp8.json").unwrap();
        let ds: Vec<_> = f.records.iter().map(|r| r.descale).collect();
        assert_eq!(ds, vec![Some(crate::fp8::Descale { q: 0.5, k: 0.25, v: 0.125 }), None, None]);
    }

    /// Regression (issue 27): a flat harness file's PyTorch records carried our kernel's TFLOP/s and GB/s.
    #[test]
    fn flat_files_give_pytorch_its_own_rates() {
        let text = r#"{"env":{"name":"h100"},"records":[{"kernel":"fa2","dtype":"bf16","b":1,"hq":8,"hkv":8,
            "sq":1024,"sk":1024,"d":64,"median_ms":2.0,"tflops":100.0,"gbps":50.0,"torch_flash_ms":1.0,
            "torch_default_ms":4.0}]}"#;
        let f = parse_results(text, "flat.json").unwrap();
        let rate = |k: &str| f.records.iter().find(|r| r.kernel == k).map(|r| (r.tflops, r.gbps)).unwrap();
        assert_eq!(rate("fa2"), (100.0, 50.0));
        assert_eq!(rate("flash"), (200.0, 100.0));
        assert_eq!(rate("default"), (50.0, 25.0));
    }
}
