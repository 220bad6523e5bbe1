"""Graph building from Python (ops and operators against NumPy), gradients, optimizers, and short training runs
whose loss must fall."""

import numpy as np
import pytest

import refs
import retort


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def run(*tensors):
    g = retort.Graph()
    g.forward(*tensors)
    g.compute()
    return g


def test_operators_match_numpy(rng):
    a_np = rng.normal(size=(3, 4)).astype(np.float32)
    b_np = rng.normal(size=(4,)).astype(np.float32) + 3.0
    a, b = retort.tensor(a_np), retort.tensor(b_np)
    outs = {
        "a + b": (a + b, a_np + b_np),
        "b + a": (b + a, b_np + a_np),  # the smaller operand first broadcasts too
        "a - b": (a - b, a_np - b_np),
        "b - a": (b - a, b_np - a_np),
        "a * b": (a * b, a_np * b_np),
        "a / b": (a / b, a_np / b_np),
        "2 / b": (2.0 / b, 2.0 / b_np),
        "1 - a": (1 - a, 1 - a_np),
        "-a": (-a, -a_np),
        "ndarray + a": (b_np + a, b_np + a_np),  # NumPy defers to retort's operators
        "ndarray @ a.T": (a_np @ a.T, a_np @ a_np.T),
        "a @ a.T": (a @ a.T, a_np @ a_np.T),
        "exp": (a.exp(), np.exp(a_np)),
        "relu": (a.relu(), np.maximum(a_np, 0)),
        "softmax": (a.softmax(), np.exp(a_np) / np.exp(a_np).sum(-1, keepdims=True)),
        "sum_rows": (a.sum_rows(), a_np.sum(-1, keepdims=True)),
        "mean": (a.mean(), a_np.mean()),
        "reshape": (a.reshape(4, 3), a_np.reshape(4, 3)),
        "permute": (a.reshape(2, 3, 2).permute(2, 0, 1), a_np.reshape(2, 3, 2).transpose(2, 0, 1)),
        "slice": (retort.ops.slice(a, 1, 1, 2), a_np[:, 1:3]),
        "concat": (retort.ops.concat(a, a, axis=0), np.concatenate([a_np, a_np], axis=0)),
        "cast": (a.cast("bf16").cast("f32"), a_np),
    }
    assert all(isinstance(t, retort.Tensor) for t, _ in outs.values())
    run(*[t for t, _ in outs.values()])
    for name, (t, want) in outs.items():
        got = t.numpy()
        assert got.shape == np.shape(want), name
        tol = 1e-2 if name == "cast" else 1e-5
        assert refs.rel_err(got, want) < tol, name


def test_matmul_options_and_batches(rng):
    x = rng.normal(size=(2, 5, 3)).astype(np.float32)
    w = rng.normal(size=(4, 3)).astype(np.float32)
    y = retort.ops.matmul(x, w, transpose_b=True)
    run(y)
    assert y.shape == (2, 5, 4)
    assert refs.rel_err(y.numpy(), x @ w.T) < 1e-5


def test_gradients_of_params(rng):
    w_np = rng.normal(size=(3, 2)).astype(np.float32)
    x_np = rng.normal(size=(5, 3)).astype(np.float32)
    w = retort.param(w_np, name="w")
    h = (retort.tensor(x_np) @ w).tanh()
    loss = (h * h).mean()
    g = retort.Graph()
    g.backward(loss)
    g.compute()
    assert [p.name for p in g.params] == ["w"]

    def f(wv):
        hv = np.tanh(x_np.astype(np.float64) @ wv)
        return np.mean(hv * hv)

    assert abs(loss.item() - f(w_np.astype(np.float64))) < 1e-6
    assert refs.rel_err(g.grad(w).numpy(), refs.fd_grad(f, w_np)) < 1e-4
    # An intermediate's gradient is available too, from the next run on.
    gh = g.grad(h)
    g.forward(h)
    g.zero_grad()
    g.compute()
    assert refs.rel_err(gh.numpy(), 2 * h.numpy() / h.size) < 1e-5
    assert g.grad(retort.tensor(x_np)) is None
    assert g.peak_bytes > 0 and len(g) > 0


def test_gradients_accumulate_until_zero_grad(rng):
    w = retort.param(np.ones((2,), np.float32))
    loss = (w * 3.0).sum()
    g = retort.Graph()
    g.backward(loss)
    g.compute()
    g.compute()
    assert np.allclose(g.grad(w).numpy(), 6.0)
    g.zero_grad()
    g.compute()
    assert np.allclose(g.grad(w).numpy(), 3.0)


def test_linear_regression_with_adamw_loss_falls(rng):
    n, d = 64, 4
    x_np = rng.normal(size=(n, d)).astype(np.float32)
    true_w = np.array([[1.5], [-2.0], [0.5], [3.0]], np.float32)
    y_np = x_np @ true_w + 0.7
    x, y = retort.tensor(x_np), retort.tensor(y_np)
    w = retort.param(np.zeros((d, 1), np.float32), name="w")
    b = retort.param(np.zeros((1,), np.float32), name="b")
    err = x @ w + b - y
    loss = (err * err).mean()
    g = retort.Graph()
    g.backward(loss)
    opt = retort.AdamW(g.params, lr=0.1, weight_decay=0.0)
    losses = []
    for step in range(300):
        g.zero_grad()
        g.compute()
        losses.append(loss.item())
        opt.step(g, lr=retort.cosine_lr(step, 10, 300, 0.1, 0.01))
    assert losses[-1] < 1e-3 * losses[0], (losses[0], losses[-1])
    assert opt.steps == 300
    assert refs.rel_err(w.numpy(), true_w) < 1e-2 and abs(b.numpy()[0] - 0.7) < 1e-2


def test_tiny_mlp_classifier_with_sgd_and_clipping(rng):
    # Two interleaved classes that a linear model cannot separate: y = (x0 * x1 > 0).
    n = 128
    x_np = rng.normal(size=(n, 2)).astype(np.float32)
    labels = (x_np[:, 0] * x_np[:, 1] > 0).astype(np.int64)
    w1 = retort.param(rng.normal(0, 1.0, size=(2, 16)).astype(np.float32), name="w1")
    b1 = retort.param(np.zeros((16,), np.float32), name="b1")
    w2 = retort.param(rng.normal(0, 0.3, size=(16, 2)).astype(np.float32), name="w2")
    logits = (retort.tensor(x_np) @ w1 + b1).relu() @ w2
    loss = retort.ops.cross_entropy(logits, labels)
    g = retort.Graph()
    g.forward(logits)
    g.backward(loss)
    opt = retort.SGD(g.params, lr=0.5, momentum=0.9)
    first = None
    for _ in range(200):
        g.zero_grad()
        g.compute()
        first = first if first is not None else loss.item()
        norm = retort.clip_grad_norm(g, 5.0)
        assert np.isfinite(norm)
        opt.step(g)
    g.compute()
    accuracy = np.mean(np.argmax(logits.numpy(), axis=1) == labels)
    assert loss.item() < 0.5 * first and accuracy > 0.9, (first, loss.item(), accuracy)


def test_leaf_values_change_between_runs(rng):
    x_np = np.zeros((2, 2), np.float32)
    x = retort.tensor(x_np)
    y = (x + 1.0).sum()
    g = run(y)
    assert y.item() == 4.0
    x_np += 1.0  # zero-copy: the next run sees it
    g.compute()
    assert y.item() == 8.0
