// kiln.io's native half: safetensors files (include/kiln/io.h), written atomically as in C++.
// python/kiln/io.py names the leaves of pytrees as kiln::tree_names does (docs/PYTHON.md,
// "nn, optim, data and io").
#include "kiln/io.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"

namespace kiln::python {
namespace {

std::vector<io::NamedTensor> named_tensors(
    const std::vector<std::pair<std::string, py::object>>& items) {
  std::vector<io::NamedTensor> out;
  out.reserve(items.size());
  for (const auto& [name, value] : items) {
    Tensor t = to_tensor(value);
    if (t.defined()) out.push_back({name, std::move(t)});  // an unset C++ leaf is not written
  }
  return out;
}

py::dict tensor_dict(const io::TensorFile& file) {
  py::dict out;
  for (const io::NamedTensor& t : file.tensors) out[py::str(t.name)] = t.tensor;
  return out;
}

}  // namespace

void bind_io(py::module_& m) {
  py::module_ io = m.def_submodule("_io", "safetensors files (native half of kiln.io).");
  io.attr("__name__") = "kiln.io";  // where its classes say they live
  io.def(
      "save_tensors",
      [](const std::string& path, const std::vector<std::pair<std::string, py::object>>& tensors,
         const std::map<std::string, std::string>& metadata) {
        std::vector<io::NamedTensor> named = named_tensors(tensors);
        py::gil_scoped_release release;
        io::save_tensors(path, named, metadata);
      },
      py::arg("path"), py::arg("tensors"),
      py::arg("metadata") = std::map<std::string, std::string>{},
      "Writes (name, tensor) pairs in order to a safetensors file, atomically: a temporary file "
      "in the same directory is written, fsync'ed and renamed over `path`.");
  io.def(
      "load_tensors",
      [](const std::string& path) {
        io::TensorFile file;
        {
          py::gil_scoped_release release;
          file = io::load_tensors(path);
        }
        return py::make_tuple(tensor_dict(file), file.metadata);
      },
      py::arg("path"), "({name: tensor} in file order, metadata) of a safetensors file.");
  io.def(
      "load_leaves",
      [](const std::string& path, const std::vector<std::string>& names,
         const std::vector<py::object>& like, bool allow_extra) {
        std::vector<Tensor> like_leaves;
        like_leaves.reserve(like.size());
        for (const py::object& l : like) like_leaves.push_back(to_tensor(l));
        std::vector<Tensor> loaded;
        {
          py::gil_scoped_release release;
          loaded = io::detail::match_leaves(io::load_tensors(path), names, like_leaves, path,
                                            io::LoadOptions{.allow_extra = allow_extra});
        }
        py::list out;
        for (const Tensor& t : loaded) out.append(py::cast(t));
        return out;
      },
      py::arg("path"), py::arg("names"), py::arg("like"), py::arg("allow_extra"),
      "The file's tensors in the order of `names`, checked against the dtypes and shapes of "
      "`like`.");
  io.def(
      "serialize",
      [](const std::vector<std::pair<std::string, py::object>>& tensors,
         const std::map<std::string, std::string>& metadata) {
        const std::vector<uint8_t> bytes =
            io::serialize_safetensors(named_tensors(tensors), metadata);
        return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      },
      py::arg("tensors"), py::arg("metadata") = std::map<std::string, std::string>{},
      "safetensors bytes of (name, tensor) pairs.");
  io.def(
      "parse",
      [](py::bytes data) {
        const std::string_view view = data;
        const io::TensorFile file = io::parse_safetensors(
            std::span(reinterpret_cast<const uint8_t*>(view.data()), view.size()));
        return py::make_tuple(tensor_dict(file), file.metadata);
      },
      py::arg("data"), "({name: tensor}, metadata) of safetensors bytes.");
}

}  // namespace kiln::python
