#!/usr/bin/env python3
"""An independent reference forward pass of a GGUF llama / qwen2 model in NumPy, for parity checks.

It reads the file with the `gguf` package (llama.cpp's own reader and dequantizer), tokenizes with the HF
`tokenizers` package built from the file's vocabulary, and runs the decoder in float64 (or float32): RMSNorm,
RoPE as llama.cpp applies it (adjacent pairs for llama, NeoX halves for qwen2), grouped-query causal attention, SwiGLU, tied or untied head.
Nothing of retort is used, so agreement with retort is evidence for both.

  python3 tools/ref_forward.py MODEL.gguf --prompt "The capital of France is"
  python3 tools/ref_forward.py MODEL.gguf --text held_out.txt --positions 1024 --out ref.npz

pytest imports load_model / forward / hf_tokenizer from here.
"""
import argparse
import sys

import numpy as np


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def load_model(path, dtype=np.float64):
    """(config dict, {name: array}) with every tensor dequantized by gguf.quants, shapes outermost first."""
    import gguf

    r = gguf.GGUFReader(path)
    arch = _field(r, "general.architecture")
    if arch not in ("llama", "qwen2"):
        raise ValueError(f"{path}: architecture {arch!r} is not llama or qwen2")
    cfg = {
        "arch": arch,
        "layers": int(_field(r, f"{arch}.block_count")),
        "d_model": int(_field(r, f"{arch}.embedding_length")),
        "d_ff": int(_field(r, f"{arch}.feed_forward_length")),
        "heads": int(_field(r, f"{arch}.attention.head_count")),
        "eps": float(_field(r, f"{arch}.attention.layer_norm_rms_epsilon")),
        "theta": float(_field(r, f"{arch}.rope.freq_base", 10000.0)),
    }
    cfg["kv_heads"] = int(_field(r, f"{arch}.attention.head_count_kv", cfg["heads"]))
    weights = {}
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        weights[t.name] = np.asarray(a, dtype=np.float64).reshape(shape).astype(dtype)
    return cfg, weights


def hf_tokenizer(path):
    """A `tokenizers` Tokenizer from the GGUF's vocabulary and merges, with its pre-tokenizer."""
    import gguf
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    r = gguf.GGUFReader(path)
    tokens = [str(t) for t in _field(r, "tokenizer.ggml.tokens")]
    merges = [tuple(str(m).split(" ", 1)) for m in _field(r, "tokenizer.ggml.merges")]
    types = list(_field(r, "tokenizer.ggml.token_type", [1] * len(tokens)))
    pre = _field(r, "tokenizer.ggml.pre", "gpt2")
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("gpt2", "gpt-2", "default"):
        tok.pre_tokenizer = byte_level
    else:
        raise ValueError(f"{path}: pre-tokenizer {pre!r} not known to this script")
    tok.decoder = decoders.ByteLevel()
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
    return tok


def _rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x, theta):
    """x [T, heads, hd]: rotates the adjacent pairs (x[2i], x[2i+1]) of each head by pos * theta^(-2i/hd)."""
    T, _, hd = x.shape
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :].astype(x.dtype), np.sin(ang)[:, None, :].astype(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def _rope_neox(x, theta):
    """x [T, heads, hd]: rotates (x[i], x[i + hd/2]) by pos * theta^(-2i/hd) (llama.cpp's NeoX mode, qwen2's)."""
    T, _, hd = x.shape
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :].astype(x.dtype), np.sin(ang)[:, None, :].astype(x.dtype)
    a, b = x[..., : hd // 2], x[..., hd // 2:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def forward(cfg, w, ids):
    """Logits [T, vocab] for one sequence of token ids, in the weights' dtype."""
    ids = np.asarray(ids, dtype=np.int64)
    T = len(ids)
    H, KV, D = cfg["heads"], cfg["kv_heads"], cfg["d_model"]
    hd = D // H
    dt = w["token_embd.weight"].dtype
    x = w["token_embd.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf, dtype=dt), k=1)
    # llama.cpp rotates adjacent pairs for llama, and the two halves of each head (NeoX) for qwen2.
    rope = _rope_neox if cfg.get("arch") == "qwen2" else _rope
    for layer in range(cfg["layers"]):
        p = f"blk.{layer}."

        def lin(h, name):
            y = h @ w[p + name + ".weight"].T
            b = w.get(p + name + ".bias")
            return y if b is None else y + b

        h = _rms_norm(x, w[p + "attn_norm.weight"], cfg["eps"])
        q = rope(lin(h, "attn_q").reshape(T, H, hd), cfg["theta"])
        k = rope(lin(h, "attn_k").reshape(T, KV, hd), cfg["theta"])
        v = lin(h, "attn_v").reshape(T, KV, hd)
        k = np.repeat(k, H // KV, axis=1)
        v = np.repeat(v, H // KV, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        o = np.einsum("hts,shd->thd", s, v).reshape(T, H * hd)
        x = x + o @ w[p + "attn_output.weight"].T
        h = _rms_norm(x, w[p + "ffn_norm.weight"], cfg["eps"])
        g = h @ w[p + "ffn_gate.weight"].T
        u = h @ w[p + "ffn_up.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ w[p + "ffn_down.weight"].T
    x = _rms_norm(x, w["output_norm.weight"], cfg["eps"])
    head = w.get("output.weight", w["token_embd.weight"])
    return x @ head.T


def log_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf")
    ap.add_argument("--prompt", help="print the 5 most likely next tokens after this text")
    ap.add_argument("--text", help="a text file: run the first --positions tokens of it")
    ap.add_argument("--positions", type=int, default=1024)
    ap.add_argument("--f32", action="store_true", help="float32 instead of float64")
    ap.add_argument("--out", help="save ids and log-probs [positions, vocab] (float32) to this .npz")
    a = ap.parse_args()
    cfg, w = load_model(a.gguf, np.float32 if a.f32 else np.float64)
    tok = hf_tokenizer(a.gguf)
    if a.prompt is not None:
        ids = tok.encode(a.prompt).ids
        lp = log_softmax(forward(cfg, w, ids)[-1])
        best = np.argsort(-lp)[:5]
        print(f"prompt {a.prompt!r} -> ids {ids}")
        for i in best:
            print(f"  {tok.decode([int(i)])!r:>14} id {int(i):6d}  p {np.exp(lp[i]):.4f}")
    if a.text:
        ids = tok.encode(open(a.text, encoding="utf-8", errors="replace").read()).ids[: a.positions]
        lp = log_softmax(forward(cfg, w, ids))
        nll = -np.mean(lp[np.arange(len(ids) - 1), ids[1:]])
        print(f"{len(ids)} positions of {a.text}: mean next-token loss {nll:.4f} nats")
        if a.out:
            np.savez(a.out, ids=np.asarray(ids, dtype=np.int32), logprobs=lp.astype(np.float32))
    return 0


if __name__ == "__main__":
    sys.exit(main())
