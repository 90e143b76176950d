//! The CUDA attention backend (issue 4 builds it).
