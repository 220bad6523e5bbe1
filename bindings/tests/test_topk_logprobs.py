"""retort.ops.topk_logprobs and retort.ops.fused_linear_topk_logprobs (a teacher's side of distillation) against
NumPy float64: ids in order (ties: the smaller id first), log-probabilities, the summed target NLL, the LSE."""

import numpy as np
import pytest

import retort


def ref(z, k, targets=None, ignore=-100):
    z = z.astype(np.float64)
    m = z.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(z - m).sum(axis=1, keepdims=True)))[:, 0]
    ids = np.stack([np.argsort(-row, kind="stable")[:k] for row in z])
    lp = np.take_along_axis(z, ids, axis=1) - lse[:, None]
    nll = None
    if targets is not None:
        keep = targets != ignore
        nll = float((lse[keep] - z[keep, targets[keep]]).sum())
    return lp, ids, nll, lse


def run(*tensors):
    g = retort.Graph()
    g.forward(*[t for t in tensors if t is not None])
    g.compute()


def test_topk_logprobs_matches_numpy():
    rng = np.random.default_rng(3)
    z = rng.normal(size=(6, 50)).astype(np.float32)
    z[2, 10] = z[2, 40] = z[2].max() + 1  # a tie at the top: id 10 first
    out = retort.ops.topk_logprobs(z, 5)
    run(out.logprobs, out.ids)
    lp, ids, _, _ = ref(z, 5)
    assert out.nll_sum is None and out.lse is None
    np.testing.assert_array_equal(out.ids.numpy(), ids)
    np.testing.assert_allclose(out.logprobs.numpy(), lp, rtol=0, atol=1e-5)


@pytest.mark.parametrize("chunk_rows", [0, 8, 37])
def test_fused_head_matches_numpy(chunk_rows):
    rng = np.random.default_rng(11 + chunk_rows)
    n, h, v, k = 37, 16, 101, 7
    hidden = rng.normal(size=(n, h)).astype(np.float32)
    weight = (rng.normal(size=(v, h)) / 4).astype(np.float32)
    targets = rng.integers(0, v, size=n).astype(np.int32)
    targets[[3, 20]] = -100
    out = retort.ops.fused_linear_topk_logprobs(hidden, weight, k, targets, return_lse=True, chunk_rows=chunk_rows)
    run(out.logprobs, out.ids, out.nll_sum, out.lse)
    lp, ids, nll, lse = ref(hidden.astype(np.float64) @ weight.T.astype(np.float64), k, targets)
    np.testing.assert_array_equal(out.ids.numpy(), ids)
    np.testing.assert_allclose(out.logprobs.numpy(), lp, rtol=0, atol=1e-4)
    np.testing.assert_allclose(out.lse.numpy(), lse, rtol=1e-5, atol=1e-5)
    assert abs(float(out.nll_sum.numpy()) - nll) <= 1e-4 * (1 + abs(nll))


def test_fused_head_without_targets_and_bad_input():
    rng = np.random.default_rng(5)
    hidden = rng.normal(size=(4, 8)).astype(np.float32)
    weight = rng.normal(size=(9, 8)).astype(np.float32)
    out = retort.ops.fused_linear_topk_logprobs(hidden, weight, 3)
    assert out.nll_sum is None and out.lse is None
    run(out.logprobs, out.ids)
    lp, ids, _, _ = ref(hidden.astype(np.float64) @ weight.T.astype(np.float64), 3)
    np.testing.assert_array_equal(out.ids.numpy(), ids)
    np.testing.assert_allclose(out.logprobs.numpy(), lp, rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="fused_linear_topk_logprobs"):
        retort.ops.fused_linear_topk_logprobs(hidden, weight, 10)  # K > V
    with pytest.raises(ValueError, match="fused_linear_topk_logprobs"):
        retort.ops.fused_linear_topk_logprobs(hidden, weight[:, :5], 3)  # H differs
    with pytest.raises(ValueError, match="topk_logprobs"):
        retort.ops.topk_logprobs(hidden, 0)
