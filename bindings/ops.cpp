// retort.ops: the graph op constructors of src/ops/ops.h and src/ops/loss/losses.h, and Tensor's operators
// and methods. Nothing runs here: each call adds a node, which a retort.Graph computes later. Axes are
// NumPy's (outermost first, negatives count from the end); retort's C++ API counts dims from the innermost.
#include "op_args.h"

namespace retort::py {

namespace {

// NumPy axis -> retort dim (0 = innermost).
int dim_of(int axis, int ndim, const char* op) {
  RT_CHECK(axis >= -ndim && axis < ndim, op, ": axis ", axis, " is out of range for ", ndim, " dims");
  if (axis < 0) axis += ndim;
  return ndim - 1 - axis;
}

// Shape arguments outermost first; a () shape is one element.
void ne_of(const Shape& s, int64_t ne[kMaxDims], const char* op) {
  shape_to_ne(s.empty() ? Shape{1} : s, ne, op);
}

// Shapes given as reshape(2, 3) or reshape((2, 3)).
Shape varargs_shape(const pyb::args& a, const char* op) {
  if (a.size() == 1) return parse_shape(a[0], op);
  return parse_shape(a, op);
}

using Binary = Tensor* (*)(Context&, Tensor*, Tensor*);

// a op b, with either operand broadcast over the other (C++ broadcasts only the second).
TensorRef binary(const char* name, Binary fn, pyb::handle a_obj, pyb::handle b_obj) {
  OpArgs args(name, {a_obj, b_obj});
  Tensor* a = args.get(a_obj, "a");
  Tensor* b = args.get(b_obj, "b");
  if (!can_broadcast(b, a) && can_broadcast(a, b)) a = repeat(args.ctx(), a, b->ne);
  return args.out(fn(args.ctx(), a, b), std::max(args.ndim(0), args.ndim(1)));
}

using Unary = Tensor* (*)(Context&, Tensor*);

TensorRef unary(const char* name, Unary fn, pyb::handle x_obj, int ndim = -1) {
  OpArgs args(name, {x_obj});
  Tensor* x = args.get(x_obj, "x");
  return args.out(fn(args.ctx(), x), ndim >= 0 ? ndim : args.ndim(0));
}

TensorRef matmul_op(pyb::handle a_obj, pyb::handle b_obj, bool ta, bool tb) {
  OpArgs args("matmul", {a_obj, b_obj});
  Tensor* a = args.get(a_obj, "a");
  Tensor* b = args.get(b_obj, "b");
  return args.out(matmul(args.ctx(), a, b, ta, tb), std::max({args.ndim(0), args.ndim(1), 2}));
}

TensorRef permute_op(pyb::handle x_obj, const std::vector<int>& axes) {
  OpArgs args("permute", {x_obj});
  Tensor* x = args.get(x_obj, "x");
  const int n = args.ndim(0);
  RT_CHECK(int(axes.size()) == n, "permute: ", x->describe(), " has ", n, " dims but ", axes.size(),
           " axes were given");
  // NumPy: result axis r is x's axis axes[r]. retort: p[i] is the result dim that x's dim i becomes.
  int p[kMaxDims] = {0, 1, 2, 3};
  std::vector<bool> seen(size_t(n), false);
  for (int r = 0; r < n; ++r) {
    const int src = dim_of(axes[size_t(r)], n, "permute");
    RT_CHECK(!seen[size_t(src)], "permute: axis ", axes[size_t(r)], " is repeated");
    seen[size_t(src)] = true;
    p[src] = n - 1 - r;
  }
  return args.out(permute(args.ctx(), x, p[0], p[1], p[2], p[3]), n);
}

}  // namespace

void bind_ops(pyb::module_& m) {
  pyb::module_ ops = m.def_submodule(
      "ops",
      "Graph ops: each call adds a node and returns its Tensor; a retort.Graph computes it. Arguments may be "
      "retort Tensors, NumPy arrays, DLPack producers or numbers (all operands on one backend). Axes and "
      "shapes are NumPy's, outermost first; 'rows' are the last axis.");

  // The loss nodes' outputs (made here, not in a static, so it goes with the module).
  ops.attr("LossOutputs") =
      pyb::module_::import("collections")
          .attr("namedtuple")("LossOutputs", pyb::make_tuple("loss", "per_row", "lse", "hard", "soft"));

  // ---- elementwise --------------------------------------------------------------------------------------
#define RT_BINARY(name, doc)                                                                                 \
  ops.def(                                                                                                   \
      #name, [](pyb::handle a, pyb::handle b) { return binary(#name, &retort::name, a, b); }, pyb::arg("a"), \
      pyb::arg("b"), doc)
  RT_BINARY(add, "a + b, broadcasting either operand (each dim 1 or equal).");
  RT_BINARY(sub, "a - b, broadcasting either operand.");
  RT_BINARY(mul, "a * b elementwise, broadcasting either operand.");
  RT_BINARY(div, "a / b elementwise, broadcasting either operand.");
#undef RT_BINARY
#define RT_UNARY(name, doc) \
  ops.def(                  \
      #name, [](pyb::handle x) { return unary(#name, &retort::name, x); }, pyb::arg("x"), doc)
  RT_UNARY(neg, "-x.");
  RT_UNARY(exp, "exp(x).");
  RT_UNARY(log, "log(x).");
  RT_UNARY(sqrt, "sqrt(x).");
  RT_UNARY(rsqrt, "1 / sqrt(x).");
  RT_UNARY(tanh, "tanh(x).");
  RT_UNARY(relu, "max(x, 0).");
  RT_UNARY(gelu, "GELU (tanh approximation).");
  RT_UNARY(silu, "x * sigmoid(x).");
  RT_UNARY(contiguous, "A contiguous copy of x.");
  RT_UNARY(sum_rows, "Sum over the last axis, kept as size 1.");
  RT_UNARY(mean_rows, "Mean over the last axis, kept as size 1.");
  RT_UNARY(max_rows, "Max over the last axis, kept as size 1.");
  RT_UNARY(softmax, "Softmax over the last axis.");
  RT_UNARY(log_softmax, "Log-softmax over the last axis.");
#undef RT_UNARY
  ops.def(
      "sum", [](pyb::handle x) { return unary("sum", &retort::sum, x, 0); }, pyb::arg("x"),
      "The sum of all elements (a 0-d f32 tensor).");
  ops.def(
      "mean", [](pyb::handle x) { return unary("mean", &retort::mean, x, 0); }, pyb::arg("x"),
      "The mean of all elements (a 0-d f32 tensor).");
  ops.def(
      "max", [](pyb::handle x) { return unary("max", &retort::max, x, 0); }, pyb::arg("x"),
      "The largest element (a 0-d f32 tensor); NaN if any is NaN.");
  ops.def(
      "scale",
      [](pyb::handle x, float s) {
        OpArgs a("scale", {x});
        Tensor* t = a.get(x, "x");
        return a.out(scale(a.ctx(), t, s), a.ndim(0));
      },
      pyb::arg("x"), pyb::arg("s"), "x * s for a number s.");

  // ---- top-K log-probabilities: a teacher's side of distillation --------------------------------------------
  ops.attr("TopKLogprobs") =
      pyb::module_::import("collections")
          .attr("namedtuple")("TopKLogprobs", pyb::make_tuple("logprobs", "ids", "nll_sum", "lse"));
  ops.def(
      "topk_logprobs",
      [](pyb::handle logits, int64_t k) {
        OpArgs a("topk_logprobs", {logits});
        const TopKLogprobs r = topk_logprobs(a.ctx(), a.get(logits, "logits"), k);
        pyb::object cls = pyb::module_::import("retort").attr("ops").attr("TopKLogprobs");
        return cls(a.out(r.logprobs, 2), a.out(r.ids, 2), pyb::none(), pyb::none());
      },
      pyb::arg("logits"), pyb::arg("k"),
      "The K largest entries of each row of logits [N, V] as log-softmax values (f32 [N, K], best first) with "
      "their ids (i32 [N, K]; equal values: the smaller id first), as TopKLogprobs(logprobs, ids, None, None). "
      "Not differentiable.");
  ops.def(
      "fused_linear_topk_logprobs",
      [](pyb::handle hidden, pyb::handle weight, int64_t k, pyb::handle targets, int64_t ignore_index,
         bool return_lse, int64_t logits_budget, int64_t chunk_rows, pyb::handle logits_dtype) {
        OpArgs a("fused_linear_topk_logprobs", {hidden, weight, targets});
        Tensor* h = a.get(hidden, "hidden");
        Tensor* w = a.get(weight, "weight");
        Tensor* y = a.get(targets, "targets", true);
        RT_CHECK(logits_budget >= 0 && chunk_rows >= 0, "fused_linear_topk_logprobs: logits_budget ",
                 logits_budget, " and chunk_rows ", chunk_rows, " must be >= 0");
        TopKLogprobsOptions o;
        o.ignore_index = ignore_index;
        o.return_lse = return_lse;
        FusedLinearOptions f;
        f.logits_budget = size_t(logits_budget);
        f.chunk_rows = chunk_rows;
        f.logits_dtype = parse_dtype_opt(logits_dtype);
        const TopKLogprobsOutputs r = fused_linear_topk_logprobs(a.ctx(), h, w, k, y, o, f);
        auto t = [&](Tensor* x, int nd) -> pyb::object { return x ? pyb::cast(a.out(x, nd)) : pyb::none(); };
        pyb::object cls = pyb::module_::import("retort").attr("ops").attr("TopKLogprobs");
        return cls(t(r.logprobs, 2), t(r.ids, 2), t(r.nll_sum, 0), t(r.lse, 1));
      },
      pyb::arg("hidden"), pyb::arg("weight"), pyb::arg("k"), pyb::arg("targets") = pyb::none(),
      pyb::arg("ignore_index") = int64_t(-100), pyb::arg("return_lse") = false,
      pyb::arg("logits_budget") = int64_t(FusedLinearOptions{}.logits_budget),
      pyb::arg("chunk_rows") = int64_t(0), pyb::arg("logits_dtype") = pyb::none(),
      "A teacher's head: the top K of each row of hidden [N, H] · weight [V, H]ᵀ as log-probabilities with "
      "their ids, the summed negative log-likelihood of targets [N] (rows equal to ignore_index add nothing) "
      "and, with return_lse, each row's log-sum-exp, in chunks that never hold the [N, V] logits "
      "(logits_budget bytes, or chunk_rows rows; f32 chunk logits unless logits_dtype asks for 16 bits). "
      "Returns TopKLogprobs(logprobs, ids, nll_sum or None, lse or None). Not differentiable.");

  // ---- shapes, views and copies -------------------------------------------------------------------------
  ops.def(
      "reshape",
      [](pyb::handle x, pyb::handle shape) {
        OpArgs a("reshape", {x});
        Tensor* t = a.get(x, "x");
        Shape s = parse_shape(shape, "reshape");
        return a.out(reshape(a.ctx(), t, s.empty() ? Shape{1} : s), int(s.size()));
      },
      pyb::arg("x"), pyb::arg("shape"), "The same elements in a new shape (x must be contiguous); a view.");
  ops.def("permute", &permute_op, pyb::arg("x"), pyb::arg("axes"),
          "Reorders the axes like numpy.transpose(x, axes); a view.");
  ops.def(
      "transpose",
      [](pyb::handle x) {
        OpArgs a("transpose", {x});
        Tensor* t = a.get(x, "x");
        return a.out(transpose(a.ctx(), t), std::max(a.ndim(0), 2));
      },
      pyb::arg("x"), "Swaps the last two axes; a view.");
  ops.def(
      "slice",
      [](pyb::handle x, int axis, int64_t start, int64_t length) {
        OpArgs a("slice", {x});
        Tensor* t = a.get(x, "x");
        return a.out(slice(a.ctx(), t, dim_of(axis, a.ndim(0), "slice"), start, length), a.ndim(0));
      },
      pyb::arg("x"), pyb::arg("axis"), pyb::arg("start"), pyb::arg("length"),
      "The window [start, start + length) of axis; a view.");
  ops.def(
      "cast",
      [](pyb::handle x, pyb::handle dtype) {
        OpArgs a("cast", {x});
        Tensor* t = a.get(x, "x");
        return a.out(cast(a.ctx(), t, parse_dtype(dtype)), a.ndim(0));
      },
      pyb::arg("x"), pyb::arg("dtype"), "A contiguous copy of x converted to dtype.");
  ops.def(
      "concat",
      [](pyb::handle x, pyb::handle y, int axis) {
        OpArgs a("concat", {x, y});
        Tensor* tx = a.get(x, "a");
        Tensor* ty = a.get(y, "b");
        const int n = std::max(a.ndim(0), a.ndim(1));
        return a.out(concat(a.ctx(), tx, ty, dim_of(axis, n, "concat")), n);
      },
      pyb::arg("a"), pyb::arg("b"), pyb::arg("axis"),
      "a and b joined along axis; the other axes must match.");
  ops.def(
      "fill",
      [](pyb::handle shape, float value, pyb::handle dtype, pyb::handle backend) {
        BackendPtr be = parse_backend(backend);
        auto ctx = std::make_shared<PyCtx>(be ? be : cpu_backend(0));
        Shape s = parse_shape(shape, "fill");
        int64_t ne[kMaxDims];
        ne_of(s, ne, "fill");
        return make_ref(fill(*ctx, parse_dtype(dtype), ne, value), int(s.size()));
      },
      pyb::arg("shape"), pyb::arg("value"), pyb::kw_only(), pyb::arg("dtype") = "f32",
      pyb::arg("backend") = pyb::none(), "A node of the given shape with every element = value.");
  ops.def(
      "repeat",
      [](pyb::handle x, pyb::handle shape) {
        OpArgs a("repeat", {x});
        Tensor* t = a.get(x, "x");
        Shape s = parse_shape(shape, "repeat");
        int64_t ne[kMaxDims];
        ne_of(s, ne, "repeat");
        return a.out(repeat(a.ctx(), t, ne), int(s.size()));
      },
      pyb::arg("x"), pyb::arg("shape"), "x broadcast to shape (each axis of x 1 or equal).");
  ops.def(
      "reduce_to",
      [](pyb::handle x, pyb::handle shape) {
        OpArgs a("reduce_to", {x});
        Tensor* t = a.get(x, "x");
        Shape s = parse_shape(shape, "reduce_to");
        int64_t ne[kMaxDims];
        ne_of(s, ne, "reduce_to");
        return a.out(reduce_to(a.ctx(), t, ne), int(s.size()));
      },
      pyb::arg("x"), pyb::arg("shape"), "x summed down to a broadcast-compatible shape (repeat's gradient).");

  // ---- linear algebra, indexing, nn ---------------------------------------------------------------------
  ops.def("matmul", &matmul_op, pyb::arg("a"), pyb::arg("b"), pyb::arg("transpose_a") = false,
          pyb::arg("transpose_b") = false,
          "a @ b over the last two axes, batched over the others (b's batch axes may be 1). transpose_a / "
          "transpose_b read a as [..., K, M] or b as [..., N, K]: matmul(x, W, transpose_b=True) is x @ W.T. "
          "The result is f32.");
  ops.def(
      "get_rows",
      [](pyb::handle table, pyb::handle ids) {
        OpArgs a("get_rows", {table, ids});
        Tensor* t = a.get(table, "table");
        Tensor* i = a.get(ids, "ids");
        return a.out(get_rows(a.ctx(), t, i), 2);
      },
      pyb::arg("table"), pyb::arg("ids"),
      "Rows of table [R, D] at integer ids [N]: [N, D] (an embedding lookup).");
  ops.def(
      "causal_softmax",
      [](pyb::handle x, float scale, int64_t n_past) {
        OpArgs a("causal_softmax", {x});
        Tensor* t = a.get(x, "x");
        return a.out(causal_softmax(a.ctx(), t, scale, n_past), a.ndim(0));
      },
      pyb::arg("x"), pyb::arg("scale"), pyb::arg("n_past") = 0,
      "Attention scores [batch*heads, T_q, T_k]: softmax(x * scale) hiding key j from query i when j > i + "
      "n_past.");
  ops.def(
      "rms_norm",
      [](pyb::handle x, float eps) {
        OpArgs a("rms_norm", {x});
        Tensor* t = a.get(x, "x");
        return a.out(rms_norm(a.ctx(), t, eps), a.ndim(0));
      },
      pyb::arg("x"), pyb::arg("eps") = 1e-6f, "RMS normalization over the last axis (no weight).");
  ops.def(
      "layer_norm",
      [](pyb::handle x, float eps) {
        OpArgs a("layer_norm", {x});
        Tensor* t = a.get(x, "x");
        return a.out(layer_norm(a.ctx(), t, eps), a.ndim(0));
      },
      pyb::arg("x"), pyb::arg("eps") = 1e-5f, "Layer normalization over the last axis (no affine part).");
  ops.def(
      "rope",
      [](pyb::handle x, pyb::handle positions, const std::string& mode, float theta) {
        RT_CHECK(mode == "normal" || mode == "neox", "rope: mode must be 'normal' or 'neox', got '", mode,
                 "'");
        OpArgs a("rope", {x, positions});
        Tensor* t = a.get(x, "x");
        Tensor* p = a.get(positions, "positions");
        return a.out(rope(a.ctx(), t, p, mode == "neox" ? RopeMode::Neox : RopeMode::Normal, theta),
                     a.ndim(0));
      },
      pyb::arg("x"), pyb::arg("positions"), pyb::arg("mode") = "normal", pyb::arg("theta") = 10000.0f,
      "Rotary embedding of x [B, T, heads, d] at i32 positions [T]: 'normal' rotates pairs (2i, 2i+1), "
      "'neox' "
      "(i, i + d/2).");
  // The losses (retort.ops.cross_entropy, topk_kd, ..., fused_linear_*) are bound with their plain functions
  // from one declaration each, in losses.cpp.

  // ---- Tensor operators and methods ---------------------------------------------------------------------
  pyb::class_<TensorRef> tc = pyb::reinterpret_borrow<pyb::class_<TensorRef>>(m.attr("Tensor"));
  tc.def(
        "__add__", [](pyb::handle a, pyb::handle b) { return binary("add", &retort::add, a, b); },
        "self + other (either may broadcast).")
      .def(
          "__radd__", [](pyb::handle a, pyb::handle b) { return binary("add", &retort::add, b, a); },
          "other + self.")
      .def(
          "__sub__", [](pyb::handle a, pyb::handle b) { return binary("sub", &retort::sub, a, b); },
          "self - other.")
      .def(
          "__rsub__", [](pyb::handle a, pyb::handle b) { return binary("sub", &retort::sub, b, a); },
          "other - self.")
      .def(
          "__mul__", [](pyb::handle a, pyb::handle b) { return binary("mul", &retort::mul, a, b); },
          "self * other elementwise.")
      .def(
          "__rmul__", [](pyb::handle a, pyb::handle b) { return binary("mul", &retort::mul, b, a); },
          "other * self elementwise.")
      .def(
          "__truediv__", [](pyb::handle a, pyb::handle b) { return binary("div", &retort::div, a, b); },
          "self / other elementwise.")
      .def(
          "__rtruediv__", [](pyb::handle a, pyb::handle b) { return binary("div", &retort::div, b, a); },
          "other / self elementwise.")
      .def(
          "__matmul__", [](pyb::handle a, pyb::handle b) { return matmul_op(a, b, false, false); },
          "self @ other (retort.ops.matmul).")
      .def(
          "__rmatmul__", [](pyb::handle a, pyb::handle b) { return matmul_op(b, a, false, false); },
          "other @ self.")
      .def(
          "__neg__", [](pyb::handle x) { return unary("neg", &retort::neg, x); }, "-self.")
      .def(
          "reshape",
          [ops](pyb::handle x, pyb::args shape) {
            return ops.attr("reshape")(x, pyb::cast(varargs_shape(shape, "reshape")));
          },
          "The same elements in a new shape (a view; the tensor must be contiguous).")
      .def(
          "permute",
          [](pyb::handle x, pyb::args axes) {
            std::vector<int> ax;
            for (int64_t v : varargs_shape(axes, "permute")) {
              RT_CHECK(v == int64_t(int(v)), "permute: axis ", v, " is out of range");
              ax.push_back(int(v));
            }
            return permute_op(x, ax);
          },
          "Reorders the axes like numpy.transpose (a view).")
      .def(
          "transpose", [ops](pyb::handle x) { return ops.attr("transpose")(x); }, "Swaps the last two axes.")
      .def_property_readonly(
          "T", [ops](pyb::handle x) { return ops.attr("transpose")(x); }, "Swaps the last two axes.")
      .def(
          "cast", [ops](pyb::handle x, pyb::handle d) { return ops.attr("cast")(x, d); }, pyb::arg("dtype"),
          "A converted copy (graph node).")
      .def(
          "astype", [ops](pyb::handle x, pyb::handle d) { return ops.attr("cast")(x, d); }, pyb::arg("dtype"),
          "Same as cast.");
  // NumPy operands defer to these operators (np_array + tensor builds a node instead of reading a value).
  tc.attr("__array_ufunc__") = pyb::none();
  for (const char* name : {"sum", "mean", "max", "sum_rows", "mean_rows", "max_rows", "exp", "log", "sqrt",
                           "rsqrt", "tanh", "relu", "gelu", "silu", "softmax", "log_softmax", "contiguous"}) {
    pyb::object fn = ops.attr(name);
    const std::string doc = "Same as retort.ops." + std::string(name) + "(self).";  // pybind copies it
    tc.def(
        name, [fn](pyb::handle x) { return fn(x); }, doc.c_str());
  }
}

}  // namespace retort::py
