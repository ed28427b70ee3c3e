// IR utilities, the verifier and the interpreter.
#include "kiln/ir.h"

#include <algorithm>
#include <ostream>
#include <unordered_map>
#include <unordered_set>

#include "ir/compiled_bodies.h"
#include "ir/trace.h"

namespace kiln::ir {

int Function::next_id() const {
  int m = -1;
  for (const Value& v : params) m = std::max(m, v.id);
  for (const Constant& c : constants) m = std::max(m, c.value.id);
  for (const Equation& e : equations)
    for (const Value& v : e.outputs) m = std::max(m, v.id);
  return m + 1;
}

std::vector<TensorType> Function::param_types() const {
  std::vector<TensorType> t;
  for (const Value& v : params) t.push_back(v.type);
  return t;
}
std::vector<TensorType> Function::result_types() const {
  std::vector<TensorType> t;
  for (const Value& v : results) t.push_back(v.type);
  return t;
}

namespace {

// Verifies f, found `depth` levels below the top-level function, and returns how many levels
// of sub-functions it has below it. `heights` remembers the functions verified already: a
// sub-function shared by several equations (as jit shares them) is checked once.
int verify_at(const Function& f, int depth, std::unordered_map<const Function*, int>& heights) {
  std::unordered_map<int, TensorType> defined;
  auto define = [&](const Value& v, std::string_view what) {
    if (!defined.emplace(v.id, v.type).second)
      fail("verify", "@", f.name, ": value %", v.id, " defined twice (", what,
           "), expected single assignment");
  };
  auto use = [&](const Value& v, std::string_view where) {
    auto it = defined.find(v.id);
    if (it == defined.end())
      fail("verify", "@", f.name, ": ", where, " uses %", v.id,
           " before it is defined, expected values defined above their uses");
    if (it->second != v.type)
      fail("verify", "@", f.name, ": ", where, " uses %", v.id, " as ", v.type,
           ", expected its defined type ", it->second);
  };
  int height = 0;
  for (const Value& v : f.params) define(v, "parameter");
  for (const Constant& c : f.constants) {
    define(c.value, "constant");
    if (c.tensor.type() != c.value.type)
      fail("verify", "@", f.name, ": constant %", c.value.id, " holds ", c.tensor.type(),
           ", expected ", c.value.type);
  }
  for (std::size_t i = 0; i < f.equations.size(); ++i) {
    const Equation& e = f.equations[i];
    if (!e.prim) fail("verify", "@", f.name, ": equation ", i, " has no primitive, expected one");
    const std::string where = "equation " + std::to_string(i) + " (" + e.prim->name + ")";
    std::vector<TensorType> in;
    for (const Value& v : e.inputs) {
      use(v, where);
      in.push_back(v.type);
    }
    for (const auto& [name, attr] : e.attrs.items()) {
      const auto* sub = std::get_if<FunctionRef>(&attr);
      if (!sub) continue;
      if (!*sub)
        fail("verify", "@", f.name, ": ", where, " attribute '", name,
             "' is a null function, expected a sub-function");
      auto it = heights.find(sub->get());
      // Checked before descending, so that verify itself never goes deeper than the limit.
      const int below = it != heights.end() ? it->second : 0;
      if (depth + 1 + below > kMaxNesting)
        fail("verify", "@", f.name, ": ", where, " attribute '", name,
             "' nests sub-functions too deeply: got ", depth + 1 + below,
             " levels, expected at most ir::kMaxNesting = ", kMaxNesting);
      if (it == heights.end())
        it = heights.emplace(sub->get(), verify_at(**sub, depth + 1, heights)).first;
      height = std::max(height, 1 + it->second);
    }
    const std::vector<TensorType> out = e.prim->infer(in, e.attrs);
    if (out.size() != e.outputs.size())
      fail("verify", "@", f.name, ": ", where, " has ", e.outputs.size(), " outputs, expected ",
           out.size());
    for (std::size_t k = 0; k < out.size(); ++k) {
      if (out[k] != e.outputs[k].type)
        fail("verify", "@", f.name, ": ", where, " output ", k, " is typed ", e.outputs[k].type,
             ", expected ", out[k], " from its type rule");
      define(e.outputs[k], where);
    }
  }
  for (const Value& v : f.results) use(v, "return");
  return height;
}

}  // namespace

void verify(const Function& f) {
  std::unordered_map<const Function*, int> heights;
  verify_at(f, 0, heights);
}

namespace {

// Runs f; with `keep_all` false each value is released after its last use, so peak memory
// follows the live set (what makes checkpointing pay off under jit as well).
std::vector<Tensor> run(const Function& f, std::span<const Tensor> args, bool keep_all) {
  if (args.size() != f.params.size())
    fail("evaluate", "@", f.name, " takes ", f.params.size(), " arguments: got ", args.size(),
         ", expected ", f.params.size());
  std::vector<Tensor> env(static_cast<std::size_t>(f.next_id()));
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i].type() != f.params[i].type)
      fail("evaluate", "@", f.name, " argument ", i, " has the wrong type: got ", args[i].type(),
           ", expected ", f.params[i].type);
    env[static_cast<std::size_t>(f.params[i].id)] = args[i];
  }
  for (const Constant& c : f.constants) env[static_cast<std::size_t>(c.value.id)] = c.tensor;
  std::vector<std::size_t> last_use(env.size(), f.equations.size());  // results: never freed
  if (!keep_all) {
    std::vector<bool> is_result(env.size());
    for (const Value& v : f.results) is_result[static_cast<std::size_t>(v.id)] = true;
    for (std::size_t i = 0; i < f.equations.size(); ++i)
      for (const Value& v : f.equations[i].inputs)
        if (!is_result[static_cast<std::size_t>(v.id)])
          last_use[static_cast<std::size_t>(v.id)] = i;
  }
  std::vector<Tensor> ins;
  for (std::size_t i = 0; i < f.equations.size(); ++i) {
    const Equation& e = f.equations[i];
    ins.clear();
    for (const Value& v : e.inputs) ins.push_back(env[static_cast<std::size_t>(v.id)]);
    std::vector<Tensor> outs;
    try {
      outs = bind(*e.prim, ins, e.attrs, Loc{});
    } catch (const Error& err) {
      detail::rethrow_at(err, e.loc);
    }
    for (std::size_t k = 0; k < outs.size(); ++k)
      env[static_cast<std::size_t>(e.outputs[k].id)] = std::move(outs[k]);
    if (!keep_all)
      for (const Value& v : e.inputs)
        if (last_use[static_cast<std::size_t>(v.id)] == i)
          env[static_cast<std::size_t>(v.id)] = Tensor();
  }
  return env;
}

}  // namespace

std::vector<Tensor> evaluate(const Function& f, std::span<const Tensor> args) {
  // A kernel of compiled code (a loop, a call) running one of its bodies runs it compiled.
  if (!tracing())
    if (const Executable* compiled = compiled_body(f)) return compiled->run(args);
  const std::vector<Tensor> env = run(f, args, false);
  std::vector<Tensor> results;
  for (const Value& v : f.results) results.push_back(env[static_cast<std::size_t>(v.id)]);
  return results;
}

std::vector<Tensor> evaluate_values(const Function& f, std::span<const Tensor> args) {
  return run(f, args, true);
}

std::ostream& operator<<(std::ostream& os, const Function& f) { return os << print(f); }

std::ostream& operator<<(std::ostream& os, const CompiledInfo& info) {
  os << (info.backend == Backend::llvm ? "llvm" : "interpreter") << ": " << info.groups.size()
     << " fused groups (" << info.kernels << " distinct kernels), " << info.kernel_calls.size()
     << " kernel calls, arena " << info.arena_bytes << " bytes, compiled in " << info.compile_ms
     << " ms" << (info.from_cache ? " (from the cache)" : "") << "\n";
  if (!info.kernel_calls_in_place.empty()) {
    os << "kernel calls that may write over an input: equations";
    for (int e : info.kernel_calls_in_place) os << " " << e;
    os << "\n";
  }
  if (!info.results_in_place.empty()) {
    os << "results written over the argument of their index:";
    for (int r : info.results_in_place) os << " " << r;
    os << "\n";
  }
  if (!info.channel_blocked.empty()) {
    os << "values stored channel-blocked:";
    for (int v : info.channel_blocked) os << " " << v;
    os << "\n";
  }
  for (std::size_t k = 0; k < info.groups.size(); ++k) {
    const CompiledInfo::Group& g = info.groups[k];
    os << "group " << k << ": equations";
    for (int e : g.equations) os << " " << e;
    os << "; reads " << g.bytes_read << " B, writes " << g.bytes_written << " B";
    for (const CompiledInfo::Group::InPlace& p : g.in_place)
      os << "; value " << p.output << " written over value " << p.input
         << (p.arena ? " (arena)" : " (its buffer)");
    os << "\n" << g.kernel;
  }
  return os;
}

}  // namespace kiln::ir
