#!/usr/bin/env python3
"""Counts test results for tools/test.sh and prints them as one line: "N passed, M failed[, K skipped]".

Sources:
  --meson DIR     a meson build dir after `meson test`: meson-logs/testlog.json says how each test binary ended,
                  meson-logs/testlog.junit.xml holds the GoogleTest cases of tests run with protocol 'gtest'.
                  A gtest binary counts as its cases (none if it has none); any other test counts as one. A binary that failed with
                  no failing case (a crash, a sanitizer report at exit, a timeout) adds one failure, so a
                  failure can never be counted as a pass.
  --pytest FILE   a pytest --junitxml file.
  --result NAME=FILE  a file holding "pass", "fail" or "skip" (one check run by the script itself).
  --skips FILE    only list the skipped cases of junit files (meson's or pytest's; repeatable), grouped by
                  their whole reason (no count line).
Missing files count as nothing: a stage that did not run is reported by the caller.
"""
import argparse
import json
import os
import sys
import xml.etree.ElementTree as ET


class Tally:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0
        self.failures = []  # names, for the report

    def add(self, other):
        self.passed += other.passed
        self.failed += other.failed
        self.skipped += other.skipped
        self.failures += other.failures

    def line(self):
        s = f"{self.passed} passed, {self.failed} failed"
        return s + (f", {self.skipped} skipped" if self.skipped else "")


def case_outcome(case):
    """'fail', 'skip' or 'pass' for a junit <testcase>."""
    if case.find("failure") is not None or case.find("error") is not None:
        return "fail"
    if case.find("skipped") is not None or case.get("status") == "notrun":
        return "skip"
    return "pass"


def read_junit(path):
    try:
        return ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None


def meson_tally(builddir):
    t = Tally()
    log = os.path.join(builddir, "meson-logs", "testlog.json")
    if not os.path.exists(log):
        return t
    root = read_junit(os.path.join(builddir, "meson-logs", "testlog.junit.xml"))
    suites = root.findall(".//testsuite") if root is not None else []
    tag = os.path.basename(os.path.normpath(builddir))
    with open(log) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            rec = json.loads(line)
            name, result = rec["name"], rec["result"]
            # meson names a gtest binary's suites "<project>.<test name>.<gtest suite>".
            prefix = f".{name}."
            cases = [c for s in suites if prefix in s.get("name", "") for c in s.findall("testcase")]
            sub = Tally()
            for c in cases:
                o = case_outcome(c)
                if o == "fail":
                    sub.failed += 1
                    sub.failures.append(f"{tag}: {name}: {c.get('classname')}.{c.get('name')}")
                elif o == "skip":
                    sub.skipped += 1
                else:
                    sub.passed += 1
            bad = result not in ("OK", "SKIP", "EXPECTEDFAIL")
            ran_gtest = "[==========]" in (rec.get("stdout") or "")
            if not cases and ran_gtest and not bad:
                pass  # a GoogleTest binary with no cases yet tests nothing: count nothing
            elif not cases:
                if bad:
                    sub.failed, sub.failures = 1, [f"{tag}: {name} ({result})"]
                elif result == "SKIP":
                    sub.skipped = 1
                else:
                    sub.passed = 1
            elif bad and sub.failed == 0:
                sub.failed = 1
                sub.failures.append(f"{tag}: {name} ({result}, after its cases passed: crash or sanitizer?)")
            t.add(sub)
    return t


def pytest_tally(path):
    t = Tally()
    root = read_junit(path) if path and os.path.exists(path) else None
    if root is None:
        return t
    for c in root.iter("testcase"):
        o = case_outcome(c)
        if o == "fail":
            t.failed += 1
            t.failures.append(f"pytest: {c.get('classname')}.{c.get('name')}")
        elif o == "skip":
            t.skipped += 1
        else:
            t.passed += 1
    return t


def list_skips(paths):
    """Prints the skipped cases of junit files grouped by reason: one line per reason, with the suites it covers."""
    roots = [r for r in (read_junit(p) for p in paths if os.path.exists(p)) if r is not None]
    by_reason = {}
    for c in (c for r in roots for c in r.iter("testcase")):
        sk = c.find("skipped")
        if sk is None:
            continue
        # GoogleTest puts "file:line" on a line before the reason; pytest gives "file:line: reason" on one.
        lines = [ln.strip() for ln in (sk.get("message") or sk.text or "").strip().splitlines() if ln.strip()]
        why = lines[-1] if lines else "no reason given"
        # The suite: GoogleTest's test suite, or pytest's module (bindings.tests.test_dlpack -> test_dlpack).
        by_reason.setdefault(why, []).append((c.get("classname") or "?").split(".")[-1])
    total = sum(len(v) for v in by_reason.values())
    if not total:
        return
    print(f"{total} test case(s) skipped:")
    for why, cases in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        suites = sorted(set(cases))
        names = ", ".join(suites[:6]) + (f", ... ({len(suites)} suites)" if len(suites) > 6 else "")
        print(f"  {len(cases)} in {names}: {why}")  # whole: a cut reason hides the part that says why


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--meson", action="append", default=[])
    ap.add_argument("--pytest")
    ap.add_argument("--result", action="append", default=[])
    ap.add_argument("--skips", action="append", default=[])
    a = ap.parse_args()
    if a.skips:
        list_skips(a.skips)
        return 0
    total = Tally()
    for d in a.meson:
        total.add(meson_tally(d))
    total.add(pytest_tally(a.pytest))
    for r in a.result:
        name, _, path = r.partition("=")
        try:
            with open(path) as f:
                v = f.read().strip()
        except OSError:
            continue
        if v == "pass":
            total.passed += 1
        elif v == "skip":
            total.skipped += 1
        else:
            total.failed += 1
            total.failures.append(name)
    for f in total.failures[:30]:
        print(f"FAILED {f}")
    if len(total.failures) > 30:
        print(f"... and {len(total.failures) - 30} more failures")
    print(total.line())
    return 1 if total.failed else 0


if __name__ == "__main__":
    sys.exit(main())
