//! The variant flags `sdpa run` and `sdpa bench` share (`--window`, `--softcap`, `--alibi`,
//! `--alibi-slopes`, `--diagonal`), turned into one [`Variants`], and the alignment rule both commands
//! apply before anything runs: a window or ALiBi measures from a diagonal that a causal mask or
//! `--diagonal` names, never one that is guessed.

use anyhow::{bail, Context, Result};
use sdpa_core::{Alibi, Diagonal, Mask, Variants, Window};
use std::path::{Path, PathBuf};

/// Most ALiBi slopes a file may hold (one per query head; far above any model's head count).
const MAX_SLOPES: usize = 1 << 16;

/// Variant flags (all off: plain attention).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct VariantArgs {
    /// Sliding window L,R: keys before and after the query's diagonal, -1 unbounded (FlashAttention's
    /// window_size), e.g. 4096,0 for Mistral-style local attention.
    #[arg(long, value_name = "L,R", allow_hyphen_values = true)]
    window: Option<Window>,
    /// Logit softcap C > 0: each scaled score s becomes C·tanh(s/C) before bias, mask and softmax (Gemma 2: 50).
    #[arg(long, value_name = "C", allow_hyphen_values = true)]
    softcap: Option<f64>,
    /// ALiBi with the standard slopes 2^(-8(h+1)/H) of BLOOM and MPT: bias -slope_h·|j - diag(i)|.
    #[arg(long, conflicts_with = "alibi_slopes")]
    alibi: bool,
    /// ALiBi with given slopes: a file of one float per query head, separated by whitespace or commas.
    #[arg(long, value_name = "FILE")]
    alibi_slopes: Option<PathBuf>,
    /// The diagonal windows and ALiBi measure from: tl (top-left, diag(i) = i, PyTorch's is_causal) or br
    /// (bottom-right, diag(i) = i + Sk - Sq, FlashAttention's). Needed with --window or ALiBi unless the mask
    /// is causal (which names it; --diagonal must then agree).
    #[arg(long, value_name = "tl|br")]
    diagonal: Option<Diagonal>,
}

impl VariantArgs {
    /// The variants the flags ask for; `None` when no variant flag was given.
    pub fn variants(&self) -> Result<Option<Variants>> {
        if let Some(w) = self.window.filter(|w| w.left.is_none() && w.right.is_none()) {
            // Not an error in the semantics (it restricts nothing), but surely not what was meant.
            bail!("--window {w} is unbounded on both sides: that is no window (give at least one side, e.g. 4096,0)");
        }
        if let Some(c) = self.softcap {
            if !(c.is_finite() && c > 0.0) {
                bail!("--softcap must be a finite number above 0 (Gemma 2 uses 50), got {c}");
            }
        }
        let alibi = match (&self.alibi_slopes, self.alibi) {
            (Some(path), _) => Some(Alibi::Slopes(read_slopes(path)?)),
            (None, true) => Some(Alibi::Standard),
            (None, false) => None,
        };
        let v = Variants { window: self.window, softcap: self.softcap, alibi, diagonal: self.diagonal };
        if v.is_plain() {
            if let Some(d) = self.diagonal {
                bail!(
                    "--diagonal {} names where a window or ALiBi measures from: give --window, --alibi or \
                     --alibi-slopes with it",
                    d.name()
                );
            }
            return Ok(None);
        }
        Ok(Some(v))
    }
}

/// Reads `--alibi-slopes FILE`: finite floats separated by whitespace or commas (the count is checked
/// against Hq with the shape).
pub fn read_slopes(path: &Path) -> Result<Vec<f32>> {
    use std::io::Read;
    // Bounded, so a wrong path (a device, a huge file) fails at once instead of filling memory.
    const MAX_BYTES: u64 = 4 << 20;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_BYTES + 1).read_to_string(&mut text))
        .with_context(|| format!("cannot read ALiBi slopes {}", path.display()))?;
    if text.len() as u64 > MAX_BYTES {
        bail!(
            "ALiBi slopes {}: larger than {} MiB (expected one float per query head)",
            path.display(),
            MAX_BYTES >> 20
        );
    }
    parse_slopes(&text).with_context(|| format!("ALiBi slopes {}", path.display()))
}

/// See [`read_slopes`].
pub fn parse_slopes(text: &str) -> Result<Vec<f32>> {
    let mut out = Vec::new();
    for (n, tok) in text.split(|c: char| c == ',' || c.is_whitespace()).filter(|t| !t.is_empty()).enumerate() {
        if out.len() == MAX_SLOPES {
            bail!("more than {MAX_SLOPES} slopes (one per query head is needed)");
        }
        let x: f32 = tok.parse().map_err(|_| anyhow::anyhow!("slope {} `{tok}` is not a number", n + 1))?;
        if !x.is_finite() {
            bail!("slope {} is {x}, not finite", n + 1);
        }
        out.push(x);
    }
    if out.is_empty() {
        bail!("no slopes (expected one float per query head, separated by whitespace or commas)");
    }
    Ok(out)
}

/// Refuses, with words about the flags, a window or ALiBi whose diagonal is not named (the mask is not
/// causal and no diagonal is given) and a diagonal that contradicts the causal mask's. `what` names where
/// the variants came from ("--window/--alibi", "the variants").
pub fn check_alignment(mask: &Mask, v: &Variants, what: &str) -> Result<()> {
    let measures = v.window.is_some() || v.alibi.is_some();
    match (mask.diagonal(), v.diagonal) {
        (Some(m), Some(d)) if m != d => bail!(
            "{what}: the diagonal {} contradicts the mask `{}`, which aligns it {}: leave the diagonal out or use \
             the mask `{}`",
            d.name(),
            mask.name(),
            m.name(),
            if d == Diagonal::TopLeft { "causal" } else { "causal-br" }
        ),
        (None, None) if measures => bail!(
            "{what}: a window or ALiBi measures from the query's diagonal, and the mask `{}` names none: give \
             --diagonal tl (top-left, diag(i) = i) or br (bottom-right, diag(i) = i + Sk - Sq, FlashAttention's), \
             or a causal mask",
            mask.name()
        ),
        _ => Ok(()),
    }
}

/// `window 4096,0 tl · softcap 50` for a call with this mask, or empty for plain attention.
pub fn label(mask: &Mask, v: &Variants) -> String {
    v.label(mask.diagonal().or(v.diagonal))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slopes_read_with_whitespace_or_commas_and_refuse_junk() {
        assert_eq!(parse_slopes("0.5, 0.25\n0.125\t0.0625\n").unwrap(), vec![0.5, 0.25, 0.125, 0.0625]);
        assert_eq!(parse_slopes("1e-2,,2").unwrap(), vec![0.01, 2.0]);
        for (bad, want) in [("", "no slopes"), ("0.5 x", "slope 2 `x`"), ("inf", "not finite"), ("1e39", "not finite")]
        {
            let err = format!("{:#}", parse_slopes(bad).unwrap_err());
            assert!(err.contains(want), "{bad}: {err}");
        }
    }

    #[test]
    fn the_diagonal_is_named_once() {
        let win = Variants { window: Some(Window::left(16)), ..Default::default() };
        assert!(check_alignment(&Mask::CausalTopLeft, &win, "x").is_ok());
        let err = check_alignment(&Mask::None, &win, "--window").unwrap_err().to_string();
        assert!(err.contains("--diagonal tl") && err.contains("`none`"), "{err}");
        let br = Variants { diagonal: Some(Diagonal::BottomRight), ..win.clone() };
        assert!(check_alignment(&Mask::None, &br, "x").is_ok());
        assert!(check_alignment(&Mask::CausalBottomRight, &br, "x").is_ok());
        let err = check_alignment(&Mask::CausalTopLeft, &br, "x").unwrap_err().to_string();
        assert!(err.contains("contradicts") && err.contains("causal-br"), "{err}");
        // A softcap alone needs no diagonal.
        let cap = Variants { softcap: Some(30.0), ..Default::default() };
        assert!(check_alignment(&Mask::None, &cap, "x").is_ok());
        assert_eq!(label(&Mask::CausalBottomRight, &win), "window 16,0 br");
        assert_eq!(label(&Mask::None, &Variants::default()), "");
    }
}
