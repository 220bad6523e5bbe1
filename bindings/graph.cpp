// retort.Graph (forward, backward, compute, gradients), the optimizers and the learning-rate schedule.
#include "common.h"

namespace retort::py {

GraphBox::GraphBox(BackendPtr be) : be_(std::move(be)) {}

void GraphBox::start(const TensorRef& root) {
  if (graph_) return;
  if (!be_) be_ = root.ctx->backend_ref();
  ctx_ = std::make_shared<PyCtx>(be_);
  graph_ = std::make_unique<Graph>(*ctx_);
}

void GraphBox::adopt(const TensorRef& r) {
  start(r);
  RT_CHECK(r.t->backend().name() == be_->name(), "graph: ", r.t->describe(), " lives on ",
           r.t->backend().name(), " but the graph runs on ", be_->name(),
           "; copy it with Tensor.to(backend)");
  ctx_->depend_on(r.ctx);  // the gradient nodes in ctx_ read the roots' graphs
}

Graph& GraphBox::graph() {
  RT_CHECK(graph_ != nullptr, "graph: it has no tensors yet; call graph.forward(t) or graph.backward(loss)");
  return *graph_;
}

void GraphBox::forward(const std::vector<TensorRef>& roots) {
  for (const TensorRef& r : roots) {
    adopt(r);
    r.t->flags |= kOutput;  // the caller will read it: the planner must not reuse its memory
    graph_->forward(r.t);
  }
}

void GraphBox::backward(const TensorRef& loss) {
  adopt(loss);
  graph_->backward(loss.t);
}

void GraphBox::compute() {
  Graph& g = graph();
  auto self = shared_from_this();
  auto forget = [&] {
    for (Tensor* n : g.nodes()) {
      auto& pl = owner_of(n)->placements;
      auto it = pl.find(n);
      if (it != pl.end() && it->second.graph.lock() == self) pl.erase(it);
    }
  };
  try {
    // A device run only queues work: a fault it meets (an id out of range) is reported by a later run,
    // synchronize() or read (bindings/README.md, "Asynchronous errors").
    pyb::gil_scoped_release nogil;
    g.compute();
  } catch (...) {
    forget();  // a failed run leaves values half written: none of them is readable
    throw;
  }
  // Record where each value is. A value survives the run when it is an output, the loss, or a view of one
  // (the planner keeps those); other intermediates may have been overwritten by later nodes.
  for (Tensor* n : g.nodes()) {
    Tensor* root = storage_root(n);
    if (root->is_leaf()) continue;
    const bool kept = n->has(kOutput) || n->has(kLoss) || root->has(kOutput) || root->has(kLoss);
    owner_of(n)->placements[n] = {self, n->data, kept};
  }
}

std::optional<TensorRef> GraphBox::grad(const TensorRef& t) {
  Tensor* g = graph().grad(t.t);
  if (!g) return std::nullopt;
  if (!g->is_leaf() && !g->has(kOutput)) {
    g->flags |= kOutput;  // read after the next run: keep it
    graph_->forward(g);   // already in the graph; this only drops the cached plan
  }
  return make_ref(g, py_ndim(t), g->is_leaf() ? nullptr : shared_from_this());
}

void GraphBox::zero_grad() {
  graph().zero_grad();
}

std::vector<TensorRef> GraphBox::params() {
  std::vector<TensorRef> out;
  for (Tensor* p : graph().params()) out.push_back(make_ref(p));
  return out;
}

namespace {

// The optimizers hold raw parameter pointers; these wrappers keep the parameters (and their backend) alive.
struct PyAdamW {
  std::vector<TensorRef> params;
  std::unique_ptr<AdamW> opt;
};
struct PySgd {
  std::vector<TensorRef> params;
  std::unique_ptr<Sgd> opt;
};

std::vector<Tensor*> raw(const std::vector<TensorRef>& ps) {
  std::vector<Tensor*> out;
  for (const TensorRef& p : ps) out.push_back(p.t);
  return out;
}

std::vector<TensorRef> tensor_list(pyb::iterable it) {
  std::vector<TensorRef> out;
  for (pyb::handle h : it) {
    RT_CHECK(pyb::isinstance<TensorRef>(h), "optimizer: params must be retort Tensors (retort.param), got ",
             std::string(pyb::str(pyb::type::handle_of(h).attr("__name__"))));
    out.push_back(h.cast<TensorRef>());
  }
  return out;
}

float lr_arg(pyb::handle lr) {
  return lr.is_none() ? -1.0f : lr.cast<float>();
}

}  // namespace

void bind_graph(pyb::module_& m) {
  pyb::class_<GraphBox, std::shared_ptr<GraphBox>>(
      m, "Graph",
      "A computation: the nodes some roots need, in order, with their gradients after backward(). Nothing "
      "runs "
      "until compute(); running again recomputes everything from the current leaf values. Results are read "
      "from the tensors (Tensor.numpy(), DLPack) while the graph is alive.")
      .def(pyb::init([](pyb::handle be) { return std::make_shared<GraphBox>(parse_backend(be)); }),
           pyb::arg("backend") = pyb::none(),
           "A graph on backend (default: the backend of the first tensor added).")
      .def(
          "forward",
          [](GraphBox& g, pyb::args roots) {
            std::vector<TensorRef> rs;
            for (pyb::handle h : roots) {
              RT_CHECK(pyb::isinstance<TensorRef>(h), "graph.forward: expected retort Tensors, got ",
                       std::string(pyb::str(pyb::type::handle_of(h).attr("__name__"))));
              rs.push_back(h.cast<TensorRef>());
            }
            g.forward(rs);
            // Each root's handle keeps the graph holding its value, so reading it never outlives the memory.
            for (pyb::handle h : roots) h.cast<TensorRef&>().graph = g.shared_from_this();
          },
          "Adds each tensor and everything it depends on, and keeps their values readable after compute() "
          "for "
          "as long as the tensor lives (the tensor keeps the graph alive).")
      .def(
          "backward",
          [](GraphBox& g, TensorRef& loss) {
            g.backward(loss);
            loss.graph = g.shared_from_this();
          },
          pyb::arg("loss"),
          "Adds the loss (a single float element) and the gradient ops of every parameter that reaches it. "
          "Parameter gradients accumulate over runs: call zero_grad() between steps.")
      .def("compute", &GraphBox::compute,
           "Runs the graph (the GIL is released meanwhile). Raises retort.Error on a bad index or label: "
           "on the CPU here; on a device, where the run only queues work, at a later call, synchronize() or "
           "read.")
      .def("grad", &GraphBox::grad, pyb::arg("t"),
           "The gradient of t after compute(), or None when it has none (t is not a parameter and no "
           "parameter's gradient flows through it). A parameter's gradient is its f32 accumulator.")
      .def("zero_grad", &GraphBox::zero_grad,
           "Zeroes every parameter gradient accumulator (lazily: the next compute() overwrites instead of "
           "adding; grad() reads zeros before that).")
      .def_property_readonly("params", &GraphBox::params,
                             "The parameters that reach the loss, in the order backward() found them.")
      .def_property_readonly(
          "backend", [](const GraphBox& g) { return g.backend(); },
          "The backend the graph runs on (or None).")
      .def_property_readonly(
          "peak_bytes", [](GraphBox& g) { return g.graph().plan().arena_bytes; },
          "Bytes of intermediate memory a run needs (the memory plan's peak), known before running.")
      .def(
          "__len__", [](GraphBox& g) { return g.started() ? g.graph().nodes().size() : size_t(0); },
          "The number of nodes.");

  pyb::class_<PyAdamW>(m, "AdamW",
                       "AdamW with decoupled weight decay and bias correction; its state lives on the "
                       "parameters' backend.")
      .def(pyb::init([](pyb::iterable params, float lr, float beta1, float beta2, float eps,
                        float weight_decay) {
             auto o = std::make_unique<PyAdamW>();
             o->params = tensor_list(params);
             o->opt =
                 std::make_unique<AdamW>(raw(o->params), AdamWConfig{lr, beta1, beta2, eps, weight_decay});
             return o;
           }),
           pyb::arg("params"), pyb::kw_only(), pyb::arg("lr") = 1e-3f, pyb::arg("beta1") = 0.9f,
           pyb::arg("beta2") = 0.999f, pyb::arg("eps") = 1e-8f, pyb::arg("weight_decay") = 0.01f,
           "AdamW over params (e.g. graph.params). Raises retort.Error on a bad option or parameter.")
      .def(
          "step",
          [](PyAdamW& o, GraphBox& g, pyb::handle lr) {
            Graph& gr = g.graph();
            const float rate = lr_arg(lr);  // read while holding the GIL
            pyb::gil_scoped_release nogil;
            o.opt->step(gr, rate);
          },
          pyb::arg("graph"), pyb::arg("lr") = pyb::none(),
          "One update of every parameter from graph.grad(p); lr overrides the configured rate for this step.")
      .def_property_readonly(
          "steps", [](const PyAdamW& o) { return o.opt->steps(); }, "Updates done so far.")
      .def_property_readonly(
          "lr", [](const PyAdamW& o) { return o.opt->config().lr; }, "The configured rate.");

  pyb::class_<PySgd>(m, "SGD", "Stochastic gradient descent with momentum and weight decay.")
      .def(pyb::init([](pyb::iterable params, float lr, float momentum, float weight_decay) {
             auto o = std::make_unique<PySgd>();
             o->params = tensor_list(params);
             o->opt = std::make_unique<Sgd>(raw(o->params), SgdConfig{lr, momentum, weight_decay});
             return o;
           }),
           pyb::arg("params"), pyb::kw_only(), pyb::arg("lr") = 1e-2f, pyb::arg("momentum") = 0.0f,
           pyb::arg("weight_decay") = 0.0f,
           "SGD over params. Raises retort.Error on a bad option or parameter.")
      .def(
          "step",
          [](PySgd& o, GraphBox& g, pyb::handle lr) {
            Graph& gr = g.graph();
            const float rate = lr_arg(lr);  // read while holding the GIL
            pyb::gil_scoped_release nogil;
            o.opt->step(gr, rate);
          },
          pyb::arg("graph"), pyb::arg("lr") = pyb::none(),
          "One update: buf = momentum * buf + (grad + weight_decay * p); p -= lr * buf.");

  m.def(
      "clip_grad_norm",
      [](GraphBox& g, double max_norm) {
        Graph& gr = g.graph();
        pyb::gil_scoped_release nogil;
        return clip_grad_norm(gr, max_norm);
      },
      pyb::arg("graph"), pyb::arg("max_norm"),
      "Scales every parameter gradient of graph so their global L2 norm is at most max_norm; returns the "
      "norm "
      "before clipping (a non-finite norm is returned and nothing is scaled).");
  m.def("cosine_lr", &cosine_lr, pyb::arg("step"), pyb::arg("warmup"), pyb::arg("total"), pyb::arg("lr_max"),
        pyb::arg("lr_min") = 0.0f,
        "Linear warmup from 0 to lr_max over warmup steps, then cosine decay to lr_min at total steps.");
}

}  // namespace retort::py
