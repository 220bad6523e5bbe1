"""Tensors from and to NumPy: zero-copy aliasing both ways, what is copied and when, dtypes and shapes."""

import gc

import numpy as np
import pytest

import retort


def run(*tensors):
    g = retort.Graph()
    g.forward(*tensors)
    g.compute()
    return g


def test_zero_copy_numpy_to_retort():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = retort.tensor(a)
    a[1, 2] = 100.0  # a change to the array shows up in retort: same memory
    assert t.numpy()[1, 2] == 100.0
    doubled = t * 2.0
    g = run(doubled)
    a[0, 0] = -7.0  # and in the next run of a graph that reads it
    g.compute()
    assert doubled.numpy()[0, 0] == -14.0 and doubled.numpy()[1, 2] == 200.0


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.float16])
def test_zero_copy_view_back_to_numpy(dtype):
    a = np.arange(6).astype(dtype).reshape(2, 3)
    t = retort.tensor(a)
    v = t.numpy()
    assert v.dtype == dtype and np.shares_memory(v, a)
    v[0, 1] = 9  # writes go through
    assert a[0, 1] == 9


def test_view_keeps_its_owner_alive():
    t = retort.tensor(np.full((1000,), 3.0, np.float32))
    v = t.numpy()
    del t
    gc.collect()
    junk = [np.ones(1000, np.float32) * i for i in range(50)]  # reuse freed memory if it were freed
    assert np.all(v == 3.0), junk[0][:1]
    p = retort.zeros((4, 5))
    pv = p.numpy()
    del p
    gc.collect()
    assert pv.shape == (4, 5) and np.all(pv == 0)


def test_array_stays_alive_with_the_tensor():
    t = retort.tensor(np.arange(1000, dtype=np.float32))  # no other reference to the array
    gc.collect()
    _ = [np.zeros(1000, np.float32) for _ in range(50)]
    assert np.array_equal(t.numpy(), np.arange(1000, dtype=np.float32))


def test_strided_arrays_alias_and_reversed_ones_copy():
    base = np.arange(40, dtype=np.float32).reshape(5, 8)
    view = base[::2, 1::3]  # positive strides: wrapped in place
    t = retort.tensor(view)
    assert not t.is_contiguous and t.shape == (3, 3)
    base[2, 4] = -1.0
    assert np.array_equal(t.numpy(), view)
    rev = base[::-1]  # negative strides: copied
    r = retort.tensor(rev)
    base[0, 0] = 1234.0
    assert r.numpy()[-1, 0] != 1234.0 and r.is_contiguous


def test_copies_when_dtype_differs_or_array_is_read_only():
    a = np.arange(6, dtype=np.float64)
    t = retort.tensor(a)  # float64 becomes f32: a copy
    assert t.dtype == retort.float32
    a[0] = 50
    assert t.numpy()[0] == 0
    ro = np.arange(4, dtype=np.float32)
    ro.setflags(write=False)
    r = retort.tensor(ro)
    assert np.array_equal(r.numpy(), ro) and not np.shares_memory(r.numpy(), ro)
    i = retort.tensor(np.arange(3, dtype=np.int64), dtype="i32")
    assert i.dtype == retort.int32 and i.numpy().dtype == np.int32
    assert retort.tensor([True, False]).dtype == retort.int32
    assert retort.tensor(np.arange(3, dtype=np.uint32)).dtype == retort.int64


def test_bf16_is_rounded_and_reads_back_as_float32():
    x = np.array([1.0, 1.00390625, 3.14159265, -2.5e-3], np.float32)
    t = retort.tensor(x, dtype=retort.bfloat16)
    back = t.numpy()
    assert back.dtype == np.float32
    assert np.array_equal(back[[0, 3]], np.array([1.0, -0.0025024414], np.float32))
    assert abs(back[2] - 3.140625) < 1e-7  # nearest bf16
    with pytest.raises(ValueError, match="bfloat16"):
        t.numpy(copy=False)


def test_shapes_keep_leading_ones_and_zero_dims():
    assert retort.tensor(np.zeros((1, 5), np.float32)).shape == (1, 5)
    assert retort.tensor(np.zeros((1, 1, 3), np.float32)).shape == (1, 1, 3)
    s = retort.tensor(np.float32(2.5))
    assert s.shape == () and s.ndim == 0 and s.item() == 2.5
    assert retort.zeros(()).shape == ()
    m = retort.ops.mean(retort.tensor(np.ones((2, 3), np.float32)))
    run(m)
    assert m.shape == () and m.item() == 1.0
    assert retort.ops.sum_rows(retort.tensor(np.ones((2, 3), np.float32))).shape == (2, 1)


def test_assign_writes_values_into_a_leaf_and_through_to_the_array():
    a = np.zeros((2, 2), np.float32)
    t = retort.tensor(a)
    t.assign([[1, 2], [3, 4]])
    assert np.array_equal(a, [[1, 2], [3, 4]])
    p = retort.param(np.zeros((3,), np.float32))
    p.assign(np.array([1.5, 2.5, 3.5]))
    assert np.array_equal(p.numpy(), [1.5, 2.5, 3.5])
    with pytest.raises(ValueError, match="assign"):
        p.assign(np.zeros(4))


def test_param_is_a_copy_and_trainable():
    a = np.ones((2, 3), np.float32)
    p = retort.param(a, name="w")
    a[0, 0] = 5
    assert p.numpy()[0, 0] == 1 and p.is_param and p.name == "w"
    assert "param" in repr(p) and "f32[2, 3]" in repr(p)


def test_context_groups_leaves_on_a_backend():
    ctx = retort.Context(retort.cpu())
    x = ctx.tensor(np.ones(3, np.float32), name="x")
    w = ctx.param(np.ones(3, np.float32), name="w")
    z = ctx.zeros((2, 2), dtype="i64")
    assert len(ctx) == 3 and x.backend == retort.cpu() and z.dtype == retort.int64 and w.is_param


def test_computed_values_are_copies_and_need_their_graph():
    x = retort.tensor(np.arange(4, dtype=np.float32))
    y = x + 1.0
    with pytest.raises(ValueError, match="no value yet"):
        y.numpy()
    g = run(y)
    first = y.numpy()
    assert not np.shares_memory(first, x.numpy())
    x.assign([10, 10, 10, 10])
    g.compute()
    assert np.array_equal(first, [1, 2, 3, 4]) and np.array_equal(y.numpy(), [11] * 4)
    with pytest.raises(ValueError, match="copy=False"):
        y.numpy(copy=False)
    del g
    gc.collect()
    assert np.array_equal(y.numpy(), [11] * 4)  # a root keeps the graph holding its value


def test_intermediates_are_not_kept_unless_asked():
    x = retort.tensor(np.ones((8, 8), np.float32))
    mid = x.exp()
    out = (mid * 2.0).sum()
    g = retort.Graph()
    g.forward(out)
    g.compute()
    with pytest.raises(ValueError, match="intermediate"):
        mid.numpy()
    g.forward(mid)
    g.compute()
    assert np.allclose(mid.numpy(), np.e)


def test_array_protocol_and_helpers():
    t = retort.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert np.array_equal(np.asarray(t), t.numpy())
    assert t.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert len(t) == 2 and t.size == 6 and t.ndim == 2 and t.device == "cpu"
    c = t.copy()
    t.assign(np.zeros((2, 3)))
    assert c.numpy()[1, 2] == 5
    assert t.to(retort.cpu(1)).backend.name == "cpu"
