// The compiled walk: every primitive, compiled (ir::Backend::llvm) against the interpreter, a
// walk over the shared sample table (tests/primitive_samples.h).
//
// For every sample, the sample's function is traced into an ir::Function, optimised (as jit
// does before ir::compile) and run through both backends on:
//   * the drawn inputs, and the same draws in every dtype the primitive's kernels accept;
//   * edge values (compare.h: +-0, +-inf, NaN, denormals, the largest finite values, integer
//     min/max) in each of those dtypes;
//   * integer index inputs as int32 and int64; convert from every dtype to every dtype;
//   * empty and 0-d versions of the inputs (where the primitive's type rule accepts them);
//   * non-contiguous views of the inputs (every other element of a larger buffer; transposed,
//     or reversed with negative strides).
// Results compare by the primitive's rule (compare.h): exact, within kTranscendentalUlps,
// within the reduction bound, or the program bound for primitives that hold a computation
// (control flow, calls, matmul, convolutions). When the interpreter raises an Error, the
// backend must too. A primitive without a sample fails
// PrimitiveSamples.EveryPrimitiveHasTheSamplesItsWalksNeed (tests/test_ad_rules.cpp), and
// CompiledWalk.EveryDtypeTheKernelsAcceptIsWalked fails when a dtype a kernel accepts has no
// case, CompiledWalkRegistry.EveryLoweringRunsFusedInTheWalk when a primitive with a lowering
// (kiln/lowering.h) runs fused in none. CompiledWalk.ChecksCatchFaultyBackends shows that each
// check can fail.
//
// Also here: one compiled function called from four threads at once (TSan runs it).
#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "compare.h"
#include "primitive_samples.h"
#include "program_generator.h"

namespace kiln {
namespace {

using Ts = std::vector<Tensor>;
using samples::Gen;
using samples::PrimitiveSample;
using testing::Factory;
using testing::Rule;

// ---- how each primitive's results compare ---------------------------------------------------

Rule rule_of(const std::string& prim) {
  static const std::set<std::string> transcendental{"exp",     "log", "log1p", "expm1",
                                                    "sin",     "cos", "tan",   "tanh",
                                                    "sigmoid", "erf", "pow",   "rsqrt"};
  static const std::set<std::string> reductions{"reduce_sum", "reduce_prod", "psum",
                                                "psum_scatter"};
  // Primitives holding a computation: sums in another order, transcendentals inside.
  static const std::set<std::string> programs{"matmul",
                                              "conv",
                                              "conv_input_grad",
                                              "conv_weight_grad",
                                              "avg_pool2d",
                                              "max_pool2d_grad",
                                              "scatter_add",
                                              "scatter_add_along",
                                              "call",
                                              "checkpoint",
                                              "custom_jvp",
                                              "custom_vjp",
                                              "cond",
                                              "while",
                                              "while_grad",
                                              "scan"};
  if (transcendental.count(prim)) return Rule::ulps;
  if (reductions.count(prim)) return Rule::reduction;
  if (programs.count(prim)) return Rule::program;
  return Rule::exact;
}
// Sums and products of the largest finite values overflow in an order-dependent way.
bool tame(const std::string& prim) {
  const Rule r = rule_of(prim);
  return r == Rule::reduction || r == Rule::program;
}

// ---- the cases of one sample ------------------------------------------------------------------

struct Case {
  std::string label;
  Ts inputs;
  Attrs attrs;
};

bool has_function(const Attrs& a) {
  for (const auto& [name, value] : a.items())
    if (std::holds_alternative<FunctionRef>(value)) return true;
  return false;
}

// Whether the primitive's type rule and kernels accept these inputs.
bool accepts(const Primitive& p, const Ts& inputs, const Attrs& attrs) {
  std::vector<TensorType> types;
  std::vector<DType> dtypes;
  for (const Tensor& t : inputs) {
    types.push_back(t.type());
    dtypes.push_back(t.dtype());
  }
  try {
    p.infer(types, attrs);
    select_kernel(p, Device::cpu, dtypes);
  } catch (const Error&) {
    return false;
  }
  return true;
}

std::string dtype_label(DType d) { return std::string(dtype_name(d)); }

std::vector<Case> cases_of(const PrimitiveSample& s) {
  const uint64_t seed = samples::seed_of(name_of(s));
  Gen g(seed, seed);
  const samples::Sample base = s.make(g);
  const Ts in = base.values();
  const Attrs& attrs = base.attrs;
  const Primitive& p = primitive(s.prim);
  const bool tm = tame(s.prim);
  std::vector<Case> out{{"drawn", in, attrs}};

  // The value inputs: not fixed, of the dtype of the first of them.
  std::vector<std::size_t> values;
  for (std::size_t k = 0; k < in.size(); ++k)
    if (base.args[k].wrt && (values.empty() || in[k].dtype() == in[values[0]].dtype()))
      values.push_back(k);
  const auto edges = [&](Ts c, const std::string& label) {
    for (std::size_t k : values)
      c[k] = testing::edge_tensor(c[k].type(), static_cast<int64_t>(3 * k + 1), tm);
    out.push_back({"edges_" + label, c, attrs});
  };
  // Bodies, sub-functions and collectives fix their operand types: those keep the drawn
  // dtypes and shapes.
  const bool fixed_types = s.body || !s.axis_name.empty() || has_function(attrs);
  if (fixed_types) {
    if (!values.empty() && (is_floating(in[values[0]].dtype()))) edges(in, "drawn");
  } else if (s.prim == "convert") {
    for (int from = 0; from < kNumDTypes; ++from)
      for (int to = 0; to < kNumDTypes; ++to) {
        const auto df = static_cast<DType>(from), dt = static_cast<DType>(to);
        Attrs a = attrs;
        a.set("dtype", dt);
        const Ts c{testing::cast_draw(in[0], df)};
        const std::string label = dtype_label(df) + "_to_" + dtype_label(dt);
        out.push_back({label, c, a});
        out.push_back({"edges_" + label, {testing::edge_tensor(c[0].type(), 1)}, a});
      }
  } else {
    for (int d = 0; d < kNumDTypes && !values.empty(); ++d) {
      const auto dt = static_cast<DType>(d);
      Ts c = in;
      for (std::size_t k : values) c[k] = testing::cast_draw(in[k], dt);
      if (!accepts(p, c, attrs)) continue;
      // Slow (sanitizer, Debug) builds draw normal values in float32 only; edge values in
      // every dtype.
      if (dt != in[values[0]].dtype() && (!testing::kSlowBuild || dt == float32))
        out.push_back({"as_" + dtype_label(dt), c, attrs});
      edges(c, dtype_label(dt));
    }
    // Integer inputs that are not values (indices, labels) in the other index dtype.
    for (std::size_t k = 0; k < in.size(); ++k) {
      if (base.args[k].wrt || (in[k].dtype() != int32 && in[k].dtype() != int64)) continue;
      Ts c = in;
      c[k] = astype(in[k], in[k].dtype() == int32 ? int64 : int32);
      if (accepts(p, c, attrs)) out.push_back({"index_" + dtype_label(c[k].dtype()), c, attrs});
    }
    // Empty and 0-d versions of every input shaped like the first value input.
    if (!values.empty() && in[values[0]].rank() > 0) {
      const Shape shape = in[values[0]].shape();
      Ts empty = in, scalar = in;
      for (std::size_t k = 0; k < in.size(); ++k) {
        if (in[k].shape() != shape) continue;
        empty[k] = slice(in[k], {Slice{0, 0, 1}});
        scalar[k] = reshape(slice(flatten(in[k]), {Slice{0, 1, 1}}), Shape{});
      }
      if (accepts(p, empty, attrs)) out.push_back({"empty", empty, attrs});
      if (accepts(p, scalar, attrs)) out.push_back({"scalar", scalar, attrs});
    }
  }
  // Non-contiguous views of every input, values unchanged.
  Ts strided = in, transposed = in;
  for (std::size_t k = 0; k < in.size(); ++k) {
    strided[k] = testing::strided_view(in[k]);
    transposed[k] = testing::transposed_view(in[k]);
  }
  out.push_back({"strided", strided, attrs});
  out.push_back({"transposed", transposed, attrs});
  return out;
}

// ---- tracing and checking one case ------------------------------------------------------

// The sample's function over inputs of these types. A collective is applied per example
// inside a vmap over the inputs' leading axis, under the sample's axis name.
std::shared_ptr<const ir::Function> trace_case(const PrimitiveSample& s, const Ts& inputs,
                                               const Attrs& attrs) {
  std::vector<TensorType> types;
  for (const Tensor& t : inputs) types.push_back(t.type());
  if (s.axis_name.empty()) {
    const ir::Traced t = ir::trace_function(
        s.prim, types, [&](const Ts& params) { return samples::apply(s, params, attrs); });
    if (!t.captures.empty()) fail("walk", "the sample's function captured values");
    return t.function;
  }
  const int64_t size = inputs.empty() ? 4 : inputs[0].shape()[0];
  std::vector<TensorType> example;
  for (const TensorType& t : types)
    example.push_back({t.dtype, Shape(std::vector<int64_t>(t.shape.begin() + 1, t.shape.end()))});
  const FunctionRef inner = ir::trace_function(s.prim, example, [&](const Ts& params) {
                              return samples::apply(s, params, attrs);
                            }).function;
  return ir::trace_function(
             s.prim + "_over_" + s.axis_name, types,
             [&](const Ts& params) {
               std::vector<Batched> args;
               for (const Tensor& t : params) args.push_back({t, 0});
               detail::AxisScopeGuard scope(s.axis_name, size);
               Ts results;
               for (const Batched& o : batching::evaluate(*inner, args, size, s.axis_name)) {
                 if (o.dim) {
                   results.push_back(moveaxis(o.value, *o.dim, 0));
                 } else {
                   std::vector<int64_t> shape{size};
                   shape.insert(shape.end(), o.value.shape().begin(), o.value.shape().end());
                   results.push_back(broadcast_to(expand_dims(o.value, 0), Shape(shape)));
                 }
               }
               return results;
             })
      .function;
}

// Empty when the backend agrees with the interpreter on this case; else what differs.
std::optional<std::string> check_case(const PrimitiveSample& s, const Case& c,
                                      const Factory& compiled) {
  const auto f =
      std::make_shared<const ir::Function>(ir::optimize(*trace_case(s, c.inputs, c.attrs)));
  ir::verify(*f);
  // A sample's body is a small program around its primitive (complex parts in, parts out): the
  // reduction rule's magnitudes (the function on |inputs|) do not bound its terms.
  const Rule rule = s.body && rule_of(s.prim) == Rule::reduction ? Rule::program : rule_of(s.prim);
  const testing::Tolerance tol{.rule = rule, .precision = testing::least_precise(*f)};
  if (tol.rule != Rule::reduction)
    return testing::check_program(f, c.inputs, compiled, [tol](std::size_t) { return tol; });
  // The terms' magnitudes: the same function on |inputs| in float64.
  Ts abs_in;
  int64_t most = 1;
  for (const Tensor& t : c.inputs) {
    abs_in.push_back(is_floating(t.dtype()) ? abs(astype(t, float64)) : t);
    most = std::max(most, t.numel());
  }
  const Ts mags = ir::evaluate(*trace_case(s, abs_in, c.attrs), abs_in);
  return testing::check_program(f, c.inputs, compiled, [&](std::size_t j) {
    testing::Tolerance t = tol;
    t.magnitude = mags[j];
    t.terms = std::max<int64_t>(1, most / std::max<int64_t>(1, mags[j].numel()));
    return t;
  });
}

std::string describe(const PrimitiveSample& s, const Case& c) {
  std::string text = name_of(s) + " / " + c.label + " (";
  for (std::size_t k = 0; k < c.inputs.size(); ++k)
    text += (k ? ", " : "") + c.inputs[k].type().to_string() +
            (c.inputs[k].numel() > 1 && !c.inputs[k].is_contiguous() ? " non-contiguous" : "");
  return text + ")";
}

// ---- the walk ---------------------------------------------------------------------------

class CompiledWalk : public ::testing::TestWithParam<PrimitiveSample> {};

TEST_P(CompiledWalk, MatchesInterpreter) {
  const PrimitiveSample& s = GetParam();
  const Factory llvm = testing::backend(ir::Backend::llvm);
  for (const Case& c : cases_of(s)) {
    SCOPED_TRACE(describe(s, c));
    if (c.label == "drawn" && s.axis_name.empty()) {
      ASSERT_TRUE(samples::traces_primitive(*trace_case(s, c.inputs, c.attrs), s))
          << "the sample's function does not contain '" << s.prim << "'";
    }
    if (auto m = check_case(s, c, llvm)) ADD_FAILURE() << *m;
  }
}

INSTANTIATE_TEST_SUITE_P(Compiled, CompiledWalk, ::testing::ValuesIn(samples::compiled_samples()),
                         [](const ::testing::TestParamInfo<PrimitiveSample>& info) {
                           return name_of(info.param);
                         });

// Every dtype a primitive's kernels accept at an input has a case there (primitives whose
// operand types are fixed by sub-functions, bodies or a named axis excepted: their sub-functions
// are walked as the programs they are).
TEST(CompiledWalkRegistry, EveryDtypeTheKernelsAcceptIsWalked) {
  std::map<std::string, std::vector<std::set<DType>>> seen;
  std::set<std::string> fixed;
  for (const PrimitiveSample& s : samples::compiled_samples()) {
    Gen g(1, 1);
    if (s.body || !s.axis_name.empty() || has_function(s.make(g).attrs)) fixed.insert(s.prim);
    for (const Case& c : cases_of(s)) {
      auto& at = seen[s.prim];
      at.resize(std::max(at.size(), c.inputs.size()));
      for (std::size_t k = 0; k < c.inputs.size(); ++k) at[k].insert(c.inputs[k].dtype());
    }
  }
  for (const Primitive* p : all_primitives()) {
    if (fixed.count(p->name)) continue;
    for (const KernelSignature& sig : kernel_signatures(*p)) {
      for (std::size_t k = 0; k < sig.inputs.size(); ++k) {
        for (int d = 0; d < kNumDTypes; ++d) {
          const auto dt = static_cast<DType>(d);
          const auto& at = seen[p->name];
          if (sig.inputs[k].contains(dt) && (k >= at.size() || !at[k].count(dt)))
            ADD_FAILURE() << "primitive '" << p->name << "' accepts " << dt << " at input " << k
                          << " (" << sig.to_string() << ") but the compiled walk has no such case";
        }
      }
    }
  }
}

// Whether the primitive's lowering (kiln/lowering.h) computes it in fused loops.
bool lowered_fused(const Primitive& p) {
  return p.lowering && (p.lowering->elementwise || p.lowering->reduction);
}

// Every primitive with a lowering runs fused in some case of the walk: its equation sits in a
// fused group there, so what the walk compares with the interpreter is the lowering and not the
// kernel. A lowering added without a sample the walk checks, or only with samples that never
// fuse, fails here.
TEST(CompiledWalkRegistry, EveryLoweringRunsFusedInTheWalk) {
  std::set<std::string> fused;
  for (const PrimitiveSample& s : samples::compiled_samples()) {
    const Primitive& p = primitive(s.prim);
    if (!lowered_fused(p) || fused.count(s.prim)) continue;
    for (const Case& c : cases_of(s)) {
      const auto f =
          std::make_shared<const ir::Function>(ir::optimize(*trace_case(s, c.inputs, c.attrs)));
      const auto code = ir::compile(f, {.backend = ir::Backend::llvm});
      for (const ir::CompiledInfo::Group& g : code->info().groups)
        for (int e : g.equations)
          if (f->equations[static_cast<std::size_t>(e)].prim == &p) fused.insert(s.prim);
      if (fused.count(s.prim)) break;
    }
  }
  for (const Primitive* p : all_primitives())
    if (lowered_fused(*p) && !fused.count(p->name))
      ADD_FAILURE() << "primitive '" << p->name
                    << "' has a lowering but no case of the compiled walk runs it fused: add a "
                       "sample to tests/primitive_samples.cpp";
}

// Every primitive's in-place kernel (Primitive::in_place) leaves in its target what its kernels
// return, bit for bit, in every case of the walk (every dtype, edge values, views), and raises
// where they raise: compiled code runs it in their place when it owns the input.
TEST(CompiledWalkRegistry, EveryInPlaceKernelWritesWhatTheKernelsReturn) {
  std::set<std::string> walked;
  for (const PrimitiveSample& s : samples::compiled_samples()) {
    const Primitive& p = primitive(s.prim);
    if (!p.in_place || s.body) continue;
    const auto k = static_cast<std::size_t>(p.in_place->input);
    for (const Case& c : cases_of(s)) {
      std::optional<Tensor> want;
      try {
        want = bind(p, c.inputs, c.attrs)[0];
      } catch (const Error&) {
      }
      Ts ins = c.inputs;
      ins[k] = where(ones(ins[k].shape(), bool_), ins[k], ins[k]);  // a copy of its own
      const std::string what = name_of(s) + " / " + c.label;
      if (!want) {
        EXPECT_THROW(p.in_place->write(ins, ins[k], c.attrs), Error) << what;
        continue;
      }
      p.in_place->write(ins, ins[k], c.attrs);
      const auto diff = testing::compare(ins[k], *want, {.rule = Rule::exact});
      EXPECT_FALSE(diff) << what << ": " << *diff;
    }
    walked.insert(s.prim);
  }
  for (const Primitive* p : all_primitives())
    if (p->in_place && !walked.count(p->name))
      ADD_FAILURE() << "primitive '" << p->name
                    << "' writes in place but no case of the compiled walk checks it";
}

// ---- the checks can fail ----------------------------------------------------------------

const PrimitiveSample& sample(const std::string& name) {
  for (const PrimitiveSample& s : samples::primitive_samples())
    if (name_of(s) == name) return s;
  throw std::runtime_error("no sample " + name);
}

// How many of a sample's cases a backend fails.
int failures(const std::string& name, const Factory& backend) {
  int n = 0;
  const PrimitiveSample& s = sample(name);
  for (const Case& c : cases_of(s))
    if (check_case(s, c, backend)) ++n;
  return n;
}

TEST(CompiledWalkFaults, ChecksCatchFaultyBackends) {
  using testing::tampered;
  // One ulp off in an IEEE-exact op: the exact rule sees it.
  EXPECT_GT(failures("sub", tampered(testing::ulps_up("sub", 1))), 0);
  // A transcendental function three ulps off: past the bound.
  EXPECT_GT(failures("exp", tampered(testing::ulps_up("exp", 3))), 0);
  // The wrong reduction: min for max, max for sum.
  EXPECT_GT(failures("reduce_max", tampered(testing::computed_as("reduce_max", "reduce_min"))), 0);
  EXPECT_GT(failures("reduce_sum", tampered(testing::computed_as("reduce_sum", "reduce_max"))), 0);
  // A loop's results 2^14 ulps off: past the program bound; one ulp off: within it.
  EXPECT_GT(failures("while", tampered(testing::ulps_up("while", 1 << 14))), 0);
  EXPECT_EQ(failures("while", tampered(testing::ulps_up("while", 1))), 0);
  // Strides ignored: the non-contiguous cases see it.
  const Factory dense = testing::ignoring_strides(testing::backend(ir::Backend::interpreter));
  for (const char* name : {"add", "exp", "reduce_sum", "transpose", "matmul", "select"})
    EXPECT_GT(failures(name, dense), 0) << name;
}

TEST(CompiledWalkFaults, AllowedDifferencesPass) {
  // Transcendentals up to kTranscendentalUlps off and sums accumulated in float lanes in
  // another order are what a correct compiler may produce: the walk accepts them.
  const Factory allowed = testing::tampered(testing::allowed_differences(7));
  for (const char* name :
       {"exp", "tanh", "sigmoid", "log", "pow", "reduce_sum", "reduce_sum_negative_axis"})
    EXPECT_EQ(failures(name, allowed), 0) << name;
}

// ---- transformations, compiled ------------------------------------------------------------

// The programs grad, vmap, hessian, custom rules, control flow and nested jit produce,
// compiled against the interpreter (by the program rule).
template <class F, class... Args>
void expect_compiles_like_interpreter(const std::string& what, F f, const Args&... args) {
  const auto fn = std::make_shared<const ir::Function>(ir::optimize(trace(f, args...)));
  ir::verify(*fn);
  const Ts in{args...};
  const auto m = testing::check_program(fn, in, testing::backend(ir::Backend::llvm));
  EXPECT_FALSE(m) << what << ": " << *m << "\n" << ir::print(*fn);
}

TEST(CompiledTransforms, GradVmapHessianCustomRulesControlFlowNestedJit) {
  const std::vector<TensorType> types{
      {float32, Shape{8, 6}}, {float32, Shape{6}}, {float32, Shape{6, 4}}, {float32, Shape{5, 8}}};
  const Ts a = testing::inputs_for(types, 42);
  const Tensor &w1 = a[0], &b1 = a[1], &w2 = a[2], &x = a[3];
  auto loss = [](const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& x) {
    return mean(log_softmax(matmul(tanh(matmul(x, w1) + b1), w2), -1));
  };
  expect_compiles_like_interpreter("grad", grad(loss), w1, b1, w2, x);
  expect_compiles_like_interpreter("value_and_grad", value_and_grad(loss), w1, b1, w2, x);
  auto per_example = [&](const Tensor& w, const Tensor& xi) {
    return grad([&](const Tensor& v, const Tensor& e) {
      return loss(v, b1, w2, reshape(e, Shape{1, 8}));
    })(w, xi);
  };
  expect_compiles_like_interpreter("vmap(grad)", vmap(per_example, in_axes(none, 0)), w1, x);
  auto smooth = [](const Tensor& v) { return sum(sin(v) * v + exp(tanh(v))); };
  expect_compiles_like_interpreter("hessian", hessian(smooth), b1);
  auto clip_grad = custom_vjp([](const Tensor& v) { return v * 1.0; },
                              [](const std::tuple<Tensor>&, const Tensor&, const Tensor& ct) {
                                return std::tuple<Tensor>{clip(ct, -1.0, 1.0)};
                              });
  auto softplus = custom_jvp([](const Tensor& v) { return log1p(exp(v)); },
                             [](const std::tuple<Tensor>& p, const std::tuple<Tensor>& t) {
                               return sigmoid(std::get<0>(p)) * std::get<0>(t);
                             });
  expect_compiles_like_interpreter(
      "grad of custom rules",
      grad([&](const Tensor& v) { return sum(clip_grad(v) * 5.0 + softplus(v)); }), b1);
  auto loop = [](const Tensor& v) {  // v: f32[6]
    using Carry = std::pair<Tensor, Tensor>;
    const Carry out =
        while_loop([](const Carry& c) { return logical_and(sum(c.second) < 10.0, c.first < 6); },
                   [](const Carry& c) {
                     return Carry{c.first + 1, c.second * 1.5 + 0.5};
                   },
                   Carry{tensor(int32_t{0}), abs(v)});
    auto [carry, ys] = scan(
        [](const Tensor& c, const Tensor& e) {
          return std::pair<Tensor, Tensor>{tanh(c + e), c * e};
        },
        slice(v, {Slice{0, 3, 1}}), reshape(out.second, Shape{2, 3}));
    return sum(carry) + sum(ys);
  };
  expect_compiles_like_interpreter("while and scan", loop, b1);
  expect_compiles_like_interpreter("grad of while and scan", grad(loop), b1);
  auto inner = jit([](const Tensor& v) { return tanh(v) * v; });
  expect_compiles_like_interpreter(
      "nested jit", [&](const Tensor& v) { return inner(v) + inner(v * 2.0); }, b1);
  expect_compiles_like_interpreter("grad of nested jit",
                                   grad([&](const Tensor& v) { return sum(inner(v) * v); }), b1);
}

// ---- concurrency ------------------------------------------------------------------------

// One compiled function (fused groups, a while, a scan with a cond per step) called from four
// threads at once on different inputs, through jit (KILN_JIT_BACKEND=llvm) and through
// ir::compile; each result checked against the interpreter.
TEST(CompiledConcurrency, FourThreadsCallOneFunction) {
  const char* old = std::getenv("KILN_JIT_BACKEND");
  const std::string saved = old ? old : "";
  setenv("KILN_JIT_BACKEND", "llvm", 1);
  auto body = [](const Tensor& x, const Tensor& w) {
    const Tensor h = tanh(matmul(x, w));
    const Tensor e = exp(h - max(h, {1}, true));
    using Carry = std::pair<Tensor, Tensor>;
    const Carry out = while_loop([](const Carry& c) { return c.first < 3; },
                                 [](const Carry& c) {
                                   return Carry{c.first + 1, sin(c.second) * 0.5 + c.second};
                                 },
                                 Carry{tensor(int32_t{0}), e / sum(e, {1}, true)});
    // A scan over the rows with a cond per step: each call's loop buffers are its own.
    auto [c, ys] = scan(
        [](const Tensor& c, const Tensor& r) {
          const Tensor n = cond(
              index(r, 0) > index(r, 1), [&] { return c * 0.5f + r; },
              [&] { return c - r * 0.25f; });
          return std::pair{n, n * 2.0f};
        },
        zeros({12}), out.second);
    return out.second + ys + c;
  };
  const auto f = jit(body);
  const TensorType xt{float32, Shape{64, 8}}, wt{float32, Shape{8, 12}};
  const auto traced =
      ir::trace_function("body", {xt, wt}, [&](const Ts& a) { return Ts{body(a[0], a[1])}; });
  const auto optimised = std::make_shared<const ir::Function>(ir::optimize(*traced.function));
  const auto compiled = ir::compile(optimised, {.backend = ir::Backend::llvm});

  constexpr int kThreads = 4, kCalls = 8;
  std::vector<std::vector<Ts>> inputs(kThreads);
  std::vector<std::vector<Tensor>> want(kThreads);
  for (int t = 0; t < kThreads; ++t)
    for (int i = 0; i < kCalls; ++i) {
      inputs[t].push_back(testing::inputs_for({xt, wt}, static_cast<uint64_t>(100 * t + i)));
      want[t].push_back(ir::evaluate(*optimised, inputs[t].back())[0]);
    }
  std::vector<std::vector<std::string>> problems(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        const Ts& in = inputs[t][i];
        const testing::Tolerance tol{.rule = Rule::program};
        if (auto m = testing::compare(f(in[0], in[1]), want[t][i], tol))
          problems[t].push_back("jit call " + std::to_string(i) + ": " + *m);
        if (auto m = testing::compare(compiled->run(in)[0], want[t][i], tol))
          problems[t].push_back("compiled call " + std::to_string(i) + ": " + *m);
      }
    });
  for (std::thread& th : threads) th.join();
  if (old)
    setenv("KILN_JIT_BACKEND", saved.c_str(), 1);
  else
    unsetenv("KILN_JIT_BACKEND");
  for (int t = 0; t < kThreads; ++t)
    for (const std::string& p : problems[t]) ADD_FAILURE() << "thread " << t << ": " << p;
}

}  // namespace
}  // namespace kiln
