//! `sdpa cache`: where the compiled-kernel cache lives, what it holds and its bound; `--clear` empties it.
//!
//! The cache itself is `sdpa_cuda::cache`; this module only prints it.

use anyhow::{Context, Result};
use sdpa_core::memory::human_bytes;
use sdpa_cuda::cache::{self, BoundSource, CacheUsage};
use serde::Serialize;

/// Flags of `sdpa cache`.
#[derive(Debug, clap::Args)]
pub struct CacheArgs {
    /// Remove the cached kernel images and temporary files; other files in the directory stay.
    #[arg(long)]
    clear: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// `sdpa cache` as plain data.
#[derive(Debug, Serialize)]
struct Usage {
    /// The directory, `null` when disabled or no home is known.
    dir: Option<String>,
    disabled: bool,
    files: usize,
    bytes: u64,
    bound_bytes: u64,
    bound_source: Source,
    /// `SDPA_CUDA_CACHE_MAX` as given, when set.
    bound_value: Option<String>,
    /// Why the directory could not be listed.
    error: Option<String>,
}

/// Where the bound came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Source {
    /// `SDPA_CUDA_CACHE_MAX` unset or empty.
    Default,
    /// `SDPA_CUDA_CACHE_MAX`.
    Env,
    /// `SDPA_CUDA_CACHE_MAX` did not parse; the default applies.
    Invalid,
}

/// `sdpa cache --clear` as plain data.
#[derive(Debug, Serialize)]
struct Cleared {
    dir: Option<String>,
    disabled: bool,
    removed_files: usize,
    removed_bytes: u64,
}

pub fn run(args: CacheArgs) -> Result<()> {
    let usage = cache::usage();
    let dir = usage.dir.as_ref().map(|d| d.display().to_string());
    if args.clear {
        let (removed_files, removed_bytes) = cache::clear().context("clearing the kernel cache")?;
        let c = Cleared { dir, disabled: usage.disabled, removed_files, removed_bytes };
        if args.json {
            println!("{}", serde_json::to_string_pretty(&c)?);
        } else {
            print_cleared(&c);
        }
        return Ok(());
    }
    let u = to_plain(&usage, dir);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&u)?);
    } else {
        print_usage(&u);
    }
    Ok(())
}

fn to_plain(usage: &CacheUsage, dir: Option<String>) -> Usage {
    let (bound_source, bound_value) = match &usage.bound.source {
        BoundSource::Default => (Source::Default, None),
        BoundSource::Env(v) => (Source::Env, Some(v.clone())),
        BoundSource::Invalid(v) => (Source::Invalid, Some(v.clone())),
    };
    Usage {
        dir,
        disabled: usage.disabled,
        files: usage.files,
        bytes: usage.bytes,
        bound_bytes: usage.bound.bytes,
        bound_source,
        bound_value,
        error: usage.error.clone(),
    }
}

fn print_usage(u: &Usage) {
    match (&u.dir, u.disabled) {
        (_, true) => println!("cache: disabled (SDPA_CUDA_CACHE=off)"),
        (Some(d), false) => println!("cache: {d}"),
        (None, false) => println!("cache: no directory (set SDPA_CUDA_CACHE, XDG_CACHE_HOME or HOME)"),
    }
    if let Some(e) = &u.error {
        println!("files: unknown ({e})");
    } else if !u.disabled && u.dir.is_some() {
        println!("files: {} ({})", u.files, human_bytes(u.bytes));
    }
    let from = match (u.bound_source, &u.bound_value) {
        (Source::Env, Some(v)) => format!("SDPA_CUDA_CACHE_MAX={v}"),
        (Source::Invalid, Some(v)) => format!("default; SDPA_CUDA_CACHE_MAX={v:?} does not parse, so it is ignored"),
        _ => "default; set SDPA_CUDA_CACHE_MAX to change it".to_string(),
    };
    println!("bound: {} ({from})", human_bytes(u.bound_bytes));
}

fn print_cleared(c: &Cleared) {
    match (&c.dir, c.disabled) {
        (_, true) => println!("cache: disabled (SDPA_CUDA_CACHE=off); nothing to clear"),
        (Some(d), false) => println!("removed {} files ({}) from {d}", c.removed_files, human_bytes(c.removed_bytes)),
        (None, false) => println!("cache: no directory; nothing to clear"),
    }
}
