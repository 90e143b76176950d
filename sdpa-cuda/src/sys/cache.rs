//! On-disk cache of compiled modules, so a second run does not compile again.
//!
//! Key: a 128-bit FNV-1a hash of the module source, every registered header, the architecture, the full option list,
//! the NVRTC version and the driver version. Location: `SDPA_CUDA_CACHE`, else `$XDG_CACHE_HOME/sdpa-cuda`,
//! else `~/.cache/sdpa-cuda`; `SDPA_CUDA_CACHE=off` disables it. Cache failures are never errors: a
//! missing or unwritable cache only means compiling again. Files are written to a temporary name and
//! renamed, so concurrent processes never read a half-written image.

use std::path::PathBuf;

/// The cache directory, or `None` when disabled or no home is known.
pub fn dir() -> Option<PathBuf> {
    match std::env::var_os("SDPA_CUDA_CACHE") {
        Some(v) if v == "off" || v == "0" => return None,
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
    let path = dir()?.join(format!("{module}-{key}.cubin"));
    std::fs::read(path).ok().filter(|b| !b.is_empty())
}

/// Stores an image; errors are ignored on purpose (see the module docs).
pub fn store(module: &str, key: &str, image: &[u8]) {
    let Some(d) = dir() else { return };
    if std::fs::create_dir_all(&d).is_err() {
        return;
    }
    let tmp = d.join(format!(".{module}-{key}.{}.tmp", std::process::id()));
    if std::fs::write(&tmp, image).is_ok() {
        let _ = std::fs::rename(&tmp, d.join(format!("{module}-{key}.cubin")));
    } else {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::key;

    #[test]
    fn key_depends_on_every_part_and_on_boundaries() {
        let k = key(&[b"src", b"sm_90"]);
        assert_eq!(k, key(&[b"src", b"sm_90"]));
        assert_ne!(k, key(&[b"src", b"sm_80"]));
        assert_ne!(k, key(&[b"sr", b"csm_90"]));
        assert_eq!(k.len(), 32);
    }
}
