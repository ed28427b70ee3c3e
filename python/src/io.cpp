// kiln.io's native half: safetensors files (include/kiln/io.h), written atomically as in C++,
// and sharded checkpoints (include/kiln/sharded_checkpoint.h). python/kiln/io.py names the
// leaves of pytrees as kiln::tree_names does (docs/PYTHON.md, "nn, optim, data and io").
#include "kiln/io.h"

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "kiln/sharded_checkpoint.h"

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

// A file's tensors in the order of `names`, checked against `like`'s dtypes and shapes.
py::list matched_leaves(const std::function<io::TensorFile()>& read, const std::string& source,
                        const std::vector<std::string>& names, const std::vector<py::object>& like,
                        bool allow_extra) {
  const std::vector<Tensor> like_leaves = to_leaves(like);
  std::vector<Tensor> loaded;
  {
    py::gil_scoped_release release;
    loaded = io::detail::match_leaves(read(), names, like_leaves, source,
                                      io::LoadOptions{.allow_extra = allow_extra});
  }
  py::list out;
  for (const Tensor& t : loaded) out.append(py::cast(t));
  return out;
}

void bind_sharded(py::module_& io) {
  using distributed::Piece;
  py::class_<Piece>(io, "Piece",
                    "One tensor's part held by this process, for save_sharded: `data` lies in the "
                    "whole tensor `name` (of shape `whole_shape` and data's dtype) as a block "
                    "starting at `start` along every dimension, or, `flat`, as a run of its "
                    "flattened elements starting at start[0].")
      .def(py::init([](std::string name, const Tensor& data, std::vector<int64_t> start,
                       std::vector<int64_t> whole_shape, bool flat) {
             return Piece{std::move(name),
                          {data.dtype(), Shape(std::move(whole_shape))},
                          data,
                          std::move(start),
                          flat};
           }),
           py::arg("name"), py::arg("data"), py::arg("start"), py::arg("whole_shape"),
           py::arg("flat") = false)
      .def_readonly("name", &Piece::name)
      .def_property_readonly("data", [](const Piece& p) { return p.data; })
      .def_readonly("start", &Piece::start)
      .def_readonly("flat", &Piece::flat)
      .def_property_readonly(
          "whole_shape", [](const Piece& p) { return py::tuple(py::cast(p.whole.shape.dims())); })
      .def("__repr__", [](const Piece& p) {
        return "Piece('" + p.name + "', " + p.data.type().to_string() +
               (p.flat ? " from element " : " at ") + attr_to_string(p.start) + " of " +
               p.whole.to_string() + ")";
      });
  io.def(
      "block_pieces",
      [](const std::vector<py::object>& blocks, const std::vector<std::string>& names,
         const std::vector<distributed::Spec>& specs, const distributed::Mesh& mesh) {
        return distributed::detail::block_pieces(to_leaves(blocks), names, specs, mesh);
      },
      py::arg("blocks"), py::arg("names"), py::arg("specs"), py::arg("mesh"));
  io.def(
      "zero_pieces",
      [](const std::vector<py::object>& pieces, const std::vector<std::string>& names,
         const distributed::ShardLayout& layout, int64_t part) {
        return distributed::detail::zero_pieces(to_leaves(pieces), names, layout, part);
      },
      py::arg("pieces"), py::arg("names"), py::arg("layout"), py::arg("part"));
  io.def(
      "save_sharded",
      [](const std::string& dir, int64_t step, py::object pieces,
         const std::map<std::string, std::string>& metadata) {
        // The pieces are made inside the save, with the GIL, so that a Python exception while
        // making them on one process is an Error on every process.
        const std::function<std::vector<Piece>()> make = [pieces] {
          py::gil_scoped_acquire gil;
          const py::object made = PyCallable_Check(pieces.ptr()) ? pieces() : pieces;
          std::vector<Piece> out;
          for (py::handle p : py::iter(made)) {
            if (!py::isinstance<Piece>(p))
              fail("io.save_sharded", "a piece is not a kiln.io.Piece: got ", repr_of(p),
                   ", expected the pieces of block_pieces, zero_pieces or kiln.io.Piece(...)");
            out.push_back(p.cast<Piece>());
          }
          return out;
        };
        py::gil_scoped_release release;
        distributed::save_sharded(dir, step, make, metadata);
      },
      py::arg("dir"), py::arg("step"), py::arg("pieces"),
      py::arg("metadata") = std::map<std::string, std::string>{});
  io.def(
      "latest_sharded_step",
      [](const std::string& dir) { return distributed::latest_sharded_step(dir); }, py::arg("dir"));
  io.def(
      "sharded_metadata", [](const std::string& dir) { return distributed::sharded_metadata(dir); },
      py::arg("dir"));
  io.def(
      "load_sharded",
      [](const std::string& dir) {
        io::TensorFile file;
        {
          py::gil_scoped_release release;
          file = distributed::load_sharded(dir);
        }
        return py::make_tuple(tensor_dict(file), file.metadata);
      },
      py::arg("dir"));
  io.def(
      "load_sharded_leaves",
      [](const std::string& dir, const std::vector<std::string>& names,
         const std::vector<py::object>& like, bool allow_extra) {
        return matched_leaves([&dir] { return distributed::load_sharded(dir); }, dir, names, like,
                              allow_extra);
      },
      py::arg("dir"), py::arg("names"), py::arg("like"), py::arg("allow_extra"));
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
        return matched_leaves([&path] { return io::load_tensors(path); }, path, names, like,
                              allow_extra);
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
  bind_sharded(io);
}

}  // namespace kiln::python
