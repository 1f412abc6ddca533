//! Test arenas the CPU optimizer kernels' tests share (`sgd.rs`, `adam.rs`, `average.rs`,
//! `parts.rs`): deterministic values with the awkward ones among them, copies, and a bit-for-bit
//! comparison that lets a NaN match any NaN.

use crate::backend::kernels::{ParamStarts, host_words};
use crate::backend::{Arena, ArenaStorage, layout_params};
use crate::dtype::StorageFormat;

/// A deterministic stream of values with zeros of both signs, subnormals, huge values,
/// infinities and NaNs among ordinary ones.
pub(super) struct Values(pub(super) u64);

impl Values {
    fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) as u32
    }

    fn value(&mut self) -> f32 {
        let r = self.next_u32();
        match r % 40 {
            0 => 0.0,
            1 => -0.0,
            2 => f32::from_bits(r >> 9),
            3 => f32::INFINITY,
            4 => f32::NAN,
            5 => 70000.0,
            6 => 1e-6,
            _ => (r % 20_000) as f32 / 10_000.0 - 1.0,
        }
    }
}

pub(super) fn arena(format: StorageFormat, ranks: usize, rank_len: usize, v: &mut Values) -> Arena {
    let words = format.words_for(rank_len) * ranks;
    let mut data = vec![0u32; words];
    let n = ranks * rank_len;
    for i in 0..n {
        let x = v.value();
        if format == StorageFormat::F64 {
            format.store_f64(&mut data, i, f64::from(x));
        } else {
            format.store(&mut data, i, x);
        }
        // Now and then a 16-bit NaN with a payload, quiet or signaling, which no store
        // writes (stores write the canonical NaN).
        if i % 97 == 5 {
            let nan = match format {
                StorageFormat::F16 => [0x7c01u32, 0xfe05][i % 2],
                StorageFormat::BF16 => [0x7f81u32, 0xffc5][i % 2],
                _ => continue,
            };
            let shift = 16 * (i % 2) as u32;
            data[i / 2] = (data[i / 2] & !(0xffff << shift)) | (nan << shift);
        }
    }
    Arena::new(
        format,
        ranks,
        rank_len,
        rank_len,
        ArenaStorage::Host(data.into()),
    )
}

pub(super) fn copy(a: &Arena) -> Arena {
    let words = host_words(a).unwrap().to_vec();
    Arena::new(
        a.format(),
        a.ranks(),
        a.rank_len(),
        a.rank_len(),
        ArenaStorage::Host(words.into()),
    )
}

/// Bit for bit, except that a NaN matches any NaN (payload and sign are not specified).
pub(super) fn same(a: &Arena, b: &Arena, what: &str) {
    let format = a.format();
    let n = a.ranks() * a.rank_len();
    let words = (host_words(a).unwrap(), host_words(b).unwrap());
    for i in 0..n {
        let (x, y) = if format == StorageFormat::F64 {
            (format.load_f64(words.0, i), format.load_f64(words.1, i))
        } else {
            let (x, y) = (format.load(words.0, i), format.load(words.1, i));
            (f64::from(x), f64::from(y))
        };
        let ok = (x.is_nan() && y.is_nan()) || x.to_bits() == y.to_bits();
        assert!(ok, "{what}: element {i}: {x:e} != reference {y:e}");
    }
}

/// Parameter sizes with tiny ones, slot-sized and odd ones, and one big enough to be split
/// between threads.
pub(super) const SIZES: [usize; 8] = [1, 63, 64, 65, 7, 3000, 2, 70_001];

/// The parameter table of [`SIZES`] laid out on the slots, and the elements of a rank.
pub(super) fn sizes_table() -> (ParamStarts, usize) {
    let (offsets, rank_len) = layout_params(&SIZES);
    (
        ParamStarts(offsets.iter().map(|&o| o as u32).collect()),
        rank_len,
    )
}

pub(super) const FORMATS: [StorageFormat; 4] = [
    StorageFormat::F32,
    StorageFormat::F16,
    StorageFormat::BF16,
    StorageFormat::F64,
];
