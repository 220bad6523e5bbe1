"""Exports read by the consumers' own readers. GGUF: the `gguf` package (llama.cpp's reader) reads every file
retort writes, with the metadata types llama.cpp's loader insists on, and a float64 NumPy forward on the
tensors it dequantizes (tools/ref_forward.py) matches retort's logits; Q8_0 blocks equal gguf.quants.quantize
byte for byte. Hugging Face: `safetensors` reads the weights, which undone with llama.cpp's own HF-to-GGUF
q/k permutation give retort's logits again, and `tokenizers` encodes the corpora exactly as retort does.
Students with a trained BPE, a byte-level vocabulary, and the teacher's (SmolLM2) vocabulary when it can be
fetched. With `transformers` and `torch` installed (the GPU machine), transformers loads the HF export too."""

import json
import os
import sys

import numpy as np
import pytest

import retort

gguf = pytest.importorskip("gguf", reason="the gguf package (llama.cpp's reader/writer) is not installed")
tokenizers = pytest.importorskip("tokenizers", reason="the tokenizers package is not installed")
safetensors_numpy = pytest.importorskip("safetensors.numpy", reason="the safetensors package is not installed")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import ref_forward  # noqa: E402

GV = gguf.GGUFValueType
Q = gguf.GGMLQuantizationType
# Tolerances on max |log-prob - reference| against the original f32 model, per stored type (random students
# with logits of a few units; F32 is f32 rounding only).
TOL = {"f32": 2e-5, "f16": 5e-3, "bf16": 5e-2, "q8_0": 5e-2}
QTYPE = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0}


def corpora():
    """The bundled texts (first 200 kB of each), else a stand-in."""
    out = {}
    for name in ("kjv", "austen"):
        for p in (os.path.join(ROOT, "build", "data", f"{name}.txt"), os.path.join(ROOT, "data", f"{name}.txt")):
            if os.path.exists(p):
                out[name] = open(p, encoding="utf-8").read()[:200_000]
                break
    if not out:
        out["stand-in"] = "In the beginning God created the heaven and the earth. 1234 ünïcödé\n\n  x" * 500
    return out


def log_softmax(z):
    z = np.asarray(z, np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def trained():
    text = next(iter(corpora().values()))
    return retort.Tokenizer.train(text[:100_000], vocab_size=512, special_tokens=["<|endoftext|>"])


def student(vocab, seed=1, tied=True, bias=False, d_model=64):
    cfg = retort.TransformerConfig(vocab=vocab, context=64, layers=2, d_model=d_model, heads=4, kv_heads=2,
                                   d_ff=96, rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=tied, qkv_bias=bias)
    return retort.Transformer(cfg, seed=seed)


def check_llama_cpp_metadata(r, arch, vocab, tied):
    """The keys llama.cpp's loader reads, with the exact types it checks."""
    want = {
        f"{arch}.context_length": GV.UINT32, f"{arch}.embedding_length": GV.UINT32,
        f"{arch}.block_count": GV.UINT32, f"{arch}.feed_forward_length": GV.UINT32,
        f"{arch}.attention.head_count": GV.UINT32, f"{arch}.attention.head_count_kv": GV.UINT32,
        f"{arch}.rope.dimension_count": GV.UINT32, f"{arch}.rope.freq_base": GV.FLOAT32,
        f"{arch}.attention.layer_norm_rms_epsilon": GV.FLOAT32, "general.architecture": GV.STRING,
        "tokenizer.ggml.model": GV.STRING, "tokenizer.ggml.pre": GV.STRING, "tokenizer.ggml.tokens": GV.ARRAY,
        "tokenizer.ggml.merges": GV.ARRAY, "tokenizer.ggml.token_type": GV.ARRAY,
    }
    for key, t in want.items():
        assert key in r.fields, key
        assert r.fields[key].types[0] == t, (key, r.fields[key].types)
    assert r.fields["tokenizer.ggml.tokens"].types[1] == GV.STRING
    assert r.fields["tokenizer.ggml.token_type"].types[1] == GV.INT32
    assert r.fields["tokenizer.ggml.pre"].contents() in ("gpt-2", "smollm", "llama-bpe", "qwen2")
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == vocab and len(set(tokens)) == vocab, "token strings must be unique"
    for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
        if key in r.fields:
            assert r.fields[key].types[0] == GV.UINT32
    names = {t.name for t in r.tensors}
    layers = int(r.fields[f"{arch}.block_count"].contents())
    expected = {"token_embd.weight", "output_norm.weight"} | ({"output.weight"} if not tied else set())
    for i in range(layers):
        expected |= {f"blk.{i}.{n}.weight" for n in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                                      "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")}
        if arch == "qwen2":
            expected |= {f"blk.{i}.attn_{n}.bias" for n in "qkv"}
    assert names == expected  # llama.cpp refuses any extra tensor
    for t in r.tensors:
        assert t.data_offset % 32 == 0
        if t.name.endswith("norm.weight") or t.name.endswith(".bias"):
            assert t.tensor_type == Q.F32, t.name


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0"])
@pytest.mark.parametrize("kind", ["bpe", "bytes", "untied", "qwen2"])
def test_gguf_read_by_gguf_package_matches_numpy_forward(tmp_path, trained, dtype, kind):
    tok = None if kind == "bytes" else trained
    vocab = 256 if kind == "bytes" else trained.vocab_size
    m = student(vocab, seed=3, tied=kind != "untied", bias=kind == "qwen2")
    path = str(tmp_path / f"s-{dtype}.gguf")
    m.export(path, format="gguf", dtype=dtype, tokenizer="bytes" if tok is None else tok)
    r = gguf.GGUFReader(path)
    arch = "qwen2" if kind == "qwen2" else "llama"
    check_llama_cpp_metadata(r, arch, vocab, tied=kind != "untied")
    for t in r.tensors:
        if t.tensor_type != Q.F32 or len(t.shape) == 2:
            assert t.tensor_type == QTYPE[dtype], (t.name, t.tensor_type)

    text = corpora()[next(iter(corpora()))][5000:7000]
    ids = (tok.encode(text) if tok else list(text.encode()))[:64]
    hf = ref_forward.hf_tokenizer(path)  # `tokenizers` built from the file's own vocabulary
    assert hf.encode(text).ids[:64] == ids
    cfg, w = ref_forward.load_model(path, np.float64)  # gguf.quants' dequantization
    ref = log_softmax(ref_forward.forward(cfg, w, ids))
    loaded = retort.load_model(path)
    got = log_softmax(loaded.logits(np.asarray(ids)[None])[0])
    assert np.abs(got - ref).max() < 2e-5, "retort reading the export vs the NumPy forward on gguf's tensors"
    orig = log_softmax(m.logits(np.asarray(ids)[None])[0])
    d = np.abs(orig - ref).max()
    assert d < TOL[dtype], f"{dtype}: max |d log-prob| against the f32 student {d:.3g}"
    if dtype == "q8_0":
        # retort's quantizer is ggml's reference: the same bytes as gguf.quants.quantize of the f32 weights.
        f32 = str(tmp_path / "f32.gguf")
        m.export(f32, format="gguf", dtype="f32", tokenizer="bytes" if tok is None else tok)
        src = {t.name: t for t in gguf.GGUFReader(f32).tensors}
        for t in r.tensors:
            if t.tensor_type == Q.Q8_0:
                a = np.asarray(src[t.name].data, np.float32).reshape(tuple(reversed(t.shape.tolist())))
                want = gguf.quants.quantize(a, Q.Q8_0)
                assert np.array_equal(np.asarray(t.data).reshape(-1).view(np.uint8),
                                      want.reshape(-1).view(np.uint8)), t.name


def hf_to_gguf_qk(w, n_head):
    """llama.cpp's convert_hf_to_gguf.py permutation (rotate-half rows to adjacent pairs)."""
    shape = w.shape
    return w.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


GGUF_NAME = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
             "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
             "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
             "self_attn.v_proj.bias": "attn_v.bias", "self_attn.o_proj.weight": "attn_output.weight",
             "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
             "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}


def read_safetensors(path):
    """The file through the `safetensors` package; bf16 (which NumPy lacks) widened to f32 from the bytes at the
    offsets the package's own header parse reports."""
    import safetensors

    with safetensors.safe_open(path, framework="np") as f:
        names = list(f.keys())
        assert f.metadata() == {"format": "pt"}
    header_len = int.from_bytes(open(path, "rb").read(8), "little")
    header = json.loads(open(path, "rb").read(8 + header_len)[8:])
    if all(header[n]["dtype"] != "BF16" for n in names):
        return safetensors_numpy.load_file(path)
    data = np.fromfile(path, dtype=np.uint8, offset=8 + header_len)
    out = {}
    for n in names:
        e = header[n]
        assert e["dtype"] == "BF16"
        b, end = e["data_offsets"]
        u = data[b:end].view(np.uint16).astype(np.uint32) << 16
        out[n] = u.view(np.float32).reshape(e["shape"])
    return out


def hf_as_gguf(d):
    """The HF directory's weights (read by `safetensors`) under GGUF names and layout, and its config."""
    cfg_json = json.load(open(os.path.join(d, "config.json")))
    st = read_safetensors(os.path.join(d, "model.safetensors"))
    H, KV = cfg_json["num_attention_heads"], cfg_json["num_key_value_heads"]
    w = {}
    for name, a in st.items():
        a = a.astype(np.float64)
        if name == "model.embed_tokens.weight":
            w["token_embd.weight"] = a
        elif name == "model.norm.weight":
            w["output_norm.weight"] = a
        elif name == "lm_head.weight":
            w["output.weight"] = a
        else:
            _, _, layer, rest = name.split(".", 3)
            # The converter permutes llama's q/k only: llama.cpp runs qwen2 in HF's rotate-half (NeoX) order.
            if rest.startswith("self_attn.q_proj") and cfg_json["model_type"] == "llama":
                a = hf_to_gguf_qk(a, H)
            elif rest.startswith("self_attn.k_proj") and cfg_json["model_type"] == "llama":
                a = hf_to_gguf_qk(a, KV)
            w[f"blk.{layer}.{GGUF_NAME[rest]}"] = a
    cfg = {"arch": cfg_json["model_type"], "layers": cfg_json["num_hidden_layers"], "d_model": cfg_json["hidden_size"],
           "d_ff": cfg_json["intermediate_size"], "heads": H, "kv_heads": KV, "eps": cfg_json["rms_norm_eps"],
           "theta": cfg_json["rope_theta"]}
    return cfg_json, cfg, w, st


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("kind", ["bpe", "bytes", "untied", "qwen2"])
def test_hf_read_by_safetensors_and_tokenizers(tmp_path, trained, dtype, kind):
    tok = None if kind == "bytes" else trained
    vocab = 256 if kind == "bytes" else trained.vocab_size
    m = student(vocab, seed=4, tied=kind != "untied", bias=kind == "qwen2")
    d = str(tmp_path / "hf")
    m.export(d, format="hf", dtype=dtype, tokenizer="bytes" if tok is None else tok)
    assert sorted(os.listdir(d)) == ["config.json", "generation_config.json", "model.safetensors",
                                     "tokenizer.json", "tokenizer_config.json"]
    cfg_json, cfg, w, st = hf_as_gguf(d)
    assert cfg_json["architectures"] == ["Qwen2ForCausalLM" if kind == "qwen2" else "LlamaForCausalLM"]
    assert cfg_json["tie_word_embeddings"] == (kind != "untied")
    assert ("lm_head.weight" in st) == (kind == "untied")
    assert {a.dtype for a in st.values()} == {np.dtype({"f32": "float32", "f16": "float16", "bf16": "float32"}[dtype])} \
        or dtype == "bf16"  # numpy has no bfloat16: safetensors.numpy widens it
    ht = tokenizers.Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    text = corpora()[next(iter(corpora()))][5000:7000]
    ids = (tok.encode(text) if tok else list(text.encode()))[:64]
    assert ht.encode(text).ids[:64] == ids
    ref = log_softmax(ref_forward.forward(cfg, w, ids))
    loaded = retort.load_model(d)
    got = log_softmax(loaded.logits(np.asarray(ids)[None])[0])
    assert np.abs(got - ref).max() < 2e-5
    orig = log_softmax(m.logits(np.asarray(ids)[None])[0])
    if dtype == "f32":
        assert np.array_equal(got, orig), "an f32 HF export loads back with identical logits"
    assert np.abs(orig - ref).max() < TOL[dtype]


def test_tokenization_equal_on_the_corpora(tmp_path, trained):
    """`tokenizers` reading the exported tokenizer.json encodes every corpus exactly as retort does (and
    decodes back to the text), for a trained BPE and for bytes."""
    for name, tok in (("bpe", trained), ("bytes", None)):
        m = student(256 if tok is None else trained.vocab_size)
        d = str(tmp_path / name)
        m.export(d, format="hf", tokenizer="bytes" if tok is None else tok)
        ht = tokenizers.Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        for cname, text in corpora().items():
            want = tok.encode(text) if tok else list(text.encode())
            got = ht.encode(text).ids
            assert got == want, f"{name} on {cname}: first difference at {next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)}"
            assert ht.decode(got) == text


def test_teacher_tokenizer_student(tmp_path):
    """A student sharing SmolLM2's tokenizer: its GGUF says pre 'smollm', and `tokenizers` reading the HF
    export encodes the corpora (specials included) as retort does."""
    import subprocess

    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "fetch_model.py"), "smollm2-135m"],
                       capture_output=True, text=True)
    path = os.environ.get("RETORT_SMOLLM2_GGUF") or (r.stdout.strip() if r.returncode == 0 else "")
    if not path or not os.path.exists(path):
        pytest.skip(f"SmolLM2-135M could not be fetched (tools/fetch_model.py: {r.stderr.strip()[-300:]})")
    teacher_tok = retort.load_model(path).tokenizer
    m = student(teacher_tok.vocab_size, d_model=64)
    g = str(tmp_path / "s.gguf")
    m.export(g, format="gguf", dtype="f16", tokenizer=teacher_tok)
    rd = gguf.GGUFReader(g)
    assert rd.fields["tokenizer.ggml.pre"].contents() == "smollm"
    assert int(rd.fields["tokenizer.ggml.eos_token_id"].contents()) == teacher_tok.eos_id
    d = str(tmp_path / "hf")
    m.export(d, format="hf", tokenizer=teacher_tok)
    ht = tokenizers.Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    for cname, text in corpora().items():
        text = text[:50_000] + "<|im_start|>user\nHi<|im_end|>"
        assert ht.encode(text).ids == teacher_tok.encode(text, allow_special=True), cname
    assert retort.load_model(g).tokenizer.encode(text) == teacher_tok.encode(text)


def test_refusals_leave_nothing(tmp_path):
    m = student(256, d_model=48)  # rows of 48: not whole Q8_0 blocks
    with pytest.raises(retort.Error, match=r"Q8_0 stores rows in blocks of 32"):
        m.export(str(tmp_path / "q.gguf"), dtype="q8_0", tokenizer="bytes")
    with pytest.raises(retort.Error, match=r"F32, F16 or BF16"):
        m.export(str(tmp_path / "hf"), format="hf", dtype="q8_0", tokenizer="bytes")
    with pytest.raises(retort.Error, match=r"no/such"):
        m.export(str(tmp_path / "no" / "such" / "x.gguf"), tokenizer="bytes")
    with pytest.raises(retort.Error, match=r"format must be 'gguf' or 'hf'"):
        m.export(str(tmp_path / "x"), format="onnx")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_transformers_loads_hf_export(tmp_path, trained, dtype):
    torch = pytest.importorskip("torch", reason="torch is not installed (the GPU machine has it)")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    m = student(trained.vocab_size, seed=5)
    d = str(tmp_path / "hf")
    m.export(d, format="hf", dtype=dtype, tokenizer=trained)
    hm = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
    ht = transformers.AutoTokenizer.from_pretrained(d)
    text = corpora()[next(iter(corpora()))][3000:4000]
    ids = trained.encode(text)[:64]
    assert ht(text, add_special_tokens=False)["input_ids"][:64] == ids
    with torch.no_grad():
        ref = hm(torch.tensor([ids])).logits[0].double().numpy()
    got = retort.load_model(d).logits(np.asarray(ids)[None])[0]
    assert np.abs(log_softmax(got) - log_softmax(ref)).max() < 1e-4
