//! Trace analysis (issue 6 builds it).
