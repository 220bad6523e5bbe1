#!/usr/bin/env python3
"""Decompresses a vendored .gz data file into the build tree and checks its sha256 (from data/PROVENANCE.md).

Usage: unpack_data.py INPUT.gz OUTPUT SHA256
Writes to a temporary name and renames, so an interrupted build never leaves a torn file behind.
"""
import gzip
import hashlib
import os
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, dst, want = sys.argv[1:]
    with gzip.open(src, "rb") as f:
        data = f.read()
    got = hashlib.sha256(data).hexdigest()
    if got != want:
        sys.exit(f"{src}: sha256 of the decompressed data is {got}, expected {want} (see data/PROVENANCE.md)")
    tmp = dst + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, dst)


if __name__ == "__main__":
    main()
