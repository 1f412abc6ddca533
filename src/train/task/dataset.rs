//! [`Dataset`]: features and labels given by the caller, and the UCI hand-written digits the
//! library embeds ([`DIGITS_BIN`], [`Dataset::digits`]).

use super::shards::MAX_ELEMENTS;
use crate::error::{Error, Result};

/// The bytes of `www/data/digits.bin`: the UCI ML hand-written digits (E. Alpaydin and
/// C. Kaynak, CC BY 4.0; see `www/data/README.md`), in the layout
/// `scripts/convert-digits.py` documents.
pub const DIGITS_BIN: &[u8] = include_bytes!("../../../www/data/digits.bin");

/// A labelled classification data set: `len` samples of `features` values each and their
/// labels in `0..classes`.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    pub(super) name: String,
    pub(super) features: usize,
    pub(super) classes: usize,
    /// `len × features`, row-major.
    pub(super) inputs: Vec<f64>,
    pub(super) labels: Vec<usize>,
}

impl Dataset {
    /// A data set from row-major `inputs` (`labels.len()` rows of `features` values) and
    /// `labels` (each below `classes`).
    ///
    /// # Errors
    /// `ValueError` when the sizes disagree, a value is not finite, a label is out of range,
    /// there are fewer than 2 classes or no samples, or the data is too large.
    pub fn new(
        name: impl Into<String>,
        features: usize,
        classes: usize,
        inputs: Vec<f64>,
        labels: Vec<usize>,
    ) -> Result<Dataset> {
        if classes < 2 {
            return Err(Error::value(format!(
                "a classification data set needs at least 2 classes, got {classes}"
            )));
        }
        if labels.is_empty() || features == 0 {
            return Err(Error::value(
                "a data set needs at least one sample of at least one feature",
            ));
        }
        if inputs.len() > MAX_ELEMENTS {
            return Err(Error::value(format!(
                "a data set of {} values is too large (at most {MAX_ELEMENTS})",
                inputs.len()
            )));
        }
        if labels.len().checked_mul(features) != Some(inputs.len()) {
            return Err(Error::value(format!(
                "{} labels of {features} features need {} values, got {}",
                labels.len(),
                labels.len().saturating_mul(features),
                inputs.len()
            )));
        }
        if let Some(i) = inputs.iter().position(|x| !x.is_finite()) {
            return Err(Error::value(format!(
                "feature {} of sample {} is {}: features must be finite",
                i % features,
                i / features,
                inputs[i]
            )));
        }
        if let Some(i) = labels.iter().position(|&l| l >= classes) {
            return Err(Error::value(format!(
                "label {} of sample {i} is out of range for {classes} classes",
                labels[i]
            )));
        }
        Ok(Dataset {
            name: name.into(),
            features,
            classes,
            inputs,
            labels,
        })
    }

    /// Parses the `digits.bin` layout (see `scripts/convert-digits.py`): pixels become
    /// features in `[0, 1]` (divided by the largest pixel value the header gives).
    ///
    /// # Errors
    /// `ValueError` for bytes that are not that layout (wrong magic, truncated, labels out of
    /// range).
    pub fn from_digits_bin(bytes: &[u8]) -> Result<Dataset> {
        const HEADER: usize = 12;
        if bytes.len() < HEADER || &bytes[..4] != b"DGT1" {
            return Err(Error::value(
                "not a digits file: it must start with the 12-byte header \"DGT1\"…",
            ));
        }
        let samples = usize::from(u16::from_le_bytes([bytes[4], bytes[5]]));
        let features = usize::from(bytes[6]) * usize::from(bytes[7]);
        let (classes, max) = (usize::from(bytes[8]), f64::from(bytes[9]));
        if max == 0.0 {
            return Err(Error::value("a digits file's largest pixel value is 0"));
        }
        let expected = HEADER + samples * features + samples;
        if bytes.len() != expected {
            return Err(Error::value(format!(
                "a digits file of {samples} samples of {features} pixels has {expected} bytes, got {}",
                bytes.len()
            )));
        }
        let pixels = &bytes[HEADER..HEADER + samples * features];
        let labels = &bytes[HEADER + samples * features..];
        Dataset::new(
            "digits",
            features,
            classes,
            pixels.iter().map(|&p| f64::from(p) / max).collect(),
            labels.iter().map(|&l| usize::from(l)).collect(),
        )
    }

    /// The UCI ML hand-written digits embedded in the library ([`DIGITS_BIN`]): 1,797 images
    /// of 8×8 pixels scaled to `[0, 1]`, 10 classes.
    ///
    /// # Errors
    /// None in practice (the embedded file is tested); the signature keeps parsing honest.
    pub fn digits() -> Result<Dataset> {
        Dataset::from_digits_bin(DIGITS_BIN)
    }

    /// The data set's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no samples (never, for a data set that was constructed).
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Values per sample.
    pub fn features(&self) -> usize {
        self.features
    }

    /// Classes.
    pub fn classes(&self) -> usize {
        self.classes
    }

    /// The labels.
    pub fn labels(&self) -> &[usize] {
        &self.labels
    }

    /// Sample `i`'s features (`None` out of range).
    pub fn sample(&self, i: usize) -> Option<&[f64]> {
        self.inputs.get(i * self.features..(i + 1) * self.features)
    }

    /// How many samples of each class the data set holds.
    pub fn class_counts(&self) -> Vec<usize> {
        let mut counts = vec![0; self.classes];
        for &l in &self.labels {
            counts[l] += 1;
        }
        counts
    }
}
