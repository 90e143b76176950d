//! Which forward kernel the ring's steps run, chosen once per call for every step of every rank (a rank
//! that refused a step halfway would leave its neighbours waiting in NCCL).
//!
//! The ring decides this itself instead of leaving `auto` to [`crate::kernels::policy`]: its step shapes
//! (one causal top-left diagonal and non-causal blocks of a few thousand to a hundred thousand rows, D = Dv,
//! dense, 16-byte aligned) are the ones `fa3` takes, and on the H100 `fa3` runs D = 128 at 1.3-1.6x `fa2`
//! (`bench/results/gpu/fa3.md`). So:
//! - `auto`: `fa3` where it takes every step ([`fa3_refusal`] is `None` for all of them) and was measured
//!   faster than `fa2` at their head dims ([`crate::kernels::policy::fa3_head_dims_pay`]); otherwise `auto`
//!   is passed through to the policy unchanged, so whatever the policy's `auto` picks runs there.
//! - `fa3`: `fa3` on every step, or a refusal naming the step and what `fa3` lacks (never a silent fallback).
//! - any other kernel: passed through as asked.
//!
//! The backward is not chosen here: its steps run the tensor-core backward (`fa2`'s) whatever the forward
//! ran.

use crate::checked::params::AttnParams;
use crate::error::unsupported;
use crate::kernels::fa3;
use sdpa_core::{AttentionSpec, Kernel, Result, SdpaError};

/// Why `fa3` cannot run one step's call on devices of compute capability `cc` whose blocks may use
/// `smem_optin` bytes of shared memory, with the step's parameters `params` (addresses and strides), or
/// `None`: [`fa3::check`], the conditions of [`fa3::plan`] without building tensor maps.
pub fn fa3_refusal(spec: &AttentionSpec, params: &AttnParams, cc: (i32, i32), smem_optin: usize) -> Option<String> {
    let optin = i32::try_from(smem_optin).unwrap_or(i32::MAX);
    fa3::check(spec, params, cc, optin).err().map(|e| match e {
        SdpaError::Unsupported { what, .. } => what,
        other => other.to_string(),
    })
}

/// The kernel every forward step asks [`crate::kernels::dispatch`] for, given the requested kernel and each
/// step's spec and parameters (`steps`: a label for errors, the spec, the parameters).
pub fn choose<'a>(
    requested: Kernel,
    steps: impl IntoIterator<Item = (String, &'a AttentionSpec, AttnParams)>,
    cc: (i32, i32),
    smem_optin: usize,
) -> Result<Kernel> {
    if !matches!(requested, Kernel::Auto | Kernel::Fa3) {
        return Ok(requested);
    }
    for (label, spec, params) in steps {
        // `auto` leaves to the policy the head dims where fa3 was measured slower than fa2.
        if requested == Kernel::Auto && !crate::kernels::policy::fa3_head_dims_pay(spec) {
            return Ok(Kernel::Auto);
        }
        if let Some(why) = fa3_refusal(spec, &params, cc, smem_optin) {
            if requested == Kernel::Fa3 {
                return Err(unsupported(format!("ring attention with kernel fa3 ({label}): {why}")));
            }
            return Ok(Kernel::Auto);
        }
    }
    Ok(Kernel::Fa3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sdpa_core::{DType, Mask, Shape};

    fn step(d: usize, dtype: DType, mask: Mask) -> (AttentionSpec, AttnParams) {
        let spec = AttentionSpec::new(Shape { b: 1, hq: 8, hkv: 2, sq: 300, sk: 600, d, dv: d }, dtype).with_mask(mask);
        let p = AttnParams::new(&spec, 1 << 32, 2 << 32, 3 << 32, 4 << 32, 0, 5 << 32).expect("params");
        (spec, p)
    }

    const H100: (i32, i32) = (9, 0);
    const OPTIN: usize = 227 * 1024;

    #[test]
    fn auto_takes_fa3_where_it_runs_every_step_and_passes_auto_through_elsewhere() {
        let (causal, pc) = step(128, DType::BF16, Mask::CausalTopLeft);
        let (plain, pp) = step(128, DType::BF16, Mask::None);
        let both = || [("step 0".to_string(), &causal, pc), ("step 1".to_string(), &plain, pp)];
        assert_eq!(choose(Kernel::Auto, both(), H100, OPTIN).expect("auto"), Kernel::Fa3);
        assert_eq!(choose(Kernel::Fa3, both(), H100, OPTIN).expect("fa3"), Kernel::Fa3);
        assert_eq!(choose(Kernel::Fa2, both(), H100, OPTIN).expect("fa2"), Kernel::Fa2);
        // An A100 (8.0): auto goes to the policy, fa3 is refused with the reason.
        assert_eq!(choose(Kernel::Auto, both(), (8, 0), 163 * 1024).expect("auto"), Kernel::Auto);
        let why = choose(Kernel::Fa3, both(), (8, 0), 163 * 1024).expect_err("refused").to_string();
        assert!(why.contains("compute capability 9.0") && why.contains("step 0"), "{why}");
    }

    #[test]
    fn a_step_fa3_cannot_take_sends_auto_to_the_policy_and_refuses_fa3_naming_the_step() {
        // D = 36: not a multiple of 8, which fa3's tensor maps cannot describe.
        let (d36, p36) = step(36, DType::F16, Mask::None);
        let (ok, pok) = step(64, DType::F16, Mask::CausalTopLeft);
        let steps = || [("rank 0 step 0".to_string(), &ok, pok), ("rank 1 step 1".to_string(), &d36, p36)];
        assert_eq!(choose(Kernel::Auto, steps(), H100, OPTIN).expect("auto"), Kernel::Auto);
        let why = choose(Kernel::Fa3, steps(), H100, OPTIN).expect_err("refused").to_string();
        assert!(why.contains("rank 1 step 1") && why.contains("head dims"), "{why}");
        // Unaligned addresses (a Q row offset of 4 elements) and too little shared memory are refusals too.
        let (s, p) = step(64, DType::BF16, Mask::None);
        let odd = AttnParams { q: p.q + 8, ..p };
        assert!(fa3_refusal(&s, &odd, H100, OPTIN).is_some_and(|w| w.contains("multiples of 8")));
        assert!(fa3_refusal(&s, &p, H100, 48 * 1024).is_some_and(|w| w.contains("shared memory")));
        assert_eq!(fa3_refusal(&s, &p, H100, OPTIN), None);
        // D = 32: fa3 takes it but ran slower than fa2, so `auto` leaves it to the policy; asked for, it runs.
        let (d32, p32) = step(32, DType::BF16, Mask::None);
        let one = || [("rank 0 step 0".to_string(), &d32, p32)];
        assert_eq!(choose(Kernel::Auto, one(), H100, OPTIN).expect("auto"), Kernel::Auto);
        assert_eq!(choose(Kernel::Fa3, one(), H100, OPTIN).expect("fa3"), Kernel::Fa3);
    }
}
