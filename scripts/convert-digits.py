#!/usr/bin/env python3
"""Converts scikit-learn's copy of the UCI hand-written digits into www/data/digits.bin.

Run once (the output is committed); nothing in CI runs it:

    pip download scikit-learn --no-deps -d /tmp/skl
    python3 scripts/convert-digits.py /tmp/skl/scikit_learn-*.whl www/data/digits.bin

The input is the wheel (a zip holding sklearn/datasets/data/digits.csv.gz) or that .csv.gz
itself: 1,797 rows of 64 pixels (0..16, an 8x8 image row by row) and the label (0..9).

digits.bin, all integers little-endian:
    bytes 0..4    magic b"DGT1"
    bytes 4..6    u16 samples (1797)
    byte  6       u8 image rows (8)
    byte  7       u8 image columns (8)
    byte  8       u8 classes (10)
    byte  9       u8 largest pixel value (16)
    bytes 10..12  reserved, 0
    then samples x rows x columns u8 pixels (sample-major, each image row by row),
    then samples u8 labels.
"""

import csv
import gzip
import io
import struct
import sys
import zipfile

MEMBER = "sklearn/datasets/data/digits.csv.gz"


def read_rows(path):
    if path.endswith(".whl") or path.endswith(".zip"):
        with zipfile.ZipFile(path) as wheel:
            raw = wheel.read(MEMBER)
    else:
        with open(path, "rb") as f:
            raw = f.read()
    text = gzip.decompress(raw).decode("ascii")
    return [[int(float(v)) for v in row] for row in csv.reader(io.StringIO(text)) if row]


def main():
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} SKLEARN_WHEEL_OR_DIGITS_CSV_GZ OUT.bin")
    rows = read_rows(sys.argv[1])
    pixels = bytearray()
    labels = bytearray()
    for row in rows:
        if len(row) != 65 or not all(0 <= p <= 16 for p in row[:64]) or not 0 <= row[64] <= 9:
            sys.exit(f"unexpected row: {row}")
        pixels.extend(row[:64])
        labels.append(row[64])
    header = b"DGT1" + struct.pack("<HBBBBH", len(rows), 8, 8, 10, 16, 0)
    with open(sys.argv[2], "wb") as out:
        out.write(header + bytes(pixels) + bytes(labels))
    counts = [labels.count(c) for c in range(10)]
    print(f"{len(rows)} samples, per class {counts}, {12 + len(pixels) + len(labels)} bytes")


if __name__ == "__main__":
    main()
