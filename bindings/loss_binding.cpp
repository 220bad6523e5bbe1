// def_loss: a LossSpec as retort.losses.<name> and retort.ops.<name> (see loss_binding.h).
#include "loss_binding.h"

#include <list>
#include <memory>

#include "loss_call.h"
#include "op_args.h"

namespace retort::py {

namespace {

const char* const kPlainResults =
    "\n\nInputs are NumPy arrays, DLPack producers (PyTorch, CuPy, JAX: CUDA tensors are used in place on "
    "retort.cuda(device)) or retort Tensors; backend overrides where the call runs. Returns the loss; with "
    "return_grad or any return_* flag, a LossResult(loss, grad, per_row, lse, hard, soft) with None for what "
    "was not asked for. grad is d(loss)/d(logits), written by the loss's own pass (no [N, V] f32 temporary) "
    "in grad_dtype (default: the logits' dtype; 'f32' for full precision); inplace_grad writes it over the "
    "logits themselves and returns them as grad (they must be usable without a copy: contiguous, writable, "
    "on the device the call runs on). Results are NumPy arrays on the CPU and retort Tensors (use DLPack) on "
    "a device. Raises retort.Error (a ValueError) naming the op on bad shapes, dtypes, options, or a "
    "label/id "
    "out of range; TypeError on an unknown keyword or a value of the wrong type.";

const char* const kFusedInputs =
    "\n\nhidden is [N, H], weight [V, H] (one row per vocabulary entry, like nn.Linear), bias [V]; f32, bf16 "
    "or f16. logits_budget bounds the chunk's logits in bytes (0, the default: an eighth of the backend's "
    "free memory, 32 MiB to 1 GiB on a GPU, to 256 MiB on the CPU; chunk_rows > 0 fixes the chunk instead); "
    "grad_hidden / grad_weight / grad_bias switch single gradients off. logits_dtype: the chunk logits' "
    "dtype "
    "(default: the inputs' when hidden and weight share a 16-bit dtype, else f32; a CUDA speed option, the "
    "CPU keeps f32 logits and with bf16 rounds only the logits gradient its gradient GEMMs read).";

const char* const kFusedResults =
    "\n\nInputs are NumPy arrays, DLPack producers or retort Tensors; backend overrides where the call runs. "
    "Returns the loss; with return_grad or any return_* flag, a LossResult(loss, grad_hidden, grad_weight, "
    "grad_bias, per_row, lse, hard, soft) with None for what was not asked for; each gradient in grad_dtype "
    "(default: its input's dtype; dW is accumulated in f32 and cast once). NumPy arrays on the CPU, retort "
    "Tensors on a device. Raises retort.Error naming the op on bad shapes, dtypes, options, or a label/id "
    "out "
    "of range; TypeError on an unknown keyword or a value of the wrong type.";

const char* const kValuesResults =
    "\n\nInputs are NumPy arrays, DLPack producers or retort Tensors; backend overrides where the call runs. "
    "Returns the values, f32 [N, K] (NumPy on the CPU, a retort Tensor on a device). With grad_output [N, K] "
    "(the gradient of some loss with respect to the values): a LossResult whose values field holds them, "
    "whose gradient fields hold the vector-Jacobian product (in grad_dtype, default each input's dtype) and "
    "whose loss is sum(values * grad_output). Raises retort.Error on bad shapes or an id outside [0, V); "
    "TypeError on an unknown keyword or a value of the wrong type.";

const char* const kNodeResults =
    "\n\nAs a graph node (retort.ops): the same inputs and options (retort Tensors, arrays or DLPack "
    "producers, all on one backend); returns the loss Tensor, or LossOutputs(loss, per_row, lse, hard, soft) "
    "of Tensors (None where not asked for) when a return_* option is set. Gradients flow through "
    "Graph.backward to whatever the inputs were computed from.";

std::string type_name(pyb::handle h) {
  return pyb::str(pyb::type::handle_of(h).attr("__name__"));
}

// The keywords of the plain call beside the loss's own options.
std::vector<Param> call_keywords(const LossSpec& s) {
  std::vector<Param> k;
  if (s.values)
    k.push_back({"grad_output", pyb::none()});
  else
    k.push_back({"return_grad", pyb::bool_(false)});
  k.push_back({"grad_dtype", pyb::none()});
  if (!s.fused && !s.values) k.push_back({"inplace_grad", pyb::bool_(false)});
  k.push_back({"backend", pyb::none()});
  return k;
}

// Inputs (positional ones first, as declared), then options, then (plain) the call keywords.
std::vector<Param> parameters(const LossSpec& s, bool plain) {
  std::vector<Param> p;
  for (const LossInput& in : s.inputs)
    p.push_back({in.name, in.optional ? pyb::object(pyb::none()) : pyb::object(), in.keyword_only});
  p.insert(p.end(), s.options.begin(), s.options.end());
  if (plain) {
    std::vector<Param> k = call_keywords(s);
    p.insert(p.end(), k.begin(), k.end());
  }
  return p;
}

// The signature as the first docstring line in the form inspect.signature reads ("name(...)\n--\n\n").
std::string signature(const char* name, const std::vector<Param>& params) {
  std::string s = std::string(name) + "(";
  bool star = false;
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = params[i];
    if (i) s += ", ";
    if (p.keyword_only && !star) {
      s += "*, ";
      star = true;
    }
    s += p.name;
    if (p.def) {
      s += '=';
      s += std::string(pyb::repr(p.def));
    }
  }
  return s + ")\n--\n\n";
}

std::vector<pyb::handle> handles(const LossSpec& s, const Bound& b, bool plain) {
  std::vector<pyb::handle> h;
  for (const LossInput& in : s.inputs) h.push_back(b[in.name]);
  if (plain && s.values) h.push_back(b["grad_output"]);
  return h;
}

// Hits and builds of every plain loss function's CallCache, for retort.losses._cache_stats().
struct CacheStats {
  size_t hits = 0, builds = 0;
};
CacheStats& cache_stats() {
  static CacheStats s;  // only touched with the GIL held
  return s;
}

// The last few plain calls of one loss function that may run again (LossCall::reusable), keyed by every
// option's value (its type and ==) and every input's layout: a repeated small call on the CPU then costs the
// argument checks and the kernels, not a graph build, a plan and an arena each time. Used with the GIL held;
// a call is taken out while it runs, so two threads never share one.
class CallCache {
 public:
  // At most this many calls per function, each holding at most kMaxBytes between calls: a call that needs
  // more runs kernels long enough to hide its build, and would keep its memory for nothing.
  static constexpr size_t kMaxCalls = 4;
  static constexpr size_t kMaxBytes = size_t(1) << 20;

  struct Entry {
    std::vector<pyb::object> options;  // Bound::values(), None where an input array was
    std::unique_ptr<LossCall> call;
  };

  // The entry that can run b, taken out of the cache; null when none can.
  std::unique_ptr<Entry> take(const Bound& b) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (matches(*it, b)) {
        auto e = std::make_unique<Entry>(std::move(*it));
        entries_.erase(it);
        return e;
      }
    return nullptr;
  }
  // Keeps a call that ran over b's arrays (it lets go of them), most recent first.
  void put(std::unique_ptr<LossCall> call, const Bound& b) {
    Entry e;
    for (const auto& [name, v] : b.values())
      e.options.push_back(call->has_input(name) ? pyb::object(pyb::none()) : v);
    call->release_inputs();
    e.call = std::move(call);
    put(std::move(e));
  }
  void put(Entry e) {
    entries_.push_front(std::move(e));
    if (entries_.size() > kMaxCalls) entries_.pop_back();
  }

 private:
  static bool matches(const Entry& e, const Bound& b) {
    const auto& v = b.values();
    for (size_t i = 0; i < v.size(); ++i) {
      const pyb::object& o = e.options[i];
      const pyb::handle h = v[i].second;
      if (o.ptr() == h.ptr()) continue;
      if (o.is_none() && e.call->has_input(v[i].first)) continue;  // an input array: same_inputs checks it
      if (Py_TYPE(o.ptr()) != Py_TYPE(h.ptr()) || !o.equal(h)) return false;
    }
    return e.call->same_inputs(b);
  }
  std::list<Entry> entries_;
};

// The plain call's graph, built for b and run once (call_plain without the cache).
pyb::object build_plain(const LossSpec& s, const Bound& b, LossCall& c) {
  c.set_grad_dtype(b["grad_dtype"]);
  const bool want = s.values ? !b["grad_output"].is_none() : b.flag("return_grad");
  const bool inplace = !s.fused && !s.values && b.flag("inplace_grad");
  const LossInput* row = nullptr;  // a row loss's input whose gradient the loss's own pass writes
  Operands t;
  for (const LossInput& in : s.inputs) {
    if (s.fused && in.grad) {
      // grad_hidden=False etc. switch one gradient off: the input is then a plain leaf.
      const bool on = want && b.flag(in.grad);
      t.add(in.name, c.student(b[in.name], in.name, on, in.grad, in.optional));
    } else {
      t.add(in.name, c.input(b[in.name], in.name, in.optional));
      if (in.grad) row = &in;
    }
  }
  BuiltLoss r = s.build(c.ctx(), t, b);
  if (s.values) {
    Tensor* v = r.out.loss;
    if (!want) return c.finish(v, Reduction::None);
    Tensor* go = c.input(b["grad_output"], "grad_output");
    if (s.fused) {
      RT_CHECK(go->ne[0] == v->ne[0] && go->ne[1] == v->ne[1] && is_float(go->dtype), s.op, ": grad_output ",
               go->describe(), " must be a float tensor shaped like the output ", v->describe());
    } else {
      Tensor* x = t(row->name);
      c.direct_grad("grad", selective_log_softmax_grad(c.ctx(), v, go, c.grad_dtype_or(x->dtype)), x);
    }
    c.set_values(v);
    // The gradients of sum(values * grad_output): the vector-Jacobian product with grad_output.
    return c.finish(sum(c.ctx(), mul(c.ctx(), v, go)), Reduction::Sum);
  }
  if (row && (want || inplace)) c.row_grad(r.out.loss, r.reduction, t(row->name), b[row->name], inplace);
  return c.finish(r.out.loss, r.reduction, r.out);
}

pyb::object call_plain(const LossSpec& s, const Bound& b, CallCache& cache) {
  if (std::unique_ptr<CallCache::Entry> e = cache.take(b)) {
    ++cache_stats().hits;
    pyb::object r = e->call->rerun(b);  // a call that throws is dropped
    cache.put(std::move(*e));
    return r;
  }
  static const std::vector<std::string> kFusedSlots = {"grad_hidden", "grad_weight", "grad_bias"};
  auto c = std::make_unique<LossCall>(s.op, handles(s, b, true), b["backend"],
                                      s.fused ? kFusedSlots : std::vector<std::string>{"grad"});
  pyb::object r = build_plain(s, b, *c);
  ++cache_stats().builds;
  if (c->reusable(CallCache::kMaxBytes)) cache.put(std::move(c), b);
  return r;
}

pyb::object call_node(const LossSpec& s, const Bound& b) {
  const std::vector<pyb::handle> h = handles(s, b, false);
  OpArgs a(s.name, h);
  Operands t;
  for (const LossInput& in : s.inputs) t.add(in.name, a.get(b[in.name], in.name, in.optional));
  BuiltLoss r = s.build(a.ctx(), t, b);
  const LossOutputs& o = r.out;
  if (o.per_row || o.lse || o.hard || o.soft) return loss_tuple(a, o, r.reduction);
  const int nd = s.values ? 2 : r.reduction == Reduction::None ? 1 : 0;
  return pyb::cast(a.out(o.loss, nd));
}

}  // namespace

Bound::Bound(std::string fn, const std::vector<Param>& params, const pyb::args& args,
             const pyb::kwargs& kwargs)
    : fn_(std::move(fn)) {
  size_t positional = 0;
  while (positional < params.size() && !params[positional].keyword_only) ++positional;
  if (args.size() > positional)
    throw pyb::type_error(fn_ + "() takes at most " + std::to_string(positional) + " positional arguments (" +
                          std::to_string(args.size()) + " given)");
  for (const Param& p : params) values_.push_back({p.name, pyb::object()});
  for (size_t i = 0; i < args.size(); ++i) values_[i].second = pyb::reinterpret_borrow<pyb::object>(args[i]);
  for (auto [key, value] : kwargs) {
    const std::string k = pyb::str(key);
    size_t i = 0;
    while (i < values_.size() && values_[i].first != k) ++i;
    if (i == values_.size()) throw pyb::type_error(fn_ + "() got an unexpected keyword argument '" + k + "'");
    if (values_[i].second) throw pyb::type_error(fn_ + "() got multiple values for argument '" + k + "'");
    values_[i].second = pyb::reinterpret_borrow<pyb::object>(value);
  }
  for (size_t i = 0; i < values_.size(); ++i) {
    if (values_[i].second) continue;
    if (!params[i].def) throw pyb::type_error(fn_ + "() missing required argument '" + params[i].name + "'");
    values_[i].second = params[i].def;
  }
}

pyb::handle Bound::operator[](const std::string& name) const {
  for (const auto& [n, v] : values_)
    if (n == name) return v;
  RT_ASSERT(false && "a loss binding asked for a parameter it does not declare");
  return pyb::none();
}

template <class T>
T Bound::get(const char* name, const char* what) const {
  pyb::handle h = (*this)[name];
  try {
    return h.cast<T>();
  } catch (const pyb::cast_error&) {
    // An int of the right kind but out of range (a negative size, one past int64) is a bad value, not a
    // bad type.
    RT_CHECK(!pyb::isinstance<pyb::int_>(h) || pyb::isinstance<pyb::bool_>(h), fn_, ": ", name, " = ",
             std::string(pyb::repr(h)), " is out of range: it must be ", what);
    throw pyb::type_error(fn_ + "(): " + name + " must be " + what + ", got " + type_name(h));
  }
}

float Bound::f32(const char* name) const {
  return get<float>(name, "a number");
}
int64_t Bound::i64(const char* name) const {
  return get<int64_t>(name, "an int");
}
size_t Bound::size(const char* name) const {
  return get<size_t>(name, "an int >= 0");
}
bool Bound::flag(const char* name) const {
  return get<bool>(name, "a bool");
}
std::string Bound::str(const char* name) const {
  return get<std::string>(name, "a str");
}

Tensor* Operands::operator()(const char* name) const {
  for (const auto& [n, t] : items_)
    if (n == name) return t;
  RT_ASSERT(false && "a loss builder asked for an input its spec does not declare");
  return nullptr;
}

void def_loss(pyb::module_& losses, pyb::module_& ops, LossSpec spec) {
  auto s = std::make_shared<const LossSpec>(std::move(spec));
  const std::string inputs = s->fused ? kFusedInputs : "";
  const char* results = s->values ? kValuesResults : s->fused ? kFusedResults : kPlainResults;
  // The signature is written into the docstring, where help() and inspect.signature read it.
  pyb::options opts;
  opts.disable_function_signatures();
  auto doc = [&](bool plain, const char* tail) {
    return signature(s->name, parameters(*s, plain)) + s->doc + inputs + tail;
  };
  auto cache = std::make_shared<CallCache>();
  losses.def(
      s->name,
      [s, params = parameters(*s, true), cache](const pyb::args& args, const pyb::kwargs& kwargs) {
        return call_plain(*s, Bound(s->name, params, args, kwargs), *cache);
      },
      doc(true, results).c_str());
  ops.def(
      s->name,
      [s, params = parameters(*s, false)](const pyb::args& args, const pyb::kwargs& kwargs) {
        return call_node(*s, Bound(s->name, params, args, kwargs));
      },
      doc(false, kNodeResults).c_str());
}

pyb::dict loss_cache_stats() {
  pyb::dict d;
  d["hits"] = cache_stats().hits;
  d["builds"] = cache_stats().builds;
  return d;
}

}  // namespace retort::py
