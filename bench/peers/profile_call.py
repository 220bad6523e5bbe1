#!/usr/bin/env python3
"""One fused loss call of bench/peers/sweep_fused.py's cells, repeated, for a phase profile: run with
RETORT_CHUNK_PROFILE=1 to get the fused op's phases (GEMMs, row passes) timed by CUDA events on its stream.

Usage: RETORT_CHUNK_PROFILE=1 PYTHONPATH=build-gpu/bindings python3 bench/peers/profile_call.py jsd 16384 768 50257
"""
import sys
import time

import torch

import sweep_fused


def main():
    loss, n, h, v = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    dtype = sys.argv[5] if len(sys.argv) > 5 else "bf16"
    c = sweep_fused.Cell(loss, n, h, v, dtype)
    for _ in range(6):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        c.retort_step()
        torch.cuda.synchronize()
        print(f"{loss} {dtype} N {n} H {h} V {v}: {(time.perf_counter() - t0) * 1e3:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
