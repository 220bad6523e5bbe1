// OpArgs: the operands of one graph op built from Python (ops.cpp, loss_binding.cpp), and the LossOutputs of
// a loss node as a namedtuple of Tensors.
#pragma once
#include <memory>
#include <vector>

#include "common.h"

namespace retort::py {

// The operands of one op: tensors on one backend (arrays and numbers become leaves there), and the fresh
// context the result goes into, which keeps the operands' contexts alive.
class OpArgs {
 public:
  OpArgs(const char* op, const std::vector<pyb::handle>& operands) : op_(op) {
    for (pyb::handle h : operands)
      if (!h.is_none() && !be_) be_ = backend_of(h);
    if (!be_) be_ = cpu_backend(0);
    ctx_ = std::make_shared<PyCtx>(be_);
  }
  // Operand obj as a tensor (null for None when optional).
  Tensor* get(pyb::handle obj, const char* role, bool optional = false) {
    if (obj.is_none()) {
      RT_CHECK(optional, op_, ": ", role, " is required, got None");
      return nullptr;
    }
    TensorRef r;
    if (pyb::isinstance<TensorRef>(obj)) {
      r = obj.cast<TensorRef>();
      RT_CHECK(r.ctx->backend_ref()->backend == be_->backend, op_, ": ", role, " ", r.t->describe(),
               " lives on ", r.t->backend().name(), " but the other operands on ", be_->name(),
               "; copy it with Tensor.to(backend)");
    } else if (pyb::isinstance<pyb::float_>(obj) || pyb::isinstance<pyb::int_>(obj)) {
      r = to_tensor(pyb::float_(obj.cast<double>()), be_, DType::F32, role);  // numbers join float math
    } else {
      r = to_tensor(obj, be_, std::nullopt, role);
    }
    ctx_->depend_on(r.ctx);
    ndims_.push_back(py_ndim(r));
    return r.t;
  }
  int ndim(size_t i) const { return ndims_.at(i); }
  Context& ctx() { return *ctx_; }
  TensorRef out(Tensor* t, int ndim) { return make_ref(t, ndim); }
  const char* op() const { return op_; }

 private:
  const char* op_;
  BackendPtr be_;
  std::shared_ptr<PyCtx> ctx_;
  std::vector<int> ndims_;
};

// The LossOutputs of a loss node as a retort.ops.LossOutputs namedtuple of Tensors (None where not asked
// for).
inline pyb::object loss_tuple(OpArgs& args, const LossOutputs& o, Reduction red) {
  pyb::object cls = pyb::module_::import("retort").attr("ops").attr("LossOutputs");
  const int loss_nd = red == Reduction::None ? 1 : 0;
  auto t = [&](Tensor* x, int nd) -> pyb::object { return x ? pyb::cast(args.out(x, nd)) : pyb::none(); };
  return cls(t(o.loss, loss_nd), t(o.per_row, 1), t(o.lse, 1), t(o.hard, loss_nd), t(o.soft, loss_nd));
}

}  // namespace retort::py
