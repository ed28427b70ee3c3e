// Transformations of Python callables (docs/PYTHON.md, "Pytrees, transformations and control
// flow"): each one flattens its arguments in C++ (pytree.h), calls the flat core of
// kiln/impl/transforms.h with pytree::python_fn around the callable, and rebuilds the Python
// result. The callables they return are C++ objects (Transformed, Jit, CustomJvp, CustomVjp)
// that carry the wrapped function's __name__, __doc__ and __wrapped__.
#include "kiln/transforms.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/distributed.h"
#include "kiln/runtime.h"
#include "pytree.h"

namespace kiln::python {
namespace {

// kiln.autograph's hook (set by _set_autograph_entry; leaked, so that nothing is released after
// the interpreter): entering(f) calls it, so that `jit(grad(f))` converts f as `jit(f)` does.
py::object& autograph_entry() {
  static auto* hook = new py::object();
  return *hook;
}

}  // namespace

py::object entering(const py::object& f) {
  const py::object& hook = autograph_entry();
  return hook ? hook(f) : f;
}

namespace {

using detail::FlatFn;
using detail::FlatTree;
using pytree::flatten_tensors;
using pytree::python_fn;
using pytree::unflatten_tensors;

// A transformed function: __call__ runs `call`; attributes (functools-style metadata) live in
// the instance dictionary.
struct Transformed {
  std::function<py::object(const py::args&, const py::kwargs&)> call;
};

// Copies what functools.wraps copies, and sets __wrapped__.
void copy_metadata(py::handle to, py::handle f) {
  for (const char* name : {"__module__", "__name__", "__qualname__", "__doc__"})
    if (py::hasattr(f, name)) to.attr(name) = f.attr(name);
  to.attr("__wrapped__") = f;
}

}  // namespace

py::object wrap(py::handle f, std::function<py::object(const py::args&, const py::kwargs&)> call) {
  py::object out = py::cast(Transformed{std::move(call)});
  copy_metadata(out, f);
  return out;
}

namespace {

// The positional arguments that grad and the Jacobians take as they are, as JAX does: Python
// scalars (bool, int, float) that are not differentiated stay concrete, so `range(n)` or
// `if n > 2` in f works on them, and jit's static arguments stay static through grad.
struct HeldArgs {
  py::tuple traced;             // the call's arguments, the held ones replaced by None
  std::vector<std::size_t> at;  // the held ones' positions
};
HeldArgs hold_python_scalars(const py::args& args, const std::vector<int>& nums) {
  HeldArgs h{py::tuple(args.size()), {}};
  for (std::size_t i = 0; i < args.size(); ++i) {
    PyTypeObject* type = Py_TYPE(args[i].ptr());
    const bool scalar = type == &PyBool_Type || type == &PyLong_Type || type == &PyFloat_Type;
    if (scalar && std::find(nums.begin(), nums.end(), static_cast<int>(i)) == nums.end()) {
      h.at.push_back(i);
      h.traced[i] = py::none();
    } else {
      h.traced[i] = args[i];
    }
  }
  return h;
}
// python_fn for the arguments `h` made: f gets the held arguments back in place. Like python_fn
// it refers to its arguments, which must outlive it.
FlatFn held_fn(const py::object& f, const TreeDef& def, const HeldArgs& h, const py::args& args,
               const py::dict* kwargs) {
  if (h.at.empty()) return python_fn(f, def, kwargs);
  return [&f, &def, &h, &args, kwargs](const std::vector<Tensor>& in, TreeDef& out_def) {
    const py::tuple traced = unflatten_tensors(def, in);
    py::list call(traced);
    for (std::size_t i : h.at) call[i] = args[i];
    const py::object out = kwargs ? f(*call, **(*kwargs)) : f(*call);
    std::vector<Tensor> leaves;
    out_def = flatten_tensors(out, leaves);
    return leaves;
  };
}

// argnums: an int (one gradient) or a tuple of ints (a tuple of gradients).
struct ArgnumsSpec {
  std::vector<int> nums;
  bool single = true;
};
ArgnumsSpec argnums_spec(std::string_view op, py::handle argnums) {
  ArgnumsSpec s;
  if (PyLong_Check(argnums.ptr())) {
    s.nums.push_back(argnums.cast<int>());
    return s;
  }
  if (!py::isinstance<py::tuple>(argnums) && !py::isinstance<py::list>(argnums))
    fail(op, "argnums must be an int or a tuple of ints: got ", repr_of(argnums),
         ", expected e.g. 0 or (0, 2)");
  s.single = false;
  for (py::handle a : argnums) s.nums.push_back(a.cast<int>());
  if (s.nums.empty()) fail(op, "argnums is empty: got (), expected at least one argument index");
  return s;
}
// The argnums for a call with n positional arguments: negative ones from the end.
std::vector<int> resolve_argnums(std::string_view op, const std::vector<int>& nums, std::size_t n) {
  std::vector<int> out;
  for (int k : nums) {
    const int r = k < 0 ? k + static_cast<int>(n) : k;
    if (r < 0 || r >= static_cast<int>(n))
      fail(op, "argnums out of range: got ", k, " for a call with ", n,
           " positional arguments, expected an index in [", -static_cast<int>(n), ", ", n - 1, "]");
    out.push_back(r);
  }
  return out;
}

// fn whose result must be (value, aux) when has_aux, else one leaf: grad's and vjp's check.
FlatFn checked_result(std::string_view op, FlatFn fn, bool has_aux, bool scalar) {
  return [op, fn = std::move(fn), has_aux, scalar](const std::vector<Tensor>& in,
                                                   TreeDef& out_def) {
    std::vector<Tensor> out = fn(in, out_def);
    if (has_aux && (out_def.kind != TreeDef::Kind::tuple || out_def.children.size() != 2))
      fail(op, "has_aux: the function must return a pair (output, aux): got ", out_def.to_string(),
           ", expected a tuple of two");
    const TreeDef& value = has_aux ? out_def.children[0] : out_def;
    if (scalar && value.kind != TreeDef::Kind::leaf)
      fail(op, "the function must return one scalar tensor", has_aux ? " (and aux)" : "", ": got ",
           value.to_string(), ", expected a single tensor (use has_aux=True to return ", "more)");
    return out;
  };
}

py::object make_grad(py::object f, py::handle argnums, bool has_aux, bool value_too) {
  const char* op = value_too ? "value_and_grad" : "grad";
  ArgnumsSpec spec = argnums_spec(op, argnums);
  return wrap(f,
              [f, spec, has_aux, value_too, op](const py::args& args,
                                                const py::kwargs& kwargs) -> py::object {
                const std::vector<int> nums = resolve_argnums(op, spec.nums, args.size());
                const HeldArgs held = hold_python_scalars(args, nums);
                const detail::FlatTree in = pytree::flatten_tree(held.traced);
                const py::object fn = entering(f);
                const detail::GradResult r = detail::grad_call(
                    op, nums, in.def, in.leaves,
                    checked_result(op, held_fn(fn, in.def, held, args, &kwargs), has_aux, true));
                py::tuple grads(nums.size());
                for (std::size_t k = 0; k < nums.size(); ++k)
                  grads[k] = unflatten_tensors(in.def.children[static_cast<std::size_t>(nums[k])],
                                               r.grads[k]);
                py::object g = spec.single ? py::object(grads[0]) : py::object(grads);
                py::object value = unflatten_tensors(r.value.def, r.value.leaves);
                if (value_too) return py::make_tuple(value, g);
                if (has_aux) return py::make_tuple(g, value[py::int_(1)]);
                return g;
              });
}

// Zeros shaped like each leaf.
std::vector<Tensor> zeros_like_all(std::span<const Tensor> leaves) {
  std::vector<Tensor> out;
  for (const Tensor& t : leaves) out.push_back(zeros_like(t));
  return out;
}

py::object vjp(py::object f, const py::args& primals, bool has_aux) {
  detail::FlatTree in = pytree::flatten_tree(primals);
  const py::object fn = entering(f);
  detail::VjpFlat r = detail::vjp_call(
      in.def, in.leaves, checked_result("vjp", python_fn(fn, in.def), has_aux, false));
  const TreeDef out_def = r.out.def;
  std::size_t n_out = r.out.leaves.size();
  std::vector<Tensor> aux_zeros;
  if (has_aux) {
    n_out = out_def.children[0].num_leaves();
    aux_zeros = zeros_like_all(std::span<const Tensor>(r.out.leaves).subspan(n_out));
  }
  auto pullback = std::make_shared<detail::FlatPullback>(std::move(r.pullback));
  py::object vjp_fn = wrap(f, [pullback, out_def, aux_zeros, has_aux, args_def = in.def](
                                  const py::args& ct, const py::kwargs&) {
    if (ct.size() != 1)
      fail("vjp", "vjp_fn takes one cotangent: got ", ct.size(), " arguments, expected 1");
    std::vector<Tensor> leaves;
    TreeDef def = flatten_tensors(ct[0], leaves);
    if (has_aux) {  // the aux output gets a zero cotangent
      TreeDef both;
      both.kind = TreeDef::Kind::tuple;
      both.children = {std::move(def), out_def.children[1]};
      def = std::move(both);
      leaves.insert(leaves.end(), aux_zeros.begin(), aux_zeros.end());
    }
    return unflatten_tensors(args_def, (*pullback)(leaves, def));
  });
  vjp_fn.attr("__name__") = "vjp_fn";
  const std::span<const Tensor> out(r.out.leaves);
  if (!has_aux) return py::make_tuple(unflatten_tensors(out_def, out), vjp_fn);
  return py::make_tuple(unflatten_tensors(out_def.children[0], out.first(n_out)), vjp_fn,
                        unflatten_tensors(out_def.children[1], out.subspan(n_out)));
}

py::object jvp(py::object f, py::handle primals, py::handle tangents) {
  for (py::handle v : {primals, tangents})
    if (!py::isinstance<py::tuple>(v) && !py::isinstance<py::list>(v))
      fail("jvp", "primals and tangents must be tuples (or lists) of arguments: got ", repr_of(v),
           ", expected e.g. (x,)");
  const detail::FlatTree p =
      pytree::flatten_tree(py::tuple(py::reinterpret_borrow<py::object>(primals)));
  const detail::FlatTree t =
      pytree::flatten_tree(py::tuple(py::reinterpret_borrow<py::object>(tangents)));
  const py::object fn = entering(f);
  const detail::JvpFlat r =
      detail::jvp_call(p.def, p.leaves, t.def, t.leaves, python_fn(fn, p.def));
  return py::make_tuple(unflatten_tensors(r.out.def, r.out.leaves),
                        unflatten_tensors(r.out.def, r.tangents));
}

py::object make_jacobian(py::object f, py::handle argnums, bool forward) {
  const char* op = forward ? "jacfwd" : "jacrev";
  ArgnumsSpec spec = argnums_spec(op, argnums);
  return wrap(f, [f, spec, forward, op](const py::args& args, const py::kwargs& kwargs) {
    const std::vector<int> nums = resolve_argnums(op, spec.nums, args.size());
    const HeldArgs held = hold_python_scalars(args, nums);
    const detail::FlatTree in = pytree::flatten_tree(held.traced);
    const py::object entered = entering(f);
    const FlatFn fn = held_fn(entered, in.def, held, args, &kwargs);
    const detail::FlatJacobian j = forward ? detail::jacfwd_call(nums, in.def, in.leaves, fn)
                                           : detail::jacrev_call(nums, in.def, in.leaves, fn);
    // Each result leaf becomes the chosen argument trees holding its blocks.
    const std::vector<detail::LeafRange> ranges = detail::arg_ranges(in.def);
    std::size_t n = 0;
    for (int k : nums) n += ranges[static_cast<std::size_t>(k)].size();
    const std::span<const Tensor> blocks(j.blocks);
    std::vector<py::object> per_leaf;
    for (std::size_t o = 0; o * n < blocks.size(); ++o) {
      py::tuple parts(nums.size());
      std::size_t at = o * n;
      for (std::size_t k = 0; k < nums.size(); ++k) {
        const auto arg = static_cast<std::size_t>(nums[k]);
        parts[k] = unflatten_tensors(in.def.children[arg], blocks.subspan(at, ranges[arg].size()));
        at += ranges[arg].size();
      }
      per_leaf.push_back(spec.single ? py::object(parts[0]) : py::object(parts));
    }
    return pytree::unflatten(j.out_def, per_leaf);
  });
}

// vmap's options for one call: in_axes resolved against the arguments' structure.
detail::VmapOptions vmap_options(py::handle in_axes, const TreeDef& args_def,
                                 const std::string& axis_name) {
  auto axis = [](py::handle a) -> std::optional<int> {
    if (a.is_none()) return std::nullopt;
    if (!PyLong_Check(a.ptr()))
      fail("vmap", "an axis must be an int or None: got ", repr_of(a), ", expected e.g. 0");
    return a.cast<int>();
  };
  detail::VmapOptions o;
  o.name = axis_name;
  InAxes in;
  const std::size_t n = args_def.children.size();
  if (in_axes.is_none() || PyLong_Check(in_axes.ptr())) {
    in.axes.assign(n, axis(in_axes));
  } else {
    if (!py::isinstance<py::tuple>(in_axes) && !py::isinstance<py::list>(in_axes))
      fail("vmap", "in_axes must be an int, None, or a tuple with one entry per argument: got ",
           repr_of(in_axes), ", expected e.g. (0, None)");
    if (py::len(in_axes) != n)
      fail("vmap", "in_axes has ", py::len(in_axes), " entries: got ", repr_of(in_axes), " for ", n,
           " arguments, expected one per argument");
    for (std::size_t a = 0; a < n; ++a) {
      py::handle spec = in_axes[py::int_(a)];
      if (spec.is_none() || PyLong_Check(spec.ptr())) {
        in.axes.emplace_back(axis(spec));
        continue;
      }
      LeafAxes leaves;
      pytree::broadcast_prefix("vmap", spec, args_def.children[a],
                               [&](py::handle x) { leaves.axes.push_back(axis(x)); });
      in.axes.emplace_back(std::move(leaves));
    }
  }
  o.in = std::move(in);
  return o;
}

py::object make_vmap(py::object f, py::object in_axes, py::object out_axes,
                     std::optional<std::string> axis_name) {
  return wrap(f, [f, in_axes, out_axes, name = axis_name.value_or("")](const py::args& args,
                                                                       const py::kwargs& kwargs) {
    const detail::FlatTree in = pytree::flatten_tree(args);
    detail::VmapOptions o = vmap_options(in_axes, in.def, name);
    const py::object entered = entering(f);
    FlatFn fn = python_fn(entered, in.def, &kwargs);
    if (out_axes.is_none() || PyLong_Check(out_axes.ptr())) {
      o.out =
          OutAxes{{out_axes.is_none() ? std::nullopt : std::optional<int>(out_axes.cast<int>())}};
    } else {
      // A prefix of the result: known once f is traced, and vmap_call reads o.out only after
      // tracing, so the traced function fills it in.
      fn = [fn = std::move(fn), &o, out_axes](const std::vector<Tensor>& x, TreeDef& out_def) {
        std::vector<Tensor> out = fn(x, out_def);
        OutAxes axes;
        pytree::broadcast_prefix("vmap", out_axes, out_def, [&](py::handle a) {
          axes.axes.push_back(a.is_none() ? std::nullopt : std::optional<int>(a.cast<int>()));
        });
        o.out = std::move(axes);
        return out;
      };
    }
    const FlatTree r = detail::vmap_call(o, in.def, in.leaves, fn);
    return unflatten_tensors(r.def, r.leaves);
  });
}

std::string name_of(py::handle f) {
  return py::str(py::getattr(f, "__qualname__", py::getattr(f, "__name__", py::repr(f))));
}

// Which arguments jit holds static, as JAX has it: static_argnums and static_argnames name
// them, and f's signature maps one onto the other, so an argument named in either is static
// whether it is passed by position or by keyword.
struct StaticArgs {
  std::vector<int> nums;           // positions (negative: from the end of the call's arguments)
  std::vector<std::string> names;  // keywords
  std::vector<std::string> positional;  // f's positional parameters' names, for messages
};

StaticArgs static_args_of(py::handle f, py::handle argnums, py::handle argnames) {
  StaticArgs s;
  if (PyLong_Check(argnums.ptr()))
    s.nums.push_back(argnums.cast<int>());
  else
    for (py::handle k : argnums) {
      if (!PyLong_Check(k.ptr()))
        fail("jit", "static_argnums must be an int or a sequence of ints: got ", repr_of(argnums),
             ", expected e.g. 1 or (1, 2)");
      s.nums.push_back(k.cast<int>());
    }
  if (PyUnicode_Check(argnames.ptr()))
    s.names.push_back(argnames.cast<std::string>());
  else
    for (py::handle n : argnames) {
      if (!PyUnicode_Check(n.ptr()))
        fail("jit", "static_argnames must be a str or a sequence of str: got ", repr_of(argnames),
             ", expected e.g. \"n\" or (\"n\", \"mode\")");
      s.names.push_back(n.cast<std::string>());
    }
  py::object sig;
  try {
    sig = py::module_::import("inspect").attr("signature")(f);
  } catch (const py::error_already_set&) {
    return s;  // no signature (some builtins): the arguments are taken as given
  }
  // Parameter kinds, as inspect numbers them.
  enum Kind { positional_only, positional_or_keyword, var_positional, keyword_only, var_keyword };
  std::vector<std::pair<std::string, int>> params;
  bool var_args = false, var_kwargs = false;
  for (py::handle p : sig.attr("parameters").attr("values")()) {
    const int kind = py::int_(p.attr("kind")).cast<int>();
    var_args = var_args || kind == var_positional;
    var_kwargs = var_kwargs || kind == var_keyword;
    if (kind == positional_only || kind == positional_or_keyword)
      s.positional.push_back(p.attr("name").cast<std::string>());
    params.emplace_back(p.attr("name").cast<std::string>(), kind);
  }
  const auto n = static_cast<int>(s.positional.size());
  const std::vector<int> given = s.nums;
  for (int k : given) {
    if (!var_args && (k >= n || k < -n))
      fail("jit", "static_argnums has ", k, ", but ", name_of(f), " takes ", n,
           " positional arguments: got static_argnums=", repr_of(argnums),
           ", expected indices in [", -n, ", ", n - 1, "]");
    if (k >= 0 && k < n && params[static_cast<std::size_t>(k)].second == positional_or_keyword &&
        std::find(s.names.begin(), s.names.end(), s.positional[static_cast<std::size_t>(k)]) ==
            s.names.end())
      s.names.push_back(s.positional[static_cast<std::size_t>(k)]);
  }
  for (const std::string& name : std::vector<std::string>(s.names)) {
    auto p =
        std::find_if(params.begin(), params.end(), [&](const auto& q) { return q.first == name; });
    if (p == params.end() ? !var_kwargs
                          : p->second == positional_only || p->second == var_positional ||
                                p->second == var_keyword)
      fail("jit", "static_argnames has '", name, "', which ", name_of(f),
           " does not take as a keyword: got static_argnames=", repr_of(argnames),
           ", expected names of its parameters");
    const auto k = static_cast<int>(p - params.begin());
    if (p != params.end() && p->second == positional_or_keyword &&
        std::find(s.nums.begin(), s.nums.end(), k) == s.nums.end())
      s.nums.push_back(k);
  }
  return s;
}

// jit(f): one JitCache per value of the static arguments.
class Jit {
 public:
  Jit(py::object f, StaticArgs statics) : f_(std::move(f)), statics_(std::move(statics)) {
    name_ = py::getattr(f_, "__name__", py::str("jit")).cast<std::string>();
  }

  // Runs without the GIL (f, when traced, takes it back): another Python thread that traces
  // the same signature waits for this one inside jit_call and must not hold the GIL meanwhile,
  // and compiled code runs while other Python threads do.
  py::object call(const py::args& args, const py::kwargs& kwargs) {
    return with_signature(
        args, kwargs, [](detail::JitCache& cache, const detail::FlatTree& in, const FlatFn& fn) {
          const FlatFn with_gil = [&fn](const std::vector<Tensor>& leaves, TreeDef& out_def) {
            py::gil_scoped_acquire gil;
            return fn(leaves, out_def);
          };
          FlatTree r;
          {
            py::gil_scoped_release no_gil;
            r = detail::jit_call(cache, in.def, in.leaves, with_gil);
          }
          return unflatten_tensors(r.def, r.leaves);
        });
  }

  // The optimised IR for these arguments (traces if needed), as text.
  py::object lower(const py::args& args, const py::kwargs& kwargs) {
    return with_signature(
        args, kwargs, [](detail::JitCache& cache, const detail::FlatTree& in, const FlatFn& fn) {
          std::ostringstream text;
          text << detail::jit_lower(cache, in.def, in.leaves, fn);
          return py::object(py::str(text.str()));
        });
  }

  // The number of traced signatures over all static-argument values.
  std::size_t cache_size() const {
    std::size_t n = plain_ ? detail::jit_cache_size(*plain_) : 0;
    for (const auto& c : by_static_) n += detail::jit_cache_size(*c);
    return n;
  }

 private:
  // A static value joins the cache key with its type, so 1, 1.0 and True stay apart; one that
  // cannot be hashed cannot be a key.
  py::tuple key_entry(py::object id, py::handle value, const std::string& what) const {
    if (PyObject_Hash(value.ptr()) == -1) {
      PyErr_Clear();
      fail("jit", "static argument ", what, " of ", name_, " is not hashable: got ", repr_of(value),
           " of type ", Py_TYPE(value.ptr())->tp_name,
           ", expected a hashable value (a tuple rather than a list, say)");
    }
    return py::make_tuple(std::move(id), py::type::handle_of(value), value);
  }

  // run(cache, flattened arguments, f as a FlatFn) with the cache of these static arguments.
  template <class Run>
  py::object with_signature(const py::args& args, const py::kwargs& kwargs, const Run& run) {
    if (statics_.nums.empty() && kwargs.empty()) {  // the common case, kept short
      if (!plain_) plain_ = detail::make_jit_cache(name_, std::nullopt);
      const detail::FlatTree in = pytree::flatten_tree(args);
      return run(*plain_, in, python_fn(f_, in.def));
    }
    // Static arguments are replaced by None in the traced tuple and passed by value to f;
    // the other keyword arguments are traced, as one dict after the positional arguments.
    // A static position past the call's arguments is one passed by keyword or left to its
    // default, as in JAX.
    const auto n = static_cast<int>(args.size());
    std::vector<std::size_t> positions;
    for (int k : statics_.nums) {
      const int r = k < 0 ? k + n : k;
      if (r >= 0 && r < n &&
          std::find(positions.begin(), positions.end(), static_cast<std::size_t>(r)) ==
              positions.end())
        positions.push_back(static_cast<std::size_t>(r));
    }
    std::sort(positions.begin(), positions.end());
    py::list key;
    py::list dynamic(args);
    for (std::size_t i : positions) {
      const std::string what = i < statics_.positional.size()
                                   ? std::to_string(i) + " ('" + statics_.positional[i] + "')"
                                   : std::to_string(i);
      key.append(key_entry(py::int_(i), args[i], what));
      dynamic[i] = py::none();
    }
    py::dict traced_kwargs, static_kwargs;
    for (auto [name, value] : kwargs) {
      const auto s = py::cast<std::string>(name);
      if (std::find(statics_.names.begin(), statics_.names.end(), s) == statics_.names.end()) {
        traced_kwargs[name] = value;
        continue;
      }
      static_kwargs[name] = value;
    }
    // Keyword order is the caller's: the key takes them sorted.
    py::list names(static_kwargs);
    if (PyList_Sort(names.ptr()) != 0) throw py::error_already_set();
    for (py::handle name : names)
      key.append(key_entry(py::reinterpret_borrow<py::object>(name), static_kwargs[name],
                           "'" + py::cast<std::string>(name) + "'"));
    const py::tuple key_tuple(key);
    py::object slot = caches_.attr("get")(key_tuple);
    if (slot.is_none()) {
      slot = py::int_(by_static_.size());
      caches_[key_tuple] = slot;
      by_static_.push_back(detail::make_jit_cache(name_, std::nullopt));
    }
    dynamic.append(traced_kwargs);
    const detail::FlatTree in = pytree::flatten_tree(py::tuple(dynamic));
    const FlatFn fn = [this, &args, &positions, &static_kwargs, &in](
                          const std::vector<Tensor>& leaves, TreeDef& out_def) {
      const std::size_t n = args.size();
      py::tuple all = pytree::unflatten_tensors(in.def, leaves);
      py::tuple call_args(n);
      for (std::size_t i = 0; i < n; ++i) call_args[i] = all[i];
      for (std::size_t i : positions) call_args[i] = args[i];
      py::dict call_kwargs = py::reinterpret_borrow<py::dict>(all[n]);
      for (auto [name, value] : static_kwargs) call_kwargs[name] = value;
      const py::object out = f_(*call_args, **call_kwargs);
      std::vector<Tensor> flat;
      out_def = flatten_tensors(out, flat);
      return flat;
    };
    return run(*by_static_[slot.cast<std::size_t>()], in, fn);
  }

  py::object f_;
  StaticArgs statics_;
  std::string name_;
  std::shared_ptr<detail::JitCache> plain_;
  py::dict caches_;  // static values (a tuple) -> index into by_static_
  std::vector<std::shared_ptr<detail::JitCache>> by_static_;
};

// nondiff_argnums of custom_jvp and custom_vjp (JAX's): positional arguments that are static
// Python values (callables, ints, ...). They are not traced or differentiated; the function
// gets them in place and the rules first, as JAX passes them.
struct Nondiff {
  std::vector<int> argnums;

  // One call's arguments split into the traced ones (in order) and the nondiff values (in
  // argnums order), with f and the rules bound to the nondiff values.
  struct Call {
    py::tuple diff;
    py::object f, fwd, rule;  // fwd and rule: unset when the object has none
  };
  Call split(std::string_view op, const py::args& args, const py::object& f, const py::object& fwd,
             const py::object& rule) const {
    if (argnums.empty()) return {py::tuple(args), f, fwd, rule};
    const std::vector<int> at = resolve_argnums(op, argnums, args.size());
    std::vector<bool> is_static(args.size(), false);
    py::tuple statics(at.size());
    for (std::size_t k = 0; k < at.size(); ++k) {
      const auto i = static_cast<std::size_t>(at[k]);
      if (is_static[i]) fail(op, "nondiff_argnums repeats ", at[k], ", expected distinct indices");
      is_static[i] = true;
      statics[k] = args[i];
    }
    py::list diff;
    for (std::size_t i = 0; i < args.size(); ++i)
      if (!is_static[i]) diff.append(args[i]);
    // f and fwd take the arguments in place: the traced ones come back between the statics.
    auto in_place = [is_static, statics, at](py::object fn) -> py::object {
      if (fn.is_none()) return fn;
      return py::cpp_function([fn, is_static, statics, at](const py::args& d) {
        py::tuple full(is_static.size());
        for (std::size_t k = 0; k < at.size(); ++k)
          full[static_cast<std::size_t>(at[k])] = statics[k];
        for (std::size_t i = 0, j = 0; i < is_static.size(); ++i)
          if (!is_static[i]) full[i] = d[j++];
        return fn(*full);
      });
    };
    py::object partial = py::module_::import("functools").attr("partial");
    return {py::tuple(diff), in_place(f), in_place(fwd),
            rule.is_none() ? rule : partial(rule, *statics)};
  }
};

std::vector<int> nondiff_argnums_of(std::string_view op, py::handle s) {
  if (PyLong_Check(s.ptr())) return {s.cast<int>()};
  if (!py::isinstance<py::tuple>(s) && !py::isinstance<py::list>(s))
    fail(op, "nondiff_argnums must be an int or a tuple of ints: got ", repr_of(s),
         ", expected e.g. (0,)");
  return s.cast<std::vector<int>>();
}

// custom_jvp(f) with JAX's f.defjvp(rule): rule(*nondiff, primals, tangents) -> (primal_out,
// tangent_out).
struct CustomJvp {
  py::object f, rule;
  Nondiff nondiff;
  // Set while the rule runs: a rule that calls the function itself (as JAX's rules may, for
  // primal_out) gets plain f, since Kiln takes the primal output from f anyway.
  std::shared_ptr<int> in_rule = std::make_shared<int>(0);

  py::object call(const py::args& args) const {
    if (*in_rule > 0) return f(*args);
    if (rule.is_none())
      fail("custom_jvp",
           "no rule: got a custom_jvp function without one, expected f.defjvp(rule) "
           "before calling it");
    const Nondiff::Call c = nondiff.split("custom_jvp", args, f, py::none(), rule);
    const detail::FlatTree in = pytree::flatten_tree(c.diff);
    // Kiln's core computes the primal output with f and takes only the tangent from the rule.
    auto factory = [r = c.rule, depth = in_rule](const TreeDef& rule_args_def) -> FlatFn {
      return [r, depth, def = rule_args_def](const std::vector<Tensor>& leaves, TreeDef& out_def) {
        const py::tuple pt = unflatten_tensors(def, leaves);
        ++*depth;
        py::object out;
        try {
          out = r(pt[0], pt[1]);
        } catch (...) {
          --*depth;
          throw;
        }
        --*depth;
        if (!py::isinstance<py::tuple>(out) || py::len(out) != 2)
          fail("custom_jvp", "the rule must return (primal_out, tangent_out): got ", repr_of(out),
               ", expected a tuple of two");
        std::vector<Tensor> flat;
        out_def = flatten_tensors(out[py::int_(1)], flat);
        return flat;
      };
    };
    const FlatTree r = detail::custom_jvp_call(in.def, in.leaves, python_fn(c.f, in.def), factory);
    return unflatten_tensors(r.def, r.leaves);
  }
};

// custom_vjp(f) with JAX's f.defvjp(fwd, bwd): fwd(*args) -> (out, residuals) runs once, in
// the forward pass (the core's residual form saves the residuals); bwd(*nondiff, residuals,
// cotangent) -> one cotangent per traced argument (None: zeros).
struct CustomVjp {
  py::object f, fwd, bwd;
  Nondiff nondiff;

  py::object call(const py::args& args) const {
    if (fwd.is_none())
      fail("custom_vjp",
           "no rule: got a custom_vjp function without one, expected "
           "f.defvjp(fwd, bwd) before calling it");
    const Nondiff::Call c = nondiff.split("custom_vjp", args, f, fwd, bwd);
    const detail::FlatTree in = pytree::flatten_tree(c.diff);
    // What a None cotangent stands for: zeros of each argument's leaf types.
    std::vector<std::vector<TensorType>> arg_types;
    for (const detail::LeafRange& r : detail::arg_ranges(in.def)) {
      arg_types.emplace_back();
      for (std::size_t i = r.begin; i < r.end; ++i) arg_types.back().push_back(in.leaves[i].type());
    }
    const bool has_nondiff = !nondiff.argnums.empty();
    auto factory = [bw = c.rule, arg_defs = in.def.children, arg_types,
                    has_nondiff](const TreeDef& rule_args_def) -> FlatFn {
      return [bw, arg_defs, arg_types, has_nondiff, def = rule_args_def](
                 const std::vector<Tensor>& leaves, TreeDef& out_def) {
        const py::tuple rc = unflatten_tensors(def, leaves);  // (residuals, cotangent)
        const py::object cts = bw(rc[0], rc[1]);
        const std::size_t n = arg_defs.size();
        if ((!py::isinstance<py::tuple>(cts) && !py::isinstance<py::list>(cts)) ||
            py::len(cts) != n)
          fail("custom_vjp", "bwd must return one cotangent per argument",
               has_nondiff ? " not in nondiff_argnums" : "", ": got ", repr_of(cts),
               ", expected a tuple of ", n);
        std::vector<Tensor> flat;
        out_def.kind = TreeDef::Kind::tuple;
        out_def.children.clear();
        for (std::size_t i = 0; i < n; ++i) {
          py::handle ct = cts[py::int_(i)];
          if (ct.is_none()) {
            for (const TensorType& t : arg_types[i])
              flat.push_back(broadcast_to(zeros(Shape{}, t.dtype), t.shape, Loc{}));
            out_def.children.push_back(arg_defs[i]);
            continue;
          }
          TreeDef d = flatten_tensors(ct, flat);
          if (d != arg_defs[i])
            fail("custom_vjp", "bwd's cotangent ", i,
                 " does not have its argument's structure: got ", d.to_string(), ", expected ",
                 arg_defs[i].to_string());
          out_def.children.push_back(std::move(d));
        }
        return flat;
      };
    };
    const FlatTree r = detail::custom_vjp_call(in.def, in.leaves, python_fn(c.f, in.def),
                                               python_fn(c.fwd, in.def), factory);
    return unflatten_tensors(r.def, r.leaves);
  }
};

// A Tensor -> Tensor collective applied to every leaf of a tree.
py::object tree_apply(py::handle x, const std::function<Tensor(const Tensor&)>& op) {
  std::vector<Tensor> leaves;
  const TreeDef def = flatten_tensors(x, leaves);
  for (Tensor& t : leaves) t = op(t);
  return unflatten_tensors(def, leaves);
}

// A collective's axis from Python: one name, or a tuple of names taken as one axis.
using AxisArg = std::variant<std::string, std::vector<std::string>>;
template <class F>
Tensor on_axes(const AxisArg& axis, F f) {
  if (const auto* one = std::get_if<std::string>(&axis)) return f(*one);
  return f(AxisNames(std::get<std::vector<std::string>>(axis)));
}
// op(leaf, axis) applied to every leaf of x, the axis one name or an AxisNames.
template <class Op>
py::object each_leaf_over(py::handle x, const AxisArg& axis, Op op) {
  return tree_apply(
      x, [&](const Tensor& t) { return on_axes(axis, [&](const auto& a) { return op(t, a); }); });
}

// pmap(f): one cache per number of positional arguments (in_axes are resolved against it).
class Pmap {
 public:
  Pmap(py::object f, py::object in_axes, py::object out_axes, std::string name)
      : f_(std::move(f)),
        in_axes_(std::move(in_axes)),
        out_axes_(std::move(out_axes)),
        name_(std::move(name)) {}
  py::object call(const py::args& args) {
    const detail::FlatTree in = pytree::flatten_tree(args);
    std::shared_ptr<detail::PmapCache>& cache = caches_[args.size()];
    if (!cache) {
      detail::VmapOptions o = vmap_options(in_axes_, in.def, name_);
      if (!out_axes_.is_none() && !PyLong_Check(out_axes_.ptr()))
        fail("pmap", "out_axes must be an int or None: got ", repr_of(out_axes_),
             ", expected e.g. 0");
      o.out =
          OutAxes{{out_axes_.is_none() ? std::nullopt : std::optional<int>(out_axes_.cast<int>())}};
      cache = detail::make_pmap_cache(o);
    }
    const FlatTree r = detail::pmap_call(*cache, in.def, in.leaves, python_fn(f_, in.def));
    return unflatten_tensors(r.def, r.leaves);
  }

 private:
  py::object f_, in_axes_, out_axes_;
  std::string name_;
  std::unordered_map<std::size_t, std::shared_ptr<detail::PmapCache>> caches_;
};

// Binds a callable class: __call__, __get__ (so it works as a method) and free attributes.
template <class T>
py::class_<T> callable_class(py::module_& m, const char* name, const char* doc) {
  py::class_<T> cls(m, name, py::dynamic_attr(), doc);
  cls.def("__get__", [](py::object self, py::object obj, py::object) -> py::object {
    if (obj.is_none()) return self;
    return py::module_::import("functools").attr("partial")(self, obj);
  });
  return cls;
}

// Python's main thread, the one that runs its signal handlers.
unsigned long g_main_thread = 0;

// Runs Python's signal handlers from inside a compiled loop (kiln::set_interrupt_check), on the
// main thread as Python does: Ctrl-C's raises KeyboardInterrupt, which leaves the loop and the
// jitted call.
void check_python_signals() {
  if (PyThread_get_thread_ident() != g_main_thread) return;
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

}  // namespace

void bind_transforms(py::module_& m) {
  m.def(
      "_set_autograph_entry", [](py::object hook) { autograph_entry() = std::move(hook); },
      py::arg("hook"),
      "Internal (kiln.autograph): hook(f) gives the function that grad, vjp, jvp, jacfwd, "
      "jacrev, hessian, vmap, checkpoint, cond, switch, while_loop, fori_loop and scan call "
      "for f.");
  g_main_thread =
      py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  set_interrupt_check(&check_python_signals);
  callable_class<Transformed>(m, "Transformed", "A function transformed by Kiln.")
      .def("__call__", [](const Transformed& t, const py::args& args, const py::kwargs& kwargs) {
        return t.call(args, kwargs);
      });

  m.def(
      "grad",
      [](py::object f, py::object argnums, bool has_aux) {
        return make_grad(std::move(f), argnums, has_aux, false);
      },
      py::arg("f"), py::arg("argnums") = 0, py::arg("has_aux") = false,
      "grad(f, argnums=0, has_aux=False): a function returning the gradient of the scalar f "
      "with respect to argument `argnums` (a tuple of them for a tuple of ints), shaped like "
      "that argument's pytree. With has_aux f returns (value, aux) and the result is "
      "(gradient, aux). Other keyword arguments pass through to f undifferentiated.");
  m.def(
      "value_and_grad",
      [](py::object f, py::object argnums, bool has_aux) {
        return make_grad(std::move(f), argnums, has_aux, true);
      },
      py::arg("f"), py::arg("argnums") = 0, py::arg("has_aux") = false,
      "value_and_grad(f, argnums=0, has_aux=False): like grad, returning (f(...), gradient); "
      "with has_aux ((value, aux), gradient).");
  m.def(
      "vjp",
      [](py::object f, const py::args& primals, const py::kwargs& kwargs) {
        bool has_aux = false;
        for (auto [k, v] : kwargs) {
          if (k.cast<std::string>() != "has_aux")
            fail("vjp", "unknown keyword argument: got ", k.cast<std::string>(),
                 ", expected has_aux");
          has_aux = v.cast<bool>();
        }
        return vjp(std::move(f), primals, has_aux);
      },
      py::arg("f"),
      "vjp(f, *primals, has_aux=False) -> (f(*primals), vjp_fn): vjp_fn(cotangent) returns a "
      "tuple with the cotangent of each primal. With has_aux f returns (out, aux) and vjp "
      "returns (out, vjp_fn, aux).");
  m.def("jvp", &jvp, py::arg("f"), py::arg("primals"), py::arg("tangents"),
        "jvp(f, primals, tangents) -> (f(*primals), tangent of the output): primals and "
        "tangents are tuples of arguments with the same pytree structure.");
  m.def(
      "jacfwd",
      [](py::object f, py::object argnums) { return make_jacobian(std::move(f), argnums, true); },
      py::arg("f"), py::arg("argnums") = 0,
      "jacfwd(f, argnums=0): the Jacobian by forward mode. The result has f's output "
      "structure with each leaf replaced by the argument's pytree (a tuple of them for a tuple "
      "argnums) whose leaves hold d(output leaf)/d(argument leaf), shaped out.shape + "
      "leaf.shape.");
  m.def(
      "jacrev",
      [](py::object f, py::object argnums) { return make_jacobian(std::move(f), argnums, false); },
      py::arg("f"), py::arg("argnums") = 0,
      "jacrev(f, argnums=0): the Jacobian by reverse mode, shaped as jacfwd's.");
  m.def(
      "hessian",
      [](py::object f, py::object argnums) {
        py::object g = make_grad(f, argnums, false, false);
        py::object h = make_jacobian(g, argnums, true);
        copy_metadata(h, f);
        return h;
      },
      py::arg("f"), py::arg("argnums") = 0,
      "hessian(f, argnums=0): jacfwd(grad(f, argnums), argnums), the Hessian of a scalar f "
      "(forward over reverse).");
  m.def("vmap", &make_vmap, py::arg("f"), py::arg("in_axes") = 0, py::arg("out_axes") = 0,
        py::arg("axis_name") = py::none(),
        "vmap(f, in_axes=0, out_axes=0, axis_name=None): f written for one example, run on a "
        "batch. in_axes: an int or None for every argument, or a tuple with one entry per "
        "argument, each an int, None (not batched) or a pytree prefix of that argument. "
        "out_axes: an int, None, or a pytree prefix of the result. axis_name names the axis "
        "for collectives (psum, ...).");

  callable_class<Jit>(m, "Jitted", "A function compiled by kiln.jit.")
      .def("__call__", &Jit::call)
      .def("lower", &Jit::lower,
           "lower(*args, **kwargs): the optimised IR compiled for these arguments, as text "
           "(traces f if this signature is new).")
      .def("_cache_size", &Jit::cache_size,
           "The number of signatures traced so far (over all static-argument values).");
  m.def(
      "jit",
      [](py::object f, py::object static_argnums, py::object static_argnames) -> py::object {
        auto make = [static_argnums, static_argnames](py::object fn) {
          py::object j = py::cast(Jit(fn, static_args_of(fn, static_argnums, static_argnames)));
          copy_metadata(j, fn);
          return j;
        };
        if (f.is_none())  // @jit(static_argnums=...)
          return py::cpp_function([make](py::object fn) { return make(std::move(fn)); });
        return make(std::move(f));
      },
      py::arg("f") = py::none(), py::arg("static_argnums") = py::tuple(),
      py::arg("static_argnames") = py::tuple(),
      "jit(f, static_argnums=(), static_argnames=()): f compiled. The first call for each "
      "signature (pytree structure, strings and static arguments by value, dtypes and shapes) "
      "traces f once and compiles it; later calls run the compiled code without calling f. "
      "Static arguments (positions in static_argnums, keyword names in static_argnames) must "
      "be hashable and are passed to f as they are; f's signature maps names and positions "
      "onto each other, so an argument named in either is static whether passed by position "
      "or by keyword. Other keyword arguments are traced like positional ones. Usable as @jit "
      "and @jit(static_argnums=..., static_argnames=...).");

  m.def(
      "checkpoint",
      [](py::object f, std::optional<std::vector<std::string>> recompute) {
        std::optional<CheckpointPolicy> policy;
        if (recompute) policy = CheckpointPolicy{*recompute};
        return wrap(f, [f, policy](const py::args& args, const py::kwargs& kwargs) {
          const detail::FlatTree in = pytree::flatten_tree(args);
          const py::object fn = entering(f);
          const FlatTree r =
              detail::checkpoint_call(in.def, in.leaves, python_fn(fn, in.def, &kwargs), policy);
          return unflatten_tensors(r.def, r.leaves);
        });
      },
      py::arg("f"), py::arg("recompute") = py::none(),
      "checkpoint(f): the same function, but reverse mode keeps only its inputs and recomputes "
      "its intermediates in the backward pass (memory for compute). checkpoint(f, recompute="
      "[names]) is a policy: the backward pass recomputes the results of the named primitives "
      "(['all_gather']: sharded weights gathered again) and keeps every other value it reads; "
      "applied when jit optimises the program (eager reverse mode recomputes everything).");

  callable_class<CustomJvp>(m, "CustomJvp", "A function with a custom forward-mode rule.")
      .def("__call__", &CustomJvp::call)
      .def(
          "defjvp",
          [](CustomJvp& self, py::object rule) {
            self.rule = rule;
            return rule;
          },
          py::arg("rule"),
          "defjvp(rule): rule(*nondiff_args, primals, tangents) -> (primal_out, tangent_out). "
          "Returns rule, so it works as a decorator.");
  m.def(
      "custom_jvp",
      [](py::object f, py::object nondiff_argnums) {
        py::object out = py::cast(
            CustomJvp{f, py::none(), Nondiff{nondiff_argnums_of("custom_jvp", nondiff_argnums)}});
        copy_metadata(out, f);
        return out;
      },
      py::arg("f"), py::arg("nondiff_argnums") = py::tuple(),
      "custom_jvp(f, nondiff_argnums=()): f with a derivative rule given by f.defjvp(rule), "
      "rule(*nondiff_args, primals, tangents) -> (primal_out, tangent_out), with primals and "
      "tangents tuples of f's other arguments. Kiln computes the primal output with f and "
      "takes the tangent from the rule; reverse mode transposes the rule, so grad uses it "
      "too. nondiff_argnums: positional arguments that are static Python values (callables, "
      "ints, ...), not differentiated and passed first to the rule, as in JAX. With "
      "functools.partial(kiln.custom_jvp, nondiff_argnums=(0,)) it is a decorator.");
  callable_class<CustomVjp>(m, "CustomVjp", "A function with a custom reverse-mode rule.")
      .def("__call__", &CustomVjp::call)
      .def(
          "defvjp",
          [](CustomVjp& self, py::object fwd, py::object bwd) {
            self.fwd = std::move(fwd);
            self.bwd = std::move(bwd);
          },
          py::arg("fwd"), py::arg("bwd"),
          "defvjp(fwd, bwd): fwd(*args) -> (out, residuals), run once in the forward pass; "
          "bwd(*nondiff_args, residuals, cotangent) -> a tuple with one cotangent per argument "
          "not in nondiff_argnums (None for zeros).");
  m.def(
      "custom_vjp",
      [](py::object f, py::object nondiff_argnums) {
        py::object out = py::cast(CustomVjp{
            f, py::none(), py::none(), Nondiff{nondiff_argnums_of("custom_vjp", nondiff_argnums)}});
        copy_metadata(out, f);
        return out;
      },
      py::arg("f"), py::arg("nondiff_argnums") = py::tuple(),
      "custom_vjp(f, nondiff_argnums=()): f with a reverse rule given by f.defvjp(fwd, bwd). "
      "fwd(*args) returns (out, residuals) with out what f returns; it runs once per forward "
      "pass and its residuals are saved for bwd (not recomputed). Residuals may be any "
      "pytree: tensors, NumPy arrays and Python scalars arrive in bwd as Tensors, None and "
      "strings as they are. bwd(*nondiff_args, residuals, cotangent) returns a tuple with one "
      "cotangent per differentiated argument, each with that argument's structure, or None "
      "for zeros. Without differentiation f's value is computed by fwd. nondiff_argnums: "
      "positional arguments that are static Python values (callables, ints, ...), passed to "
      "f and fwd in place and first to bwd, as in JAX; with functools.partial(kiln."
      "custom_vjp, nondiff_argnums=(0,)) it is a decorator. Forward mode (jvp, jacfwd, "
      "hessian) is not defined by a reverse rule.");

  m.def(
      "stop_gradient",
      [](py::handle x) {
        return tree_apply(x, [](const Tensor& t) { return stop_gradient(t, Loc{}); });
      },
      py::arg("x"), "x (a pytree) as a constant for differentiation: its derivative is zero.");

  // Collectives over a named vmap / pmap axis, applied to each leaf of a pytree. Those that
  // reduce, gather or index also take a tuple of names, the grid of those axes (major first).
  m.def(
      "psum",
      [](py::handle x, const AxisArg& axis) {
        return each_leaf_over(x, axis,
                              [](const Tensor& t, const auto& a) { return psum(t, a, Loc{}); });
      },
      py::arg("x"), py::arg("axis_name"),
      "The sum of x over all examples of the named axis (or tuple of axes).");
  m.def(
      "pmean",
      [](py::handle x, const AxisArg& axis) {
        return each_leaf_over(x, axis,
                              [](const Tensor& t, const auto& a) { return pmean(t, a, Loc{}); });
      },
      py::arg("x"), py::arg("axis_name"),
      "The mean of x over all examples of the named axis (or tuple of axes).");
  m.def(
      "pmax",
      [](py::handle x, const AxisArg& axis) {
        return each_leaf_over(x, axis,
                              [](const Tensor& t, const auto& a) { return pmax(t, a, Loc{}); });
      },
      py::arg("x"), py::arg("axis_name"),
      "The maximum of x over all examples of the named axis (or tuple of axes).");
  m.def(
      "pmin",
      [](py::handle x, const AxisArg& axis) {
        return each_leaf_over(x, axis,
                              [](const Tensor& t, const auto& a) { return pmin(t, a, Loc{}); });
      },
      py::arg("x"), py::arg("axis_name"),
      "The minimum of x over all examples of the named axis (or tuple of axes).");
  m.def(
      "all_gather",
      [](py::handle x, const AxisArg& axis) {
        return each_leaf_over(
            x, axis, [](const Tensor& t, const auto& a) { return all_gather(t, a, Loc{}); });
      },
      py::arg("x"), py::arg("axis_name"),
      "Every example's x, stacked along a new leading axis (a tuple of axes: the grid's "
      "examples, the first axis major).");
  m.def(
      "axis_index",
      [](const AxisArg& axis) {
        return on_axes(axis, [&](const auto& a) { return axis_index(a, Loc{}); });
      },
      py::arg("axis_name"),
      "This example's position along the named axis, or in the grid of a tuple of axes "
      "(int32 scalar).");
  m.def(
      "ppermute",
      [](py::handle x, const std::string& axis,
         const std::vector<std::pair<int64_t, int64_t>>& perm) {
        return tree_apply(x, [&](const Tensor& t) { return ppermute(t, axis, perm, Loc{}); });
      },
      py::arg("x"), py::arg("axis_name"), py::arg("perm"),
      "For each (source, dest) pair in perm, example dest gets example source's x; the others "
      "get zeros.");
  m.def(
      "all_to_all",
      [](py::handle x, const std::string& axis, int64_t split_axis, int64_t concat_axis) {
        return tree_apply(x, [&](const Tensor& t) {
          return all_to_all(t, axis, split_axis, concat_axis, Loc{});
        });
      },
      py::arg("x"), py::arg("axis_name"), py::arg("split_axis"), py::arg("concat_axis"),
      "Example i's result at j along concat_axis is example j's x at i along split_axis.");
  m.def(
      "psum_scatter",
      [](py::handle x, const AxisArg& axis, int64_t scatter_dimension) {
        return each_leaf_over(x, axis, [&](const Tensor& t, const auto& a) {
          return psum_scatter(t, a, scatter_dimension, Loc{});
        });
      },
      py::arg("x"), py::arg("axis_name"), py::arg("scatter_dimension") = 0,
      "Example i gets the sum over examples of x at index i along scatter_dimension (a tuple of "
      "axes: i is the position in their grid, the first axis major).");

  callable_class<Pmap>(m, "Pmapped", "A function mapped over processes by kiln.pmap.")
      .def("__call__", &Pmap::call);
  m.def(
      "pmap",
      [](py::object f, py::object in_axes, py::object out_axes, std::optional<std::string> name) {
        py::object p = py::cast(Pmap(f, in_axes, out_axes, name.value_or("")));
        copy_metadata(p, f);
        return p;
      },
      py::arg("f"), py::arg("in_axes") = 0, py::arg("out_axes") = 0,
      py::arg("axis_name") = py::none(),
      "pmap(f, in_axes=0, out_axes=0, axis_name=None): SPMD over the processes started by "
      "mpirun (docs/DISTRIBUTED.md): each process passes its local examples and the named axis "
      "spans all of them; traced once per signature and compiled. In one process it is "
      "jit(vmap(f)). in_axes: an int, None or a tuple of them; out_axes: an int or None.");
  m.def("process_index", &distributed::process_index,
        "This process's index among those mpirun started (0 without mpirun), as JAX's.");
  m.def("process_count", &distributed::process_count,
        "The number of processes mpirun started (1 without mpirun), as JAX's.");
}

}  // namespace kiln::python
