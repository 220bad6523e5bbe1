// LossCall: one plain loss function call of retort.losses (loss_binding.cpp). It wraps the inputs
// (NumPy arrays, DLPack producers, retort Tensors) without copying where it can, builds a one-loss graph on
// the inputs' backend, runs it with the GIL released, and packs the loss, the gradients asked for and the
// extra outputs: NumPy arrays when the call ran on the CPU, retort Tensors (kept alive with their graph) on a
// device. A call on the host whose inputs were all NumPy arrays used in place can run again over other arrays
// of the same layouts (rerun): the graph, its plan and its arena are kept, only the leaves' addresses change.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "loss_binding.h"

namespace retort::py {

// One plain loss call: a context and a graph of its own on the backend the inputs decide.
class LossCall {
 public:
  // grad_slots: the names of the gradients the result has room for (None when not asked for).
  LossCall(const char* op, const std::vector<pyb::handle>& inputs, pyb::handle backend,
           std::vector<std::string> grad_slots = {"grad"})
      : op_(op), slots_(std::move(grad_slots)) {
    be_ = parse_backend(backend);
    for (pyb::handle h : inputs)
      if (!be_ && !h.is_none()) be_ = backend_of(h);
    if (!be_) be_ = cpu_backend(0);
    ctx_ = std::make_shared<PyCtx>(be_);
  }

  // An input as a fresh leaf of this call's context: retort Tensors are aliased (their values must exist),
  // arrays wrapped or copied onto the backend. Null for an optional None.
  Tensor* input(pyb::handle obj, const char* role, bool optional = false) {
    if (obj.is_none()) {
      RT_CHECK(optional, op_, ": ", role, " is required, got None");
      return nullptr;
    }
    if (pyb::isinstance<TensorRef>(obj)) {
      TensorRef r = obj.cast<TensorRef>();
      if (r.ctx->backend_ref()->backend != be_->backend) r = copy_to(r, be_);
      leaves_.push_back({role, nullptr, {}, {}});  // not an array: the call cannot run again over another
      return alias_leaf(r, *ctx_, role);
    }
    Tensor* t = to_tensor(obj, be_, std::nullopt, role, ctx_).t;
    Leaf leaf{role, nullptr, {}, {}};
    if (pyb::isinstance<pyb::array>(obj) && wrapped_in_place(obj, t)) {
      const pyb::array a = obj.cast<pyb::array>();
      leaf.t = t;
      for (pyb::ssize_t i = 0; i < a.ndim(); ++i) {
        leaf.shape.push_back(a.shape(i));
        leaf.strides.push_back(a.shape(i) == 1 ? 0 : a.strides(i));  // any stride is valid for one index
      }
    }
    leaves_.push_back(std::move(leaf));
    return t;
  }

  // A trainable input (the student's logits; hidden, weight, bias): with want_grad, a leaf whose gradient the
  // result returns in slot grad_name. Null for an optional None.
  Tensor* student(pyb::handle obj, const char* role, bool want_grad, const char* grad_name = "grad",
                  bool optional = false) {
    Tensor* t = input(obj, role, optional);
    if (t && want_grad) {
      RT_CHECK(is_float(t->dtype), op_, ": ", role, " must be f32, bf16 or f16, got ", t->describe());
      t->flags |= kParam;  // a leaf of this call only: the caller's data is not marked
      grads_.push_back({grad_name, t});
    }
    return t;
  }

  Context& ctx() { return *ctx_; }

  // The grad_dtype option: None, each gradient in the dtype of its input; else this dtype for all.
  void set_grad_dtype(pyb::handle h) {
    grad_dtype_ = parse_dtype_opt(h);
    RT_CHECK(!grad_dtype_ || is_float(*grad_dtype_), op_, ": grad_dtype must be f32, bf16 or f16, got ",
             dtype_name(*grad_dtype_));
  }

  // A row loss's logits gradient written by the loss's own pass (losses.h logits_grad), in grad_dtype or the
  // logits' dtype; in_place over the caller's logits, which must then have been wrapped without a copy.
  void row_grad(Tensor* loss, Reduction red, Tensor* x, pyb::handle logits, bool in_place) {
    RT_CHECK(red != Reduction::None, op_,
             ": return_grad needs reduction 'mean' or 'sum' (a gradient is taken of a single number)");
    const DType dt = grad_dtype_.value_or(x->dtype);
    if (in_place) {
      RT_CHECK(!grad_dtype_ || *grad_dtype_ == x->dtype, op_, ": inplace_grad writes the gradient in the ",
               "logits' dtype ", dtype_name(x->dtype), ", but grad_dtype is ", dtype_name(*grad_dtype_));
      RT_CHECK(wrapped_in_place(logits, x), op_, ": inplace_grad needs logits the call can use without a ",
               "copy (contiguous, of a float dtype, on the backend the call runs on); got ", x->describe(),
               ", which was copied");
      in_place_ = logits;
    }
    Tensor* g = retort::logits_grad(*ctx_, loss, dt, in_place);
    ctx_->set_ndim(g, ctx_->ndim(x));
    direct_.push_back({"grad", g});
  }
  // A plain function's own output, returned in field "values" beside the surrogate loss finish() runs.
  void set_values(Tensor* v) { values_ = v; }

  DType grad_dtype_or(DType d) const { return grad_dtype_.value_or(d); }

  // A gradient made by the call's own node (selective_log_softmax_grad), returned in slot name.
  void direct_grad(const char* name, Tensor* g, Tensor* like) {
    ctx_->set_ndim(g, ctx_->ndim(like));
    direct_.push_back({name, g});
  }

  // Runs the graph for loss (and the extra outputs), with the gradients asked for, and packs the results:
  // the loss alone when nothing else was asked for, else LossResult(loss, <grad slots>, per_row, lse, hard,
  // soft) with None where nothing was asked for.
  pyb::object finish(Tensor* loss, Reduction red, const LossOutputs& extra = {}) {
    build(loss, red, extra);
    graph_->compute();
    return pack();
  }

  // Whether the call may run again over other arrays (rerun): on the host, every input a NumPy array used in
  // place, no gradient written over an input, and at most max_bytes of memory held between calls.
  bool reusable(size_t max_bytes) {
    if (!graph_ || !be_->backend->is_host() || in_place_) return false;
    for (const Leaf& l : leaves_)
      if (!l.t) return false;
    size_t bytes = graph_->graph().plan().arena_bytes;
    for (auto& [name, r] : grads_out_)
      if (r.t->is_leaf()) bytes += r.t->nbytes();  // a parameter's f32 accumulator
    return bytes <= max_bytes;
  }
  // Whether b holds, for every input, a NumPy array this call's leaf can take in place (rerun's condition).
  bool same_inputs(const Bound& b) const {
    for (const Leaf& l : leaves_) {
      pyb::handle h = b[l.role];
      if (!pyb::isinstance<pyb::array>(h)) return false;
      const pyb::array a = pyb::reinterpret_borrow<pyb::array>(h);
      if (size_t(a.ndim()) != l.shape.size() || !wraps_in_place(a, l.t->dtype)) return false;
      for (pyb::ssize_t i = 0; i < a.ndim(); ++i)
        if (a.shape(i) != l.shape[size_t(i)] || (a.shape(i) == 1 ? 0 : a.strides(i)) != l.strides[size_t(i)])
          return false;
    }
    return true;
  }
  // Runs the kept graph over b's arrays (same_inputs(b) holds) and packs the results like finish.
  pyb::object rerun(const Bound& b) {
    for (const Leaf& l : leaves_)
      l.t->data = const_cast<void*>(pyb::reinterpret_borrow<pyb::array>(b[l.role]).data());
    graph_->zero_grad();  // the gradients are this call's, not summed with the last one's
    graph_->compute();
    pyb::object r = pack();
    release_inputs();
    return r;
  }
  // Whether role names one of the call's NumPy inputs (used in place).
  bool has_input(const std::string& role) const {
    for (const Leaf& l : leaves_)
      if (l.t && l.role == role) return true;
    return false;
  }
  // Lets go of the caller's arrays: a kept call must not keep them alive. Their leaves keep stale addresses,
  // which only rerun reads, after setting new ones.
  void release_inputs() {
    for (const Leaf& l : leaves_) l.t->buffer.reset();
  }

 private:
  void build(Tensor* loss, Reduction red, const LossOutputs& extra) {
    const int loss_nd = red == Reduction::None ? 1 : 0;
    graph_ = std::make_shared<GraphBox>(be_);
    auto& graph = graph_;
    auto& outs = outs_;
    outs.push_back({"loss", make_ref(loss, loss_nd)});
    auto add = [&](const char* name, Tensor* t, int nd) {
      if (t) outs.push_back({name, make_ref(t, nd)});
    };
    add("per_row", extra.per_row, 1);
    add("lse", extra.lse, 1);
    add("hard", extra.hard, loss_nd);
    add("soft", extra.soft, loss_nd);
    add("values", values_, 2);
    std::vector<TensorRef> roots;
    for (auto& o : outs) roots.push_back(o.second);
    auto& grads = grads_out_;
    for (auto& [name, g] : direct_) {
      g->flags |= kOutput;
      grads.push_back({name, make_ref(g, ctx_->ndim(g))});
      roots.push_back(grads.back().second);
    }
    graph->forward(roots);
    if (!grads_.empty()) {
      RT_CHECK(red != Reduction::None, op_,
               ": return_grad needs reduction 'mean' or 'sum' (a gradient is taken of a single number)");
      graph->backward(outs[0].second);
      for (auto& [name, t] : grads_) {
        TensorRef g = *graph->grad(make_ref(t));
        const DType dt = grad_dtype_.value_or(t->dtype);
        if (dt != g.t->dtype) {  // the f32 accumulator, cast once after the run's last accumulation
          Tensor* c = cast(*ctx_, g.t, dt);
          c->flags |= kOutput;
          g = make_ref(c, ctx_->ndim(t));
          graph->forward(std::vector<TensorRef>{g});
        }
        grads.push_back({name, g});
      }
    }
  }

  // The loss alone when nothing else was asked for, else LossResult(loss, <grad slots>, per_row, lse, hard,
  // soft): NumPy copies on the host (a rerun rewrites the arena), Tensors holding the graph on a device.
  pyb::object pack() {
    const auto& graph = graph_;
    const auto& outs = outs_;
    const auto& grads = grads_out_;
    const bool host = be_->backend->is_host();
    auto result = [&](const TensorRef& r) -> pyb::object {
      TensorRef kept = r;
      kept.graph = graph;  // a device result is read through DLPack later: its graph must stay
      return host ? pyb::object(to_numpy(kept, true)) : pyb::cast(kept);
    };
    if (outs.size() == 1 && grads.empty()) return result(outs[0].second);

    pyb::list fields, values;
    fields.append("loss");
    values.append(result(outs[0].second));
    for (const std::string& slot : slots_) {
      fields.append(slot);
      pyb::object v = pyb::none();
      for (auto& [name, r] : grads)
        if (name == slot)
          v = in_place_ && slot == "grad" ? pyb::reinterpret_borrow<pyb::object>(in_place_) : result(r);
      values.append(v);
    }
    std::vector<const char*> extras = {"per_row", "lse", "hard", "soft"};
    if (values_) extras.push_back("values");
    for (const char* name : extras) {
      fields.append(name);
      pyb::object v = pyb::none();
      for (size_t i = 1; i < outs.size(); ++i)
        if (outs[i].first == name) v = result(outs[i].second);
      values.append(v);
    }
    if (!result_cls_) result_cls_ = result_type(pyb::tuple(fields));
    // tuple.__new__(cls, values), what namedtuple's _make does, without its Python-level __new__.
    auto* cls = reinterpret_cast<PyTypeObject*>(result_cls_.ptr());
    PyObject* r = PyTuple_Type.tp_new(cls, pyb::make_tuple(pyb::tuple(values)).ptr(), nullptr);
    if (!r) throw pyb::error_already_set();
    return pyb::reinterpret_steal<pyb::object>(r);
  }

  // Whether leaf x, made by input() from obj, is obj's own memory: NumPy arrays and retort Tensors are
  // compared by address; a DLPack producer on the call's device is always imported in place.
  bool wrapped_in_place(pyb::handle obj, const Tensor* x) const {
    if (pyb::isinstance<pyb::array>(obj)) {
      const pyb::array a = obj.cast<pyb::array>();
      return a.writeable() && a.data() == x->data;
    }
    if (pyb::isinstance<TensorRef>(obj)) {
      const TensorRef r = obj.cast<TensorRef>();
      return r.t->data == x->data && r.t->dtype == x->dtype;
    }
    if (pyb::hasattr(obj, "__dlpack__")) {
      BackendPtr b = backend_of(obj);
      return b ? b->backend == be_->backend : be_->backend->is_host();
    }
    return false;
  }

  // A namedtuple class per field list ("LossResult"), made once and kept in retort.losses._result_types.
  static pyb::object result_type(const pyb::tuple& fields) {
    // Looked up once: an import per call costs microseconds. Leaked: no Python object in a static destructor.
    static const pyb::dict* types =
        new pyb::dict(pyb::module_::import("retort").attr("losses").attr("_result_types"));
    const pyb::dict& cache = *types;
    if (!cache.contains(fields))
      cache[fields] = pyb::module_::import("collections").attr("namedtuple")("LossResult", fields);
    return cache[fields];
  }

  // An input as input() found it: t, shape and strides (NumPy's) when it is a NumPy array used in place.
  struct Leaf {
    std::string role;
    Tensor* t;
    std::vector<pyb::ssize_t> shape, strides;
  };

  const char* op_;
  std::vector<std::string> slots_;
  BackendPtr be_;
  std::shared_ptr<PyCtx> ctx_;
  std::vector<std::pair<std::string, Tensor*>> grads_;   // taken by a graph backward
  std::vector<std::pair<std::string, Tensor*>> direct_;  // written by a forward node
  std::optional<DType> grad_dtype_;
  Tensor* values_ = nullptr;
  pyb::handle in_place_;  // the caller's logits, when the gradient overwrote them
  std::vector<Leaf> leaves_;
  std::shared_ptr<GraphBox> graph_;
  std::vector<std::pair<std::string, TensorRef>> outs_, grads_out_;
  pyb::object result_cls_;  // the LossResult class of this call's fields, once known
};

}  // namespace retort::py
