#include "ir/trace.h"

#include <algorithm>
#include <unordered_map>

#include "detail/trace_hooks.h"

namespace kiln::detail {

class TraceState : public std::enable_shared_from_this<TraceState> {
 public:
  explicit TraceState(std::string name) { fn.name = std::move(name); }

  ir::Function fn;
  int next_id = 0;
  bool active = true;
  int declared_params = 0;
  std::vector<Tensor> captures;
  std::vector<ir::Value> capture_params;
  // Concrete tensors and outer tracers already given a value here, keyed by TensorImpl.
  // `held` keeps those impls alive so that a key is never reused by another tensor.
  std::unordered_map<const TensorImpl*, ir::Value> known;
  std::vector<Tensor> held;

  ir::Value fresh(const TensorType& t) { return ir::Value{next_id++, t}; }

  ir::Value value_of(const Tensor& t, const std::vector<TraceState*>& stack);
};

namespace {
thread_local std::vector<TraceState*> g_stack;
}

bool trace_active() { return !g_stack.empty(); }

TracingPaused::TracingPaused() { saved_.swap(g_stack); }
TracingPaused::~TracingPaused() { g_stack.swap(saved_); }

ir::Value TraceState::value_of(const Tensor& t, const std::vector<TraceState*>& stack) {
  if (t.is_traced() && t.impl()->tracer->trace().get() == this) return t.impl()->tracer->value();
  if (auto it = known.find(t.impl()); it != known.end()) return it->second;
  ir::Value v = fresh(t.type());
  if (!t.is_traced()) {
    fn.constants.push_back({v, t});
  } else {
    TraceState* owner = t.impl()->tracer->trace().get();
    const bool outer = owner->active && std::find(stack.begin(), stack.end(), owner) != stack.end();
    if (!outer) throw_escaped("trace", t);
    captures.push_back(t);
    capture_params.push_back(v);
  }
  known.emplace(t.impl(), v);
  held.push_back(t);
  return v;
}

bool Tracer::escaped() const { return !trace_->active; }

void throw_escaped(std::string_view op, const Tensor& t) {
  const Tracer& tr = *t.impl()->tracer;
  const ir::SourceLoc& at = tr.created_at();
  fail(op, "a traced value escaped the function that traced it: got a tracer ", t.type(),
       " of the finished trace @", tr.trace()->fn.name,
       at.known() ? " created at " + at.file + ":" + std::to_string(at.line) : std::string(),
       ", expected a concrete tensor or one created inside the current function (return traced "
       "values from the function instead of storing them outside it)");
}

Trace::Trace(std::string name) : state_(std::make_shared<TraceState>(std::move(name))) {
  g_stack.push_back(state_.get());
}

Trace::~Trace() {
  state_->active = false;
  if (!finished_) {
    auto it = std::find(g_stack.begin(), g_stack.end(), state_.get());
    if (it != g_stack.end()) g_stack.erase(it);
  }
}

Tensor Trace::param(const TensorType& type, std::string name) {
  if (!state_->captures.empty())
    fail("trace", "parameter added after a capture: got a new parameter ", type,
         ", expected every declared parameter before the function body runs");
  ir::Value v = state_->fresh(type);
  state_->fn.params.push_back(v);
  state_->fn.param_names.push_back(std::move(name));
  ++state_->declared_params;
  auto impl = std::make_shared<TensorImpl>();
  impl->type = type;
  impl->tracer = std::make_shared<Tracer>(state_, v);
  return Tensor(std::move(impl));
}

std::shared_ptr<ir::Function> Trace::finish(std::span<const Tensor> results) {
  if (g_stack.empty() || g_stack.back() != state_.get())
    fail("trace",
         "traces finished out of order: got a trace that is not the innermost one, "
         "expected nested traces to finish inner first");
  for (const Tensor& r : results) {
    if (!r.defined())
      fail("trace",
           "the function returned an undefined tensor: got a default-constructed "
           "Tensor, expected every result to be computed");
    state_->fn.results.push_back(state_->value_of(r, g_stack));
  }
  g_stack.pop_back();
  finished_ = true;
  state_->active = false;
  auto fn = std::make_shared<ir::Function>(state_->fn);
  for (std::size_t i = 0; i < state_->capture_params.size(); ++i) {
    fn->params.push_back(state_->capture_params[i]);
    fn->param_names.emplace_back();
  }
  return fn;
}

const std::vector<Tensor>& Trace::captures() const { return state_->captures; }

std::vector<Tensor> record(const Primitive& prim, std::span<const Tensor> inputs,
                           const Attrs& attrs, const ir::SourceLoc& loc) {
  TraceState* t = g_stack.back();
  ir::Equation eq;
  eq.prim = &prim;
  eq.attrs = attrs;
  eq.loc = loc;
  std::vector<TensorType> types;
  for (const Tensor& x : inputs) {
    eq.inputs.push_back(t->value_of(x, g_stack));
    types.push_back(x.type());
  }
  std::vector<TensorType> out_types;
  try {
    out_types = prim.infer(types, attrs);
  } catch (const Error& e) {
    rethrow_at(e, loc);
  }
  std::vector<Tensor> outs;
  for (const TensorType& ty : out_types) {
    ir::Value v = t->fresh(ty);
    eq.outputs.push_back(v);
    auto impl = std::make_shared<TensorImpl>();
    impl->type = ty;
    impl->tracer = std::make_shared<Tracer>(t->shared_from_this(), v, loc);
    outs.emplace_back(std::move(impl));
  }
  t->fn.equations.push_back(std::move(eq));
  return outs;
}

void rethrow_at(const Error& e, const ir::SourceLoc& loc) {
  const std::string what = e.what();
  if (!loc.known() || what.find(" (at ") != std::string::npos) throw e;
  throw Error(e.op(), what.substr(e.op().size() + 3) + " (at " + loc.file + ":" +
                          std::to_string(loc.line) + ")");
}

}  // namespace kiln::detail

namespace kiln::ir {

bool tracing() { return detail::trace_active(); }

Traced trace_function(std::string name, const std::vector<TensorType>& params,
                      const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& body,
                      const std::vector<std::string>& param_names) {
  detail::Trace t(std::move(name));
  std::vector<Tensor> args;
  for (std::size_t i = 0; i < params.size(); ++i)
    args.push_back(t.param(params[i], i < param_names.size() ? param_names[i] : ""));
  const std::vector<Tensor> results = body(args);
  auto fn = t.finish(results);
  return Traced{fn, t.captures()};
}

}  // namespace kiln::ir
