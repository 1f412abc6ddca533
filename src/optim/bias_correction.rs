//! Adam's bias corrections as PyTorch computes them, the same on every target: `beta ** step`
//! and `bias_correction2 ** 0.5` in Python (C's `pow`, glibc's on the hosts PyTorch's wheels
//! run on), or `std::pow` and `std::sqrt` in the fused kernel. glibc's `pow` rounds these
//! correctly; Rust's own `pow` on wasm32 (the C library's is not there) can differ in the last
//! bit, which a float64 parameter's update shows. So on wasm32 a whole power is computed by
//! square-and-multiply in double-double arithmetic and rounded once, and the square root is
//! `sqrt`.

/// `(1 - beta1 ** step, sqrt(1 - beta2 ** step))` for a parameter's `step`-th update (1-based);
/// under `fused`, the square root is `std::sqrt`, otherwise Python's `** 0.5`.
pub(super) fn bias_corrections(betas: (f64, f64), step: u64, fused: bool) -> (f64, f64) {
    let bias_correction1 = 1.0 - power(betas.0, step);
    let bias_correction2 = 1.0 - power(betas.1, step);
    let root = if fused {
        bias_correction2.sqrt()
    } else {
        half_power(bias_correction2)
    };
    (bias_correction1, root)
}

/// `base ** step`, correctly rounded.
fn power(base: f64, step: u64) -> f64 {
    #[cfg(target_arch = "wasm32")]
    return whole_power(base, step);
    #[cfg(not(target_arch = "wasm32"))]
    base.powf(step as f64)
}

/// `x ** 0.5` (correctly rounded, so the square root).
fn half_power(x: f64) -> f64 {
    #[cfg(target_arch = "wasm32")]
    return x.sqrt();
    #[cfg(not(target_arch = "wasm32"))]
    x.powf(0.5)
}

/// `base^n` by square-and-multiply on double-double values (about 104 bits, so the one rounding
/// at the end is the correct one but in cases within 2^-95 of a tie), for `|base| <= 1`.
#[cfg(any(target_arch = "wasm32", test))]
fn whole_power(base: f64, mut n: u64) -> f64 {
    let mut result = (1.0, 0.0);
    let mut square = (base, 0.0);
    while n > 0 {
        if n & 1 == 1 {
            result = dd_mul(result, square);
        }
        n >>= 1;
        if n > 0 {
            square = dd_mul(square, square);
        }
    }
    result.0 + result.1
}

/// A double-double product (Dekker's exact product of the high parts, then the cross terms),
/// normalized.
#[cfg(any(target_arch = "wasm32", test))]
fn dd_mul(a: (f64, f64), b: (f64, f64)) -> (f64, f64) {
    let p = a.0 * b.0;
    if !p.is_normal() || p.abs() < 1e-290 {
        // Underflow: Dekker's split is no longer exact, and the value is far below anything
        // `1 - power` can show.
        return (p, 0.0);
    }
    let (ah, al) = split(a.0);
    let (bh, bl) = split(b.0);
    let e = ((ah * bh - p) + ah * bl + al * bh) + al * bl;
    let e = e + (a.0 * b.1 + a.1 * b.0);
    let s = p + e;
    (s, e - (s - p))
}

/// Veltkamp's split of `x` into two halves of 26 bits each, `hi + lo == x`.
#[cfg(any(target_arch = "wasm32", test))]
fn split(x: f64) -> (f64, f64) {
    let t = 134_217_729.0 * x; // 2^27 + 1
    let hi = t - (t - x);
    (hi, x - hi)
}

#[cfg(test)]
mod tests {
    use super::whole_power;
    use crate::rng::SplitMix64;

    /// The double-double power is the C library's `pow` (glibc's, as Python's `**`) but where
    /// glibc itself misses the correct rounding, by one unit in the last place (about 1 in 1,000
    /// of these; `0.8 ** 356` is one, checked with exact rationals). Rust's own `pow` of wasm32
    /// (the `libm` crate's) differs in about 1 in 10. PyTorch's usual betas and random ones,
    /// steps 1 to 3,000 and random ones up to two million; results below 1e-280, where the
    /// double-double loses precision, are far below anything `1 - power` shows.
    #[test]
    fn whole_power_is_the_c_library_pow_but_for_its_misroundings() {
        let mut rng = SplitMix64::new(11, 0);
        let mut betas = vec![0.0, 0.5, 0.8, 0.9, 0.95, 0.99, 0.999, 0.9999, 1.0 - 1e-8];
        betas.extend((0..200).map(|_| (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64));
        let (mut powers, mut differ) = (0, 0);
        for &beta in &betas {
            let steps = (1..=3000).chain((0..200).map(|_| 1 + rng.next_u64() % 2_000_000));
            for step in steps {
                let (want, got) = (beta.powf(step as f64), whole_power(beta, step));
                if want < 1e-280 {
                    continue;
                }
                powers += 1;
                if want.to_bits() != got.to_bits() {
                    differ += 1;
                    assert_eq!(
                        want.to_bits().abs_diff(got.to_bits()),
                        1,
                        "{beta:e} ** {step}: the C library's {want:e}, double-double {got:e}"
                    );
                }
            }
        }
        // Exact rationals round 0.8 ** 356 to this; glibc's pow gives the next double up.
        assert_eq!(whole_power(0.8, 356), 3.1625352079267906e-35);
        assert!(
            differ * 500 < powers,
            "{differ} of {powers} powers differ from the C library's"
        );
    }
}
