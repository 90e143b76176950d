//! On-disk cache of compiled kernel images, so a second run does not compile again.
//!
//! Location: `SDPA_CUDA_CACHE`, else `$XDG_CACHE_HOME/sdpa-cuda`, else `~/.cache/sdpa-cuda`;
//! `SDPA_CUDA_CACHE=off` (or `0`) disables it ([`dir`]). Files: `{label}-{key}.cubin`, where the label names
//! what was compiled (a plain, file-name-safe string such as `fa2_bf16_128_causal`) and the key ([`key`]) is
//! a 128-bit FNV-1a hash of the source, every registered header, the architecture, the full option list, the
//! NVRTC version and the driver version, as 32 hex digits.
//!
//! Bound: `SDPA_CUDA_CACHE_MAX` bytes, an integer with an optional binary suffix (`K`, `M`, `G`, `T`, also
//! written `KiB`, `MB`, ...: `512M`, `2G`); unset or empty means 1 GiB; a value that does not parse also means
//! 1 GiB, and [`usage`] reports it ([`BoundSource::Invalid`]). After [`store`] writes a file it lists the
//! directory once: when the cache's images together exceed the bound it deletes the least recently used (oldest
//! modification time) until they fit, never the file it just wrote, and it deletes temporary files older than an
//! hour (left by a process that died mid-write). A [`load`] hit sets the file's modification time to now, so
//! use counts as recency, not only creation.
//!
//! Clearing: [`clear`] removes the images and temporary files the cache writes (names of the forms above, a
//! 32-hex-digit key included) and nothing else; the directory itself goes only when that leaves it empty.
//! [`usage`] says where the cache is, what it holds and its bound; `sdpa cache [--clear]` prints both.
//!
//! Concurrency: any number of processes may share the directory. Files are written to a temporary name and
//! renamed, so no reader sees a half-written image. Evictions that race each other at worst delete a little
//! more than needed; a file that vanishes between the listing and its deletion is skipped; a [`load`] that
//! races an eviction misses and the kernel is compiled again. Cache failures are never errors: a missing,
//! full or unwritable cache only means compiling again.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The bound when `SDPA_CUDA_CACHE_MAX` is unset, empty or does not parse: 1 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

/// Temporary files older than this belong to a process that died mid-write; a live write takes well under it.
const STALE_TMP_AGE: Duration = Duration::from_secs(3600);

/// The cache's size bound and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    /// Most bytes the cached images may occupy together, after a store's eviction.
    pub bytes: u64,
    /// Where `bytes` came from.
    pub source: BoundSource,
}

/// Where the bound came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BoundSource {
    /// `SDPA_CUDA_CACHE_MAX` unset or empty: [`DEFAULT_MAX_BYTES`].
    Default,
    /// `SDPA_CUDA_CACHE_MAX`, parsed; the value as given.
    Env(String),
    /// `SDPA_CUDA_CACHE_MAX` did not parse, so [`DEFAULT_MAX_BYTES`] applies; the value as given.
    Invalid(String),
}

/// What the cache holds now ([`usage`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheUsage {
    /// The cache directory; `None` when disabled or when no home is known.
    pub dir: Option<PathBuf>,
    /// `SDPA_CUDA_CACHE` is `off` or `0`.
    pub disabled: bool,
    /// Cached images (`*.cubin` files the cache wrote), temporary files not counted.
    pub files: usize,
    /// Their total size, in bytes.
    pub bytes: u64,
    /// The size bound [`store`] keeps.
    pub bound: Bound,
    /// Why the directory could not be listed (then `files` and `bytes` are 0). A directory that does not exist
    /// yet is an empty cache, not an error.
    pub error: Option<String>,
}

/// `SDPA_CUDA_CACHE` turns the cache off.
fn disabled_by_env() -> bool {
    std::env::var_os("SDPA_CUDA_CACHE").is_some_and(|v| v == "off" || v == "0")
}

/// The cache directory, or `None` when disabled or no home is known.
pub fn dir() -> Option<PathBuf> {
    if disabled_by_env() {
        return None;
    }
    match std::env::var_os("SDPA_CUDA_CACHE") {
        Some(v) if !v.is_empty() => return Some(PathBuf::from(v)),
        _ => {}
    }
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(x).join("sdpa-cuda"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("sdpa-cuda"))
}

/// Stable 128-bit FNV-1a over the parts, each length-prefixed so that boundaries count.
pub fn key(parts: &[&[u8]]) -> String {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut a: u64 = 0xcbf2_9ce4_8422_2325;
    let mut b: u64 = 0x6c62_272e_07bb_0142;
    let mut feed = |bytes: &[u8]| {
        for &x in bytes {
            a = (a ^ x as u64).wrapping_mul(PRIME);
            b = (b ^ (x as u64).rotate_left(3)).wrapping_mul(PRIME);
        }
    };
    for p in parts {
        feed(&(p.len() as u64).to_le_bytes());
        feed(p);
    }
    format!("{a:016x}{b:016x}")
}

/// Reads a cached image.
pub fn load(module: &str, key: &str) -> Option<Vec<u8>> {
    load_in(&dir()?, module, key)
}

/// Stores an image; errors are ignored on purpose (see the module docs).
pub fn store(module: &str, key: &str, image: &[u8]) {
    let Some(d) = dir() else { return };
    store_in(&d, module, key, image, bound().bytes);
}

/// The bound from `SDPA_CUDA_CACHE_MAX` (see the module docs).
pub fn bound() -> Bound {
    bound_from(std::env::var_os("SDPA_CUDA_CACHE_MAX").as_deref())
}

/// What the cache holds, where it is and its bound; never fails (an unlistable directory is in `error`).
pub fn usage() -> CacheUsage {
    let dir = dir();
    let (files, bytes, error) = match &dir {
        Some(d) => match usage_in(d) {
            Ok((files, bytes)) => (files, bytes, None),
            Err(e) => (0, 0, Some(format!("listing {}: {e}", d.display()))),
        },
        None => (0, 0, None),
    };
    CacheUsage { dir, disabled: disabled_by_env(), files, bytes, bound: bound(), error }
}

/// Removes every cached image and temporary file (other files stay; the directory goes only if that empties it)
/// and returns how many files and bytes went. A disabled or absent cache removes nothing.
pub fn clear() -> io::Result<(usize, u64)> {
    match dir() {
        Some(d) => clear_in(&d),
        None => Ok((0, 0)),
    }
}

/// Parses a bound: an integer number of bytes with an optional binary suffix (`K`, `M`, `G`, `T`, each also as
/// `KB`/`KiB` and so on, any case; a plain `B` too). `None` for anything else, or a value beyond `u64`.
pub fn parse_bound(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, suffix) = s.split_at(digits);
    let n: u64 = number.parse().ok()?;
    let shift = match suffix.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

/// The bound for a given `SDPA_CUDA_CACHE_MAX` value.
fn bound_from(value: Option<&OsStr>) -> Bound {
    let Some(v) = value.filter(|v| !v.is_empty()) else {
        return Bound { bytes: DEFAULT_MAX_BYTES, source: BoundSource::Default };
    };
    let text = v.to_string_lossy().into_owned();
    match v.to_str().and_then(parse_bound) {
        Some(bytes) => Bound { bytes, source: BoundSource::Env(text) },
        None => Bound { bytes: DEFAULT_MAX_BYTES, source: BoundSource::Invalid(text) },
    }
}

/// The file name of an image.
fn image_name(module: &str, key: &str) -> String {
    format!("{module}-{key}.cubin")
}

/// `{label}-{32 hex digits}`: the stem of every name the cache writes.
fn is_cache_stem(stem: &str) -> bool {
    stem.rsplit_once('-')
        .is_some_and(|(label, key)| !label.is_empty() && key.len() == 32 && key.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// What a directory entry is to the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Image,
    Temp,
}

/// `{label}-{key}.cubin` is an image, `.{label}-{key}.{digits}.tmp` (process id and sequence number) a
/// temporary file; anything else is not ours.
fn kind_of(name: &OsStr) -> Option<Kind> {
    let name = name.to_str()?;
    if let Some(stem) = name.strip_suffix(".cubin") {
        return (!stem.starts_with('.') && is_cache_stem(stem)).then_some(Kind::Image);
    }
    let (stem, pid) = name.strip_prefix('.')?.strip_suffix(".tmp")?.rsplit_once('.')?;
    (!pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) && is_cache_stem(stem)).then_some(Kind::Temp)
}

/// Deletes the image of `module` under `key` (one the driver refused to load: it is compiled again).
pub fn remove(module: &str, key: &str) {
    if let Some(d) = dir() {
        let _ = std::fs::remove_file(d.join(image_name(module, key)));
    }
}

/// [`load`] in a given directory.
fn load_in(dir: &Path, module: &str, key: &str) -> Option<Vec<u8>> {
    let mut file = File::open(dir.join(image_name(module, key))).ok()?;
    let mut image = Vec::new();
    file.read_to_end(&mut image).ok()?;
    if image.is_empty() {
        return None;
    }
    // A hit makes the image recent, so eviction takes images that are not used rather than old ones that are.
    // A file system that refuses only costs that ordering.
    let _ = file.set_modified(SystemTime::now());
    Some(image)
}

/// [`store`] in a given directory under a given bound.
fn store_in(dir: &Path, module: &str, key: &str, image: &[u8], bound: u64) {
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let name = image_name(module, key);
    // The process id and a sequence number: unique across processes and across this process's threads and
    // devices, which may store the same image at once (a shared name would let one truncate what the other
    // is renaming). Six digits for the sequence keep `pid || sequence` unambiguous.
    static SEQUENCE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 1_000_000;
    let tmp = dir.join(format!(".{module}-{key}.{}{n:06}.tmp", std::process::id()));
    if std::fs::write(&tmp, image).is_ok() {
        if std::fs::rename(&tmp, dir.join(&name)).is_ok() {
            sweep(dir, bound, Some(OsStr::new(&name)), SystemTime::now());
        } else {
            let _ = std::fs::remove_file(&tmp);
        }
    } else {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// One listing of `dir`: deletes temporary files older than [`STALE_TMP_AGE`] at `now`, then the least recently
/// modified images until the rest total at most `bound` bytes, never `keep`. Every error is skipped: another
/// process may be sweeping or clearing the same directory.
fn sweep(dir: &Path, bound: u64, keep: Option<&OsStr>, now: SystemTime) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut images: Vec<(SystemTime, OsString, u64)> = Vec::new();
    let mut total: u64 = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(kind) = kind_of(&name) else { continue };
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        // A file system without modification times makes everything equally old: the order falls to the name.
        let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        match kind {
            Kind::Temp => {
                if now.duration_since(modified).is_ok_and(|age| age > STALE_TMP_AGE) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
            Kind::Image => {
                total = total.saturating_add(meta.len());
                images.push((modified, name, meta.len()));
            }
        }
    }
    if total <= bound {
        return;
    }
    images.sort();
    for (_, name, len) in images {
        if total <= bound {
            break;
        }
        if Some(name.as_os_str()) == keep {
            continue;
        }
        match std::fs::remove_file(dir.join(&name)) {
            Ok(()) => total = total.saturating_sub(len),
            // Another process evicted or cleared it first: it is gone all the same.
            Err(e) if e.kind() == io::ErrorKind::NotFound => total = total.saturating_sub(len),
            Err(_) => {}
        }
    }
}

/// Images in `dir` and their bytes; a directory that does not exist is empty.
fn usage_in(dir: &Path) -> io::Result<(usize, u64)> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((0, 0)),
        Err(e) => return Err(e),
    };
    let mut files = 0;
    let mut bytes: u64 = 0;
    for entry in entries.flatten() {
        if kind_of(&entry.file_name()) != Some(Kind::Image) {
            continue;
        }
        // Vanished since the listing: evicted by another process, no longer part of the cache.
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_file() {
            files += 1;
            bytes = bytes.saturating_add(meta.len());
        }
    }
    Ok((files, bytes))
}

/// [`clear`] in a given directory.
fn clear_in(dir: &Path) -> io::Result<(usize, u64)> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((0, 0)),
        Err(e) => return Err(io::Error::new(e.kind(), format!("listing {}: {e}", dir.display()))),
    };
    let mut files = 0;
    let mut bytes: u64 = 0;
    for entry in entries {
        let entry = entry.map_err(|e| io::Error::new(e.kind(), format!("listing {}: {e}", dir.display())))?;
        if kind_of(&entry.file_name()).is_none() {
            continue;
        }
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        let path = entry.path();
        match std::fs::remove_file(&path) {
            Ok(()) => {
                files += 1;
                bytes = bytes.saturating_add(meta.len());
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io::Error::new(e.kind(), format!("removing {}: {e}", path.display()))),
        }
    }
    // Fails, as it should, when the directory holds anything else (or a store has just begun a new file).
    let _ = std::fs::remove_dir(dir);
    Ok((files, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An empty directory of its own per test: tests run in parallel threads.
    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sdpa-cuda-cache-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    }

    const K: &str = "0123456789abcdef0123456789abcdef";

    /// Writes `name` with `len` bytes, modified `age_s` seconds ago.
    fn put(dir: &Path, name: &str, len: usize, age_s: u64) {
        let path = dir.join(name);
        std::fs::write(&path, vec![7u8; len]).expect("write");
        let when = SystemTime::now() - Duration::from_secs(age_s);
        File::options().write(true).open(&path).expect("open").set_modified(when).expect("set mtime");
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn key_depends_on_every_part_and_on_boundaries() {
        let k = key(&[b"src", b"sm_90"]);
        assert_eq!(k, key(&[b"src", b"sm_90"]));
        assert_ne!(k, key(&[b"src", b"sm_80"]));
        assert_ne!(k, key(&[b"sr", b"csm_90"]));
        assert_eq!(k.len(), 32);
    }

    #[test]
    fn names_the_cache_writes_are_recognised_and_others_are_not() {
        assert!(is_cache_stem(&format!("fa2_bf16_128_causal-{}", key(&[b"x"]))));
        assert_eq!(kind_of(OsStr::new(&format!("fa2_bf16_128_causal-{K}.cubin"))), Some(Kind::Image));
        assert_eq!(kind_of(OsStr::new(&format!(".fa2-{K}.4242.tmp"))), Some(Kind::Temp));
        for other in [
            "notes.txt",
            "mine.cubin",
            "fa2-0123.cubin",
            &format!("-{K}.cubin"),
            &format!(".fa2-{K}.cubin"),
            &format!(".fa2-{K}.tmp"),
            &format!(".fa2-{K}.x1.tmp"),
            &format!("fa2-{K}.4242.tmp"),
        ] {
            assert_eq!(kind_of(OsStr::new(other)), None, "{other}");
        }
    }

    #[test]
    fn store_then_load_round_trips() {
        let d = tmp("round-trip");
        assert_eq!(load_in(&d, "fa2", K), None);
        store_in(&d, "fa2", K, b"image", DEFAULT_MAX_BYTES);
        assert_eq!(load_in(&d, "fa2", K).as_deref(), Some(&b"image"[..]));
        assert_eq!(names(&d), [format!("fa2-{K}.cubin")], "no temporary file is left behind");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn eviction_removes_the_oldest_first_and_keeps_the_newest_and_the_stored_file() {
        let d = tmp("evict-oldest");
        put(&d, &format!("a-{K}.cubin"), 100, 300);
        put(&d, &format!("b-{K}.cubin"), 100, 200);
        put(&d, &format!("c-{K}.cubin"), 100, 100);
        put(&d, "unrelated.bin", 1000, 400);
        // 400 bytes of images against 250: the two oldest go, the unrelated file is not counted or touched.
        store_in(&d, "d", K, &[1u8; 100], 250);
        assert_eq!(names(&d), [format!("c-{K}.cubin"), format!("d-{K}.cubin"), "unrelated.bin".to_string()]);

        // A bound below the stored image alone: everything else goes, the stored file stays.
        store_in(&d, "e", K, &[1u8; 100], 50);
        assert_eq!(names(&d), [format!("e-{K}.cubin"), "unrelated.bin".to_string()]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn sweep_never_deletes_the_kept_file_even_when_it_is_the_oldest() {
        let d = tmp("evict-keep");
        put(&d, &format!("old-{K}.cubin"), 100, 500);
        put(&d, &format!("new-{K}.cubin"), 100, 10);
        let keep = format!("old-{K}.cubin");
        sweep(&d, 100, Some(OsStr::new(&keep)), SystemTime::now());
        assert_eq!(names(&d), [keep]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_load_refreshes_recency() {
        let d = tmp("load-recency");
        put(&d, &format!("a-{K}.cubin"), 100, 300);
        put(&d, &format!("b-{K}.cubin"), 100, 200);
        assert!(load_in(&d, "a", K).is_some());
        // `a` was created first but used last, so `b` is the least recently used.
        store_in(&d, "c", K, &[1u8; 100], 200);
        assert_eq!(names(&d), [format!("a-{K}.cubin"), format!("c-{K}.cubin")]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn stale_temp_files_go_and_fresh_ones_stay() {
        let d = tmp("stale-tmp");
        put(&d, &format!(".a-{K}.111.tmp"), 10, 2 * 3600);
        put(&d, &format!(".b-{K}.222.tmp"), 10, 60);
        put(&d, ".editor-swap.tmp", 10, 2 * 3600);
        store_in(&d, "c", K, b"image", DEFAULT_MAX_BYTES);
        assert_eq!(names(&d), [format!(".b-{K}.222.tmp"), ".editor-swap.tmp".to_string(), format!("c-{K}.cubin")]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn usage_counts_only_images() {
        let d = tmp("usage");
        put(&d, &format!("a-{K}.cubin"), 100, 0);
        put(&d, &format!("b-{K}.cubin"), 28, 0);
        put(&d, &format!(".c-{K}.9.tmp"), 1000, 0);
        put(&d, "other.cubin", 1000, 0);
        assert_eq!(usage_in(&d).expect("usage"), (2, 128));
        assert_eq!(usage_in(&d.join("absent")).expect("absent dir"), (0, 0));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn clear_removes_only_cache_files() {
        let d = tmp("clear");
        put(&d, &format!("a-{K}.cubin"), 100, 0);
        put(&d, &format!("b-{K}.cubin"), 28, 0);
        put(&d, &format!(".c-{K}.9.tmp"), 2, 0);
        put(&d, "notes.txt", 5, 0);
        put(&d, "other.cubin", 5, 0);
        assert_eq!(clear_in(&d).expect("clear"), (3, 130));
        assert_eq!(names(&d), ["notes.txt", "other.cubin"], "the directory and other files stay");

        let only_cache = tmp("clear-empties");
        put(&only_cache, &format!("a-{K}.cubin"), 1, 0);
        assert_eq!(clear_in(&only_cache).expect("clear"), (1, 1));
        assert!(!only_cache.exists(), "a directory left empty goes");
        assert_eq!(clear_in(&only_cache).expect("clear again"), (0, 0));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn bound_parser_takes_suffixes_and_rejects_garbage() {
        assert_eq!(parse_bound("512M"), Some(512 << 20));
        assert_eq!(parse_bound("2G"), Some(2 << 30));
        assert_eq!(parse_bound("2g"), Some(2 << 30));
        assert_eq!(parse_bound("2GiB"), Some(2 << 30));
        assert_eq!(parse_bound("2 GB"), Some(2 << 30));
        assert_eq!(parse_bound("64k"), Some(64 << 10));
        assert_eq!(parse_bound("1T"), Some(1 << 40));
        assert_eq!(parse_bound("123456"), Some(123456));
        assert_eq!(parse_bound(" 100B "), Some(100));
        assert_eq!(parse_bound("0"), Some(0));
        for bad in ["", "M", "lots", "-1", "1.5G", "2X", "10iB", "99999999999999999999", "20000000T"] {
            assert_eq!(parse_bound(bad), None, "{bad:?}");
        }

        assert_eq!(bound_from(None), Bound { bytes: DEFAULT_MAX_BYTES, source: BoundSource::Default });
        assert_eq!(bound_from(Some(OsStr::new(""))).source, BoundSource::Default);
        assert_eq!(
            bound_from(Some(OsStr::new("512M"))),
            Bound { bytes: 512 << 20, source: BoundSource::Env("512M".into()) }
        );
        assert_eq!(
            bound_from(Some(OsStr::new("lots"))),
            Bound { bytes: DEFAULT_MAX_BYTES, source: BoundSource::Invalid("lots".into()) }
        );
    }
}
