"""One checkpoint format for Python and the programs: Transformer.save and Trainer.save write the programs'
checkpoint (config and tokenizer inside), retort.load_model opens a program's checkpoint without being told
its config, and greedy generation from Python equals the generate program's on the same file."""

import os
import subprocess

import numpy as np
import pytest

import retort

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def programs():
    d = os.path.join(ROOT, "build", "examples")
    if not all(os.path.exists(os.path.join(d, p)) for p in ("train", "eval", "generate")):
        pytest.skip("the example programs are not built (build/examples)")
    return d


def text(n=40_000):
    for p in (os.path.join(ROOT, "build", "data", "kjv.txt"), os.path.join(ROOT, "data", "kjv.txt")):
        if os.path.exists(p):
            return open(p, encoding="utf-8").read()[:n]
    pytest.skip("no kjv.txt (ninja -C build data/kjv.txt)")


def run(*args, cwd=None):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd)
    assert r.returncode == 0, f"{args[0]} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return r.stdout


def printable(b):
    """examples/common.cpp's printable(): text and well-formed UTF-8 stay, other bytes become '?'."""
    out, i = [], 0
    while i < len(b):
        c = b[i]
        if c in (9, 10) or 32 <= c < 127:
            out.append(chr(c))
            i += 1
            continue
        n = 2 if c & 0xE0 == 0xC0 else 3 if c & 0xF0 == 0xE0 else 4 if c & 0xF8 == 0xF0 else 0
        try:
            if n and i + n <= len(b):
                out.append(b[i:i + n].decode("utf-8"))
                i += n
                continue
        except UnicodeDecodeError:
            pass
        out.append("?")
        i += 1
    return "".join(out)


def program_greedy(x, path, prompt, n, cwd=None):
    return run(f"{x}/generate", "--model", path, "--prompt", prompt, "--len", n, "--temperature", 0,
               "--device", "cpu", cwd=cwd).rstrip("\n")


def test_python_save_is_the_programs_checkpoint(tmp_path):
    corpus = text()
    tok = retort.Tokenizer.train(corpus, vocab_size=300)
    cfg = retort.TransformerConfig(vocab=320, context=32, layers=1, d_model=32, heads=2)
    m = retort.Transformer(cfg, seed=3)
    path = str(tmp_path / "py.safetensors")
    m.save(path, metadata={"note": "from python"}, tokenizer=tok)
    # Python opens it without being told the config, tokenizer included.
    back = retort.load_model(path)
    assert back.config.describe() == m.config.describe()
    assert back.tokenizer is not None and back.tokenizer.encode("And God said") == tok.encode("And God said")
    ids = tok.encode("And God said")
    assert back.generate(ids, 12, temperature=0) == m.generate(ids, 12, temperature=0)
    # The programs read it too, alone in another directory: the same greedy continuation.
    x = programs()
    alone = tmp_path / "alone"
    alone.mkdir()
    os.replace(path, alone / "m.st")
    got = program_greedy(x, "m.st", "And God said", 12, cwd=alone)
    assert got == "And God said" + printable(tok.decode(m.generate(ids, 12, temperature=0)))
    # Metadata keys of the tokenizer are the checkpoint's own.
    with pytest.raises(ValueError, match="reserved"):
        m.save(str(tmp_path / "x.st"), metadata={"tokenizer": "mine"})


def test_a_program_checkpoint_in_python(tmp_path):
    x = programs()
    (tmp_path / "t.txt").write_text(text())
    run(f"{x}/train", "--data", tmp_path / "t.txt", "--tokenizer", "bpe", "--vocab", 300, "--layers", 1,
        "--d-model", 32, "--heads", 2, "--context", 32, "--batch", 4, "--steps", 3, "--eval-windows", 2,
        "--sample-len", 0, "--threads", 1, "--device", "cpu", "--save", tmp_path / "p.st")
    m = retort.load_model(str(tmp_path / "p.st"))
    c = m.config
    assert (c.vocab, c.layers, c.d_model, c.heads, c.context) == (300, 1, 32, 2, 32)
    assert m.tokenizer is not None and m.tokenizer.vocab_size == 300
    ids = m.tokenizer.encode("In the beginning")
    py = "In the beginning" + printable(m.tokenizer.decode(m.generate(ids, 10, temperature=0)))
    assert program_greedy(x, tmp_path / "p.st", "In the beginning", 10) == py
    # A trainer resumes the program's run (moments and step), and saves it back in the same format.
    t = retort.Trainer(m, total_steps=10)
    t.load(str(tmp_path / "p.st"))
    assert t.steps == 3
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 300, size=(2, 33))
    t.step(tokens[:, :-1], tokens[:, 1:])
    t.save(str(tmp_path / "q.st"))
    q = retort.load_model(str(tmp_path / "q.st"))
    assert q.tokenizer is not None and q.tokenizer.encode("In the") == m.tokenizer.encode("In the")
    # The programs take it: eval on the run's shards (the tokenizer's identity was kept).
    out = run(f"{x}/eval", "--model", tmp_path / "q.st", "--shards", tmp_path / "t.bpe300", "--threads", 1,
              "--device", "cpu", "--eval-windows", 4)
    assert "val_loss=" in out
    # A model saved for use is not a run to resume.
    model_only = str(tmp_path / "model-only.st")
    m.save(model_only)
    with pytest.raises(ValueError, match="holds no optimizer state"):
        retort.Trainer(m, total_steps=10).load(model_only)
