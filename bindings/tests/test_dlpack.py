"""DLPack both ways: NumPy <-> retort without copies, legacy and versioned capsules, bf16, computed values,
lifetimes; PyTorch (CPU) round trips when torch is importable."""

import gc

import numpy as np
import pytest

import retort

kDLCPU, kDLBfloat = 1, 4


def run(*tensors):
    g = retort.Graph()
    g.forward(*tensors)
    g.compute()
    return g


def test_numpy_to_retort_without_copy():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = retort.from_dlpack(a)
    assert t.shape == (3, 4) and t.dtype == retort.float32 and t.device == "cpu"
    a[2, 3] = -5
    assert t.numpy()[2, 3] == -5  # the producer's memory, in place


def test_retort_to_numpy_without_copy():
    t = retort.tensor(np.arange(6, dtype=np.int64).reshape(2, 3))
    assert t.__dlpack_device__() == (kDLCPU, 0)
    a = np.from_dlpack(t)
    assert a.dtype == np.int64 and a.shape == (2, 3)
    t.assign(np.full((2, 3), 7))
    assert np.all(a == 7)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64])
def test_round_trip_dtypes(dtype):
    a = (np.arange(24).reshape(2, 3, 4) - 5).astype(dtype)
    back = np.from_dlpack(retort.from_dlpack(a))
    assert back.dtype == dtype and np.array_equal(back, a) and np.shares_memory(back, a)


def test_strided_and_zero_dim_arrays():
    base = np.arange(30, dtype=np.float32).reshape(5, 6)
    t = retort.from_dlpack(base[1:, ::2])
    assert t.shape == (4, 3) and not t.is_contiguous
    assert np.array_equal(t.numpy(), base[1:, ::2])
    assert np.array_equal(np.from_dlpack(t), base[1:, ::2])  # strides go back out as they came in
    s = retort.from_dlpack(np.array(3.5, np.float32))
    assert s.shape == () and s.item() == 3.5
    assert np.from_dlpack(s).shape == ()


def test_legacy_and_versioned_capsules():
    t = retort.tensor(np.arange(4, dtype=np.float32))
    legacy = t.__dlpack__()
    assert "dltensor" in repr(legacy) and "versioned" not in repr(legacy)
    versioned = t.__dlpack__(max_version=(1, 0))
    assert "dltensor_versioned" in repr(versioned)
    # A bare capsule is a producer too (host memory only); consuming one twice is an error.
    a = retort.from_dlpack(legacy)
    assert np.array_equal(a.numpy(), [0, 1, 2, 3])
    with pytest.raises(ValueError, match="consumed"):
        retort.from_dlpack(legacy)
    b = retort.from_dlpack(versioned)
    assert np.array_equal(b.numpy(), [0, 1, 2, 3])
    del t
    gc.collect()
    assert np.array_equal(b.numpy(), [0, 1, 2, 3])  # the capsule kept the storage alive


def test_unconsumed_capsules_are_freed():
    t = retort.tensor(np.arange(4, dtype=np.float32))
    for _ in range(100):
        t.__dlpack__()
        t.__dlpack__(max_version=(1, 0))
    gc.collect()  # nothing to see: the test fails under ASan or crashes if a destructor double-frees


def test_bf16_through_dlpack():
    t = retort.tensor(np.array([[1.5, -2.0], [0.25, 3.0]], np.float32), dtype="bf16")
    cap_owner = t
    u = retort.from_dlpack(cap_owner)  # retort -> DLPack (kDLBfloat) -> retort
    assert u.dtype == retort.bfloat16 and np.array_equal(u.numpy(), t.numpy())
    with pytest.raises(BufferError, match="device"):
        t.__dlpack__(dl_device=(2, 0))


def test_copy_request_and_device_tuple():
    t = retort.tensor(np.ones(3, np.float32))
    a = np.from_dlpack(t, copy=True)
    t.assign([2, 2, 2])
    assert np.all(a == 1)


def test_computed_values_export_and_keep_their_graph():
    x = retort.tensor(np.arange(5, dtype=np.float32))
    y = x * 3.0
    g = run(y)
    a = np.from_dlpack(y)
    del g, y
    gc.collect()
    assert np.array_equal(a, np.arange(5) * 3.0)
    z = x + 1.0
    with pytest.raises(ValueError, match="no value yet"):
        z.__dlpack__()


def test_unsupported_inputs_raise():
    with pytest.raises(ValueError, match="float64"):
        retort.from_dlpack(np.zeros(3))
    with pytest.raises(ValueError, match="__dlpack__"):
        retort.from_dlpack([1, 2, 3])
    with pytest.raises(ValueError, match="at most 4 dims"):
        retort.from_dlpack(np.zeros((1, 1, 1, 1, 2), np.float32))


# ---- PyTorch, when available ------------------------------------------------------------------------------

try:
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")


@needs_torch
def test_torch_round_trip_without_copy():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    t = retort.from_dlpack(x)
    x[0, 0] = 42
    assert t.numpy()[0, 0] == 42
    back = torch.from_dlpack(t)
    assert back.data_ptr() == x.data_ptr()
    y = torch.from_dlpack(retort.tensor(np.ones((2, 2), np.float32)))
    assert y.sum().item() == 4


@needs_torch
def test_torch_bf16_and_transposed():
    x = torch.randn(4, 6).to(torch.bfloat16)
    t = retort.from_dlpack(x)
    assert t.dtype == retort.bfloat16
    assert torch.equal(torch.from_dlpack(t), x)
    xt = torch.randn(5, 3).t()  # strided: wrapped as a view
    assert np.array_equal(retort.from_dlpack(xt).numpy(), xt.numpy())


@needs_torch
def test_torch_inputs_to_losses():
    z = torch.randn(6, 10)
    y = torch.randint(0, 10, (6,))
    got = retort.losses.cross_entropy(z, y)
    want = torch.nn.functional.cross_entropy(z.double(), y).item()
    assert abs(float(got) - want) < 1e-5


# ---- JAX and ml_dtypes, when available --------------------------------------------------------------------

try:
    import jax
    import jax.numpy as jnp
except ImportError:  # pragma: no cover - depends on the machine
    jax = None
try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None


@pytest.mark.skipif(jax is None, reason="JAX is not installed")
def test_jax_round_trip_with_bf16():
    x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    assert np.array_equal(retort.from_dlpack(x).numpy(), np.asarray(x))
    y = jnp.from_dlpack(retort.tensor(np.arange(6, dtype=np.float32).reshape(2, 3)))
    assert y.shape == (2, 3) and float(y[1, 2]) == 5.0
    xb = jnp.array([1.5, -3.0, 0.0078125], dtype=jnp.bfloat16)
    tb = retort.from_dlpack(xb)
    assert tb.dtype == retort.bfloat16 and np.array_equal(tb.numpy(), [1.5, -3.0, 0.0078125])
    back = jnp.from_dlpack(tb)
    assert back.dtype == jnp.bfloat16 and bool(jnp.all(back == xb))
    got = retort.losses.cross_entropy(jnp.zeros((2, 5)), jnp.array([0, 1]))
    assert abs(float(got) - np.log(5)) < 1e-6


@pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes is not installed")
def test_ml_dtypes_bfloat16_arrays_alias():
    a = np.array([1.5, 2.0, -0.5], dtype=ml_dtypes.bfloat16)
    t = retort.tensor(a)
    assert t.dtype == retort.bfloat16
    a[1] = 8.0
    assert np.array_equal(t.numpy(), [1.5, 8.0, -0.5])
