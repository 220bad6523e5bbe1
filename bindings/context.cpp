// Backends, shared contexts, tensor handles, and the argument parsers every binding uses.
#include <map>
#include <mutex>
#include <unordered_set>

#include "common.h"

namespace retort::py {

// ---- backends ---------------------------------------------------------------------------------------------

namespace {

std::mutex backend_mutex;
std::map<int, BackendPtr> cpu_cache;   // by thread count
std::map<int, BackendPtr> cuda_cache;  // by device

}  // namespace

BackendPtr cpu_backend(int threads) {
  RT_CHECK(threads >= 0, "retort.cpu: threads must be >= 0 (0: all cores), got ", threads);
  std::lock_guard<std::mutex> lock(backend_mutex);
  BackendPtr& slot = cpu_cache[threads];
  if (!slot) {
    auto ref = std::make_shared<BackendRef>();
    if (threads == 0)
      ref->backend = std::shared_ptr<Backend>(&default_cpu_backend(), [](Backend*) {});  // a static: not ours
    else
      ref->backend = std::make_shared<CpuBackend>(threads);
    slot = ref;
  }
  return slot;
}

BackendPtr cuda_backend(int device) {
  RT_CHECK(device >= 0, "retort.cuda: device must be >= 0, got ", device);
  std::lock_guard<std::mutex> lock(backend_mutex);
  BackendPtr& slot = cuda_cache[device];
  if (!slot) {
    auto ref = std::make_shared<BackendRef>();
    ref->backend = std::shared_ptr<Backend>(make_cuda_backend(device));  // throws with the reason
    ref->device = device;
    slot = ref;
  }
  return slot;
}

void clear_backend_cache() {
  std::map<int, BackendPtr> cpu, cuda;
  {
    std::lock_guard<std::mutex> lock(backend_mutex);
    cpu.swap(cpu_cache);
    cuda.swap(cuda_cache);
  }
}

// ---- contexts ---------------------------------------------------------------------------------------------

namespace {

// The live PyCtx objects, so owner_of can prove a Context is one before casting. Contexts may die on threads
// without the GIL (a DLPack consumer dropping our capsule), hence the mutex.
std::mutex live_mutex;
std::unordered_set<const Context*>& live_contexts() {
  static std::unordered_set<const Context*> s;
  return s;
}

}  // namespace

PyCtx::PyCtx(BackendPtr be) : Context(*be->backend), be_(std::move(be)) {
  std::lock_guard<std::mutex> lock(live_mutex);
  live_contexts().insert(static_cast<const Context*>(this));
}

PyCtx::~PyCtx() {
  std::lock_guard<std::mutex> lock(live_mutex);
  live_contexts().erase(static_cast<const Context*>(this));
  // Memory a DLPack producer lent us goes back when queued kernels are done with it (from_dlpack's owner).
}

void PyCtx::depend_on(const std::shared_ptr<PyCtx>& other) {
  if (!other || other.get() == this) return;
  for (const auto& d : deps_)
    if (d == other) return;
  deps_.push_back(other);
}

int PyCtx::ndim(const Tensor* t) const {
  auto it = ndim_.find(t);
  return it == ndim_.end() ? t->n_dims() : std::max(it->second, 0);
}

std::shared_ptr<PyCtx> owner_of(const Tensor* t) {
  RT_ASSERT(t != nullptr && t->ctx != nullptr);
  {
    std::lock_guard<std::mutex> lock(live_mutex);
    RT_ASSERT(live_contexts().count(t->ctx) > 0);
  }
  return static_cast<PyCtx*>(t->ctx)->shared_from_this();
}

TensorRef make_ref(Tensor* t, int ndim, std::shared_ptr<GraphBox> graph) {
  TensorRef r;
  r.ctx = owner_of(t);
  r.t = t;
  r.graph = std::move(graph);
  if (ndim >= 0) r.ctx->set_ndim(t, ndim);
  return r;
}

int py_ndim(const TensorRef& r) {
  // Never fewer dims than the record has; more only as leading 1s.
  return std::max(r.ctx->ndim(r.t), r.t->n_dims() == 1 && r.t->ne[0] == 1 ? 0 : r.t->n_dims());
}

Shape py_shape(const TensorRef& r) {
  Shape s;
  for (int d = py_ndim(r) - 1; d >= 0; --d) s.push_back(d < kMaxDims ? r.t->ne[d] : 1);
  return s;
}

std::shared_ptr<GraphBox> value_owner(const TensorRef& r, const char* what) {
  Tensor* t = r.t;
  if (storage_root(t)->is_leaf()) return nullptr;  // leaf storage (or a view of it): always there
  const auto& pl = owner_of(t)->placements;
  auto it = pl.find(t);
  RT_CHECK(it != pl.end(), what, ": ", t->describe(),
           " has no value yet: add it to a graph (graph.forward(t)) and call graph.compute()");
  std::shared_ptr<GraphBox> g = it->second.graph.lock();
  RT_CHECK(g != nullptr, what, ": ", t->describe(),
           " was computed by a graph that no longer exists; keep the graph alive while you read its results");
  RT_CHECK(it->second.kept, what, ": ", t->describe(),
           " is an intermediate whose memory the planner reused; call graph.forward(t) before "
           "graph.compute() to keep its value");
  RT_CHECK(it->second.data == t->data, what, ": ", t->describe(),
           " was placed again since its graph last ran; call graph.compute() first");
  return g;
}

// ---- argument parsers -------------------------------------------------------------------------------------

namespace {

std::optional<DType> dtype_from_name(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (s == "f32" || s == "float32" || s == "float") return DType::F32;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "f16" || s == "float16" || s == "half") return DType::F16;
  if (s == "i32" || s == "int32") return DType::I32;
  if (s == "i64" || s == "int64") return DType::I64;
  return std::nullopt;
}

}  // namespace

std::optional<DType> parse_dtype_opt(pyb::handle h) {
  if (h.is_none()) return std::nullopt;
  return parse_dtype(h);
}

DType parse_dtype(pyb::handle h) {
  if (pyb::isinstance<DType>(h)) return h.cast<DType>();
  std::string name;
  if (pyb::isinstance<pyb::str>(h)) {
    name = h.cast<std::string>();
  } else {
    // NumPy dtypes, NumPy scalar types, and anything with a dtype-like name (torch.float32 prints as such).
    try {
      name = pyb::str(pyb::dtype::from_args(pyb::reinterpret_borrow<pyb::object>(h)).attr("name"));
    } catch (const pyb::error_already_set&) {
      name = pyb::str(h);
      auto dot = name.rfind('.');
      if (dot != std::string::npos) name = name.substr(dot + 1);
    }
  }
  auto d = dtype_from_name(name);
  RT_CHECK(d.has_value(), "dtype: unknown dtype '", name,
           "' (retort has f32, bf16, f16, i32 and i64; names like 'float32' and NumPy dtypes work too)");
  return *d;
}

Shape parse_shape(pyb::handle h, const char* op) {
  // pybind11 reports a failed conversion as a RuntimeError that names no op; a shape is the caller's input.
  try {
    if (!PySequence_Check(h.ptr())) return {h.cast<int64_t>()};
    return h.cast<Shape>();
  } catch (const pyb::cast_error&) {
    RT_FAIL(op, ": a shape must be an int or a sequence of ints that fit in int64, got ",
            std::string(pyb::repr(h)));
  }
}

Reduction parse_reduction(pyb::handle h) {
  if (pyb::isinstance<Reduction>(h)) return h.cast<Reduction>();
  RT_CHECK(pyb::isinstance<pyb::str>(h), "reduction: expected 'mean', 'sum' or 'none', got ",
           std::string(pyb::str(pyb::type::handle_of(h).attr("__name__"))));
  std::string s = h.cast<std::string>();
  if (s == "mean") return Reduction::Mean;
  if (s == "sum") return Reduction::Sum;
  if (s == "none") return Reduction::None;
  RT_FAIL("reduction: expected 'mean', 'sum' or 'none', got '", s, "'");
}

namespace {
// The Python name of each divergence, the one list parse_divergence and divergence_name read.
const std::pair<const char*, Divergence> kDivergences[] = {{"kl", Divergence::Kl},
                                                           {"tvd", Divergence::Tvd},
                                                           {"skew_kl", Divergence::SkewKl},
                                                           {"skew_reverse_kl", Divergence::SkewReverseKl}};
}  // namespace

Divergence parse_divergence(const std::string& s) {
  std::string names;
  for (const auto& [name, d] : kDivergences) {
    if (s == name) return d;
    names += std::string(names.empty() ? "" : ", ") + "'" + name + "'";
  }
  RT_FAIL("divergence: expected one of ", names, " ('kl' is the KL family by beta), got '", s, "'");
}

const char* divergence_name(Divergence d) {
  for (const auto& [name, v] : kDivergences)
    if (v == d) return name;
  RT_FAIL("divergence: no name for value ", int64_t(d));
}

BackendPtr parse_backend(pyb::handle h) {
  if (h.is_none()) return nullptr;
  if (pyb::isinstance<BackendRef>(h)) return h.cast<BackendPtr>();
  if (pyb::isinstance<pyb::str>(h)) {
    std::string s = h.cast<std::string>();
    if (s == "cpu") return cpu_backend(0);
    if (s == "cuda") return cuda_backend(0);
    if (s.rfind("cuda:", 0) == 0) {
      int dev = -1;
      try {
        dev = std::stoi(s.substr(5));
      } catch (const std::exception&) {
      }
      RT_CHECK(dev >= 0, "backend: cannot read a device number in '", s, "'");
      return cuda_backend(dev);
    }
    RT_FAIL("backend: expected 'cpu', 'cuda' or 'cuda:N', got '", s, "'");
  }
  RT_FAIL("backend: expected a retort.Backend (retort.cpu(), retort.cuda()) or a name, got ",
          std::string(pyb::str(pyb::type::handle_of(h).attr("__name__"))));
}

}  // namespace retort::py
