//! The TraceLens-style directory contract of the seed analysis skill.
//!
//! Input: `DIR/category_data/sdpa_fwd_ops.csv` (one row per distinct SDPA op: name, `Input Dims`,
//! `Input type`, `Concrete Inputs` as Python tuple literals, `operation_count`, `Kernel Time (µs)_sum`,
//! `kernel_details_summary`, `call_stack_full`) and `DIR/metadata/sdpa_fwd_metadata.json` (`platform`,
//! `gpu_utilization`). Output: `DIR/category_findings/sdpa_fwd_findings.md`. The backward category
//! (`sdpa_bwd_ops.csv`, `sdpa_bwd_metadata.json` -> `sdpa_bwd_findings.md`) is read the same way when present.
//!
//! The rows are re-analysed with this crate's own model: dims and causal flags are read from the raw
//! inputs (not TraceLens' `perf_params`), bytes use the real element size, causal FLOPs are exact for any
//! Sq/Sk, and the backend comes from the op and its kernels (cuDNN's flash kernel is a flash kernel).

use crate::error::{AnalysisError, Result};
use crate::trace::analyze::{build_report, Options};
use crate::trace::attention::fused::{checked_shape, extract_mask, extract_shape, extract_variants, refine_backend};
use crate::trace::attention::signature::signature;
use crate::trace::attention::{AttentionCall, Kind, MaskInfo};
use crate::trace::kineto::OpArgs;
use crate::trace::report::{DeviceInfo, Suspect, TraceInfo, TraceReport};
use std::path::{Path, PathBuf};

/// Largest `operation_count` accepted from a row, and from all rows together (a guard against absurd
/// input: no profile of a few steps holds ten million attention calls).
const MAX_COUNT: u64 = 10_000_000;

/// The column that holds each row's GPU kernel time, and the one used when it is absent.
const KERNEL_TIME: &str = "Kernel Time (µs)_sum";
const CPU_TIME: &str = "total_duration_us";

/// Reads the contract's forward-SDPA inputs under `dir` and analyses them.
pub fn analyze_dir(dir: &Path, opts: &Options) -> Result<TraceReport> {
    analyze_category(dir, "sdpa_fwd", opts)
}

/// True when `DIR/category_data/{category}_ops.csv` exists (`sdpa_fwd`, `sdpa_bwd`).
pub fn has_category(dir: &Path, category: &str) -> bool {
    dir.join("category_data").join(format!("{category}_ops.csv")).is_file()
}

/// Reads `DIR/category_data/{category}_ops.csv` and `DIR/metadata/{category}_metadata.json` and analyses
/// them (`category` is `sdpa_fwd` or `sdpa_bwd`).
pub fn analyze_category(dir: &Path, category: &str, opts: &Options) -> Result<TraceReport> {
    let csv_path = dir.join("category_data").join(format!("{category}_ops.csv"));
    let meta_path = dir.join("metadata").join(format!("{category}_metadata.json"));
    let text = std::fs::read_to_string(&csv_path).map_err(|e| AnalysisError::io(&csv_path, "cannot read", e))?;
    // Excel and Windows editors save CSV with a UTF-8 byte order mark; it is not part of the first column's name.
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let rows = parse_csv(text).map_err(|m| AnalysisError::invalid(&csv_path, m))?;
    let header = rows.first().ok_or_else(|| AnalysisError::invalid(&csv_path, "empty CSV"))?;
    let col = |name: &str| header.iter().position(|h| h == name);
    let need = |name: &str| col(name).ok_or_else(|| AnalysisError::invalid(&csv_path, format!("no `{name}` column")));
    let (c_name, c_dims, c_types, c_conc, c_count) =
        (need("name")?, need("Input Dims")?, need("Input type")?, need("Concrete Inputs")?, need("operation_count")?);
    let mut missing = Vec::new();
    let c_time = match (col(KERNEL_TIME), col(CPU_TIME)) {
        (Some(c), _) => c,
        // The op's CPU duration includes launch overhead and the kernels' wait, not GPU time: a different
        // number (327.5 µs instead of 154.6 µs on the qwen2 fixture) and maybe a different severity. Say so.
        (None, Some(c)) => {
            missing.push(format!(
                "{}: no `{KERNEL_TIME}` column: attention time is the ops' CPU duration from `{CPU_TIME}` \
                 (launch overhead and waits included), not their GPU kernel time",
                csv_path.display()
            ));
            c
        }
        (None, None) => {
            return Err(AnalysisError::invalid(&csv_path, format!("no `{KERNEL_TIME}` (or `{CPU_TIME}`) column")))
        }
    };
    let c_kernels = col("kernel_details_summary");
    let c_stack = col("call_stack_full");
    let c_strides = col("Input Strides");
    let c_perf = col("perf_params");

    let mut calls: Vec<AttentionCall> = Vec::new();
    let mut skipped = Vec::new();
    let mut suspect: Vec<Suspect> = Vec::new();
    let csv_name = csv_path.display().to_string();
    let mut total_count: u64 = 0;
    for (line, row) in rows.iter().enumerate().skip(1) {
        let get = |c: usize| row.get(c).map(String::as_str).unwrap_or("");
        let name = get(c_name);
        let Some(sig) = signature(name) else {
            skipped.push(name.to_string());
            continue;
        };
        let args = OpArgs {
            dims: parse_py_dims(get(c_dims)),
            types: parse_py_strs(get(c_types)),
            concrete: parse_py_strs(get(c_conc)),
            strides: c_strides.map(|c| parse_py_dims(get(c))).unwrap_or_default(),
        };
        let count: u64 = get(c_count)
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 1.0)
            .map(|v| v as u64)
            .ok_or_else(|| {
                AnalysisError::invalid(
                    &csv_path,
                    format!("row {}: operation_count `{}` is not a positive number", line + 1, get(c_count)),
                )
            })?;
        if count > MAX_COUNT || total_count + count > MAX_COUNT {
            return Err(AnalysisError::invalid(
                &csv_path,
                format!(
                    "row {}: operation_count {count} is implausible ({} calls in the rows before it; at most {MAX_COUNT} in all)",
                    line + 1,
                    total_count
                ),
            ));
        }
        let total: f64 =
            get(c_time).trim().parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0).ok_or_else(|| {
                AnalysisError::invalid(
                    &csv_path,
                    format!("row {}: kernel time `{}` is not a number", line + 1, get(c_time)),
                )
            })?;
        if let Err(why) = crate::trace::plausible::duration(total / count as f64) {
            let example = format!("row {}: `{name}` per-call time {why}", line + 1);
            Suspect::tally(&mut suspect, Some(&csv_name), "row time", &example, "row left out", 1);
            continue;
        }
        let kernels = c_kernels.map(|c| parse_kernel_summary(get(c))).unwrap_or_default();
        let module: Vec<String> = c_stack
            .map(|c| {
                parse_py_strs_loose(get(c))
                    .into_iter()
                    .filter_map(|f| f.strip_prefix("nn.Module: ").map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let mut shape_suspect = None;
        let mut shape = match extract_shape(&sig, &args).map(|x| checked_shape(x, name)) {
            Some(Ok((s, packing, _))) => Some((s, packing)),
            Some(Err(why)) => {
                shape_suspect = Some(why);
                None
            }
            None => None,
        };
        let mut mask = extract_mask(&sig, &args).unwrap_or(MaskInfo::Unknown);
        let mut notes =
            vec![format!("from a TraceLens {category}_ops.csv row (per-call time = Kernel Time sum / count)")];
        // Autograd-node rows carry only the gradient's dims: fall back on TraceLens' own perf_params.
        let pp = c_perf.map(|c| parse_perf_params(get(c))).unwrap_or_default();
        if shape.is_none() && shape_suspect.is_none() {
            match pp.shape.map(|s| checked_shape((s, (), ()), name)) {
                Some(Ok((s, (), ()))) => {
                    shape = Some((s, Default::default()));
                    notes.push("shape from TraceLens' perf_params (the op's inputs do not carry Q/K/V)".into());
                }
                Some(Err(why)) => shape_suspect = Some(why),
                None => {}
            }
        }
        if mask == MaskInfo::Unknown {
            if let Some(c) = pp.causal {
                mask = if c { MaskInfo::CausalTopLeft } else { MaskInfo::None };
            }
        }
        let per_call = total / count as f64;
        let mut call = AttentionCall {
            kind: Kind::Fused,
            phase: sig.phase,
            backend: sig.backend,
            op: name.to_string(),
            module,
            shape: shape.map(|s| s.0),
            layout: shape.map(|s| s.1.layout).unwrap_or_default(),
            ragged: shape.and_then(|s| s.1.ragged),
            dtype: args.ty(sig.qkv[0]).map(str::to_string),
            mask,
            variants: extract_variants(&sig, &args),
            scale: None,
            dropout: None,
            q_bshd_strides: shape.is_some_and(|s| s.1.bshd),
            gpu_us: per_call,
            kernels: kernels.iter().map(|(k, us)| (k.clone(), us / count as f64)).collect(),
            grid_blocks: None,
            parts: Vec::new(),
            notes,
            suspect: shape_suspect,
            repeat: count,
            at: (0, line as f64),
            seqs: Vec::new(),
            kv: Default::default(),
        };
        refine_backend(&mut call);
        total_count += count;
        calls.push(call);
    }

    if !skipped.is_empty() {
        missing.push(format!(
            "{}: rows that are not attention ops were skipped: {}",
            csv_path.display(),
            skipped.join(", ")
        ));
    }
    let (platform, total_gpu) = read_metadata(&meta_path, &mut missing)?;
    let attention: f64 = calls.iter().map(|c| c.gpu_us * c.repeat as f64).sum();
    let total_gpu = match total_gpu {
        // The metadata's busy time is measured on the whole trace, the rows' kernel time is summed per op:
        // attention above the busy time means the two do not describe the same run (rows duplicated or
        // edited, metadata of another trace). Dividing one by the other gave "attention = 192292.7 % of
        // GPU time" on 60,000 rows; neither number can be trusted as the other's denominator.
        Some(t) if t > 0.0 && t.is_finite() && attention <= t * (1.0 + 1e-9) => t,
        Some(t) if t > 0.0 && t.is_finite() => {
            missing.push(format!(
                "{}: the metadata's GPU busy time ({t:.1} µs) is less than the rows' attention kernel time \
                 ({attention:.1} µs), so they do not describe the same run: the attention share is relative to \
                 attention alone",
                meta_path.display()
            ));
            attention
        }
        _ => {
            missing.push("no GPU busy time in the metadata: the attention share is relative to attention alone".into());
            attention
        }
    };
    let device = DeviceInfo::resolve(platform.as_deref(), None, opts.device.as_deref(), "metadata");
    if device.key.is_none() {
        missing.push("platform not in the hardware table: pass --device".into());
    }
    let inputs = vec![csv_path.display().to_string(), meta_path.display().to_string()];
    Ok(build_report(inputs, device, &calls, total_gpu, missing, suspect, TraceInfo::default(), Vec::new(), opts, &[]))
}

/// Writes the findings markdown into `DIR/category_findings/sdpa_fwd_findings.md`; returns its path.
pub fn write_findings(dir: &Path, report: &TraceReport) -> Result<PathBuf> {
    write_category_findings(dir, "sdpa_fwd", report)
}

/// Writes `DIR/category_findings/{category}_findings.md`; returns its path.
pub fn write_category_findings(dir: &Path, category: &str, report: &TraceReport) -> Result<PathBuf> {
    let out_dir = dir.join("category_findings");
    std::fs::create_dir_all(&out_dir).map_err(|e| AnalysisError::io(&out_dir, "cannot create", e))?;
    let out = out_dir.join(format!("{category}_findings.md"));
    std::fs::write(&out, crate::trace::printers::markdown::render(report))
        .map_err(|e| AnalysisError::io(&out, "cannot write", e))?;
    Ok(out)
}

/// Platform name and GPU busy time (µs) from the metadata JSON; a missing file is noted, a malformed one is
/// an error.
fn read_metadata(path: &Path, missing: &mut Vec<String>) -> Result<(Option<String>, Option<f64>)> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            missing.push(format!("{}: not found; device unknown unless --device is given", path.display()));
            return Ok((None, None));
        }
        Err(e) => return Err(AnalysisError::io(path, "cannot read", e)),
    };
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| AnalysisError::invalid(path, format!("invalid JSON: {e}")))?;
    let platform = v.get("platform").and_then(|p| p.as_str()).map(str::to_string);
    let util = v.get("gpu_utilization");
    let total_ms = util.and_then(|u| u.get("total_time_ms")).and_then(|x| x.as_f64());
    let busy_pct = util.and_then(|u| u.get("computation_time_percent")).and_then(|x| x.as_f64());
    let busy_us = match (total_ms, busy_pct) {
        (Some(t), Some(p)) => Some(t * 1e3 * p / 100.0),
        _ => None,
    };
    Ok((platform, busy_us))
}

/// What TraceLens' `perf_params` column says (`{'B': 2, 'N_Q': 1024, 'H_Q': 8, 'N_KV': 1024, 'H_KV': 8,
/// 'd_h_qk': 64, 'd_h_v': 64, 'causal': True, ...}`).
#[derive(Debug, Default, PartialEq)]
struct PerfParams {
    shape: Option<sdpa_core::Shape>,
    causal: Option<bool>,
}

fn parse_perf_params(s: &str) -> PerfParams {
    let field = |key: &str| -> Option<&str> {
        let at = s.find(&format!("'{key}': "))? + key.len() + 4;
        let rest = &s[at..];
        Some(rest[..rest.find([',', '}']).unwrap_or(rest.len())].trim())
    };
    let num = |key: &str| field(key).and_then(|v| v.parse::<usize>().ok()).filter(|&v| v > 0);
    let shape = (|| {
        Some(sdpa_core::Shape {
            b: num("B")?,
            hq: num("H_Q")?,
            hkv: num("H_KV")?,
            sq: num("N_Q")?,
            sk: num("N_KV")?,
            d: num("d_h_qk")?,
            dv: num("d_h_v")?,
        })
    })();
    let causal = match field("causal") {
        Some("True") => Some(true),
        Some("False") => Some(false),
        _ => None,
    };
    PerfParams { shape, causal }
}

/// Parses RFC 4180 CSV (quoted fields may hold commas, quotes and newlines).
pub fn parse_csv(text: &str) -> std::result::Result<Vec<Vec<String>>, String> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        any = true;
        if quoted {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    field.push('"');
                    chars.next();
                } else {
                    quoted = false;
                }
            } else {
                field.push(c);
            }
            continue;
        }
        match c {
            '"' if field.is_empty() => quoted = true,
            ',' => row.push(std::mem::take(&mut field)),
            '\r' => {}
            '\n' => {
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
                any = false;
            }
            _ => field.push(c),
        }
    }
    if quoted {
        return Err("unterminated quoted field (truncated CSV?)".into());
    }
    if any {
        row.push(field);
        rows.push(row);
    }
    Ok(rows)
}

/// `((2, 8, 1024, 64), (), (3,))` -> per-entry integer lists (`()` is an empty list).
pub fn parse_py_dims(s: &str) -> Vec<Option<Vec<i64>>> {
    let inner = s.trim().strip_prefix('(').and_then(|x| x.strip_suffix(')')).unwrap_or("");
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut cur = String::new();
    for c in inner.chars() {
        match c {
            '(' | '[' => {
                depth += 1;
                if depth == 1 {
                    cur.clear();
                    continue;
                }
            }
            ')' | ']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    let nums: Vec<Option<i64>> =
                        cur.split(',').map(str::trim).filter(|x| !x.is_empty()).map(|x| x.parse().ok()).collect();
                    out.push(nums.into_iter().collect::<Option<Vec<i64>>>());
                    continue;
                }
            }
            _ => {}
        }
        if depth >= 1 {
            cur.push(c);
        }
    }
    out
}

/// `('c10::BFloat16', '', 'Scalar')` -> the quoted strings, in order.
pub fn parse_py_strs(s: &str) -> Vec<String> {
    parse_py_strs_loose(s)
}

/// Every single- or double-quoted string in `s`, in order (nesting ignored).
fn parse_py_strs_loose(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\'' || c == '"' {
            let mut v = String::new();
            let mut closed = false;
            for d in chars.by_ref() {
                if d == c {
                    closed = true;
                    break;
                }
                v.push(d);
            }
            if closed {
                out.push(v);
            }
        }
    }
    out
}

/// Kernel names and total µs from `kernel_details_summary` (`[{'name': '...', ..., 'total_duration_us':
/// np.float64(26.176), ...}, ...]`).
fn parse_kernel_summary(s: &str) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for part in s.split("{'name': ").skip(1) {
        let name = parse_py_strs_loose(part).into_iter().next().unwrap_or_default();
        let us = part
            .split("'total_duration_us': ")
            .nth(1)
            .map(|t| t.trim_start_matches("np.float64("))
            .and_then(|t| t.split([')', ',']).next())
            .and_then(|t| t.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        if !name.is_empty() {
            out.push((name, us));
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn python_literals_parse() {
        let d = parse_py_dims("((2, 8, 1024, 64), (2, 2, 2048, 64), (), ())");
        assert_eq!(d, vec![Some(vec![2, 8, 1024, 64]), Some(vec![2, 2, 2048, 64]), Some(vec![]), Some(vec![])]);
        assert_eq!(parse_py_dims("((2, 8, 1024, 64),)"), vec![Some(vec![2, 8, 1024, 64])]);
        assert_eq!(parse_py_strs("('', 'True', '0.125')"), vec!["", "True", "0.125"]);
        let csv = parse_csv("a,b\n\"x, \"\"y\"\"\",2\n").unwrap();
        assert_eq!(csv, vec![vec!["a", "b"], vec!["x, \"y\"", "2"]]);
        assert!(parse_csv("a\n\"open").is_err());
        let pp = parse_perf_params(
            "{'B': 2, 'N_Q': 1024, 'H_Q': 8, 'N_KV': 1024, 'H_KV': 8, 'd_h_qk': 64, 'd_h_v': 64, 'causal': True}",
        );
        assert_eq!(pp.shape, Some(sdpa_core::Shape::new(2, 8, 1024, 1024, 64)));
        assert_eq!(pp.causal, Some(true));
    }
}
