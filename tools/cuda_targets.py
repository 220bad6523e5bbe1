#!/usr/bin/env python3
"""Reads `meson introspect --targets` on stdin and prints, one per line, the ninja names of the targets that hold
CUDA: the library, a CUDA source, C++ that uses the CUDA backend (its header or RETORT_HAS_CUDA), and the CUDA
test suite (test_cuda), which runs there to show why it skips. tools/test.sh builds only these in build-cuda/
when the machine has no GPU, so CUDA is compiled once, as a check.
Usage: meson introspect DIR --targets | tools/cuda_targets.py DIR"""
import json
import os
import sys

builddir = os.path.abspath(sys.argv[1])
marks = ("cuda_backend.h", "RETORT_HAS_CUDA", "cuda_runtime")


def uses_cuda(path):
    if path.endswith(".cu"):
        return True
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return False
    return any(m in text for m in marks)


for t in json.load(sys.stdin):
    if t["type"] not in ("executable", "shared library", "static library"):
        continue
    sources = [s for ts in t.get("target_sources", []) for s in ts.get("sources", [])]
    if t["name"] in ("retort", "test_cuda") or any(uses_cuda(s) for s in sources):
        for f in t["filename"]:
            print(os.path.relpath(f, builddir))
