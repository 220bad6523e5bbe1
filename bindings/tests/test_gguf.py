"""retort.GgufFile against the `gguf` package, llama.cpp's own Python writer and reference dequantizer: files
written with gguf.GGUFWriter read back with the same metadata, shapes and bytes, and every type retort decodes
equals gguf.quants.dequantize on the same bytes (bit for bit in retort's builds; the check allows 1 ulp, the
most an FMA-contracting compiler could change)."""

import numpy as np
import pytest

import retort

gguf = pytest.importorskip("gguf", reason="the gguf package (pip install gguf) writes the fixtures and is the reference")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFValueType as V  # noqa: E402
from gguf import quants  # noqa: E402

# Where each block keeps its f16 scales: random bytes there could be inf or NaN, which no quantizer writes.
SCALE_OFFSETS = {
    Q.Q8_0: [0], Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2],
    Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
}
QUANTIZABLE = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1]  # gguf.quants.quantize supports these
SUPPORTED = [Q.F32, Q.F16, Q.BF16] + list(SCALE_OFFSETS)


def write_gguf(path, tensors=(), kv=(), alignment=None):
    """tensors: (name, array, raw_dtype or None); kv: (key, value, GGUFValueType, sub_type or None)."""
    w = gguf.GGUFWriter(str(path), arch="test")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, value, vtype, sub in kv:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, arr, raw_dtype in tensors:
        w.add_tensor(name, arr, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def random_blocks(rng, qtype, shape):
    """Random bytes for a tensor of `shape` elements, its f16 scales finite and of a sane size."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rows = int(np.prod(shape[:-1]))
    nblocks = rows * shape[-1] // block
    raw = rng.integers(0, 256, size=(nblocks, size), dtype=np.uint8)
    for off in SCALE_OFFSETS[qtype]:
        scale = (rng.uniform(1e-3, 1e-1, nblocks) * rng.choice([-1, 1], nblocks)).astype(np.float16)
        raw[:, off:off + 2] = scale.view(np.uint8).reshape(nblocks, 2)
    return raw.reshape(*shape[:-1], shape[-1] // block * size)


def fixtures(rng):
    """(name, raw uint8 bytes or typed array, raw_dtype, qtype) for every supported type."""
    out = []
    f32 = rng.standard_normal((3, 64)).astype(np.float32)
    f32[0, :4] = [np.inf, -0.0, 1e-42, -np.inf]  # an infinity, a negative zero, a subnormal
    out.append(("f32", f32, None, Q.F32))
    bits = rng.integers(0, 1 << 16, size=(2, 3, 40), dtype=np.uint16)  # every f16: NaN, inf, subnormals
    out.append(("f16", bits.view(np.float16), None, Q.F16))
    data = (rng.standard_normal((4, 96)) * 10).astype(np.float32)
    out.append(("bf16", quants.quantize(data, Q.BF16), Q.BF16, Q.BF16))
    for qt in QUANTIZABLE:
        data = rng.standard_normal((2, 3, 128)).astype(np.float32)
        out.append((f"{qt.name}.quantized", quants.quantize(data, qt), qt, qt))
    for qt in SCALE_OFFSETS:
        block = gguf.GGML_QUANT_SIZES[qt][0]
        shape = (2, 1, 3, 2 * block) if block == 256 else (5, 4 * block)
        out.append((f"{qt.name}.random", random_blocks(rng, qt, shape), qt, qt))
    return out


def raw_bytes(arr):
    return np.ascontiguousarray(arr).view(np.uint8)


def ulp_distance(a, b):
    """Distance in units in the last place of f32 (NaN against NaN counts as 0)."""
    def ordered(x):
        i = x.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    d = np.abs(ordered(a) - ordered(b))
    both_nan = np.isnan(a) & np.isnan(b)
    return np.where(both_nan, 0, d)


@pytest.fixture(scope="module")
def quant_file(tmp_path_factory):
    rng = np.random.default_rng(1234)
    fx = fixtures(rng)
    path = write_gguf(tmp_path_factory.mktemp("gguf") / "types.gguf", [(n, a, r) for n, a, r, _ in fx])
    return path, fx


def test_every_supported_type_dequantizes_like_gguf_quants(quant_file):
    path, fx = quant_file
    f = retort.GgufFile(path)
    assert sorted(f.tensor_names) == sorted(n for n, *_ in fx)
    assert {f.tensor_type(n) for n, *_ in fx} == {qt.name for qt in SUPPORTED}
    for name, arr, _, qt in fx:
        raw = raw_bytes(arr)
        ref = quants.dequantize(raw, qt)
        got = f.tensor(name)
        assert got.dtype == np.float32
        assert got.shape == ref.shape == f.tensor_shape(name), name
        assert np.array_equal(f.tensor_bytes(name), raw.ravel()), name
        assert np.array_equal(np.isnan(got), np.isnan(ref)), name
        assert ulp_distance(got, ref).max() <= 1, (name, int(ulp_distance(got, ref).max()))


def test_bit_exact_in_this_build(quant_file):
    # retort's decoders round each product and sum once, as NumPy does; nothing here contracts to FMAs.
    path, fx = quant_file
    f = retort.GgufFile(path)
    for name, arr, _, qt in fx:
        ref = quants.dequantize(raw_bytes(arr), qt)
        got = f.tensor(name)
        ok = np.isnan(ref) | (got.view(np.uint32) == ref.view(np.uint32))
        assert ok.all(), (name, int((~ok).sum()))


def test_tensor_bytes_is_a_read_only_view(quant_file):
    f = retort.GgufFile(quant_file[0])
    b = f.tensor_bytes("f32")
    del f  # the view keeps the file mapped
    assert b.dtype == np.uint8 and not b.flags.writeable and b.size == 3 * 64 * 4
    assert b.view(np.float32)[4] == np.float32(b.view(np.float32)[4])


METADATA = [
    ("u8", 255, V.UINT8, None),
    ("i8", -128, V.INT8, None),
    ("u16", 65535, V.UINT16, None),
    ("i16", -32768, V.INT16, None),
    ("u32", 4294967295, V.UINT32, None),
    ("i32", -2147483648, V.INT32, None),
    ("f32", 0.1, V.FLOAT32, None),
    ("bool.t", True, V.BOOL, None),
    ("bool.f", False, V.BOOL, None),
    ("str", "h\u00e9llo \u4e16\u754c", V.STRING, None),
    ("str.empty", "", V.STRING, None),
    ("u64", 2**64 - 1, V.UINT64, None),
    ("i64", -(2**63), V.INT64, None),
    ("f64", -1e300, V.FLOAT64, None),
    ("a.i32", [1, -2, 3], V.ARRAY, None),
    ("a.u8", [0, 255], V.ARRAY, V.UINT8),
    ("a.u64", [2**63, 1], V.ARRAY, V.UINT64),
    ("a.i64", [-(2**40)], V.ARRAY, V.INT64),
    ("a.f32", [1.5, -0.1], V.ARRAY, None),
    ("a.f64", [1e-300], V.ARRAY, V.FLOAT64),
    ("a.bool", [True, False, True], V.ARRAY, None),
    ("a.str", ["a", "", "\u00fc"], V.ARRAY, None),
    ("a.nested", [[1, 2], [3]], V.ARRAY, None),
    ("a.deep", [[["x", "y"]], [["z"]]], V.ARRAY, None),
]


def same(a, b, vtype):
    if vtype == V.FLOAT32:
        return np.float32(a) == np.float32(b)
    if isinstance(b, list):
        return len(a) == len(b) and all(same(x, y, V.FLOAT32 if isinstance(y, float) else None)
                                        for x, y in zip(a, b))
    return a == b and type(a) is type(b)


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("alignment", [None, 64, 8])
def test_metadata_round_trips(tmp_path, version, alignment):
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    path = write_gguf(tmp_path / "meta.gguf", [("w", w, None), ("v", np.ones(5, np.float32), None)],
                      METADATA, alignment)
    if version == 2:  # v2 and v3 differ only in the number (v3 allows big-endian files)
        with open(path, "r+b") as fh:
            fh.seek(4)
            fh.write((2).to_bytes(4, "little"))
    f = retort.GgufFile(path)
    assert f.version == version
    assert f.alignment == (alignment or 32)
    md = f.metadata
    assert md["general.architecture"] == "test"
    for key, value, vtype, _ in METADATA:
        assert same(md[key], value, vtype), (key, md[key], value)
    assert list(md)[-len(METADATA):] == [k for k, *_ in METADATA]  # file order
    assert f.tensor_names == ["w", "v"]
    assert f.tensor_shape("w") == (3, 4)
    np.testing.assert_array_equal(f.tensor("w"), w)
    assert "version=%d" % version in repr(f)


def test_reads_what_gguf_reader_reads(quant_file):
    path, _ = quant_file
    r = gguf.GGUFReader(path)
    f = retort.GgufFile(path)
    for t in r.tensors:
        assert f.tensor_type(t.name) == t.tensor_type.name
        assert f.tensor_shape(t.name) == tuple(int(d) for d in reversed(t.shape.tolist()))
        assert np.array_equal(f.tensor_bytes(t.name), np.asarray(t.data).view(np.uint8).ravel())


def test_bad_files_raise_retort_error_naming_the_file(tmp_path, quant_file):
    good = open(quant_file[0], "rb").read()
    bad = tmp_path / "cut.gguf"
    for n in [0, 3, 20, 100, len(good) // 2]:
        bad.write_bytes(good[:n])
        with pytest.raises(retort.Error, match=str(bad)):
            retort.GgufFile(str(bad))
    bad.write_bytes(b"GGUF" + (1).to_bytes(4, "little") + good[8:])
    with pytest.raises(ValueError, match="GGUF version 1 is not supported"):
        retort.GgufFile(str(bad))
    f = retort.GgufFile(quant_file[0])
    with pytest.raises(retort.Error, match="no tensor named 'nope'"):
        f.tensor("nope")


def test_unsupported_type_names_tensor_and_type(tmp_path):
    raw = np.zeros((1, gguf.GGML_QUANT_SIZES[Q.Q2_K][1]), np.uint8)
    path = write_gguf(tmp_path / "q2k.gguf", [("q", raw, Q.Q2_K)])
    f = retort.GgufFile(path)
    assert f.tensor_type("q") == "Q2_K" and f.tensor_shape("q") == (1, 256)
    with pytest.raises(retort.Error, match="tensor 'q' is Q2_K, which retort cannot dequantize"):
        f.tensor("q")
