//! Serving layouts: ragged (varlen) batches and paged KV caches.
//!
//! A **ragged batch** packs sequences of their own lengths without padding, as FlashAttention's varlen API
//! does with `cu_seqlens`: Q and O are `[total_q, H, D]` tokens (sequence `b` starts at the sum of the
//! lengths before it), K and V `[total_k, Hkv, D]`. Each sequence is an attention problem of its own: its
//! causal mask, window and ALiBi measure from its own diagonal (`i + Sk_b − Sq_b` when aligned bottom-right),
//! and its LSE rows are `[Hq, total_q]` (FlashAttention's varlen order).
//!
//! A **paged KV cache** keeps K and V in pages of `page_size` token slots, `[num_pages, page_size, Hkv, D]`
//! (vLLM's PagedAttention, FlashAttention's `page_table`, FlashInfer's NHD order; the BHSD stride choice gives
//! FlashInfer's HND `[num_pages, Hkv, page_size, D]`). Sequence `b`'s key `j` lives in slot `j % page_size` of
//! page `block_table[b][j / page_size]`; `seqlens_k[b]` is its cache length. Pages may sit anywhere in the
//! pool and in any order; two sequences may share a page (a shared prefix) since attention only reads them.
//!
//! The lengths live in the spec (they decide the work, the checks and the cost), the block table with the
//! inputs (it is data, like an explicit mask). [`append_to_pages`] is the "write to cache" step a server runs
//! before attention: new K/V rows copied into the slots after each sequence's cache length.

use crate::error::{Result, SdpaError};
use serde::{Deserialize, Serialize};

/// Largest page size kernels accept (FlashInfer and vLLM use 1..=256; FlashAttention multiples of 256).
pub const MAX_PAGE_SIZE: usize = 256;

/// The serving layouts a backend may honour ([`crate::backend::Capabilities::serving`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Serving {
    /// Ragged batches with packed K/V.
    Varlen,
    /// Ragged batches reading K/V from a paged cache.
    Paged,
}

impl Serving {
    /// Both.
    pub const ALL: [Serving; 2] = [Serving::Varlen, Serving::Paged];

    /// The layout of a spec; `None` for a dense batch.
    pub fn of(spec: &crate::spec::AttentionSpec) -> Option<Self> {
        spec.ragged.as_ref().map(|r| if r.pages.is_some() { Serving::Paged } else { Serving::Varlen })
    }

    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Serving::Varlen => "varlen",
            Serving::Paged => "paged",
        }
    }
}

/// K/V held in pages addressed through a block table `[B, max_pages]` of `u32` page indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Paging {
    /// Token slots per page, 1..=[`MAX_PAGE_SIZE`].
    pub page_size: usize,
    /// Pages in the pool (the K and V buffers hold this many).
    pub num_pages: usize,
    /// Columns of the block table: the most pages one sequence may own.
    pub max_pages: usize,
}

impl Paging {
    /// Pages that hold `len` tokens.
    pub fn pages_for(&self, len: usize) -> usize {
        len.div_ceil(self.page_size.max(1))
    }

    /// The page and slot of key `j` of sequence `b` (the table must have been checked).
    #[inline]
    pub fn locate(&self, table: &[u32], b: usize, j: usize) -> (usize, usize) {
        (table[b * self.max_pages + j / self.page_size] as usize, j % self.page_size)
    }
}

/// The lengths of a ragged batch and, for a paged KV cache, its pages.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ragged {
    /// Query rows of each sequence (B entries; 0 allowed).
    pub seqlens_q: Vec<usize>,
    /// Keys of each sequence (B entries; 0 allowed); with pages, each sequence's cache length.
    pub seqlens_k: Vec<usize>,
    /// K/V in pages; packed like Q (`[total_k, Hkv, D]`) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pages: Option<Paging>,
}

/// One sequence of a batch: its lengths and where its tokens start in the packed Q/O (and K/V) rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seq {
    /// Query rows.
    pub sq: usize,
    /// Keys.
    pub sk: usize,
    /// First packed query row (0 for a dense batch, whose batch stride addresses it).
    pub q_start: usize,
    /// First packed key row (0 for a dense batch or a paged cache).
    pub k_start: usize,
}

impl Ragged {
    /// A packed ragged batch from per-sequence lengths.
    pub fn new(seqlens_q: Vec<usize>, seqlens_k: Vec<usize>) -> Self {
        Ragged { seqlens_q, seqlens_k, pages: None }
    }

    /// Puts K/V in pages of `page_size` slots: as many pages as the sequences need (`spare` more in the pool)
    /// and a block table as wide as the longest sequence needs.
    pub fn paged(mut self, page_size: usize, spare: usize) -> Self {
        let ps = page_size.max(1);
        let need: usize = self.seqlens_k.iter().map(|&k| k.div_ceil(ps)).fold(0usize, usize::saturating_add);
        let widest = self.seqlens_k.iter().map(|&k| k.div_ceil(ps)).max().unwrap_or(0).max(1);
        self.pages = Some(Paging { page_size, num_pages: need.saturating_add(spare).max(1), max_pages: widest });
        self
    }

    /// A ragged batch from cumulative offsets (`cu_seqlens`, B + 1 entries starting at 0), as
    /// FlashAttention and candle-flash-attn take them; offsets that go down are refused.
    pub fn from_offsets(cu_q: &[usize], cu_k: &[usize]) -> Result<Self> {
        Ok(Ragged::new(lengths_of("cu_seqlens_q", cu_q)?, lengths_of("cu_seqlens_k", cu_k)?))
    }

    /// Number of sequences.
    pub fn batch(&self) -> usize {
        self.seqlens_q.len()
    }

    /// Query tokens of the whole batch (saturating; validation refuses an overflow).
    pub fn total_q(&self) -> usize {
        self.seqlens_q.iter().fold(0usize, |a, &x| a.saturating_add(x))
    }

    /// Key tokens of the whole batch (saturating; validation refuses an overflow).
    pub fn total_k(&self) -> usize {
        self.seqlens_k.iter().fold(0usize, |a, &x| a.saturating_add(x))
    }

    /// The longest query length (0 for an empty batch).
    pub fn max_q(&self) -> usize {
        self.seqlens_q.iter().copied().max().unwrap_or(0)
    }

    /// The longest key length.
    pub fn max_k(&self) -> usize {
        self.seqlens_k.iter().copied().max().unwrap_or(0)
    }

    /// The sequence that packed row `t` belongs to and the row's index within it, given the cumulative
    /// `offsets` ([`Self::offsets_q`] or [`Self::offsets_k`]): the last sequence whose start is <= t, so
    /// empty sequences that share that start are skipped.
    pub(crate) fn locate(offsets: &[usize], t: usize) -> (usize, usize) {
        let b = offsets.partition_point(|&o| o <= t).saturating_sub(1).min(offsets.len().saturating_sub(2));
        (b, t - offsets[b])
    }

    /// Cumulative offsets `[0, l0, l0 + l1, ...]` (B + 1 entries) of the query rows.
    pub fn offsets_q(&self) -> Vec<usize> {
        offsets(&self.seqlens_q)
    }

    /// Cumulative offsets of the key rows (for a paged cache: of the cache lengths, which address nothing).
    pub fn offsets_k(&self) -> Vec<usize> {
        offsets(&self.seqlens_k)
    }

    /// Every sequence with its starts, in order.
    pub fn seqs(&self) -> Vec<Seq> {
        let paged = self.pages.is_some();
        let (mut q0, mut k0) = (0usize, 0usize);
        self.seqlens_q
            .iter()
            .zip(&self.seqlens_k)
            .map(|(&sq, &sk)| {
                let s = Seq { sq, sk, q_start: q0, k_start: if paged { 0 } else { k0 } };
                q0 = q0.saturating_add(sq);
                k0 = k0.saturating_add(sk);
                s
            })
            .collect()
    }

    /// Checks the lengths against the batch size and the shape's bounds (`max_sq`, `max_sk`) and the pages
    /// against their limits; never panics.
    pub fn validate(&self, b: usize, max_sq: usize, max_sk: usize) -> Result<()> {
        let invalid = |m: String| Err(SdpaError::invalid(m));
        if self.seqlens_q.len() != b || self.seqlens_k.len() != b {
            return invalid(format!(
                "a ragged batch of B = {b} sequences needs {b} query and {b} key lengths, got {} and {}",
                self.seqlens_q.len(),
                self.seqlens_k.len()
            ));
        }
        let sum = |v: &[usize], what: &str| {
            v.iter().try_fold(0usize, |a, &x| a.checked_add(x)).ok_or_else(|| SdpaError::overflow(what.to_string()))
        };
        let total_q = sum(&self.seqlens_q, "total query tokens of the ragged batch")?;
        let total_k = sum(&self.seqlens_k, "total key tokens of the ragged batch")?;
        if total_q == 0 {
            return invalid("the ragged batch holds no query token (every query length is 0)".into());
        }
        if self.pages.is_none() && total_k == 0 {
            return invalid("the ragged batch holds no key token (every key length is 0)".into());
        }
        for (what, v, max) in [("query", &self.seqlens_q, max_sq), ("key", &self.seqlens_k, max_sk)] {
            if let Some((i, &len)) = v.iter().enumerate().find(|&(_, &l)| l > max) {
                return invalid(format!(
                    "sequence {i} has {len} {what} tokens, more than the shape's bound {max}; raise the bound \
                     (0 on the command line means the longest given)"
                ));
            }
        }
        if let Some(p) = &self.pages {
            if p.page_size == 0 || p.page_size > MAX_PAGE_SIZE {
                return invalid(format!("page size {} is outside 1..={MAX_PAGE_SIZE}", p.page_size));
            }
            if p.num_pages == 0 || p.max_pages == 0 {
                return invalid("a paged cache needs at least one page and one block-table column".into());
            }
            if p.num_pages > u32::MAX as usize {
                return invalid(format!("{} pages do not fit the block table's u32 indices", p.num_pages));
            }
            b.checked_mul(p.max_pages).ok_or_else(|| SdpaError::overflow("entries of the block table"))?;
            let room = p.max_pages.checked_mul(p.page_size).ok_or_else(|| SdpaError::overflow("slots per sequence"))?;
            if let Some((i, &len)) = self.seqlens_k.iter().enumerate().find(|&(_, &l)| l > room) {
                return invalid(format!(
                    "sequence {i} has a cache length of {len}, beyond its {} pages of {} slots ({room})",
                    p.max_pages, p.page_size
                ));
            }
        }
        Ok(())
    }

    /// Checks a block table against the pages: `B × max_pages` entries, and every page a sequence uses
    /// (those holding its first `seqlens_k[b]` keys) inside the pool. Columns past a sequence's length are
    /// never read and may hold anything. Errors for a packed batch given a table, or a paged one without.
    pub fn check_block_table(&self, table: Option<&[u32]>) -> Result<()> {
        let (p, table) = match (&self.pages, table) {
            (None, None) => return Ok(()),
            (None, Some(_)) => return Err(SdpaError::invalid("a block table was given but K/V are not paged")),
            (Some(_), None) => return Err(SdpaError::invalid("a paged KV cache needs its block table")),
            (Some(p), Some(t)) => (p, t),
        };
        let needed = self.batch().saturating_mul(p.max_pages);
        if table.len() < needed {
            return Err(SdpaError::BufferTooShort { name: "block table", len: table.len(), needed });
        }
        for (b, &len) in self.seqlens_k.iter().enumerate() {
            for c in 0..p.pages_for(len) {
                let page = table[b * p.max_pages + c];
                if page as usize >= p.num_pages {
                    return Err(SdpaError::invalid(format!(
                        "block table row {b}, column {c} names page {page}, but the cache has {} pages",
                        p.num_pages
                    )));
                }
            }
        }
        Ok(())
    }

    /// A block table that places every used page of every sequence at a distinct page of the pool, in a
    /// seeded random order (so no kernel can assume neighbouring pages); when the pool is smaller than what
    /// the sequences use, pages repeat (shared pages, as prefix sharing makes them). Unused columns hold
    /// `u32::MAX`, which no kernel may read.
    pub fn shuffled_block_table(&self, seed: u64) -> Result<Vec<u32>> {
        use rand::{Rng, SeedableRng};
        let p = self.pages.ok_or_else(|| SdpaError::invalid("a block table needs paged K/V"))?;
        let len = self.batch().checked_mul(p.max_pages).ok_or_else(|| SdpaError::overflow("block table"))?;
        let mut table = crate::memory::try_filled(len, u32::MAX, "the block table")?;
        // A Fisher-Yates shuffle of the pool drawn lazily (only the positions it touches are stored), so a
        // pool far larger than the pages in use costs nothing; past the pool's end it starts over.
        let pool = p.num_pages.clamp(1, u32::MAX as usize);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut moved: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
        let mut next = 0usize;
        for (b, &sk) in self.seqlens_k.iter().enumerate() {
            for c in 0..p.pages_for(sk).min(p.max_pages) {
                let at = next % pool;
                if at == 0 {
                    moved.clear();
                }
                let pick = rng.gen_range(at..pool);
                let chosen = *moved.get(&pick).unwrap_or(&pick);
                let displaced = *moved.get(&at).unwrap_or(&at);
                moved.insert(pick, displaced);
                table[b * p.max_pages + c] = chosen as u32;
                next += 1;
            }
        }
        Ok(table)
    }
}

/// A ragged batch as the command line, presets and replays name it: per-sequence lengths (absent: every
/// sequence has the shape's) and a page size (absent: K/V packed). Resolved against a shape whose B is the
/// number of sequences and whose Sq/Sk bound the lengths, 0 meaning "the longest given".
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RaggedRequest {
    /// Query rows per sequence (`--seqlens-q`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seqlens_q: Option<Vec<usize>>,
    /// Keys per sequence (`--seqlens-k`); with pages, cache lengths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seqlens_k: Option<Vec<usize>>,
    /// Token slots per page (`--page-size`): K/V in a paged cache, pages placed in shuffled order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<usize>,
}

impl RaggedRequest {
    /// True when nothing is asked: a dense batch.
    pub fn is_dense(&self) -> bool {
        self.seqlens_q.is_none() && self.seqlens_k.is_none() && self.page_size.is_none()
    }

    /// The shape with its bounds filled in (0 becomes the longest length) and the ragged batch; `None` for
    /// a dense request. Lists must have B entries.
    pub fn resolve(&self, shape: &crate::spec::Shape) -> Result<Option<(crate::spec::Shape, Ragged)>> {
        if self.is_dense() {
            return Ok(None);
        }
        let b = shape.b;
        let list = |given: &Option<Vec<usize>>, fallback: usize, flag: &str| -> Result<Vec<usize>> {
            match given {
                Some(v) if v.len() != b => Err(SdpaError::invalid(format!(
                    "{flag} lists {} lengths but the shape has B = {b} sequences; give one per sequence",
                    v.len()
                ))),
                Some(v) => Ok(v.clone()),
                None if fallback == 0 => Err(SdpaError::invalid(format!(
                    "without {flag} every sequence takes the shape's length, which is 0 there"
                ))),
                None => Ok(vec![fallback; b]),
            }
        };
        let seqlens_q = list(&self.seqlens_q, shape.sq, "--seqlens-q")?;
        let seqlens_k = list(&self.seqlens_k, shape.sk, "--seqlens-k")?;
        let mut r = Ragged::new(seqlens_q, seqlens_k);
        let bound = |given: usize, longest: usize| if given == 0 { longest.max(1) } else { given };
        let shape = crate::spec::Shape { sq: bound(shape.sq, r.max_q()), sk: bound(shape.sk, r.max_k()), ..*shape };
        if let Some(ps) = self.page_size {
            r = r.paged(ps, 0);
        }
        r.validate(shape.b, shape.sq, shape.sk)?;
        Ok(Some((shape, r)))
    }

    /// The request that reproduces a ragged batch (for records and replays).
    pub fn of(r: &Ragged) -> Self {
        RaggedRequest {
            seqlens_q: Some(r.seqlens_q.clone()),
            seqlens_k: Some(r.seqlens_k.clone()),
            page_size: r.pages.map(|p| p.page_size),
        }
    }
}

/// Sequence `b` of a ragged batch as a dense call of its own (B = 1, BHSD, its own Sq and Sk, the same
/// mask, scale and variants) with its rows gathered out of the packed or paged inputs: the independent
/// oracle a ragged kernel is checked against, and what a server without varlen support would run. `None`
/// when the sequence has no query row or no key (its rows are then zeros with LSE −inf, or absent).
pub fn sequence_as_dense(
    spec: &crate::spec::AttentionSpec,
    inputs: &crate::tensor::HostInputs,
    b: usize,
) -> Result<Option<(crate::spec::AttentionSpec, crate::tensor::HostInputs)>> {
    use crate::spec::{AttentionSpec, Operand, Shape};
    use crate::tensor::{HostBuffer, HostInputs};
    spec.validate()?;
    inputs.check(spec)?;
    let seq = spec.seq(b);
    if seq.sq == 0 || seq.sk == 0 {
        return Ok(None);
    }
    let s = spec.shape;
    let shape = Shape { b: 1, sq: seq.sq, sk: seq.sk, ..s };
    let dense = AttentionSpec { ragged: None, ..AttentionSpec::new(shape, spec.dtype) }
        .with_mask(spec.mask)
        .with_variants(spec.variants.clone());
    let dense = match spec.scale {
        Some(x) => dense.with_scale(x),
        None => dense,
    };
    let table = inputs.block_table.as_deref();
    let gather = |heads: usize, rows: usize, dim: usize, at: &dyn Fn(usize, usize) -> usize, src: &HostBuffer| {
        let mut v = Vec::with_capacity(heads * rows * dim);
        for h in 0..heads {
            for i in 0..rows {
                let off = at(h, i);
                v.extend((0..dim).map(|c| src.get_f32(off + c)));
            }
        }
        HostBuffer::from_f32(spec.dtype, &v)
    };
    let q = gather(s.hq, seq.sq, s.d, &|h, i| spec.q_offset(&seq, b, h, i), &inputs.q);
    let k = gather(s.hkv, seq.sk, s.d, &|h, j| spec.kv_offset(Operand::K, table, &seq, b, h, j), &inputs.k);
    let v = gather(s.hkv, seq.sk, s.dv, &|h, j| spec.kv_offset(Operand::V, table, &seq, b, h, j), &inputs.v);
    Ok(Some((dense, HostInputs { q, k, v, mask: None, block_table: None })))
}

fn offsets(lens: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(lens.len() + 1);
    let mut acc = 0usize;
    out.push(0);
    for &l in lens {
        acc = acc.saturating_add(l);
        out.push(acc);
    }
    out
}

fn lengths_of(name: &str, cu: &[usize]) -> Result<Vec<usize>> {
    match cu.first() {
        None => return Err(SdpaError::invalid(format!("{name} is empty; it needs B + 1 offsets starting at 0"))),
        Some(&first) if first != 0 => {
            return Err(SdpaError::invalid(format!("{name} starts at {first}; the first offset must be 0")))
        }
        _ => {}
    }
    cu.windows(2)
        .enumerate()
        .map(|(i, w)| {
            w[1].checked_sub(w[0]).ok_or_else(|| {
                SdpaError::invalid(format!(
                    "{name} goes down at sequence {i} ({} then {}); offsets must not decrease",
                    w[0], w[1]
                ))
            })
        })
        .collect()
}

/// Where new K/V rows go in a paged cache: the "write to cache" step before attention.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendSpec {
    /// The cache's pages.
    pub paging: Paging,
    /// KV heads.
    pub hkv: usize,
    /// Head dim of K.
    pub d: usize,
    /// Head dim of V.
    pub dv: usize,
    /// Tokens in the cache of each sequence before the append (B entries).
    pub cache_lens: Vec<usize>,
    /// New tokens per sequence, packed `[total_new, Hkv, D]` (and Dv for V) in sequence order.
    pub new_lens: Vec<usize>,
    /// Strides of the packed new rows: (token, head); the head dim is contiguous.
    pub new_strides: (usize, usize),
    /// Strides of the pages: (page, slot, head); the head dim is contiguous.
    pub page_strides: (usize, usize, usize),
}

impl AppendSpec {
    /// Contiguous NHD pages `[num_pages, page_size, Hkv, D]` and packed new rows `[total, Hkv, D]`; for V,
    /// whose head dim differs, use [`AppendSpec::for_dim`].
    pub fn new(paging: Paging, hkv: usize, d: usize, cache_lens: Vec<usize>, new_lens: Vec<usize>) -> Self {
        AppendSpec {
            paging,
            hkv,
            d,
            dv: d,
            cache_lens,
            new_lens,
            new_strides: (hkv.saturating_mul(d), d),
            page_strides: (paging.page_size.saturating_mul(hkv).saturating_mul(d), hkv.saturating_mul(d), d),
        }
    }

    /// The same append for rows of head dim `dim` (V's Dv) in the contiguous layouts.
    pub fn for_dim(&self, dim: usize) -> Self {
        AppendSpec {
            d: dim,
            dv: dim,
            ..Self::new(self.paging, self.hkv, dim, self.cache_lens.clone(), self.new_lens.clone())
        }
    }

    /// Checks lengths, room and the block table; the buffers must hold `new_len()` and `pages_len()`
    /// elements.
    pub fn validate(&self, table: &[u32], new_len: usize, pages_len: usize) -> Result<()> {
        let grown: Vec<usize> = self
            .cache_lens
            .iter()
            .zip(&self.new_lens)
            .map(|(&c, &n)| c.checked_add(n).ok_or_else(|| SdpaError::overflow("cache length after the append")))
            .collect::<Result<_>>()?;
        let r = Ragged { seqlens_q: self.new_lens.clone(), seqlens_k: grown, pages: Some(self.paging) };
        let b = self.cache_lens.len();
        if self.new_lens.len() != b {
            return Err(SdpaError::invalid(format!(
                "{b} cache lengths but {} new-token counts; give one per sequence",
                self.new_lens.len()
            )));
        }
        if self.hkv == 0 || self.d == 0 {
            return Err(SdpaError::invalid("an append needs at least one KV head and a head dim of at least 1"));
        }
        r.validate(b, usize::MAX, usize::MAX).or_else(|e| match e {
            // An append of no token at all is a valid no-op.
            SdpaError::InvalidSpec(m) if m.contains("no query token") => Ok(()),
            e => Err(e),
        })?;
        r.check_block_table(Some(table))?;
        if new_len < self.new_len()? {
            return Err(SdpaError::BufferTooShort { name: "new rows", len: new_len, needed: self.new_len()? });
        }
        if pages_len < self.pages_len()? {
            return Err(SdpaError::BufferTooShort { name: "pages", len: pages_len, needed: self.pages_len()? });
        }
        Ok(())
    }

    /// Elements the packed new rows span.
    pub fn new_len(&self) -> Result<usize> {
        let total = self.new_lens.iter().try_fold(0usize, |a, &x| a.checked_add(x));
        let over = || SdpaError::overflow("length of the new rows");
        match total.ok_or_else(over)? {
            0 => Ok(0),
            t => span(&[(t, self.new_strides.0), (self.hkv, self.new_strides.1)], self.d).ok_or_else(over),
        }
    }

    /// Elements the pages span.
    pub fn pages_len(&self) -> Result<usize> {
        let (p, s, h) = self.page_strides;
        span(&[(self.paging.num_pages, p), (self.paging.page_size, s), (self.hkv, h)], self.d)
            .ok_or_else(|| SdpaError::overflow("length of the pages"))
    }

    /// Every copy the append makes, as `(source offset, destination offset)` of one row of `d` elements.
    pub fn row_copies<'a>(&'a self, table: &'a [u32]) -> impl Iterator<Item = (usize, usize)> + 'a {
        let mut first = 0usize;
        self.new_lens.iter().zip(&self.cache_lens).enumerate().flat_map(move |(b, (&n, &c))| {
            let base = first;
            first += n;
            (0..n).flat_map(move |t| {
                let (page, slot) = self.paging.locate(table, b, c + t);
                (0..self.hkv).map(move |h| {
                    let src = (base + t) * self.new_strides.0 + h * self.new_strides.1;
                    let dst = page * self.page_strides.0 + slot * self.page_strides.1 + h * self.page_strides.2;
                    (src, dst)
                })
            })
        })
    }
}

/// One past the last element addressed by `dims` (count, stride) around a contiguous run of `inner`.
fn span(dims: &[(usize, usize)], inner: usize) -> Option<usize> {
    dims.iter().try_fold(inner, |last, &(n, stride)| n.checked_sub(1)?.checked_mul(stride)?.checked_add(last))
}

/// Copies new K (or V) rows into their pages, after each sequence's cached tokens. Validates first and
/// changes nothing when anything is wrong.
pub fn append_to_pages<T: Copy>(spec: &AppendSpec, table: &[u32], new: &[T], pages: &mut [T]) -> Result<()> {
    spec.validate(table, new.len(), pages.len())?;
    let d = spec.d;
    for (src, dst) in spec.row_copies(table) {
        pages[dst..dst + d].copy_from_slice(&new[src..src + d]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_round_trip_and_decreasing_offsets_are_refused() {
        let r = Ragged::from_offsets(&[0, 3, 3, 10], &[0, 5, 6, 20]).unwrap();
        assert_eq!(r.seqlens_q, vec![3, 0, 7]);
        assert_eq!(r.seqlens_k, vec![5, 1, 14]);
        assert_eq!(r.offsets_q(), vec![0, 3, 3, 10]);
        let e = Ragged::from_offsets(&[0, 4, 2], &[0, 1, 2]).unwrap_err().to_string();
        assert!(e.contains("goes down at sequence 1"), "{e}");
        assert!(Ragged::from_offsets(&[1, 4], &[0, 1]).unwrap_err().to_string().contains("must be 0"));
        assert!(Ragged::from_offsets(&[], &[0]).is_err());
    }

    #[test]
    fn validation_names_each_problem() {
        let r = Ragged::new(vec![1, 0, 4], vec![3, 9, 0]);
        assert!(r.validate(3, 4, 9).is_ok());
        assert!(r.validate(2, 4, 9).unwrap_err().to_string().contains("needs 2 query"));
        assert!(r.validate(3, 3, 9).unwrap_err().to_string().contains("sequence 2 has 4 query tokens"));
        assert!(Ragged::new(vec![0, 0], vec![1, 1]).validate(2, 1, 1).unwrap_err().to_string().contains("no query"));
        let p = r.clone().paged(4, 0);
        assert_eq!(p.pages, Some(Paging { page_size: 4, num_pages: 4, max_pages: 3 }));
        assert!(p.validate(3, 4, 9).is_ok());
        let mut short = p.clone();
        short.pages = Some(Paging { max_pages: 2, ..p.pages.unwrap() });
        assert!(short.validate(3, 4, 9).unwrap_err().to_string().contains("beyond its 2 pages"));
        let mut big = p.clone();
        big.pages = Some(Paging { page_size: 512, ..p.pages.unwrap() });
        assert!(big.validate(3, 4, 9).unwrap_err().to_string().contains("page size 512"));
        let over = Ragged::new(vec![usize::MAX, 1], vec![1, 1]);
        assert!(matches!(over.validate(2, usize::MAX, 1), Err(SdpaError::SizeOverflow { .. })));
    }

    #[test]
    fn requests_resolve_like_the_command_line() {
        use crate::spec::Shape;
        // Three cached sequences decoding one token each: Sq = 1 for all, Sk bound = the longest.
        let shape: Shape = "3,8,2,1,0,128".parse().unwrap();
        let req = RaggedRequest { seqlens_k: Some(vec![1, 4097, 333]), page_size: Some(16), ..Default::default() };
        let (s, r) = req.resolve(&shape).unwrap().unwrap();
        assert_eq!((s.sq, s.sk), (1, 4097));
        assert_eq!(r.seqlens_q, vec![1, 1, 1]);
        assert_eq!(r.pages, Some(Paging { page_size: 16, num_pages: 1 + 257 + 21, max_pages: 257 }));
        assert_eq!(RaggedRequest::of(&r).resolve(&s).unwrap().unwrap().1, r);
        let two = RaggedRequest { seqlens_q: Some(vec![1, 2]), ..Default::default() };
        assert!(two.resolve(&shape).unwrap_err().to_string().contains("B = 3"));
        assert!(RaggedRequest::default().resolve(&shape).unwrap().is_none());
        let over = RaggedRequest { seqlens_k: Some(vec![1, 9000, 2]), ..Default::default() };
        assert!(over.resolve(&"3,8,2,1,4096,128".parse().unwrap()).is_err());
    }

    #[test]
    fn block_tables_are_checked_on_the_pages_in_use_only() {
        let r = Ragged::new(vec![1, 1], vec![5, 2]).paged(4, 0); // 2 + 1 pages, table 2 x 2
        let t = r.shuffled_block_table(1).unwrap();
        assert_eq!(t.len(), 4);
        assert_eq!(t[3], u32::MAX, "sequence 1 uses one page; its second column is never read");
        let mut used: Vec<u32> = vec![t[0], t[1], t[2]];
        used.sort_unstable();
        assert_eq!(used, vec![0, 1, 2], "every page of the pool placed once");
        assert!(r.check_block_table(Some(&t)).is_ok());
        let mut bad = t.clone();
        bad[1] = 3;
        let e = r.check_block_table(Some(&bad)).unwrap_err().to_string();
        assert!(e.contains("row 0, column 1 names page 3"), "{e}");
        assert!(r.check_block_table(Some(&t[..3])).is_err());
        assert!(r.check_block_table(None).is_err());
        assert!(Ragged::new(vec![1], vec![1]).check_block_table(Some(&t)).is_err());
    }

    #[test]
    fn appends_land_after_the_cached_tokens() {
        // Two sequences, 2 heads, D = 3, pages of 2 slots; sequence 0 has 3 cached, sequence 1 has 0.
        let paging = Paging { page_size: 2, num_pages: 4, max_pages: 2 };
        let table = [2u32, 0, 3, 1];
        let spec = AppendSpec::new(paging, 2, 3, vec![3, 0], vec![1, 2]);
        let new: Vec<f32> = (0..3 * 2 * 3).map(|x| x as f32).collect();
        let mut pages = vec![-1.0f32; 4 * 2 * 2 * 3];
        append_to_pages(&spec, &table, &new, &mut pages).unwrap();
        // Sequence 0's token 3 is page table[0][1] = 0, slot 1.
        assert_eq!(&pages[6..12], &new[0..6]);
        // Sequence 1's tokens 0 and 1 are page 3, slots 0 and 1.
        assert_eq!(&pages[36..48], &new[6..18]);
        assert_eq!(pages.iter().filter(|&&x| x == -1.0).count(), 48 - 18);
        // Beyond the pages: refused, nothing written.
        let full = AppendSpec::new(paging, 2, 3, vec![4, 0], vec![1, 0]);
        let before = pages.clone();
        assert!(append_to_pages(&full, &table, &new, &mut pages)
            .unwrap_err()
            .to_string()
            .contains("beyond its 2 pages"));
        assert_eq!(pages, before);
    }
}
