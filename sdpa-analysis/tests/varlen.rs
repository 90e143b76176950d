//! Varlen and paged attention in traces (issue 23): packed batches (FlashAttention's `cu_seqlens`, PyTorch's
//! nested tensors and `varlen_attn`) and paged KV caches (vLLM, FlashInfer, FlashAttention's `block_table`).
//!
//! The real trace `tests/fixtures/varlen_bf16.json.gz` is recorded on the H100 by
//! `tests/fixtures/record_varlen.py`, whose `.meta.json` holds every call's true lengths; its test is skipped,
//! with the reason printed, while the file is absent. The vLLM and FlashInfer traces here are synthetic (no
//! such package runs on the device machine): small hand-built traces whose op and kernel names and argument
//! positions are the libraries' own, as cited in `src/trace/attention/signature.rs` (vLLM's
//! `csrc/torch_bindings.cpp`, `csrc/attention/paged_attention_v*.cu`, `csrc/cache_kernels.cu`; FlashInfer's
//! `include/flashinfer/attention/{decode,prefill}.cuh` and `page.cuh`; flash-attn's
//! `flash_attn/flash_attn_interface.py`). Expected work comes from closed forms written out here.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::analyze;
use sdpa_analysis::trace::attention::{AttnBackend, BatchLayout, Ragged, WorkBound};
use sdpa_analysis::trace::printers::{csv, markdown, text};
use sdpa_analysis::trace::report::AttentionOp;
use sdpa_analysis::{analyze_path, Options, TraceReport};
use sdpa_core::cost::pairs_per_head;
use sdpa_core::Mask;
use std::path::PathBuf;

/// A CPU op: its name, its `args` object, and the kernels it launched (name, µs).
type Op<'a> = (&'a str, &'a str, &'a [(&'a str, f64)]);

/// CPU ops, each with its kernels, one after the other on one thread; kernels linked by correlation.
fn ops(list: &[Op<'_>]) -> String {
    let mut ev = Vec::new();
    let mut corr = 0;
    for (i, (name, args, kernels)) in list.iter().enumerate() {
        let ts = 100.0 + 1000.0 * i as f64;
        ev.push(format!(
            r#"{{"ph": "X", "cat": "cpu_op", "name": "{name}", "pid": 1, "tid": 1, "ts": {ts}, "dur": 500, "args": {args}}}"#
        ));
        for (k, (kernel, us)) in kernels.iter().enumerate() {
            corr += 1;
            let at = ts + 10.0 + k as f64;
            ev.push(format!(
                r#"{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": {at}, "dur": 1, "args": {{"correlation": {corr}}}}},
                   {{"ph": "X", "cat": "kernel", "name": "{kernel}", "pid": 0, "tid": 7, "ts": {}, "dur": {us}, "args": {{"correlation": {corr}}}}}"#,
                at + 100.0
            ));
        }
    }
    ev.join(",\n")
}

fn only_op(r: &TraceReport) -> &AttentionOp {
    assert_eq!(r.attention_ops.len(), 1, "{:#?}", r.attention_ops);
    &r.attention_ops[0]
}

/// `flash_attn::_flash_attn_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
/// dropout_p, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, return_softmax,
/// block_table)`: Input Dims and Concrete Inputs of one call.
fn fa_varlen_args(q: &str, k: &str, b: usize, max_q: usize, max_k: usize, causal: bool, block_table: &str) -> String {
    format!(
        r#"{{"Input Dims": [{q}, {k}, {k}, [{n}], [{n}], [], [], [], [], [], [], [], [], [], [], {block_table}],
        "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "int", "int", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "", "Scalar", "int"],
        "Concrete Inputs": ["", "", "", "", "", "{max_q}", "{max_k}", "0.0", "0.08838834764831845", "{c}", "-1", "-1", "0.0", "", "False", ""]}}"#,
        n = b + 1,
        c = if causal { "True" } else { "False" }
    )
}

#[test]
fn flash_attn_varlen_with_unequal_lengths_is_a_stated_lower_bound() {
    // Five sequences of 128, 2000, 7, 8192 and 1 tokens: the trace shows B = 5, T = 10328 and the longest, 8192.
    let lengths = [128usize, 2000, 7, 8192, 1];
    let t: usize = lengths.iter().sum();
    let args = fa_varlen_args(&format!("[{t}, 16, 128]"), &format!("[{t}, 4, 128]"), 5, 8192, 8192, true, "[]");
    let trace = ops(&[("flash_attn::_flash_attn_varlen_forward", &args, &[("void flash::flash_fwd_kernel<>", 900.0)])]);
    let r = analyze("fa-varlen", &trace);
    let op = only_op(&r);
    assert_eq!((op.backend, op.layout, op.work), (AttnBackend::FlashAttn, BatchLayout::Varlen, WorkBound::LowerBound));
    assert_eq!(
        op.ragged,
        Some(Ragged { sequences: 5, total_q: t, max_q: 8192, total_k: Some(t), max_k: 8192, page_size: None })
    );
    assert_eq!(op.mask, "causal-br");
    // Σ s(s+1)/2 >= (T²/B + T)/2 (Cauchy-Schwarz), 16 query heads, D + Dv = 256.
    let tf = t as f64;
    assert_eq!(op.flops, Some(2.0 * 16.0 * (tf * tf / 5.0 + tf) / 2.0 * 256.0));
    let truth: u128 = lengths.iter().map(|&s| pairs_per_head(s, s, &Mask::CausalBottomRight)).sum();
    assert!(op.flops.unwrap() <= 2.0 * 16.0 * truth as f64 * 256.0, "a lower bound never exceeds the truth");
    // Bytes are exact from the totals: Q and O with 16 heads, K and V with 4.
    assert_eq!(op.bytes, Some((tf * 16.0 * 256.0 + tf * 4.0 * 256.0) * 2.0));
    assert!(op.work_why.as_deref().unwrap().contains("Cauchy-Schwarz"));
    // No exact replay, and each finding about the op says why.
    for f in r.findings.iter().filter(|f| f.op_index == Some(0) && !f.title.starts_with("Attention is")) {
        assert!(f.replay.is_none(), "{}", f.title);
        assert!(f.replay_note.as_deref().unwrap().contains("no exact replay"), "{:?}", f.replay_note);
    }
    assert!(r.findings.iter().all(|f| f.replay.is_none()));
}

#[test]
fn nested_tensor_flash_with_equal_lengths_is_exact_and_replays_with_seqlens() {
    // aten::_flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
    // return_debug_mask): what nested tensors and varlen_attn call; four sequences of 512 tokens.
    let args = r#"{"Input Dims": [[2048, 8, 128], [2048, 8, 128], [2048, 8, 128], [5], [5], [], [], [], [], []],
        "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "int", "int", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar"],
        "Concrete Inputs": ["", "", "", "", "", "512", "512", "0.0", "True", "False"]}"#;
    let trace = ops(&[(
        "aten::_flash_attention_forward",
        args,
        &[("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", 200.0)],
    )]);
    let r = analyze("njt-uniform", &trace);
    let op = only_op(&r);
    assert_eq!((op.backend, op.layout, op.work), (AttnBackend::Flash, BatchLayout::Varlen, WorkBound::Exact));
    assert_eq!(op.shape_label(), "4,8,8,512,512,128");
    assert_eq!(op.mask, "causal-br", "PyTorch's flash kernel aligns causal bottom-right in each sequence");
    assert_eq!(op.flops, Some(2.0 * 8.0 * 4.0 * (512.0 * 513.0 / 2.0) * 256.0));
    let replay = r.findings.iter().find_map(|f| f.replay.as_ref()).unwrap();
    assert!(replay.command.ends_with(" --seqlens-q 512,512,512,512 --seqlens-k 512,512,512,512"), "{}", replay.command);
    assert!(replay.command.contains("--shape 4,8,8,512,512,128"), "{}", replay.command);
    assert!(replay.note.as_deref().unwrap().contains("exact lengths"));
    // A dense call of the same op keeps its old reading (no offsets: None is recorded with no dims).
    let dense = r#"{"Input Dims": [[4, 512, 8, 128], [4, 512, 8, 128], [4, 512, 8, 128], [], [], [], [], [], [], []],
        "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "", "", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar"],
        "Concrete Inputs": ["", "", "", "", "", "512", "512", "0.0", "False", "False"]}"#;
    let r = analyze(
        "flash-dense",
        &ops(&[("aten::_flash_attention_forward", dense, &[("void pytorch_flash::flash_fwd_kernel<>", 200.0)])]),
    );
    assert_eq!((only_op(&r).layout, only_op(&r).ragged), (BatchLayout::Dense, None));
}

#[test]
fn a_packed_call_under_a_dense_looking_sdpa_op_is_read_as_packed() {
    // Should a nested tensor's SDPA op record its padded view [B, H, max, D], the packed call below it is what
    // ran: its batch wins over the view.
    let sdpa = r#"{"Input Dims": [[4, 8, 1500, 128], [4, 8, 1500, 128], [4, 8, 1500, 128], [], [], [], [], []],
        "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "", "Scalar", "Scalar", "Scalar", "Scalar"],
        "Concrete Inputs": ["", "", "", "", "0.", "False", "", "False"]}"#;
    let flash = r#"{"Input Dims": [[2863, 8, 128], [2863, 8, 128], [2863, 8, 128], [5], [5], [], [], [], [], []],
        "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "int", "int", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar"],
        "Concrete Inputs": ["", "", "", "", "", "1500", "1500", "0.0", "False", "False"]}"#;
    let ev = format!(
        r#"{{"ph": "X", "cat": "cpu_op", "name": "aten::scaled_dot_product_attention", "pid": 1, "tid": 1, "ts": 100, "dur": 100, "args": {sdpa}}},
           {{"ph": "X", "cat": "cpu_op", "name": "aten::_flash_attention_forward", "pid": 1, "tid": 1, "ts": 110, "dur": 50, "args": {flash}}},
           {{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 120, "dur": 1, "args": {{"correlation": 1}}}},
           {{"ph": "X", "cat": "kernel", "name": "void pytorch_flash::flash_fwd_kernel<>", "pid": 0, "tid": 7, "ts": 300, "dur": 250, "args": {{"correlation": 1}}}}"#
    );
    let r = analyze("njt-under-sdpa", &ev);
    let op = only_op(&r);
    assert_eq!((op.layout, op.op.as_str()), (BatchLayout::Varlen, "aten::scaled_dot_product_attention"));
    assert_eq!(op.ragged.unwrap().total_q, 2863);
}

#[test]
fn nested_tensor_efficient_path_reads_the_unit_batch() {
    // _efficient_attention_forward(query, key, value, bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
    // max_seqlen_k, dropout_p, custom_mask_type, ...): nested tensors pass Q as [1, total, H, D].
    let args = r#"{"Input Dims": [[1, 2863, 8, 128], [1, 2863, 8, 128], [1, 2863, 8, 128], [], [5], [5], [], [], [], []],
        "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "", "int", "int", "Scalar", "Scalar", "Scalar", "Scalar"],
        "Concrete Inputs": ["", "", "", "", "", "", "1500", "1500", "0.0", "0"]}"#;
    let r = analyze(
        "njt-efficient",
        &ops(&[("aten::_efficient_attention_forward", args, &[("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", 300.0)])]),
    );
    let op = only_op(&r);
    assert_eq!((op.backend, op.layout, op.work), (AttnBackend::Efficient, BatchLayout::Varlen, WorkBound::LowerBound));
    let g = op.ragged.unwrap();
    assert_eq!((g.sequences, g.total_q, g.total_k, g.max_q), (4, 2863, Some(2863), 1500));
    assert_eq!(op.mask, "none");
    assert_eq!(op.flops, Some(2.0 * 8.0 * (2863.0 * 2863.0 / 4.0) * 256.0));
}

#[test]
fn varlen_attn_decoding_one_query_per_sequence_is_exact() {
    // torch_attn::_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, ...): one query
    // for each of five sequences with 1, 4097, 333, 2048 and 1000 keys.
    let tk = 1 + 4097 + 333 + 2048 + 1000;
    let args = format!(
        r#"{{"Input Dims": [[5, 8, 128], [{tk}, 8, 128], [{tk}, 8, 128], [6], [6], [], [], [], []],
        "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "int", "int", "Scalar", "Scalar", "Scalar", ""],
        "Concrete Inputs": ["", "", "", "", "", "1", "4097", "False", ""]}}"#
    );
    let r = analyze(
        "varlen-decode",
        &ops(&[("torch_attn::_varlen_attn", &args, &[("void pytorch_flash::flash_fwd_splitkv_kernel<>", 20.0)])]),
    );
    let op = only_op(&r);
    assert_eq!((op.layout, op.work), (BatchLayout::Varlen, WorkBound::Exact), "{op:#?}");
    assert!(op.decode);
    assert_eq!(op.flops, Some(2.0 * 8.0 * tk as f64 * 256.0));
    // The work is exact but the key lengths are not known one by one: no replay, said why.
    assert!(r.findings.iter().all(|f| f.replay.is_none()));
    for f in r.findings.iter().filter(|f| f.op_index == Some(0) && !f.title.starts_with("Attention is")) {
        assert!(f.replay_note.as_deref().unwrap().contains("not each sequence's length"), "{:?}", f.replay_note);
    }
}

#[test]
fn flash_attn_block_table_is_paged_with_its_page_size() {
    // flash_attn_varlen_func(..., block_table=...): K and V are pages [num_pages, page_size, Hkv, D]. Three
    // sequences decoding one token each against caches of up to 4097 tokens in pages of 16.
    let args = fa_varlen_args("[3, 32, 128]", "[800, 16, 8, 128]", 3, 1, 4097, true, "[3, 257]");
    let r = analyze(
        "fa-paged",
        &ops(&[("flash_attn::_flash_attn_varlen_forward", &args, &[("void flash::flash_fwd_splitkv_kernel<>", 30.0)])]),
    );
    let op = only_op(&r);
    assert_eq!((op.layout, op.work), (BatchLayout::Paged, WorkBound::LowerBound));
    let g = op.ragged.unwrap();
    assert_eq!((g.sequences, g.total_k, g.page_size, g.max_k), (3, None, Some(16), 4097));
    assert_eq!((op.hq, op.hkv, op.sq, op.sk), (Some(32), Some(8), Some(1), Some(4097)));
    // At least the longest cache plus one key for each other sequence: 4097 + 2 keys.
    assert_eq!(op.flops, Some(2.0 * 32.0 * 4099.0 * 256.0));
    assert!(op.layout_label().ends_with("page 16"), "{}", op.layout_label());
}

/// vLLM's `_C::paged_attention_v2(out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache,
/// num_kv_heads, scale, block_tables, seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype, ...)`:
/// B = 32 sequences, Hq = 32, Hkv = 8, D = 128, pages of 16, the longest 32768 tokens. Synthetic.
const VLLM_V2: &str = r#"{"Input Dims": [[32, 32, 128], [32, 32, 64], [32, 32, 64], [32, 32, 64, 128], [32, 32, 128], [4096, 8, 16, 16, 8], [4096, 8, 128, 16], [], [], [32, 2048], [32], [], [], [], []],
    "Input type": ["c10::BFloat16", "float", "float", "c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar", "int", "int", "Scalar", "Scalar", "", "str"],
    "Concrete Inputs": ["", "", "", "", "", "", "", "8", "0.08838834764831845", "", "", "16", "32768", "", "auto"]}"#;

const CACHE_WRITE: &str = r#"{"Input Dims": [[32, 8, 128], [32, 8, 128], [4096, 16, 8, 128], [4096, 16, 8, 128], [32], [], [], []],
    "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "long int", "str", "float", "float"]}"#;

#[test]
fn vllm_paged_decode_is_found_with_its_cache_writes_named_beside_it() {
    let trace = ops(&[
        (
            "_C_cache_ops::reshape_and_cache_flash",
            CACHE_WRITE,
            &[("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>", 4.0)],
        ),
        (
            "_C::paged_attention_v2",
            VLLM_V2,
            &[
                ("void vllm::paged_attention_v2_kernel<__nv_bfloat16, __nv_bfloat16, 128, 16, 128, (vllm::Fp8KVCacheDataType)0, false, 512>", 300.0),
                ("void vllm::paged_attention_v2_reduce_kernel<__nv_bfloat16, 128, 128, 512>", 10.0),
            ],
        ),
    ]);
    let r = analyze("vllm-v2", &trace);
    let op = only_op(&r);
    assert_eq!((op.backend, op.layout, op.work), (AttnBackend::Vllm, BatchLayout::Paged, WorkBound::LowerBound));
    assert_eq!(op.shape_label(), "32,32,8,1,32768,128");
    assert!(op.decode);
    assert_eq!(op.total_us, 310.0, "the reduce kernel belongs to the call");
    let keys = 32768.0 + 31.0;
    assert_eq!(op.bytes, Some((32.0 * 32.0 * 256.0 + keys * 8.0 * 256.0) * 2.0));
    // Cache writes are attention-adjacent: named, timed, not attention.
    assert_eq!(r.summary.attention_time_us, 310.0);
    assert_eq!(r.summary.cache_write_time_us, 4.0);
    assert!(r.summary.cache_write_kernels[0].name.contains("reshape_and_cache_flash_kernel"));
    let f = r.findings.iter().find(|f| f.title.starts_with("Paged KV cache writes")).unwrap();
    assert!(f.title.contains("4.0 µs"), "{}", f.title);
    // Printers show the layout, the page size and the bound.
    let t = text::render(&r);
    assert!(t.contains("paged B=32 Tq=32 Tk=? max 1/32768 page 16"), "{t}");
    assert!(t.contains("work lower_bound"), "{t}");
    assert!(t.contains("attention-adjacent: KV cache writes 4.0 µs"), "{t}");
    let md = markdown::render(&r);
    assert!(md.contains("| paged B=32 Tq=32 Tk=? max 1/32768 page 16 |"), "{md}");
    assert!(md.contains("| lower_bound |"), "{md}");
    assert!(md.contains(">="), "bounded figures carry their sign: {md}");
    let c = csv::render(&r);
    let header: Vec<&str> = c.lines().next().unwrap().split(',').collect();
    let row = csv_fields(c.lines().nth(1).unwrap());
    assert_eq!(row.len(), header.len());
    let col = |name: &str| row[header.iter().position(|h| *h == name).unwrap()].as_str();
    assert_eq!((col("layout"), col("work"), col("sequences"), col("page_size")), ("paged", "lower_bound", "32", "16"));
    assert_eq!(col("total_k"), "");
    let json = serde_json::to_value(&r).unwrap();
    let o = &json["attention_ops"][0];
    assert_eq!((o["layout"].as_str(), o["work"].as_str()), (Some("paged"), Some("lower_bound")));
    assert_eq!(o["ragged"]["page_size"], 16);
    assert!(o["work_why"].as_str().unwrap().contains("paged decode"));
    assert_eq!(json["summary"]["cache_write_time_us"], 4.0);
}

/// The fields of one CSV line (RFC 4180 quoting: the kernel names hold commas).
fn csv_fields(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted, mut chars) = (Vec::new(), String::new(), false, line.chars().peekable());
    while let Some(ch) = chars.next() {
        match (ch, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(std::mem::take(&mut cur)),
            _ => cur.push(ch),
        }
    }
    out.push(cur);
    out
}

#[test]
fn vllm_v1_reads_its_own_argument_positions() {
    // paged_attention_v1(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens,
    // block_size, max_seq_len, ...). Synthetic.
    let args = r#"{"Input Dims": [[4, 16, 64], [4, 16, 64], [100, 4, 8, 32, 8], [100, 4, 64, 32], [], [], [4, 10], [4], [], [], [], []],
        "Input type": ["c10::Half", "c10::Half", "c10::Half", "c10::Half", "Scalar", "Scalar", "int", "int", "Scalar", "Scalar", "", "str"],
        "Concrete Inputs": ["", "", "", "", "4", "0.125", "", "", "32", "300", "", "auto"]}"#;
    let r = analyze(
        "vllm-v1",
        &ops(&[("_C::paged_attention_v1", args, &[("void vllm::paged_attention_v1_kernel<c10::Half>", 12.0)])]),
    );
    let op = only_op(&r);
    assert_eq!(op.shape_label(), "4,16,4,1,300,64");
    assert_eq!(op.ragged.unwrap().page_size, Some(32));
    assert_eq!(op.dtype.as_deref(), Some("f16"));
}

#[test]
fn flashinfer_kernels_without_a_known_op_are_paged_attention_of_unknown_shape() {
    // FlashInfer's ops vary with its JIT modules: the kernels alone say what ran. Synthetic.
    let trace = ops(&[(
        "serving_step",
        r#"{}"#,
        &[
            ("void flashinfer::AppendPagedKVCacheKernel<128, 8, __nv_bfloat16, int>", 3.0),
            (
                "void flashinfer::BatchDecodeWithPagedKVCacheKernel<(flashinfer::PosEncodingMode)0, 2, 2, 8, 4, 1, 4>",
                80.0,
            ),
            ("void flashinfer::BatchPrefillWithRaggedKVCacheKernel<>", 150.0),
        ],
    )]);
    let r = analyze("flashinfer", &trace);
    assert_eq!(r.attention_ops.len(), 2);
    let decode = r.attention_ops.iter().find(|o| o.layout == BatchLayout::Paged).unwrap();
    let ragged = r.attention_ops.iter().find(|o| o.layout == BatchLayout::Varlen).unwrap();
    assert_eq!((decode.backend, ragged.backend), (AttnBackend::FlashInfer, AttnBackend::FlashInfer));
    assert_eq!((decode.total_us, ragged.total_us), (80.0, 150.0));
    assert!(decode.shape().is_none() && decode.flops.is_none());
    assert_eq!(r.summary.cache_write_time_us, 3.0);
    assert_eq!(r.summary.attention_time_us, 230.0, "the append kernel is not attention");
}

#[test]
fn absurd_varlen_arguments_are_suspect_or_ignored_never_a_panic() {
    // A longest length of 10^14, a total of 2^40 tokens, a negative offset count, an unparsable maximum.
    let huge_max = fa_varlen_args("[100, 8, 64]", "[100, 8, 64]", 4, 1, 100_000_000_000_000, false, "[]");
    let huge_total = fa_varlen_args("[1099511627776, 1, 1]", "[1099511627776, 1, 1]", 4, 8, 8, false, "[]");
    let no_offsets =
        fa_varlen_args("[100, 8, 64]", "[100, 8, 64]", 4, 8, 8, false, "[]").replace("[5], [5]", "[0], [0]");
    let junk = fa_varlen_args("[100, 8, 64]", "[100, 8, 64]", 4, 8, 8, false, "[]")
        .replace("\"8\", \"8\"", "\"x\", \"1e400\"");
    let paged_junk = fa_varlen_args("[3, 8, 64]", "[7]", 3, 1, 10, false, "[3, 4]");
    for (name, args) in [
        ("huge-max", huge_max),
        ("huge-total", huge_total),
        ("no-offsets", no_offsets),
        ("junk", junk),
        ("paged-junk", paged_junk),
    ] {
        let r = analyze(
            name,
            &ops(&[("flash_attn::_flash_attn_varlen_forward", &args, &[("void flash::flash_fwd_kernel<>", 5.0)])]),
        );
        let op = only_op(&r);
        assert!(op.flops.is_none_or(f64::is_finite), "{name}");
        assert!(op.efficiency.is_none_or(|e| e.is_finite() && e < 100.0), "{name}: {:?}", op.efficiency);
        assert!(r.findings.iter().all(|f| f.replay.is_none()), "{name}: nothing absurd is replayed");
        let _ = (text::render(&r), markdown::render(&r), csv::render(&r), serde_json::to_string(&r).unwrap());
    }
    let r = analyze(
        "huge-total-again",
        &ops(&[(
            "flash_attn::_flash_attn_varlen_forward",
            &fa_varlen_args("[4294967296, 1, 1]", "[4294967296, 1, 1]", 4, 8, 8, false, "[]"),
            &[("void flash::flash_fwd_kernel<>", 5.0)],
        )]),
    );
    assert!(only_op(&r).suspect.as_deref().unwrap().contains("above 2^31"), "{:?}", only_op(&r).suspect);
}

// ---- the real trace --------------------------------------------------------------------------------------

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// The command that records the fixture on the device machine (from the repository root).
const RECORD: &str =
    "python3 sdpa-analysis/tests/fixtures/record_varlen.py \"$OUT\" (then copy varlen_bf16.json.gz and \
                      varlen_bf16.meta.json into sdpa-analysis/tests/fixtures/)";

#[test]
fn the_recorded_varlen_trace_is_read_against_its_true_lengths() {
    let (trace, meta) = (fixture("varlen_bf16.json.gz"), fixture("varlen_bf16.meta.json"));
    if !trace.exists() || !meta.exists() {
        eprintln!("skipped: {} is not recorded yet; record it on an H100 with: {RECORD}", trace.display());
        return;
    }
    let meta: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(meta).unwrap()).unwrap();
    let r = analyze_path(&trace, &Options::default()).unwrap();
    let (hq, d) = (meta["heads_q"].as_u64().unwrap() as f64, meta["head_dim"].as_u64().unwrap() as f64);
    let calls = meta["calls"].as_object().unwrap();
    assert!(!calls.is_empty(), "the recipe recorded no call");
    for (name, c) in calls {
        let lens =
            |k: &str| -> Vec<usize> { c[k].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect() };
        let (q, k) = (lens("seqlens_q"), lens("seqlens_k"));
        let causal = c["causal"].as_bool().unwrap();
        let mask = if causal { Mask::CausalBottomRight } else { Mask::None };
        let truth: u128 = q.iter().zip(&k).map(|(&sq, &sk)| pairs_per_head(sq, sk, &mask)).sum();
        let truth_flops = 2.0 * hq * truth as f64 * 2.0 * d;
        let (tq, tk) = (q.iter().sum::<usize>(), k.iter().sum::<usize>());
        let op = r
            .attention_ops
            .iter()
            .find(|o| o.ragged.is_some_and(|g| g.total_q == tq && g.total_k == Some(tk)))
            .unwrap_or_else(|| panic!("{name}: no varlen op with {tq} query and {tk} key tokens"));
        assert_eq!(op.layout, BatchLayout::Varlen, "{name}");
        let g = op.ragged.unwrap();
        assert_eq!(
            (g.sequences, g.max_q, g.max_k),
            (q.len(), *q.iter().max().unwrap(), *k.iter().max().unwrap()),
            "{name}"
        );
        assert_eq!(op.causal, Some(causal), "{name}");
        assert_eq!(op.count as u64, meta["calls_per_layer"].as_u64().unwrap(), "{name}");
        let flops = op.flops.unwrap();
        let equal = q.iter().all(|&s| s == q[0]) && k.iter().all(|&s| s == k[0]);
        match op.work {
            WorkBound::Exact => {
                assert!((flops - truth_flops).abs() <= 1e-9 * truth_flops, "{name}: {flops} vs {truth_flops}")
            }
            WorkBound::LowerBound => assert!(flops <= truth_flops && !equal, "{name}: {flops} vs {truth_flops}"),
            WorkBound::UpperBound => assert!(flops >= truth_flops, "{name}: {flops} vs {truth_flops}"),
        }
        if equal {
            assert_eq!(op.work, WorkBound::Exact, "{name}: equal lengths are exact");
        }
        match name.as_str() {
            "njt_flash" | "varlen_causal" | "varlen_uniform" | "varlen_decode" => {
                assert_eq!(op.backend, AttnBackend::Flash, "{name}")
            }
            "njt_efficient" => assert_eq!(op.backend, AttnBackend::Efficient, "{name}"),
            other => panic!("the recipe recorded a call this test does not know: {other}"),
        }
    }
}
