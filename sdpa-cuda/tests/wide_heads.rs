//! The wide-head path (`kernels/wide.rs`: head dims above 256 on tensor cores in query slabs) against the f64
//! reference on the GPU: random data, poisoned outputs, lengths off every tile, Sq != Sk both ways, D = 264,
//! 320, 512, 576/512 (MLA with many speculative rows, and its variants), 1024 and 4096, Dv != D
//! both ways, GQA 1/2/8 and 16 heads on one kv head, every mask in both causal alignments, both layouts, with
//! and without LSE, f16 and bf16, each within twice the unfused kernel's error on the same inputs; windows,
//! softcap and ALiBi; a NaN in one query; a causal call in several slabs. `auto` must report the wide path
//! (`unfused`), never `fa1`. Run it once more with `SDPA_WIDE_SLAB_MB=1` to cut every call into many slabs
//! (and GEMM batches; the device script does). Skips (printing why) without a GPU.

mod common;

use common::{assert_nan_in_a_query_stays_in_its_row, gpu, masks, rows_for, run_spec, sh, Case};
use sdpa_core::check::check_output;
use sdpa_core::{Alibi, DType, F32Math, HostBackend, HostInputs, Kernel, Layout, Mask, Shape, Window};

const HALF: [DType; 2] = [DType::F16, DType::BF16];

fn shapes() -> Vec<Shape> {
    vec![
        sh(1, 4, 2, 77, 130, 264),
        sh(2, 2, 2, 130, 77, 320),
        sh(1, 8, 1, 65, 200, 512),
        // MLA with more rows per kv head than `auto` sends to splitkv's MLA path (tests/splitkv_mla.rs has the
        // decoding shapes): 128 heads x 3 speculative rows, and one longer sequence.
        Shape { dv: 512, ..sh(1, 128, 1, 3, 300, 576) },
        Shape { dv: 512, ..sh(1, 64, 1, 3, 3000, 576) },
        sh(2, 4, 4, 1, 700, 512),
        sh(1, 2, 2, 33, 47, 1024),
        sh(1, 2, 1, 17, 40, 4096),
        Shape { dv: 64, ..sh(1, 2, 2, 50, 60, 512) },
        Shape { dv: 320, ..sh(1, 4, 2, 50, 60, 64) },
    ]
}

#[test]
fn wide_heads_match_the_reference_and_the_unfused_error() {
    let cases = common::table(shapes(), masks, Kernel::Auto, F32Math::Exact, &HALF);
    common::run_table_vs_unfused("wide", &cases, 7000, Some(Kernel::Unfused));
}

/// Windows, softcap and ALiBi (the softmax applies them per score) at D = 512 and the MLA pair. The MLA shape
/// has 16 x 9 = 144 rows on its kv head, more than `auto` gives splitkv's MLA path
/// (`splitkv_mla::AUTO_MAX_ROWS`): with one decoding row, a window went there on sm_90 (that path takes
/// windows), and this test failed on its kernel assertion (session 21's call 4).
#[test]
fn wide_heads_take_the_variants() {
    let shapes = [sh(1, 4, 2, 77, 130, 512), Shape { dv: 512, ..sh(1, 16, 1, 9, 900, 576) }];
    let case =
        |shape| Case::new(shape, DType::BF16, Mask::CausalBottomRight, Layout::Bshd, Kernel::Auto, F32Math::Exact);
    // Checked without a GPU too: no shape here is one `auto` may give the MLA path.
    assert!(shapes.iter().all(|&s| !sdpa_cuda::kernels::splitkv_mla::auto_takes(&case(s).spec())));
    let Some(gpu) = gpu() else { return };
    for shape in shapes {
        let case = case(shape);
        let base = case.spec();
        for spec in [
            base.clone().with_window(Window::left(40)),
            base.clone().with_softcap(30.0),
            base.clone().with_alibi(Alibi::Standard),
        ] {
            let (kernel, r) = run_spec(&gpu, &case, &spec, 11);
            assert_eq!(kernel, Kernel::Unfused, "{spec:?}");
            assert!(r.pass, "{spec:?}: {r:?}");
        }
    }
}

/// A NaN in one query poisons that row only.
#[test]
fn a_nan_in_a_query_stays_in_its_row() {
    let Some(gpu) = gpu() else { return };
    for mask in [Mask::None, Mask::CausalTopLeft] {
        let case = Case::new(sh(1, 2, 1, 50, 70, 512), DType::F16, mask, Layout::Bhsd, Kernel::Auto, F32Math::Exact);
        assert_nan_in_a_query_stays_in_its_row(&gpu, &case);
    }
}

/// A causal call of 8 heads x 2000 rows x 4096 keys: two slabs of rows (at most 1024), each over the keys
/// its rows see; sampled rows against the reference.
#[test]
fn a_large_call_runs_in_slabs() {
    let Some(gpu) = gpu() else { return };
    let shape = sh(1, 8, 8, 2000, 4096, 512);
    let case = Case::new(shape, DType::BF16, Mask::CausalBottomRight, Layout::Bshd, Kernel::Auto, F32Math::Exact);
    let spec = case.spec();
    let inputs = HostInputs::random(&spec, 3).expect("valid spec");
    let run = gpu.run_host(&spec, &case.opts(), &inputs).expect("runs");
    assert_eq!(run.kernel, Kernel::Unfused);
    let r = check_output(&spec, &inputs, &run.output, F32Math::Exact, rows_for(&shape)).expect("checks");
    assert!(r.pass, "{r:?}");
}
