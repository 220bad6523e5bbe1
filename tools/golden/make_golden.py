#!/usr/bin/env python3
"""Golden reference for retort's Transformer: logits, loss, every parameter gradient and ten AdamW steps of a
tiny model, computed in float64 from the initial parameters and token batches that retort wrote to
tests/data/golden/inputs.safetensors (so retort's init need not be reproduced here).

Two independent implementations of the same model, both float64 on the CPU:
  * PyTorch (autograd, F.cross_entropy, torch.optim.AdamW): the reference; writes fixture_torch.safetensors.
  * NumPy (hand-written backward, hand-written AdamW): runs anywhere; writes fixture_numpy.safetensors.
A PyTorch run computes the NumPy path too and refuses to write unless the two agree to ~1e-9.

Usage (from the repository root):
  python3 tools/golden/make_golden.py            # PyTorch: writes tests/data/golden/fixture_torch.safetensors
  python3 tools/golden/make_golden.py --numpy    # NumPy only: writes tests/data/golden/fixture_numpy.safetensors
  python3 tools/golden/make_golden.py --compare  # both, print the largest differences, write nothing
  python3 tools/golden/make_golden.py --numpy --check-grads   # NumPy backward vs central differences

Runtime dependencies: Python 3.8+, NumPy; PyTorch (any 2.x, CPU is enough) for the default and --compare.
The model, written out (shapes outermost first, linear weights [out, in], x @ W.T):
  x = tok_emb[tokens]                                   (the residual stream [B*T, d_model])
  per layer:  x += attn(rms(x) * attn_norm);  x += mlp(rms(x) * mlp_norm)
  logits = (rms(x) * final_norm) @ head.T                (head = tok_emb when tied)
  rms(x) = x / sqrt(mean(x^2) + eps)                     (eps inside the sqrt, per row)
  attn: q = h wq.T, k = h wk.T, v = h wv.T as [B, T, heads, hd]; RoPE on q and k rotates the interleaved pairs
        (2i, 2i+1) of each head at position p by p * theta^(-2i/hd); kv head j serves query heads
        j*(H/KV) .. j*(H/KV)+H/KV-1; causal softmax(q k.T / sqrt(hd)) v; heads side by side, then @ wo.T
  mlp:  (silu(h wg.T) * (h wu.T)) @ wd.T
  loss = mean over targets != ignore_index of cross-entropy
  train step k = 1..steps: loss and gradients on batch k-1; clip the global gradient norm to `clip`
        (g *= clip / norm when norm > clip); lr = cosine_lr(k); AdamW with decoupled weight decay on every
        parameter: p *= 1 - lr wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
        p -= lr / (1 - b1^k) * m / (sqrt(v) / sqrt(1 - b2^k) + eps)
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN_DIR = os.path.join(ROOT, "tests", "data", "golden")

# ---- safetensors, by hand (u64 LE header length, JSON header, raw little-endian data) ----------------------

_DTYPES = {"F64": "<f8", "F32": "<f4", "I64": "<i8", "I32": "<i4"}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    data = raw[8 + n :]
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        if e["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor {name} has dtype {e['dtype']}, this reader knows {list(_DTYPES)}")
        b, end = e["data_offsets"]
        arr = np.frombuffer(data[b:end], dtype=_DTYPES[e["dtype"]]).reshape(e["shape"])
        out[name] = arr.copy()
    return out, meta


def write_safetensors(path, tensors, metadata):
    """tensors: name -> array (float arrays are stored as F32, integer ones as I32: the dtypes retort reads)."""
    header = {"__metadata__": {k: str(v) for k, v in metadata.items()}}
    blobs, off = [], 0
    for name, a in tensors.items():
        a = np.asarray(a)
        if np.issubdtype(a.dtype, np.floating):
            dt, a = "F32", a.astype("<f4")
        else:
            dt, a = "I32", a.astype("<i4")
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


# ---- the inputs --------------------------------------------------------------------------------------------


def load_inputs(path):
    t, meta = read_safetensors(path)
    train = json.loads(meta["train"])
    models = {}
    for m in meta["models"].split(","):
        cfg = json.loads(meta[m + ".config"])
        prefix = m + "/params/"
        params = {k[len(prefix) :]: v.astype(np.float64) for k, v in t.items() if k.startswith(prefix)}
        order = cfg["param_order"].split(",")
        assert sorted(order) == sorted(params), (order, sorted(params))
        models[m] = (cfg, {k: params[k] for k in order})
    batches = {k: t[k].astype(np.int64) for k in ("tokens", "targets", "train_tokens", "train_targets")}
    return models, batches, train, meta


def cosine_lr(step, warmup, total, lr_max, lr_min):
    """examples/train.cpp's schedule (src/nn/optim.cpp cosine_lr), in float64."""
    if step < warmup:
        return lr_max * step / warmup
    if step >= total:
        return lr_min
    progress = (step - warmup) / (total - warmup)
    return lr_min + 0.5 * (lr_max - lr_min) * (1.0 + math.cos(math.pi * progress))


def head_name(cfg):
    return "tok_emb" if cfg["tie_embeddings"] else "lm_head"


# ---- NumPy: forward and hand-written backward --------------------------------------------------------------


def _rope_tables(T, hd, theta):
    i = np.arange(hd // 2, dtype=np.float64)
    freq = theta ** (-2.0 * i / hd)
    ang = np.arange(T, dtype=np.float64)[:, None] * freq[None, :]  # [T, hd/2]
    return np.cos(ang)[None, :, None, :], np.sin(ang)[None, :, None, :]  # broadcast over [B, T, heads, hd/2]


def _rope(x, c, s, inverse=False):
    """x [B, T, heads, hd]: rotates the pairs (2i, 2i+1); inverse rotates back (the adjoint)."""
    if inverse:
        s = -s
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = a * s + b * c
    return out


def _rms_fwd(x, eps):
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * r, r


def _rms_bwd(dn, x, r):
    # n = x r, r = (mean(x^2) + eps)^-1/2: dx = r dn - r^3 x mean(dn x)
    return r * dn - r**3 * x * np.mean(dn * x, axis=-1, keepdims=True)


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def numpy_forward_backward(cfg, P, tokens, targets, ignore_index):
    """Returns logits [B*T, V], loss, grads {name: array} (float64)."""
    B, T = tokens.shape
    N, D = B * T, cfg["d_model"]
    H, KV = cfg["heads"], cfg["kv_heads"]
    hd, rep, eps = D // H, H // KV, cfg["norm_eps"]
    scale = 1.0 / math.sqrt(hd)
    c, s = _rope_tables(T, hd, cfg["rope_theta"])
    mask = np.triu(np.ones((T, T), dtype=bool), k=1)  # key j > query i is hidden
    head = P[head_name(cfg)]
    ids = tokens.reshape(N)

    x = P["tok_emb"][ids]
    saved = []
    for layer in range(cfg["layers"]):
        L = f"layer{layer}."
        # attention
        n1, r1 = _rms_fwd(x, eps)
        h1 = n1 * P[L + "attn_norm"]
        q = _rope((h1 @ P[L + "wq"].T).reshape(B, T, H, hd), c, s)
        k = _rope((h1 @ P[L + "wk"].T).reshape(B, T, KV, hd), c, s)
        v = (h1 @ P[L + "wv"].T).reshape(B, T, KV, hd)
        qh = q.transpose(0, 2, 1, 3)
        kh = np.repeat(k, rep, axis=2).transpose(0, 2, 1, 3)  # query head h reads kv head h // rep
        vh = np.repeat(v, rep, axis=2).transpose(0, 2, 1, 3)
        sc = (qh @ kh.transpose(0, 1, 3, 2)) * scale
        sc = np.where(mask, -np.inf, sc)
        p = np.exp(sc - sc.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        o = (p @ vh).transpose(0, 2, 1, 3).reshape(N, H * hd)
        x_mid = x + o @ P[L + "wo"].T
        # mlp
        n2, r2 = _rms_fwd(x_mid, eps)
        h2 = n2 * P[L + "mlp_norm"]
        g = h2 @ P[L + "w_gate"].T
        u = h2 @ P[L + "w_up"].T
        sg = _sigmoid(g)
        a = g * sg
        m = a * u
        x_out = x_mid + m @ P[L + "w_down"].T
        saved.append(dict(x=x, n1=n1, r1=r1, h1=h1, qh=qh, kh=kh, vh=vh, p=p, o=o, x_mid=x_mid, n2=n2, r2=r2,
                          h2=h2, g=g, u=u, sg=sg, a=a, m=m))
        x = x_out
    nf, rf = _rms_fwd(x, eps)
    hf = nf * P["final_norm"]
    logits = hf @ head.T

    valid = targets.reshape(N) != ignore_index
    nvalid = int(valid.sum())
    mx = logits.max(axis=-1, keepdims=True)
    lse = (mx + np.log(np.exp(logits - mx).sum(axis=-1, keepdims=True)))[:, 0]
    tgt = np.where(valid, targets.reshape(N), 0)
    picked = logits[np.arange(N), tgt]
    loss = float(np.sum(np.where(valid, lse - picked, 0.0)) / max(nvalid, 1))

    # backward
    G = {k: np.zeros_like(v) for k, v in P.items()}
    dlogits = np.exp(logits - lse[:, None])
    dlogits[np.arange(N), tgt] -= 1.0
    dlogits *= (valid / max(nvalid, 1))[:, None]
    G[head_name(cfg)] += dlogits.T @ hf
    dhf = dlogits @ head
    G["final_norm"] += np.sum(dhf * nf, axis=0)
    dx = _rms_bwd(dhf * P["final_norm"], x, rf)
    for layer in reversed(range(cfg["layers"])):
        L, S = f"layer{layer}.", saved[layer]
        # mlp
        G[L + "w_down"] += dx.T @ S["m"]
        dm = dx @ P[L + "w_down"]
        da, du = dm * S["u"], dm * S["a"]
        dg = da * (S["sg"] + S["g"] * S["sg"] * (1.0 - S["sg"]))
        G[L + "w_gate"] += dg.T @ S["h2"]
        G[L + "w_up"] += du.T @ S["h2"]
        dh2 = dg @ P[L + "w_gate"] + du @ P[L + "w_up"]
        G[L + "mlp_norm"] += np.sum(dh2 * S["n2"], axis=0)
        dx = dx + _rms_bwd(dh2 * P[L + "mlp_norm"], S["x_mid"], S["r2"])
        # attention
        G[L + "wo"] += dx.T @ S["o"]
        do = (dx @ P[L + "wo"]).reshape(B, T, H, hd).transpose(0, 2, 1, 3)
        p = S["p"]
        dp = do @ S["vh"].transpose(0, 1, 3, 2)
        dvh = p.transpose(0, 1, 3, 2) @ do
        dsc = p * (dp - np.sum(dp * p, axis=-1, keepdims=True)) * scale
        dqh = dsc @ S["kh"]
        dkh = dsc.transpose(0, 1, 3, 2) @ S["qh"]
        dq = _rope(dqh.transpose(0, 2, 1, 3), c, s, inverse=True).reshape(N, H * hd)
        dk = dkh.transpose(0, 2, 1, 3).reshape(B, T, KV, rep, hd).sum(axis=3)
        dk = _rope(dk, c, s, inverse=True).reshape(N, KV * hd)
        dv = dvh.transpose(0, 2, 1, 3).reshape(B, T, KV, rep, hd).sum(axis=3).reshape(N, KV * hd)
        h1 = S["h1"]
        G[L + "wq"] += dq.T @ h1
        G[L + "wk"] += dk.T @ h1
        G[L + "wv"] += dv.T @ h1
        dh1 = dq @ P[L + "wq"] + dk @ P[L + "wk"] + dv @ P[L + "wv"]
        G[L + "attn_norm"] += np.sum(dh1 * S["n1"], axis=0)
        dx = dx + _rms_bwd(dh1 * P[L + "attn_norm"], S["x"], S["r1"])
    np.add.at(G["tok_emb"], ids, dx)
    return logits, loss, G


class NumpyBackend:
    name = "numpy"

    def __init__(self, cfg, params, ignore_index):
        self.cfg, self.ignore = cfg, ignore_index
        self.P = {k: v.copy() for k, v in params.items()}

    def step_values(self, tokens, targets):
        return numpy_forward_backward(self.cfg, self.P, tokens, targets, self.ignore)

    def train(self, batches, tr):
        P, out = self.P, {"losses": [], "grad_norms": [], "lrs": []}
        m = {k: np.zeros_like(v) for k, v in P.items()}
        v = {k: np.zeros_like(x) for k, x in P.items()}
        b1, b2, eps, wd = tr["beta1"], tr["beta2"], tr["eps"], tr["weight_decay"]
        for step in range(1, tr["steps"] + 1):
            _, loss, G = numpy_forward_backward(self.cfg, P, batches["train_tokens"][step - 1],
                                                batches["train_targets"][step - 1], self.ignore)
            norm = math.sqrt(sum(float(np.sum(g * g)) for g in G.values()))
            if tr["clip"] > 0 and norm > tr["clip"]:
                for g in G.values():
                    g *= tr["clip"] / norm
            lr = cosine_lr(step, tr["warmup"], tr["total"], tr["lr_max"], tr["lr_min"])
            for k in P:
                g = G[k]
                m[k] = b1 * m[k] + (1 - b1) * g
                v[k] = b2 * v[k] + (1 - b2) * g * g
                P[k] *= 1 - lr * wd
                P[k] -= lr / (1 - b1**step) * m[k] / (np.sqrt(v[k]) / math.sqrt(1 - b2**step) + eps)
            out["losses"].append(loss)
            out["grad_norms"].append(norm)
            out["lrs"].append(lr)
        _, out["final_loss"], _ = numpy_forward_backward(self.cfg, P, batches["tokens"], batches["targets"],
                                                         self.ignore)
        return out


# ---- PyTorch: the same model with autograd -----------------------------------------------------------------


class TorchBackend:
    name = "torch"

    def __init__(self, cfg, params, ignore_index):
        import torch  # noqa: F401 (imported here so the NumPy path runs without it)

        self.torch = torch
        self.cfg, self.ignore = cfg, ignore_index
        self.P = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in params.items()}

    def _loss(self, tokens, targets):
        torch, cfg, P = self.torch, self.cfg, self.P
        F = torch.nn.functional
        tokens = torch.as_tensor(tokens, dtype=torch.int64)
        targets = torch.as_tensor(targets, dtype=torch.int64)
        B, T = tokens.shape
        N, D = B * T, cfg["d_model"]
        H, KV = cfg["heads"], cfg["kv_heads"]
        hd, eps = D // H, cfg["norm_eps"]
        i = torch.arange(hd // 2, dtype=torch.float64)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * cfg["rope_theta"] ** (-2.0 * i / hd)
        cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]

        def rms(x, w):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

        def rope(x):  # x [B, T, heads, hd]; pairs (2i, 2i+1)
            a, b = x[..., 0::2], x[..., 1::2]
            return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)

        causal = torch.ones(T, T, dtype=torch.bool).tril()
        x = P["tok_emb"][tokens.reshape(N)]
        for layer in range(cfg["layers"]):
            L = f"layer{layer}."
            h = rms(x, P[L + "attn_norm"])
            q = rope((h @ P[L + "wq"].T).view(B, T, H, hd)).transpose(1, 2)
            k = rope((h @ P[L + "wk"].T).view(B, T, KV, hd)).transpose(1, 2)
            v = (h @ P[L + "wv"].T).view(B, T, KV, hd).transpose(1, 2)
            k = k.repeat_interleave(H // KV, dim=1)
            v = v.repeat_interleave(H // KV, dim=1)
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
            o = (probs @ v).transpose(1, 2).reshape(N, H * hd)
            x = x + o @ P[L + "wo"].T
            h = rms(x, P[L + "mlp_norm"])
            x = x + (F.silu(h @ P[L + "w_gate"].T) * (h @ P[L + "w_up"].T)) @ P[L + "w_down"].T
        logits = rms(x, P["final_norm"]) @ P[head_name(cfg)].T
        loss = F.cross_entropy(logits, targets.reshape(N), ignore_index=self.ignore, reduction="mean")
        return logits, loss

    def step_values(self, tokens, targets):
        for p in self.P.values():
            p.grad = None
        logits, loss = self._loss(tokens, targets)
        loss.backward()
        G = {k: p.grad.detach().numpy().copy() for k, p in self.P.items()}
        return logits.detach().numpy(), float(loss.detach()), G

    def train(self, batches, tr):
        torch = self.torch
        params = list(self.P.values())
        opt = torch.optim.AdamW(params, lr=tr["lr_max"], betas=(tr["beta1"], tr["beta2"]), eps=tr["eps"],
                                weight_decay=tr["weight_decay"], foreach=False)
        out = {"losses": [], "grad_norms": [], "lrs": []}
        for step in range(1, tr["steps"] + 1):
            opt.zero_grad(set_to_none=True)
            _, loss = self._loss(batches["train_tokens"][step - 1], batches["train_targets"][step - 1])
            loss.backward()
            # By hand: torch.nn.utils.clip_grad_norm_ divides by norm + 1e-6, retort by the norm.
            with torch.no_grad():
                norm = math.sqrt(sum(float((p.grad * p.grad).sum()) for p in params))
                if tr["clip"] > 0 and norm > tr["clip"]:
                    for p in params:
                        p.grad.mul_(tr["clip"] / norm)
            lr = cosine_lr(step, tr["warmup"], tr["total"], tr["lr_max"], tr["lr_min"])
            for group in opt.param_groups:
                group["lr"] = lr
            opt.step()
            out["losses"].append(float(loss))
            out["grad_norms"].append(norm)
            out["lrs"].append(lr)
        with torch.no_grad():
            _, final = self._loss(batches["tokens"], batches["targets"])
        out["final_loss"] = float(final)
        return out


# ---- driver ------------------------------------------------------------------------------------------------


def compute(backend_cls, models, batches, train, ignore_index):
    """name -> array: per model, the logits, loss, every gradient, and the training run."""
    res = {}
    for mname, (cfg, params) in models.items():
        be = backend_cls(cfg, params, ignore_index)
        logits, loss, G = be.step_values(batches["tokens"], batches["targets"])
        res[f"{mname}/logits"] = logits
        res[f"{mname}/loss"] = np.array([loss])
        for k in params:
            res[f"{mname}/grad/{k}"] = G[k]
        tr = backend_cls(cfg, params, ignore_index).train(batches, train)
        res[f"{mname}/train_losses"] = np.array(tr["losses"])
        res[f"{mname}/train_grad_norms"] = np.array(tr["grad_norms"])
        res[f"{mname}/train_lrs"] = np.array(tr["lrs"])
        res[f"{mname}/final_loss"] = np.array([tr["final_loss"]])
    return res


def max_diffs(a, b):
    """Largest |a - b| / max|a| per entry, and the worst."""
    worst, rows = 0.0, []
    for k in a:
        scale = max(float(np.max(np.abs(a[k]))), 1e-30)
        d = float(np.max(np.abs(np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64)))) / scale
        rows.append((d, k))
        worst = max(worst, d)
    return worst, sorted(rows, reverse=True)


def check_grads(models, batches, ignore_index, rng):
    """NumPy backward against central differences of the NumPy forward, a few coordinates per parameter."""
    worst = 0.0
    for mname, (cfg, params) in models.items():
        _, _, G = numpy_forward_backward(cfg, params, batches["tokens"], batches["targets"], ignore_index)
        for k, p in params.items():
            for _ in range(4):
                idx = tuple(int(rng.integers(0, n)) for n in p.shape)
                h = 1e-6
                P = {kk: vv.copy() for kk, vv in params.items()}
                P[k][idx] += h
                lp = numpy_forward_backward(cfg, P, batches["tokens"], batches["targets"], ignore_index)[1]
                P[k][idx] -= 2 * h
                lm = numpy_forward_backward(cfg, P, batches["tokens"], batches["targets"], ignore_index)[1]
                fd = (lp - lm) / (2 * h)
                err = abs(fd - G[k][idx]) / max(float(np.max(np.abs(G[k]))), 1e-12)
                worst = max(worst, err)
                if err > 1e-6:
                    print(f"  {mname}/{k}{list(idx)}: analytic {G[k][idx]:.10g} finite-diff {fd:.10g}")
    print(f"check-grads: worst |analytic - finite difference| / max|grad| = {worst:.2e}")
    return worst < 1e-6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", default=os.path.join(GOLDEN_DIR, "inputs.safetensors"))
    ap.add_argument("--out", default=None, help="fixture path (default: tests/data/golden/fixture_<impl>.safetensors)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--numpy", action="store_true", help="NumPy only (no PyTorch needed)")
    mode.add_argument("--compare", action="store_true", help="run both, print differences, write nothing")
    ap.add_argument("--check-grads", action="store_true", help="also check the NumPy backward numerically")
    args = ap.parse_args()

    models, batches, train, meta = load_inputs(args.inputs)
    ignore = int(meta["ignore_index"])
    print(f"inputs: {args.inputs}: models {', '.join(models)}; batch {list(batches['tokens'].shape)}, "
          f"{train['steps']} AdamW steps")
    if args.check_grads and not check_grads(models, batches, ignore, np.random.default_rng(0)):
        sys.exit("check-grads FAILED")

    ref_np = compute(NumpyBackend, models, batches, train, ignore)
    impl, ref = "numpy", ref_np
    if not args.numpy:
        try:
            import torch
        except ImportError:
            sys.exit("PyTorch is not installed: run with --numpy for the NumPy reference")
        torch.set_num_threads(min(4, torch.get_num_threads()))
        ref = compute(TorchBackend, models, batches, train, ignore)
        impl = "torch"
        worst, rows = max_diffs(ref, ref_np)
        print(f"torch {torch.__version__} vs numpy, float64: worst relative difference {worst:.2e}")
        for d, k in rows[:8]:
            print(f"  {d:.2e}  {k}")
        if worst > 1e-8:
            sys.exit("torch and numpy disagree: not writing a fixture (a bug in one of the two paths)")
        if args.compare:
            return
    for mname in models:
        print(f"{impl} {mname}: loss {ref[mname + '/loss'][0]:.6f}; train losses "
              + " ".join(f"{x:.4f}" for x in ref[mname + "/train_losses"])
              + f"; final {ref[mname + '/final_loss'][0]:.6f}; grad norms "
              + " ".join(f"{x:.3f}" for x in ref[mname + "/train_grad_norms"]))
    out = args.out or os.path.join(GOLDEN_DIR, f"fixture_{impl}.safetensors")
    version = np.__version__
    if impl == "torch":
        import torch

        version = torch.__version__
    write_safetensors(out, ref, {"generator": f"tools/golden/make_golden.py {impl} {version} float64",
                                 "inputs": os.path.basename(args.inputs)})
    print(f"wrote {out} ({os.path.getsize(out)} bytes)")


if __name__ == "__main__":
    main()
