//! Reading PyTorch profiler (kineto) traces: the byte [`source`], the streaming [`parse`]r, tolerant
//! field readers ([`lenient`]) and the compact [`model`] they fill.

pub mod lenient;
pub mod model;
pub mod parse;
pub mod scan;
pub mod source;

pub use model::*;
pub use parse::{parse_file, parse_file_reference, parse_file_with_progress};
pub use scan::Progress;
