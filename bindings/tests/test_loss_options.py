"""The options that make the plain loss functions fast by default (issue 23): gradients in the input dtype
(grad_dtype), gradients written over the logits (inplace_grad) with the inputs used without a copy (NumPy and
DLPack, f32 / f16 / bf16), selective log-softmax's gradient from grad_output, the fused losses' logits_dtype
and grad_dtype, and the allocator statistics' refusal on the CPU. Values against the float64 references of
refs.py and central differences."""

import numpy as np
import pytest

import refs
import retort

FWD_TOL = 2e-5
GRAD_TOL = 3e-4
# A gradient stored in 16 bits: each element rounded to 8 (bf16) or 11 (f16) bits of mantissa.
BF16_GRAD_TOL = 8e-3
F16_GRAD_TOL = 1.5e-3


@pytest.fixture
def rng():
    return np.random.default_rng(2311)


def close(got, want, tol, what):
    err = refs.rel_err(got, want)
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:g}"


def is_bf16_valued(a):
    """True when every float32 value of a has a zero low half: it came from bf16 storage."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return bool(np.all((bits & 0xFFFF) == 0))


def ce_case(rng, n=6, v=13):
    z = rng.normal(0, 2, size=(n, v)).astype(np.float32)
    y = rng.integers(0, v, size=n)
    y[2] = -100
    return z, y


class DLPackOnly:
    """Exposes only the DLPack protocol of an array, so the call goes through from_dlpack."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


# ---- grad_dtype --------------------------------------------------------------------------------------------

def test_row_loss_gradient_comes_in_the_logits_dtype(rng):
    z, y = ce_case(rng)
    ref = lambda x: refs.cross_entropy(x, y)[0]  # noqa: E731
    z16 = z.astype(np.float16)
    r = retort.losses.cross_entropy(z16, y, return_grad=True)
    assert r.grad.dtype == np.float16
    close(r.grad, refs.fd_grad(ref, z16.astype(np.float64)), F16_GRAD_TOL, "f16 grad")

    zb = retort.tensor(z, dtype="bf16")
    zr = zb.numpy()
    r = retort.losses.cross_entropy(zb, y, return_grad=True)
    assert is_bf16_valued(r.grad), "the default gradient of bf16 logits is bf16"
    close(r.grad, refs.fd_grad(ref, zr), BF16_GRAD_TOL, "bf16 grad")
    r32 = retort.losses.cross_entropy(zb, y, return_grad=True, grad_dtype="f32")
    assert not is_bf16_valued(r32.grad)
    close(r32.grad, refs.fd_grad(ref, zr), GRAD_TOL, "bf16 logits, f32 grad")

    r = retort.losses.cross_entropy(z, y, return_grad=True, grad_dtype="f16")
    assert r.grad.dtype == np.float16
    with pytest.raises(retort.Error, match="grad_dtype"):
        retort.losses.cross_entropy(z, y, return_grad=True, grad_dtype="i32")


@pytest.mark.parametrize("loss", ["entropy", "topk_kd", "topk_kl_gathered", "distill"])
def test_every_row_loss_takes_grad_dtype_and_inplace_grad(rng, loss):
    n, v, k = 5, 12, 4
    z = rng.normal(0, 2, size=(n, v)).astype(np.float32)
    ids = np.stack([rng.permutation(v)[:k] for _ in range(n)])
    lp = np.log(rng.dirichlet(np.ones(k), size=n) * 0.9).astype(np.float32)
    teacher = rng.normal(0, 2, size=(n, v)).astype(np.float32)
    if loss == "entropy":
        call = lambda x, **kw: retort.losses.entropy(x, reduction="mean", **kw)  # noqa: E731
        ref = lambda x: refs.entropy(x, 1.0, "mean")  # noqa: E731
    elif loss == "topk_kd":
        call = lambda x, **kw: retort.losses.topk_kd(x, ids, lp, **kw)  # noqa: E731
        ref = lambda x: refs.topk_kd(x, ids, lp)[0]  # noqa: E731
    elif loss == "topk_kl_gathered":
        z = z[:, :k].copy()
        call = lambda x, **kw: retort.losses.topk_kl_gathered(x, lp, **kw)  # noqa: E731
        ref = lambda x: refs.topk_kl_gathered(x, lp)[0]  # noqa: E731
    else:
        call = lambda x, **kw: retort.losses.distill(x, teacher, beta=0.5, **kw)  # noqa: E731
        ref = lambda x: refs.distill(x, teacher, beta=0.5)[0]  # noqa: E731
    want = refs.fd_grad(ref, z.astype(np.float64))
    close(call(z, return_grad=True).grad, want, GRAD_TOL, f"{loss} f32 grad")
    z16 = z.astype(np.float16)
    want16 = refs.fd_grad(ref, z16.astype(np.float64))
    g16 = call(z16, return_grad=True).grad
    assert g16.dtype == np.float16
    close(g16, want16, F16_GRAD_TOL, f"{loss} f16 grad")
    # In place: the logits array becomes the gradient and is returned as it.
    buf = z16.copy()
    r = call(buf, inplace_grad=True)
    assert r.grad is buf
    np.testing.assert_array_equal(buf, g16)


# ---- inplace_grad and zero-copy inputs --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_inplace_grad_overwrites_numpy_logits(rng, dtype):
    z, y = ce_case(rng)
    z = z.astype(dtype)
    want = retort.losses.cross_entropy(z, y, return_grad=True, return_lse=True)
    buf = z.copy()
    r = retort.losses.cross_entropy(buf, y, inplace_grad=True, return_lse=True)
    assert r.grad is buf, "the gradient is the caller's array"
    np.testing.assert_array_equal(buf, want.grad)
    assert float(r.loss) == float(want.loss)
    np.testing.assert_array_equal(r.lse, want.lse)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_dlpack_inputs_are_used_without_a_copy(rng, dtype):
    z, y = ce_case(rng)
    z = z.astype(dtype)
    want = retort.losses.cross_entropy(z, y, return_grad=True).grad
    buf = z.copy()
    retort.losses.cross_entropy(DLPackOnly(buf), y, inplace_grad=True)
    np.testing.assert_array_equal(buf, want)  # written through the DLPack import: no copy was made


def test_bf16_tensor_inputs_are_used_without_a_copy(rng):
    z, y = ce_case(rng)
    zb = retort.tensor(z, dtype="bf16")
    want = retort.losses.cross_entropy(zb, y, return_grad=True).grad
    r = retort.losses.cross_entropy(zb, y, inplace_grad=True)
    assert r.grad is zb
    np.testing.assert_array_equal(zb.numpy(), want)
    zb2 = retort.tensor(z, dtype="bf16")
    retort.losses.cross_entropy(DLPackOnly(zb2), y, inplace_grad=True)
    np.testing.assert_array_equal(zb2.numpy(), want)


def test_inplace_grad_refuses_what_it_cannot_overwrite(rng):
    z, y = ce_case(rng)
    wide = np.repeat(z, 2, axis=1)
    with pytest.raises(retort.Error, match="in-place gradient .* needs contiguous"):
        retort.losses.cross_entropy(wide[:, ::2], y, inplace_grad=True)  # a strided view
    ro = z.copy()
    ro.flags.writeable = False
    with pytest.raises(retort.Error, match="inplace_grad"):
        retort.losses.cross_entropy(ro, y, inplace_grad=True)
    with pytest.raises(retort.Error, match="inplace_grad"):
        retort.losses.cross_entropy(z.astype(np.float16), y, inplace_grad=True, grad_dtype="f32")
    with pytest.raises(retort.Error, match="reduction"):
        retort.losses.cross_entropy(z, y, inplace_grad=True, reduction="none")
    np.testing.assert_array_equal(z, ce_case(np.random.default_rng(2311))[0])  # nothing was written


# ---- selective log-softmax's gradient ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_selective_log_softmax_gradient(rng, dtype):
    n, v, k = 5, 11, 3
    z = rng.normal(0, 2, size=(n, v)).astype(dtype)
    ids = rng.integers(0, v, size=(n, k))
    g = rng.normal(size=(n, k)).astype(np.float32)
    r = retort.losses.selective_log_softmax(z, ids, grad_output=g)
    close(r.values, refs.selective_log_softmax(z, ids), FWD_TOL if dtype == np.float32 else 1e-3, "values")
    want = refs.fd_grad(lambda x: float(np.sum(refs.selective_log_softmax(x, ids) * g)), z.astype(np.float64))
    assert r.grad.dtype == dtype and r.grad.shape == (n, v)
    close(r.grad, want, GRAD_TOL if dtype == np.float32 else F16_GRAD_TOL, "grad")
    close(r.loss, np.sum(refs.selective_log_softmax(z, ids) * g), 1e-5 if dtype == np.float32 else 1e-3,
          "surrogate")
    r32 = retort.losses.selective_log_softmax(z, ids, grad_output=g, grad_dtype="f32")
    assert r32.grad.dtype == np.float32
    with pytest.raises(retort.Error, match="grad_output"):
        retort.losses.selective_log_softmax(z, ids, grad_output=g[:, :2])


# ---- the fused losses ---------------------------------------------------------------------------------------

def fused_case(rng, n=7, h=5, v=19):
    hid = rng.normal(size=(n, h)).astype(np.float32)
    w = rng.normal(size=(v, h)).astype(np.float32)
    y = rng.integers(0, v, size=n)
    return hid, w, y


def test_fused_logits_dtype_option(rng):
    hid, w, y = fused_case(rng)
    base = retort.losses.fused_linear_cross_entropy(hid, w, y, return_grad=True)
    for ld in ["f32", "bf16", "f16"]:  # the CPU executor keeps f32 logits whatever is asked
        r = retort.losses.fused_linear_cross_entropy(hid, w, y, return_grad=True, logits_dtype=ld)
        assert float(r.loss) == float(base.loss)
        np.testing.assert_array_equal(r.grad_weight, base.grad_weight)
    with pytest.raises(retort.Error, match="logits_dtype"):
        retort.losses.fused_linear_cross_entropy(hid, w, y, logits_dtype="i64")
    node = retort.ops.fused_linear_cross_entropy(retort.tensor(hid), retort.tensor(w), retort.tensor(y),
                                                 logits_dtype="bf16")
    assert isinstance(node, retort.Tensor) and node.shape == ()


def test_fused_gradients_come_in_the_input_dtype(rng):
    hid, w, y = fused_case(rng)
    hb, wb = retort.tensor(hid, dtype="bf16"), retort.tensor(w, dtype="bf16")
    h64, w64 = hb.numpy().astype(np.float64), wb.numpy().astype(np.float64)
    ref = lambda hh, ww: refs.cross_entropy(hh @ ww.T, y)[0]  # noqa: E731
    want_h = refs.fd_grad(lambda x: ref(x, w64), h64)
    want_w = refs.fd_grad(lambda x: ref(h64, x), w64)
    r = retort.losses.fused_linear_cross_entropy(hb, wb, y, return_grad=True)
    assert is_bf16_valued(r.grad_hidden) and is_bf16_valued(r.grad_weight)
    close(r.grad_hidden, want_h, BF16_GRAD_TOL, "bf16 grad_hidden")
    close(r.grad_weight, want_w, BF16_GRAD_TOL, "bf16 grad_weight")
    # f32 gradients: exact with f32 chunk logits; with the default (bf16 logits for bf16 inputs) the CPU's
    # gradient GEMMs read the logits gradient rounded to bf16, as a GPU's 16-bit logits do.
    r32 = retort.losses.fused_linear_cross_entropy(hb, wb, y, return_grad=True, grad_dtype="f32",
                                                   logits_dtype="f32")
    close(r32.grad_hidden, want_h, GRAD_TOL, "f32 grad_hidden")
    close(r32.grad_weight, want_w, GRAD_TOL, "f32 grad_weight")
    r32b = retort.losses.fused_linear_cross_entropy(hb, wb, y, return_grad=True, grad_dtype="f32")
    close(r32b.grad_hidden, want_h, BF16_GRAD_TOL, "f32 grad_hidden, bf16 logits")
    close(r32b.grad_weight, want_w, BF16_GRAD_TOL, "f32 grad_weight, bf16 logits")
    h16, w16 = hid.astype(np.float16), w.astype(np.float16)
    r16 = retort.losses.fused_linear_cross_entropy(h16, w16, y, return_grad=True)
    assert r16.grad_hidden.dtype == np.float16 and r16.grad_weight.dtype == np.float16


def test_fused_selective_log_softmax_gradient(rng):
    hid, w, _ = fused_case(rng)
    ids = rng.integers(0, w.shape[0], size=(hid.shape[0], 4))
    g = rng.normal(size=ids.shape).astype(np.float32)
    r = retort.losses.fused_linear_selective_log_softmax(hid, w, ids, grad_output=g)
    h64, w64 = hid.astype(np.float64), w.astype(np.float64)
    f = lambda hh, ww: float(np.sum(refs.selective_log_softmax(hh @ ww.T, ids) * g))  # noqa: E731
    close(r.values, refs.selective_log_softmax(h64 @ w64.T, ids), FWD_TOL, "values")
    close(r.grad_hidden, refs.fd_grad(lambda x: f(x, w64), h64), GRAD_TOL, "grad_hidden")
    close(r.grad_weight, refs.fd_grad(lambda x: f(h64, x), w64), GRAD_TOL, "grad_weight")
    assert r.grad_bias is None
    plain = retort.losses.fused_linear_selective_log_softmax(hid, w, ids)
    np.testing.assert_array_equal(plain, r.values)


def test_memory_stats_are_a_device_feature():
    with pytest.raises(retort.Error, match="CPU"):
        retort.cpu().memory_stats()
