"""Bad arguments raise retort.Error, a ValueError carrying retort's message, which names the op and the
shapes."""

import numpy as np
import pytest

import retort

Z = np.zeros((4, 6), np.float32)
Y = np.array([0, 1, 2, 3])


def raises(match, fn, *args, **kwargs):
    with pytest.raises(ValueError, match=match) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, retort.Error)
    return str(info.value)


def test_error_type():
    assert issubclass(retort.Error, ValueError)


def test_op_shape_errors_name_the_op_and_shapes():
    a = retort.tensor(np.zeros((2, 3), np.float32))
    b = retort.tensor(np.zeros((4, 5), np.float32))
    msg = raises(r"^add: cannot broadcast", lambda: a + b)
    assert "[2, 3]" in msg and "[4, 5]" in msg
    raises(r"^matmul: inner dimensions differ", lambda: a @ b)
    raises(r"^reshape", lambda: a.reshape(4, 4))
    raises(r"^permute: axis 5 is out of range", retort.ops.permute, a, [5, 0])
    raises(r"^slice", retort.ops.slice, a, 1, 2, 5)
    raises(r"^exp: operand must be a float tensor", retort.ops.exp, retort.tensor(np.arange(3)))


def test_loss_errors_name_the_loss():
    raises(r"^cross_entropy_loss: labels .* must be \[N\] with N = 4", retort.losses.cross_entropy, Z, Y[:3])
    raises(r"^cross_entropy_loss: label_smoothing must be in \[0, 1\]", retort.losses.cross_entropy, Z, Y,
           label_smoothing=1.5)
    raises(r"^cross_entropy_loss: .*logits.* must be f32, bf16 or f16", retort.losses.cross_entropy,
           np.zeros((4, 6), np.int32), Y)
    raises(r"cross_entropy_loss .*label 9 at row 1 is outside \[0, 6\)", retort.losses.cross_entropy, Z,
           np.array([0, 9, 1, 2]))
    ids = np.zeros((4, 8), np.int64)
    raises(r"^topk_kd: teacher_ids .* has K = 8 slots but logits .* has only V = 6", retort.losses.topk_kd, Z,
           ids, np.zeros((4, 8), np.float32))
    raises(r"^topk_kd: beta must be in \[0, 1\]", retort.losses.topk_kd, Z, ids[:, :2],
           np.zeros((4, 2), np.float32), beta=2.0)
    raises(r"^distill: temperature must be a finite number > 0", retort.losses.distill, Z, Z, temperature=0.0)
    raises(r"^distill: w_hard = 1 needs labels", retort.losses.distill, Z, Z, w_hard=1.0)
    raises(r"^topk_kl_gathered: teacher_logprobs", retort.losses.topk_kl_gathered, Z, Z[:, :3])
    raises(r"^entropy: return_grad needs reduction", retort.losses.entropy, Z, return_grad=True)
    raises(r"selective_log_softmax.*id 7 at row 0", retort.losses.selective_log_softmax, Z,
           np.full((4, 1), 7))
    raises(r"^reduction: expected 'mean', 'sum' or 'none', got 'avg'", retort.losses.cross_entropy, Z, Y,
           reduction="avg")


def test_shape_arguments_that_do_not_fit_int64():
    # Found by tests/fuzz/fuzz_python.py: pybind11's RuntimeError "Unable to cast" that named no op.
    x = retort.tensor(np.zeros((2, 3), np.float32))
    raises(r"^repeat: a shape must be an int or a sequence of ints that fit in int64", retort.ops.repeat, x,
           [2**64, 3])
    raises(r"^zeros: a shape must be", retort.zeros, (2**63, 1))
    raises(r"^fill: a shape must be", retort.ops.fill, "ab", 1.0)
    raises(r"^reshape: a shape must be", x.reshape, 2**70, 3)
    raises(r"^permute: axis 4294967296 is out of range", x.permute, 2**32, 0)
    assert x.reshape(np.int64(3), 2).shape == (3, 2)


def test_fill_of_an_integer_tensor_needs_a_value_that_fits():
    raises(r"^fill: value .* does not fit i32", retort.ops.fill, (2,), 1e30, dtype="i32")


def test_conversion_errors():
    raises(r"at most 4 dims", retort.tensor, np.zeros((1, 2, 1, 2, 1), np.float32))
    raises(r"no empty dims", retort.tensor, np.zeros((0, 3), np.float32))
    raises(r"^dtype: unknown dtype 'f8'", retort.tensor, Z, dtype="f8")
    raises(r"cannot store NumPy float32 values in an integer tensor", retort.tensor, Z, dtype="i64")
    raises(r"do not fit in i32", retort.tensor, np.array([2**40]), dtype="i32")
    raises(r"do not fit in i32", retort.tensor, np.array(2**63 + 5, dtype=np.uint64), dtype="i32")
    raises(r"^param .*parameters must be f32, bf16 or f16", retort.param, np.arange(3))
    raises(r"^backend: expected 'cpu'", retort.tensor, Z, backend="tpu")


def test_graph_and_optimizer_errors():
    g = retort.Graph()
    raises(r"^graph: it has no tensors yet", g.compute)
    x = retort.tensor(Z)
    raises(r"^graph.backward: no parameter reaches the loss", g.backward, x.sum())
    w = retort.param(np.ones(3, np.float32))
    raises(r"^graph.backward: the loss must be a single float element", retort.Graph().backward, w * 2.0)
    raises(r"AdamW: .*lr", retort.AdamW, [w], lr=-1.0)
    raises(r"^optimizer: params must be retort Tensors", retort.AdamW, [np.ones(3)])
    raises(r"SGD|Sgd|sgd", retort.SGD, [w], momentum=1.5)
    raises(r"cosine_lr", retort.cosine_lr, -1, 0, 10, 1.0)


def test_cuda_unavailable_says_why():
    ok, reason = retort.cuda_available(with_reason=True)
    if ok:
        pytest.skip("a CUDA device is present")
    assert reason
    msg = raises(r"cuda", retort.cuda)
    assert reason in msg
