// retort.GgufFile: a GGUF file's metadata as Python values and its tensors dequantized into NumPy arrays.
#include <memory>

#include "common.h"

namespace retort::py {

namespace {

// A GGUF string as str, or as bytes when it is not valid UTF-8 (the format says UTF-8; files do not always).
pyb::object string_to_py(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), pyb::ssize_t(s.size()), "strict");
  if (o != nullptr) return pyb::reinterpret_steal<pyb::object>(o);
  PyErr_Clear();
  return pyb::bytes(s);
}

pyb::object value_to_py(const GgufValue& v) {
  switch (v.type()) {
    case GgufType::Bool:
      return pyb::bool_(v.as_bool());
    case GgufType::F32:
    case GgufType::F64:
      return pyb::float_(v.as_float());
    case GgufType::String:
      return string_to_py(v.as_string());
    case GgufType::Array: {
      pyb::list out(v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        if (v.elem_type() == GgufType::String)
          out[i] = string_to_py(v.string_at(i));
        else if (v.elem_type() == GgufType::Array)
          out[i] = value_to_py(v.array_at(i));
        else
          out[i] = value_to_py(v.scalar_at(i));
      }
      return out;
    }
    case GgufType::I8:
    case GgufType::I16:
    case GgufType::I32:
    case GgufType::I64:
      return pyb::int_(v.as_int());
    default:
      return pyb::int_(v.as_uint());
  }
}

using GgufPtr = std::shared_ptr<GgufFile>;

pyb::tuple shape_tuple(const Shape& s) {
  pyb::tuple t(s.size());
  for (size_t i = 0; i < s.size(); ++i) t[i] = pyb::int_(s[i]);
  return t;
}

}  // namespace

void bind_gguf(pyb::module_& m) {
  pyb::class_<GgufFile, GgufPtr> c(
      m, "GgufFile",
      "A GGUF model file (llama.cpp's format, versions 2 and 3), memory-mapped and "
      "validated when opened. Raises retort.Error naming the file and the fault "
      "for a malformed one.");
  c.def(pyb::init([](const std::string& path) {
          pyb::gil_scoped_release nogil;
          return std::make_shared<GgufFile>(path);
        }),
        pyb::arg("path"), "Opens and validates path.");
  c.def_property_readonly("path", &GgufFile::path, "The file's path.");
  c.def_property_readonly("version", &GgufFile::version, "The GGUF version (2 or 3).");
  c.def_property_readonly("alignment", &GgufFile::alignment,
                          "The data alignment (general.alignment, or 32).");
  c.def_property_readonly(
      "metadata",
      [](const GgufFile& f) {
        pyb::dict d;
        for (const auto& [k, v] : f.metadata()) d[string_to_py(k)] = value_to_py(v);
        return d;
      },
      "Every key/value as a dict (file order): ints, floats, bools, str (bytes when not UTF-8), and lists "
      "for "
      "arrays, nested as in the file.");
  c.def_property_readonly(
      "tensor_names",
      [](const GgufFile& f) {
        std::vector<std::string> out;
        for (const auto& t : f.tensors()) out.push_back(t.name);
        return out;
      },
      "Tensor names in file order.");
  c.def(
      "tensor_type",
      [](const GgufFile& f, const std::string& name) { return quant_name(f.tensor(name).type); },
      pyb::arg("name"), "The ggml type of a tensor: 'F32', 'Q4_K', ...");
  c.def(
      "tensor_shape",
      [](const GgufFile& f, const std::string& name) { return shape_tuple(f.tensor(name).shape); },
      pyb::arg("name"), "The shape of a tensor, outermost dim first (the reverse of the file's ggml order).");
  c.def(
      "tensor_bytes",
      [](const GgufPtr& f, const std::string& name) {
        std::span<const uint8_t> b = f->tensor_bytes(f->tensor(name));
        // A read-only view into the map that keeps the file open.
        pyb::array out(pyb::dtype::of<uint8_t>(), {pyb::ssize_t(b.size())}, {pyb::ssize_t(1)}, b.data(),
                       pyb::cast(f));
        out.attr("setflags")(pyb::arg("write") = false);
        return out;
      },
      pyb::arg("name"), "The tensor's raw bytes as a read-only uint8 array (a view into the file).");
  c.def(
      "tensor",
      [](const GgufFile& f, const std::string& name) {
        const GgufFile::TensorInfo& t = f.tensor(name);
        f.tensor_bytes(t);  // validate before allocating
        pyb::array_t<float> out(std::vector<pyb::ssize_t>(t.shape.begin(), t.shape.end()));
        float* dst = out.mutable_data();
        {
          pyb::gil_scoped_release nogil;
          f.dequantize(t, dst);
        }
        return out;
      },
      pyb::arg("name"),
      "The tensor dequantized to a float32 array, shape outermost first. Raises retort.Error for a type "
      "retort "
      "cannot decode (it decodes F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K).");
  c.def("__repr__", [](const GgufFile& f) {
    return "retort.GgufFile('" + f.path() + "', version=" + std::to_string(f.version()) +
           ", tensors=" + std::to_string(f.tensors().size()) +
           ", keys=" + std::to_string(f.metadata().size()) + ")";
  });
}

}  // namespace retort::py
