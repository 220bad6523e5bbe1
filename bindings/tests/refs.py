"""Float64 NumPy references for the loss backend, written from the formulas in src/ops/loss/row_kernels.h and
sharing nothing with the kernels; and central finite differences for their gradients.

Every reference takes float64 arrays and returns (loss, per_row, lse[, hard, soft]) with loss reduced the way
retort reduces it.
"""

import numpy as np


def lse(x, axis=-1):
    """Log-sum-exp along axis, stable in float64 (all -inf rows give -inf)."""
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    return np.squeeze(m, axis) + np.log(np.sum(np.exp(x - m), axis=axis))


def reduce(rows, valid, reduction):
    """rows [N] -> the loss: the mean over the valid rows (0 when none), the sum, or rows itself."""
    if reduction == "none":
        return rows
    if reduction == "sum":
        return rows.sum()
    n = int(np.count_nonzero(valid))
    return rows.sum() / n if n else 0.0


def cross_entropy(z, labels, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=0.0,
                  reduction="mean"):
    z = np.asarray(z, np.float64)
    s = softcap * np.tanh(z / softcap) if softcap > 0 else z
    row_lse = lse(s)
    valid = labels != ignore_index
    safe = np.where(valid, labels, 0)
    picked = s[np.arange(len(s)), safe]
    eps = label_smoothing
    rows = (1 - eps) * (row_lse - picked) + eps * (row_lse - s.mean(axis=1)) + z_loss * row_lse ** 2
    rows = np.where(valid, rows, 0.0)
    return reduce(rows, valid, reduction), rows, row_lse


def _divergence(logp, logq, beta, valid=None, divergence="kl", skew_alpha=0.1):
    """D(P, Q) per row over the last axis; entries where valid is False are left out."""
    if valid is None:
        valid = np.ones(logp.shape, bool)
    p = np.where(valid, np.exp(np.where(valid, logp, 0.0)), 0.0)
    q = np.where(valid, np.exp(np.where(valid, logq, 0.0)), 0.0)
    lp = np.where(valid, logp, 0.0)
    lq = np.where(valid, logq, 0.0)
    a = skew_alpha
    if divergence == "tvd":
        return 0.5 * np.sum(np.abs(p - q), axis=-1)
    if divergence in ("skew_kl", "skew_reverse_kl"):
        fwd = divergence == "skew_kl"
        m = a * p + (1 - a) * q if fwd else (1 - a) * p + a * q
        w, lw = (p, lp) if fwd else (q, lq)
        lm = np.log(np.where(valid & (m > 0), m, 1.0))
        return np.sum(np.where(w > 0, w * (lw - lm), 0.0), axis=-1)
    assert divergence == "kl", divergence
    if beta == 0:
        return np.sum(p * (lp - lq), axis=-1)
    if beta == 1:
        return np.sum(q * (lq - lp), axis=-1)
    m = beta * p + (1 - beta) * q
    lm = np.log(np.where(valid & (m > 0), m, 1.0))
    return beta * np.sum(p * (lp - lm), axis=-1) + (1 - beta) * np.sum(q * (lq - lm), axis=-1)


def topk_kd(z, ids, logprobs, mask=None, labels=None, beta=0.0, temperature=1.0, normalize_topk=False,
            w_hard=0.0, w_soft=1.0, ignore_index=-100, reduction="mean", divergence="kl", skew_alpha=0.1):
    z = np.asarray(z, np.float64)
    lp = np.asarray(logprobs, np.float64)
    n, v = z.shape
    t = temperature
    valid_slot = np.isfinite(lp) if mask is None else (np.asarray(mask) != 0) & np.isfinite(lp)
    x = z / t
    xs = np.take_along_axis(x, ids, axis=1)
    neg = -np.inf
    # teacher log p over the valid slots (renormalized at T != 1)
    if t == 1:
        logp = lp
    else:
        lpt = np.where(valid_slot, lp / t, neg)
        logp = lpt - lse(lpt)[:, None]
    # student log q at the slots
    if normalize_topk:
        xv = np.where(valid_slot, xs, neg)
        logq = xs - lse(xv)[:, None]
    else:
        logq = xs - lse(x)[:, None]
    any_valid = valid_slot.any(axis=1)
    d = np.where(any_valid, _divergence(logp, logq, beta, valid_slot, divergence, skew_alpha), 0.0)
    soft = t * t * d
    row_lse = lse(x)
    if labels is not None:
        valid_row = labels != ignore_index
        safe = np.where(valid_row, labels, 0)
        hard = lse(z) - z[np.arange(n), safe]
    else:
        valid_row = np.ones(n, bool)
        hard = np.zeros(n)
    rows = w_hard * hard + w_soft * soft
    rows, hard, soft = (np.where(valid_row, a, 0.0) for a in (rows, hard, soft))
    return (reduce(rows, valid_row, reduction), rows, row_lse, reduce(hard, valid_row, reduction),
            reduce(soft, valid_row, reduction))


def topk_kl_gathered(s, logprobs, mask=None, temperature=1.0, reduction="mean"):
    s = np.asarray(s, np.float64)
    lp = np.asarray(logprobs, np.float64)
    n = s.shape[0]
    t = temperature
    valid_slot = np.isfinite(lp) if mask is None else (np.asarray(mask) != 0) & np.isfinite(lp)
    if t == 1:
        logp = lp
    else:
        lpt = np.where(valid_slot, lp / t, -np.inf)
        logp = lpt - lse(lpt)[:, None]
    xv = np.where(valid_slot, s / t, -np.inf)
    any_valid = valid_slot.any(axis=1)
    row_lse = np.where(any_valid, lse(xv), 0.0)
    logq = s / t - row_lse[:, None]
    rows = np.where(any_valid, t * t * _divergence(logp, logq, 0.0, valid_slot), 0.0)
    return reduce(rows, np.ones(n, bool), reduction), rows, row_lse


def distill(student, teacher, labels=None, beta=0.0, temperature=1.0, w_hard=0.0, w_soft=1.0,
            ignore_index=-100, reduction="mean", divergence="kl", skew_alpha=0.1):
    z = np.asarray(student, np.float64)
    tz = np.asarray(teacher, np.float64)
    n = z.shape[0]
    t = temperature
    logq = z / t - lse(z / t)[:, None]
    logp = tz / t - lse(tz / t)[:, None]
    soft = t * t * _divergence(logp, logq, beta, None, divergence, skew_alpha)
    if labels is not None:
        valid_row = labels != ignore_index
        safe = np.where(valid_row, labels, 0)
        hard = lse(z) - z[np.arange(n), safe]
    else:
        valid_row = np.ones(n, bool)
        hard = np.zeros(n)
    rows = w_hard * hard + w_soft * soft
    rows, hard, soft = (np.where(valid_row, a, 0.0) for a in (rows, hard, soft))
    return (reduce(rows, valid_row, reduction), rows, lse(z / t), reduce(hard, valid_row, reduction),
            reduce(soft, valid_row, reduction))


def entropy(z, temperature=1.0, reduction="none"):
    x = np.asarray(z, np.float64) / temperature
    logq = x - lse(x)[:, None]
    rows = -np.sum(np.exp(logq) * logq, axis=1)
    return reduce(rows, np.ones(len(rows), bool), reduction)


def selective_log_softmax(z, ids):
    z = np.asarray(z, np.float64)
    return np.take_along_axis(z, ids, axis=1) - lse(z)[:, None]


def fd_grad(f, x, h=1e-6):
    """Central differences of the scalar function f at x (float64)."""
    x = np.array(x, np.float64)
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + h
        up = f(x)
        x[i] = old - h
        down = f(x)
        x[i] = old
        g[i] = (up - down) / (2 * h)
    return g


def rel_err(got, want):
    """max |got - want| / max(max |want|, 1e-30): one number per comparison, scale-free."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
