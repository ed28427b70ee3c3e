// kiln.optim's native half: the optimisers of include/kiln/optim.h on flat lists of leaves and
// the learning-rate schedules. python/kiln/optim.py flattens pytrees of parameters and keeps the
// state as a pytree (docs/PYTHON.md, "nn, optim, data and io").
#include "kiln/optim.h"

#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "kiln/zero.h"

namespace kiln::python {
namespace {

py::list from_leaves(const std::vector<Tensor>& leaves) {
  py::list out;
  for (const Tensor& t : leaves) out.append(py::cast(t));
  return out;
}

// A TreeDef whose leaves carry the Python tree's names, so Kiln's messages name them
// ("gradient for 'layers.0.weight' ..."). Python checks the structures themselves.
optim::detail::FlatTree named_flat(std::vector<Tensor> leaves,
                                   const std::vector<std::string>& names) {
  if (names.size() != leaves.size())
    fail("optim", "internal: got ", names.size(), " names for ", leaves.size(), " leaves");
  TreeDef def;
  def.kind = TreeDef::Kind::map;
  def.names = names;
  def.children.resize(leaves.size());
  return {std::move(leaves), std::move(def)};
}

using Slots = std::map<std::string, std::vector<py::object>>;

// One update from Python's leaves: `update` on the named flat trees, its result as (params,
// step, {slot: leaves}).
template <class Update>
py::tuple update_with(const Update& update, const std::vector<py::object>& params,
                      const std::vector<py::object>& grads, py::handle step, const Slots& slots,
                      const std::vector<std::string>& names) {
  std::map<std::string, optim::detail::FlatTree> flat_slots;
  for (const auto& [name, leaves] : slots)
    flat_slots.emplace(name, named_flat(to_leaves(leaves), names));
  const optim::detail::FlatUpdate u =
      update(named_flat(to_leaves(params), names), named_flat(to_leaves(grads), names),
             to_tensor(step), flat_slots);
  py::dict next_slots;
  for (const auto& [name, leaves] : u.state.slots) next_slots[py::str(name)] = from_leaves(leaves);
  return py::make_tuple(from_leaves(u.params), u.state.step, next_slots);
}

// A learning rate from Python: a number, a Schedule, or a callable step -> rate.
optim::Schedule to_schedule(py::handle value) {
  if (py::isinstance<optim::Schedule>(value)) return value.cast<optim::Schedule>();
  if (py::isinstance<py::float_>(value) || py::isinstance<py::int_>(value))
    return optim::Schedule(value.cast<double>());
  if (PyCallable_Check(value.ptr())) {
    auto fn = py::reinterpret_borrow<py::object>(value);
    return optim::Schedule([fn](const Tensor& step) { return to_tensor(fn(step)); });
  }
  fail("optim", "a learning rate must be a number, a Schedule or a callable step -> rate: got a ",
       py::str(value.get_type().attr("__name__")).cast<std::string>());
}

// decay_on="all" or "matrices" (optim::DecayOn).
optim::DecayOn to_decay_on(const std::string& name) {
  if (name == "all") return optim::DecayOn::all;
  if (name == "matrices") return optim::DecayOn::matrices;
  fail("optim", "unknown decay_on: got '", name, "', expected 'all' or 'matrices'");
}

void bind_schedules(py::module_& optim) {
  py::class_<optim::Schedule> schedule(
      optim, "Schedule",
      "A learning rate as a function of the step (updates done before this one), computed with "
      "Kiln ops so that it is traced inside jit. Call it with an int (a float) or an i32 scalar "
      "Tensor (a float64 scalar Tensor).");
  schedule.def(py::init([](py::handle value) { return to_schedule(value); }), py::arg("value"),
               "From a number (constant) or a callable step -> rate.");
  schedule.def(
      "__call__", [](const optim::Schedule& s, int64_t step) { return s(step); }, py::arg("step"));
  schedule.def(
      "__call__", [](const optim::Schedule& s, const Tensor& step) { return s(step); },
      py::arg("step"));
  schedule.def_property_readonly("constant_value", &optim::Schedule::constant_value,
                                 "The rate when the schedule is a constant, else None.");

  optim.def("constant", &optim::constant, py::arg("lr"), "lr at every step.");
  optim.def("step_decay", &optim::step_decay, py::arg("lr"), py::arg("step_size"), py::arg("gamma"),
            "lr * gamma^floor(step / step_size), as torch's StepLR.");
  optim.def("cosine_decay", &optim::cosine_decay, py::arg("lr"), py::arg("decay_steps"),
            py::arg("final_lr") = 0.0,
            "Cosine from lr at step 0 to final_lr at decay_steps, then constant.");
  optim.def(
      "linear_warmup",
      [](int64_t warmup_steps, py::handle after, double init_lr) {
        return optim::linear_warmup(warmup_steps, to_schedule(after), init_lr);
      },
      py::arg("warmup_steps"), py::arg("after"), py::arg("init_lr") = 0.0,
      "Linear from init_lr to after(0) over warmup_steps, then after(step - warmup_steps).");
  optim.def(
      "join",
      [](const std::vector<py::object>& schedules, std::vector<int64_t> boundaries) {
        std::vector<optim::Schedule> s;
        for (const py::object& o : schedules) s.push_back(to_schedule(o));
        return optim::join(std::move(s), std::move(boundaries));
      },
      py::arg("schedules"), py::arg("boundaries"),
      "schedules[i](step - boundaries[i-1]) between boundaries (optax.join_schedules).");
  optim.def("warmup_cosine_decay", &optim::warmup_cosine_decay, py::arg("init_lr"),
            py::arg("peak_lr"), py::arg("warmup_steps"), py::arg("decay_steps"),
            py::arg("end_lr") = 0.0, "optax.warmup_cosine_decay_schedule.");
}

void bind_algorithms(py::module_& optim) {
  py::class_<optim::Optimizer> opt(
      optim, "_Optimizer",
      "The native optimiser on flat lists of leaves; kiln.optim.Optimizer wraps it for pytrees.");
  opt.def_property_readonly("name", &optim::Optimizer::name);
  opt.def_property_readonly("slot_names", &optim::Optimizer::slot_names);
  opt.def(
      "learning_rate",
      [](const optim::Optimizer& o, int64_t step) { return o.learning_rate(step); },
      py::arg("step"));
  opt.def(
      "learning_rate",
      [](const optim::Optimizer& o, const Tensor& step) { return o.learning_rate(step); },
      py::arg("step"));
  opt.def(
      "init_leaves",
      [](const optim::Optimizer& o, const std::vector<py::object>& params,
         const std::vector<std::string>& names) {
        optim::detail::FlatState s =
            optim::detail::init_leaves(o.algorithm(), named_flat(to_leaves(params), names));
        py::dict slots;
        for (const auto& [name, leaves] : s.slots) slots[py::str(name)] = from_leaves(leaves);
        return py::make_tuple(s.step, slots);
      },
      py::arg("params"), py::arg("names"), "(step, {slot: leaves}) before the first update.");
  opt.def(
      "update_leaves",
      [](const optim::Optimizer& o, const std::vector<py::object>& params,
         const std::vector<py::object>& grads, py::handle step, const Slots& slots,
         const std::vector<std::string>& names) {
        return update_with(
            [&](const optim::detail::FlatTree& p, const optim::detail::FlatTree& g, const Tensor& s,
                const std::map<std::string, optim::detail::FlatTree>& sl) {
              return optim::detail::update_leaves(o.algorithm(), p, g, s, sl);
            },
            params, grads, step, slots, names);
      },
      py::arg("params"), py::arg("grads"), py::arg("step"), py::arg("slots"), py::arg("names"),
      "(params, step, slots) after one update; None gradients leave their leaves as they are.");

  optim.def(
      "_sgd",
      [](py::handle lr, double momentum, double dampening, bool nesterov, double weight_decay,
         std::optional<double> clip_norm) {
        return optim::sgd({.lr = to_schedule(lr),
                           .momentum = momentum,
                           .dampening = dampening,
                           .nesterov = nesterov,
                           .weight_decay = weight_decay,
                           .clip_norm = clip_norm});
      },
      py::arg("lr"), py::arg("momentum"), py::arg("dampening"), py::arg("nesterov"),
      py::arg("weight_decay"), py::arg("clip_norm"));
  optim.def(
      "_adam",
      [](py::handle lr, double b1, double b2, double eps, double weight_decay,
         const std::string& decay_on, std::optional<double> clip_norm) {
        return optim::adam({.lr = to_schedule(lr),
                            .b1 = b1,
                            .b2 = b2,
                            .eps = eps,
                            .weight_decay = weight_decay,
                            .decay_on = to_decay_on(decay_on),
                            .clip_norm = clip_norm});
      },
      py::arg("lr"), py::arg("b1"), py::arg("b2"), py::arg("eps"), py::arg("weight_decay"),
      py::arg("decay_on"), py::arg("clip_norm"));
  optim.def(
      "_adamw",
      [](py::handle lr, double b1, double b2, double eps, double weight_decay,
         const std::string& decay_on, std::optional<double> clip_norm) {
        return optim::adamw({.lr = to_schedule(lr),
                             .b1 = b1,
                             .b2 = b2,
                             .eps = eps,
                             .weight_decay = weight_decay,
                             .decay_on = to_decay_on(decay_on),
                             .clip_norm = clip_norm});
      },
      py::arg("lr"), py::arg("b1"), py::arg("b2"), py::arg("eps"), py::arg("weight_decay"),
      py::arg("decay_on"), py::arg("clip_norm"));

  optim.def(
      "_global_norm",
      [](const std::vector<py::object>& leaves) {
        return optim::detail::global_norm_leaves(to_leaves(leaves));
      },
      py::arg("leaves"));
  optim.def(
      "_clip_leaves",
      [](const std::vector<py::object>& leaves, double max_norm) {
        return from_leaves(optim::detail::clip_leaves(to_leaves(leaves), max_norm));
      },
      py::arg("leaves"), py::arg("max_norm"));
}

// ZeRO (kiln/zero.h) on flat lists of leaves: python/kiln/optim.py's ShardLayout, shard,
// gather, scatter_sum and Zero flatten the pytrees.
void bind_zero(py::module_& optim) {
  using distributed::ShardLayout;
  py::class_<ShardLayout>(optim, "_ShardLayout")
      .def(py::init([](const std::vector<py::object>& full, int64_t parts) {
             const std::vector<Tensor> leaves = to_leaves(full);
             return ShardLayout(std::span<const Tensor>(leaves), parts);
           }),
           py::arg("full"), py::arg("parts"))
      .def_property_readonly("parts", &ShardLayout::parts);
  optim.def(
      "_shard_leaves",
      [](const ShardLayout& layout, const std::vector<py::object>& full, py::handle part) {
        const std::vector<Tensor> leaves = to_leaves(full);
        Tensor p;
        // A Python or NumPy integer is checked here; a Tensor (axis_index, traced) is not.
        if (!py::isinstance<Tensor>(part) && py::hasattr(part, "__index__")) {
          const int64_t k = py::module_::import("operator").attr("index")(part).cast<int64_t>();
          if (k < 0 || k >= layout.parts())
            fail("zero", "bad part: got ", k, ", expected one in [0, ", layout.parts(), ")");
          p = tensor(static_cast<int32_t>(k));
        } else {
          p = to_tensor(part);
        }
        return from_leaves(distributed::detail::shard_leaves(layout, leaves, p));
      },
      py::arg("layout"), py::arg("full"), py::arg("part"));
  optim.def(
      "_gather_leaves",
      [](const ShardLayout& layout, const std::vector<py::object>& pieces,
         const std::string& axis) {
        const std::vector<Tensor> leaves = to_leaves(pieces);
        return from_leaves(distributed::detail::gather_leaves(layout, leaves, axis));
      },
      py::arg("layout"), py::arg("pieces"), py::arg("axis"));
  optim.def(
      "_scatter_sum_leaves",
      [](const ShardLayout& layout, const std::vector<py::object>& full, const std::string& axis) {
        const std::vector<Tensor> leaves = to_leaves(full);
        return from_leaves(distributed::detail::scatter_sum_leaves(layout, leaves, axis));
      },
      py::arg("layout"), py::arg("full"), py::arg("axis"));
  py::class_<distributed::Zero>(optim, "_Zero")
      .def(py::init<optim::Optimizer, int, std::string, ShardLayout>(), py::arg("optimizer"),
           py::arg("stage"), py::arg("axis"), py::arg("layout"))
      .def(
          "update_leaves",
          [](const distributed::Zero& z, const std::vector<py::object>& params,
             const std::vector<py::object>& grads, py::handle step, const Slots& slots,
             const std::vector<std::string>& names) {
            return update_with(
                [&](const optim::detail::FlatTree& p, const optim::detail::FlatTree& g,
                    const Tensor& s, const std::map<std::string, optim::detail::FlatTree>& sl) {
                  return z.update_leaves(p, g, s, sl);
                },
                params, grads, step, slots, names);
          },
          py::arg("params"), py::arg("grads"), py::arg("step"), py::arg("slots"), py::arg("names"));
}

}  // namespace

void bind_optim(py::module_& m) {
  py::module_ optim = m.def_submodule("_optim", "Kiln's optimisers (native half).");
  optim.attr("__name__") = "kiln.optim";  // where its classes say they live
  bind_schedules(optim);
  bind_algorithms(optim);
  bind_zero(optim);
}

}  // namespace kiln::python
