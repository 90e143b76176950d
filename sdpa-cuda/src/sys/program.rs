//! One NVRTC program per kernel instantiation: what a call needs is compiled on its own, in about a second,
//! instead of the whole family's module (every dtype x head dim x tile x mask) before the first call.
//!
//! A family's `.cu` file holds templates and an entry macro (`FA2_ENTRY(NAME, T, D, ...)`) but no list of
//! entries. A [`Program`] is that file included as a header plus a thin instantiation, one macro line
//! built by the family's launcher from the same table the launcher plans with, so the tiles are written
//! once (in Rust) and a launch can only ask for an entry some program defines. Small modules whose entries
//! are plain functions (`unfused`, `l2_flush`) are compiled whole ([`Program::whole`]).

use crate::sys::modules::ModuleSource;
use sdpa_core::DType;

/// One compilation unit: a module's source and, for a family, the instantiation that defines one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    /// The family (or whole) module.
    pub module: &'static ModuleSource,
    /// Unique label: the entry point for an instantiation, the module name for a whole module. Names the
    /// cache file and the errors.
    pub name: String,
    /// The lines after `#include "{module}.cu"`; empty for a whole module.
    pub instantiation: String,
}

impl Program {
    /// The module compiled as it is, with the entry points its source defines.
    pub fn whole(module: &'static ModuleSource) -> Self {
        Program { module, name: module.name.to_string(), instantiation: String::new() }
    }

    /// Entry point `entry` of a family, defined by `instantiation` (a macro line of the family's `.cu`).
    pub fn entry(module: &'static ModuleSource, entry: impl Into<String>, instantiation: impl Into<String>) -> Self {
        Program { module, name: entry.into(), instantiation: instantiation.into() }
    }

    /// Whether this is a whole module rather than one instantiation.
    pub fn is_whole(&self) -> bool {
        self.instantiation.is_empty()
    }

    /// The source handed to NVRTC: the module itself, or an include of it plus the instantiation.
    pub fn source(&self) -> String {
        if self.is_whole() {
            self.module.source.to_string()
        } else {
            format!("#include \"{}\"\n{}\n", self.header_name(), self.instantiation)
        }
    }

    /// The name the family source is included under.
    pub fn header_name(&self) -> String {
        format!("{}.cu", self.module.name)
    }

    /// The file name NVRTC reports errors against.
    pub fn file_name(&self) -> String {
        format!("{}.cu", self.name)
    }
}

/// The C++ element type of an entry for `dtype`, as the kernels' templates take it.
pub fn cuda_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float",
        DType::F16 => "__half",
        DType::BF16 => "__nv_bfloat16",
        // The E4M3 tag of `fa3` (kernels/fa3_fp8.cuh), the one family that takes FP8 inputs.
        DType::F8E4M3 => "sdpa_e4m3",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::modules::{FA2, UNFUSED};

    #[test]
    fn an_instantiation_includes_its_family_and_adds_one_line() {
        let p = Program::entry(&FA2, "fa2_bf16_128_none", "FA2_ENTRY(fa2_bf16_128_none, __nv_bfloat16)");
        assert_eq!(p.source(), "#include \"fa2.cu\"\nFA2_ENTRY(fa2_bf16_128_none, __nv_bfloat16)\n");
        assert_eq!((p.file_name(), p.is_whole()), ("fa2_bf16_128_none.cu".to_string(), false));
        let w = Program::whole(&UNFUSED);
        assert_eq!((w.name.as_str(), w.source().as_str(), w.is_whole()), ("unfused", UNFUSED.source, true));
    }
}
