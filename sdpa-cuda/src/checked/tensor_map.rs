//! TMA tensor maps for sm_90 tensor copies (`cp.async.bulk.tensor`): the host describes a K or V operand
//! once per call, and a kernel then copies a whole 2-D tile of it into shared memory with one instruction.
//!
//! An operand `[B, H, S, D]` (strides in elements, head dim contiguous) becomes the 4-D tensor (D, S, H, B),
//! innermost first, read in boxes of `[keys][64]` elements (one 128-byte row per key) in the 128-byte
//! swizzle: the layout the kernels' `ldmatrix` addressing expects (`kernels/splitkv.cu`). `splitkv` also
//! reads head dims that are odd multiples of 32 columns in boxes of `[keys][32]` in the 64-byte swizzle
//! ([`BoxRow::Bytes64`], [`map_in_rows`]). Rows past `S` arrive as zeros. Layouts a tensor map cannot describe (a base or a stride not a multiple of 16 bytes,
//! a head dim that is not whole boxes) get `None`, and the caller takes a path without tensor copies.
//! [`padded_tensor_map`] takes head dims that end inside a box too: the map records the true width, and
//! TMA fills the box's columns past it with zeros (how `fa3` runs a head dim below its class).

use crate::checked::params::AttnParams;
use cudarc::driver::sys;
use sdpa_core::{AttentionSpec, DType};

/// Columns of one box: 64 two-byte elements = 128 bytes, the widest row the 128-byte swizzle takes (an
/// E4M3 operand's boxes are 128 one-byte columns: [`BoxRow::cols`]).
pub const BOX_COLS: usize = 64;

/// Bytes of one box row (one key's slice of the head dim), and with it the swizzle: the swizzle span
/// equals the row, so that 8 consecutive keys of one 16-byte column chunk fall in 8 distinct bank groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoxRow {
    /// 128-byte rows in the 128-byte swizzle (64 two-byte columns): every kernel's default.
    Bytes128,
    /// 64-byte rows in the 64-byte swizzle (32 two-byte columns): `splitkv`'s ring at D = 96.
    Bytes64,
}

impl BoxRow {
    /// Bytes of one row of a box.
    pub fn bytes(self) -> usize {
        match self {
            BoxRow::Bytes128 => 128,
            BoxRow::Bytes64 => 64,
        }
    }

    /// Columns of one box row of `dtype` (128-byte rows: 64 for f16/bf16, 128 for E4M3).
    pub fn cols(self, dtype: DType) -> usize {
        self.bytes() / dtype.size_bytes().max(1)
    }

    fn swizzle(self) -> sys::CUtensorMapSwizzle {
        match self {
            BoxRow::Bytes128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            BoxRow::Bytes64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
        }
    }
}

/// One K or V operand as the kernel sees it.
#[derive(Debug, Clone, Copy)]
pub struct KvOperand {
    /// Device address of element (0, 0, 0, 0).
    pub ptr: u64,
    /// Element type (f16, bf16 or E4M3; others have no map).
    pub dtype: DType,
    /// (B, H, S, D).
    pub dims: [usize; 4],
    /// Strides of B, H and S in elements (D is contiguous).
    pub strides: [i64; 3],
}

/// The K and V operands of a call's tensor maps and the keys of one box: dense over (D, Sk, Hkv, B); a
/// varlen call over its packed rows as one batch, `[1, Hkv, total keys, D]` (the batch stride unused, the
/// extent at least 1: a batch without keys loads none); a paged cache over its pool, `[pages, Hkv, page
/// size, D]` (the batch stride steps pages), in boxes of min(`keys_per_box`, page size) keys, one page each.
/// The maps carry the call's own head dims (`fa3` and `splitkv`'s MLA path).
pub fn kv_operands(spec: &AttentionSpec, params: &AttnParams, keys_per_box: usize) -> (KvOperand, KvOperand, usize) {
    let s = spec.shape;
    let (dims3, packed, box_keys) = match spec.ragged.as_ref() {
        None => ([s.b, s.hkv, s.sk], false, keys_per_box),
        Some(r) => match r.pages {
            Some(pg) => ([pg.num_pages, s.hkv, pg.page_size], false, keys_per_box.min(pg.page_size)),
            None => ([1, s.hkv, r.total_k().max(1)], true, keys_per_box),
        },
    };
    let op = |ptr, st: [i64; 3], w| KvOperand {
        ptr,
        dtype: spec.dtype,
        dims: [dims3[0], dims3[1], dims3[2], w],
        strides: if packed { [0, st[1], st[2]] } else { st },
    };
    (op(params.k, params.k_stride, s.d), op(params.v, params.v_stride, s.dv), box_keys)
}

/// Encodes the tensor map of `op` for boxes of `box_keys` keys x 128-byte rows ([`BOX_COLS`] two-byte
/// columns), or `None` when the head dim is not whole rows, the layout cannot be described or the driver
/// refuses it.
pub fn kv_tensor_map(op: &KvOperand, box_keys: usize) -> Option<sys::CUtensorMap> {
    map_in_rows(op, box_keys, BoxRow::Bytes128, false)
}

/// Like [`kv_tensor_map`], for a head dim `D` that need not be whole boxes: boxes reaching past `D` get
/// zeros in the columns past it. `D` must be a multiple of 8 elements (rows of whole 16-byte chunks, what
/// the callers' stores need), else `None`.
pub fn padded_tensor_map(op: &KvOperand, box_keys: usize) -> Option<sys::CUtensorMap> {
    map_in_rows(op, box_keys, BoxRow::Bytes128, true)
}

/// The map of `op` in boxes of `box_keys` keys x `row` bytes: of whole boxes ([`kv_tensor_map`]'s rule) or,
/// `padded`, of any head dim of whole 16-byte chunks ([`padded_tensor_map`]'s).
pub fn map_in_rows(op: &KvOperand, box_keys: usize, row: BoxRow, padded: bool) -> Option<sys::CUtensorMap> {
    let fits = if padded { op.dims[3].is_multiple_of(8) } else { whole_boxes(op, row) };
    if !fits {
        return None;
    }
    encode(op, box_keys, row)
}

/// Whether `op`'s rows are whole boxes of `row` bytes (f16/bf16: 64 or 32 columns).
fn whole_boxes(op: &KvOperand, row: BoxRow) -> bool {
    (op.dims[3] * op.dtype.size_bytes()).is_multiple_of(row.bytes())
}

/// Whether [`kv_tensor_map`] can describe `op` in boxes of `box_keys` keys, decided without the driver (the
/// layout rules it checks before encoding; a policy deciding which kernel takes a call asks this).
pub fn kv_describable(op: &KvOperand, box_keys: usize) -> bool {
    whole_boxes(op, BoxRow::Bytes128) && layout(op, box_keys).is_some()
}

/// The global dims and byte strides (innermost first) of `op`'s map, or `None` when no tensor map can
/// describe it: dtype, alignment, box, strides (positive multiples of 16 bytes below 2^40 for extents above
/// 1) and extents (1 to 2^32).
fn layout(op: &KvOperand, box_keys: usize) -> Option<([u64; 4], [u64; 3])> {
    if op.dtype == DType::F32 {
        return None;
    }
    let elem = op.dtype.size_bytes() as u64;
    let [b, h, s, d] = op.dims;
    if !op.ptr.is_multiple_of(16) || !(1..=256).contains(&box_keys) {
        return None;
    }
    // Innermost first: (D, S, H, B) and the byte strides of S, H, B.
    let dims = [d, s, h, b];
    let mut strides = [0u64; 3];
    for (i, (&st, &extent)) in [op.strides[2], op.strides[1], op.strides[0]].iter().zip(&dims[1..]).enumerate() {
        let bytes = u64::try_from(st).ok()?.checked_mul(elem)?;
        // A dimension of extent 1 is only ever read at index 0, so its stride does not matter; tensor maps
        // want a positive multiple of 16 bytes (broadcast views often carry 0 there).
        strides[i] = if extent == 1 && (bytes == 0 || !bytes.is_multiple_of(16)) { 16 } else { bytes };
        if strides[i] == 0 || !strides[i].is_multiple_of(16) || strides[i] >= 1 << 40 {
            return None;
        }
    }
    let mut global_dim = [0u64; 4];
    for (g, &x) in global_dim.iter_mut().zip(&dims) {
        if x == 0 || x as u64 > 1 << 32 {
            return None;
        }
        *g = x as u64;
    }
    Some((global_dim, strides))
}

fn encode(op: &KvOperand, box_keys: usize, row: BoxRow) -> Option<sys::CUtensorMap> {
    let data_type = match op.dtype {
        DType::F16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::BF16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        // TMA only moves bytes: E4M3 travels as u8.
        DType::F8E4M3 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        DType::F32 => return None,
    };
    let (global_dim, strides) = layout(op, box_keys)?;
    let box_dim = [row.cols(op.dtype) as u32, box_keys as u32, 1, 1];
    let element_strides = [1u32; 4];
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: every pointer refers to a live local array of the length the rank (4) implies; the map is
    // written by the driver and only read after it reports success. The global address is not accessed
    // here, only recorded.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            data_type,
            4,
            op.ptr as *mut std::ffi::c_void,
            global_dim.as_ptr(),
            strides.as_ptr(),
            box_dim.as_ptr(),
            element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            row.swizzle(),
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return None;
    }
    // SAFETY: the driver filled the map (checked above); zeroed memory is a valid map value anyway.
    Some(unsafe { map.assume_init() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(ptr: u64, dtype: DType, d: usize, strides: [i64; 3]) -> KvOperand {
        KvOperand { ptr, dtype, dims: [2, 4, 100, d], strides }
    }

    // Layouts no tensor map can describe are refused before the driver is asked (so these run without one).
    #[test]
    fn layouts_a_tensor_map_cannot_describe_get_none() {
        let ok = [4 * 100 * 128, 100 * 128, 128];
        // A base not 16-byte aligned.
        assert!(kv_tensor_map(&op(8, DType::BF16, 128, ok), 32).is_none());
        // Rows 68 elements apart: 136 bytes, not a multiple of 16.
        assert!(kv_tensor_map(&op(256, DType::F16, 64, [4 * 100 * 68, 100 * 68, 68]), 32).is_none());
        // A head dim that is not whole 64-column boxes, and f32.
        assert!(kv_tensor_map(&op(256, DType::BF16, 96, [4 * 100 * 96, 100 * 96, 96]), 32).is_none());
        assert!(kv_tensor_map(&op(256, DType::F32, 128, ok), 32).is_none());
        // Boxes of no keys or more than 256.
        assert!(kv_tensor_map(&op(256, DType::BF16, 128, ok), 0).is_none());
        assert!(kv_tensor_map(&op(256, DType::BF16, 128, ok), 257).is_none());
        // A negative stride.
        assert!(kv_tensor_map(&op(256, DType::BF16, 128, [-(4 * 100 * 128), 100 * 128, 128]), 32).is_none());
        // Padded maps: head dims that are not whole 16-byte rows, and the same refusals as above.
        assert!(padded_tensor_map(&op(256, DType::BF16, 36, [4 * 100 * 40, 100 * 40, 40]), 32).is_none());
        assert!(padded_tensor_map(&op(8, DType::BF16, 80, [4 * 100 * 80, 100 * 80, 80]), 32).is_none());
        assert!(padded_tensor_map(&op(256, DType::F32, 80, [4 * 100 * 80, 100 * 80, 80]), 32).is_none());
    }

    #[test]
    fn kv_operands_cover_dense_packed_and_paged_calls() {
        use sdpa_core::{Layout, Ragged, Shape};
        let shape = Shape { b: 2, hq: 8, hkv: 2, sq: 1, sk: 1000, d: 192, dv: 128 };
        let dense = AttentionSpec::new(shape, DType::BF16);
        let packed = dense.clone().with_ragged(Ragged::new(vec![1, 1], vec![700, 1000]), Layout::Bshd);
        let paged = dense.clone().with_ragged(Ragged::new(vec![1, 1], vec![700, 1000]).paged(16, 3), Layout::Bshd);
        let params =
            |spec: &AttentionSpec| AttnParams::new(spec, 256, 1 << 20, 2 << 20, 3 << 20, 0, 0).expect("params");

        // Dense: three batches of two kv heads (told apart), the call's dtype.
        let dense3 = AttentionSpec::new(Shape { b: 3, ..shape }, DType::F16);
        let p = params(&dense3);
        let (k, v, keys) = kv_operands(&dense3, &p, 64);
        assert_eq!((k.ptr, v.ptr, keys), (1 << 20, 2 << 20, 64));
        assert_eq!((k.dtype, v.dtype), (DType::F16, DType::F16));
        assert_eq!((k.dims, v.dims), ([3, 2, 1000, 192], [3, 2, 1000, 128]));
        assert_eq!((k.strides, v.strides), (p.k_stride, p.v_stride));

        // Packed rows: one batch of all 1700 keys, its batch stride unused.
        let p = params(&packed);
        let (k, v, keys) = kv_operands(&packed, &p, 64);
        assert_eq!((k.dims, v.dims, keys), ([1, 2, 1700, 192], [1, 2, 1700, 128], 64));
        assert_eq!((k.strides, v.strides), ([0, p.k_stride[1], p.k_stride[2]], [0, p.v_stride[1], p.v_stride[2]]));

        // Pages: the pool (44 + 63 pages of 16 keys for 700 and 1000 keys, 3 spare), one page a box.
        let p = params(&paged);
        let (k, v, keys) = kv_operands(&paged, &p, 64);
        assert_eq!((k.dims, v.dims, keys), ([110, 2, 16, 192], [110, 2, 16, 128], 16));
        assert_eq!((k.strides, v.strides), (p.k_stride, p.v_stride));
        assert_eq!(kv_operands(&paged, &p, 8).2, 8);
    }
}
