// Elementwise ops on the device: binary with broadcasting of src[1] over src[0], unary maps, and the
// activation gradients. One thread per output element (grid-stride), f32 math, any dtype and strides in and
// out.
#include "cuda_common.cuh"

namespace retort::cuda {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluC = 0.044715f;

__device__ __forceinline__ float sigmoid_f(float x) {
  return 1.0f / (1.0f + expf(-x));
}
__device__ __forceinline__ float gelu_f(float x) {
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kGeluC * x * x * x)));
}
__device__ __forceinline__ float gelu_grad(float x) {
  float u = kSqrt2OverPi * (x + kGeluC * x * x * x);
  float th = tanhf(u);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kSqrt2OverPi * (1.0f + 3.0f * kGeluC * x * x);
}

// Binary functors f(a, b).
struct FAdd {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct FSub {
  __device__ float operator()(float a, float b) const { return a - b; }
};
struct FMul {
  __device__ float operator()(float a, float b) const { return a * b; }
};
struct FDiv {
  __device__ float operator()(float a, float b) const { return a / b; }
};
// Activation gradients f(grad, x).
struct FReluBack {
  __device__ float operator()(float g, float x) const { return x > 0.0f ? g : 0.0f; }
};
struct FGeluBack {
  __device__ float operator()(float g, float x) const { return g * gelu_grad(x); }
};
struct FSiluBack {
  __device__ float operator()(float g, float x) const {
    float s = sigmoid_f(x);
    return g * s * (1.0f + x * (1.0f - s));
  }
};

// Unary functors f(x); s is the op's float parameter (used by scale).
struct FScale {
  float s;
  __device__ float operator()(float x) const { return x * s; }
};
struct FNeg {
  __device__ float operator()(float x) const { return -x; }
};
struct FExp {
  __device__ float operator()(float x) const { return expf(x); }
};
struct FLog {
  __device__ float operator()(float x) const { return logf(x); }
};
struct FSqrt {
  __device__ float operator()(float x) const { return sqrtf(x); }
};
struct FRsqrt {
  // 1 / sqrt rather than rsqrtf: rsqrtf is an approximation (2 ulp) and the CPU computes 1 / sqrt.
  __device__ float operator()(float x) const { return 1.0f / sqrtf(x); }
};
struct FTanh {
  __device__ float operator()(float x) const { return tanhf(x); }
};
struct FRelu {
  __device__ float operator()(float x) const { return x > 0.0f ? x : 0.0f; }
};
struct FGelu {
  __device__ float operator()(float x) const { return gelu_f(x); }
};
struct FSilu {
  __device__ float operator()(float x) const { return x * sigmoid_f(x); }
};

template <typename F>
__global__ void binary_kernel(TDesc out, TDesc a, TDesc b, int64_t n, F f) {
  RT_GRID_LOOP(i, n) {
    int64_t c[4];
    unravel(i, out.ne, c);
    float x = load_f(at(a, c), a.dtype);
    float y = load_f(at_bcast(b, c), b.dtype);
    store_f(at(out, c), out.dtype, f(x, y));
  }
}

// Contiguous operands (the common case in a model's graph): flat indices, no per-element unravel, 8 at a
// time where the operands align (flat_groups). b is read at i % bmod: bmod = n (same shape), ne0 (a row
// broadcast over the rows, a multiple of 8 on the 8-wide path) or 1 (a scalar).
template <int W, typename F>
__global__ void binary_flat_kernel(char* out, DType ot, const char* a, DType at_, const char* b, DType bt, int64_t n,
                                   int64_t bmod, F f) {
  const int os = dtype_size_dev(ot), as = dtype_size_dev(at_), bs = dtype_size_dev(bt);
  flat_groups<W>(n, [&]<int V>(int64_t i) {
    float x[V], y[V];
    load_w<V>(a, i, as, at_, x);
    if (bmod == 1) {
      const float b0 = load_f(b, bt);
#pragma unroll
      for (int k = 0; k < V; ++k) y[k] = b0;
    } else {
      load_w<V>(b, bmod == n ? i : i % bmod, bs, bt, y);
    }
#pragma unroll
    for (int k = 0; k < V; ++k) x[k] = f(x[k], y[k]);
    store_w<V>(out, i, os, ot, x);
  });
}

template <int W, typename F>
__global__ void unary_flat_kernel(char* out, DType ot, const char* a, DType at_, int64_t n, F f) {
  const int os = dtype_size_dev(ot), as = dtype_size_dev(at_);
  flat_groups<W>(n, [&]<int V>(int64_t i) {
    float x[V];
    load_w<V>(a, i, as, at_, x);
#pragma unroll
    for (int k = 0; k < V; ++k) x[k] = f(x[k]);
    store_w<V>(out, i, os, ot, x);
  });
}

template <typename F>
__global__ void unary_kernel(TDesc out, TDesc a, int64_t n, F f) {
  RT_GRID_LOOP(i, n) {
    int64_t c[4];
    unravel(i, out.ne, c);
    store_f(at(out, c), out.dtype, f(load_f(at(a, c), a.dtype)));
  }
}

template <typename F>
void launch_binary(CudaExec& ex, Tensor* t, F f) {
  const Tensor* a = t->src[0];
  const Tensor* b = t->src[1];
  RT_CHECK(is_float(a->dtype) && is_float(b->dtype) && same_shape(a, t) && can_broadcast(b, t), "cuda ",
           op_name(t->op), ": unexpected operands ", a->describe(), " and ", b->describe(), " for ",
           t->describe());
  int64_t n = t->nelements();
  if (t->is_contiguous() && a->is_contiguous() && b->is_contiguous()) {
    const int64_t nb = b->nelements();
    // b's elements line up with out's flat index modulo nb when b is all of out, one row of it, or one value.
    const bool flat = nb == n || nb == 1 || (nb == t->ne[0] && b->ne[0] == t->ne[0]);
    if (flat) {
      const bool v8 = aligned16(t->data) && aligned16(a->data) && aligned16(b->data) &&
                      (nb == n || nb == 1 || nb % 8 == 0);
      auto launch = [&]<int W>() {
        binary_flat_kernel<W><<<ex.grid_for((n + W - 1) / W, kBlock), kBlock, 0, ex.stream>>>(
            static_cast<char*>(t->data), t->dtype, static_cast<const char*>(a->data), a->dtype,
            static_cast<const char*>(b->data), b->dtype, n, nb, f);
      };
      v8 ? launch.template operator()<8>() : launch.template operator()<1>();
      RT_CUDA_LAUNCH_CHECK("binary_flat_kernel");
      return;
    }
  }
  binary_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(desc(t), desc(a), desc(b), n, f);
  RT_CUDA_LAUNCH_CHECK("binary_kernel");
}

template <typename F>
void launch_unary(CudaExec& ex, Tensor* t, F f) {
  const Tensor* a = t->src[0];
  RT_CHECK(is_float(a->dtype) && same_shape(a, t), "cuda ", op_name(t->op), ": unexpected operand ",
           a->describe(), " for ", t->describe());
  int64_t n = t->nelements();
  if (t->is_contiguous() && a->is_contiguous()) {
    auto launch = [&]<int W>() {
      unary_flat_kernel<W><<<ex.grid_for((n + W - 1) / W, kBlock), kBlock, 0, ex.stream>>>(
          static_cast<char*>(t->data), t->dtype, static_cast<const char*>(a->data), a->dtype, n, f);
    };
    aligned16(t->data) && aligned16(a->data) ? launch.template operator()<8>() : launch.template operator()<1>();
    RT_CUDA_LAUNCH_CHECK("unary_flat_kernel");
    return;
  }
  unary_kernel<<<ex.grid_for(n, kBlock), kBlock, 0, ex.stream>>>(desc(t), desc(a), n, f);
  RT_CUDA_LAUNCH_CHECK("unary_kernel");
}

void add_l(CudaExec& ex, Tensor* t) {
  launch_binary(ex, t, FAdd{});
}
void sub_l(CudaExec& ex, Tensor* t) {
  launch_binary(ex, t, FSub{});
}
void mul_l(CudaExec& ex, Tensor* t) {
  launch_binary(ex, t, FMul{});
}
void div_l(CudaExec& ex, Tensor* t) {
  launch_binary(ex, t, FDiv{});
}
void relu_back_l(CudaExec& ex, Tensor* t) {
  launch_binary(ex, t, FReluBack{});
}
void gelu_back_l(CudaExec& ex, Tensor* t) {
  launch_binary(ex, t, FGeluBack{});
}
void silu_back_l(CudaExec& ex, Tensor* t) {
  launch_binary(ex, t, FSiluBack{});
}
void scale_l(CudaExec& ex, Tensor* t) {
  launch_unary(ex, t, FScale{t->fp[0]});
}
void neg_l(CudaExec& ex, Tensor* t) {
  launch_unary(ex, t, FNeg{});
}
void exp_l(CudaExec& ex, Tensor* t) {
  launch_unary(ex, t, FExp{});
}
void log_l(CudaExec& ex, Tensor* t) {
  launch_unary(ex, t, FLog{});
}
void sqrt_l(CudaExec& ex, Tensor* t) {
  launch_unary(ex, t, FSqrt{});
}
void rsqrt_l(CudaExec& ex, Tensor* t) {
  launch_unary(ex, t, FRsqrt{});
}
void tanh_l(CudaExec& ex, Tensor* t) {
  launch_unary(ex, t, FTanh{});
}
void relu_l(CudaExec& ex, Tensor* t) {
  launch_unary(ex, t, FRelu{});
}
void gelu_l(CudaExec& ex, Tensor* t) {
  launch_unary(ex, t, FGelu{});
}
void silu_l(CudaExec& ex, Tensor* t) {
  launch_unary(ex, t, FSilu{});
}

}  // namespace

void register_cuda_elementwise_ops(CudaOpTable& t) {
  t[size_t(Op::Add)] = add_l;
  t[size_t(Op::Sub)] = sub_l;
  t[size_t(Op::Mul)] = mul_l;
  t[size_t(Op::Div)] = div_l;
  t[size_t(Op::Scale)] = scale_l;
  t[size_t(Op::Neg)] = neg_l;
  t[size_t(Op::Exp)] = exp_l;
  t[size_t(Op::Log)] = log_l;
  t[size_t(Op::Sqrt)] = sqrt_l;
  t[size_t(Op::Rsqrt)] = rsqrt_l;
  t[size_t(Op::Tanh)] = tanh_l;
  t[size_t(Op::Relu)] = relu_l;
  t[size_t(Op::Gelu)] = gelu_l;
  t[size_t(Op::Silu)] = silu_l;
  t[size_t(Op::ReluBack)] = relu_back_l;
  t[size_t(Op::GeluBack)] = gelu_back_l;
  t[size_t(Op::SiluBack)] = silu_back_l;
}

}  // namespace retort::cuda
