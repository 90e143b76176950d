//! Prints every kernel program the launchers can ask for, one per line: name, family (the `.cu` file) and
//! the instantiation line appended to the family's source (empty for a module compiled whole). For kernel
//! authors and the study scripts that compile a family outside the crate (`dev/kernel_resources.py`,
//! `dev/fa1_nvrtc_report.py` take these lines in `SDPA_INSTANTIATE`):
//!
//!     cargo run -q -p sdpa-cuda --example programs | grep '^fa2_bf16_128_'

fn main() {
    for p in sdpa_cuda::kernels::all_programs() {
        println!("{}\t{}\t{}", p.name, p.module.name, p.instantiation);
    }
}
