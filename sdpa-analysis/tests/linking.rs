//! Kernel-to-op linking on small hand-built traces: the External id and flow fallbacks, and CUDA graph
//! replays (every kernel of the graph carries the `cudaGraphLaunch`'s correlation id).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::write_trace as write;
use sdpa_analysis::trace::attention::{detect, AttnBackend, Phase};
use sdpa_analysis::trace::kineto::parse_file;
use sdpa_analysis::trace::tree::OpTree;
use sdpa_analysis::{analyze_path, Options};

#[test]
fn external_id_links_when_there_is_no_correlation() {
    let p = write(
        "ext",
        r#"{"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1, "ts": 10, "dur": 10, "args": {"External id": 5}},
           {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 30, "dur": 4, "args": {"External id": 5}}"#,
    );
    let t = parse_file(&p).unwrap();
    let tree = OpTree::build(&t);
    assert_eq!((tree.links.by_external_id, tree.links.unlinked), (1, 0));
    assert_eq!(tree.incl_gpu_us[0], 4.0);
}

#[test]
fn flow_arrows_link_when_ids_are_missing() {
    let p = write(
        "flow",
        r#"{"ph": "X", "cat": "cpu_op", "name": "aten::mul", "pid": 1, "tid": 1, "ts": 100, "dur": 10},
           {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 101, "dur": 2, "args": {"correlation": 77}},
           {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 9, "pid": 1, "tid": 1, "ts": 101},
           {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 9, "pid": 0, "tid": 7, "ts": 150, "bp": "e"},
           {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 150, "dur": 3, "args": {}}"#,
    );
    let t = parse_file(&p).unwrap();
    let tree = OpTree::build(&t);
    assert_eq!((tree.links.by_flow, tree.links.unlinked), (1, 0));
    assert_eq!(tree.incl_gpu_us[0], 3.0);
}

#[test]
fn cuda_graph_replays_are_attributed_and_their_attention_kernels_found() {
    // A graph replayed from one op: two flash forward kernels, one flash backward kernel and a GEMM, all
    // with the cudaGraphLaunch's correlation id. No SDPA op is on the CPU side at replay time.
    let p = write(
        "graph",
        r#"{"ph": "X", "cat": "cpu_op", "name": "CUDAGraph::replay", "pid": 1, "tid": 1, "ts": 100, "dur": 50},
           {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1, "ts": 110, "dur": 20, "args": {"correlation": 50}},
           {"ph": "X", "cat": "kernel", "name": "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", "pid": 0, "tid": 7, "ts": 200, "dur": 30, "args": {"correlation": 50, "grid": [8, 16, 2]}},
           {"ph": "X", "cat": "kernel", "name": "nvjet_sm90_tst_128x64_64x8_1x2_h_bz_NNT", "pid": 0, "tid": 7, "ts": 240, "dur": 10, "args": {"correlation": 50}},
           {"ph": "X", "cat": "kernel", "name": "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", "pid": 0, "tid": 7, "ts": 260, "dur": 30, "args": {"correlation": 50}},
           {"ph": "X", "cat": "kernel", "name": "void pytorch_flash::flash_bwd_dq_dk_dv_loop_kernel<>", "pid": 0, "tid": 7, "ts": 300, "dur": 70, "args": {"correlation": 50}}"#,
    );
    let t = parse_file(&p).unwrap();
    let tree = OpTree::build(&t);
    assert_eq!((tree.links.by_correlation, tree.links.graph_kernels), (4, 4));
    assert_eq!(tree.incl_gpu_us[0], 140.0, "all graph kernels belong to the replaying op");
    let calls = detect(&tree);
    assert_eq!(calls.len(), 3);
    assert!(calls.iter().all(|c| c.backend == AttnBackend::Flash && c.shape.is_none()));
    assert_eq!(calls.iter().filter(|c| c.phase == Phase::Fwd).count(), 2);
    assert_eq!(calls.iter().filter(|c| c.phase == Phase::Bwd).count(), 1);
    assert!(calls[0].notes[0].contains("CUDA graph"));
    let r = analyze_path(&p, &Options::default()).unwrap();
    assert_eq!(r.summary.attention_time_us, 130.0);
    assert_eq!(r.summary.total_gpu_time_us, 140.0);
    assert_eq!(r.attention_ops.iter().map(|o| o.count).sum::<usize>(), 3);
}
