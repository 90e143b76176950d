//! candle integration (issue 8 builds it).
