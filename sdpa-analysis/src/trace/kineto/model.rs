//! The compact in-memory form of a trace: only what the analysis needs, with names interned and operator
//! arguments kept only for the operators attention detection looks at. One copy of the events, never the
//! JSON document.

use std::collections::HashMap;
use std::path::PathBuf;

/// Index into [`Names`].
pub type NameId = u32;

/// Sentinel for "no id" in integer id fields (`External id`, `correlation`, sequence numbers).
pub const NO_ID: i64 = i64::MIN;

/// Interned event names: kernel names are long and repeat thousands of times.
#[derive(Debug, Default)]
pub struct Names {
    map: HashMap<Box<str>, NameId>,
    list: Vec<Box<str>>,
}

impl Names {
    /// The id of `s`, adding it when new.
    pub fn intern(&mut self, s: &str) -> NameId {
        if let Some(&id) = self.map.get(s) {
            return id;
        }
        let id = self.list.len() as NameId;
        self.list.push(s.into());
        self.map.insert(s.into(), id);
        id
    }

    /// The name of an id ("" for an id this table never gave out).
    pub fn get(&self, id: NameId) -> &str {
        self.list.get(id as usize).map(|s| &**s).unwrap_or("")
    }

    /// Number of distinct names.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// True when no name was interned.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

/// Shapes, dtypes and literal values PyTorch recorded for an operator (`record_shapes=True`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OpArgs {
    /// `Input Dims`: one entry per input; `None` for inputs that are not a plain tensor (scalars, lists).
    pub dims: Vec<Option<Vec<i64>>>,
    /// `Input type`: e.g. `c10::BFloat16`, `float`, `Scalar`, `""`.
    pub types: Vec<String>,
    /// `Concrete Inputs`: literal scalar arguments as PyTorch printed them (`True`, `0.125`, `""`).
    pub concrete: Vec<String>,
    /// `Input Strides`, like `dims`.
    pub strides: Vec<Option<Vec<i64>>>,
}

impl OpArgs {
    /// Dims of input `i` when it is a plain tensor.
    pub fn dim(&self, i: usize) -> Option<&[i64]> {
        self.dims.get(i).and_then(|d| d.as_deref())
    }

    /// Strides of input `i` when recorded.
    pub fn stride(&self, i: usize) -> Option<&[i64]> {
        self.strides.get(i).and_then(|d| d.as_deref())
    }

    /// Concrete input `i` when non-empty.
    pub fn concrete(&self, i: usize) -> Option<&str> {
        self.concrete.get(i).map(|s| s.as_str()).filter(|s| !s.is_empty())
    }

    /// Type of input `i`.
    pub fn ty(&self, i: usize) -> Option<&str> {
        self.types.get(i).map(|s| s.as_str()).filter(|s| !s.is_empty())
    }
}

/// A CPU-side operator (`cpu_op`, `user_annotation`): a node of the op tree.
#[derive(Debug, Clone)]
pub struct CpuOp {
    /// Operator name, e.g. `aten::bmm`.
    pub name: NameId,
    /// Index into [`Trace::threads`].
    pub thread: u32,
    /// Start, µs.
    pub ts: f64,
    /// Duration, µs.
    pub dur: f64,
    /// `External id`, or [`NO_ID`].
    pub ext_id: i64,
    /// Autograd `Sequence number` (links a forward op to its backward node), or [`NO_ID`].
    pub seq: i64,
    /// Shapes and literals, kept only for operators the detectors read.
    pub args: Option<Box<OpArgs>>,
}

/// A CUDA runtime or driver call that carries a `correlation` id (kernel launches, graph launches, copies).
#[derive(Debug, Clone)]
pub struct Launch {
    /// e.g. `cudaLaunchKernel`, `cudaGraphLaunch`.
    pub name: NameId,
    /// Index into [`Trace::threads`].
    pub thread: u32,
    /// Start, µs.
    pub ts: f64,
    /// `correlation`.
    pub correlation: i64,
    /// `External id` of the enclosing op, or [`NO_ID`].
    pub ext_id: i64,
}

/// What a GPU activity is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuKind {
    /// A compute kernel.
    Kernel,
    /// A memory copy.
    Memcpy,
    /// A memory set.
    Memset,
}

/// One activity on a GPU stream.
#[derive(Debug, Clone)]
pub struct GpuActivity {
    /// Kernel name (or `Memcpy DtoD ...`).
    pub name: NameId,
    /// Kernel, copy or set.
    pub kind: GpuKind,
    /// Index into [`Trace::threads`] (the stream's row in the trace).
    pub thread: u32,
    /// Start, µs.
    pub ts: f64,
    /// Duration, µs.
    pub dur: f64,
    /// `correlation` of the launching runtime call, or [`NO_ID`].
    pub correlation: i64,
    /// `External id` of the launching op, or [`NO_ID`].
    pub ext_id: i64,
    /// `device` index, or -1.
    pub device: i64,
    /// Grid size when recorded (blocks in x, y, z).
    pub grid: Option<[i64; 3]>,
}

/// An `nn.Module` frame from a `python_function` event (`with_stack` / `with_modules`).
#[derive(Debug, Clone)]
pub struct PyModule {
    /// e.g. `nn.Module: LlamaAttention_0`.
    pub name: NameId,
    /// Index into [`Trace::threads`].
    pub thread: u32,
    /// Start, µs.
    pub ts: f64,
    /// Duration, µs.
    pub dur: f64,
}

/// One end of an `ac2g` flow arrow (host launch -> GPU activity).
#[derive(Debug, Clone, Copy)]
pub struct FlowEnd {
    /// Flow id (kineto uses the correlation id).
    pub id: i64,
    /// Index into [`Trace::threads`].
    pub thread: u32,
    /// Time of the end point, µs.
    pub ts: f64,
}

/// A GPU from the trace's `deviceProperties`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceProps {
    /// Device index.
    pub id: i64,
    /// Name as the driver reports it.
    pub name: String,
    /// Streaming multiprocessors, when recorded.
    pub num_sms: Option<i64>,
}

/// What the profiler was asked to record (top-level trace fields); `None` when the field is absent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordFlags {
    /// `record_shapes`.
    pub record_shapes: Option<bool>,
    /// `with_stack`.
    pub with_stack: Option<bool>,
    /// `with_modules`.
    pub with_modules: Option<bool>,
}

/// The trace's `distributedInfo` (PyTorch writes it when a process group exists): which rank recorded it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DistributedInfo {
    /// `rank`, when recorded as an integer.
    pub rank: Option<i64>,
    /// `world_size`, when recorded as an integer.
    pub world_size: Option<i64>,
}

impl DistributedInfo {
    /// Reads the field's JSON value; anything but an object with integer `rank` / `world_size` reads as unknown.
    pub fn from_json(v: &serde_json::Value) -> Self {
        let int = |k: &str| v.get(k).and_then(serde_json::Value::as_i64);
        DistributedInfo { rank: int("rank"), world_size: int("world_size") }
    }
}

/// Counters of the parse.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParseStats {
    /// Events in `traceEvents`.
    pub events: u64,
    /// Elements of `traceEvents` that were not objects (skipped).
    pub skipped: u64,
    /// Event objects with a `ph` or `ts` field: zero means the file is JSON but not a trace.
    pub recognised: u64,
    /// Decompressed JSON bytes read.
    pub bytes: u64,
    /// The file was gzip-compressed.
    pub gzip: bool,
}

/// Events left out because a value lies outside physical bounds ([`crate::trace::plausible`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Implausible {
    /// The field and the kind of event, e.g. `GPU activity duration`.
    pub what: &'static str,
    /// Events left out for it.
    pub count: u64,
    /// The first such event: its name, value and what is wrong with it.
    pub example: String,
}

/// A parsed trace.
#[derive(Debug, Default)]
pub struct Trace {
    /// The file it came from.
    pub path: PathBuf,
    /// Interned names.
    pub names: Names,
    /// (pid, tid) of each thread row; strings (e.g. `"Spans"`) are hashed into negative numbers.
    pub threads: Vec<(i64, i64)>,
    /// CPU operators, in file order.
    pub ops: Vec<CpuOp>,
    /// Runtime calls with a correlation id.
    pub launches: Vec<Launch>,
    /// GPU kernels, copies and sets.
    pub gpu: Vec<GpuActivity>,
    /// `nn.Module` frames.
    pub modules: Vec<PyModule>,
    /// Start points of `ac2g` flows.
    pub flow_starts: Vec<FlowEnd>,
    /// End points of `ac2g` flows.
    pub flow_ends: Vec<FlowEnd>,
    /// `deviceProperties`.
    pub devices: Vec<DeviceProps>,
    /// Top-level record flags.
    pub flags: RecordFlags,
    /// `distributedInfo`, when the trace has one.
    pub distributed: Option<DistributedInfo>,
    /// CPU ops that carried `Input Dims` (whether or not their args were kept): zero means the trace was
    /// recorded without shapes.
    pub ops_with_shapes: u64,
    /// Number of `python_function` events (module frames or not): tells "no stacks" from "no modules".
    pub python_events: u64,
    /// Parse counters.
    pub stats: ParseStats,
    /// Events left out as implausible (a duration of 1.7e308 µs, a NaN timestamp), one entry per kind.
    pub implausible: Vec<Implausible>,
}
