//! Attention variants beyond the mask: sliding windows, logit softcapping and ALiBi position biases.
//!
//! One score, written once (the f64 reference computes exactly this; every kernel that claims a variant
//! computes the same):
//!
//! ```text
//! x(i, j)  = scale · q_i · k_j
//! x'(i, j) = cap · tanh(x / cap)                    softcap (when set), before any bias or mask
//! s(i, j)  = x' − slope_h · |j − diag(i)| + m(i, j)  ALiBi (when set), explicit mask m (when set)
//! key j takes part in row i iff  diag(i) − left ≤ j ≤ diag(i) + right  (window, when set)
//!                           and   j ≤ diag(i)                         (causal masks)
//!                           and   m(i, j) ≠ −inf
//! ```
//!
//! `diag(i)` is the key on query row `i`'s diagonal: `i` when the diagonal is aligned top-left (PyTorch's
//! `is_causal`), `i + Sk − Sq` when aligned bottom-right (FlashAttention's convention for everything:
//! causal, `window_size` and `alibi_slopes`). The alignment is always named, never guessed: a causal mask
//! names it (`causal` is top-left, `causal-br` bottom-right), otherwise the spec's [`Variants::diagonal`]
//! must. Mapping onto FlashAttention: `window_size = (left, right)` with `-1` for unbounded is our
//! `Window { left, right }` on the bottom-right diagonal; its `causal=True` is our `causal-br` (equivalently
//! a window `(unbounded, 0)`); its `softcap` is our cap; its `alibi_slopes` with the documented bias
//! `−slope · |i + Sk − Sq − j|` is our ALiBi on the bottom-right diagonal. (FlashAttention's causal kernels
//! add `slope · j` instead, which differs from the documented bias by a constant per row: the same output, an
//! LSE shifted by `slope · diag(i)`. Ours follows the documented formula in both the output and the LSE.)
//!
//! A row that no key reaches gives zeros and LSE `−inf`, as for every mask.

use crate::error::{Result, SdpaError};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::Range;
use std::str::FromStr;

/// Where query row `i`'s diagonal key lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Diagonal {
    /// `diag(i) = i` (PyTorch's `is_causal=True`).
    TopLeft,
    /// `diag(i) = i + Sk − Sq` (FlashAttention; the last query row sees the last key).
    BottomRight,
}

impl Diagonal {
    /// `diag(i) − i` for a call with these lengths.
    pub fn offset(self, sq: usize, sk: usize) -> i128 {
        match self {
            Diagonal::TopLeft => 0,
            Diagonal::BottomRight => sk as i128 - sq as i128,
        }
    }

    /// Short name: `tl` or `br`.
    pub fn name(self) -> &'static str {
        match self {
            Diagonal::TopLeft => "tl",
            Diagonal::BottomRight => "br",
        }
    }
}

impl FromStr for Diagonal {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tl" | "top-left" | "topleft" => Ok(Diagonal::TopLeft),
            "br" | "bottom-right" | "bottomright" => Ok(Diagonal::BottomRight),
            other => Err(format!("unknown diagonal `{other}` (expected tl (top-left) or br (bottom-right))")),
        }
    }
}

/// A sliding window around the diagonal: keys `diag(i) − left ..= diag(i) + right`; `None` is unbounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Window {
    /// Keys before the diagonal (`None`: all of them).
    pub left: Option<usize>,
    /// Keys after the diagonal (`None`: all of them).
    pub right: Option<usize>,
}

impl Window {
    /// Mistral-style local attention: `left` keys back, none ahead (used with a causal mask or alone).
    pub fn left(left: usize) -> Self {
        Window { left: Some(left), right: Some(0) }
    }
}

impl fmt::Display for Window {
    /// `L,R` with `-1` for an unbounded side (FlashAttention's `window_size` convention), so it reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = |x: Option<usize>| x.map_or("-1".to_string(), |v| v.to_string());
        write!(f, "{},{}", side(self.left), side(self.right))
    }
}

impl FromStr for Window {
    type Err = String;
    /// Parses `L,R`; `-1`, `inf` or an empty side is unbounded.
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        if parts.len() != 2 {
            return Err(format!("window `{s}` must be L,R (keys before and after the diagonal; -1 = unbounded)"));
        }
        let side = |p: &str| -> std::result::Result<Option<usize>, String> {
            match p {
                "" | "-1" | "inf" => Ok(None),
                _ => p.parse().map(Some).map_err(|_| format!("window `{s}`: `{p}` is not a count of keys or -1")),
            }
        };
        Ok(Window { left: side(parts[0])?, right: side(parts[1])? })
    }
}

/// ALiBi slopes, one per query head.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Alibi {
    /// The slopes of the ALiBi paper (BLOOM, MPT): [`standard_alibi_slopes`].
    Standard,
    /// Given slopes, one per query head (f32, as kernels use them).
    Slopes(Vec<f32>),
}

impl Alibi {
    /// The slope of every query head, as f32 (what the kernels read and the reference widens).
    pub fn slopes(&self, hq: usize) -> Result<Vec<f32>> {
        match self {
            Alibi::Standard => Ok(standard_alibi_slopes(hq).into_iter().map(|x| x as f32).collect()),
            Alibi::Slopes(s) => {
                if s.len() != hq {
                    return Err(SdpaError::invalid(format!(
                        "{} ALiBi slopes given for Hq = {hq} query heads (one per query head)",
                        s.len()
                    )));
                }
                if let Some((h, x)) = s.iter().enumerate().find(|(_, x)| !x.is_finite()) {
                    return Err(SdpaError::invalid(format!("ALiBi slope of head {h} is {x}, not finite")));
                }
                Ok(s.clone())
            }
        }
    }

    /// `standard` or `slopes`, for labels.
    pub fn name(&self) -> &'static str {
        match self {
            Alibi::Standard => "standard",
            Alibi::Slopes(_) => "slopes",
        }
    }
}

/// The ALiBi paper's slopes for `h` heads (Press et al., 2022, and BLOOM's `build_alibi_tensor`): for a power
/// of two `n`, head `k` (0-based) gets `2^(−8(k+1)/n)`; otherwise the `p` slopes of the largest power of two
/// `p < h` come first, then every other slope of `2p` (the 1st, 3rd, ...) until there are `h`.
pub fn standard_alibi_slopes(h: usize) -> Vec<f64> {
    fn power_of_two(n: usize) -> Vec<f64> {
        (0..n).map(|k| (-8.0 * (k as f64 + 1.0) / n as f64).exp2()).collect()
    }
    if h == 0 {
        return Vec::new();
    }
    if h.is_power_of_two() {
        return power_of_two(h);
    }
    let p = 1usize << (usize::BITS - 1 - h.leading_zeros()); // largest power of two below h
    let mut s = power_of_two(p);
    s.extend(power_of_two(2 * p).into_iter().step_by(2).take(h - p));
    s
}

/// The variants of one call. All default to off; any combination is allowed. Unknown keys are refused, so a
/// misspelt `"windw"` in a spec file is an error, not plain attention.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variants {
    /// Sliding window around the diagonal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<Window>,
    /// Logit softcap `cap > 0`: the scaled score becomes `cap · tanh(score / cap)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub softcap: Option<f64>,
    /// ALiBi position bias `−slope_h · |j − diag(i)|`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alibi: Option<Alibi>,
    /// The diagonal windows and ALiBi measure from, when no causal mask names it. With a causal mask it
    /// may be omitted or must agree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagonal: Option<Diagonal>,
}

/// One variant, for capability lists and refusals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Variant {
    /// A sliding window.
    Window,
    /// A logit softcap.
    Softcap,
    /// ALiBi biases.
    Alibi,
}

impl Variant {
    /// Every variant.
    pub const ALL: [Variant; 3] = [Variant::Window, Variant::Softcap, Variant::Alibi];

    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Window => "window",
            Variant::Softcap => "softcap",
            Variant::Alibi => "alibi",
        }
    }
}

impl Variants {
    /// True when no variant is set (plain attention).
    pub fn is_plain(&self) -> bool {
        self.window.is_none() && self.softcap.is_none() && self.alibi.is_none()
    }

    /// The variants in use.
    pub fn kinds(&self) -> Vec<Variant> {
        let mut v = Vec::new();
        if self.window.is_some() {
            v.push(Variant::Window);
        }
        if self.softcap.is_some() {
            v.push(Variant::Softcap);
        }
        if self.alibi.is_some() {
            v.push(Variant::Alibi);
        }
        v
    }

    /// `window 4096,0 br · softcap 50 · alibi standard`, or empty for plain attention: how the CLI, the
    /// records' readers and reports name a call's variants.
    pub fn label(&self, diagonal: Option<Diagonal>) -> String {
        let mut parts = Vec::new();
        let diag = diagonal.map(|d| format!(" {}", d.name())).unwrap_or_default();
        if let Some(w) = self.window {
            parts.push(format!("window {w}{diag}"));
        }
        if let Some(c) = self.softcap {
            parts.push(format!("softcap {c}"));
        }
        if let Some(a) = &self.alibi {
            let d = if self.window.is_some() { String::new() } else { diag };
            parts.push(format!("alibi {}{d}", a.name()));
        }
        parts.join(" · ")
    }

    /// Checks the values (the diagonal is checked by the spec, which knows the mask).
    pub fn validate(&self, hq: usize) -> Result<()> {
        if let Some(c) = self.softcap {
            if !(c.is_finite() && c > 0.0) {
                return Err(SdpaError::invalid(format!("softcap {c} must be finite and > 0")));
            }
        }
        if let Some(a) = &self.alibi {
            a.slopes(hq)?;
        }
        Ok(())
    }
}

/// The positional band of a call: query row `i` may see key `j` iff `i + lo ≤ j ≤ i + hi` (a `None` side is
/// unbounded). Causal masks and windows both reduce to it; explicit masks are applied on top.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct KeyBand {
    /// Lowest visible key minus `i`.
    pub lo: Option<i128>,
    /// Highest visible key minus `i`.
    pub hi: Option<i128>,
}

impl KeyBand {
    /// The whole key range.
    pub const ALL: KeyBand = KeyBand { lo: None, hi: None };

    /// True when the band restricts nothing.
    pub fn is_all(&self) -> bool {
        self.lo.is_none() && self.hi.is_none()
    }

    /// Keys query row `i` may see, clamped to `0..sk` (empty when none).
    #[inline]
    pub fn range(&self, i: usize, sk: usize) -> Range<usize> {
        let i = i as i128;
        let sk_i = sk as i128;
        let lo = self.lo.map_or(0, |lo| (i + lo).clamp(0, sk_i)) as usize;
        let hi = self.hi.map_or(sk_i, |hi| (i + hi + 1).clamp(0, sk_i)) as usize;
        lo..hi.max(lo)
    }

    /// The bounds as `i64`, clamped to what can matter for rows `0..sq` and keys `0..sk` (so kernels can take
    /// them as plain integers): `lo` in `[−sq, sk]`, `hi` in `[−sq − 1, sk]`; unbounded sides become the
    /// clamp's ends, which restrict nothing.
    pub fn clamped(&self, sq: usize, sk: usize) -> (i64, i64) {
        let (sq, sk) = (sq as i128, sk as i128);
        let lo = self.lo.unwrap_or(-sq).clamp(-sq, sk);
        let hi = self.hi.unwrap_or(sk).clamp(-sq - 1, sk);
        (lo as i64, hi as i64)
    }

    /// Exact number of visible (query, key) pairs over rows `0..sq`, in closed form (no loop over rows).
    pub fn pairs(&self, sq: usize, sk: usize) -> u128 {
        // Row i sees B(i) − A(i) keys, A(i) = clamp(i + lo, 0, sk), B(i) = clamp(i + hi + 1, 0, sk); with
        // hi < lo the band is empty. Each clamp is linear in i except where it starts (i = −c) or stops
        // (i = sk − c) moving, so the count is linear between those four cuts: sum each piece as an
        // arithmetic series (exact in integers, no loop over rows).
        let (lo, hi) = self.clamped(sq, sk);
        let (sq, sk) = (sq as i128, sk as i128);
        let (lo, hi) = (lo as i128, hi as i128);
        if hi < lo || sq == 0 || sk == 0 {
            return 0;
        }
        let count = |i: i128| (i + hi + 1).clamp(0, sk) - (i + lo).clamp(0, sk);
        let mut cuts = vec![0, sq, -lo, sk - lo, -hi - 1, sk - hi - 1];
        cuts.retain(|&c| (0..=sq).contains(&c));
        cuts.sort_unstable();
        cuts.dedup();
        let mut total: i128 = 0;
        for w in cuts.windows(2) {
            let (a, b) = (w[0], w[1]);
            total = total.saturating_add((count(a) + count(b - 1)).saturating_mul(b - a) / 2);
        }
        total as u128
    }
}
