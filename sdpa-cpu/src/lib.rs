//! The CPU attention backend (issue 3 builds it).
