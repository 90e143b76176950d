//! Byte mutations of real fixtures for the bounded fuzz tests (`sdpa-core/tests/fuzz_bounded.rs`,
//! `sdpa-analysis/tests/fuzz_bounded.rs`), included by path: byte flips, inserted JSON/CSV tokens, deleted
//! runs, truncations, splices from another seed, numbers made huge or odd, deep nesting and a BOM. The
//! cargo-fuzz targets under `fuzz/` do the same search unbounded and coverage-guided.

use proptest::prelude::*;
use proptest::sample::Index;
use std::path::{Path, PathBuf};

/// One edit of a seed.
#[derive(Debug, Clone)]
pub enum Edit {
    /// Replace one byte.
    Flip(Index, u8),
    /// Insert a token (JSON punctuation, a keyword, a separator).
    Insert(Index, &'static str),
    /// Delete up to this many bytes.
    Delete(Index, u16),
    /// Cut the input here.
    Truncate(Index),
    /// Copy a run of another seed (or this one) in.
    Splice { from: Index, src: Index, len: u16, at: Index },
    /// Replace the number that starts at or after this place with an extreme one.
    Number(Index, &'static str),
    /// Wrap the whole input in this many arrays.
    Nest(u16),
    /// Put a UTF-8 byte order mark in front.
    Bom,
}

const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "\"",
    ",",
    ":",
    "\\",
    "null",
    "true",
    "-",
    "e",
    ".",
    "\n",
    "\r\n",
    "\u{0}",
    "\u{feff}",
    "é",
    "\"traceEvents\"",
    "\"ph\":\"X\"",
    "\"cat\":\"kernel\"",
    "\"dur\"",
    "\"args\"",
    "\"Input Dims\"",
    "[[]]",
    "{}",
    "\"shape\"",
    "\"records\"",
    "\"median\"",
    ",,",
    "'",
    "(",
    ")",
    "\"\"\"",
];

const NUMBERS: &[&str] = &[
    "0",
    "-1",
    "1e308",
    "-1e308",
    "1.7e308",
    "1e-320",
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854775807",
    "4611686018427387904",
    "4294967296",
    "99999999999999999999999999",
    "NaN",
    "Infinity",
    "-0",
    "1e400",
    "0.0000001",
];

/// A strategy for up to `max` edits.
pub fn edits(max: usize) -> impl Strategy<Value = Vec<Edit>> {
    let edit = prop_oneof![
        4 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Flip(i, b)),
        4 => (any::<Index>(), prop::sample::select(TOKENS)).prop_map(|(i, t)| Edit::Insert(i, t)),
        2 => (any::<Index>(), 1u16..64).prop_map(|(i, n)| Edit::Delete(i, n)),
        1 => any::<Index>().prop_map(Edit::Truncate),
        2 => (any::<Index>(), any::<Index>(), 1u16..512, any::<Index>())
            .prop_map(|(from, src, len, at)| Edit::Splice { from, src, len, at }),
        4 => (any::<Index>(), prop::sample::select(NUMBERS)).prop_map(|(i, n)| Edit::Number(i, n)),
        1 => prop_oneof![1u16..200, Just(5000u16)].prop_map(Edit::Nest),
        1 => Just(Edit::Bom),
    ];
    prop::collection::vec(edit, 1..=max)
}

/// Applies `edits` to `seed`; `others` are the seeds a splice may copy from.
pub fn apply(seed: &[u8], others: &[Vec<u8>], edits: &[Edit]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for e in edits {
        let at = |i: &Index, b: &Vec<u8>| i.index(b.len() + 1);
        match e {
            Edit::Flip(i, x) if !b.is_empty() => {
                let k = i.index(b.len());
                b[k] = *x;
            }
            Edit::Flip(..) => {}
            Edit::Insert(i, t) => {
                let k = at(i, &b);
                b.splice(k..k, t.bytes());
            }
            Edit::Delete(i, n) => {
                let k = at(i, &b);
                let end = (k + *n as usize).min(b.len());
                b.drain(k..end);
            }
            Edit::Truncate(i) => {
                let k = at(i, &b);
                b.truncate(k);
            }
            Edit::Splice { from, src, len, at: to } => {
                let pool = if others.is_empty() { &b } else { &others[src.index(others.len())] };
                let start = from.index(pool.len() + 1);
                let run: Vec<u8> = pool[start..(start + *len as usize).min(pool.len())].to_vec();
                let k = at(to, &b);
                b.splice(k..k, run);
            }
            Edit::Number(i, n) => {
                let k = at(i, &b);
                if let Some(s) = b[k..].iter().position(|c| c.is_ascii_digit()).map(|p| p + k) {
                    let end = b[s..]
                        .iter()
                        .position(|c| !(c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E' | b'+' | b'-')))
                        .map_or(b.len(), |p| p + s);
                    b.splice(s..end, n.bytes());
                }
            }
            Edit::Nest(n) => {
                let n = *n as usize;
                let mut out = Vec::with_capacity(b.len() + 2 * n);
                out.resize(n, b'[');
                out.extend_from_slice(&b);
                out.resize(out.len() + n, b']');
                b = out;
            }
            Edit::Bom => {
                b.splice(0..0, "\u{feff}".bytes());
            }
        }
    }
    b
}

/// The committed seeds of one fuzz target (`fuzz/seeds/<target>/`), sorted by name.
pub fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds").join(target);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let p = e.expect("seed entry").path();
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (name, bytes)
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no seeds in {}", dir.display());
    out
}

/// A scratch directory for one test in this process.
pub fn scratch(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sdpa-fuzz-bounded-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
    d
}
