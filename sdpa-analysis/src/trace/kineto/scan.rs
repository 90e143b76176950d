//! The fast path of the streaming parser: a byte scanner walks the document's outer structure (the top
//! object, the `traceEvents` array) over the decompressed chunks and cuts out one event at a time; each
//! event is then deserialised from its own slice by the serde visitors of [`super::parse`] (serde_json's
//! slice reader is several times faster than its `io::Read` one). Values the analysis does not need are
//! skipped without being copied. Memory: one chunk and one event at a time.
//!
//! The scanner checks the outer structure itself (brackets match, strings close, commas separate) and
//! reports problems with the byte offset, line and column in the decompressed document.

use super::model::DistributedInfo;
use super::parse::{Collector, DeviceList, EventSeed};
use super::source::{ChunkReader, GzipFailure};
use crate::error::{AnalysisError, Result};
use serde::de::DeserializeSeed;
use std::path::{Path, PathBuf};

pub(crate) struct Scanner {
    reader: ChunkReader,
    path: PathBuf,
    chunk: Vec<u8>,
    pos: usize,
    /// Offset of `chunk[0]` in the document.
    base: u64,
    /// Newlines before `chunk[0]`.
    lines_before: u64,
    eof: bool,
    progress: Option<Progress>,
}

/// Progress callback: (file bytes read, file size). Called once per chunk (1 MiB of JSON).
pub type Progress = std::sync::Arc<dyn Fn(u64, u64) + Send + Sync>;

impl Scanner {
    pub fn new(reader: ChunkReader, path: &Path, progress: Option<Progress>) -> Self {
        Scanner {
            reader,
            path: path.to_path_buf(),
            chunk: Vec::new(),
            pos: 0,
            base: 0,
            lines_before: 0,
            eof: false,
            progress,
        }
    }

    /// Bytes consumed so far.
    pub fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// An error at the current position.
    pub fn error(&self, message: impl Into<String>) -> AnalysisError {
        self.error_at(self.offset(), message)
    }

    fn error_at(&self, offset: u64, message: impl Into<String>) -> AnalysisError {
        // Line and column of `offset` (which lies in or at the end of the current chunk, or earlier for
        // errors inside an event, which the caller adjusts).
        let in_chunk = offset.saturating_sub(self.base).min(self.chunk.len() as u64) as usize;
        let head = &self.chunk[..in_chunk];
        let nl = head.iter().filter(|&&b| b == b'\n').count() as u64;
        let col = match head.iter().rposition(|&b| b == b'\n') {
            Some(i) => in_chunk - i,
            // No newline in this chunk before `offset`: count from the chunk start (the column is exact for
            // the first chunk, a lower bound after).
            None => in_chunk + 1,
        };
        AnalysisError::Json {
            path: self.path.clone(),
            offset,
            line: (self.lines_before + nl + 1) as usize,
            column: col.max(1),
            message: message.into(),
        }
    }

    /// Makes `pos < chunk.len()` true, fetching the next chunk; false at end of file.
    #[inline]
    fn fill(&mut self) -> Result<bool> {
        if self.pos < self.chunk.len() {
            return Ok(true);
        }
        self.refill()
    }

    #[cold]
    fn refill(&mut self) -> Result<bool> {
        if self.eof {
            return Ok(false);
        }
        loop {
            match self.reader.next_chunk() {
                Ok(Some(c)) => {
                    if let Some(p) = &self.progress {
                        p(self.reader.raw_read(), self.reader.raw_total);
                    }
                    self.lines_before += self.chunk.iter().filter(|&&b| b == b'\n').count() as u64;
                    self.base += self.chunk.len() as u64;
                    self.chunk = c;
                    self.pos = 0;
                    if !self.chunk.is_empty() {
                        return Ok(true);
                    }
                }
                Ok(None) => {
                    self.eof = true;
                    return Ok(false);
                }
                Err(e) => {
                    let offset = self.offset();
                    if let Some(GzipFailure(inner)) = e.get_ref().and_then(|r| r.downcast_ref::<GzipFailure>()) {
                        return Err(AnalysisError::Gzip {
                            path: self.path.clone(),
                            offset,
                            source: std::io::Error::new(inner.kind(), inner.to_string()),
                        });
                    }
                    return Err(AnalysisError::io(&self.path, format!("read failed after {offset} bytes"), e));
                }
            }
        }
    }

    fn eof_error(&self, what: &str) -> AnalysisError {
        self.error(format!("EOF while parsing {what} (the file is truncated)"))
    }

    /// The next non-whitespace byte, not consumed; `None` at end of file.
    #[inline]
    pub fn peek(&mut self) -> Result<Option<u8>> {
        loop {
            if !self.fill()? {
                return Ok(None);
            }
            let c = self.chunk[self.pos];
            if matches!(c, b' ' | b'\n' | b'\r' | b'\t') {
                self.pos += 1;
            } else {
                return Ok(Some(c));
            }
        }
    }

    /// Consumes `b` (after whitespace) or fails.
    pub fn expect(&mut self, b: u8, what: &str) -> Result<()> {
        match self.peek()? {
            Some(c) if c == b => {
                self.pos += 1;
                Ok(())
            }
            Some(c) => Err(self.error(format!("expected {what}, found `{}`", c as char))),
            None => Err(self.eof_error(what)),
        }
    }

    /// Consumes one byte that `peek` returned.
    #[inline]
    pub fn bump(&mut self) {
        self.pos += 1;
    }

    /// Copies (or skips, when `out` is `None`) one JSON value into `out`.
    pub fn value(&mut self, out: Option<&mut Vec<u8>>) -> Result<()> {
        match out {
            None => self.scan_value(false, &mut Vec::new()).map(|_| ()),
            Some(buf) => {
                let len0 = buf.len();
                let mut spill = std::mem::take(buf);
                spill.truncate(len0);
                let span = self.scan_value(true, &mut spill)?;
                if let Some((a, b)) = span {
                    spill.extend_from_slice(&self.chunk[a..b]);
                }
                *buf = spill;
                Ok(())
            }
        }
    }

    /// Scans one JSON value, checking that brackets match and strings close; nesting is tracked on a heap
    /// stack, no recursion. With `keep`, returns the value's span in the current chunk when it lies in
    /// one chunk (no copy), or `None` with the bytes appended to `spill` when it crosses chunks.
    fn scan_value(&mut self, keep: bool, spill: &mut Vec<u8>) -> Result<Option<(usize, usize)>> {
        let Some(first) = self.peek()? else { return Err(self.eof_error("a value")) };
        let mut stack: Vec<u8> = Vec::new();
        let mut in_string = false;
        let mut escape = false;
        let mut seg = self.pos;
        let mut copied = false;
        let scalar = !matches!(first, b'{' | b'[' | b'"');
        loop {
            if self.pos == self.chunk.len() {
                if keep {
                    spill.extend_from_slice(&self.chunk[seg..]);
                    copied = true;
                }
                if !self.fill()? {
                    if scalar {
                        return Ok(if keep && !copied { Some((seg, self.pos)) } else { None });
                    }
                    return Err(self.eof_error(if in_string { "a string" } else { "a value" }));
                }
                seg = 0;
            }
            let bytes = &self.chunk[self.pos..];
            let mut i = 0;
            let mut done = false;
            if scalar {
                while i < bytes.len() {
                    if matches!(bytes[i], b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t') {
                        done = true;
                        break;
                    }
                    i += 1;
                }
            } else {
                while i < bytes.len() {
                    if in_string {
                        if escape {
                            escape = false;
                            i += 1;
                            continue;
                        }
                        // Jump to the next quote or backslash.
                        match find_quote_or_backslash(&bytes[i..]) {
                            None => {
                                i = bytes.len();
                                break;
                            }
                            Some(p) => {
                                i += p;
                                if bytes[i] == b'\\' {
                                    escape = true;
                                } else {
                                    in_string = false;
                                    if stack.is_empty() {
                                        i += 1;
                                        done = true;
                                        break;
                                    }
                                }
                                i += 1;
                                continue;
                            }
                        }
                    }
                    let c = bytes[i];
                    i += 1;
                    match c {
                        b'"' => in_string = true,
                        b'{' => stack.push(b'}'),
                        b'[' => stack.push(b']'),
                        b'}' | b']' => {
                            if stack.pop() != Some(c) {
                                self.pos += i - 1;
                                return Err(self.error(format!("mismatched `{}`", c as char)));
                            }
                            if stack.is_empty() {
                                done = true;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
            }
            self.pos += i;
            if done {
                if !keep {
                    return Ok(None);
                }
                if copied {
                    spill.extend_from_slice(&self.chunk[seg..self.pos]);
                    return Ok(None);
                }
                return Ok(Some((seg, self.pos)));
            }
        }
    }

    /// Reads a JSON string key (after whitespace) and returns its raw contents (no unescaping: the keys
    /// we look for have no escapes).
    pub fn key(&mut self, buf: &mut Vec<u8>) -> Result<()> {
        buf.clear();
        match self.peek()? {
            Some(b'"') => {}
            Some(c) => return Err(self.error(format!("expected a key string, found `{}`", c as char))),
            None => return Err(self.eof_error("an object key")),
        }
        self.value(Some(buf))
    }

    /// Parses the document into the collector.
    pub fn document(&mut self, c: &mut Collector) -> Result<()> {
        match self.peek()? {
            Some(b'{') => {
                self.bump();
                self.object_body(c)?;
            }
            Some(b'[') => {
                self.bump();
                c.saw_events = true;
                self.events(c)?;
            }
            Some(x) => {
                return Err(self.error(format!(
                    "expected a trace object with traceEvents, or an array of events, found `{}`",
                    x as char
                )))
            }
            None => return Err(self.error("EOF while parsing the document: the file is empty")),
        }
        match self.peek()? {
            None => Ok(()),
            Some(_) => Err(self.error("trailing characters after the trace")),
        }
    }

    fn object_body(&mut self, c: &mut Collector) -> Result<()> {
        let mut key = Vec::new();
        let mut val = Vec::new();
        if self.peek()? == Some(b'}') {
            self.bump();
            return Ok(());
        }
        loop {
            self.key(&mut key)?;
            self.expect(b':', "`:` after a key")?;
            match key.as_slice() {
                b"\"traceEvents\"" => match self.peek()? {
                    Some(b'[') => {
                        self.bump();
                        c.saw_events = true;
                        self.events(c)?;
                    }
                    Some(_) => return Err(self.error("expected traceEvents to be an array of events")),
                    None => return Err(self.eof_error("traceEvents")),
                },
                b"\"deviceProperties\""
                | b"\"record_shapes\""
                | b"\"with_stack\""
                | b"\"with_modules\""
                | b"\"distributedInfo\"" => {
                    val.clear();
                    let at = self.offset();
                    self.value(Some(&mut val))?;
                    self.top_field(c, &key, &val, at)?;
                }
                _ => self.value(None)?,
            }
            match self.peek()? {
                Some(b',') => self.bump(),
                Some(b'}') => {
                    self.bump();
                    return Ok(());
                }
                Some(x) => {
                    return Err(self.error(format!("expected `,` or `}}` in the trace object, found `{}`", x as char)))
                }
                None => return Err(self.eof_error("the trace object")),
            }
        }
    }

    fn top_field(&self, c: &mut Collector, key: &[u8], val: &[u8], at: u64) -> Result<()> {
        let wrap = |e: serde_json::Error| self.slice_error(at, val, e);
        let num = |v: &[u8]| -> Result<Option<bool>> {
            let n: super::lenient::Num = serde_json::from_slice(v).map_err(wrap)?;
            Ok(n.0.map(|x| x != 0.0))
        };
        match key {
            b"\"deviceProperties\"" => {
                let DeviceList(d) = serde_json::from_slice(val).map_err(wrap)?;
                c.trace.devices = d;
            }
            b"\"record_shapes\"" => c.trace.flags.record_shapes = num(val)?,
            b"\"with_stack\"" => c.trace.flags.with_stack = num(val)?,
            b"\"distributedInfo\"" => {
                // A malformed value loses only the rank, never the trace.
                let v: serde_json::Value = serde_json::from_slice(val).map_err(wrap)?;
                c.trace.distributed = Some(DistributedInfo::from_json(&v));
            }
            _ => c.trace.flags.with_modules = num(val)?,
        }
        Ok(())
    }

    fn events(&mut self, c: &mut Collector) -> Result<()> {
        let mut ev = Vec::with_capacity(4096);
        if self.peek()? == Some(b']') {
            self.bump();
            return Ok(());
        }
        loop {
            ev.clear();
            self.peek()?;
            let at = self.offset();
            let span = self.scan_value(true, &mut ev)?;
            let slice: &[u8] = match span {
                Some((a, b)) => &self.chunk[a..b],
                None => &ev,
            };
            let mut de = serde_json::Deserializer::from_slice(slice);
            let parsed = EventSeed(&mut c.trace.names).deserialize(&mut de).and_then(|v| de.end().map(|()| v));
            match parsed {
                Ok(Some(raw)) => c.push(raw),
                Ok(None) => {
                    c.trace.stats.events += 1;
                    c.trace.stats.skipped += 1;
                }
                Err(e) => {
                    let owned = slice.to_vec();
                    return Err(self.slice_error(at, &owned, e));
                }
            }
            match self.peek()? {
                Some(b',') => self.bump(),
                Some(b']') => {
                    self.bump();
                    return Ok(());
                }
                Some(x) => return Err(self.error(format!("expected `,` or `]` after an event, found `{}`", x as char))),
                None => return Err(self.eof_error("traceEvents")),
            }
        }
    }

    /// Maps an error inside a value that started at document offset `at` to document coordinates.
    fn slice_error(&self, at: u64, slice: &[u8], e: serde_json::Error) -> AnalysisError {
        let (line, col) = (e.line(), e.column());
        let mut idx = 0usize;
        for _ in 1..line {
            match slice[idx..].iter().position(|&b| b == b'\n') {
                Some(p) => idx += p + 1,
                None => break,
            }
        }
        let idx = (idx + col.saturating_sub(1)).min(slice.len());
        let full = e.to_string();
        let suffix = format!(" at line {line} column {col}");
        let message = full.strip_suffix(&suffix).unwrap_or(&full).to_string();
        match self.error_at(at, "") {
            AnalysisError::Json { path, line: l0, column: c0, .. } => {
                let nl = slice[..idx].iter().filter(|&&b| b == b'\n').count();
                let column = match slice[..idx].iter().rposition(|&b| b == b'\n') {
                    Some(p) => idx - p,
                    None => c0 + idx,
                };
                AnalysisError::Json { path, offset: at + idx as u64, line: l0 + nl, column, message }
            }
            other => other,
        }
    }
}

/// Parses one file through the scanner.
pub(crate) fn parse_with_scanner(
    path: &Path,
    reader: ChunkReader,
    c: &mut Collector,
    progress: Option<Progress>,
) -> Result<u64> {
    let mut s = Scanner::new(reader, path, progress);
    s.document(c)?;
    Ok(s.offset())
}

/// Index of the first `"` or `\\` in `b`, eight bytes at a time (SWAR: a zero byte in `w ^ pattern`
/// marks a match).
#[inline]
fn find_quote_or_backslash(b: &[u8]) -> Option<usize> {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    const QUOTE: u64 = LO * b'"' as u64;
    const BSLASH: u64 = LO * b'\\' as u64;
    let has_zero = |x: u64| x.wrapping_sub(LO) & !x & HI;
    let mut i = 0;
    while i + 8 <= b.len() {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[i..i + 8]);
        let w = u64::from_le_bytes(w);
        if has_zero(w ^ QUOTE) | has_zero(w ^ BSLASH) != 0 {
            break;
        }
        i += 8;
    }
    b[i..].iter().position(|&c| c == b'"' || c == b'\\').map(|p| p + i)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::find_quote_or_backslash as f;

    #[test]
    fn finds_the_first_quote_or_backslash() {
        assert_eq!(f(b"abcdefghijklmnop\"q"), Some(16));
        assert_eq!(f(b"abc\\defghijklmnop"), Some(3));
        assert_eq!(f(b"abcdefghijklmnopqrstuvwxyz"), None);
        assert_eq!(f(b""), None);
        // Bytes >= 0x80 (UTF-8) do not trigger false matches.
        assert_eq!(f("ééééééééé\"".as_bytes()), Some(18));
    }
}
