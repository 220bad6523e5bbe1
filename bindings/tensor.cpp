// NumPy <-> tensor conversions, and the Python classes Tensor and Context with the leaf constructors
// (retort.tensor, retort.param, retort.zeros, retort.from_dlpack).
#include <array>
#include <bit>
#include <cstring>

#include "common.h"

namespace retort::py {

namespace {

pyb::module_ numpy() {
  return pyb::module_::import("numpy");
}

bool is_ml_bfloat16(const pyb::dtype& dt) {
  // NumPy's own numeric kinds are never ml_dtypes' bfloat16: skip the name lookup (slow) on every call.
  const char k = dt.kind();
  if (k == 'f' || k == 'i' || k == 'u' || k == 'b') return false;
  return std::string(pyb::str(dt.attr("name"))) == "bfloat16";
}

bool native_order(const pyb::dtype& dt) {
  const char bo = dt.byteorder();
  return bo == '=' || bo == '|' || bo == (std::endian::native == std::endian::big ? '>' : '<');
}

// The retort dtype an array's elements take when no dtype is asked for: float64 becomes f32 (retort has no
// f64), small integers and bools i32, wide unsigned integers i64.
DType default_dtype(const pyb::dtype& dt) {
  if (is_ml_bfloat16(dt)) return DType::BF16;
  const size_t size = size_t(dt.itemsize());
  switch (dt.kind()) {
    case 'f':
      if (size == 2) return DType::F16;
      if (size == 4 || size == 8) return DType::F32;
      break;
    case 'i':
      return size == 8 ? DType::I64 : DType::I32;
    case 'u':
      return size >= 4 ? DType::I64 : DType::I32;
    case 'b':
      return DType::I32;
    default:
      break;
  }
  RT_FAIL("tensor: NumPy dtype ", std::string(pyb::str(dt)),
          " has no retort counterpart (retort has f32, bf16, f16, i32 and i64)");
}

// True when the array's elements are exactly retort dtype d in memory.
bool same_layout(const pyb::dtype& dt, DType d) {
  if (!native_order(dt)) return false;
  const size_t size = size_t(dt.itemsize());
  switch (d) {
    case DType::F32:
      return dt.kind() == 'f' && size == 4;
    case DType::F16:
      return dt.kind() == 'f' && size == 2;
    case DType::I32:
      return dt.kind() == 'i' && size == 4;
    case DType::I64:
      return dt.kind() == 'i' && size == 8;
    case DType::BF16:
      return is_ml_bfloat16(dt);
  }
  return false;
}

// The NumPy dtype that reads d back (bf16 reads back as float32: NumPy has no bfloat16). Made once: a dtype
// from a name goes through NumPy's format parser, several microseconds per result.
pyb::dtype numpy_dtype(DType d) {
  // Leaked on purpose: Python objects must not be released by static destructors after the interpreter.
  static const auto* types = new std::array<pyb::dtype, 4>{pyb::dtype("float32"), pyb::dtype("float16"),
                                                           pyb::dtype("int32"), pyb::dtype("int64")};
  switch (d) {
    case DType::F16:
      return (*types)[1];
    case DType::I32:
      return (*types)[2];
    case DType::I64:
      return (*types)[3];
    case DType::F32:
    case DType::BF16:
      break;
  }
  return (*types)[0];
}

Shape array_shape(const pyb::array& a) {
  Shape s;
  for (pyb::ssize_t i = 0; i < a.ndim(); ++i) s.push_back(int64_t(a.shape(i)));
  if (s.empty()) s.push_back(1);  // a 0-d array is one element
  return s;
}

// Holds a Python object from C++ owners that may let go on any thread, with or without the GIL.
std::shared_ptr<void> keep_alive(pyb::object o) {
  PyObject* p = o.release().ptr();
  return std::shared_ptr<void>(p, [](void* q) {
    if (!Py_IsInitialized()) return;  // the interpreter is gone: nothing left to release into
    pyb::gil_scoped_acquire gil;
    Py_DECREF(static_cast<PyObject*>(q));
  });
}

// The array's values as d's storage bytes in C order, converted by NumPy (bf16 rounded here).
std::vector<uint8_t> storage_bytes(const pyb::array& arr, DType d, const std::string& what) {
  pyb::module_ np = numpy();
  const char kind = arr.dtype().kind();
  if (is_int(d)) {
    RT_CHECK(kind == 'i' || kind == 'u' || kind == 'b', what, ": cannot store NumPy ",
             std::string(pyb::str(arr.dtype())), " values in an integer tensor (", dtype_name(d),
             "); pass integers");
    if (d == DType::I32 && arr.size() > 0 && arr.dtype().itemsize() >= 4 && kind != 'b') {
      // Both as doubles: a uint64 minimum above INT64_MAX has no int64 to cast to.
      const double lo = np.attr("min")(arr).cast<double>();
      const double hi = np.attr("max")(arr).cast<double>();
      RT_CHECK(lo >= double(INT32_MIN) && hi <= double(INT32_MAX), what, ": values in [", lo, ", ", hi,
               "] do not fit in i32");
    }
  }
  if (d == DType::BF16 && !is_ml_bfloat16(arr.dtype())) {
    auto f = pyb::array_t<float, pyb::array::c_style | pyb::array::forcecast>::ensure(arr);
    RT_CHECK(f, what, ": cannot convert these values to bf16");
    std::vector<uint8_t> out(size_t(f.size()) * 2);
    auto* dst = reinterpret_cast<uint16_t*>(out.data());
    const float* src = f.data();
    for (pyb::ssize_t i = 0; i < f.size(); ++i) dst[i] = f32_to_bf16(src[i]);
    return out;
  }
  pyb::array c = np.attr("ascontiguousarray")(arr, d == DType::BF16 ? arr.dtype() : numpy_dtype(d));
  std::vector<uint8_t> out(size_t(c.nbytes()));
  if (!out.empty()) std::memcpy(out.data(), c.data(), out.size());
  return out;
}

// A new context on be, or ctx itself (whose backend must then be be).
std::shared_ptr<PyCtx> context_for(BackendPtr be, std::shared_ptr<PyCtx> ctx) {
  if (ctx) return ctx;
  return std::make_shared<PyCtx>(be ? be : cpu_backend(0));
}

bool is_dlpack_producer(pyb::handle obj) {
  if (pyb::isinstance<pyb::array>(obj)) return false;  // NumPy arrays take the buffer path
  return PyCapsule_CheckExact(obj.ptr()) || pyb::hasattr(obj, "__dlpack__");
}

TensorRef from_numpy(pyb::array arr, BackendPtr be, std::optional<DType> want, const std::string& name,
                     std::shared_ptr<PyCtx> ctx, bool as_param) {
  const DType d = want ? *want : default_dtype(arr.dtype());
  const std::string what =
      name.empty() ? std::string(as_param ? "param" : "tensor") : "tensor '" + name + "'";
  ctx = context_for(be, ctx);
  const Shape shape = array_shape(arr);
  RT_CHECK(arr.ndim() <= kMaxDims, what, ": retort tensors have at most 4 dims, got an array of shape ",
           std::string(
               pyb::str(pyb::tuple(pyb::cast(std::vector<int64_t>(arr.shape(), arr.shape() + arr.ndim()))))));
  RT_CHECK(arr.size() > 0, what, ": retort tensors have no empty dims, got an array with 0 elements");

  // Zero-copy: the tensor aliases the array's memory and keeps the array alive.
  bool alias = !as_param && ctx->backend().is_host() && same_layout(arr.dtype(), d) && arr.writeable() &&
               reinterpret_cast<uintptr_t>(arr.data()) % dtype_size(d) == 0;
  std::vector<size_t> strides;
  for (pyb::ssize_t i = 0; alias && i < arr.ndim(); ++i) {
    const pyb::ssize_t st = arr.shape(i) == 1 ? 0 : arr.strides(i);
    alias = st >= 0 && size_t(st) % dtype_size(d) == 0;
    strides.push_back(size_t(st));
  }
  Tensor* t;
  if (alias) {
    void* data = const_cast<void*>(arr.data());
    t = ctx->wrap(d, shape, data, keep_alive(arr), strides, name);
  } else {
    std::vector<uint8_t> bytes = storage_bytes(arr, d, what);
    t = as_param ? ctx->param(d, shape, name) : ctx->tensor(d, shape, name);
    set_bytes(t, bytes.data(), bytes.size());
  }
  return make_ref(t, int(arr.ndim()));
}

}  // namespace

bool wraps_in_place(const pyb::array& a, DType d) {
  if (!a.writeable() || !same_layout(a.dtype(), d) || default_dtype(a.dtype()) != d ||
      reinterpret_cast<uintptr_t>(a.data()) % dtype_size(d) != 0)
    return false;
  for (pyb::ssize_t i = 0; i < a.ndim(); ++i)
    if (a.shape(i) != 1 && (a.strides(i) < 0 || size_t(a.strides(i)) % dtype_size(d) != 0)) return false;
  return true;
}

BackendPtr backend_of(pyb::handle obj) {
  if (pyb::isinstance<TensorRef>(obj)) return obj.cast<const TensorRef&>().ctx->backend_ref();
  if (!pyb::isinstance<pyb::array>(obj) && pyb::hasattr(obj, "__dlpack_device__")) {
    pyb::tuple dev = obj.attr("__dlpack_device__")();
    const int type = dev[0].cast<int>();
    if (type == 2 || type == 13) return cuda_backend(dev[1].cast<int>());  // kDLCUDA, kDLCUDAManaged
  }
  return nullptr;
}

TensorRef copy_to(const TensorRef& r, BackendPtr be, std::shared_ptr<PyCtx> ctx) {
  value_owner(r, "copy");
  ctx = context_for(be ? be : r.ctx->backend_ref(), ctx);
  std::vector<uint8_t> bytes;
  Tensor* t = ctx->tensor(r.t->dtype, r.t->shape(), r.t->name);
  {
    pyb::gil_scoped_release nogil;
    bytes = get_bytes(r.t);
    set_bytes(t, bytes.data(), bytes.size());
  }
  return make_ref(t, py_ndim(r));
}

Tensor* alias_leaf(const TensorRef& r, PyCtx& ctx, const std::string& name) {
  std::shared_ptr<GraphBox> g = value_owner(r, name.empty() ? "alias" : name.c_str());
  const Tensor* t = r.t;
  RT_CHECK(t->backend().name() == ctx.backend().name(), name, ": ", t->describe(), " lives on ",
           t->backend().name(), " but the computation runs on ", ctx.backend().name());
  std::vector<size_t> strides;
  for (int d = t->n_dims() - 1; d >= 0; --d) strides.push_back(t->nb[d]);
  auto keep = std::make_shared<std::pair<std::shared_ptr<PyCtx>, std::shared_ptr<GraphBox>>>(r.ctx, g);
  Tensor* a = ctx.wrap(t->dtype, t->shape(), t->data, keep, strides, name);
  ctx.set_ndim(a, py_ndim(r));
  return a;
}

TensorRef to_tensor(pyb::handle obj, BackendPtr be, std::optional<DType> dtype, const std::string& name,
                    std::shared_ptr<PyCtx> ctx) {
  if (ctx) be = ctx->backend_ref();
  if (pyb::isinstance<TensorRef>(obj)) {
    const TensorRef& r = obj.cast<const TensorRef&>();
    RT_CHECK(!dtype || *dtype == r.t->dtype, "tensor: ", r.t->describe(), " is not ", dtype_name(*dtype),
             "; convert it in the graph with retort.ops.cast");
    if (!be || be->backend == r.ctx->backend_ref()->backend) return r;
    return copy_to(r, be, ctx);
  }
  if (is_dlpack_producer(obj)) {
    BackendPtr src = backend_of(obj);
    const bool host = !src;
    if (dtype && host && !PyCapsule_CheckExact(obj.ptr())) {
      // A host object in another dtype: let NumPy convert it (it reads DLPack producers itself).
      TensorRef probe = from_dlpack(obj, nullptr, name, nullptr);
      if (probe.t->dtype != *dtype) {
        pyb::array arr = to_numpy(probe, true);
        return from_numpy(arr, be, dtype, name, ctx, false);
      }
      return be && be->backend != probe.ctx->backend_ref()->backend ? copy_to(probe, be, ctx) : probe;
    }
    TensorRef r = from_dlpack(obj, be, name, ctx);
    RT_CHECK(!dtype || *dtype == r.t->dtype, "tensor: the DLPack tensor is ", dtype_name(r.t->dtype),
             ", not ", dtype_name(*dtype), "; convert it before handing it over, or with retort.ops.cast");
    return r;
  }
  pyb::array arr = numpy().attr("asarray")(obj);
  return from_numpy(arr, be, dtype, name, ctx, false);
}

TensorRef to_param(pyb::handle obj, BackendPtr be, std::optional<DType> dtype, const std::string& name,
                   std::shared_ptr<PyCtx> ctx) {
  if (ctx) be = ctx->backend_ref();
  pyb::array arr;
  if (pyb::isinstance<TensorRef>(obj) || is_dlpack_producer(obj)) {
    TensorRef r = to_tensor(obj, nullptr, std::nullopt, name, nullptr);
    if (!be) be = r.ctx->backend_ref();
    if (!dtype || *dtype == r.t->dtype) {
      RT_CHECK(is_float(r.t->dtype), "param '", name, "': parameters must be f32, bf16 or f16, got ",
               dtype_name(r.t->dtype));
      value_owner(r, "param");
      ctx = context_for(be, ctx);
      Tensor* t = ctx->param(r.t->dtype, r.t->shape(), name);
      std::vector<uint8_t> bytes;
      {
        pyb::gil_scoped_release nogil;
        bytes = get_bytes(r.t);
        set_bytes(t, bytes.data(), bytes.size());
      }
      return make_ref(t, py_ndim(r));
    }
    arr = to_numpy(r, true);
  } else {
    arr = numpy().attr("asarray")(obj);
  }
  DType d = dtype ? *dtype : default_dtype(arr.dtype());
  RT_CHECK(is_float(d), "param '", name, "': parameters must be f32, bf16 or f16, got ", dtype_name(d));
  return from_numpy(arr, be, d, name, ctx, true);
}

pyb::array to_numpy(const TensorRef& r, std::optional<bool> copy) {
  std::shared_ptr<GraphBox> g = value_owner(r, "numpy");
  const Tensor* t = r.t;
  const Shape shape = py_shape(r);
  const bool host = t->backend().is_host();
  // Views only of leaf storage: a graph's arena is rewritten by its next run, so its values are copied.
  const bool viewable = host && !g && t->dtype != DType::BF16;
  if (copy.has_value() && !*copy) {
    RT_CHECK(viewable, "numpy(copy=False): ", t->describe(), " cannot be viewed without a copy (",
             !host ? "it lives on " + t->backend().name()
             : g   ? std::string("it is a computed value in a graph's reusable memory")
                   : std::string("NumPy has no bfloat16"),
             ")");
  }
  if (viewable && !(copy.has_value() && *copy)) {
    std::vector<pyb::ssize_t> strides;
    for (int i = 0; i < int(shape.size()); ++i) {
      const int d = int(shape.size()) - 1 - i;
      strides.push_back(d < kMaxDims ? pyb::ssize_t(t->nb[d]) : 0);
    }
    // The array's base holds the context, which holds the storage (and whatever array it wraps).
    auto holder = std::make_unique<std::shared_ptr<PyCtx>>(r.ctx);
    pyb::capsule base(holder.get(), [](void* p) {
      std::unique_ptr<std::shared_ptr<PyCtx>>(static_cast<std::shared_ptr<PyCtx>*>(p));
    });
    holder.release();
    return pyb::array(numpy_dtype(t->dtype), std::vector<pyb::ssize_t>(shape.begin(), shape.end()), strides,
                      t->data, base);
  }
  std::vector<uint8_t> bytes;
  {
    pyb::gil_scoped_release nogil;
    bytes = get_bytes(t);
  }
  pyb::array out(numpy_dtype(t->dtype), std::vector<pyb::ssize_t>(shape.begin(), shape.end()));
  if (t->dtype == DType::BF16) {
    float* dst = static_cast<float*>(out.mutable_data());
    for (int64_t i = 0; i < t->nelements(); ++i) dst[i] = load_f32(bytes.data(), DType::BF16, i);
  } else {
    std::memcpy(out.mutable_data(), bytes.data(), bytes.size());
  }
  return out;
}

void assign(const TensorRef& r, pyb::handle obj) {
  Tensor* t = r.t;
  RT_CHECK(t->is_leaf(), "assign: ", t->describe(), " is computed by the graph; only leaves can be assigned");
  pyb::array arr = numpy().attr("asarray")(obj);
  Shape want = py_shape(r), got = array_shape(arr);
  auto squeeze = [](Shape s) {
    while (s.size() > 1 && s.front() == 1) s.erase(s.begin());
    return s;
  };
  RT_CHECK(squeeze(want) == squeeze(got), "assign: ", t->describe(), " cannot take values of shape ",
           std::string(pyb::str(pyb::tuple(pyb::cast(got)))));
  std::vector<uint8_t> bytes = storage_bytes(arr, t->dtype, "assign");
  pyb::gil_scoped_release nogil;
  set_bytes(t, bytes.data(), bytes.size());
}

// ---- Python classes ---------------------------------------------------------------------------------------

namespace {

std::string repr(const TensorRef& r) {
  std::string s = "retort.Tensor(" + std::string(dtype_name(r.t->dtype)) + "[";
  Shape sh = py_shape(r);
  for (size_t i = 0; i < sh.size(); ++i) s += (i ? ", " : "") + std::to_string(sh[i]);
  s += "], " + r.t->backend().name();
  if (!r.t->name.empty()) s += ", name='" + r.t->name + "'";
  if (r.t->has(kParam)) s += ", param";
  return s + ")";
}

TensorRef zeros(std::shared_ptr<PyCtx> ctx, pyb::handle shape_obj, pyb::handle dtype, const std::string& name,
                bool param) {
  Shape shape = parse_shape(shape_obj, "zeros");
  const int ndim = int(shape.size());
  if (shape.empty()) shape.push_back(1);
  const DType d = parse_dtype(dtype);
  Tensor* t = param ? ctx->param(d, shape, name) : ctx->tensor(d, shape, name);
  return make_ref(t, ndim);
}

}  // namespace

void bind_tensor(pyb::module_& m) {
  pyb::class_<TensorRef> tc(
      m, "Tensor",
      "A retort tensor: a leaf (data you gave, or a parameter) or a graph node whose value "
      "exists after a retort.Graph that holds it ran. Shapes are outermost first, as in "
      "NumPy, with at most 4 dims.");
  tc.def_property_readonly(
        "shape", [](const TensorRef& r) { return pyb::tuple(pyb::cast(py_shape(r))); },
        "The shape, outermost first (a tuple).")
      .def_property_readonly("ndim", &py_ndim, "The number of dims.")
      .def_property_readonly(
          "dtype", [](const TensorRef& r) { return r.t->dtype; }, "The element type.")
      .def_property_readonly(
          "size", [](const TensorRef& r) { return r.t->nelements(); }, "The element count.")
      .def_property_readonly(
          "backend", [](const TensorRef& r) { return r.ctx->backend_ref(); },
          "The backend the tensor lives on.")
      .def_property_readonly(
          "device", [](const TensorRef& r) { return r.t->backend().name(); }, "'cpu' or 'cuda:N'.")
      .def_property(
          "name", [](const TensorRef& r) { return r.t->name; },
          [](const TensorRef& r, const std::string& n) { r.t->name = n; }, "The name used in error messages.")
      .def_property_readonly(
          "is_leaf", [](const TensorRef& r) { return r.t->is_leaf(); },
          "True for data and parameters, False for graph nodes.")
      .def_property_readonly(
          "is_param", [](const TensorRef& r) { return r.t->has(kParam); },
          "True for trainable tensors (retort.param).")
      .def_property_readonly(
          "is_contiguous", [](const TensorRef& r) { return r.t->is_contiguous(); },
          "True when the elements are packed in row-major order.")
      .def(
          "numpy", &to_numpy, pyb::arg("copy") = pyb::none(),
          "The value as a NumPy array. Leaf storage on the CPU is returned as a view (writes go through; the "
          "tensor stays alive with the array) unless copy=True; device tensors, computed values and bf16 "
          "(as float32) are copied. copy=False raises retort.Error where a view is impossible.")
      .def(
          "__array__",
          [](const TensorRef& r, pyb::object dtype, pyb::object copy) {
            pyb::array a =
                to_numpy(r, copy.is_none() ? std::nullopt : std::optional<bool>(copy.cast<bool>()));
            return dtype.is_none() ? a : pyb::array(a.attr("astype")(dtype));
          },
          pyb::arg("dtype") = pyb::none(), pyb::arg("copy") = pyb::none(), "NumPy's array protocol.")
      .def(
          "item",
          [](const TensorRef& r) -> pyb::object {
            RT_CHECK(r.t->nelements() == 1, "item: ", r.t->describe(), " has ", r.t->nelements(),
                     " elements, not one");
            return to_numpy(r, true).attr("item")();
          },
          "The single element as a Python number.")
      .def(
          "tolist", [](const TensorRef& r) { return to_numpy(r, true).attr("tolist")(); },
          "The value as nested Python lists.")
      .def("assign", &assign, pyb::arg("values"),
           "Writes values (array-like, same shape) into this leaf, converting to its dtype. A tensor that "
           "wraps "
           "a NumPy array writes into that array.")
      .def(
          "to", [](const TensorRef& r, pyb::handle be) { return copy_to(r, parse_backend(be)); },
          pyb::arg("backend"), "A copy of the value on another backend (a leaf).")
      .def(
          "copy", [](const TensorRef& r) { return copy_to(r, nullptr); }, "A copy of the value (a new leaf).")
      .def("__dlpack__", &to_dlpack, pyb::kw_only(), pyb::arg("stream") = pyb::none(),
           pyb::arg("max_version") = pyb::none(), pyb::arg("dl_device") = pyb::none(),
           pyb::arg("copy") = pyb::none(),
           "DLPack export without a copy: a capsule that keeps this tensor (and the graph holding a computed "
           "value) alive. A computed value changes when its graph runs again. Device work is finished first.")
      .def("__dlpack_device__", &dlpack_device, "(device type, device id) as DLPack numbers.")
      .def("__repr__", &repr, "retort.Tensor(dtype[shape], backend[, name][, param]).")
      .def(
          "__len__",
          [](const TensorRef& r) {
            const Shape s = py_shape(r);
            if (s.empty()) throw pyb::type_error("len() of a 0-d tensor");
            return s[0];
          },
          "The size of the first axis.");

  pyb::class_<PyCtx, std::shared_ptr<PyCtx>>(
      m, "Context",
      "A group of tensors on one backend, freed together. Optional: retort.tensor and friends make their own "
      "context per tensor; use one to put leaves on a chosen backend without repeating it.")
      .def(pyb::init([](pyb::handle be) {
             BackendPtr b = parse_backend(be);
             return std::make_shared<PyCtx>(b ? b : cpu_backend(0));
           }),
           pyb::arg("backend") = pyb::none(), "A context on backend (default: the CPU).")
      .def_property_readonly("backend", &PyCtx::backend_ref, "The backend.")
      .def("__len__", &PyCtx::size, "The number of tensor records in the context.")
      .def(
          "tensor",
          [](const std::shared_ptr<PyCtx>& c, pyb::handle data, pyb::handle dtype, const std::string& name) {
            return to_tensor(data, nullptr, parse_dtype_opt(dtype), name, c);
          },
          pyb::arg("data"), pyb::arg("dtype") = pyb::none(), pyb::arg("name") = "",
          "A leaf holding data; see retort.tensor.")
      .def(
          "param",
          [](const std::shared_ptr<PyCtx>& c, pyb::handle data, pyb::handle dtype, const std::string& name) {
            return to_param(data, nullptr, parse_dtype_opt(dtype), name, c);
          },
          pyb::arg("data"), pyb::arg("dtype") = pyb::none(), pyb::arg("name") = "",
          "A trainable copy of data; see retort.param.")
      .def("zeros", &zeros, pyb::arg("shape"), pyb::arg("dtype") = "f32", pyb::arg("name") = "",
           pyb::arg("param") = false, "A zero-filled leaf; see retort.zeros.")
      .def(
          "from_dlpack",
          [](const std::shared_ptr<PyCtx>& c, pyb::handle x, const std::string& name) {
            return from_dlpack(x, nullptr, name, c);
          },
          pyb::arg("x"), pyb::arg("name") = "",
          "A leaf over a DLPack producer's memory; see retort.from_dlpack.");

  m.def(
      "tensor",
      [](pyb::handle data, pyb::handle dtype, pyb::handle backend, const std::string& name) {
        return to_tensor(data, parse_backend(backend), parse_dtype_opt(dtype), name);
      },
      pyb::arg("data"), pyb::kw_only(), pyb::arg("dtype") = pyb::none(), pyb::arg("backend") = pyb::none(),
      pyb::arg("name") = "",
      "A leaf tensor holding data (a NumPy array, anything NumPy accepts, a DLPack producer, or a "
      "retort.Tensor).\n\n"
      "No copy when the data are on the host, the backend is the CPU and the dtype matches (f32, f16, i32, "
      "i64, ml_dtypes bfloat16; non-negative strides): the tensor aliases the array and keeps it alive, so "
      "changes to the array show up in retort. DLPack producers are imported without a copy on their own "
      "device. Otherwise the values are copied and converted. Without dtype: float64 becomes f32, small "
      "integers and bools i32, other integers i64.");
  m.def(
      "param",
      [](pyb::handle data, pyb::handle dtype, pyb::handle backend, const std::string& name) {
        return to_param(data, parse_backend(backend), parse_dtype_opt(dtype), name);
      },
      pyb::arg("data"), pyb::kw_only(), pyb::arg("dtype") = pyb::none(), pyb::arg("backend") = pyb::none(),
      pyb::arg("name") = "",
      "A trainable parameter (f32, bf16 or f16) holding a copy of data. Graph.backward gives every parameter "
      "that reaches the loss a gradient; the optimizers update it in place.");
  m.def(
      "zeros",
      [](pyb::handle shape, pyb::handle dtype, pyb::handle backend, const std::string& name, bool param) {
        BackendPtr be = parse_backend(backend);
        return zeros(std::make_shared<PyCtx>(be ? be : cpu_backend(0)), shape, dtype, name, param);
      },
      pyb::arg("shape"), pyb::kw_only(), pyb::arg("dtype") = "f32", pyb::arg("backend") = pyb::none(),
      pyb::arg("name") = "", pyb::arg("param") = false, "A zero-filled leaf (a parameter when param=True).");
  m.def(
      "from_dlpack",
      [](pyb::handle x, pyb::handle backend, const std::string& name) {
        return from_dlpack(x, parse_backend(backend), name, nullptr);
      },
      pyb::arg("x"), pyb::kw_only(), pyb::arg("backend") = pyb::none(), pyb::arg("name") = "",
      "A leaf over the memory of any object with __dlpack__ (PyTorch, CuPy, JAX, NumPy) or a DLPack capsule, "
      "without a copy: CUDA memory lands on retort.cuda(its device), host memory on the CPU; the producer's "
      "buffer stays alive with the tensor. f32, bf16, f16, i32 and i64; at most 4 dims. backend, when it is "
      "another one, gets a copy.");
}

}  // namespace retort::py
