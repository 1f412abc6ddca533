//! Exact, branch-free conversions between the 16-bit formats and f32 for the CPU backend's
//! loops: the same bits as `half` and `crate::dtype` for every input, NaNs included, compiled
//! to straight-line integer code so that the loops calling them vectorize.

/// A 16-bit storage format, decoded from and encoded to the low half of a `u32`.
pub(super) trait HalfFormat {
    fn decode(bits: u32) -> f32;
    fn encode(value: f32) -> u32;

    /// An element as an arithmetic operand: [`decode`](Self::decode), except that a NaN may
    /// keep another NaN's bits. For loops whose every result is stored through `encode` (which
    /// writes any NaN as the canonical NaN): the stored bits are the same.
    #[inline(always)]
    fn decode_operand(bits: u32) -> f32 {
        Self::decode(bits)
    }

    /// `value` rounded to the format and widened back: `decode(encode(value))`, bit for bit.
    #[inline(always)]
    fn round(value: f32) -> f32 {
        Self::decode(Self::encode(value))
    }

    /// The encoding of a value [`round`](Self::round) returned: `encode(value)`, bit for bit,
    /// where the format has a cheaper way to say it.
    #[inline(always)]
    fn encode_rounded(value: f32) -> u32 {
        Self::encode(value)
    }
}

/// IEEE binary16.
#[derive(Clone, Copy)]
pub(super) struct Binary16;
/// bfloat16.
#[derive(Clone, Copy)]
pub(super) struct BFloat16;

impl HalfFormat for Binary16 {
    /// Exact; a NaN keeps its payload and becomes quiet (as `half::f16::to_f32`).
    #[inline(always)]
    fn decode(bits: u32) -> f32 {
        let sign = (bits & 0x8000) << 16;
        let magnitude = bits & 0x7fff;
        let mantissa = bits & 0x03ff;
        // Normal: rebias the exponent (15 -> 127).
        let normal = (magnitude << 13) + 0x3800_0000;
        // Zero or subnormal: mantissa · 2^-24, exact in f32.
        let subnormal = (magnitude as i32 as f32 * 5.960_464_5e-8).to_bits(); // i32: one vector conversion
        // Infinity or NaN.
        let quiet = if mantissa != 0 { 0x0040_0000 } else { 0 };
        let special = 0x7f80_0000 | (mantissa << 13) | quiet;
        let out = if magnitude < 0x0400 {
            subnormal
        } else if magnitude >= 0x7c00 {
            special
        } else {
            normal
        };
        f32::from_bits(out | sign)
    }

    /// Round to nearest even, overflow to ±inf, subnormals kept, NaN to the signed canonical
    /// quiet NaN: the bits of `crate::dtype::f32_to_f16_bits`.
    #[inline(always)]
    fn encode(value: f32) -> u32 {
        const OVERFLOW: u32 = (127 + 16) << 23; // 65536: everything from here on is ±inf
        const MIN_NORMAL: u32 = 113 << 23; // 2^-14
        const DENORM_MAGIC: u32 = ((127 - 15) + (23 - 10) + 1) << 23; // 0.5
        let bits = value.to_bits();
        let sign = (bits >> 16) & 0x8000;
        let magnitude = bits & 0x7fff_ffff;
        let special = if magnitude > 0x7f80_0000 {
            0x7e00
        } else {
            0x7c00
        };
        // Below 2^-14, adding 0.5 makes the FPU round the value to the binary16 subnormal grid
        // (nearest even); the low bits of the sum are then the subnormal's encoding.
        let subnormal = (f32::from_bits(magnitude) + f32::from_bits(DENORM_MAGIC))
            .to_bits()
            .wrapping_sub(DENORM_MAGIC);
        // Normal: rebias and round to nearest even on the 13 dropped bits (a carry into the
        // exponent is the right encoding, up to infinity).
        let odd = (magnitude >> 13) & 1;
        let normal = magnitude
            .wrapping_sub((127 - 15) << 23)
            .wrapping_add(0xfff + odd)
            >> 13;
        let half = if magnitude >= OVERFLOW {
            special
        } else if magnitude < MIN_NORMAL {
            subnormal
        } else {
            normal
        };
        half | sign
    }

    /// The round trip without leaving float32: round to nearest even on the 13 dropped bits in
    /// the normal range (65520 and above become infinity), to the subnormal grid of 2^-24 by
    /// adding and taking away 0.5 below 2^-14, NaN to the signed quiet NaN `decode` gives for
    /// `0x7e00`.
    #[inline(always)]
    fn round(value: f32) -> f32 {
        const MIN_NORMAL: u32 = 113 << 23; // 2^-14
        const OVERFLOW: u32 = 0x4780_0000; // 65536, where 65520 and above round to
        let bits = value.to_bits();
        let sign = bits & 0x8000_0000;
        let magnitude = bits & 0x7fff_ffff;
        let normal = magnitude.wrapping_add(0xfff + ((magnitude >> 13) & 1)) & 0xffff_e000;
        let normal = if normal >= OVERFLOW {
            0x7f80_0000
        } else {
            normal
        };
        let subnormal = ((f32::from_bits(magnitude) + 0.5) - 0.5).to_bits();
        let out = if magnitude > 0x7f80_0000 {
            0x7fc0_0000
        } else if magnitude < MIN_NORMAL {
            subnormal
        } else {
            normal
        };
        f32::from_bits(out | sign)
    }
}

impl HalfFormat for BFloat16 {
    /// Exact; a NaN becomes quiet (as `half::bf16::to_f32`).
    #[inline(always)]
    fn decode(bits: u32) -> f32 {
        let wide = (bits & 0xffff) << 16;
        let quiet = if (bits & 0x7fff) > 0x7f80 {
            0x0040_0000
        } else {
            0
        };
        f32::from_bits(wide | quiet)
    }

    /// The bits widened: a signaling NaN stays signaling, which no result shows.
    #[inline(always)]
    fn decode_operand(bits: u32) -> f32 {
        f32::from_bits((bits & 0xffff) << 16)
    }

    /// Round to nearest even on the 16 dropped bits (a carry into the exponent is the right
    /// result, up to infinity), NaN to the canonical quiet NaN; branch-free (the same bits as
    /// `crate::dtype::f32_to_bf16_bits`).
    #[inline(always)]
    fn encode(value: f32) -> u32 {
        let bits = value.to_bits();
        let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
        if value.is_nan() { 0x7fc0 } else { rounded }
    }

    /// The round trip in five integer operations and a select: round to nearest even on the
    /// 16 dropped bits (a carry into the exponent is the right result, up to infinity), and
    /// the canonical quiet NaN for a NaN (whose encoding `decode` leaves as it is).
    #[inline(always)]
    fn round(value: f32) -> f32 {
        let bits = value.to_bits();
        let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000;
        f32::from_bits(if value.is_nan() { 0x7fc0_0000 } else { rounded })
    }

    /// A rounded value's low 16 bits are zero (the canonical NaN's too): its top half is its
    /// encoding.
    #[inline(always)]
    fn encode_rounded(value: f32) -> u32 {
        value.to_bits() >> 16
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    /// `H::decode` against `want` (the `half` crate's widening) on every 16-bit value.
    fn decode_matches<H: HalfFormat>(want: fn(u16) -> f32, what: &str) {
        for h in 0..=u16::MAX {
            let got = H::decode(u32::from(h)).to_bits();
            assert_eq!(got, want(h).to_bits(), "{what} bits {h:#06x}");
        }
    }

    #[test]
    fn f16_decode_matches_half_for_every_value() {
        decode_matches::<Binary16>(|h| f16::from_bits(h).to_f32(), "f16");
    }

    #[test]
    fn bf16_decode_matches_half_for_every_value() {
        decode_matches::<BFloat16>(|h| bf16::from_bits(h).to_f32(), "bf16");
    }

    /// `H::round` against `decode(encode())` on every f32 whose bits above `dropped` take
    /// every value and whose low `dropped` bits take each of `lows`.
    fn round_is_the_round_trip<H: HalfFormat>(dropped: u32, lows: &[u32]) {
        for high in 0..(1u32 << (32 - dropped)) {
            for &low in lows {
                let value = f32::from_bits((high << dropped) | low);
                let want = H::decode(H::encode(value)).to_bits();
                assert_eq!(
                    H::round(value).to_bits(),
                    want,
                    "f32 bits {:#010x}",
                    value.to_bits()
                );
            }
        }
    }

    #[test]
    fn bf16_round_is_the_round_trip_on_every_rounding_case() {
        // Every sign, exponent and top 7 mantissa bits, with the 16 dropped bits below, at and
        // around the half-way point (NaNs and infinities included).
        round_is_the_round_trip::<BFloat16>(16, &[0, 1, 0x7fff, 0x8000, 0x8001, 0xffff]);
    }

    #[test]
    fn bf16_encode_matches_the_reference_on_every_rounding_case() {
        // Every sign, exponent and top 7 mantissa bits, with the 16 dropped bits below, at and
        // around the half-way point (NaNs and infinities included).
        for high in 0..(1u32 << 16) {
            for low in [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff] {
                let bits = (high << 16) | low;
                let value = f32::from_bits(bits);
                let want = u32::from(crate::dtype::f32_to_bf16_bits(value));
                assert_eq!(BFloat16::encode(value), want, "f32 bits {bits:#010x}");
            }
        }
    }

    #[test]
    fn encode_rounded_is_encode_on_every_rounded_value() {
        for h in 0..=u16::MAX {
            let bf = BFloat16::round(BFloat16::decode(u32::from(h)));
            assert_eq!(
                BFloat16::encode_rounded(bf),
                BFloat16::encode(bf),
                "bf16 bits {h:#06x}"
            );
            let f = Binary16::round(Binary16::decode(u32::from(h)));
            assert_eq!(
                Binary16::encode_rounded(f),
                Binary16::encode(f),
                "f16 bits {h:#06x}"
            );
        }
    }

    #[test]
    fn f16_round_is_the_round_trip_on_every_rounding_case() {
        // Every sign, exponent and top 10 mantissa bits, with the 13 dropped bits below, at and
        // around the half-way point (every subnormal grid's half-way points lie in the top bits).
        round_is_the_round_trip::<Binary16>(
            13,
            &[0, 1, 0x7ff, 0xfff, 0x1000, 0x1001, 0x17ff, 0x1800, 0x1fff],
        );
    }

    #[test]
    fn f16_encode_matches_the_reference_on_every_rounding_case() {
        // Every sign, exponent and top 10 mantissa bits, with the 13 dropped bits below, at
        // and above the half-way point.
        let lows = [
            0u32, 1, 0x7ff, 0xfff, 0x1000, 0x1001, 0x17ff, 0x1800, 0x1fff,
        ];
        for high in 0..(1u32 << 19) {
            for &low in &lows {
                let bits = (high << 13) | low;
                let value = f32::from_bits(bits);
                let want = u32::from(crate::dtype::f32_to_f16_bits(value));
                assert_eq!(Binary16::encode(value), want, "f32 bits {bits:#010x}");
            }
        }
    }
}
