//! Byte source of a trace file: plain or gzip (detected from the magic bytes, not the name), decompressed
//! on a second thread so inflating and JSON parsing overlap, handed to the parser in bounded chunks.
//!
//! Memory stays bounded by the channel (a few MiB) whatever the file size. The reader counts the bytes it
//! has delivered so a parse error can name its byte offset.

use crate::error::{AnalysisError, Result};
use flate2::read::MultiGzDecoder;
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread;

const CHUNK: usize = 1 << 20;
const CHUNKS_IN_FLIGHT: usize = 4;

/// Marks an I/O error that came from inflating, so the caller can report a damaged gzip stream rather than
/// bad JSON.
#[derive(Debug)]
pub(crate) struct GzipFailure(pub io::Error);

impl std::fmt::Display for GzipFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for GzipFailure {}

/// A `Read` over the decompressed bytes of one file.
#[derive(Debug)]
pub(crate) struct ChunkReader {
    rx: Receiver<io::Result<Vec<u8>>>,
    cur: Vec<u8>,
    pos: usize,
    before_cur: u64,
    /// True when the file was gzip-compressed.
    pub gzip: bool,
    /// Bytes of the file (compressed, when gzip) read so far by the reading thread.
    raw_read: Arc<AtomicU64>,
    /// Size of the file in bytes.
    pub raw_total: u64,
}

/// Counts the bytes read from the file (progress reporting).
struct Counting<R> {
    inner: R,
    n: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let k = self.inner.read(buf)?;
        self.n.fetch_add(k as u64, Ordering::Relaxed);
        Ok(k)
    }
}

impl ChunkReader {
    /// Opens `path` and starts the reading thread.
    pub fn open(path: &Path) -> Result<Self> {
        let mut file = File::open(path).map_err(|e| AnalysisError::io(path, "cannot open trace", e))?;
        let mut magic = [0u8; 2];
        let n = read_up_to(&mut file, &mut magic).map_err(|e| AnalysisError::io(path, "cannot read trace", e))?;
        let gzip = n == 2 && magic == [0x1f, 0x8b];
        // The content decides, not the name (a plain JSON file named .gz is read as JSON); but a file named
        // .gz that is shorter than the magic, or starts like gzip and is not, is a damaged gzip stream, and
        // saying "invalid JSON" about it would send the user looking in the wrong place.
        let named_gz = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gz"));
        if named_gz && !gzip && (n < 2 || magic[0] == 0x1f) {
            let what = if n < 2 {
                format!("the file has {n} byte(s), fewer than the 2-byte gzip magic")
            } else {
                format!("the file starts with {:#04x} {:#04x}, not the gzip magic 0x1f 0x8b", magic[0], magic[1])
            };
            let source = io::Error::new(io::ErrorKind::UnexpectedEof, what);
            return Err(AnalysisError::Gzip { path: path.to_path_buf(), offset: 0, source });
        }
        let head = magic[..n].to_vec();
        let raw_total = file.metadata().map(|m| m.len()).unwrap_or(0);
        let raw_read = Arc::new(AtomicU64::new(n as u64));
        let file = Counting { inner: file, n: Arc::clone(&raw_read) };
        let (tx, rx) = sync_channel::<io::Result<Vec<u8>>>(CHUNKS_IN_FLIGHT);
        let spawn = thread::Builder::new().name("sdpa-trace-reader".into()).spawn(move || {
            let head = io::Cursor::new(head);
            let mut src: Box<dyn Read> =
                if gzip { Box::new(MultiGzDecoder::new(head.chain(file))) } else { Box::new(head.chain(file)) };
            let mut first = true;
            loop {
                let mut buf = vec![0u8; CHUNK];
                let mut filled = 0;
                let mut failure = None;
                while filled < CHUNK {
                    match src.read(&mut buf[filled..]) {
                        Ok(0) => break,
                        Ok(n) => filled += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            failure = Some(e);
                            break;
                        }
                    }
                }
                // A UTF-8 byte order mark (Windows editors write one) is not JSON: drop it before the parser
                // sees it. The first chunk holds the first CHUNK bytes, or the whole (shorter) document.
                let bom = if first && buf[..filled].starts_with(b"\xEF\xBB\xBF") { 3 } else { 0 };
                first = false;
                // Hand over what was decoded before a failure, so the error's offset is exact.
                if filled > bom {
                    buf.truncate(filled);
                    buf.drain(..bom);
                    if tx.send(Ok(buf)).is_err() {
                        return; // the parser stopped early
                    }
                }
                if let Some(e) = failure {
                    let e = if gzip { io::Error::new(e.kind(), GzipFailure(e)) } else { e };
                    let _ = tx.send(Err(e));
                    return;
                }
                if filled < CHUNK {
                    return; // end of file
                }
            }
        });
        spawn.map_err(|e| AnalysisError::io(path, "cannot start the reading thread", e))?;
        Ok(ChunkReader { rx, cur: Vec::new(), pos: 0, before_cur: 0, gzip, raw_read, raw_total })
    }

    /// The next chunk of decompressed bytes, `None` at end of file (the scanner's fast path; do not mix
    /// with `read`).
    pub fn next_chunk(&mut self) -> io::Result<Option<Vec<u8>>> {
        match self.rx.recv() {
            Ok(Ok(chunk)) => Ok(Some(chunk)),
            Ok(Err(e)) => Err(e),
            Err(_) => Ok(None),
        }
    }

    /// File bytes read so far (compressed bytes for gzip): progress against [`ChunkReader::raw_total`].
    pub fn raw_read(&self) -> u64 {
        self.raw_read.load(Ordering::Relaxed)
    }

    /// Decompressed bytes handed to the parser so far.
    pub fn offset(&self) -> u64 {
        self.before_cur + self.pos as u64
    }
}

impl Read for ChunkReader {
    #[inline]
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.cur.len() {
            match self.rx.recv() {
                Ok(Ok(chunk)) => {
                    self.before_cur += self.cur.len() as u64;
                    self.cur = chunk;
                    self.pos = 0;
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => return Ok(0), // the reading thread finished: end of file
            }
        }
        let n = buf.len().min(self.cur.len() - self.pos);
        buf[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Fills `buf` as far as the source allows; returns fewer bytes only at end of stream.
fn read_up_to(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}
