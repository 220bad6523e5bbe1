"""atheris harness for the Python module: the loss functions (retort.losses), the graph ops (retort.ops) and the
tensor constructors called with fuzzed arrays (every NumPy dtype the module meets, 0 to 5 dims, empty dims,
transposed, reversed, sliced and broadcast (zero-stride) layouts, values with NaN, inf and huge integers) and
fuzzed options (sizes, axes and indices at the overflow edges, NaN and infinite floats, unknown strings).

The expected answer to a bad call is retort.Error (or a TypeError from pybind11 for an argument of the wrong
kind); any other exception, a crash or a hang is a finding. Graphs run only when their planned memory is small.

    PYTHONPATH=build/bindings python3 tests/fuzz/fuzz_python.py [-max_total_time=60] [CORPUS_DIR]

tools/fuzz.sh runs it as the harness `python` (atheris: pip install atheris).
"""

import sys
import warnings

import atheris
import numpy as np

import retort  # a C++ extension: atheris sees the coverage of this script's own branches only

EDGES = [0, 1, 2, 3, -1, -2, -100, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**48, 2**62, 2**63 - 1, -(2**63), 2**64,
         2**63, 7, 4]
FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 1e-30, 1e30, 1e4, -1e4, float("nan"), float("inf"), float("-inf"), 3e38,
          1e-45, 0.25, 1.5, 1e300]
DTYPES = [np.float32, np.float32, np.float64, np.float16, np.int32, np.int64, np.int8, np.uint8, np.uint64, np.bool_,
          np.complex64, ">f4", ">i8", np.uint32]
try:
    import ml_dtypes

    DTYPES.append(ml_dtypes.bfloat16)
except ImportError:
    pass
DTYPE_NAMES = ["f32", "bf16", "f16", "i32", "i64", "f64", "", "F32", None, "float32", "bfloat16", "x"]
REDUCTIONS = ["mean", "sum", "none", "avg", "", None, "MEAN"]
MAX_PLAN_BYTES = 4 << 20


class Gen:
    def __init__(self, data):
        self.fdp = atheris.FuzzedDataProvider(data)

    def byte(self):
        return self.fdp.ConsumeIntInRange(0, 255)

    def pick(self, seq):
        return seq[self.fdp.ConsumeIntInRange(0, len(seq) - 1)]

    def flag(self):
        return self.fdp.ConsumeBool()

    def size(self):
        b = self.byte()
        if b < 160:
            return b % 10
        if b < 240:
            return self.pick(EDGES)
        return self.fdp.ConsumeInt(8)

    def real(self):
        return self.pick(FLOATS) if self.byte() < 200 else self.fdp.ConsumeFloat()

    def shape(self, hi=7):
        return tuple(self.fdp.ConsumeIntInRange(0 if self.byte() > 240 else 1, hi)
                     for _ in range(self.fdp.ConsumeIntInRange(0, 5 if self.byte() > 230 else 3)))

    def array(self, kind=None):
        dt = np.dtype(self.pick(DTYPES) if kind is None else kind)
        shape = self.shape()
        n = int(np.prod(shape)) if shape else 1
        mode = self.byte()
        if dt.kind == "f" or dt.name == "bfloat16":
            vals = np.array([self.real() if mode > 200 else (self.byte() - 128) / 32.0 for _ in range(n)])
        elif dt.kind == "c":
            vals = np.array([complex(self.real(), 0.0) for _ in range(n)])
        elif dt.kind == "b":
            vals = np.array([self.flag() for _ in range(n)])
        else:
            vals = np.array([self.size() if mode > 200 else self.byte() % 12 - 1 for _ in range(n)], dtype=object)
            info = np.iinfo(dt)
            vals = np.array([min(max(int(v), info.min), info.max) for v in vals.ravel()], dtype=object)
        with np.errstate(all="ignore"):
            a = vals.astype(dt).reshape(shape)
        layout = self.byte()
        if a.ndim >= 2 and layout < 40:
            a = a.T
        elif a.ndim >= 1 and layout < 70:
            a = a[::-1]
        elif a.ndim >= 1 and layout < 100:
            a = a[::2]
        elif a.ndim >= 1 and a.shape[0] > 0 and layout < 115:
            a = np.broadcast_to(a[:1], (self.fdp.ConsumeIntInRange(1, 6),) + a.shape[1:])  # zero stride
        elif layout < 125:
            a = np.asfortranarray(a)
        return a

    def floats(self, rows=None, cols=None):
        """A float array, mostly [rows, cols] when given, so calls get past the shape checks."""
        if rows is not None and self.byte() < 200:
            dt = self.pick([np.float32, np.float32, np.float16, np.float64] + DTYPES[-1:])
            with np.errstate(all="ignore"):
                a = np.array([(self.byte() - 128) / 16.0 if self.byte() < 230 else self.real()
                              for _ in range(rows * cols)]).astype(dt).reshape(rows, cols)
            return a.T.copy().T if self.byte() < 30 else a
        return self.array()

    def ints(self, shape, hi):
        if self.byte() < 200:
            return np.array([self.byte() % (hi + 2) - 1 if self.byte() < 240 else self.size() % 2**31
                             for _ in range(int(np.prod(shape)))], dtype=self.pick([np.int64, np.int32])
                            ).reshape(shape)
        return self.array()

    def maybe(self, make):
        return make() if self.flag() else None

    def reduction(self):
        return self.pick(REDUCTIONS)

    def dtype_name(self):
        return self.pick(DTYPE_NAMES)

    def sizes(self):
        return [self.size() for _ in range(self.fdp.ConsumeIntInRange(0, 5))]


@atheris.instrument_func
def loss_call(g):
    """One retort.losses call with arrays shaped mostly right and options drawn from the edges."""
    n, v, k, h = (g.fdp.ConsumeIntInRange(1, 6), g.fdp.ConsumeIntInRange(1, 12), g.fdp.ConsumeIntInRange(1, 5),
                  g.fdp.ConsumeIntInRange(1, 5))
    L = retort.losses
    common = {}
    if g.flag():
        common["return_grad"] = g.flag()
        common["grad_dtype"] = g.dtype_name()
    which = g.byte() % 11
    fused = {}
    if which >= 6:
        if g.flag():
            fused["logits_budget"] = g.size()
        if g.flag():
            fused["chunk_rows"] = g.size()
        if g.flag():
            fused["logits_dtype"] = g.dtype_name()
        for key in ("grad_hidden", "grad_weight", "grad_bias"):
            if g.flag():
                fused[key] = g.flag()
    elif g.flag():
        common["inplace_grad"] = g.flag()

    def kd_opts():
        o = {"beta": g.real() if g.flag() else 0.5, "temperature": g.real() if g.flag() else 2.0,
             "w_hard": g.real() if g.flag() else 0.0, "w_soft": g.real() if g.flag() else 1.0,
             "ignore_index": g.size() if g.flag() else -1, "reduction": g.reduction(),
             "return_per_row": g.flag(), "return_lse": g.flag(), "return_parts": g.flag()}
        return o

    x = g.floats(n, v)
    if which == 0:
        return L.cross_entropy(x, g.ints((n,), v), ignore_index=g.size() if g.flag() else -1,
                               label_smoothing=g.real() if g.flag() else 0.1, z_loss=g.real() if g.flag() else 0.0,
                               softcap=g.real() if g.flag() else 0.0, reduction=g.reduction(),
                               return_per_row=g.flag(), return_lse=g.flag(), **common)
    if which == 1:
        o = kd_opts()
        return L.topk_kd(x, g.ints((n, k), v), g.floats(n, k), g.maybe(lambda: g.ints((n, k), 1)),
                         g.maybe(lambda: g.ints((n,), v)), normalize_topk=g.flag(), **o, **common)
    if which == 2:
        return L.topk_kl_gathered(g.floats(n, k), g.floats(n, k), g.maybe(lambda: g.ints((n, k), 1)),
                                  temperature=g.real() if g.flag() else 1.0, reduction=g.reduction(),
                                  return_per_row=g.flag(), return_lse=g.flag(), **common)
    if which == 3:
        return L.distill(x, g.floats(n, v), g.maybe(lambda: g.ints((n,), v)), **kd_opts(), **common)
    if which == 4:
        return L.entropy(x, temperature=g.real() if g.flag() else 1.0, reduction=g.reduction(), **common)
    if which == 5:
        return L.selective_log_softmax(x, g.ints((n, k), v), grad_output=g.maybe(lambda: g.floats(n, k)),
                                       grad_dtype=g.dtype_name())
    hid, w = g.floats(n, h), g.floats(v, h)
    bias = g.maybe(lambda: g.floats(1, v).reshape(-1) if g.flag() else g.array())
    if which == 6:
        return L.fused_linear_cross_entropy(hid, w, g.ints((n,), v), bias=bias, ignore_index=g.size(),
                                            label_smoothing=g.real() if g.flag() else 0.0,
                                            reduction=g.reduction(), return_lse=g.flag(), **fused, **common)
    if which == 7:
        o = kd_opts()
        return L.fused_linear_topk_kd(hid, w, g.ints((n, k), v), g.floats(n, k),
                                      g.maybe(lambda: g.ints((n, k), 1)), g.maybe(lambda: g.ints((n,), v)),
                                      bias=bias, normalize_topk=g.flag(), **o, **fused, **common)
    if which == 8:
        return L.fused_linear_distill(hid, w, g.floats(n, h), g.floats(v, h), g.maybe(lambda: g.ints((n,), v)),
                                      bias=bias, **kd_opts(), **fused, **common)
    if which == 9:
        return L.fused_linear_entropy(hid, w, bias=bias, temperature=g.real() if g.flag() else 1.0,
                                      reduction=g.reduction(), **fused, **common)
    return L.fused_linear_selective_log_softmax(hid, w, g.ints((n, k), v), bias=bias,
                                                grad_output=g.maybe(lambda: g.floats(n, k)),
                                                grad_dtype=g.dtype_name(), **fused)


@atheris.instrument_func
def graph_call(g):
    """A few retort.ops calls on tensors made from fuzzed arrays, then the graph run when its plan is small."""
    O = retort.ops
    pool = []
    for _ in range(g.fdp.ConsumeIntInRange(1, 3)):
        a = g.array()
        maker = g.byte()
        try:
            if maker < 150:
                pool.append(retort.tensor(a, dtype=g.dtype_name() if g.byte() > 220 else None))
            elif maker < 230:
                pool.append(retort.param(a))
            else:
                sizes = g.sizes()
                if addressable_but_large(sizes):
                    continue  # a real allocation of up to 2^48 bytes: the caller's to ask for, not a bug
                pool.append(retort.zeros(tuple(sizes), dtype=g.dtype_name(), param=g.flag()))
        except (retort.Error, TypeError):
            pass
    if not pool:
        return None

    def t():
        return g.pick(pool) if g.byte() < 230 else g.array()

    unary = [O.exp, O.log, O.sqrt, O.rsqrt, O.tanh, O.relu, O.gelu, O.silu, O.neg, O.sum_rows, O.mean_rows,
             O.max_rows, O.sum, O.mean, O.max, O.softmax, O.log_softmax, O.contiguous, O.transpose]
    for _ in range(g.fdp.ConsumeIntInRange(1, 6)):
        op = g.byte() % 24
        try:
            if op < 6:
                r = g.pick(unary)(t())
            elif op == 6:
                r = O.reshape(t(), g.sizes())
            elif op == 7:
                r = O.permute(t(), g.sizes())
            elif op == 8:
                r = O.slice(t(), g.size(), g.size(), g.size())
            elif op == 9:
                r = O.fill(g.sizes(), g.real(), dtype=g.dtype_name())
            elif op == 10:
                r = O.repeat(t(), g.sizes())
            elif op == 11:
                r = O.reduce_to(t(), g.sizes())
            elif op == 12:
                r = O.concat(t(), t(), g.size())
            elif op == 13:
                r = O.cast(t(), g.dtype_name())
            elif op == 14:
                r = O.causal_softmax(t(), g.real(), g.size())
            elif op == 15:
                r = O.rope(t(), t(), g.pick(["normal", "neox", "x"]), g.real())
            elif op == 16:
                r = O.matmul(t(), t(), g.flag(), g.flag())
            elif op == 17:
                r = O.get_rows(t(), t())
            elif op == 18:
                r = g.pick([O.add, O.sub, O.mul, O.div])(t(), t())
            elif op == 19:
                r = g.pick([O.rms_norm, O.layer_norm, O.scale])(t(), g.real())
            elif op == 20:
                r = O.cross_entropy(t(), t(), ignore_index=g.size(), reduction=g.reduction())
            elif op == 21:
                r = O.topk_kd(t(), t(), t(), g.maybe(t), g.maybe(t), temperature=g.real(),
                              reduction=g.reduction())
            elif op == 22:
                r = O.entropy(t(), g.real(), g.reduction())
            else:
                r = O.selective_log_softmax(t(), t())
        except (retort.Error, TypeError):
            continue
        pool.append(r)
    root = pool[-1]
    graph = retort.Graph()
    graph.forward(root)
    if g.flag() and root.dtype in ("f32", "bf16", "f16") and any(p.is_param for p in pool):
        try:
            graph.backward(root.sum() if root.size != 1 else root)
        except retort.Error:
            pass
    if graph.peak_bytes > MAX_PLAN_BYTES:
        return None
    graph.compute()
    return root.numpy()


def addressable_but_large(sizes):
    """True for a shape retort would really allocate (valid, at most 2^48 bytes) that is too large to fuzz with."""
    count = 1
    for d in sizes:
        if not isinstance(d, int) or d < 1:
            return False
        count *= d
    return (64 << 20) < count * 8 <= 2**48 * 8


def read(result):
    """Touches every array a call returned."""
    if result is None:
        return
    if isinstance(result, (tuple, list)):
        for r in result:
            read(r)
    elif isinstance(result, np.ndarray):
        result.sum()
    elif hasattr(result, "_fields"):
        for f in result._fields:
            read(getattr(result, f))


@atheris.instrument_func
def one_input(data):
    g = Gen(data)
    try:
        if g.flag():
            read(loss_call(g))
        else:
            read(graph_call(g))
    except retort.Error:
        pass
    except TypeError as e:
        # pybind11's answer to an argument of the wrong kind (e.g. an int that does not fit int64), or the loss
        # bindings' (bindings/loss_binding.cpp: "<fn>(): <name> must be ..."); anything else raising TypeError
        # is a finding.
        if "incompatible function arguments" not in str(e) and "(): " not in str(e):
            raise


def main():
    warnings.simplefilter("ignore")  # NumPy's overflow warnings on purposely extreme values
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
