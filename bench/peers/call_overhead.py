#!/usr/bin/env python3
"""The fixed cost of one retort.losses call from Python: tiny shapes, where the kernels take microseconds and
the call path (argument checks, graph build or reuse, launches, waits) is the time. Each case runs --calls
calls back to back and waits once at the end, so the time per call is what a training loop pays; it also
prints how many times retort's host waited for the device per call (Backend.host_waits, where the module has
it). On the GPU the inputs are PyTorch tensors (DLPack, as users call it) and the results are taken back with
torch.from_dlpack; on the CPU, NumPy arrays.

Usage: PYTHONPATH=build/bindings python3 bench/peers/call_overhead.py [--device cpu|cuda] [--calls 2000]
       [--reps 7]
Run it on two builds (e.g. main and a branch) on the same machine to compare them.
"""

import argparse
import statistics
import time

import numpy as np

import retort


def cases(dev, torch):
    n, v, h = 8, 64, 16
    rng = np.random.default_rng(0)
    z = rng.standard_normal((n, v), dtype=np.float32)
    y = rng.integers(0, v, n)
    hid = rng.standard_normal((n, h), dtype=np.float32)
    w = rng.standard_normal((v, h), dtype=np.float32)
    if dev == "cuda":
        z, hid, w = (torch.from_numpy(a).cuda().to(torch.bfloat16) for a in (z, hid, w))
        y = torch.from_numpy(y).cuda()
    L = retort.losses
    return {
        "cross_entropy": lambda: L.cross_entropy(z, y),
        "cross_entropy grad": lambda: L.cross_entropy(z, y, return_grad=True),
        "entropy": lambda: L.entropy(z),
        "fused_linear_cross_entropy": lambda: L.fused_linear_cross_entropy(hid, w, y),
        "fused_linear_cross_entropy grad": lambda: L.fused_linear_cross_entropy(hid, w, y, return_grad=True),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    torch = None
    if a.device == "cuda":
        import torch
    be = retort.cuda() if a.device == "cuda" else retort.cpu()

    def drain():
        if torch is not None:
            torch.cuda.synchronize()

    print(f"retort {retort.__version__} on {be.name}, {a.calls} calls per rep, median of {a.reps}")
    print(f"{'case':34} {'us/call':>8} {'min':>8} {'waits/call':>10}")
    for name, fn in cases(a.device, torch).items():
        def take(r):  # what a user does with the result
            if torch is not None:
                return torch.from_dlpack(r if not isinstance(r, tuple) else r[0])
            return r
        for _ in range(200):
            take(fn())
        drain()
        per = []
        w0 = getattr(be, "host_waits", None)
        for _ in range(a.reps):
            drain()
            t0 = time.perf_counter()
            for _ in range(a.calls):
                take(fn())
            drain()
            per.append((time.perf_counter() - t0) / a.calls * 1e6)
        waits = "-" if w0 is None else f"{(be.host_waits - w0) / (a.calls * a.reps):.2f}"
        print(f"{name:34} {statistics.median(per):8.2f} {min(per):8.2f} {waits:>10}", flush=True)


if __name__ == "__main__":
    main()
