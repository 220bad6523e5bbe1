"""Pretrained models from files people have: GGUF (written here by the `gguf` package, llama.cpp's own writer,
in every weight type retort reads) and Hugging Face directories (config.json, safetensors written by the
`safetensors` package or by hand for bf16, tokenizer.json by `tokenizers`). Logits are checked against
independent NumPy forwards: tools/ref_forward.py for GGUF's adjacent-pair RoPE, and a rotate-half forward in
this file for HF's layout. Bad files must raise retort.Error naming the file and the fault. The real
SmolLM2-135M runs when it can be fetched (tools/fetch_model.py), else those tests skip saying why."""

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import retort

gguf = pytest.importorskip("gguf", reason="the gguf package (llama.cpp's reader/writer) is not installed")
tokenizers = pytest.importorskip("tokenizers", reason="the tokenizers package is not installed")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import ref_forward  # noqa: E402

Q = gguf.GGMLQuantizationType
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def corpus(n=60_000):
    for p in (os.path.join(ROOT, "build", "data", "kjv.txt"), os.path.join(ROOT, "data", "kjv.txt")):
        if os.path.exists(p):
            return open(p, encoding="utf-8").read()[:n]
    return ("In the beginning God created the heaven and the earth. 1 2 3 And the earth was without form. " * 600)[:n]


@pytest.fixture(scope="module")
def bpe():
    """A small byte-level BPE trained by `tokenizers` (specials first, as SmolLM2 has them)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([corpus()], trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    assert [i for _, i in vocab] == list(range(len(tokens)))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tok, tokens, merges


def rng_weights(cfg, seed, scale=0.08):
    """Random parameters by GGUF name, f32, shapes outermost first."""
    r = np.random.default_rng(seed)
    D, F, H, KV, V = cfg["d_model"], cfg["d_ff"], cfg["heads"], cfg["kv_heads"], cfg["vocab"]
    hd = D // H
    w = {"token_embd.weight": r.normal(0, 0.5, (V, D)), "output_norm.weight": 1 + r.normal(0, 0.1, D)}
    if not cfg.get("tied", True):
        w["output.weight"] = r.normal(0, scale, (V, D))
    for layer in range(cfg["layers"]):
        p = f"blk.{layer}."
        w[p + "attn_norm.weight"] = 1 + r.normal(0, 0.1, D)
        w[p + "ffn_norm.weight"] = 1 + r.normal(0, 0.1, D)
        w[p + "attn_q.weight"] = r.normal(0, scale, (H * hd, D))
        w[p + "attn_k.weight"] = r.normal(0, scale, (KV * hd, D))
        w[p + "attn_v.weight"] = r.normal(0, scale, (KV * hd, D))
        w[p + "attn_output.weight"] = r.normal(0, scale, (D, H * hd))
        w[p + "ffn_gate.weight"] = r.normal(0, scale, (F, D))
        w[p + "ffn_up.weight"] = r.normal(0, scale, (F, D))
        w[p + "ffn_down.weight"] = r.normal(0, scale, (D, F))
        if cfg.get("bias"):
            for n, rows in (("attn_q", H * hd), ("attn_k", KV * hd), ("attn_v", KV * hd)):
                w[p + n + ".bias"] = r.normal(0, 0.2, rows)
    return {k: v.astype(np.float32) for k, v in w.items()}


# Weight types spread over the tensors, so one small model exercises every format the gguf package quantizes.
MATRIX_TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1]


def write_gguf(path, cfg, weights, tokens, merges, arch="llama", types=None, pre="gpt2", drop=(), extra_kv=None,
               shape_override=None):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("retort test model")
    w.add_block_count(cfg["layers"])
    w.add_context_length(cfg["context"])
    w.add_embedding_length(cfg["d_model"])
    w.add_feed_forward_length(cfg["d_ff"])
    w.add_head_count(cfg["heads"])
    w.add_head_count_kv(cfg["kv_heads"])
    w.add_rope_freq_base(cfg["theta"])
    w.add_layer_norm_rms_eps(cfg["eps"])
    w.add_rope_dimension_count(cfg["d_model"] // cfg["heads"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    for k, v in (extra_kv or {}).items():
        getattr(w, k)(*v)
    types = types or {}
    for i, (name, a) in enumerate(weights.items()):
        if name in drop:
            continue
        if shape_override and name in shape_override:
            a = np.resize(a, shape_override[name]).astype(np.float32)
        t = types.get(name)
        if t is None:
            t = Q.F32 if a.ndim == 1 else MATRIX_TYPES[i % len(MATRIX_TYPES)]
        if t == Q.F32:
            w.add_tensor(name, a)
        elif t == Q.F16:
            w.add_tensor(name, a.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(a, t), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def tiny_cfg(vocab, **kw):
    cfg = dict(vocab=vocab, context=64, layers=2, d_model=64, heads=4, kv_heads=2, d_ff=96, theta=10000.0, eps=1e-5)
    cfg.update(kw)
    return cfg


def compare_logits(model, cfg_path_or_ref, ids, tol):
    cfg, w = cfg_path_or_ref
    ref = ref_forward.forward(cfg, w, ids)
    got = model.logits(np.asarray(ids)[None, :])[0]
    scale = np.abs(ref).max()
    err = np.abs(got - ref).max() / scale
    assert err < tol, f"max |logit - reference| / max |reference| = {err:.3g} (tolerance {tol:g})"
    assert np.array_equal(got.argmax(-1), ref.argmax(-1))
    return err


@pytest.mark.parametrize("arch, tied", [("llama", True), ("llama", False), ("qwen2", False)])
def test_gguf_every_weight_type_matches_reference_forward(tmp_path, bpe, arch, tied):
    tok, tokens, merges = bpe
    cfg = tiny_cfg(len(tokens), tied=tied, bias=arch == "qwen2")
    path = write_gguf(tmp_path / "m.gguf", cfg, rng_weights(cfg, 1), tokens, merges, arch=arch)
    m = retort.load_model(path)
    c = m.config
    assert (c.vocab, c.layers, c.d_model, c.heads, c.kv_heads, c.d_ff) == (len(tokens), 2, 64, 4, 2, 96)
    assert c.tie_embeddings == tied and c.qkv_bias == (arch == "qwen2")
    text = corpus()[1000:1400]
    ids = tok.encode(text).ids
    assert m.tokenizer.encode(text) == ids
    assert m.tokenizer.eos_id == tokens.index("<|im_end|>")
    compare_logits(m, ref_forward.load_model(path), ids[:60], 2e-5)


def test_gguf_k_quant_tensor(tmp_path, bpe):
    """Q4_K / Q5_K / Q6_K blocks (the gguf package cannot quantize them: random blocks with small scales)."""
    tok, tokens, merges = bpe
    cfg = tiny_cfg(len(tokens), d_model=256, heads=4, kv_heads=4, d_ff=256, layers=1)
    weights = rng_weights(cfg, 2)
    path = str(tmp_path / "k.gguf")
    w = gguf.GGUFWriter(path, "llama")
    for k, v in [("add_block_count", 1), ("add_context_length", 64), ("add_embedding_length", 256),
                 ("add_feed_forward_length", 256), ("add_head_count", 4), ("add_head_count_kv", 4),
                 ("add_layer_norm_rms_eps", 1e-5)]:
        getattr(w, k)(v)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    r = np.random.default_rng(3)
    sizes = {Q.Q4_K: (144, (0, 2)), Q.Q5_K: (176, (0, 2)), Q.Q6_K: (210, (208, 210))}
    kinds = [Q.Q4_K, Q.Q5_K, Q.Q6_K]
    for i, (name, a) in enumerate(weights.items()):
        if a.ndim == 1 or name == "token_embd.weight":
            w.add_tensor(name, a)
            continue
        t = kinds[i % 3]
        nbytes, (d0, d1) = sizes[t]
        blocks = r.integers(0, 256, size=(a.shape[0], a.shape[1] // 256, nbytes), dtype=np.uint8)
        d = np.frombuffer(np.float16(0.002).tobytes(), dtype=np.uint8)
        blocks[..., d0:d1] = d  # the super-block scale
        if t != Q.Q6_K:
            blocks[..., 2:4] = np.frombuffer(np.float16(0.001).tobytes(), dtype=np.uint8)  # dmin
        w.add_tensor(name, blocks.reshape(a.shape[0], -1), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    m = retort.load_model(path)
    ids = tok.encode(corpus()[:300]).ids[:40]
    compare_logits(m, ref_forward.load_model(path), ids, 2e-5)


def expect_error(match, fn, *args):
    with pytest.raises(retort.Error, match=match) as info:
        fn(*args)
    return str(info.value)


def test_gguf_bad_files(tmp_path, bpe):
    tok, tokens, merges = bpe
    cfg = tiny_cfg(len(tokens))
    good = rng_weights(cfg, 4)
    p = write_gguf(tmp_path / "arch.gguf", cfg, good, tokens, merges, arch="gptneox")
    assert "arch.gguf" in expect_error("architecture 'gptneox' is not supported", retort.load_model, p)
    p = write_gguf(tmp_path / "missing.gguf", cfg, good, tokens, merges, drop=("blk.1.ffn_up.weight",))
    expect_error("missing.gguf.*no tensor for parameter layer1.w_up", retort.load_model, p)
    p = write_gguf(tmp_path / "shape.gguf", cfg, good, tokens, merges, shape_override={"blk.0.attn_k.weight": (64, 64)},
                   types={"blk.0.attn_k.weight": Q.F32})
    expect_error(r"shape.gguf.*blk.0.attn_k.weight has shape \[64, 64\], expected \[32, 64\]", retort.load_model, p)
    extra = dict(good)
    extra["blk.0.attn_output.bias"] = np.zeros(64, np.float32)
    p = write_gguf(tmp_path / "extra.gguf", cfg, extra, tokens, merges)
    expect_error("extra.gguf.*blk.0.attn_output.bias is not a parameter", retort.load_model, p)
    p = write_gguf(tmp_path / "vocab.gguf", cfg, good, tokens, merges, extra_kv={"add_vocab_size": (len(tokens) + 5,)})
    expect_error("vocab.gguf.*vocab_size is", retort.load_model, p)
    p = write_gguf(tmp_path / "pre.gguf", cfg, good, tokens, merges, pre="made-up")
    expect_error("pre.gguf.*made-up", retort.load_model, p)
    p = write_gguf(tmp_path / "scaling.gguf", cfg, good, tokens, merges, extra_kv={"add_rope_scaling_type": (gguf.RopeScalingType.LINEAR,)})
    expect_error("scaling.gguf.*RoPE scaling", retort.load_model, p)
    data = open(write_gguf(tmp_path / "full.gguf", cfg, good, tokens, merges), "rb").read()
    for cut in (3, 20, len(data) // 3, len(data) - 7):
        t = tmp_path / f"cut{cut}.gguf"
        t.write_bytes(data[:cut])
        expect_error(f"cut{cut}.gguf", retort.load_model, str(t))


# ---- Hugging Face directories ------------------------------------------------------------------------------

def hf_weights_from(cfg, w):
    """HF names and HF's rotate-half q/k layout from the GGUF-layout weights (llama.cpp's conversion, inverted)."""
    H, KV, D = cfg["heads"], cfg["kv_heads"], cfg["d_model"]
    hd = D // H

    def unpermute(a, heads):
        shape = a.shape
        return a.reshape(heads, hd // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)

    out = {"model.embed_tokens.weight": w["token_embd.weight"], "model.norm.weight": w["output_norm.weight"]}
    if "output.weight" in w:
        out["lm_head.weight"] = w["output.weight"]
    names = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
             "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
             "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
             "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
             "attn_v.bias": "self_attn.v_proj.bias", "ffn_gate.weight": "mlp.gate_proj.weight",
             "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight"}
    for k, a in w.items():
        if not k.startswith("blk."):
            continue
        _, layer, rest = k.split(".", 2)
        if rest.startswith("attn_q"):
            a = unpermute(a, H)
        elif rest.startswith("attn_k"):
            a = unpermute(a, KV)
        out[f"model.layers.{layer}.{names[rest]}"] = a
    return out


def hf_forward(cfg, w, ids):
    """HF Llama's forward, in float64: rotate-half RoPE (element i pairs with i + hd/2)."""
    H, KV, D = cfg["heads"], cfg["kv_heads"], cfg["d_model"]
    hd, T = D // H, len(ids)
    w = {k: v.astype(np.float64) for k, v in w.items()}
    inv = cfg["theta"] ** (-np.arange(0, hd, 2) / hd)
    ang = np.arange(T)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1))[:, None], np.sin(np.concatenate([ang, ang], -1))[:, None]

    def rope(x):
        rot = np.concatenate([-x[..., hd // 2:], x[..., : hd // 2]], -1)
        return x * cos + rot * sin

    def norm(x, g):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + cfg["eps"]) * g

    x = w["model.embed_tokens.weight"][ids]
    for layer in range(cfg["layers"]):
        p = f"model.layers.{layer}."

        def lin(h, n):
            y = h @ w[p + n + ".weight"].T
            return y + w[p + n + ".bias"] if p + n + ".bias" in w else y

        h = norm(x, w[p + "input_layernorm.weight"])
        q = rope(lin(h, "self_attn.q_proj").reshape(T, H, hd))
        k = np.repeat(rope(lin(h, "self_attn.k_proj").reshape(T, KV, hd)), H // KV, 1)
        v = np.repeat(lin(h, "self_attn.v_proj").reshape(T, KV, hd), H // KV, 1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + np.triu(np.full((T, T), -np.inf), 1)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        x = x + np.einsum("hts,shd->thd", s, v).reshape(T, D) @ w[p + "self_attn.o_proj.weight"].T
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        g, u = lin(h, "mlp.gate_proj"), lin(h, "mlp.up_proj")
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T
    x = norm(x, w["model.norm.weight"])
    return x @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T


def to_bf16_bytes(a):
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()


def write_safetensors(path, tensors, dtype):
    """safetensors by hand (the package's NumPy writer has no bf16)."""
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        b = to_bf16_bytes(a) if dtype == "BF16" else np.ascontiguousarray(a, dtype=np.float16 if dtype == "F16" else np.float32).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_hf(d, cfg, w, tok, arch="llama", dtype="F32", shards=1, **config_extra):
    d.mkdir(exist_ok=True)
    hw = hf_weights_from(cfg, w)
    config = {"model_type": arch, "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                                     "mistral": "MistralForCausalLM"}[arch]],
              "vocab_size": cfg["vocab"], "hidden_size": cfg["d_model"], "intermediate_size": cfg["d_ff"],
              "num_hidden_layers": cfg["layers"], "num_attention_heads": cfg["heads"],
              "num_key_value_heads": cfg["kv_heads"], "max_position_embeddings": cfg["context"],
              "rms_norm_eps": cfg["eps"], "rope_theta": cfg["theta"], "tie_word_embeddings": "lm_head.weight" not in hw,
              "rope_scaling": None, "torch_dtype": {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[dtype]}
    config.update(config_extra)
    (d / "config.json").write_text(json.dumps(config))
    tok.save(str(d / "tokenizer.json"))
    names = list(hw)
    if shards == 1:
        if dtype == "F32":
            from safetensors.numpy import save_file
            save_file({k: np.ascontiguousarray(v) for k, v in hw.items()}, str(d / "model.safetensors"))
        else:
            write_safetensors(d / "model.safetensors", hw, dtype)
    else:
        weight_map = {}
        for s in range(shards):
            part = {k: hw[k] for k in names[s::shards]}
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            write_safetensors(d / fname, part, dtype)
            weight_map.update({k: fname for k in part})
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return hw


@pytest.mark.parametrize("arch, dtype, shards, tied", [("llama", "F32", 1, True), ("llama", "BF16", 2, False),
                                                       ("qwen2", "F16", 1, False), ("mistral", "BF16", 3, True)])
def test_hf_directory_matches_rotate_half_forward(tmp_path, bpe, arch, dtype, shards, tied):
    pytest.importorskip("safetensors", reason="the safetensors package is not installed")
    tok, tokens, _ = bpe
    cfg = tiny_cfg(len(tokens), tied=tied, bias=arch == "qwen2")
    w = rng_weights(cfg, 5)
    if dtype != "F32":  # the reference sees the stored values
        w = {k: (np.frombuffer(to_bf16_bytes(v), np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(v.shape)
             if dtype == "BF16" else v.astype(np.float16).astype(np.float32) for k, v in w.items()}
    hw = write_hf(tmp_path / "hf", cfg, w, tok, arch=arch, dtype=dtype, shards=shards)
    m = retort.load_model(str(tmp_path / "hf"))
    assert m.config.tie_embeddings == tied and m.config.qkv_bias == (arch == "qwen2")
    ids = tok.encode(corpus()[2000:2400]).ids[:50]
    assert m.tokenizer.encode(corpus()[2000:2400]) == tok.encode(corpus()[2000:2400]).ids
    ref = hf_forward(cfg, hw, ids)
    got = m.logits(np.asarray(ids)[None])[0]
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err < 2e-5, err
    # The same weights through GGUF give the same logits: the two layouts meet. llama.cpp's converter keeps
    # qwen2's q/k in HF's rotate-half order (llama.cpp runs qwen2 with NeoX RoPE) and permutes llama's.
    gw = dict(w)
    if arch == "qwen2":
        for k in w:
            if k.startswith("blk.") and k.split(".")[2] in ("attn_q", "attn_k"):
                layer, rest = k.split(".", 2)[1:]
                hf = {"attn_q.weight": "q_proj.weight", "attn_q.bias": "q_proj.bias", "attn_k.weight": "k_proj.weight",
                      "attn_k.bias": "k_proj.bias"}[rest]
                gw[k] = hw[f"model.layers.{layer}.self_attn.{hf}"]
    g = write_gguf(tmp_path / "same.gguf", cfg, gw, tokens, _, arch="qwen2" if arch == "qwen2" else "llama",
                   types={k: Q.F32 for k in w})
    assert np.abs(retort.load_model(g).logits(np.asarray(ids)[None])[0] - got).max() < 1e-4 * np.abs(ref).max()


def test_hf_bad_directories(tmp_path, bpe):
    pytest.importorskip("safetensors", reason="the safetensors package is not installed")
    tok, tokens, _ = bpe
    cfg = tiny_cfg(len(tokens))
    w = rng_weights(cfg, 6)
    d = tmp_path / "a"
    write_hf(d, cfg, w, tok, rope_scaling={"type": "linear", "factor": 2.0})
    expect_error("config.json.*rope_scaling", retort.load_model, str(d))
    d = tmp_path / "b"
    write_hf(d, cfg, w, tok, model_type="gpt2")
    expect_error("config.json.*model_type 'gpt2' is not supported", retort.load_model, str(d))
    d = tmp_path / "c"
    write_hf(d, cfg, w, tok, vocab_size=len(tokens) - 10)
    expect_error("tokenizer.json.*more than the model's vocab_size", retort.load_model, str(d))
    d = tmp_path / "d"
    write_hf(d, cfg, w, tok, shards=2)
    os.remove(d / "model-00002-of-00002.safetensors")
    expect_error("model-00002-of-00002.safetensors", retort.load_model, str(d))
    expect_error("without config.json", retort.load_model, str(tmp_path))


# ---- the real model --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2():
    path = os.environ.get("RETORT_SMOLLM2_GGUF")
    if path and os.path.exists(path):
        return path
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "fetch_model.py"), "smollm2-135m"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"SmolLM2-135M could not be fetched (tools/fetch_model.py: {r.stderr.strip()[-300:]})")
    return r.stdout.strip()


def test_smollm2_known_answers(smollm2):
    m = retort.load_model(smollm2)
    c = m.config
    assert (c.layers, c.d_model, c.heads, c.kv_heads, c.d_ff, c.vocab) == (30, 576, 9, 3, 1536, 49152)
    assert c.tie_embeddings and abs(c.rope_theta - 100000) < 1
    t = m.tokenizer
    for prompt, answer, p_min in (("The capital of France is", " Paris", 0.7), ("Once upon a time", ",", 0.9)):
        ids = t.encode(prompt)
        lp = m.logits(np.asarray(ids)[None])[0, -1].astype(np.float64)
        p = np.exp(lp - lp.max())
        p /= p.sum()
        assert t.decode([int(p.argmax())]) == answer.encode() and p.max() > p_min, (prompt, p.max())


def test_smollm2_parity_with_reference_forward(smollm2):
    """≥ 1,000 held-out positions: retort f32 against the float64 NumPy forward on llama.cpp's dequantization."""
    m = retort.load_model(smollm2)
    text = open(os.path.join(ROOT, "build", "data", "austen.txt"), encoding="utf-8").read()[-60_000:] \
        if os.path.exists(os.path.join(ROOT, "build", "data", "austen.txt")) else corpus()[-60_000:]
    ids = m.tokenizer.encode(text)[:1024]
    cfg, w = ref_forward.load_model(smollm2, np.float64)
    ref = ref_forward.log_softmax(ref_forward.forward(cfg, w, ids))
    got = m.logits(np.asarray(ids)[None])[0].astype(np.float64)
    got = ref_forward.log_softmax(got)
    dmax = np.abs(got - ref).max()
    agree = np.mean(got.argmax(-1) == ref.argmax(-1))
    print(f"SmolLM2-135M, {len(ids)} positions: max |d log-prob| {dmax:.2e}, top-1 agreement {agree:.4f}")
    assert len(ids) >= 1000
    assert dmax < 1e-3 and agree == 1.0


# ---- the example programs on a pretrained teacher ----------------------------------------------------------

def programs():
    d = os.path.join(ROOT, "build", "examples")
    if not all(os.path.exists(os.path.join(d, p)) for p in ("teacher-cache", "distill", "train", "eval", "generate")):
        pytest.skip("the example programs are not built (build/examples)")
    return d


def run(*args):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    assert r.returncode == 0, f"{args[0]} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return r.stdout + r.stderr


def test_programs_distill_from_a_gguf_teacher(tmp_path, bpe):
    """teacher-cache, distill (--init-from-teacher, offline and online), train with the teacher's tokenizer,
    eval and generate (--chat) on a small GGUF teacher, from a text file."""
    x = programs()
    tok, tokens, merges = bpe
    cfg = tiny_cfg(len(tokens), layers=3)
    teacher = write_gguf(tmp_path / "t.gguf", cfg, rng_weights(cfg, 7), tokens, merges)
    text = tmp_path / "text.txt"
    text.write_text(corpus(30_000))
    shards = tmp_path / "text.t"
    data = ["--data", text, "--shards", shards, "--context", 32, "--device", "cpu", "--threads", 1]
    out = run(f"{x}/teacher-cache", "--teacher", teacher, *data, "--k", 8, "--batch", 4, "--out", tmp_path / "c")
    assert "teacher: gguf llama" in out and "cache:" in out
    student = ["--layers", 2, "--steps", 6, "--batch", 4, "--sample-len", 0, "--eval-windows", 4]
    out = run(f"{x}/distill", "--teacher", teacher, "--cache", tmp_path / "c", *data, *student,
              "--init-from-teacher", 1, "--save", tmp_path / "d.st")
    assert "init from the teacher: embedding, final norm and layers 0 2" in out, out[-1500:]
    assert "reusing" in out  # the shards teacher-cache made
    out = run(f"{x}/distill", "--teacher", teacher, *data, *student, "--d-model", 32, "--heads", 2,
              "--save", tmp_path / "o.st")  # online: the teacher runs in process
    assert "teacher top-K: online" in out
    run(f"{x}/train", "--tokenizer", teacher, *data, *student, "--d-model", 64, "--heads", 4, "--kv-heads", 2,
        "--save", tmp_path / "s.st")
    for m in (teacher, tmp_path / "d.st", tmp_path / "s.st"):
        out = run(f"{x}/eval", "--model", m, "--shards", shards, "--seq", 32, "--device", "cpu", "--threads", 1)
        assert "val_loss=" in out
    # The student checkpoint decodes with the teacher's tokenizer, found through its metadata.
    out = run(f"{x}/generate", "--model", tmp_path / "d.st", "--prompt", "And God said", "--len", 5,
              "--device", "cpu", "--threads", 1)
    assert out.startswith("And God said")
    out = run(f"{x}/generate", "--model", teacher, "--chat", 1, "--prompt", "Hi", "--len", 5, "--device", "cpu")
    # The student stands alone: with the teacher's file gone, it still decodes (its tokenizer is inside).
    os.replace(teacher, tmp_path / "moved.gguf")
    alone = tmp_path / "alone"
    alone.mkdir()
    os.replace(tmp_path / "d.st", alone / "d.st")
    r = subprocess.run([f"{x}/generate", "--model", "d.st", "--prompt", "And God said", "--len", "5", "--device",
                        "cpu"], capture_output=True, text=True, cwd=alone)
    assert r.returncode == 0 and r.stdout.startswith("And God said"), r.stderr
    os.replace(tmp_path / "moved.gguf", teacher)
    # Bad use: a pretrained teacher without data.
    r = subprocess.run([f"{x}/distill", "--teacher", teacher, "--device", "cpu"], capture_output=True, text=True)
    assert r.returncode != 0 and "needs --data TEXT or --shards PREFIX" in r.stderr
