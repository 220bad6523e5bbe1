// The Python module `retort`: dtypes, backends, the error type, and the submodules (ops, losses).
#include "common.h"

namespace retort::py {

namespace {

void bind_dtypes(pyb::module_& m) {
  pyb::enum_<DType> dt(m, "DType", "Element types: F32, BF16, F16, I32, I64 (also retort.float32, ...).");
  dt.value("F32", DType::F32)
      .value("BF16", DType::BF16)
      .value("F16", DType::F16)
      .value("I32", DType::I32)
      .value("I64", DType::I64);
  dt.def(
      "__str__", [](DType d) { return std::string(dtype_name(d)); }, "The short name: 'f32', 'bf16', ...");
  dt.def_property_readonly(
      "itemsize", [](DType d) { return dtype_size(d); }, "Bytes per element.");
  dt.def_property_readonly(
      "is_float", [](DType d) { return is_float(d); }, "True for f32, bf16 and f16.");
  m.attr("float32") = DType::F32;
  m.attr("bfloat16") = DType::BF16;
  m.attr("float16") = DType::F16;
  m.attr("int32") = DType::I32;
  m.attr("int64") = DType::I64;

  pyb::enum_<Reduction>(
      m, "Reduction",
      "How a loss reduces its rows: MEAN over the valid rows, SUM, or NONE (one value per row). "
      "Loss functions also take the strings 'mean', 'sum' and 'none'.")
      .value("MEAN", Reduction::Mean)
      .value("SUM", Reduction::Sum)
      .value("NONE", Reduction::None);
}

void bind_backends(pyb::module_& m) {
  pyb::class_<BackendRef, BackendPtr>(
      m, "Backend",
      "Where tensors live and ops run: the CPU (retort.cpu()) or a CUDA device "
      "(retort.cuda()).")
      .def_property_readonly("name", &BackendRef::name, "'cpu' or 'cuda:N'.")
      .def_property_readonly(
          "is_host", [](const BackendRef& b) { return b.backend->is_host(); },
          "True when tensor data are host addresses (the CPU backend).")
      .def_property_readonly(
          "device", [](const BackendRef& b) { return b.device; },
          "The CUDA device ordinal, or -1 for the CPU.")
      .def(
          "synchronize",
          [](const BackendRef& b) {
            pyb::gil_scoped_release nogil;
            b.backend->synchronize();
          },
          "Waits until all work queued on this backend has finished; raises retort.Error for a device-side "
          "fault (e.g. a label out of range) that no earlier call reported.")
      .def_property_readonly(
          "host_waits", [](const BackendRef& b) { return b.backend->host_waits(); },
          "How many times the host has waited for this backend (each synchronize() and each read of device "
          "memory into host memory); a loss call on a device adds none.")
      .def(
          "memory_stats",
          [](const BackendRef& b) {
            RT_CHECK(!b.backend->is_host(), "memory_stats: the CPU backend keeps no allocator statistics");
            const CudaMemoryStats s = cuda_memory_stats(*b.backend);
            pyb::dict d;
            d["current"] = s.bytes_in_use;
            d["peak"] = s.peak_bytes;
            d["cached"] = s.bytes_cached;
            d["reserved"] = s.bytes_reserved;
            d["alloc_calls"] = s.alloc_calls;
            d["device_allocs"] = s.device_allocs;
            return d;
          },
          "The device allocator's statistics in bytes (like torch.cuda.memory_stats): current (live "
          "buffers: tensors, graph arenas, temporaries), peak (highest current since the backend was made "
          "or reset_peak_memory_stats), cached (freed blocks kept for reuse), reserved (current + cached), "
          "alloc_calls and device_allocs (cache misses). Raises retort.Error on the CPU backend.")
      .def(
          "reset_peak_memory_stats",
          [](const BackendRef& b) {
            RT_CHECK(!b.backend->is_host(), "reset_peak_memory_stats: the CPU backend keeps no statistics");
            cuda_reset_peak(*b.backend);
          },
          "Sets memory_stats()['peak'] to the current bytes in use.")
      .def(
          "empty_cache",
          [](const BackendRef& b) {
            RT_CHECK(!b.backend->is_host(), "empty_cache: the CPU backend keeps no cache");
            cuda_empty_cache(*b.backend);
          },
          "Returns the allocator's cached free blocks to the device.")
      .def("__repr__", [](const BackendRef& b) { return "retort.Backend('" + b.name() + "')"; })
      .def(
          "__eq__", [](const BackendRef& a, const BackendRef& b) { return a.backend == b.backend; },
          "True for the same backend object (retort.cpu() == retort.cpu()).")
      .def(
          "__hash__", [](const BackendRef& b) { return std::hash<const void*>()(b.backend.get()); },
          "Hash of the backend object.");

  m.def("cpu", &cpu_backend, pyb::arg("threads") = 0,
        "The CPU backend with `threads` worker threads (0: all cores). Backends are shared: the same count "
        "gives the same backend.");
  m.def("cuda", &cuda_backend, pyb::arg("device") = 0,
        "The CUDA backend of `device` (one per device). Raises retort.Error (a ValueError) saying why when "
        "CUDA is unavailable: retort built without CUDA, no device, a driver problem.");
  m.def(
      "cuda_available",
      [](bool with_reason) -> pyb::object {
        std::string why;
        bool ok = cuda_available(&why);
        if (with_reason) return pyb::make_tuple(ok, ok ? std::string() : why);
        return pyb::bool_(ok);
      },
      pyb::arg("with_reason") = false,
      "True when retort was built with CUDA and a device is usable. with_reason=True returns (ok, reason), "
      "the reason being empty when ok.");
}

}  // namespace

}  // namespace retort::py

PYBIND11_MODULE(retort, m) {
  namespace rp = retort::py;
  namespace pyb = pybind11;
  m.doc() =
      "retort: a tensor engine with reverse-mode autodiff, CPU and CUDA backends, and fused distillation "
      "losses.\n\n"
      "Tensors come from NumPy arrays (retort.tensor, zero-copy on the CPU when the dtype matches) or any "
      "DLPack producer (retort.from_dlpack: PyTorch, CuPy, JAX), and go back through Tensor.numpy() or "
      "DLPack. Ops (retort.ops, or Tensor operators) build a graph lazily; retort.Graph runs it and "
      "differentiates it. retort.losses has each loss as a plain function over arrays.\n\n"
      "Every error retort reports is a retort.Error, a subclass of ValueError, carrying retort's message.";
  m.attr("__version__") = RETORT_VERSION;
  m.attr("built_with_cuda") = bool(RETORT_HAS_CUDA);

  // Every retort::Error (bad shapes, dtypes, options, indices; also internal assertions, which say so).
  pyb::register_exception<retort::Error>(m, "Error", PyExc_ValueError);

  rp::bind_dtypes(m);
  rp::bind_backends(m);
  rp::bind_tensor(m);
  rp::bind_ops(m);
  rp::bind_graph(m);
  rp::bind_losses(m);
  rp::bind_model(m);
  rp::bind_gguf(m);
  rp::bind_tokenizer(m);

  // Backends must go while the interpreter (and the CUDA runtime) still exists, not in static destructors.
  pyb::module_::import("atexit").attr("register")(pyb::cpp_function(&rp::clear_backend_cache));
}
