//! Dividing by a loop-invariant divisor (the CPU kernels, the MPI all-reduce's quotients): by a product when the divisor is a power of two, whose
//! reciprocal is exact. `x · 2^-k` and `x / 2^k` are then the same number (both are the
//! correctly rounded value of one real number, subnormals, infinities and NaNs included), and a
//! product costs a fraction of a division.

/// How the CPU loops divide by one divisor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Quotient {
    /// `x / divisor`.
    Divide(f32),
    /// `x * scale`, `scale` being the exact reciprocal of a power-of-two divisor.
    Scale(f32),
}

impl Quotient {
    /// The cheapest exact way to divide by `divisor`.
    pub(crate) fn by(divisor: f32) -> Quotient {
        let reciprocal = 1.0 / divisor;
        let power_of_two = |x: f32| x.is_normal() && x > 0.0 && x.to_bits() & 0x007f_ffff == 0;
        if power_of_two(divisor) && power_of_two(reciprocal) {
            Quotient::Scale(reciprocal)
        } else {
            Quotient::Divide(divisor)
        }
    }

    /// `x / divisor`, bit for bit (the tests' way; loops use [`Divide`]).
    #[cfg(test)]
    pub(crate) fn of(self, x: f32) -> f32 {
        match self {
            Quotient::Divide(divisor) => x / divisor,
            Quotient::Scale(scale) => x * scale,
        }
    }
}

/// `out[i] = values[i] / divisor` (equal lengths), by a product where that is exact (the MPI
/// all-reduce's quotients).
#[cfg(feature = "mpi")]
pub(crate) fn divide_into(out: &mut [f32], values: &[f32], divisor: f32) {
    fn go<Q: Divide>(out: &mut [f32], values: &[f32], quotient: Q) {
        for (o, &x) in out.iter_mut().zip(values) {
            *o = quotient.of(x);
        }
    }
    match Quotient::by(divisor) {
        Quotient::Divide(d) => go(out, values, ByDivision(d)),
        Quotient::Scale(s) => go(out, values, ByScale(s)),
    }
}

/// `values[i] /= divisor`, by a product where that is exact (the MPI all-reduce's quotients).
#[cfg(feature = "mpi")]
pub(crate) fn divide_in_place(values: &mut [f32], divisor: f32) {
    fn go<Q: Divide>(values: &mut [f32], quotient: Q) {
        for x in values.iter_mut() {
            *x = quotient.of(*x);
        }
    }
    match Quotient::by(divisor) {
        Quotient::Divide(d) => go(values, ByDivision(d)),
        Quotient::Scale(s) => go(values, ByScale(s)),
    }
}

/// One way of dividing, as a type: a loop generic over it compiles to a loop of divisions or
/// one of products, each free to vectorize (a branch inside the loop might not be).
pub(crate) trait Divide: Copy {
    /// `x / divisor`, bit for bit.
    fn of(self, x: f32) -> f32;
    /// The same division, as a value.
    fn quotient(self) -> Quotient;
}

/// `x / divisor`.
#[derive(Clone, Copy)]
pub(crate) struct ByDivision(pub(crate) f32);

/// `x * scale`, for the exact reciprocal `scale` of a power of two.
#[derive(Clone, Copy)]
pub(crate) struct ByScale(pub(crate) f32);

impl Divide for ByDivision {
    #[inline(always)]
    fn of(self, x: f32) -> f32 {
        x / self.0
    }
    fn quotient(self) -> Quotient {
        Quotient::Divide(self.0)
    }
}

impl Divide for ByScale {
    #[inline(always)]
    fn of(self, x: f32) -> f32 {
        x * self.0
    }
    fn quotient(self) -> Quotient {
        Quotient::Scale(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_only_by_exact_reciprocals_and_agrees_with_division() {
        assert_eq!(Quotient::by(8.0), Quotient::Scale(0.125));
        assert_eq!(Quotient::by(1.0), Quotient::Scale(1.0));
        assert_eq!(Quotient::by(3.0), Quotient::Divide(3.0));
        assert_eq!(Quotient::by(-4.0), Quotient::Divide(-4.0));
        // 2^127's reciprocal is subnormal, no longer a power of two with a normal encoding.
        assert_eq!(
            Quotient::by(2f32.powi(127)),
            Quotient::Divide(2f32.powi(127))
        );
        let values = [
            0.0,
            -0.0,
            1.0,
            -3.7,
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            f32::from_bits(0x0000_0fff),
            f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e-30,
            123_456.79,
        ];
        for divisor in [1.0f32, 2.0, 4.0, 8.0, 64.0, 1024.0, 0.5] {
            let q = Quotient::by(divisor);
            assert!(matches!(q, Quotient::Scale(_)), "{divisor}");
            for x in values {
                assert_eq!(
                    q.of(x).to_bits(),
                    (x / divisor).to_bits(),
                    "{x} / {divisor}"
                );
            }
            assert!(q.of(f32::NAN).is_nan());
        }
    }
}
