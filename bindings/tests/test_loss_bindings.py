"""One binding per loss: retort.losses.<name> (plain function) and retort.ops.<name> (graph node) come from one
declaration each (bindings/losses.cpp). They take the same inputs and options with the same defaults, and give
the same values with every option set away from its default; a new option without a case here fails
test_every_option_has_a_case."""

import inspect

import numpy as np
import pytest

import retort

N, V, K, H = 6, 11, 3, 5
# The keywords only the plain function has: how it returns gradients and where it runs.
ROW_CALL = ["return_grad", "grad_dtype", "inplace_grad", "backend"]
FUSED_CALL = ["return_grad", "grad_dtype", "backend"]
VALUES_CALL = ["grad_output", "grad_dtype", "backend"]


def inputs(rng):
    z = rng.normal(0, 2, size=(N, V)).astype(np.float32)
    y = rng.integers(0, V, size=N)
    y[1], y[2] = 3, -100  # 3 is the ignore_index of the non-default case
    ids = np.stack([rng.permutation(V)[:K] for _ in range(N)]).astype(np.int64)
    t = rng.normal(0, 1, size=(N, K))
    logp = (t - np.log(np.exp(t).sum(1, keepdims=True))).astype(np.float32)
    mask = np.ones((N, K), np.float32)
    mask[0, 2] = 0
    h = rng.normal(0, 1, size=(N, H)).astype(np.float32)
    w = rng.normal(0, 0.5, size=(V, H)).astype(np.float32)
    bias = rng.normal(0, 0.1, size=V).astype(np.float32)
    th = rng.normal(0, 1, size=(N, H + 2)).astype(np.float32)
    tw = rng.normal(0, 0.5, size=(V, H + 2)).astype(np.float32)
    teacher = rng.normal(0, 2, size=(N, V)).astype(np.float32)
    return {
        "cross_entropy": ((z, y), {}),
        "topk_kd": ((z, ids, logp, mask, y), {}),
        "topk_kl_gathered": ((z[:, :K].copy(), logp, mask), {}),
        "distill": ((z, teacher, y), {}),
        "entropy": ((z,), {}),
        "selective_log_softmax": ((z, ids), {}),
        "fused_linear_cross_entropy": ((h, w, y), {"bias": bias}),
        "fused_linear_topk_kd": ((h, w, ids, logp, mask, y), {"bias": bias}),
        "fused_linear_distill": ((h, w, th, tw, y), {"bias": bias, "teacher_bias": bias * 2}),
        "fused_linear_entropy": ((h, w), {"bias": bias}),
        "fused_linear_selective_log_softmax": ((h, w, ids), {"bias": bias}),
    }


LOSSES = list(inputs(np.random.default_rng(0)))

# A value away from the default for every option of every loss.
CE = {"ignore_index": 3, "label_smoothing": 0.1, "z_loss": 1e-3, "softcap": 5.0, "reduction": "sum",
      "return_per_row": True, "return_lse": True}
DIV = {"beta": 0.5, "divergence": "skew_kl", "skew_alpha": 0.3, "temperature": 1.7, "w_hard": 0.3,
       "w_soft": 0.5, "ignore_index": 3, "reduction": "sum", "return_per_row": True, "return_lse": True,
       "return_parts": True}
ENT = {"temperature": 1.7, "reduction": "mean"}
FUSED = {"logits_budget": 4096, "chunk_rows": 4, "logits_dtype": "f32", "grad_hidden": False,
         "grad_weight": False, "grad_bias": False}
CASES = {
    "cross_entropy": CE,
    "topk_kd": {**DIV, "normalize_topk": True},
    "topk_kl_gathered": {"temperature": 1.7, "reduction": "sum", "return_per_row": True, "return_lse": True},
    "distill": DIV,
    "entropy": ENT,
    "selective_log_softmax": {},
    "fused_linear_cross_entropy": {**CE, **FUSED},
    "fused_linear_topk_kd": {**DIV, "normalize_topk": True, **FUSED},
    "fused_linear_distill": {**DIV, **FUSED},
    "fused_linear_entropy": {**ENT, **FUSED},
    "fused_linear_selective_log_softmax": FUSED,
}
# Options that change no value, only which gradients flow (checked by test_fused_gradient_switches).
GRAD_ONLY = {"grad_hidden", "grad_weight", "grad_bias"}
# Options that change how the loss is computed or returned, not its value (on the CPU: f32 chunk logits).
SAME_VALUE = {"logits_budget", "chunk_rows", "logits_dtype", "return_per_row", "return_lse", "return_parts"}
# Options that act only beside another: set together, and compared against that other alone.
WITH = {"skew_alpha": {"divergence": "skew_kl"}}


def call_keywords(name):
    if name.endswith("selective_log_softmax"):
        return VALUES_CALL
    return FUSED_CALL if name.startswith("fused_linear_") else ROW_CALL


def params(fn):
    return list(inspect.signature(fn).parameters.values())


@pytest.mark.parametrize("name", LOSSES)
def test_plain_and_node_take_the_same_inputs_options_and_defaults(name):
    plain, node = params(getattr(retort.losses, name)), params(getattr(retort.ops, name))
    extra = call_keywords(name)
    assert [p.name for p in plain[-len(extra):]] == extra
    assert [(p.name, p.default, p.kind) for p in plain[:-len(extra)]] == \
        [(p.name, p.default, p.kind) for p in node]


@pytest.mark.parametrize("name", LOSSES)
def test_every_option_has_a_case(name):
    plain = params(getattr(retort.losses, name))
    options = {p.name for p in plain if p.kind == p.KEYWORD_ONLY and p.default is not None} - set(
        call_keywords(name))
    options |= {p.name for p in plain if p.name == "logits_dtype"}
    assert options == set(CASES[name]), f"{name}: options without a non-default case here"


def fields(result):
    """The named values of a plain result or an evaluated node result, as NumPy arrays (None left out)."""
    if isinstance(result, tuple):
        items = result._asdict().items()
    else:
        items = [("loss", result)]
    out = {}
    for k, v in items:
        if v is None or k.startswith("grad"):
            continue
        out[k] = np.asarray(v.numpy() if isinstance(v, retort.Tensor) else v, dtype=np.float64)
    return out


def relabel(args, opt):
    """With ignore_index 3, the label -100 would be out of range: it becomes 3."""
    if opt.get("ignore_index") != 3:
        return args
    return tuple(np.where(a == -100, 3, a) if a.ndim == 1 and a.dtype == np.int64 else a for a in args)


def run_node(name, args, kw):
    r = getattr(retort.ops, name)(*args, **kw)
    tensors = [v for v in (r if isinstance(r, tuple) else (r,)) if v is not None]
    g = retort.Graph()
    g.forward(*tensors)
    g.compute()
    return fields(r)


@pytest.mark.parametrize("name", LOSSES)
def test_plain_and_node_agree_with_each_option_off_its_default(name):
    rng = np.random.default_rng(26)
    args, kw = inputs(rng)[name]
    options = [(None, None)] + [(k, v) for k, v in CASES[name].items() if k not in GRAD_ONLY]
    if name in ("topk_kd", "distill", "fused_linear_topk_kd", "fused_linear_distill"):
        options += [("divergence", d) for d in ("tvd", "skew_reverse_kl")]
    default = None
    for key, value in options:
        opt = dict(kw, **WITH.get(key, {}), **({key: value} if key else {}))
        a = relabel(args, opt)
        with np.errstate(all="ignore"):
            plain = fields(getattr(retort.losses, name)(*a, **opt))
            node = run_node(name, a, opt)
        assert plain.keys() == node.keys(), (key, plain.keys(), node.keys())
        for k in plain:
            np.testing.assert_allclose(node[k], plain[k], rtol=1e-6, atol=1e-6, err_msg=f"{name} {key} {k}")
        if key and key.startswith("return_"):
            assert key[len("return_"):] in plain or key == "return_parts" and "hard" in plain, key
        if key is None:
            default = plain["loss"]
        elif key not in SAME_VALUE:  # the option reached the loss
            base = default
            if key in WITH:
                base = fields(getattr(retort.losses, name)(*a, **kw, **WITH[key]))["loss"]
            assert np.shape(plain["loss"]) != np.shape(base) or not np.allclose(plain["loss"], base), key
        else:
            np.testing.assert_allclose(plain["loss"], default, rtol=1e-5, err_msg=f"{name} {key}")
    # All the options at once, where they combine.
    opt = dict(kw, **{k: v for k, v in CASES[name].items() if k not in GRAD_ONLY})
    with np.errstate(all="ignore"):
        a = relabel(args, opt)
        plain, node = fields(getattr(retort.losses, name)(*a, **opt)), run_node(name, a, opt)
    for k in plain:
        np.testing.assert_allclose(node[k], plain[k], rtol=1e-6, atol=1e-6, err_msg=f"{name} all {k}")


@pytest.mark.parametrize("name", [n for n in LOSSES if n.startswith("fused_linear_")])
def test_fused_gradient_switches(name):
    rng = np.random.default_rng(5)
    args, kw = inputs(rng)[name]
    grad_kw = {"grad_output": np.ones((N, K), np.float32)} if name.endswith("selective_log_softmax") else {
        "return_grad": True}
    if name == "fused_linear_entropy":
        kw = dict(kw, reduction="mean")
    fn = getattr(retort.losses, name)
    full = fn(*args, **kw, **grad_kw)
    assert all(getattr(full, g) is not None for g in GRAD_ONLY)
    for off in sorted(GRAD_ONLY):
        r = fn(*args, **kw, **grad_kw, **{off: False})
        for g in GRAD_ONLY:
            assert (getattr(r, g) is None) == (g == off), (off, g)


@pytest.mark.parametrize("module", ["losses", "ops"])
def test_bad_calls_raise_type_error_naming_the_function(module):
    fn = getattr(retort, module).cross_entropy
    z = np.zeros((2, 3), np.float32)
    y = np.zeros(2, np.int64)
    with pytest.raises(TypeError, match=r"^cross_entropy\(\) got an unexpected keyword argument 'beta'"):
        fn(z, y, beta=0.5)
    with pytest.raises(TypeError, match=r"^cross_entropy\(\) missing required argument 'labels'"):
        fn(z)
    with pytest.raises(TypeError, match=r"^cross_entropy\(\) got multiple values for argument 'labels'"):
        fn(z, y, labels=y)
    with pytest.raises(TypeError, match=r"^cross_entropy\(\) takes at most 2 positional arguments"):
        fn(z, y, -100)
    with pytest.raises(TypeError, match=r"^cross_entropy\(\): z_loss must be a number, got str"):
        fn(z, y, z_loss="x")
