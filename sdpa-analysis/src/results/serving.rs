//! The serving layouts' table (issue 23): every ragged (varlen or paged) record against its dense
//! equal-work counterpart, against the best PyTorch record of the same batch, and, for paged decoding, its
//! GB/s against the copy bandwidth measured on the same platform.
//!
//! The dense counterpart is the fastest dense record of the same platform, backend, kernel, dtype, mask,
//! variants and heads whose FLOPs are within 1 % of the ragged call's (the `serving` preset writes such a
//! call next to each batch: same FLOPs, and for decoding the same bytes). The ratio is of TFLOP/s, so a
//! counterpart with slightly different work still compares rates.

use super::model::{cost_of, ragged_key, Group, ResultsReport, Row};

/// One line of [`ResultsReport::serving_rows`].
#[derive(Debug, Clone, PartialEq)]
pub struct ServingRow {
    /// The group of the ragged record (its title names the batch).
    pub group: usize,
    /// `backend:kernel`.
    pub series: String,
    /// `varlen` or `paged`.
    pub layout: &'static str,
    /// Median, ms.
    pub median_ms: f64,
    /// TFLOP/s over the batch's own work.
    pub tflops: f64,
    /// GB/s over the batch's own bytes.
    pub gbps: f64,
    /// Our TFLOP/s over the dense counterpart's, with the counterpart's shape and layout.
    pub vs_dense: Option<(f64, String)>,
    /// The best PyTorch record's median over ours, with its kernel.
    pub vs_pytorch: Option<(f64, String)>,
    /// Paged only: our TFLOP/s over the same lengths packed (same series).
    pub vs_packed: Option<f64>,
    /// Paged only: GB/s over the measured copy bandwidth of the platform.
    pub of_peak_bw: Option<f64>,
}

/// Relative FLOP difference under which two calls count as the same work.
const SAME_WORK: f64 = 0.01;

impl ResultsReport {
    /// Every ragged record of ours (not PyTorch's) with its ratios, in group order.
    pub fn serving_rows(&self) -> Vec<ServingRow> {
        let mut out = Vec::new();
        for (i, g) in self.groups.iter().enumerate() {
            let Some(r) = &g.ragged else { continue };
            let paged = r.pages.is_some();
            for row in g.rows.iter().filter(|x| x.rec.backend != "pytorch") {
                let Some(flops) = cost_of(&row.rec).map(|c| c.flops) else { continue };
                out.push(ServingRow {
                    group: i,
                    series: row.series.clone(),
                    layout: if paged { "paged" } else { "varlen" },
                    median_ms: row.rec.time_ms.median,
                    tflops: row.tflops,
                    gbps: row.gbps,
                    vs_dense: self.dense_counterpart(g, row, flops),
                    vs_pytorch: self.best_pytorch(g, row),
                    vs_packed: if paged { self.packed_twin(g, row) } else { None },
                    of_peak_bw: if paged {
                        self.measured_gbps.get(&g.platform).filter(|bw| **bw > 0.0).map(|bw| row.gbps / bw)
                    } else {
                        None
                    },
                });
            }
        }
        out
    }

    /// Groups of the same platform, pass, dtype, mask, variants and heads as `g` (any layout, shape, batch).
    fn kin<'a>(&'a self, g: &'a Group) -> impl Iterator<Item = &'a Group> + 'a {
        let (s, v) = (g.shape, &g.variants);
        self.groups.iter().filter(move |o| {
            let t = o.shape;
            o.platform == g.platform
                && o.pass == g.pass
                && o.dtype == g.dtype
                && o.mask == g.mask
                && o.variants == *v
                && (t.hq, t.hkv, t.d, t.dv) == (s.hq, s.hkv, s.d, s.dv)
        })
    }

    fn dense_counterpart(&self, g: &Group, row: &Row, flops: f64) -> Option<(f64, String)> {
        self.kin(g)
            .filter(|o| o.ragged.is_none())
            .flat_map(|o| o.rows.iter().map(move |x| (o, x)))
            .filter(|(_, x)| x.series == row.series)
            .filter(|(_, x)| cost_of(&x.rec).is_some_and(|c| (c.flops - flops).abs() <= SAME_WORK * flops))
            .filter(|(_, x)| x.tflops > 0.0)
            .max_by(|a, b| a.1.tflops.total_cmp(&b.1.tflops))
            .map(|(o, x)| {
                let s = o.shape;
                (row.tflops / x.tflops, format!("B={} Sq={} Sk={} {}", s.b, s.sq, s.sk, o.layout))
            })
    }

    fn best_pytorch(&self, g: &Group, row: &Row) -> Option<(f64, String)> {
        let key = ragged_key(g.ragged.as_ref());
        self.kin(g)
            .filter(|o| o.shape == g.shape && ragged_key(o.ragged.as_ref()) == key)
            .flat_map(|o| o.rows.iter())
            .filter(|x| x.rec.backend == "pytorch" && x.rec.time_ms.median > 0.0)
            .min_by(|a, b| a.rec.time_ms.median.total_cmp(&b.rec.time_ms.median))
            .map(|x| (x.rec.time_ms.median / row.rec.time_ms.median, x.rec.kernel.clone()))
    }

    fn packed_twin(&self, g: &Group, row: &Row) -> Option<f64> {
        let r = g.ragged.as_ref()?;
        self.kin(g)
            .filter(|o| {
                o.shape == g.shape
                    && o.ragged
                        .as_ref()
                        .is_some_and(|p| p.pages.is_none() && p.seqlens_q == r.seqlens_q && p.seqlens_k == r.seqlens_k)
            })
            .flat_map(|o| o.rows.iter())
            .filter(|x| x.series == row.series && x.tflops > 0.0)
            .map(|x| row.tflops / x.tflops)
            // Against the fastest packed record.
            .min_by(f64::total_cmp)
    }
}
