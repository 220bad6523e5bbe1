// One binding per loss: every loss of the loss backend is declared once, as a LossSpec (its inputs, its
// options with their defaults, how it builds its node), and def_loss makes from that one declaration both the
// plain function retort.losses.<name> and the graph node retort.ops.<name>, so their keywords and defaults
// cannot drift apart.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common.h"

namespace retort::py {

// A parameter of a binding. def: the default (a null object: required).
struct Param {
  std::string name;
  pyb::object def;
  bool keyword_only = true;
};

// The arguments of one call bound to the parameters as Python binds them (positional ones in order, the rest
// by keyword, defaults for what is missing). Throws TypeError, naming the function, for an unknown or
// repeated keyword, too many positional arguments, a missing required one, or a value of the wrong type.
class Bound {
 public:
  Bound(std::string fn, const std::vector<Param>& params, const pyb::args& args, const pyb::kwargs& kwargs);
  pyb::handle operator[](const std::string& name) const;
  float f32(const char* name) const;
  int64_t i64(const char* name) const;
  size_t size(const char* name) const;
  bool flag(const char* name) const;
  std::string str(const char* name) const;
  // Every parameter's value, in the declared order.
  const std::vector<std::pair<std::string, pyb::object>>& values() const { return values_; }

 private:
  template <class T>
  T get(const char* name, const char* what) const;
  std::string fn_;
  std::vector<std::pair<std::string, pyb::object>> values_;
};

// An input tensor of a loss: positional (keyword_only false) or keyword-only, optional or required. grad: the
// result slot its gradient goes into in the plain function ("grad" for a row loss's logits; "grad_hidden",
// "grad_weight", "grad_bias" for a fused loss's trainable inputs), null when it gets none.
struct LossInput {
  const char* name;
  bool optional = false;
  bool keyword_only = false;
  const char* grad = nullptr;
};

// The tensors of one call, by input name (null for an optional input left None).
class Operands {
 public:
  void add(const char* name, Tensor* t) { items_.push_back({name, t}); }
  Tensor* operator()(const char* name) const;

 private:
  std::vector<std::pair<std::string, Tensor*>> items_;
};

// What a loss's builder made: its outputs and how its loss is reduced.
struct BuiltLoss {
  LossOutputs out;
  Reduction reduction = Reduction::Mean;
};

// One loss, declared once.
struct LossSpec {
  const char* name;  // the Python name in retort.losses and retort.ops
  const char* op;    // the C++ op that names itself in errors
  std::vector<LossInput> inputs;
  std::vector<Param> options;  // keyword-only, in the order the signature shows
  // fused: gradients for hidden / weight / bias (FusedLinearOptions among the options); values: the output is
  // the loss's own [N, K] values and the plain function takes grad_output instead of return_grad.
  bool fused = false;
  bool values = false;
  std::function<BuiltLoss(Context&, const Operands&, const Bound&)> build;
  std::string doc;
};

// Defines spec as retort.losses.<name> (arrays in, results out, gradients on request) and retort.ops.<name>
// (a node: the loss Tensor, or LossOutputs when a return_* option is set).
void def_loss(pyb::module_& losses, pyb::module_& ops, LossSpec spec);

// How many plain loss calls ran a kept graph again (hits) and how many built one (builds), over every loss
// function of the process: retort.losses._cache_stats(), for tests.
pyb::dict loss_cache_stats();

}  // namespace retort::py
