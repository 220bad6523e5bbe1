"""The per-call path of retort.losses: a repeated call on the CPU runs its kept graph again over new arrays
(retort.losses._cache_stats counts hits and builds), and that gives the right answer (float64 NumPy
references of refs.py) for new values, rebuilds for a changed shape, dtype, layout or option, never sums
gradients across calls, and keeps no caller's array alive; errors stay the call's own. Also the DLPack stream
argument of Tensor.__dlpack__ (the array API standard's rules) and the error semantics on the CPU backend."""

import gc
import weakref

import numpy as np
import pytest

import refs
import retort

TOL = 2e-5
GRAD_TOL = 3e-4


@pytest.fixture
def rng():
    return np.random.default_rng(2311)


def close(got, want, tol, what):
    err = refs.rel_err(got, want)
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:g}"


def stats():
    return dict(retort.losses._cache_stats())


def delta(before):
    now = stats()
    return now["hits"] - before["hits"], now["builds"] - before["builds"]


def ce_inputs(rng, n=6, v=11, dtype=np.float32):
    z = rng.normal(0, 2, size=(n, v)).astype(dtype)
    y = rng.integers(0, v, size=n)
    return z, y


def test_repeated_call_reuses_its_graph_with_new_values(rng):
    z, y = ce_inputs(rng)
    s = stats()
    retort.losses.cross_entropy(z, y, label_smoothing=0.05)
    for _ in range(3):
        z, y = ce_inputs(rng)  # fresh values, new arrays, same layout
        got = retort.losses.cross_entropy(z, y, label_smoothing=0.05)
        close(got, refs.cross_entropy(z, y, label_smoothing=0.05)[0], TOL, "loss")
    assert delta(s) == (3, 1)


def test_cached_call_counts_its_own_ignored_rows(rng):
    # The mean is over valid rows: a rerun with another number of ignored labels must divide by its own count.
    for ignored in ([], [1], [0, 2, 4], [0, 1, 2, 3, 4]):
        z, y = ce_inputs(rng)
        y[ignored] = -100
        r = retort.losses.cross_entropy(z, y, return_grad=True, grad_dtype="f32")
        close(r.loss, refs.cross_entropy(z, y)[0], TOL, f"loss, rows {ignored} ignored")
        close(r.grad, refs.fd_grad(lambda x: refs.cross_entropy(x, y)[0], z), 3e-4, f"grad, rows {ignored} ignored")
        h = rng.normal(size=(6, 3)).astype(np.float32)
        w = rng.normal(size=(11, 3)).astype(np.float32)
        f = retort.losses.fused_linear_cross_entropy(h, w, y)
        close(f, refs.cross_entropy(h.astype(np.float64) @ w.T.astype(np.float64), y)[0], TOL,
              f"fused loss, rows {ignored} ignored")


def test_cached_call_writes_into_the_same_array_it_was_given(rng):
    # The same array object with new contents: the graph must read the new values, not a copy.
    z, y = ce_inputs(rng)
    retort.losses.cross_entropy(z, y)
    z[:] = rng.normal(0, 3, size=z.shape)
    y[:] = rng.integers(0, z.shape[1], size=y.shape)
    close(retort.losses.cross_entropy(z, y), refs.cross_entropy(z, y)[0], TOL, "loss after an in-place change")


@pytest.mark.parametrize(
    "change",
    ["shape", "dtype", "option", "reduction", "transposed", "label dtype", "return flag"])
def test_a_changed_call_rebuilds(rng, change):
    z, y = ce_inputs(rng)
    retort.losses.cross_entropy(z, y)
    s = stats()
    opts = {}
    if change == "shape":
        z, y = ce_inputs(rng, n=7, v=13)
    elif change == "dtype":
        z = z.astype(np.float16)
    elif change == "option":
        opts = {"z_loss": 1e-2}
    elif change == "reduction":
        opts = {"reduction": "sum"}
    elif change == "transposed":
        z = np.asfortranarray(z)  # same shape, other strides
    elif change == "label dtype":
        y = y.astype(np.int32)
    r = retort.losses.cross_entropy(z, y, return_grad=change == "return flag", **opts)
    loss = r.loss if change == "return flag" else r
    tol = 1e-3 if change == "dtype" else TOL
    close(loss, refs.cross_entropy(z.astype(np.float64), y, **opts)[0], tol, "loss")
    assert delta(s) == (0, 1), f"a call with another {change} must build its own graph"


def test_cached_gradients_are_each_calls_own(rng):
    # A fused loss's weight gradient is an accumulator in the graph: a rerun must overwrite, not add.
    n, h_, v = 5, 3, 9
    s = stats()
    for _ in range(3):
        h = rng.normal(size=(n, h_)).astype(np.float32)
        w = rng.normal(size=(v, h_)).astype(np.float32)
        y = rng.integers(0, v, size=n)
        r = retort.losses.fused_linear_cross_entropy(h, w, y, return_grad=True, grad_dtype="f32")
        h64, w64 = h.astype(np.float64), w.astype(np.float64)
        close(r.loss, refs.cross_entropy(h64 @ w64.T, y)[0], TOL, "loss")
        close(r.grad_hidden, refs.fd_grad(lambda x: refs.cross_entropy(x @ w64.T, y)[0], h64), GRAD_TOL,
              "grad_hidden")
        close(r.grad_weight, refs.fd_grad(lambda x: refs.cross_entropy(h64 @ x.T, y)[0], w64), GRAD_TOL,
              "grad_weight")
    assert delta(s) == (2, 1)


def test_results_of_a_cached_call_are_not_overwritten_by_the_next(rng):
    z1, y1 = ce_inputs(rng)
    r1 = retort.losses.cross_entropy(z1, y1, reduction="none", return_grad=False)
    z2, y2 = ce_inputs(rng)
    r2 = retort.losses.cross_entropy(z2, y2, reduction="none")
    close(r1, refs.cross_entropy(z1, y1, reduction="none")[0], TOL, "first result after the second call")
    close(r2, refs.cross_entropy(z2, y2, reduction="none")[0], TOL, "second result")


def test_a_cached_call_keeps_no_array_alive(rng):
    z, y = ce_inputs(rng)
    retort.losses.entropy(z)
    z2, _ = ce_inputs(rng)
    retort.losses.entropy(z2)  # a hit
    zr = weakref.ref(z2)
    del z2
    gc.collect()
    assert zr() is None, "the cache kept the caller's logits alive"


def test_a_bad_label_in_a_cached_call_raises_and_the_next_call_works(rng):
    z, y = ce_inputs(rng)
    retort.losses.cross_entropy(z, y)
    bad = y.copy()
    bad[2] = 99
    with pytest.raises(retort.Error, match=r"cross_entropy.*label 99"):
        retort.losses.cross_entropy(z, bad)
    close(retort.losses.cross_entropy(z, y), refs.cross_entropy(z, y)[0], TOL, "loss after the error")


def test_inputs_that_need_a_copy_run_uncached_and_right(rng):
    z, y = ce_inputs(rng)
    s = stats()
    for _ in range(2):
        z64 = rng.normal(0, 2, size=z.shape)  # float64: converted to f32, not used in place
        close(retort.losses.cross_entropy(z64, y), refs.cross_entropy(z64.astype(np.float32), y)[0], TOL,
              "loss")
    assert delta(s) == (0, 2)


def test_inplace_grad_is_never_reused(rng):
    z, y = ce_inputs(rng)
    s = stats()
    for _ in range(2):
        w = z.copy()
        r = retort.losses.entropy(w, reduction="mean", inplace_grad=True)
        assert r.grad is w
    assert delta(s) == (0, 2)


# ---- DLPack stream argument (array API standard) ----------------------------------------------------------

def test_dlpack_stream_none_on_the_cpu():
    t = retort.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(np.from_dlpack(t), np.arange(6, dtype=np.float32).reshape(2, 3))
    cap = t.__dlpack__(stream=None)
    assert type(cap).__name__ == "PyCapsule"


@pytest.mark.parametrize("stream", [1, 2, -1, 0, 12345])
def test_dlpack_cpu_tensor_refuses_a_stream(stream):
    t = retort.tensor(np.ones(4, np.float32))
    with pytest.raises(retort.Error, match=r"__dlpack__: a host tensor takes stream=None"):
        t.__dlpack__(stream=stream)


@pytest.mark.parametrize("stream", ["1", 1.0, True, object()])
def test_dlpack_stream_must_be_an_int(stream):
    t = retort.tensor(np.ones(4, np.float32))
    with pytest.raises(TypeError, match=r"__dlpack__: stream must be an int or None"):
        t.__dlpack__(stream=stream)


# ---- errors on the CPU backend: raised by the call that meets them, once ----------------------------------

def test_cpu_errors_are_the_calls_own(rng):
    be = retort.cpu()
    z, y = ce_inputs(rng)
    bad = y.copy()
    bad[0] = -7
    with pytest.raises(retort.Error, match=r"label -7"):
        retort.losses.cross_entropy(z, bad)
    be.synchronize()  # nothing left to report
    close(retort.losses.cross_entropy(z, y), refs.cross_entropy(z, y)[0], TOL, "loss after the error")
    # The CPU counts each read of a result into NumPy as a host wait, like a device: one loss, one read.
    w0 = be.host_waits
    retort.losses.cross_entropy(z, y)
    assert be.host_waits - w0 == 1
