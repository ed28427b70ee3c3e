// Structured control flow for Python callables, JAX's signatures (docs/PYTHON.md, "Pytrees,
// transformations and control flow"): the branches and bodies become FlatFns
// (pytree::python_fn) for the flat core of kiln/control_flow.h, which runs them natively when
// nothing is traced and stages them as sub-functions under a trace.
#include "kiln/control_flow.h"

#include <string>
#include <utility>
#include <vector>

#include "pytree.h"

namespace kiln::python {
namespace {

using detail::FlatFn;
using pytree::flatten_tensors;
using pytree::one_arg;
using pytree::python_fn;
using pytree::unflatten_tensors;

TreeDef tuple_of(std::vector<TreeDef> children) {
  TreeDef d;
  d.kind = TreeDef::Kind::tuple;
  d.children = std::move(children);
  return d;
}

py::object cond(py::handle pred, py::object true_fun, py::object false_fun,
                const py::args& operands) {
  const detail::FlatTree ops = pytree::flatten_tree(operands);
  const py::object on_false = entering(false_fun), on_true = entering(true_fun);
  const std::vector<FlatFn> branches{python_fn(on_false, ops.def), python_fn(on_true, ops.def)};
  auto [out, def] =
      detail::cf::switch_flat("cond", detail::cf::predicate_index("cond", to_tensor(pred)),
                              branches, {"false_fun", "true_fun"}, ops.leaves);
  return unflatten_tensors(def, out);
}

py::object switch_(py::handle index, const py::sequence& branches, const py::args& operands) {
  const detail::FlatTree ops = pytree::flatten_tree(operands);
  std::vector<py::object> fns;
  for (py::handle b : branches) fns.push_back(entering(py::reinterpret_borrow<py::object>(b)));
  std::vector<FlatFn> flat;
  std::vector<std::string> names;
  for (const py::object& b : fns) {
    names.push_back("branch " + std::to_string(flat.size()));
    flat.push_back(python_fn(b, ops.def));
  }
  if (flat.empty()) fail("switch", "no branches: got [], expected at least one function");
  auto [out, def] = detail::cf::switch_flat("switch", to_tensor(index), flat, names, ops.leaves);
  return unflatten_tensors(def, out);
}

py::object while_loop(py::object cond_fun, py::object body_fun, py::handle init_val) {
  const detail::FlatTree init = pytree::flatten_tree(init_val);
  const TreeDef arg = one_arg(init.def);
  const FlatFn c = [f = entering(cond_fun), arg](const std::vector<Tensor>& in, TreeDef& out_def) {
    const py::object p = f(*unflatten_tensors(arg, in));
    out_def = TreeDef{};
    return std::vector<Tensor>{to_tensor(p)};
  };
  const py::object body = entering(body_fun);
  const FlatFn b = python_fn(body, arg);
  return unflatten_tensors(init.def, detail::cf::while_flat(c, b, init.leaves, init.def));
}

py::object scan(py::object f, py::handle init_val, py::handle xs, std::optional<int64_t> length,
                bool reverse, int64_t unroll) {
  const detail::FlatTree init = pytree::flatten_tree(init_val);
  const detail::FlatTree x = pytree::flatten_tree(xs);
  const std::size_t nc = init.leaves.size();
  const TreeDef args = tuple_of({init.def, x.def});
  const FlatFn body = [f = entering(f), args](const std::vector<Tensor>& in, TreeDef& out_def) {
    const py::object r = f(*unflatten_tensors(args, in));
    if (!py::isinstance<py::tuple>(r) || py::len(r) != 2)
      fail("scan", "the body must return (carry, y): got ", py::repr(r).cast<std::string>(),
           ", expected a tuple of two");
    std::vector<Tensor> out;
    TreeDef carry = flatten_tensors(r[py::int_(0)], out);
    TreeDef y = flatten_tensors(r[py::int_(1)], out);
    out_def = tuple_of({std::move(carry), std::move(y)});
    return out;
  };
  auto [out, y_def] =
      detail::cf::scan_flat(body, init.leaves, init.def, x.leaves, length, reverse, unroll);
  const std::span<const Tensor> all(out);
  return py::make_tuple(unflatten_tensors(init.def, all.first(nc)),
                        unflatten_tensors(y_def, all.subspan(nc)));
}

py::object fori_loop(py::handle lower, py::handle upper, py::object body_fun, py::handle init_val) {
  const detail::FlatTree init = pytree::flatten_tree(init_val);
  const std::size_t nc = init.leaves.size();
  // The carry is (i, value); body_fun(i, value) gives the next value.
  const TreeDef carry = tuple_of({TreeDef{}, init.def});
  const TreeDef args = tuple_of({TreeDef{}, init.def});
  auto step = [f = entering(body_fun), args](const std::vector<Tensor>& in, TreeDef& value_def) {
    const py::object r = f(*unflatten_tensors(args, in));
    std::vector<Tensor> out{in[0] + 1};
    value_def = flatten_tensors(r, out);
    return out;
  };
  std::vector<Tensor> start{detail::cf::int_scalar(0)};
  const bool static_bounds = PyLong_Check(lower.ptr()) && PyLong_Check(upper.ptr());
  if (static_bounds) {
    // Python ints: a scan of known length, which reverse mode differentiates.
    const auto lo = lower.cast<int64_t>(), hi = upper.cast<int64_t>();
    start[0] = detail::cf::int_scalar(lo);
    start.insert(start.end(), init.leaves.begin(), init.leaves.end());
    const FlatFn body = [step](const std::vector<Tensor>& in, TreeDef& out_def) {
      TreeDef value;
      std::vector<Tensor> out = step(in, value);
      out_def = tuple_of({tuple_of({TreeDef{}, std::move(value)}), tuple_of({})});
      return out;
    };
    auto [out, y_def] =
        detail::cf::scan_flat(body, start, carry, {}, detail::cf::trip_count(lo, hi), false, 1);
    return unflatten_tensors(init.def, std::span<const Tensor>(out).subspan(1, nc));
  }
  // Tensor bounds (may be traced): a while_loop while i < upper.
  start[0] = astype(to_tensor(lower), int32, Loc{});
  start.insert(start.end(), init.leaves.begin(), init.leaves.end());
  const Tensor hi = astype(to_tensor(upper), int32, Loc{});
  const FlatFn c = [hi](const std::vector<Tensor>& in, TreeDef& out_def) {
    out_def = TreeDef{};
    return std::vector<Tensor>{less(in[0], hi, Loc{})};
  };
  const FlatFn b = [step](const std::vector<Tensor>& in, TreeDef& out_def) {
    TreeDef value;
    std::vector<Tensor> out = step(in, value);
    out_def = tuple_of({TreeDef{}, std::move(value)});
    return out;
  };
  const std::vector<Tensor> out = detail::cf::while_flat(c, b, start, carry);
  return unflatten_tensors(init.def, std::span<const Tensor>(out).subspan(1, nc));
}

}  // namespace

void bind_control_flow(py::module_& m) {
  m.def("cond", &cond, py::arg("pred"), py::arg("true_fun"), py::arg("false_fun"),
        "cond(pred, true_fun, false_fun, *operands): true_fun(*operands) if the bool scalar pred "
        "holds, else false_fun(*operands). Both must return pytrees of the same structure, "
        "dtypes and shapes. Eagerly only the chosen branch runs; under a transformation both "
        "are traced.");
  m.def("switch", &switch_, py::arg("index"), py::arg("branches"),
        "switch(index, branches, *operands): branches[index](*operands), the integer scalar "
        "index clamped to [0, len(branches) - 1].");
  m.def("while_loop", &while_loop, py::arg("cond_fun"), py::arg("body_fun"), py::arg("init_val"),
        "while_loop(cond_fun, body_fun, init_val): val = init_val; while cond_fun(val): val = "
        "body_fun(val); returns val. body_fun keeps the pytree structure, dtypes and shapes; "
        "cond_fun returns a bool scalar. The trip count may depend on data. Not reverse-mode "
        "differentiable (use fori_loop with int bounds or scan).");
  m.def("fori_loop", &fori_loop, py::arg("lower"), py::arg("upper"), py::arg("body_fun"),
        py::arg("init_val"),
        "fori_loop(lower, upper, body_fun, init_val): val = body_fun(i, val) for i in "
        "range(lower, upper), i an int32 scalar tensor. Python int bounds make a scan (reverse "
        "mode works); tensor bounds a while_loop.");
  m.def("scan", &scan, py::arg("f"), py::arg("init"), py::arg("xs") = py::none(),
        py::arg("length") = py::none(), py::arg("reverse") = false, py::arg("unroll") = 1,
        "scan(f, init, xs=None, length=None, reverse=False, unroll=1) -> (carry, ys): for each "
        "slice x of xs along the leading axis (of every leaf), (carry, y) = f(carry, x); the y "
        "are stacked along a new leading axis. xs may be None when length is given; reverse "
        "runs from the end (ys stay in xs order); unroll (>= 1) unrolls the traced loop body.");
}

}  // namespace kiln::python
