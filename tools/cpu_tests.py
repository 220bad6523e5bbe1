#!/usr/bin/env python3
"""Prints, one per line, the CPU test suites of a configured meson build dir (every test but the CUDA ones, so
new CPU suites are covered without edits) or, with --targets, the ninja targets those suites need: the
sanitizer stage of tools/test.sh builds only these, not the CUDA suite it would never run.
Usage: tools/cpu_tests.py DIR [--targets]"""
import json
import os
import subprocess
import sys

builddir = os.path.abspath(sys.argv[1])
info = json.loads(subprocess.run(["meson", "introspect", builddir, "--tests", "--targets"], check=True,
                                 capture_output=True, text=True).stdout)
tests = [t for t in info["tests"] if "cuda" not in t["name"]]
if "--targets" not in sys.argv[2:]:
    print("\n".join(t["name"] for t in tests))
    sys.exit(0)
files = {t["id"]: t["filename"] for t in info["targets"]}
wanted = []
for t in tests:
    for dep in t["depends"]:
        for f in files.get(dep, []):
            rel = os.path.relpath(f, builddir)
            if rel not in wanted:
                wanted.append(rel)
print("\n".join(wanted))
