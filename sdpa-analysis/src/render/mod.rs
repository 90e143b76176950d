//! What both faces' pages share: HTML escaping, tables and the page frame ([`html`]), markdown tables
//! ([`markdown`]), and the SVG canvas
//! (frame, axes labels, legend, ticks, palette: [`svg`]). `sdpa report`'s page ([`crate::results::page`]) and
//! `sdpa analyze --html` ([`crate::trace::printers::html`]) draw with the same pieces, so both read alike and
//! escape the same way.

pub mod html;
pub mod markdown;
pub mod svg;

pub use html::esc;
