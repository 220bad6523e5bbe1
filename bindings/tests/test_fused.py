"""The fused linear losses (lm-head matmul + loss in chunks) against the float64 references of refs.py applied
to hidden @ weight.T + bias, with the gradients of hidden, weight and bias against central differences; chunk
sizes; the graph-node versions; and errors."""

import numpy as np
import pytest

import refs
import retort

FWD_TOL = 2e-5
GRAD_TOL = 3e-4

N, H, V, K = 5, 3, 9, 3


@pytest.fixture
def rng():
    return np.random.default_rng(99)


def close(got, want, tol, what):
    err = refs.rel_err(got, want)
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:g}"


def inputs(rng):
    h = rng.normal(size=(N, H)).astype(np.float32)
    w = rng.normal(size=(V, H)).astype(np.float32)
    b = rng.normal(size=(V,)).astype(np.float32) * 0.5
    y = rng.integers(0, V, size=N)
    y[2] = -100
    return h, w, b, y


def check_grads(r, ref_loss, h, w, b):
    """ref_loss(z) -> float64 scalar of the logits z = h @ w.T + b."""
    h64, w64, b64 = (a.astype(np.float64) for a in (h, w, b))
    close(r.grad_hidden, refs.fd_grad(lambda x: ref_loss(x @ w64.T + b64), h64), GRAD_TOL, "grad_hidden")
    close(r.grad_weight, refs.fd_grad(lambda x: ref_loss(h64 @ x.T + b64), w64), GRAD_TOL, "grad_weight")
    close(r.grad_bias, refs.fd_grad(lambda x: ref_loss(h64 @ w64.T + x), b64), GRAD_TOL, "grad_bias")


@pytest.mark.parametrize("chunk_rows", [0, 2])
@pytest.mark.parametrize("opts", [{}, {"label_smoothing": 0.1, "z_loss": 1e-2, "softcap": 4.0}], ids=str)
def test_fused_cross_entropy(rng, opts, chunk_rows):
    h, w, b, y = inputs(rng)
    r = retort.losses.fused_linear_cross_entropy(h, w, y, bias=b, return_grad=True, return_per_row=True,
                                                 return_lse=True, chunk_rows=chunk_rows, **opts)
    z = h.astype(np.float64) @ w.T.astype(np.float64) + b
    loss, rows, row_lse = refs.cross_entropy(z, y, **opts)
    close(r.loss, loss, FWD_TOL, "loss")
    close(r.per_row, rows, FWD_TOL, "per_row")
    valid = y != -100  # the ignored row's lse: see test_fused_lse_of_ignored_rows
    close(r.lse[valid], row_lse[valid], FWD_TOL, "lse")
    check_grads(r, lambda zz: refs.cross_entropy(zz, y, **opts)[0], h, w, b)
    # The plain loss on the materialized logits agrees.
    plain = retort.losses.cross_entropy((h @ w.T + b).astype(np.float32), y, **opts)
    close(r.loss, plain, 1e-5, "fused vs unfused")


@pytest.mark.parametrize("opts", [{}, {"normalize_topk": True}, {"beta": 0.5, "temperature": 2.0, "w_hard": 0.3},
                                  {"divergence": "tvd"}, {"divergence": "skew_kl", "normalize_topk": True},
                                  {"divergence": "skew_reverse_kl", "skew_alpha": 0.3, "w_hard": 0.3}],
                         ids=str)
def test_fused_topk_kd(rng, opts):
    h, w, b, y = inputs(rng)
    teacher = rng.normal(size=(N, V))
    ids = np.argsort(-teacher, axis=1)[:, :K]
    logp = np.take_along_axis(teacher - refs.lse(teacher)[:, None], ids, axis=1).astype(np.float32)
    mask = np.ones((N, K), np.int32)
    mask[0, -1] = 0
    r = retort.losses.fused_linear_topk_kd(h, w, ids, logp, mask, y, bias=b, return_grad=True, **opts)
    z = h.astype(np.float64) @ w.T.astype(np.float64) + b
    close(r.loss, refs.topk_kd(z, ids, logp, mask, y, **opts)[0], FWD_TOL, "loss")
    check_grads(r, lambda zz: refs.topk_kd(zz, ids, logp, mask, y, **opts)[0], h, w, b)


@pytest.mark.parametrize("opts", [{"beta": 0.5}, {"divergence": "tvd"}, {"divergence": "skew_kl"},
                                  {"divergence": "skew_reverse_kl", "skew_alpha": 0.2}], ids=str)
def test_fused_distill_with_online_teacher(rng, opts):
    h, w, b, y = inputs(rng)
    th = rng.normal(size=(N, 4)).astype(np.float32)
    tw = rng.normal(size=(V, 4)).astype(np.float32)
    o = dict(temperature=1.5, w_hard=0.2, **opts)
    r = retort.losses.fused_linear_distill(h, w, th, tw, y, bias=b, return_grad=True, return_parts=True, **o)
    tz = th.astype(np.float64) @ tw.T.astype(np.float64)
    z = h.astype(np.float64) @ w.T.astype(np.float64) + b
    want = refs.distill(z, tz, y, **o)
    close(r.loss, want[0], FWD_TOL, "loss")
    close(r.soft, want[4], FWD_TOL, "soft")
    check_grads(r, lambda zz: refs.distill(zz, tz, y, **o)[0], h, w, b)


def test_fused_entropy_and_selective(rng):
    h, w, b, _ = inputs(rng)
    z = h.astype(np.float64) @ w.T.astype(np.float64) + b
    r = retort.losses.fused_linear_entropy(h, w, bias=b, temperature=2.0, reduction="mean", return_grad=True)
    close(r.loss, refs.entropy(z, 2.0, "mean"), FWD_TOL, "entropy")
    check_grads(r, lambda zz: refs.entropy(zz, 2.0, "mean"), h, w, b)
    ids = rng.integers(0, V, size=(N, 2))
    got = retort.losses.fused_linear_selective_log_softmax(h, w, ids, bias=b)
    close(got, refs.selective_log_softmax(z, ids), FWD_TOL, "selective")


def test_fused_lse_of_ignored_rows(rng):
    h, w, b, y = inputs(rng)
    r = retort.losses.fused_linear_cross_entropy(h, w, y, bias=b, return_grad=True, return_lse=True)
    z = h.astype(np.float64) @ w.T.astype(np.float64) + b
    close(r.lse, refs.cross_entropy(z, y)[2], FWD_TOL, "lse with an ignored row")


def test_fused_gradient_switches_and_no_bias(rng):
    h, w, _, y = inputs(rng)
    r = retort.losses.fused_linear_cross_entropy(h, w, y, return_grad=True, grad_weight=False)
    assert r.grad_hidden is not None and r.grad_weight is None and r.grad_bias is None
    assert r._fields == ("loss", "grad_hidden", "grad_weight", "grad_bias", "per_row", "lse", "hard", "soft")


def test_fused_node_trains_an_lm_head(rng):
    h_np, w_np, _, y = inputs(rng)
    y[2] = 1
    hidden = retort.tensor(h_np)
    w = retort.param(w_np * 0.1, name="lm_head")
    loss = retort.ops.fused_linear_cross_entropy(hidden, w, y, chunk_rows=2)
    g = retort.Graph()
    g.backward(loss)
    opt = retort.AdamW(g.params, lr=0.1, weight_decay=0.0)
    losses = []
    for _ in range(60):
        g.zero_grad()
        g.compute()
        losses.append(loss.item())
        opt.step(g)
    assert losses[-1] < 0.3 * losses[0], (losses[0], losses[-1])


def test_fused_errors_name_the_op(rng):
    h, w, b, y = inputs(rng)
    with pytest.raises(ValueError, match=r"^fused_linear_cross_entropy: weight .* must be"):
        retort.losses.fused_linear_cross_entropy(h, w[:, :2], y)
    with pytest.raises(ValueError, match=r"^fused_linear_cross_entropy: chunk_rows must be >= 0"):
        retort.losses.fused_linear_cross_entropy(h, w, y, chunk_rows=-1)
    with pytest.raises(ValueError, match=r"^fused_linear_cross_entropy: bias"):
        retort.losses.fused_linear_cross_entropy(h, w, y, bias=b[:4])
