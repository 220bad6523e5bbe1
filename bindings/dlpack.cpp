// DLPack both ways, without copies: import any producer's tensor as a retort leaf, export retort tensors as
// capsules. The structs below follow the DLPack specification (dlpack.h, ABI versions 0.x and 1.x); they are
// declared here because the header is not a dependency of retort.
#include <cstring>

#include "common.h"

namespace retort::py {

namespace {

// ---- the DLPack ABI ---------------------------------------------------------------------------------------

enum DLDeviceType : int32_t { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 };
enum DLDataTypeCode : uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6 };

struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null means compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr uint64_t kDLFlagReadOnly = 1u << 0;
constexpr uint64_t kDLFlagIsCopied = 1u << 1;
constexpr uint32_t kDLPackMajor = 1, kDLPackMinor = 0;

const char* const kLegacyName = "dltensor";
const char* const kLegacyUsed = "used_dltensor";
const char* const kVersionedName = "dltensor_versioned";
const char* const kVersionedUsed = "used_dltensor_versioned";

// ---- import -----------------------------------------------------------------------------------------------

std::optional<DType> dtype_of(DLDataType t) {
  if (t.lanes != 1) return std::nullopt;
  if (t.code == kDLFloat && t.bits == 32) return DType::F32;
  if (t.code == kDLFloat && t.bits == 16) return DType::F16;
  if (t.code == kDLBfloat && t.bits == 16) return DType::BF16;
  if (t.code == kDLInt && t.bits == 32) return DType::I32;
  if (t.code == kDLInt && t.bits == 64) return DType::I64;
  return std::nullopt;
}

std::string describe_dl(DLDataType t) {
  const char* kind = t.code == kDLInt      ? "int"
                     : t.code == kDLUInt   ? "uint"
                     : t.code == kDLFloat  ? "float"
                     : t.code == kDLBfloat ? "bfloat"
                     : t.code == kDLBool   ? "bool"
                                           : "code ";
  std::string s = kind + std::to_string(t.code == kDLInt || t.code == kDLUInt || t.code == kDLFloat ||
                                                t.code == kDLBfloat || t.code == kDLBool
                                            ? int(t.bits)
                                            : int(t.code));
  if (t.lanes != 1) s += "x" + std::to_string(t.lanes);
  return s;
}

// Calls the producer's __dlpack__, asking for a versioned capsule first (DLPack 1.x) and falling back to the
// legacy call for producers that do not take max_version.
pyb::object request_capsule(pyb::handle obj, pyb::object stream) {
  if (PyCapsule_CheckExact(obj.ptr())) return pyb::reinterpret_borrow<pyb::object>(obj);
  pyb::object fn = obj.attr("__dlpack__");
  try {
    return fn(pyb::arg("stream") = stream,
              pyb::arg("max_version") = pyb::make_tuple(kDLPackMajor, kDLPackMinor));
  } catch (pyb::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
  }
  if (stream.is_none()) return fn();
  return fn(pyb::arg("stream") = stream);
}

// Calls a producer's deleter with the GIL (NumPy's releases a Python reference). Device memory goes back only
// once the kernels queued on be so far have run (after_queued: an event, no host wait), so the producer may
// reuse it at once; host memory, read synchronously, at once.
template <class Managed>
std::shared_ptr<void> producer_owner(Managed* m, std::shared_ptr<Backend> be) {
  auto give_back = [](Managed* mt) {
    if (!mt->deleter || !Py_IsInitialized()) return;
    pyb::gil_scoped_acquire gil;
    mt->deleter(mt);
  };
  return std::shared_ptr<void>(m, [be = std::move(be), give_back](void* p) {
    auto* mt = static_cast<Managed*>(p);
    if (be) {
      try {
        be->after_queued([mt, give_back] { give_back(mt); });
        return;
      } catch (const std::exception&) {
        // The device failed for good (a sticky CUDA error): nothing will read the memory any more.
      }
    }
    give_back(mt);
  });
}

// Copies a host tensor with arbitrary (also negative) element strides into contiguous storage.
void gather_host(const char* base, int ndim, const int64_t* shape, const int64_t* strides, size_t es,
                 char* out) {
  std::vector<int64_t> idx(size_t(ndim), 0);
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  for (int64_t k = 0; k < n; ++k) {
    int64_t off = 0;
    for (int i = 0; i < ndim; ++i) off += idx[size_t(i)] * strides[i];
    std::memcpy(out + size_t(k) * es, base + off * int64_t(es), es);
    for (int i = ndim - 1; i >= 0; --i) {
      if (++idx[size_t(i)] < shape[i]) break;
      idx[size_t(i)] = 0;
    }
  }
}

}  // namespace

TensorRef from_dlpack(pyb::handle obj, BackendPtr be, const std::string& name, std::shared_ptr<PyCtx> ctx) {
  const char* what = "from_dlpack";
  if (ctx) be = ctx->backend_ref();
  // Where the producer's memory is decides the backend that wraps it; be, if different, gets a copy.
  int dev_type = kDLCPU, dev_id = 0;
  if (!PyCapsule_CheckExact(obj.ptr())) {
    RT_CHECK(pyb::hasattr(obj, "__dlpack__"), what, ": ",
             std::string(pyb::str(pyb::type::handle_of(obj).attr("__name__"))),
             " has no __dlpack__ method (pass a PyTorch, CuPy, JAX or NumPy array, or a DLPack capsule)");
    if (pyb::hasattr(obj, "__dlpack_device__")) {
      pyb::tuple dev = obj.attr("__dlpack_device__")();
      dev_type = dev[0].cast<int>();
      dev_id = dev[1].cast<int>();
    }
  }
  const bool on_device = dev_type == kDLCUDA || dev_type == kDLCUDAManaged;
  RT_CHECK(on_device || dev_type == kDLCPU || dev_type == kDLCUDAHost, what, ": DLPack device type ",
           dev_type, " is not supported (retort reads CPU and CUDA memory)");
  BackendPtr home = on_device ? cuda_backend(dev_id) : cpu_backend(0);

  // The producer makes its pending writes visible to the stream we run on (host memory needs no stream).
  pyb::object stream = pyb::none();
  if (on_device) {
    void* s = home->backend->stream_handle();
    // Without a handle, the legacy default stream (1); the CUDA backend should expose its stream.
    stream = s ? pyb::int_(reinterpret_cast<uintptr_t>(s)) : pyb::int_(1);
  }
  pyb::object cap = request_capsule(obj, stream);

  // Take ownership: rename the capsule so its destructor leaves the tensor to us, and give it back to the
  // producer when the last retort owner lets go and no queued kernel reads it.
  DLTensor* dl = nullptr;
  std::shared_ptr<void> owner;
  bool read_only = false;
  std::shared_ptr<Backend> reader = on_device ? home->backend : nullptr;
  if (PyCapsule_IsValid(cap.ptr(), kVersionedName)) {
    auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap.ptr(), kVersionedName));
    PyCapsule_SetName(cap.ptr(), kVersionedUsed);
    owner = producer_owner(m, reader);
    RT_CHECK(m->version.major == kDLPackMajor, what, ": the producer speaks DLPack ", m->version.major, ".",
             m->version.minor, "; retort reads 1.x");
    dl = &m->dl_tensor;
    read_only = (m->flags & kDLFlagReadOnly) != 0;
  } else if (PyCapsule_IsValid(cap.ptr(), kLegacyName)) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), kLegacyName));
    PyCapsule_SetName(cap.ptr(), kLegacyUsed);
    owner = producer_owner(m, reader);
    dl = &m->dl_tensor;
  } else {
    RT_FAIL(what, ": not a DLPack capsule, or one that was already consumed");
  }

  const std::optional<DType> dt = dtype_of(dl->dtype);
  RT_CHECK(dt.has_value(), what, ": DLPack dtype ", describe_dl(dl->dtype),
           " is not supported (retort has f32, bf16, f16, i32 and i64)");
  RT_CHECK(dl->ndim >= 0 && dl->ndim <= kMaxDims, what, ": retort tensors have at most 4 dims, got ",
           dl->ndim);
  RT_CHECK(dl->device.device_type == dev_type || PyCapsule_CheckExact(obj.ptr()), what,
           ": the capsule's device does not match __dlpack_device__");
  if (PyCapsule_CheckExact(obj.ptr())) {  // a bare capsule: its tensor says where it lives
    dev_type = dl->device.device_type;
    RT_CHECK(
        dev_type == kDLCPU || dev_type == kDLCUDAHost, what,
        ": a bare capsule must hold host memory; pass the device array itself so its stream is honoured");
  }
  const size_t es = dtype_size(*dt);
  Shape shape;
  std::vector<int64_t> elem_strides(size_t(dl->ndim));
  int64_t expect = 1;
  bool negative = false;
  for (int i = dl->ndim - 1; i >= 0; --i) {
    const int64_t n = dl->shape[i];
    RT_CHECK(n >= 1, what, ": retort tensors have no empty dims, got size ", n, " at dim ", i);
    elem_strides[size_t(i)] = dl->strides ? dl->strides[i] : expect;
    if (n == 1) elem_strides[size_t(i)] = expect;  // any stride is valid for a single index
    negative = negative || elem_strides[size_t(i)] < 0;
    expect *= n;
  }
  for (int i = 0; i < dl->ndim; ++i) shape.push_back(dl->shape[i]);
  if (shape.empty()) shape.push_back(1);
  char* data = static_cast<char*>(dl->data) + dl->byte_offset;

  std::shared_ptr<PyCtx> target = (!be || be->backend == home->backend) && ctx ? ctx : nullptr;
  auto local = target ? target : std::make_shared<PyCtx>(home);
  Tensor* t;
  if (negative || read_only) {
    // Reversed views cannot be expressed with retort's unsigned strides, and read-only memory must not
    // become a writable leaf: copy (on the host only; a device producer can make it contiguous itself).
    RT_CHECK(!on_device, what, ": a CUDA tensor with ", negative ? "negative strides" : "the read-only flag",
             " cannot be wrapped; pass a contiguous copy");
    t = local->tensor(*dt, shape, name);
    gather_host(data, dl->ndim, dl->shape, elem_strides.data(), es, static_cast<char*>(t->data));
  } else {
    std::vector<size_t> byte_strides;
    for (int64_t s : elem_strides) byte_strides.push_back(size_t(s) * es);
    if (dl->ndim == 0) byte_strides.clear();
    t = local->wrap(*dt, shape, data, owner, byte_strides, name);
  }
  TensorRef r = make_ref(t, dl->ndim);
  if (be && be->backend != home->backend) return copy_to(r, be, ctx);
  return r;
}

// ---- export -----------------------------------------------------------------------------------------------

namespace {

// What an exported capsule owns: the shape and strides arrays it points at, and what keeps the data alive.
// When the consumer lets go, its reads may still be queued on the stream it named: our later work (which may
// reuse the memory) waits for them.
struct ExportHolder {
  std::vector<int64_t> shape, strides;
  std::shared_ptr<PyCtx> ctx;
  std::shared_ptr<GraphBox> graph;
  void* consumer = nullptr;  // the consumer's stream, or null (host memory, or stream=-1)
  DLManagedTensor legacy{};
  DLManagedTensorVersioned versioned{};
  ~ExportHolder() {
    if (!consumer) return;
    try {
      ctx->backend_ref()->backend->wait_for(consumer);
    } catch (const std::exception&) {
      // A sticky device error: no later work will run to touch the memory.
    }
  }
};

// Consumers may call these on any thread, with or without the GIL; nothing here touches Python directly
// (owners that do take the GIL themselves).
void delete_legacy(DLManagedTensor* self) {
  std::unique_ptr<ExportHolder>(static_cast<ExportHolder*>(self->manager_ctx));
}
void delete_versioned(DLManagedTensorVersioned* self) {
  std::unique_ptr<ExportHolder>(static_cast<ExportHolder*>(self->manager_ctx));
}

// A capsule nobody consumed still owns its tensor.
void legacy_capsule_destructor(PyObject* cap) {
  if (!PyCapsule_IsValid(cap, kLegacyName)) return;  // renamed: the consumer owns it now
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, kLegacyName));
  if (m && m->deleter) m->deleter(m);
}
void versioned_capsule_destructor(PyObject* cap) {
  if (!PyCapsule_IsValid(cap, kVersionedName)) return;
  auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, kVersionedName));
  if (m && m->deleter) m->deleter(m);
}

DLDataType dl_dtype(DType d) {
  switch (d) {
    case DType::F32:
      return {kDLFloat, 32, 1};
    case DType::F16:
      return {kDLFloat, 16, 1};
    case DType::BF16:
      return {kDLBfloat, 16, 1};
    case DType::I32:
      return {kDLInt, 32, 1};
    case DType::I64:
      return {kDLInt, 64, 1};
  }
  return {kDLFloat, 32, 1};
}

}  // namespace

// The consumer's stream from __dlpack__(stream=...), as the array API standard defines it for CUDA: None is
// the legacy default stream, 1 the legacy default stream, 2 the per-thread default stream, a larger integer a
// cudaStream_t, and -1 no synchronization at all (returned as null); 0 is ambiguous and refused. Memory
// without streams (the host) takes None only.
void* consumer_stream(pyb::handle stream, bool device) {
  if (!stream.is_none() && (!pyb::isinstance<pyb::int_>(stream) || pyb::isinstance<pyb::bool_>(stream)))
    throw pyb::type_error("__dlpack__: stream must be an int or None, got " +
                          std::string(pyb::str(pyb::type::handle_of(stream).attr("__name__"))));
  if (!device) {
    RT_CHECK(stream.is_none(), "__dlpack__: a host tensor takes stream=None (the host has no streams), got ",
             std::string(pyb::repr(stream)));
    return nullptr;
  }
  if (stream.is_none()) return reinterpret_cast<void*>(uintptr_t(1));
  int64_t s = 0;
  try {
    s = stream.cast<int64_t>();
  } catch (const pyb::cast_error&) {
    RT_FAIL("__dlpack__: stream ", std::string(pyb::repr(stream)), " is not a CUDA stream handle");
  }
  RT_CHECK(s >= -1 && s != 0, "__dlpack__: stream ", s,
           " is not a CUDA stream (expected -1: no synchronization, 1: the legacy default stream, 2: the ",
           "per-thread default stream, or a cudaStream_t; 0 is ambiguous and disallowed)");
  return s == -1 ? nullptr : reinterpret_cast<void*>(uintptr_t(s));
}

pyb::tuple dlpack_device(const TensorRef& r) {
  const BackendRef& b = *r.ctx->backend_ref();
  if (b.is_cuda()) return pyb::make_tuple(int(kDLCUDA), b.device);
  return pyb::make_tuple(int(kDLCPU), 0);
}

pyb::object to_dlpack(const TensorRef& r0, pyb::handle stream, pyb::handle max_version, pyb::handle dl_device,
                      pyb::handle copy) {
  TensorRef r = r0;
  const bool want_copy = !copy.is_none() && copy.cast<bool>();
  if (!dl_device.is_none()) {
    pyb::tuple want = pyb::reinterpret_borrow<pyb::tuple>(dl_device);
    pyb::tuple have = dlpack_device(r);
    if (want[0].cast<int>() != have[0].cast<int>() || want[1].cast<int>() != have[1].cast<int>())
      throw pyb::buffer_error("__dlpack__: retort exports on its own device only (" + r.t->backend().name() +
                              "); copy with Tensor.to(backend) first");
  }
  Backend& be = *r.ctx->backend_ref()->backend;
  void* consumer = consumer_stream(stream, !be.is_host());
  be.poll_errors();  // a fault that earlier work recorded is reported here rather than handed on as values
  if (want_copy) r = copy_to(r, nullptr);
  std::shared_ptr<GraphBox> g = value_owner(r, "__dlpack__");
  const Tensor* t = r.t;
  RT_CHECK(t->data != nullptr, "__dlpack__: ", t->describe(), " has no storage");
  // The consumer's stream waits for the work that writes the value (an event, no host wait).
  if (consumer && consumer != be.stream_handle()) be.make_wait(consumer);

  auto h = std::make_unique<ExportHolder>();
  h->ctx = r.ctx;
  h->graph = g;
  h->consumer = consumer != be.stream_handle() ? consumer : nullptr;
  h->shape = py_shape(r);
  const int ndim = int(h->shape.size());
  for (int i = 0; i < ndim; ++i) {
    const int d = ndim - 1 - i;
    h->strides.push_back(d < kMaxDims ? int64_t(t->nb[d] / t->elsize()) : 1);
  }
  DLTensor dl{};
  dl.data = t->data;
  const pyb::tuple dev = dlpack_device(r);
  dl.device = {dev[0].cast<int32_t>(), dev[1].cast<int32_t>()};
  dl.ndim = ndim;
  dl.dtype = dl_dtype(t->dtype);
  dl.shape = h->shape.empty() ? nullptr : h->shape.data();
  dl.strides = h->strides.empty() ? nullptr : h->strides.data();
  dl.byte_offset = 0;

  bool versioned = false;
  if (!max_version.is_none()) {
    pyb::tuple mv = pyb::reinterpret_borrow<pyb::tuple>(max_version);
    versioned = mv.size() >= 1 && mv[0].cast<int>() >= int(kDLPackMajor);
  }
  ExportHolder* raw = h.get();
  if (versioned) {
    raw->versioned.version = {kDLPackMajor, kDLPackMinor};
    raw->versioned.manager_ctx = raw;
    raw->versioned.deleter = &delete_versioned;
    raw->versioned.flags = want_copy ? kDLFlagIsCopied : 0;
    raw->versioned.dl_tensor = dl;
    PyObject* cap = PyCapsule_New(&raw->versioned, kVersionedName, &versioned_capsule_destructor);
    if (!cap) throw pyb::error_already_set();
    h.release();  // the capsule owns it now
    return pyb::reinterpret_steal<pyb::object>(cap);
  }
  raw->legacy.dl_tensor = dl;
  raw->legacy.manager_ctx = raw;
  raw->legacy.deleter = &delete_legacy;
  PyObject* cap = PyCapsule_New(&raw->legacy, kLegacyName, &legacy_capsule_destructor);
  if (!cap) throw pyb::error_already_set();
  h.release();
  return pyb::reinterpret_steal<pyb::object>(cap);
}

}  // namespace retort::py
