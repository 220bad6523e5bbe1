"""retort.losses against float64 NumPy references (refs.py): values, per-row outputs, log-sum-exps, the
gradient with respect to the logits (against central differences of the reference), every option, bf16
storage, and the graph-node versions in retort.ops."""

import numpy as np
import pytest

import refs
import retort

# f32 math on O(1) logits: forward values agree to ~1e-6 relative; gradients are compared with finite
# differences of the float64 reference, whose own error is ~1e-9.
FWD_TOL = 2e-5
GRAD_TOL = 2e-4
# bf16 storage rounds each logit to 8 bits of mantissa; the reference sees the same rounded values, so only
# the f32 math remains — with gradients asked for in f32, checked the same way.
BF16_TOL = 1e-4


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def close(got, want, tol, what):
    err = refs.rel_err(got, want)
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:g}"


def grad_check(fn_ref, z, got, tol=GRAD_TOL, what="grad"):
    want = refs.fd_grad(fn_ref, z)
    close(got, want, tol, what)


def logits_and_labels(rng, n=6, v=11, ignore=True):
    z = rng.normal(0, 2, size=(n, v)).astype(np.float32)
    y = rng.integers(0, v, size=n)
    if ignore:
        y[1] = -100
    return z, y


# ---- cross-entropy ----------------------------------------------------------------------------------------

CE_OPTIONS = [
    {},
    {"label_smoothing": 0.1},
    {"z_loss": 1e-2},
    {"softcap": 3.0},
    {"label_smoothing": 0.2, "z_loss": 1e-3, "softcap": 5.0, "reduction": "sum"},
    {"ignore_index": 3},
]


@pytest.mark.parametrize("opts", CE_OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_cross_entropy(rng, opts):
    z, y = logits_and_labels(rng)
    if opts.get("ignore_index") == 3:
        y[1], y[2] = 0, 3  # -100 is an ordinary (out-of-range) label then
    r = retort.losses.cross_entropy(z, y, return_grad=True, return_per_row=True, return_lse=True, **opts)
    loss, rows, row_lse = refs.cross_entropy(z, y, **opts)
    close(r.loss, loss, FWD_TOL, "loss")
    close(r.per_row, rows, FWD_TOL, "per_row")
    close(r.lse, row_lse, FWD_TOL, "lse")
    assert r.loss.shape == () and r.per_row.shape == (6,) and r.grad.shape == z.shape
    grad_check(lambda x: refs.cross_entropy(x, y, **opts)[0], z, r.grad)


def test_cross_entropy_reduction_none_and_plain_result(rng):
    z, y = logits_and_labels(rng)
    rows = retort.losses.cross_entropy(z, y, reduction="none")
    assert isinstance(rows, np.ndarray) and rows.shape == (6,)
    close(rows, refs.cross_entropy(z, y)[1], FWD_TOL, "rows")
    assert rows[1] == 0.0  # the ignored row
    only = retort.losses.cross_entropy(z, y)
    close(only, refs.cross_entropy(z, y)[0], FWD_TOL, "loss")


def test_cross_entropy_all_rows_ignored_is_zero(rng):
    z, _ = logits_and_labels(rng)
    r = retort.losses.cross_entropy(z, np.full(6, -100), return_grad=True)
    assert float(r.loss) == 0.0 and np.all(r.grad == 0)


def test_cross_entropy_bf16_and_strided(rng):
    z, y = logits_and_labels(rng, n=5, v=16)
    zb = retort.tensor(z, dtype="bf16")
    zr = zb.numpy()  # the rounded values, as float32
    assert not np.array_equal(zr, z) and np.allclose(zr, z, rtol=1e-2)
    # f32 gradient: this checks the math on bf16 storage (the bf16 default is test_loss_options.py's).
    r = retort.losses.cross_entropy(zb, y, return_grad=True, grad_dtype="f32")
    close(r.loss, refs.cross_entropy(zr, y)[0], BF16_TOL, "bf16 loss")
    grad_check(lambda x: refs.cross_entropy(x, y)[0], zr, r.grad, what="bf16 grad")
    # A strided view (every other column) is read in place.
    wide = rng.normal(size=(5, 32)).astype(np.float32)
    view = wide[:, ::2]
    close(retort.losses.cross_entropy(view, y), refs.cross_entropy(view, y)[0], FWD_TOL, "strided")


def test_cross_entropy_int32_labels_and_torch_style_inputs(rng):
    z, y = logits_and_labels(rng)
    a = retort.losses.cross_entropy(z, y.astype(np.int32))
    b = retort.losses.cross_entropy(z.astype(np.float64), y)  # float64 becomes f32
    close(a, refs.cross_entropy(z, y)[0], FWD_TOL, "i32 labels")
    close(b, refs.cross_entropy(z, y)[0], FWD_TOL, "f64 logits")


# ---- top-K distillation -----------------------------------------------------------------------------------

def topk_inputs(rng, n=5, v=12, k=4, pad=True):
    z = rng.normal(0, 1.5, size=(n, v)).astype(np.float32)
    teacher = rng.normal(0, 2, size=(n, v))
    ids = np.argsort(-teacher, axis=1)[:, :k].astype(np.int64)
    logp = np.take_along_axis(teacher - refs.lse(teacher)[:, None], ids, axis=1).astype(np.float32)
    mask = np.ones((n, k), np.int32)
    if pad:
        mask[0, k - 1] = 0       # a masked slot
        logp[2, k - 2] = -np.inf  # a -inf padding slot
        mask[3, :] = 0           # a row without any valid slot
    y = rng.integers(0, v, size=n)
    y[4] = -100
    return z, ids, logp, mask, y


TOPK_OPTIONS = [
    {},
    {"beta": 1.0},
    {"beta": 0.5},
    {"temperature": 2.0},
    {"normalize_topk": True},
    {"w_hard": 0.5, "w_soft": 0.7, "temperature": 1.5, "beta": 0.3},
    {"normalize_topk": True, "temperature": 0.7, "reduction": "sum"},
    {"divergence": "tvd"},
    {"divergence": "tvd", "normalize_topk": True, "temperature": 2.0},
    {"divergence": "skew_kl", "skew_alpha": 0.3, "w_hard": 0.5},
    {"divergence": "skew_reverse_kl", "temperature": 1.5},
]


@pytest.mark.parametrize("opts", TOPK_OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_topk_kd(rng, opts):
    z, ids, logp, mask, y = topk_inputs(rng)
    r = retort.losses.topk_kd(z, ids, logp, mask, y, return_grad=True, return_per_row=True, return_lse=True,
                              return_parts=True, **opts)
    with np.errstate(all="ignore"):
        loss, rows, row_lse, hard, soft = refs.topk_kd(z, ids, logp, mask, y, **opts)
        close(r.loss, loss, FWD_TOL, "loss")
        close(r.per_row, rows, FWD_TOL, "per_row")
        close(r.lse, row_lse, FWD_TOL, "lse")
        close(r.hard, hard, FWD_TOL, "hard")  # computed from the labels whatever w_hard is
        close(r.soft, soft, FWD_TOL, "soft")
        grad_check(lambda x: refs.topk_kd(x, ids, logp, mask, y, **opts)[0], z, r.grad)


def test_bad_divergence_names_the_choices(rng):
    z, y = logits_and_labels(rng, n=3, v=5)
    with pytest.raises(retort.Error, match="tvd"):
        retort.losses.distill(z, z, y, divergence="js")
    with pytest.raises(retort.Error, match="skew_alpha"):
        retort.losses.distill(z, z, y, divergence="skew_kl", skew_alpha=2.0)


def test_topk_kd_without_mask_and_labels(rng):
    z, ids, logp, _, _ = topk_inputs(rng, pad=False)
    r = retort.losses.topk_kd(z, ids, logp, return_grad=True)
    close(r.loss, refs.topk_kd(z, ids, logp)[0], FWD_TOL, "loss")
    grad_check(lambda x: refs.topk_kd(x, ids, logp)[0], z, r.grad)


@pytest.mark.parametrize("opts", [{}, {"temperature": 2.0}, {"reduction": "sum"}], ids=str)
def test_topk_kl_gathered(rng, opts):
    z, ids, logp, mask, _ = topk_inputs(rng)
    s = np.take_along_axis(z, ids, axis=1).copy()
    r = retort.losses.topk_kl_gathered(s, logp, mask, return_grad=True, return_per_row=True, return_lse=True,
                                       **opts)
    with np.errstate(all="ignore"):
        loss, rows, row_lse = refs.topk_kl_gathered(s, logp, mask, **opts)
        close(r.loss, loss, FWD_TOL, "loss")
        close(r.per_row, rows, FWD_TOL, "per_row")
        close(r.lse, row_lse, FWD_TOL, "lse")
        grad_check(lambda x: refs.topk_kl_gathered(x, logp, mask, **opts)[0], s, r.grad)


# ---- full-vocabulary distillation, entropy, selective log-softmax -----------------------------------------

DISTILL_OPTIONS = [
    {},
    {"beta": 1.0},
    {"beta": 0.5, "temperature": 2.0},
    {"w_hard": 0.3, "w_soft": 0.9, "temperature": 1.5},
    {"reduction": "sum", "beta": 0.2},
    {"divergence": "tvd", "temperature": 2.0},
    {"divergence": "skew_kl", "w_hard": 0.3},
    {"divergence": "skew_reverse_kl", "skew_alpha": 0.4, "reduction": "sum"},
]


@pytest.mark.parametrize("opts", DISTILL_OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_distill(rng, opts):
    z, y = logits_and_labels(rng, n=5, v=9)
    teacher = rng.normal(0, 2, size=z.shape).astype(np.float32)
    r = retort.losses.distill(z, teacher, y, return_grad=True, return_per_row=True, return_lse=True,
                              return_parts=True, **opts)
    loss, rows, row_lse, hard, soft = refs.distill(z, teacher, y, **opts)
    close(r.loss, loss, FWD_TOL, "loss")
    close(r.per_row, rows, FWD_TOL, "per_row")
    close(r.lse, row_lse, FWD_TOL, "lse")
    close(r.hard, hard, FWD_TOL, "hard")
    close(r.soft, soft, FWD_TOL, "soft")
    grad_check(lambda x: refs.distill(x, teacher, y, **opts)[0], z, r.grad)


@pytest.mark.parametrize("temperature", [1.0, 0.5, 3.0])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_entropy(rng, temperature, reduction):
    z = rng.normal(0, 2, size=(4, 10)).astype(np.float32)
    want = refs.entropy(z, temperature, reduction)
    if reduction == "none":
        close(retort.losses.entropy(z, temperature=temperature), want, FWD_TOL, "entropy")
        return
    r = retort.losses.entropy(z, temperature=temperature, reduction=reduction, return_grad=True)
    close(r.loss, want, FWD_TOL, "entropy")
    grad_check(lambda x: refs.entropy(x, temperature, reduction), z, r.grad)


def test_selective_log_softmax(rng):
    z = rng.normal(0, 2, size=(5, 13)).astype(np.float32)
    ids = rng.integers(0, 13, size=(5, 3))
    got = retort.losses.selective_log_softmax(z, ids)
    assert got.shape == (5, 3) and got.dtype == np.float32
    close(got, refs.selective_log_softmax(z, ids), FWD_TOL, "selective_log_softmax")


# ---- graph nodes (retort.ops) agree with the plain functions ----------------------------------------------

def test_loss_nodes_in_a_graph_train_the_logits(rng):
    z, y = logits_and_labels(rng)
    logits = retort.param(z, name="logits")
    out = retort.ops.cross_entropy(logits, y, label_smoothing=0.1, return_lse=True)
    assert out.per_row is None and out.lse is not None
    g = retort.Graph()
    g.forward(out.lse)
    g.backward(out.loss)
    g.compute()
    loss, _, row_lse = refs.cross_entropy(z, y, label_smoothing=0.1)
    close(out.loss.numpy(), loss, FWD_TOL, "node loss")
    close(out.lse.numpy(), row_lse, FWD_TOL, "node lse")
    plain = retort.losses.cross_entropy(z, y, label_smoothing=0.1, return_grad=True)
    close(g.grad(logits).numpy(), plain.grad, 1e-6, "node grad vs plain grad")


def test_loss_nodes_other_losses(rng):
    z, ids, logp, mask, y = topk_inputs(rng)
    node = retort.ops.topk_kd(z, ids, logp, mask, y, beta=0.5, w_hard=0.2)
    ent = retort.ops.entropy(z, temperature=2.0, reduction="mean")
    sel = retort.ops.selective_log_softmax(z, ids)
    teacher = rng.normal(size=z.shape).astype(np.float32)
    dist = retort.ops.distill(z, teacher, y, beta=1.0)
    g = retort.Graph()
    g.forward(node, ent, sel, dist)
    g.compute()
    with np.errstate(all="ignore"):
        close(node.numpy(), refs.topk_kd(z, ids, logp, mask, y, beta=0.5, w_hard=0.2)[0], FWD_TOL, "topk node")
    close(ent.numpy(), refs.entropy(z, 2.0, "mean"), FWD_TOL, "entropy node")
    close(sel.numpy(), refs.selective_log_softmax(z, ids), FWD_TOL, "selective node")
    close(dist.numpy(), refs.distill(z, teacher, y, beta=1.0)[0], FWD_TOL, "distill node")


def test_loss_inputs_may_be_retort_tensors_and_computed_values(rng):
    z, y = logits_and_labels(rng)
    x = retort.tensor(z)
    scaled = x * 0.5
    g = retort.Graph()
    g.forward(scaled)
    g.compute()
    r = retort.losses.cross_entropy(scaled, retort.tensor(y), return_grad=True)
    close(r.loss, refs.cross_entropy(z * 0.5, y)[0], FWD_TOL, "computed input")
    assert not x.is_param  # return_grad marks a private alias, not the caller's tensor
