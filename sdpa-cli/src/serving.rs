//! The serving-layout flags `sdpa run`, `sdpa bench` and `sdpa warmup` share (`--seqlens-q`, `--seqlens-k`,
//! `--page-size`), turned into one [`RaggedRequest`] and resolved against `--shape` by the core's rule (the
//! shape keeps B, the heads and head dims; its Sq/Sk bound the lengths, 0 meaning the longest given), and
//! the words every printer uses for a ragged batch.

use anyhow::{bail, Result};
use sdpa_core::{AttentionSpec, Layout, Ragged, RaggedRequest, Shape};

/// Per-sequence lengths and a page size (none given: a dense batch).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct BatchArgs {
    /// Query rows per sequence, comma-separated (a ragged batch; one per sequence of --shape's B; default:
    /// the shape's Sq for every sequence).
    #[arg(long, value_name = "N,N,...", value_parser = parse_lengths)]
    seqlens_q: Option<Lengths>,
    /// Keys per sequence, comma-separated (with --page-size: each sequence's cache length; default: the
    /// shape's Sk for every sequence).
    #[arg(long, value_name = "N,N,...", value_parser = parse_lengths)]
    seqlens_k: Option<Lengths>,
    /// K/V in a paged cache of N-token pages (1..=256), placed in shuffled order through a block table.
    #[arg(long, value_name = "N")]
    page_size: Option<usize>,
}

/// One `--seqlens-*` list (a newtype, so clap takes the whole list as one value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lengths(pub Vec<usize>);

/// Parses `128,2000,0`: non-negative integers separated by commas; anything else is refused with the
/// offending item and its position.
pub fn parse_lengths(s: &str) -> std::result::Result<Lengths, String> {
    let mut out = Vec::new();
    for (i, item) in s.split(',').enumerate() {
        let item = item.trim();
        if item.is_empty() {
            return Err(format!(
                "length {} of `{s}` is empty (give numbers separated by commas, e.g. 128,2000)",
                i + 1
            ));
        }
        match item.parse::<usize>() {
            Ok(n) => out.push(n),
            Err(_) => {
                return Err(format!(
                    "length {} of `{s}` is `{item}`, not a whole number of tokens (give e.g. 128,2000,333)",
                    i + 1
                ))
            }
        }
    }
    Ok(Lengths(out))
}

impl BatchArgs {
    /// The request the flags make (dense when none was given).
    pub fn request(&self) -> RaggedRequest {
        RaggedRequest {
            seqlens_q: self.seqlens_q.as_ref().map(|l| l.0.clone()),
            seqlens_k: self.seqlens_k.as_ref().map(|l| l.0.clone()),
            page_size: self.page_size,
        }
    }
}

/// The shape with its bounds filled in and the ragged batch of `req` (`None` for a dense request), with
/// errors that name the flags.
pub fn resolve(req: &RaggedRequest, shape: &Shape) -> Result<Option<(Shape, Ragged)>> {
    if req.page_size == Some(0) || req.page_size.is_some_and(|p| p > sdpa_core::ragged::MAX_PAGE_SIZE) {
        bail!("--page-size must be in 1..={} tokens", sdpa_core::ragged::MAX_PAGE_SIZE);
    }
    req.resolve(shape).map_err(|e| anyhow::anyhow!("{e} (shape {})", shape.labelled()))
}

/// The layout of a call: the one asked for, else BSHD (FlashAttention's packed `[total, H, D]`) for a
/// ragged batch and BHSD for a dense one.
pub fn default_layout(asked: Option<Layout>, ragged: bool) -> Layout {
    asked.unwrap_or(if ragged { Layout::Bshd } else { Layout::Bhsd })
}

/// `varlen 3 seqs, 6000 q / 6000 k tokens` or `paged (page 16, 278 pages) 3 seqs, 3 q tokens, 4431 cached`.
pub fn describe(r: &Ragged) -> String {
    let seqs = r.batch();
    match &r.pages {
        None => format!("varlen {seqs} seqs, {} q / {} k tokens", r.total_q(), r.total_k()),
        Some(p) => format!(
            "paged (page {}, {} pages) {seqs} seqs, {} q tokens, {} cached",
            p.page_size,
            p.num_pages,
            r.total_q(),
            r.total_k()
        ),
    }
}

/// The layout words of a spec: empty for a dense one, ` [varlen ...]` for a ragged one.
pub fn label(spec: &AttentionSpec) -> String {
    spec.ragged.as_ref().map(|r| format!(" [{}]", describe(r))).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_or_say_which_item_is_wrong() {
        assert_eq!(parse_lengths("1,4097, 333").unwrap(), Lengths(vec![1, 4097, 333]));
        assert_eq!(parse_lengths("0").unwrap(), Lengths(vec![0]));
        let e = parse_lengths("12,x,3").unwrap_err();
        assert!(e.contains("length 2") && e.contains("`x`"), "{e}");
        assert!(parse_lengths("12,,3").unwrap_err().contains("empty"));
        assert!(parse_lengths("-4").unwrap_err().contains("whole number"));
        assert!(parse_lengths("1.5").unwrap_err().contains("whole number"));
    }

    #[test]
    fn the_issue_example_resolves_to_three_cached_sequences() {
        let shape: Shape = "3,8,2,1,0,128".parse().unwrap();
        let req = RaggedRequest { seqlens_q: None, seqlens_k: Some(vec![1, 4097, 333]), page_size: Some(16) };
        let (shape, r) = resolve(&req, &shape).unwrap().unwrap();
        assert_eq!((shape.sq, shape.sk), (1, 4097));
        assert_eq!(r.seqlens_q, vec![1, 1, 1]);
        assert_eq!(r.pages.map(|p| p.page_size), Some(16));
        assert_eq!(describe(&r), "paged (page 16, 279 pages) 3 seqs, 3 q tokens, 4431 cached");
        assert_eq!(default_layout(None, true), Layout::Bshd);
        assert_eq!(default_layout(Some(Layout::Bhsd), true), Layout::Bhsd);
    }

    #[test]
    fn bad_requests_name_the_flag() {
        let shape: Shape = "3,8,2,1,100,128".parse().unwrap();
        let count = RaggedRequest { seqlens_k: Some(vec![1, 2]), ..Default::default() };
        assert!(resolve(&count, &shape).unwrap_err().to_string().contains("--seqlens-k lists 2 lengths"));
        let long = RaggedRequest { seqlens_k: Some(vec![1, 2, 101]), ..Default::default() };
        assert!(resolve(&long, &shape).unwrap_err().to_string().contains("bound 100"));
        let page = RaggedRequest { page_size: Some(0), ..Default::default() };
        assert!(resolve(&page, &shape).unwrap_err().to_string().contains("--page-size"));
    }
}
