#!/usr/bin/env python3
"""Fused lm-head losses over a grid of shapes and dtypes, called the way users call them: retort's Python
module with default options on PyTorch CUDA tensors (through DLPack), against the cuBLAS floor and against
torch.compile of the same loss, in one process, forward + backward, interleaved, median of --reps.

PyTorch is a peer here, never a dependency of retort: this script runs where torch is installed (the GPU
image). Cells: shapes (N, H, V) that cover N in {1024, 4096, 16384}, H in {768, 2000, 2048, 4096}, V in
{32000, 49152, 50257, 128256, 151936} (--grid full: every combination), losses CE, top-K KD + 0.5 CE (K 8, 64,
128) and online JSD (beta 0.5, teacher H = min(2H, 4096)), dtypes bf16 and f16.

The floor is what any fused implementation must do on the tensor cores: the GEMMs of the forward logits and
of the two gradients (hidden and weight), plus the teacher's logits GEMM for online JSD, timed as torch.matmul
(cuBLAS) in the same dtype. torch.compile compiles each cell's shape once (static shapes, its default), and
its compile time is not counted. Peak memory: the allocator's peak above what the inputs hold, during one
forward + backward (retort: Backend.memory_stats; torch: torch.cuda.max_memory_allocated).

Prints one row per cell and, last, a summary: the worst and the median ratio to the floor for retort and for
torch.compile, and the cells where retort is slower than torch.compile.

Usage: PYTHONPATH=build/bindings python3 bench/peers/sweep_fused.py [--dtypes bf16,f16] [--losses ce,topk64]
       [--grid cover|full] [--reps 7] [--no-compile] [--json out.json]
"""

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch._dynamo

import retort

COVER = [  # every N, H and V value at least once, and the headline shape of issue 23
    (1024, 768, 32000),
    (1024, 4096, 151936),
    (4096, 2000, 50257),
    (4096, 2048, 128256),
    (4096, 4096, 151936),
    (16384, 768, 50257),
    (16384, 2000, 128256),
    (16384, 4096, 49152),
    (8192, 4096, 128256),
]
FULL = [(n, h, v) for n in (1024, 4096, 16384) for h in (768, 2000, 2048, 4096)
        for v in (32000, 49152, 50257, 128256, 151936)]
LOSSES = ["ce", "topk8", "topk64", "topk128", "jsd"]


def timed(fn, reps, warmup=2):
    """Median wall time of fn() in ms, the device drained before and after (retort and torch queue work on
    streams of their own, so events on one stream would miss the other's work)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


class Cell:
    def __init__(self, loss, n, h, v, dtype, seed=0):
        self.loss, self.n, self.h, self.v, self.dtype = loss, n, h, v, dtype
        g = torch.Generator(device="cuda").manual_seed(seed)
        dt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
        self.hidden = (torch.randn(n, h, device="cuda", generator=g) * 0.5).to(dt)
        self.weight = (torch.randn(v, h, device="cuda", generator=g) / math.sqrt(h)).to(dt)
        self.labels = torch.randint(0, v, (n,), device="cuda", generator=g)
        self.k = int(loss[4:]) if loss.startswith("topk") else 0
        if self.k:
            # a teacher's top K: distinct ids, log-probs of a peaked distribution over them
            self.ids = torch.topk(torch.rand(n, v, device="cuda", generator=g), self.k, dim=1).indices
            lp = torch.log_softmax(torch.randn(n, self.k, device="cuda", generator=g) * 2, dim=1) - 0.1
            self.logprobs = lp.float()
        # The floor's lm-head is padded to a multiple of 128 rows (zeros) like retort's and the C++ bench's:
        # an odd V gives rows whose byte stride is not 16-byte aligned, which cuBLAS runs several times slower.
        vp = (v + 127) // 128 * 128
        self.weight_p = torch.zeros(vp, h, device="cuda", dtype=dt)
        self.weight_p[:v] = self.weight
        if loss == "jsd":
            self.ht = min(2 * h, 4096)
            self.t_hidden = (torch.randn(n, self.ht, device="cuda", generator=g) * 0.5).to(dt)
            self.t_weight = (torch.randn(v, self.ht, device="cuda", generator=g) / math.sqrt(self.ht)).to(dt)
            self.t_weight_p = torch.zeros(vp, self.ht, device="cuda", dtype=dt)
            self.t_weight_p[:v] = self.t_weight

    # ---- retort, default options ----
    budget = 0  # logits_budget in bytes (0: retort's default)

    def retort_step(self):
        L = retort.losses
        kw = {"logits_budget": self.budget} if self.budget else {}
        if self.loss == "ce":
            r = L.fused_linear_cross_entropy(self.hidden, self.weight, self.labels, return_grad=True, **kw)
        elif self.k:
            r = L.fused_linear_topk_kd(self.hidden, self.weight, self.ids, self.logprobs, None, self.labels,
                                       w_hard=0.5, w_soft=1.0, return_grad=True, **kw)
        else:
            r = L.fused_linear_distill(self.hidden, self.weight, self.t_hidden, self.t_weight, beta=0.5,
                                       return_grad=True, **kw)
        return r

    # ---- the PyTorch reference ----
    def torch_loss(self, h, w):
        z = (h @ w.T).float()
        if self.loss == "ce":
            return torch.nn.functional.cross_entropy(z, self.labels)
        if self.k:
            lq = torch.log_softmax(z, dim=1)
            p = self.logprobs.exp()
            soft = (p * (self.logprobs - lq.gather(1, self.ids))).sum(1).mean()
            hard = torch.nn.functional.nll_loss(lq, self.labels)
            return 0.5 * hard + soft
        zt = (self.t_hidden @ self.t_weight.T).float()
        lq, lp = torch.log_softmax(z, 1), torch.log_softmax(zt, 1)
        lm = torch.logsumexp(torch.stack([lp, lq]), 0) - math.log(2.0)
        return 0.5 * ((lp.exp() * (lp - lm)).sum(1) + (lq.exp() * (lq - lm)).sum(1)).mean()

    def torch_step(self, fn):
        h = self.hidden.detach().requires_grad_(True)
        w = self.weight.detach().requires_grad_(True)
        loss = fn(h, w)
        loss.backward()
        return loss

    def floor_step(self):
        z = self.hidden @ self.weight_p.T
        _ = z @ self.weight_p  # d hidden
        _ = z.T @ self.hidden  # d weight
        if self.loss == "jsd":
            _ = self.t_hidden @ self.t_weight_p.T


ROW_SHAPES = [(1024, 32000), (4096, 50257), (4096, 128256), (8192, 151936), (16384, 49152)]


def row_losses(a, be):
    """Entropy and selective log-softmax (K = 1, the sampled token) on given logits [N, V]: forward against
    a read of the logits (torch.sum), forward + backward against a read and a write (a copy) — the floors of
    a one-pass row kernel — and against torch.compile of the same function with autograd."""
    print(f"{'row loss':22} {'dtype':5} {'N':>6} {'V':>7} {'floor':>7} {'retort':>7} {'x':>6} {'compile':>8} "
          f"{'x':>6}", flush=True)
    out = []
    for dtype in a.dtypes.split(","):
        dt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
        for n, v in ROW_SHAPES:
            z = (torch.randn(n, v, device="cuda") * 2).to(dt)
            work = z.clone()
            dst = torch.empty_like(z)
            ids = torch.randint(0, v, (n, 1), device="cuda")
            go = torch.randn(n, 1, device="cuda")

            def ent(x):
                lp = torch.log_softmax(x.float(), 1)
                return -(lp.exp() * lp).sum(1).mean()

            def sel(x):
                return torch.log_softmax(x.float(), 1).gather(1, ids)

            def torch_fb(f, x, g=None):
                xx = x.detach().requires_grad_(True)
                y = f(xx)
                y.backward(g)
                return xx.grad

            cases = [
                ("entropy fwd", "read", lambda: retort.losses.entropy(z), None),
                ("entropy fwd+bwd", "copy", lambda: retort.losses.entropy(z, reduction="mean", return_grad=True),
                 lambda f: torch_fb(f, z)),
                ("entropy fwd+bwd inpl", "copy",
                 lambda: retort.losses.entropy(work, reduction="mean", inplace_grad=True), None),
                ("selective fwd", "read", lambda: retort.losses.selective_log_softmax(z, ids), None),
                ("selective fwd+bwd", "copy", lambda: retort.losses.selective_log_softmax(z, ids, grad_output=go),
                 lambda f: torch_fb(f, z, go)),
            ]
            for name, floor, fn, tfn in cases:
                compiled = None
                if tfn is not None and not a.no_compile:
                    torch._dynamo.reset()
                    compiled = torch.compile(ent if name.startswith("entropy") else sel)
                    tfn(compiled)
                fl, rt, tc = [], [], []
                for _ in range(a.reps):
                    fl.append(timed((lambda: z.sum()) if floor == "read" else (lambda: dst.copy_(z)), 1, 1))
                    rt.append(timed(fn, 1, 1))
                    if compiled is not None:
                        tc.append(timed(lambda: tfn(compiled), 1, 1))
                fm, rm = statistics.median(fl), statistics.median(rt)
                tm = statistics.median(tc) if tc else float("nan")
                out.append(dict(loss=name, dtype=dtype, n=n, v=v, floor=fm, retort=rm, compile=tm,
                                r_floor=rm / fm, c_floor=tm / fm))
                print(f"{name:22} {dtype:5} {n:>6} {v:>7} {fm:7.3f} {rm:7.3f} {rm / fm:6.3f} {tm:8.3f} "
                      f"{tm / fm:6.3f}", flush=True)
            del z, work, dst
            torch.cuda.empty_cache()
            be.empty_cache()
    for kind in ("fwd", "fwd+bwd"):
        sel_rows = sorted(x["r_floor"] for x in out if x["loss"].endswith(kind) or
                          (kind == "fwd+bwd" and x["loss"].endswith("inpl")))
        print(f"row losses {kind}: retort / floor median {statistics.median(sel_rows):.3f}, "
              f"worst {sel_rows[-1]:.3f}")
    return out


def peak_extra(fn, be):
    """Peak bytes above the current allocation during fn(), for retort (its allocator) or torch."""
    torch.cuda.synchronize()
    if be is None:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    be.synchronize()
    be.reset_peak_memory_stats()
    base = be.memory_stats()["current"]
    r = fn()
    be.synchronize()
    peak = be.memory_stats()["peak"] - base
    del r
    return peak


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="bf16,f16")
    ap.add_argument("--losses", default=",".join(LOSSES))
    ap.add_argument("--grid", default="cover", choices=["cover", "full"])
    ap.add_argument("--shapes", default="", help="N,H,V;N,H,V... instead of --grid")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (retort vs the floor only)")
    ap.add_argument("--rows", action="store_true", help="the row losses on given logits instead")
    ap.add_argument("--budget-mib", type=int, default=0, help="retort's logits_budget (0: its default)")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    shapes = COVER if a.grid == "cover" else FULL
    if a.shapes:
        shapes = [tuple(int(x) for x in s.split(",")) for s in a.shapes.split(";")]
    be = retort.cuda(0)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, retort {retort.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    print(f"{'loss':8} {'dtype':5} {'N':>6} {'H':>5} {'V':>7} {'floor ms':>9} {'retort':>8} {'x':>6} "
          f"{'compile':>8} {'x':>6} {'r/c':>6} {'r MiB':>7} {'c MiB':>7}", flush=True)
    if a.rows:
        res = row_losses(a, be)
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(res, fh, indent=1)
        return 0
    rows = []
    for dtype in a.dtypes.split(","):
        for loss in a.losses.split(","):
            for n, h, v in shapes:
                c = Cell(loss, n, h, v, dtype)
                c.budget = a.budget_mib << 20
                torch._dynamo.reset()  # a fresh static-shape compile per cell, never a dynamic fallback
                compiled = None if a.no_compile else torch.compile(c.torch_loss)
                if compiled is not None:
                    try:
                        c.torch_step(compiled)  # compile outside the timing
                        torch.cuda.synchronize()
                    except torch.cuda.OutOfMemoryError:
                        print(f"  ({loss} {dtype} {n} {h} {v}: torch.compile runs out of memory)", flush=True)
                        compiled = None
                        torch.cuda.empty_cache()
                f, r, t = [], [], []
                for _ in range(a.reps):  # interleaved: each sample of each under the same clocks
                    f.append(timed(c.floor_step, 1, warmup=1))
                    r.append(timed(c.retort_step, 1, warmup=1))
                    if compiled is not None:
                        t.append(timed(lambda: c.torch_step(compiled), 1, warmup=1))
                fm, rm = statistics.median(f), statistics.median(r)
                tm = statistics.median(t) if t else float("nan")
                rmem = peak_extra(c.retort_step, be) / 2**20
                tmem = peak_extra(lambda: c.torch_step(compiled), None) / 2**20 if compiled else float("nan")
                row = dict(loss=loss, dtype=dtype, n=n, h=h, v=v, floor=fm, retort=rm, compile=tm,
                           device=torch.cuda.get_device_name(0),
                           r_floor=rm / fm, c_floor=tm / fm, r_c=rm / tm, r_mib=rmem, c_mib=tmem)
                rows.append(row)
                print(f"{loss:8} {dtype:5} {n:>6} {h:>5} {v:>7} {fm:9.3f} {rm:8.3f} {rm / fm:6.3f} "
                      f"{tm:8.3f} {tm / fm:6.3f} {rm / tm:6.3f} {rmem:7.0f} {tmem:7.0f}", flush=True)
                del c, compiled
                torch.cuda.empty_cache()
                be.empty_cache()
    rf = sorted(x["r_floor"] for x in rows)
    print(f"\nretort / floor: median {statistics.median(rf):.3f}, worst {rf[-1]:.3f} "
          f"({len(rows)} cells)")
    if not a.no_compile:
        cf = sorted(x["c_floor"] for x in rows if not math.isnan(x["c_floor"]))
        print(f"torch.compile / floor: median {statistics.median(cf):.3f}, worst {cf[-1]:.3f}")
        slower = [x for x in rows if x["r_c"] > 1.0]
        print(f"cells where retort is slower than torch.compile: {len(slower)}")
        for x in slower:
            print(f"  {x['loss']} {x['dtype']} N {x['n']} H {x['h']} V {x['v']}: {x['r_c']:.3f}x")
    print(f"retort peak extra memory: max {max(x['r_mib'] for x in rows):.0f} MiB")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    sys.exit(main())
