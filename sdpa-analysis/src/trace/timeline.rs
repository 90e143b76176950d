//! The per-layer timeline: every attention call as a span on the row of the layer (module instance) that made
//! it, for the page's timeline (`sdpa analyze --html`).
//!
//! A call is placed at its op's start on the CPU clock (the SDPA op, or the first matmul of an eager chain;
//! backward calls on the autograd thread's op; a kernel found with no op above it at the kernel's own start,
//! which kineto records on the same clock), measured from the first attention call of the same input file,
//! and is as long as its GPU time: the trace ties kernels to ops, so the CPU start orders calls exactly while
//! the GPU time says how much each cost. Rows are layers in the order they first ran; calls without module
//! frames get one row per kind, pass and backend. At most [`MAX_SPANS`] spans are kept (the first in time);
//! the rest are counted in [`Timeline::left_out`], so the report stays bounded on long serving traces.

use crate::trace::attention::AttentionCall;
use serde::Serialize;
use std::collections::HashMap;

/// Most spans a timeline keeps.
pub const MAX_SPANS: usize = 20_000;

/// Attention calls by layer and time.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Timeline {
    /// Row labels: the module instance path (`LlamaModel_0/LlamaDecoderLayer_1/LlamaAttention_1`), prefixed
    /// with the input file when the report covers several, or `(no module) KIND PASS BACKEND`.
    pub rows: Vec<String>,
    /// The calls, in time order within each input.
    pub spans: Vec<Span>,
    /// Calls beyond [`MAX_SPANS`], not drawn.
    pub left_out: usize,
}

/// One attention call.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Span {
    /// Index of its op in the report's `attention_ops`.
    pub op: usize,
    /// Index into [`Timeline::rows`].
    pub row: usize,
    /// Index of its file in the report's `inputs`.
    pub input: usize,
    /// Start of its op on the CPU clock, µs after the first attention call of its input.
    pub start_us: f64,
    /// Its GPU time, µs.
    pub gpu_us: f64,
}

impl Timeline {
    /// True when there is nothing to draw.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Builds the timeline of `calls`, `op_of_call[i]` being call i's op and `input_of_call[i]` its file (an
    /// empty `input_of_call` gives an empty timeline: calls that are not placed in time, as TraceLens rows).
    pub fn build(calls: &[AttentionCall], op_of_call: &[usize], input_of_call: &[usize], inputs: &[String]) -> Self {
        if input_of_call.len() != calls.len() || op_of_call.len() != calls.len() {
            return Timeline::default();
        }
        let mut first: HashMap<usize, f64> = HashMap::new();
        for (c, &input) in calls.iter().zip(input_of_call) {
            let t = first.entry(input).or_insert(c.at.1);
            *t = t.min(c.at.1);
        }
        let mut order: Vec<usize> = (0..calls.len()).collect();
        order.sort_by(|&a, &b| {
            let ka = (input_of_call[a], calls[a].at.1 - first[&input_of_call[a]]);
            let kb = (input_of_call[b], calls[b].at.1 - first[&input_of_call[b]]);
            ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1))
        });
        let several = inputs.len() > 1;
        let mut rows: Vec<String> = Vec::new();
        let mut row_of: HashMap<String, usize> = HashMap::new();
        let mut spans = Vec::with_capacity(order.len().min(MAX_SPANS));
        for &i in order.iter().take(MAX_SPANS) {
            let c = &calls[i];
            let input = input_of_call[i];
            let layer = if c.module.is_empty() {
                format!("(no module) {} {} {}", c.kind.name(), c.phase.name(), c.backend.name())
            } else {
                c.module.join("/")
            };
            let label = match inputs.get(input).filter(|_| several) {
                Some(f) => format!("{}: {layer}", file_name(f)),
                None => layer,
            };
            let row = match row_of.get(&label) {
                Some(&r) => r,
                None => {
                    rows.push(label.clone());
                    row_of.insert(label, rows.len() - 1);
                    rows.len() - 1
                }
            };
            spans.push(Span { op: op_of_call[i], row, input, start_us: c.at.1 - first[&input], gpu_us: c.gpu_us });
        }
        Timeline { rows, spans, left_out: calls.len().saturating_sub(MAX_SPANS) }
    }

    /// The latest end (start + GPU time) of any span, µs.
    pub fn end_us(&self) -> f64 {
        self.spans.iter().fold(0.0, |a, s| a.max(s.start_us + s.gpu_us))
    }
}

fn file_name(path: &str) -> &str {
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}
