// Shared pieces of the Python module `retort`: who owns what, and the conversions every binding file uses.
//
// Ownership, in one paragraph: every tensor record lives in a PyCtx (a Context that Python objects share
// through shared_ptr). A Python Tensor holds the PyCtx that owns its record; a PyCtx holds the contexts its
// nodes read from, so a tensor keeps everything it was computed from alive. Op results get a fresh PyCtx
// each, so a tensor dropped in Python frees its records with it. A node's value lives in the arena of the
// graph that computed it: the graph records where it placed each node (PyCtx::placements), and reading a
// value checks that record, so a value whose graph is gone, or whose memory the planner reused, is an error
// and never a dangling read.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "retort.h"

namespace retort::py {

namespace pyb = pybind11;

// ---- backends ---------------------------------------------------------------------------------------------

// A backend and where its memory lives.
struct BackendRef {
  std::shared_ptr<Backend> backend;
  int device = -1;  // CUDA device ordinal; -1 for the host
  bool is_cuda() const { return device >= 0; }
  std::string name() const { return backend->name(); }
};
using BackendPtr = std::shared_ptr<BackendRef>;

// The CPU backend with `threads` workers (0: all cores; one shared backend per count).
BackendPtr cpu_backend(int threads = 0);
// The CUDA backend of a device (one per device). Throws retort::Error with the reason when CUDA is
// unavailable.
BackendPtr cuda_backend(int device);
// Forgets the cached backends (at interpreter exit, before static destructors run).
void clear_backend_cache();

// ---- contexts and tensors ---------------------------------------------------------------------------------

class GraphBox;

class PyCtx : public Context, public std::enable_shared_from_this<PyCtx> {
 public:
  explicit PyCtx(BackendPtr be);
  ~PyCtx();
  PyCtx(const PyCtx&) = delete;
  PyCtx& operator=(const PyCtx&) = delete;

  const BackendPtr& backend_ref() const { return be_; }
  // Keeps other alive as long as this context (its nodes read other's tensors).
  void depend_on(const std::shared_ptr<PyCtx>& other);
  // The number of dims Python sees for t: NumPy keeps leading 1s that retort's shape drops.
  void set_ndim(const Tensor* t, int ndim) { ndim_[t] = ndim; }
  int ndim(const Tensor* t) const;

  // Where the last graph that ran node t put it. kept: the planner never reused that memory in that run.
  struct Placement {
    std::weak_ptr<GraphBox> graph;
    void* data = nullptr;
    bool kept = false;
  };
  std::unordered_map<const Tensor*, Placement> placements;

 private:
  BackendPtr be_;
  std::vector<std::shared_ptr<PyCtx>> deps_;
  std::unordered_map<const Tensor*, int> ndim_;
};

// The context that owns t. Every tensor the module hands out lives in a PyCtx; anything else is a bug.
std::shared_ptr<PyCtx> owner_of(const Tensor* t);

// The Python `Tensor`: a record and what keeps it alive.
struct TensorRef {
  std::shared_ptr<PyCtx> ctx;  // owns *t
  Tensor* t = nullptr;
  std::shared_ptr<GraphBox> graph;  // set when the handle must keep the graph holding its value alive
};

// A handle for t (owned by its context); records the Python ndim when ndim >= 0.
TensorRef make_ref(Tensor* t, int ndim = -1, std::shared_ptr<GraphBox> graph = nullptr);
// The shape Python sees, outermost first.
Shape py_shape(const TensorRef& r);
int py_ndim(const TensorRef& r);

// Throws retort::Error unless r's value can be read now; returns the graph holding it (null for leaf
// storage).
std::shared_ptr<GraphBox> value_owner(const TensorRef& r, const char* what);

// ---- conversions ------------------------------------------------------------------------------------------

// A dtype from a retort.DType, a string ("f32", "float32", "bf16", ...), a NumPy dtype or a type object.
DType parse_dtype(pyb::handle h);
std::optional<DType> parse_dtype_opt(pyb::handle h);  // None -> nullopt
// "kl" (the KL family by beta) | "tvd" | "skew_kl" | "skew_reverse_kl"
Divergence parse_divergence(const std::string& s);
const char* divergence_name(Divergence d);  // the inverse of parse_divergence
Reduction parse_reduction(pyb::handle h);   // "mean" | "sum" | "none" or a retort.Reduction
BackendPtr parse_backend(pyb::handle h);    // None -> nullptr; a Backend; "cpu"; "cuda" / "cuda:N"
// A shape argument (outermost first): an int or a sequence of ints. Throws retort::Error naming op for
// anything else, an int that does not fit in int64 included.
Shape parse_shape(pyb::handle h, const char* op);

// A leaf of ctx over data: a retort Tensor is returned as is (it must live on ctx's backend); NumPy arrays
// and array-likes are wrapped without a copy when they are on the host, the backend is the CPU and the dtype
// matches (the array stays alive with the tensor), copied otherwise; objects with __dlpack__ go through
// from_dlpack. ctx null: a fresh context on be (be null: the CPU, or the DLPack object's device).
TensorRef to_tensor(pyb::handle obj, BackendPtr be, std::optional<DType> dtype, const std::string& name,
                    std::shared_ptr<PyCtx> ctx = nullptr);
// Whether to_tensor on the host takes NumPy array a in place as a leaf of dtype d (d's layout and default
// dtype, writable, aligned, non-negative strides): what a repeated loss call checks before reusing a graph.
bool wraps_in_place(const pyb::array& a, DType d);
// A trainable copy of data (Context::param).
TensorRef to_param(pyb::handle obj, BackendPtr be, std::optional<DType> dtype, const std::string& name,
                   std::shared_ptr<PyCtx> ctx = nullptr);
// A new leaf on be (in ctx when given) holding a copy of r's value.
TensorRef copy_to(const TensorRef& r, BackendPtr be, std::shared_ptr<PyCtx> ctx = nullptr);
// A new leaf in ctx that aliases r's value (leaf storage, or a computed value whose graph it keeps alive).
Tensor* alias_leaf(const TensorRef& r, PyCtx& ctx, const std::string& name);
// r's value as a NumPy array: a view of leaf storage on the host for f32/f16/i32/i64 unless copy is true, a
// copy otherwise (bf16 becomes float32). copy false and no view possible: throws retort::Error.
pyb::array to_numpy(const TensorRef& r, std::optional<bool> copy);
// Writes array values into leaf r (converted to its dtype; the shape must match).
void assign(const TensorRef& r, pyb::handle obj);
// The backend an object lives on, if it says: a retort Tensor's, or a DLPack device's; nullptr for NumPy.
BackendPtr backend_of(pyb::handle obj);

// ---- DLPack (dlpack.cpp) ----------------------------------------------------------------------------------

// Imports any object with __dlpack__ (or a DLPack capsule) without a copy; a device object lands on the CUDA
// backend of its device, a host one on the CPU. be, when given and elsewhere, gets a copy.
TensorRef from_dlpack(pyb::handle obj, BackendPtr be, const std::string& name, std::shared_ptr<PyCtx> ctx);
// Tensor.__dlpack__ and Tensor.__dlpack_device__.
pyb::object to_dlpack(const TensorRef& r, pyb::handle stream, pyb::handle max_version, pyb::handle dl_device,
                      pyb::handle copy);
pyb::tuple dlpack_device(const TensorRef& r);

// ---- graphs (graph.cpp) -----------------------------------------------------------------------------------

// A Graph and the context its gradient nodes live in, created on the backend of its first root.
class GraphBox : public std::enable_shared_from_this<GraphBox> {
 public:
  explicit GraphBox(BackendPtr be);
  // Adds roots and keeps their values (kOutput).
  void forward(const std::vector<TensorRef>& roots);
  void backward(const TensorRef& loss);
  // Runs the graph with the GIL released, then records where each node's value is.
  void compute();
  // The gradient of t (None if it has none); a non-parameter's gradient is kept from the next compute on.
  std::optional<TensorRef> grad(const TensorRef& t);
  void zero_grad();
  std::vector<TensorRef> params();
  Graph& graph();
  const BackendPtr& backend() const { return be_; }
  bool started() const { return graph_ != nullptr; }

 private:
  void start(const TensorRef& root);
  void adopt(const TensorRef& r);
  BackendPtr be_;
  std::shared_ptr<PyCtx> ctx_;
  std::unique_ptr<Graph> graph_;
};

// ---- binding entry points ---------------------------------------------------------------------------------

void bind_tensor(pyb::module_& m);     // tensor.cpp: Tensor, Context, tensor/param/zeros/from_dlpack
void bind_ops(pyb::module_& m);        // ops.cpp: retort.ops and Tensor operators
void bind_graph(pyb::module_& m);      // graph.cpp: Graph, optimizers, schedules
void bind_losses(pyb::module_& m);     // losses.cpp: retort.losses and the loss nodes of retort.ops
void bind_model(pyb::module_& m);      // model.cpp: TransformerConfig, Transformer, Trainer
void bind_gguf(pyb::module_& m);       // gguf.cpp: GgufFile
void bind_tokenizer(pyb::module_& m);  // tokenizer.cpp: Tokenizer

}  // namespace retort::py
