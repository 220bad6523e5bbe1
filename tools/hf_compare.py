#!/usr/bin/env python3
"""A retort student in the `transformers` library: exports it as a Hugging Face directory (Transformer.export),
loads that with transformers.AutoModelForCausalLM / AutoTokenizer, and compares with retort running the
student's own checkpoint: tokenization of a held-out text, next-token log-probabilities at every position
(max |Δ log-prob|, top-1 agreement, same top-5 order), and greedy continuations of a prompt.

  python3 tools/hf_compare.py [STUDENT.safetensors] [--text FILE] [--positions 256] [--dtype f32|bf16|f16]
                              [--device cpu|cuda] [--out DIR]

Default student: build/demo/student-distilled.safetensors; default text: the held-out end of the Jane Austen
text. Needs torch and transformers (the GPU machine has them) and retort's Python module (PYTHONPATH=
build/bindings). Prints one line per check; exits 1 when a check fails its tolerance (log-probs within
1e-4 for f32 weights, 5e-2 for bf16 / f16; the same tokens; the same greedy text for f32).
"""
import argparse
import gzip
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def held_out_text():
    for p in (os.path.join(ROOT, "build", "data", "austen.txt"), os.path.join(ROOT, "data", "austen.txt")):
        if os.path.exists(p):
            return open(p, encoding="utf-8").read()[-20000:]
    return gzip.open(os.path.join(ROOT, "data", "austen.txt.gz"), "rt", encoding="utf-8").read()[-20000:]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("student", nargs="?", default=os.path.join(ROOT, "build", "demo", "student-distilled.safetensors"))
    ap.add_argument("--text")
    ap.add_argument("--positions", type=int, default=256)
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f16"])
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--prompt", default="It was a truth universally acknowledged")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--out", help="keep the export here (default: a temporary directory)")
    a = ap.parse_args()

    import retort  # before NumPy and torch (see tools/llamacpp_compare.sh)

    student = retort.load_model(a.student)
    import numpy as np
    import torch
    import transformers

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = a.out or tempfile.mkdtemp(prefix="retort-hf-")
    student.export(out, format="hf", dtype=a.dtype)
    print(f"student: {a.student} ({student.config.describe()})")
    print(f"export: {out} ({a.dtype}); transformers {transformers.__version__}, torch {torch.__version__}, {device}")
    hm = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).to(device).eval()
    ht = transformers.AutoTokenizer.from_pretrained(out)
    ok = True

    text = open(a.text, encoding="utf-8").read() if a.text else held_out_text()
    tok = student.tokenizer
    mine = tok.encode(text) if tok is not None else list(text.encode())
    theirs = ht(text, add_special_tokens=False)["input_ids"]
    same = mine == theirs
    ok &= same
    print(f"tokenization: transformers {'equals' if same else 'DIFFERS from'} retort on {len(mine)} tokens")

    ids = mine[: min(a.positions, student.config.context)]
    with torch.no_grad():
        ref = hm(torch.tensor([ids], device=device)).logits[0].double().cpu().numpy()
    got = student.logits(np.asarray(ids)[None])[0].astype(np.float64)

    def log_softmax(z):
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    la, lb = log_softmax(got), log_softmax(ref)
    dmax = float(np.abs(la - lb).max())
    top1 = float(np.mean(la.argmax(-1) == lb.argmax(-1)))
    top5 = float(np.mean([list(np.argsort(-la[i])[:5]) == list(np.argsort(-lb[i])[:5]) for i in range(len(ids))]))
    tol = 1e-4 if a.dtype == "f32" else 5e-2
    ok &= dmax < tol
    print(f"next-token log-probs over {len(ids)} positions: max |d| {dmax:.2e} (tolerance {tol:g}), "
          f"top-1 agreement {top1:.4f}, same top-5 order {top5:.4f}")

    p = tok.encode(a.prompt) if tok is not None else list(a.prompt.encode())
    with torch.no_grad():
        g = hm.generate(torch.tensor([p], device=device), max_new_tokens=a.gen, do_sample=False,
                        pad_token_id=ht.eos_token_id if ht.eos_token_id is not None else 0)
    hf_ids = g[0, len(p):].tolist()
    r_ids = student.generate(p, a.gen, temperature=0.0)
    decode = (lambda x: tok.decode(x).decode("utf-8", "replace")) if tok is not None else \
        (lambda x: bytes(x).decode("utf-8", "replace"))
    print(f"transformers greedy: {a.prompt + decode(hf_ids)!r}")
    same_gen = list(r_ids)[: len(hf_ids)] == hf_ids
    print(f"retort greedy: {'the same tokens' if same_gen else repr(a.prompt + decode(list(r_ids)))}")
    if a.dtype == "f32":
        ok &= same_gen
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
