//! Prints the attention calls found in a trace (debugging aid): `cargo run -p sdpa-analysis --example 01_attention_calls -- TRACE`.
fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: 01_attention_calls TRACE");
        std::process::exit(2);
    };
    let trace = match sdpa_analysis::trace::kineto::parse_file(std::path::Path::new(&path)) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    let tree = sdpa_analysis::trace::tree::OpTree::build(&trace);
    println!("events {} ops {} gpu {} links {:?}", trace.stats.events, trace.ops.len(), trace.gpu.len(), tree.links);
    for c in sdpa_analysis::trace::attention::detect(&tree) {
        println!(
            "{:?} {:?} {:?} {} {:?} {:?} {:?} {:?} {:.1}us grid {:?} parts {:?} notes {:?}",
            c.kind,
            c.phase,
            c.backend,
            c.op,
            c.module.last(),
            c.shape,
            c.dtype,
            c.mask,
            c.gpu_us,
            c.grid_blocks,
            c.parts.iter().map(|p| (p.role, p.gpu_us)).collect::<Vec<_>>(),
            c.notes
        );
    }
}
