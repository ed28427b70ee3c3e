// Meshes of processes with named axes, their specs, and shard_map (kiln/distributed.h;
// docs/DISTRIBUTED.md, "Meshes and shard_map"); pmap and the collectives are bound with the
// other transformations (transforms.cpp).
#include "kiln/distributed.h"

#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "pytree.h"

namespace kiln::python {
namespace {

using distributed::Mesh;
using distributed::Spec;

// {"data": 2, "model": 2} or [("data", 2), ("model", 2)], in axis order.
Mesh mesh_of(py::handle axes) {
  std::vector<distributed::MeshAxis> out;
  const py::object items = py::isinstance<py::dict>(axes)
                               ? py::reinterpret_borrow<py::dict>(axes).attr("items")()
                               : py::reinterpret_borrow<py::object>(axes);
  for (py::handle item : items) {
    const py::tuple pair = py::reinterpret_borrow<py::object>(item);
    if (!py::isinstance<py::tuple>(item) || pair.size() != 2 || !py::isinstance<py::str>(pair[0]) ||
        !py::isinstance<py::int_>(pair[1]))
      fail("Mesh", "an axis is a name and a size: got ", repr_of(item),
           ", expected e.g. {'data': 2, 'model': 2} or [('data', 2), ('model', 2)]");
    out.push_back({pair[0].cast<std::string>(), pair[1].cast<int64_t>()});
  }
  return Mesh(std::move(out));
}

// One dimension of a spec: None, an axis name, or a tuple or list of names (major first).
std::vector<std::string> spec_dim(py::handle d) {
  if (d.is_none()) return {};
  if (py::isinstance<py::str>(d)) return {d.cast<std::string>()};
  if (py::isinstance<py::tuple>(d) || py::isinstance<py::list>(d)) {
    std::vector<std::string> names;
    for (py::handle n : d) {
      if (!py::isinstance<py::str>(n))
        fail("spec", "a dimension's axes are names: got ", repr_of(d),
             ", expected a tuple of strings such as ('data', 'model')");
      names.push_back(n.cast<std::string>());
    }
    return names;
  }
  fail("spec", "a dimension is None, an axis name or a tuple of names: got ", repr_of(d));
}

Spec spec_of(py::handle s) {
  if (!py::isinstance<Spec>(s))
    fail("shard_map", "specs are kiln.spec(...): got ", repr_of(s),
         ", expected e.g. kiln.spec('data', None)");
  return s.cast<Spec>();
}

// in_specs: one entry per positional argument, a spec for all its leaves or a list of specs,
// one per leaf in flatten order.
distributed::InSpecs in_specs_of(py::handle in) {
  if (!py::isinstance<py::tuple>(in) && !py::isinstance<py::list>(in))
    fail("shard_map", "in_specs is a tuple with one entry per argument: got ", repr_of(in));
  distributed::InSpecs out;
  for (py::handle a : in) {
    if (py::isinstance<py::list>(a)) {
      distributed::LeafSpecs leaves;
      for (py::handle s : a) leaves.specs.push_back(spec_of(s));
      out.args.emplace_back(std::move(leaves));
    } else {
      out.args.emplace_back(spec_of(a));
    }
  }
  return out;
}

// out_specs: a spec for every result leaf, or a tuple or list of specs, one per result leaf.
distributed::OutSpecs out_specs_of(py::handle out) {
  distributed::OutSpecs specs;
  if (py::isinstance<py::tuple>(out) || py::isinstance<py::list>(out))
    for (py::handle s : out) specs.leaves.push_back(spec_of(s));
  else
    specs.leaves.push_back(spec_of(out));
  return specs;
}

std::string spec_repr(const Spec& s) {
  std::string out = "spec(";
  for (std::size_t d = 0; d < s.dims.size(); ++d) {
    out += d ? ", " : "";
    const std::vector<std::string>& names = s.dims[d];
    if (names.empty()) out += "None";
    if (names.size() == 1) out += "'" + names[0] + "'";
    if (names.size() > 1) {
      out += "(";
      for (std::size_t k = 0; k < names.size(); ++k) out += (k ? ", '" : "'") + names[k] + "'";
      out += ")";
    }
  }
  return out + ")";
}

}  // namespace

void bind_distributed(py::module_& m) {
  py::class_<Mesh>(m, "Mesh",
                   "The processes as an array with named axes, as jax.sharding.Mesh: "
                   "Mesh({'data': 2, 'model': 2}) (or a list of (name, size) pairs); process r "
                   "sits at row-major position r, and the sizes multiply to process_count().")
      .def(py::init(&mesh_of), py::arg("axes"))
      .def_property_readonly("axis_names",
                             [](const Mesh& mesh) {
                               py::list names;
                               for (const distributed::MeshAxis& a : mesh.axes())
                                 names.append(a.name);
                               return py::tuple(names);
                             })
      .def_property_readonly("shape",
                             [](const Mesh& mesh) {
                               py::dict shape;
                               for (const distributed::MeshAxis& a : mesh.axes())
                                 shape[py::str(a.name)] = a.size;
                               return shape;
                             })
      .def("size", &Mesh::size, py::arg("axis"), "The size of the named axis.")
      .def("index", &Mesh::index, py::arg("axis"), "This process's position along the named axis.")
      .def("group", &Mesh::group, py::arg("axis"),
           "The processes on the line along `axis` through this one, in axis order.")
      .def("__repr__", [](const Mesh& mesh) { return "Mesh(" + mesh.to_string() + ")"; });

  py::class_<Spec>(m, "Spec", "How an array is laid out over a mesh: made by kiln.spec.")
      .def_property_readonly("dims",
                             [](const Spec& s) {
                               py::list dims;
                               for (const std::vector<std::string>& d : s.dims)
                                 dims.append(py::tuple(py::cast(d)));
                               return py::tuple(dims);
                             })
      .def("__eq__",
           [](const Spec& a, py::handle b) {
             return py::isinstance<Spec>(b) && a.dims == b.cast<Spec>().dims;
           })
      .def("__hash__", [](const Spec& s) { return py::hash(py::str(spec_repr(s))); })
      .def("__repr__", &spec_repr);
  m.def(
      "spec",
      [](const py::args& dims) {
        Spec s;
        for (py::handle d : dims) s.dims.push_back(spec_dim(d));
        return s;
      },
      "spec(*dims), as JAX's PartitionSpec: for each leading dimension the mesh axes that split "
      "it (None: not split; a name; a tuple of names, the major first). spec() is a replica.");

  m.def("local_block", &distributed::local_block, py::arg("x"), py::arg("mesh"), py::arg("spec"),
        "This process's block of the global array x laid out by spec over the mesh (no "
        "communication; split dimensions must divide evenly).");
  m.def("assemble", &distributed::assemble, py::arg("block"), py::arg("spec"),
        "Inside shard_map: the global array from every process's block, gathered along the axes "
        "the spec names; the same on every process.");

  m.def(
      "shard_map",
      [](py::object f, const Mesh& mesh, py::handle in_specs, py::handle out_specs) {
        auto cache =
            detail::make_shard_map_cache(mesh, in_specs_of(in_specs), out_specs_of(out_specs));
        return wrap(f, [f, cache](const py::args& args, const py::kwargs& kwargs) {
          if (!kwargs.empty())
            fail("shard_map", "keyword arguments: got ", repr_of(kwargs),
                 ", expected positional arguments, one per entry of in_specs");
          const detail::FlatTree in = pytree::flatten_tree(args);
          const py::object fn = entering(f);
          const detail::FlatTree r =
              detail::shard_map_call(*cache, in.def, in.leaves, pytree::python_fn(fn, in.def));
          return pytree::unflatten_tensors(r.def, r.leaves);
        });
      },
      py::arg("f"), py::arg("mesh"), py::arg("in_specs"), py::arg("out_specs"),
      "shard_map(f, mesh, in_specs, out_specs): SPMD over a mesh of processes, as "
      "jax.experimental.shard_map. Each process passes its blocks (local_block of the global "
      "arrays) and f runs on them with every mesh axis a named axis for the collectives (psum "
      "over 'model' runs among the processes of this one's line along 'model'). in_specs: one "
      "spec per argument, or a list of specs per leaf; out_specs: one spec for every result "
      "leaf, or a tuple of specs per leaf. A result may vary only along the axes its spec "
      "names. Traced once per signature and compiled; grad, vmap and jit compose with it.");
}

}  // namespace kiln::python
