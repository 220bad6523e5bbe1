"""retort.Transformer and retort.Trainer from Python: shapes, causality, the cached graphs against the graph
API, a short training run whose loss falls, checkpoints, and bad arguments raising ValueError with the C++
message."""

import numpy as np
import pytest

import retort


def tiny(**kw):
    args = dict(vocab=32, context=8, layers=2, d_model=16, heads=4, kv_heads=2, d_ff=32)
    args.update(kw)
    return retort.TransformerConfig(**args)


def pattern_batch(rng, batch, seq, vocab):
    """Sequences following t' = (3 t + 1) mod vocab: learnable in a few dozen steps."""
    start = rng.integers(0, vocab, size=(batch, 1))
    seqs = [start]
    for _ in range(seq):
        seqs.append((3 * seqs[-1] + 1) % vocab)
    s = np.concatenate(seqs, axis=1)
    return s[:, :-1], s[:, 1:]


def raises(match, fn, *args, **kwargs):
    with pytest.raises(ValueError, match=match) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, retort.Error)
    return str(info.value)


def test_config_fields_and_resolution():
    c = retort.TransformerConfig(vocab=50, d_model=48, heads=6)
    assert (c.vocab, c.d_model, c.heads, c.kv_heads, c.d_ff) == (50, 48, 6, 0, 0)
    r = c.resolved()
    assert r.kv_heads == 6 and r.d_ff == 128 and r.head_dim == 8
    c.layers = 3
    assert c.layers == 3 and "layers=3" in c.describe() and "retort.TransformerConfig" in repr(c)


def test_parameters_are_tensors_and_numpy_views():
    m = retort.Transformer(tiny(), seed=1)
    params = m.parameters
    assert all(isinstance(p, retort.Tensor) for p in params)
    sd = m.state_dict()
    assert list(sd) == [p.name for p in params]
    assert sd["tok_emb"].shape == (32, 16) and sd["layer0.wk"].shape == (8, 16)  # 2 kv heads of 4 dims
    assert m.parameter_count == sum(a.size for a in sd.values())
    assert np.all(sd["final_norm"] == 1.0) and 0.01 < sd["tok_emb"].std() < 0.03
    # A view: writing it changes the model.
    tokens = np.arange(8).reshape(1, 8)
    before = m.logits(tokens)
    sd["final_norm"][:] = 2.0
    assert np.allclose(m.logits(tokens), 2.0 * before, rtol=1e-5, atol=1e-7)
    assert not np.shares_memory(m.state_dict(copy=True)["final_norm"], sd["final_norm"])


def test_logits_shape_and_causality():
    m = retort.Transformer(tiny(), seed=2)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 32, size=(3, 8))
    a = m.logits(tokens)
    assert a.shape == (3, 8, 32) and a.dtype == np.float32
    changed = tokens.copy()
    changed[1, 5] = (changed[1, 5] + 1) % 32
    b = m.logits(changed)
    assert np.array_equal(a[:, :5], b[:, :5]) and np.array_equal(a[0], b[0]) and np.array_equal(a[2], b[2])
    assert not np.allclose(a[1, 5], b[1, 5])
    # One sequence as 1-D, shorter than the context: the same rows.
    assert np.allclose(m.logits(tokens[0, :6]), a[0, :6][None], rtol=1e-5, atol=1e-6)


def test_loss_matches_the_logits_and_the_graph_api():
    m = retort.Transformer(tiny(tie_embeddings=False), seed=3)
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 32, size=(2, 8)), rng.integers(0, 32, size=(2, 8))
    y[0, 2] = -100
    z = m.logits(x).astype(np.float64).reshape(16, 32)
    lse = np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1)
    valid = y.reshape(-1) != -100
    want = np.mean((lse - z[np.arange(16), np.where(valid, y.reshape(-1), 0)])[valid])
    assert abs(m.loss(x, y) - want) < 1e-5
    # forward() is a graph node: the same loss through retort.Graph and retort.ops.
    logits = m.forward(x)
    assert logits.shape == (16, 32)
    loss = retort.ops.cross_entropy(logits, retort.tensor(y.reshape(-1)))
    g = retort.Graph()
    g.backward(loss)
    g.compute()
    assert abs(loss.item() - want) < 1e-5
    assert len(g.params) == len(m.parameters)
    assert g.grad(m.parameters[0]).numpy().any()


def test_short_training_run_loss_falls():
    m = retort.Transformer(tiny(), seed=4)
    rng = np.random.default_rng(2)
    steps = 60
    t = retort.Trainer(m, total_steps=steps, lr=1e-2, warmup=5)
    vx, vy = pattern_batch(np.random.default_rng(99), 8, 8, 32)
    before = m.loss(vx, vy)
    losses = [t.step(*pattern_batch(rng, 8, 8, 32)) for _ in range(steps)]
    after = m.loss(vx, vy)
    assert t.steps == steps and t.last_loss == losses[-1]
    assert np.isfinite(t.last_grad_norm) and t.last_grad_norm > 0
    assert abs(t.last_lr - 1e-3) < 1e-9  # the last step of the schedule gives lr_min = lr / 10
    assert abs(losses[0] - np.log(32)) < 0.1  # the init is close to uniform
    assert np.mean(losses[-5:]) < 0.5 * losses[0]
    assert after < 0.5 * before


def test_trainer_matches_the_graph_api_step():
    """Trainer.step is clip + cosine_lr + AdamW on the graph: the same run by hand gives the same weights."""
    cfg = tiny(layers=1)
    a, b = retort.Transformer(cfg, seed=5), retort.Transformer(cfg, seed=5)
    rng = np.random.default_rng(3)
    batches = [pattern_batch(rng, 4, 8, 32) for _ in range(3)]
    t = retort.Trainer(a, total_steps=3, lr=5e-3, warmup=1, clip=0.5, weight_decay=0.1)
    for x, y in batches:
        t.step(x, y)
    tokens = retort.zeros((4, 8), dtype="i32")
    targets = retort.zeros((4, 8), dtype="i32")
    loss = retort.ops.cross_entropy(b.forward(tokens), targets.reshape(32))
    g = retort.Graph()
    g.backward(loss)
    opt = retort.AdamW(b.parameters, lr=5e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    for step, (x, y) in enumerate(batches, 1):
        tokens.assign(x.astype(np.int32))
        targets.assign(y.astype(np.int32))
        g.zero_grad()
        g.compute()
        retort.clip_grad_norm(g, 0.5)
        opt.step(g, lr=retort.cosine_lr(step, 1, 3, 5e-3, 5e-4))
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert np.allclose(pa, pb, rtol=1e-5, atol=1e-7), name


def test_save_and_load(tmp_path):
    m = retort.Transformer(tiny(), seed=6)
    rng = np.random.default_rng(4)
    t = retort.Trainer(m, total_steps=20, lr=1e-2)
    for _ in range(3):
        t.step(*pattern_batch(rng, 4, 8, 32))
    path = str(tmp_path / "model.safetensors")
    m.save(path, metadata={"note": "test"})
    fresh = retort.Transformer(tiny(), seed=7)
    x, y = pattern_batch(rng, 4, 8, 32)
    assert fresh.loss(x, y) != m.loss(x, y)
    fresh.load(path)
    assert fresh.loss(x, y) == m.loss(x, y)
    # A trainer checkpoint resumes the run exactly: the same next steps as the original.
    ck = str(tmp_path / "trainer.safetensors")
    t.save(ck)
    m2 = retort.Transformer(tiny(), seed=8)
    t2 = retort.Trainer(m2, total_steps=20, lr=1e-2)
    t2.load(ck)
    assert t2.steps == 3
    for _ in range(2):
        x, y = pattern_batch(rng, 4, 8, 32)
        assert t.step(x, y) == t2.step(x, y)
    # A model of another shape is refused before anything changes.
    other = retort.Transformer(tiny(d_model=32), seed=0)
    keep = other.state_dict(copy=True)
    msg = raises(r"model\.safetensors: checkpoint holds a model layers=2 d_model=16", other.load, path)
    assert "d_model=32" in msg
    assert all(np.array_equal(v, other.state_dict()[k]) for k, v in keep.items())
    raises(r"no such tensor|not a Trainer checkpoint|cannot open|No such file", other.load,
           str(tmp_path / "missing.safetensors"))


def test_bad_arguments_raise_value_error_with_the_cpp_message():
    raises(r"^transformer: kv_heads 3 must divide heads 4", retort.Transformer, tiny(kv_heads=3))
    raises(r"^transformer: head_dim = d_model / heads = 3 must be even", retort.Transformer,
           tiny(d_model=12, heads=4, kv_heads=0))
    raises(r"^transformer: vocab must be >= 1", tiny(vocab=0).resolved)
    m = retort.Transformer(tiny(), seed=0)
    raises(r"^Transformer\.logits: tokens must be an integer array", m.logits, np.zeros((2, 4), np.float32))
    raises(r"^Transformer\.logits: tokens holds id 32, outside the vocabulary \[0, 32\)", m.logits,
           np.full((1, 4), 32))
    raises(r"^Transformer\.logits: tokens \[1, 9\] have more positions than the model's context 8", m.logits,
           np.zeros((1, 9), np.int64))
    raises(r"^Transformer\.loss: targets \[1, 3\] must have the shape of tokens \[1, 4\]", m.loss,
           np.zeros((1, 4), np.int64), np.zeros((1, 3), np.int64))
    raises(r"^Trainer: clip = -1 must be >= 0", retort.Trainer, m, total_steps=10, clip=-1.0)
    raises(r"^cosine_lr: need 0 <= warmup <= total", retort.Trainer, m, total_steps=10, warmup=20)
    raises(r"^AdamW: beta2 = 1 is out of range", retort.Trainer, m, total_steps=10, beta2=1.0)
    t = retort.Trainer(m, total_steps=10)
    raises(r"^Trainer\.step: targets holds id -5, outside the vocabulary", t.step, np.zeros((1, 4), np.int64),
           np.full((1, 4), -5))
    raises(r"^transformer\.forward: tokens .* has T = 9 positions, more than the model's context 8",
           m.forward, np.zeros((1, 9), np.int32))
    assert t.steps == 0


def test_threads_share_a_model_safely():
    """The GIL is released during a step, and the model's lock serializes the C++ work: two threads
    evaluating while one trains give finite results and the trainer takes every step."""
    import threading

    m = retort.Transformer(tiny(), seed=9)
    t = retort.Trainer(m, total_steps=20, lr=1e-2)
    rng = np.random.default_rng(5)
    batches = [pattern_batch(rng, 4, 8, 32) for _ in range(20)]
    seen, errors = [], []

    def evaluate():
        try:
            for x, y in batches:
                seen.append(m.loss(x, y))
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=evaluate) for _ in range(2)]
    for th in threads:
        th.start()
    for x, y in batches:
        t.step(x, y)
    for th in threads:
        th.join()
    assert not errors and len(seen) == 40 and all(np.isfinite(seen)) and t.steps == 20


def test_freeze_weights_keeps_the_logits_and_refuses_training(tmp_path):
    m = retort.Transformer(tiny(), seed=3)
    path = str(tmp_path / "m.safetensors")
    m.save(path)
    b = retort.load_model(path, compute_dtype="bf16")
    x, y = pattern_batch(np.random.default_rng(5), 2, 8, 32)
    before = b.logits(x)
    assert not b.frozen
    b.freeze_weights()
    assert b.frozen
    # The copies round like the per-run casts, and x + sum is added in the same order: the same logits.
    np.testing.assert_array_equal(b.logits(x), before)
    raises("frozen", retort.Trainer(b, total_steps=2).step, x, y)
    # In f32 there is nothing to freeze.
    m.freeze_weights()
    assert not m.frozen
    retort.Trainer(m, total_steps=2).step(x, y)
