//! One streaming pass over a kineto Chrome trace: serde visitors walk `traceEvents` element by element and
//! keep the compact [`Trace`]; no JSON document is ever built. Field order inside an event does not matter,
//! unknown fields are skipped, odd types are tolerated (see [`super::lenient`]); only malformed JSON fails,
//! with the byte offset where the parser stopped.

use super::lenient::{DimsList, Id, Num, Str, StrList};
use super::model::*;
use super::source::{ChunkReader, GzipFailure};
use crate::error::{AnalysisError, Result};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::collections::HashMap;
use std::fmt;
use std::path::Path;

/// Parses one trace file (`.json` or gzip, detected from its first bytes).
pub fn parse_file(path: &Path) -> Result<Trace> {
    parse_file_with_progress(path, None)
}

/// [`parse_file`] with a progress callback (file bytes read, file size), called once per MiB of JSON.
pub fn parse_file_with_progress(path: &Path, progress: Option<super::scan::Progress>) -> Result<Trace> {
    let reader = ChunkReader::open(path)?;
    let gzip = reader.gzip;
    let mut collector = Collector::new(path);
    let bytes = super::scan::parse_with_scanner(path, reader, &mut collector, progress)?;
    let mut trace = collector.finish()?;
    trace.stats.bytes = bytes;
    trace.stats.gzip = gzip;
    Ok(trace)
}

/// The same parse through serde_json's `io::Read` path (one visitor over the whole document). Slower than
/// [`parse_file`]; kept as the reference the scanner is tested against.
pub fn parse_file_reference(path: &Path) -> Result<Trace> {
    let mut reader = ChunkReader::open(path)?;
    let gzip = reader.gzip;
    let mut collector = Collector::new(path);
    let outcome = {
        let mut de = serde_json::Deserializer::from_reader(&mut reader);
        TopSeed(&mut collector).deserialize(&mut de).and_then(|()| de.end())
    };
    let offset = reader.offset();
    if let Err(e) = outcome {
        return Err(convert_error(path, offset, e));
    }
    let mut trace = collector.finish()?;
    trace.stats.bytes = offset;
    trace.stats.gzip = gzip;
    Ok(trace)
}

fn convert_error(path: &Path, offset: u64, e: serde_json::Error) -> AnalysisError {
    let (line, column) = (e.line(), e.column());
    if e.is_io() {
        // serde_json hands back the reader's own io::Error; our marker says it came from inflating.
        let io: std::io::Error = e.into();
        if let Some(GzipFailure(inner)) = io.get_ref().and_then(|r| r.downcast_ref::<GzipFailure>()) {
            return AnalysisError::Gzip {
                path: path.to_path_buf(),
                offset,
                source: std::io::Error::new(inner.kind(), inner.to_string()),
            };
        }
        return AnalysisError::io(path, format!("read failed after {offset} bytes"), io);
    }
    let full = e.to_string();
    let suffix = format!(" at line {line} column {column}");
    let message = full.strip_suffix(&suffix).unwrap_or(&full).to_string();
    let message = if e.is_eof() { format!("{message} (the file is truncated)") } else { message };
    AnalysisError::Json { path: path.to_path_buf(), offset, line, column, message }
}

/// Operators whose shapes and literals the detectors read; all others drop their `args` right away.
fn wants_args(name: &str) -> bool {
    const ATEN: &[&str] = &[
        "matmul",
        "bmm",
        "baddbmm",
        "einsum",
        "softmax",
        "_softmax",
        "_safe_softmax",
        "mul",
        "div",
        "add",
        "sub",
        "masked_fill",
        "masked_fill_",
        "where",
        "to",
        "_to_copy",
        "dropout",
        "native_dropout",
        "expand",
        "repeat_interleave",
        // Position comparisons that build causal and windowed masks (`attention::positions`), and the `tanh`
        // of a softcap.
        "le",
        "lt",
        "ge",
        "gt",
        "tanh",
    ];
    if let Some(op) = name.strip_prefix("aten::") {
        return ATEN.contains(&op) || op.contains("attention");
    }
    // `ttention` also keeps FlexAttention's Triton kernels (`triton_tem_fused_flex_attention_0`) and vLLM's
    // `_C::paged_attention_v1`/`_v2`; `varlen_attn` PyTorch's `torch_attn::_varlen_attn`.
    name.contains("ttention")
        || name.contains("varlen_attn")
        || name.contains("flex_decoding")
        || name.starts_with("flash_attn")
        || name.contains("FlashAttn")
}

pub(crate) struct Collector {
    pub(crate) trace: Trace,
    /// Per name id: 0 not yet decided, 1 keep args, 2 drop args.
    keep: Vec<u8>,
    thread_ids: HashMap<(i64, i64), u32>,
    /// The document held an events list: a `traceEvents` array, or the document itself was an array.
    pub(crate) saw_events: bool,
}

impl Collector {
    fn new(path: &Path) -> Self {
        let trace = Trace { path: path.to_path_buf(), ..Trace::default() };
        Collector { trace, keep: Vec::new(), thread_ids: HashMap::new(), saw_events: false }
    }

    /// Counts an event left out for an implausible value; the first of each kind is kept as the example.
    fn implausible(&mut self, what: &'static str, name: Option<NameId>, why: String) {
        let list = &mut self.trace.implausible;
        match list.iter_mut().find(|i| i.what == what) {
            Some(i) => i.count += 1,
            None => {
                let name = name.map(|n| self.trace.names.get(n)).unwrap_or("");
                list.push(Implausible { what, count: 1, example: format!("`{name}`: {what} {why}") });
            }
        }
    }

    /// A plausible duration, or `None` after counting the event as implausible.
    fn duration(&mut self, what: &'static str, name: Option<NameId>, dur: Option<f64>) -> Option<f64> {
        let dur = dur?;
        match crate::trace::plausible::duration(dur) {
            Ok(()) => Some(dur),
            Err(why) => {
                self.implausible(what, name, why);
                None
            }
        }
    }

    fn thread(&mut self, pid: i64, tid: i64) -> u32 {
        let next = self.trace.threads.len() as u32;
        *self.thread_ids.entry((pid, tid)).or_insert_with(|| {
            self.trace.threads.push((pid, tid));
            next
        })
    }

    fn keeps_args(&mut self, name: NameId) -> bool {
        let i = name as usize;
        if self.keep.len() <= i {
            self.keep.resize(i + 1, 0);
        }
        if self.keep[i] == 0 {
            self.keep[i] = if wants_args(self.trace.names.get(name)) { 1 } else { 2 };
        }
        self.keep[i] == 1
    }

    pub(crate) fn push(&mut self, ev: RawEvent) {
        self.trace.stats.events += 1;
        if ev.keyed {
            self.trace.stats.recognised += 1;
        }
        let (Some(ts), name) = (ev.ts, ev.name) else {
            return;
        };
        if let Err(why) = crate::trace::plausible::timestamp(ts) {
            self.implausible("timestamp", name, why);
            return;
        }
        let name = name.unwrap_or_else(|| self.trace.names.intern(""));
        let thread = self.thread(ev.pid.unwrap_or(-1), ev.tid.unwrap_or(-1));
        let args = ev.args.unwrap_or_default();
        match ev.cat {
            Cat::CpuOp => {
                let Some(dur) = self.duration("CPU op duration", Some(name), ev.dur) else { return };
                if ev.ph.is_some_and(|p| p != b'X') {
                    return;
                }
                if !args.dims.0.is_empty() {
                    self.trace.ops_with_shapes += 1;
                }
                let args_kept = if args.has_op_args() && self.keeps_args(name) {
                    Some(Box::new(OpArgs {
                        dims: args.dims.0,
                        types: args.types.0,
                        concrete: args.concrete.0,
                        strides: args.strides.0,
                    }))
                } else {
                    None
                };
                self.trace.ops.push(CpuOp {
                    name,
                    thread,
                    ts,
                    dur,
                    ext_id: args.ext_id,
                    seq: args.seq,
                    args: args_kept,
                });
            }
            Cat::PythonFunction => {
                self.trace.python_events += 1;
                let Some(dur) = self.duration("Python frame duration", Some(name), ev.dur) else { return };
                if self.trace.names.get(name).starts_with("nn.Module: ") {
                    self.trace.modules.push(PyModule { name, thread, ts, dur });
                }
            }
            Cat::Runtime => {
                if args.correlation != NO_ID {
                    self.trace.launches.push(Launch {
                        name,
                        thread,
                        ts,
                        correlation: args.correlation,
                        ext_id: args.ext_id,
                    });
                }
            }
            Cat::Kernel | Cat::Memcpy | Cat::Memset => {
                let Some(dur) = self.duration("GPU activity duration", Some(name), ev.dur) else { return };
                let kind = match ev.cat {
                    Cat::Kernel => GpuKind::Kernel,
                    Cat::Memcpy => GpuKind::Memcpy,
                    _ => GpuKind::Memset,
                };
                self.trace.gpu.push(GpuActivity {
                    name,
                    kind,
                    thread,
                    ts,
                    dur,
                    correlation: args.correlation,
                    ext_id: args.ext_id,
                    device: args.device,
                    grid: args.grid,
                });
            }
            Cat::Ac2g => {
                let Some(id) = ev.id else { return };
                let end = FlowEnd { id, thread, ts };
                match ev.ph {
                    Some(b's') => self.trace.flow_starts.push(end),
                    Some(b'f') => self.trace.flow_ends.push(end),
                    _ => {}
                }
            }
            Cat::Other => {}
        }
    }

    /// The trace, or an error when the JSON held no trace: an object without `traceEvents` (`{}`, a
    /// TraceLens metadata file), or events none of which is an event object (`[1,2,3]`, `[{}]`, nested
    /// arrays). An empty `traceEvents` list stays a trace; the pipeline says it has no events.
    fn finish(self) -> Result<Trace> {
        let path = &self.trace.path;
        if !self.saw_events {
            return Err(AnalysisError::invalid(
                path,
                "not a PyTorch profiler trace: a JSON object without a `traceEvents` list",
            ));
        }
        let s = &self.trace.stats;
        if s.events > 0 && s.recognised == 0 {
            return Err(AnalysisError::invalid(
                path,
                format!(
                    "not a PyTorch profiler trace: none of its {} events is an event object (with `ph` or `ts`)",
                    s.events
                ),
            ));
        }
        Ok(self.trace)
    }
}

/// Event categories the analysis distinguishes (kineto's current and older spellings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Cat {
    CpuOp,
    PythonFunction,
    Runtime,
    Kernel,
    Memcpy,
    Memset,
    Ac2g,
    #[default]
    Other,
}

fn classify_cat(s: &str) -> Cat {
    match s {
        "cpu_op" | "user_annotation" | "Operator" | "operator" => Cat::CpuOp,
        "python_function" => Cat::PythonFunction,
        "cuda_runtime" | "cuda_driver" | "Runtime" | "runtime" | "hip_runtime" => Cat::Runtime,
        "kernel" | "Kernel" => Cat::Kernel,
        "gpu_memcpy" | "Memcpy" | "memcpy" => Cat::Memcpy,
        "gpu_memset" | "Memset" | "memset" => Cat::Memset,
        "ac2g" => Cat::Ac2g,
        _ => Cat::Other,
    }
}

#[derive(Default)]
pub(crate) struct RawEvent {
    /// The object had a `ph` or `ts` field: it looks like a trace event.
    keyed: bool,
    ph: Option<u8>,
    cat: Cat,
    name: Option<NameId>,
    pid: Option<i64>,
    tid: Option<i64>,
    ts: Option<f64>,
    dur: Option<f64>,
    id: Option<i64>,
    args: Option<RawArgs>,
}

struct RawArgs {
    ext_id: i64,
    correlation: i64,
    seq: i64,
    device: i64,
    grid: Option<[i64; 3]>,
    dims: DimsList,
    types: StrList,
    concrete: StrList,
    strides: DimsList,
}

impl Default for RawArgs {
    fn default() -> Self {
        RawArgs {
            ext_id: NO_ID,
            correlation: NO_ID,
            seq: NO_ID,
            device: -1,
            grid: None,
            dims: DimsList::default(),
            types: StrList::default(),
            concrete: StrList::default(),
            strides: DimsList::default(),
        }
    }
}

impl RawArgs {
    fn has_op_args(&self) -> bool {
        !self.dims.0.is_empty() || !self.types.0.is_empty() || !self.concrete.0.is_empty()
    }
}

/// The whole document: an object with `traceEvents` (kineto), or a bare array of events (Chrome's other
/// trace format).
struct TopSeed<'a>(&'a mut Collector);

impl<'de> DeserializeSeed<'de> for TopSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TopSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a trace object with traceEvents, or an array of events")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<(), A::Error> {
        while let Some(key) = m.next_key::<TopField>()? {
            match key {
                TopField::TraceEvents => {
                    self.0.saw_events = true;
                    m.next_value_seed(EventsSeed(self.0))?
                }
                TopField::DeviceProperties => {
                    let DeviceList(devs) = m.next_value()?;
                    self.0.trace.devices = devs;
                }
                TopField::RecordShapes => self.0.trace.flags.record_shapes = m.next_value::<Num>()?.0.map(|v| v != 0.0),
                TopField::WithStack => self.0.trace.flags.with_stack = m.next_value::<Num>()?.0.map(|v| v != 0.0),
                TopField::WithModules => self.0.trace.flags.with_modules = m.next_value::<Num>()?.0.map(|v| v != 0.0),
                TopField::DistributedInfo => {
                    let v: serde_json::Value = m.next_value()?;
                    self.0.trace.distributed = Some(DistributedInfo::from_json(&v));
                }
                TopField::Other => {
                    m.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, s: A) -> Result<(), A::Error> {
        self.0.saw_events = true;
        EventsSeed(self.0).visit_seq(s)
    }
}

enum TopField {
    TraceEvents,
    DeviceProperties,
    RecordShapes,
    WithStack,
    WithModules,
    DistributedInfo,
    Other,
}

impl<'de> de::Deserialize<'de> for TopField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TopField;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E>(self, v: &str) -> Result<TopField, E> {
                Ok(match v {
                    "traceEvents" => TopField::TraceEvents,
                    "deviceProperties" => TopField::DeviceProperties,
                    "record_shapes" => TopField::RecordShapes,
                    "with_stack" => TopField::WithStack,
                    "with_modules" => TopField::WithModules,
                    "distributedInfo" => TopField::DistributedInfo,
                    _ => TopField::Other,
                })
            }
        }
        d.deserialize_identifier(V)
    }
}

struct EventsSeed<'a>(&'a mut Collector);

impl<'de> DeserializeSeed<'de> for EventsSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for EventsSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("traceEvents to be an array of events")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<(), A::Error> {
        while let Some(ev) = s.next_element_seed(EventSeed(&mut self.0.trace.names))? {
            match ev {
                Some(ev) => self.0.push(ev),
                None => {
                    self.0.trace.stats.events += 1;
                    self.0.trace.stats.skipped += 1;
                }
            }
        }
        Ok(())
    }
}

/// One event; `None` when the element is not an object (skipped, counted).
pub(crate) struct EventSeed<'a>(pub(crate) &'a mut Names);

impl<'de> DeserializeSeed<'de> for EventSeed<'_> {
    type Value = Option<RawEvent>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

macro_rules! skip_str {
    ($t:ty) => {
        fn visit_str<E>(self, _: &str) -> Result<$t, E> {
            Ok(Default::default())
        }
    };
}

macro_rules! skip_non_map {
    ($t:ty) => {
        fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<$t, A::Error> {
            while s.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Default::default())
        }
        fn visit_i64<E>(self, _: i64) -> Result<$t, E> {
            Ok(Default::default())
        }
        fn visit_u64<E>(self, _: u64) -> Result<$t, E> {
            Ok(Default::default())
        }
        fn visit_f64<E>(self, _: f64) -> Result<$t, E> {
            Ok(Default::default())
        }
        fn visit_bool<E>(self, _: bool) -> Result<$t, E> {
            Ok(Default::default())
        }
        fn visit_unit<E>(self) -> Result<$t, E> {
            Ok(Default::default())
        }
    };
}

impl<'de> Visitor<'de> for EventSeed<'_> {
    type Value = Option<RawEvent>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an event object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
        let mut ev = RawEvent::default();
        while let Some(key) = m.next_key::<EventField>()? {
            match key {
                EventField::Ph => {
                    ev.keyed = true;
                    ev.ph = m.next_value_seed(FirstByte)?
                }
                EventField::Cat => ev.cat = m.next_value_seed(CatSeed)?,
                EventField::Name => ev.name = Some(m.next_value_seed(InternSeed(self.0))?),
                EventField::Pid => ev.pid = m.next_value::<Id>()?.0,
                EventField::Tid => ev.tid = m.next_value::<Id>()?.0,
                // Kept raw: the collector judges the values (crate::trace::plausible) and counts the bad ones.
                EventField::Ts => {
                    ev.keyed = true;
                    ev.ts = m.next_value::<Num>()?.0
                }
                EventField::Dur => ev.dur = m.next_value::<Num>()?.0,
                EventField::Id => ev.id = m.next_value::<Id>()?.0,
                EventField::Args => ev.args = m.next_value_seed(ArgsSeed)?,
                EventField::Other => {
                    m.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Some(ev))
    }
    skip_non_map!(Option<RawEvent>);
    skip_str!(Option<RawEvent>);
}

enum EventField {
    Ph,
    Cat,
    Name,
    Pid,
    Tid,
    Ts,
    Dur,
    Id,
    Args,
    Other,
}

impl<'de> de::Deserialize<'de> for EventField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = EventField;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E>(self, v: &str) -> Result<EventField, E> {
                Ok(match v {
                    "ph" => EventField::Ph,
                    "cat" => EventField::Cat,
                    "name" => EventField::Name,
                    "pid" => EventField::Pid,
                    "tid" => EventField::Tid,
                    "ts" => EventField::Ts,
                    "dur" => EventField::Dur,
                    "id" => EventField::Id,
                    "args" => EventField::Args,
                    _ => EventField::Other,
                })
            }
        }
        d.deserialize_identifier(V)
    }
}

/// Interns a string value without allocating when the name was seen before.
struct InternSeed<'a>(&'a mut Names);

impl<'de> DeserializeSeed<'de> for InternSeed<'_> {
    type Value = NameId;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<NameId, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for InternSeed<'_> {
    type Value = NameId;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a name")
    }
    fn visit_str<E>(self, v: &str) -> Result<NameId, E> {
        Ok(self.0.intern(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<NameId, E> {
        Ok(self.0.intern(&v.to_string()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<NameId, E> {
        Ok(self.0.intern(&v.to_string()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<NameId, E> {
        Ok(self.0.intern(&v.to_string()))
    }
    fn visit_bool<E>(self, v: bool) -> Result<NameId, E> {
        Ok(self.0.intern(if v { "true" } else { "false" }))
    }
    fn visit_unit<E>(self) -> Result<NameId, E> {
        Ok(self.0.intern(""))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<NameId, A::Error> {
        while s.next_element::<IgnoredAny>()?.is_some() {}
        Ok(self.0.intern(""))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<NameId, A::Error> {
        while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(self.0.intern(""))
    }
}

struct FirstByte;

impl<'de> DeserializeSeed<'de> for FirstByte {
    type Value = Option<u8>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<u8>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for FirstByte {
    type Value = Option<u8>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a phase letter")
    }
    fn visit_str<E>(self, v: &str) -> Result<Option<u8>, E> {
        Ok(v.bytes().next())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Option<u8>, A::Error> {
        while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    skip_non_map!(Option<u8>);
}

struct CatSeed;

impl<'de> DeserializeSeed<'de> for CatSeed {
    type Value = Cat;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Cat, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for CatSeed {
    type Value = Cat;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a category")
    }
    fn visit_str<E>(self, v: &str) -> Result<Cat, E> {
        Ok(classify_cat(v))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Cat, A::Error> {
        while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Cat::Other)
    }
    skip_non_map!(Cat);
}

struct ArgsSeed;

impl<'de> DeserializeSeed<'de> for ArgsSeed {
    type Value = Option<RawArgs>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ArgsSeed {
    type Value = Option<RawArgs>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an args object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
        let mut a = RawArgs::default();
        while let Some(key) = m.next_key::<ArgField>()? {
            match key {
                ArgField::ExtId => a.ext_id = m.next_value::<Id>()?.0.unwrap_or(NO_ID),
                ArgField::Correlation => a.correlation = m.next_value::<Id>()?.0.unwrap_or(NO_ID),
                ArgField::Seq => a.seq = m.next_value::<Id>()?.0.unwrap_or(NO_ID),
                ArgField::Device => a.device = m.next_value::<Id>()?.0.unwrap_or(-1),
                ArgField::Grid => {
                    let d = m.next_value::<super::lenient::Dims>()?.0;
                    a.grid = d.filter(|g| g.len() == 3).map(|g| [g[0], g[1], g[2]]);
                }
                ArgField::Dims => a.dims = m.next_value()?,
                ArgField::Types => a.types = m.next_value()?,
                ArgField::Concrete => a.concrete = m.next_value()?,
                ArgField::Strides => a.strides = m.next_value()?,
                ArgField::Other => {
                    m.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Some(a))
    }
    skip_non_map!(Option<RawArgs>);
    skip_str!(Option<RawArgs>);
}

enum ArgField {
    ExtId,
    Correlation,
    Seq,
    Device,
    Grid,
    Dims,
    Types,
    Concrete,
    Strides,
    Other,
}

impl<'de> de::Deserialize<'de> for ArgField {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ArgField;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E>(self, v: &str) -> Result<ArgField, E> {
                Ok(match v {
                    "External id" => ArgField::ExtId,
                    "correlation" => ArgField::Correlation,
                    "Sequence number" => ArgField::Seq,
                    "device" => ArgField::Device,
                    "grid" => ArgField::Grid,
                    "Input Dims" => ArgField::Dims,
                    "Input type" => ArgField::Types,
                    "Concrete Inputs" => ArgField::Concrete,
                    "Input Strides" => ArgField::Strides,
                    _ => ArgField::Other,
                })
            }
        }
        d.deserialize_identifier(V)
    }
}

/// `deviceProperties`: a list of objects with `id`, `name`, `numSms`.
#[derive(Default)]
pub(crate) struct DeviceList(pub(crate) Vec<DeviceProps>);

impl<'de> de::Deserialize<'de> for DeviceList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DeviceListVisitor)
    }
}

struct DeviceListVisitor;

impl<'de> Visitor<'de> for DeviceListVisitor {
    type Value = DeviceList;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of devices")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<DeviceList, A::Error> {
        let mut out = Vec::new();
        while let Some(dev) = s.next_element::<DeviceEntry>()? {
            if let Some(d) = dev.0 {
                out.push(d);
            }
        }
        Ok(DeviceList(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<DeviceList, A::Error> {
        while m.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(DeviceList::default())
    }
    fn visit_str<E>(self, _: &str) -> Result<DeviceList, E> {
        Ok(DeviceList::default())
    }
    fn visit_i64<E>(self, _: i64) -> Result<DeviceList, E> {
        Ok(DeviceList::default())
    }
    fn visit_u64<E>(self, _: u64) -> Result<DeviceList, E> {
        Ok(DeviceList::default())
    }
    fn visit_f64<E>(self, _: f64) -> Result<DeviceList, E> {
        Ok(DeviceList::default())
    }
    fn visit_bool<E>(self, _: bool) -> Result<DeviceList, E> {
        Ok(DeviceList::default())
    }
    fn visit_unit<E>(self) -> Result<DeviceList, E> {
        Ok(DeviceList::default())
    }
}

#[derive(Default)]
struct DeviceEntry(Option<DeviceProps>);

impl<'de> de::Deserialize<'de> for DeviceEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DeviceEntryVisitor)
    }
}

struct DeviceEntryVisitor;

impl<'de> Visitor<'de> for DeviceEntryVisitor {
    type Value = DeviceEntry;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a device object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<DeviceEntry, A::Error> {
        let mut d = DeviceProps::default();
        while let Some(k) = m.next_key::<super::lenient::Str>()? {
            match k.0.as_str() {
                "id" => d.id = m.next_value::<Id>()?.0.unwrap_or(0),
                "name" => d.name = m.next_value::<Str>()?.0,
                "numSms" => d.num_sms = m.next_value::<Id>()?.0,
                _ => {
                    m.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(DeviceEntry(Some(d)))
    }
    skip_non_map!(DeviceEntry);
    skip_str!(DeviceEntry);
}
