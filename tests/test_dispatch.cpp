// The primitive registry and multiple dispatch, through the public API in kiln/primitive.h:
// user-defined primitives, most-specific kernel selection, overriding built-in kernels, and
// the errors of registration and binding.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "testing.h"

using namespace kiln;

namespace {

using kiln::testing::expect_error;

using F = std::vector<float>;

// A primitive description, built field by field (Primitive grows fields over time).
Primitive prim(std::string name, int arity, TypeRule rule, bool variadic = false) {
  Primitive p;
  p.name = std::move(name);
  p.arity = arity;
  p.variadic = variadic;
  p.type_rule = std::move(rule);
  return p;
}

KernelSignature sig(std::vector<DTypeSet> inputs, bool variadic = false) {
  return KernelSignature{.device = Device::cpu, .inputs = std::move(inputs), .variadic = variadic};
}

// Elementwise helper for the test kernels: out[i] = f(in[i]) over contiguous copies, in double.
template <typename Fn>
Tensor map_double(const Tensor& x, DType out_dtype, Fn f) {
  const std::vector<double> v = x.to_vector<double>();
  std::vector<double> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = f(v[i], i);
  return astype(tensor(r, x.shape()), out_dtype);
}

// Type rule of a unary float primitive: same type out, floating inputs only.
std::vector<TensorType> float_unary_rule(std::string name, std::span<const TensorType> in) {
  if (!is_floating(in[0].dtype))
    fail(name, "unsupported dtype: got ", in[0], ", expected a floating dtype");
  return {in[0]};
}

// ---- a user-defined primitive ------------------------------------------------------

// axpy{alpha}(x, y) = alpha * x + y, for floats of one dtype and shape.
const Primitive& axpy_p = register_primitive(
    prim("test_axpy", 2,
         [](std::span<const TensorType> in, const Attrs& a) {
           (void)a.get_double("alpha");
           if (in[0] != in[1] || !is_floating(in[0].dtype))
             fail("test_axpy", "operands differ or are not floats: got ", in[0], " and ", in[1],
                  ", expected two floats of one type");
           return std::vector<TensorType>{in[0]};
         }),
    {{sig({DTypeSet::floating(), DTypeSet::floating()}),
      [](std::span<const Tensor> in, const Attrs& a) {
        const double alpha = a.get_double("alpha");
        const std::vector<double> y = in[1].to_vector<double>();
        return std::vector<Tensor>{map_double(
            in[0], in[0].dtype(), [&](double x, std::size_t i) { return alpha * x + y[i]; })};
      }}});

TEST(Dispatch, UserPrimitiveRunsThroughBind) {
  EXPECT_EQ(&primitive("test_axpy"), &axpy_p);
  EXPECT_EQ(find_primitive("test_axpy"), &axpy_p);
  EXPECT_EQ(axpy_p.arity, 2);
  EXPECT_GE(axpy_p.id, 0);
  const Tensor x = tensor({1.0f, 2.0f, 3.0f}), y = tensor({10.0f, 20.0f, 30.0f});
  const Tensor r = bind1(axpy_p, {x, y}, {{"alpha", 2.0}});
  EXPECT_EQ(r.dtype(), float32);
  EXPECT_EQ(r.to_vector<float>(), (F{12, 24, 36}));
  // Any float dtype; strided inputs reach the kernel as views.
  const Tensor xd = transpose(tensor({1.0, 2.0, 3.0, 4.0}, Shape{2, 2}));
  const Tensor yd = zeros(Shape{2, 2}, float64);
  EXPECT_EQ(bind1(axpy_p, {xd, yd}, {{"alpha", -1.0}}).to_vector<double>(),
            (std::vector<double>{-1, -3, -2, -4}));
  const std::vector<Tensor> outs = bind(axpy_p, {x, y}, {{"alpha", 0.5}});
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].to_vector<float>(), (F{10.5f, 21, 31.5f}));
  // The type rule's error reaches the user, with the call site appended.
  try {
    (void)bind1(axpy_p, {x, tensor({1.0})}, {{"alpha", 1.0}});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[test_axpy] ", 0), 0u) << msg;
    EXPECT_NE(msg.find("f32[3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("f64[1]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("test_dispatch.cpp"), std::string::npos) << msg;
  }
  // A missing attribute is an error too.
  expect_error([&] { (void)bind1(axpy_p, {x, y}); }, "attrs", {"alpha"});
}

TEST(Dispatch, InferChecksInputCount) {
  const TensorType t{float32, Shape{2}};
  const std::vector<TensorType> one = {t};
  expect_error(
      [&] {
        (void)axpy_p.infer(one, {{"alpha", 1.0}});
      },
      "test_axpy", {"wrong number of inputs", "got 1", "expected 2"});
  const std::vector<TensorType> two = {t, t};
  EXPECT_EQ(axpy_p.infer(two, {{"alpha", 1.0}}), (std::vector<TensorType>{t}));
}

// ---- most-specific kernel wins ------------------------------------------------------

std::atomic<int> g_generic_runs{0}, g_f32_runs{0}, g_any_runs{0};

TEST(Dispatch, MostSpecificKernelWins) {
  // softplus(x) = log(1 + exp(x)). The generic kernel computes it; the f32 one returns
  // the result plus 1000 so the test can tell which ran. Registration order: f32 first, then
  // the broader ones, so that only specificity (not order) can pick the f32 kernel.
  const Primitive& p =
      register_primitive(prim("test_softplus", 1, [](std::span<const TensorType> in, const Attrs&) {
        return float_unary_rule("test_softplus", in);
      }));
  register_kernel(p, sig({float32}), [](std::span<const Tensor> in, const Attrs&) {
    ++g_f32_runs;
    return std::vector<Tensor>{map_double(
        in[0], float32, [](double x, std::size_t) { return std::log1p(std::exp(x)) + 1000; })};
  });
  register_kernel(p, sig({DTypeSet::floating()}), [](std::span<const Tensor> in, const Attrs&) {
    ++g_generic_runs;
    return std::vector<Tensor>{map_double(
        in[0], in[0].dtype(), [](double x, std::size_t) { return std::log1p(std::exp(x)); })};
  });
  register_kernel(p, sig({DTypeSet::all()}), [](std::span<const Tensor> in, const Attrs&) {
    ++g_any_runs;
    return std::vector<Tensor>{zeros_like(in[0])};
  });
  EXPECT_EQ(kernel_signatures(p).size(), 3u);

  const Tensor f = bind1(p, {tensor({0.0f})});
  EXPECT_EQ(g_f32_runs.load(), 1);
  EXPECT_EQ(g_generic_runs.load(), 0);
  EXPECT_NEAR(f.item<double>(), 1000 + std::log(2.0), 1e-3);

  const Tensor d = bind1(p, {tensor({0.0})});
  EXPECT_EQ(g_generic_runs.load(), 1);
  EXPECT_EQ(g_f32_runs.load(), 1);
  EXPECT_NEAR(d.item<double>(), std::log(2.0), 1e-12);

  const Tensor h = bind1(p, {astype(tensor({0.0f}), float16)});
  EXPECT_EQ(g_generic_runs.load(), 2);
  EXPECT_EQ(h.dtype(), float16);
  EXPECT_EQ(g_any_runs.load(), 0);

  // select_kernel names the same choice: the f32 kernel for f32.
  const std::vector<DType> f32s = {float32};
  const Kernel& k = select_kernel(p, Device::cpu, f32s);
  const std::vector<Tensor> ins = {tensor({0.0f})};
  (void)k(ins, {});
  EXPECT_EQ(g_f32_runs.load(), 2);
}

TEST(Dispatch, SpecificityIsPerInputAndSummed) {
  // Two inputs: (f32, any) vs (floating, floating): 8 + 0 vs 5 + 5 by the documented rule
  // (fewest accepted dtypes per input): the second is more specific for (f32, f32).
  static std::atomic<int> a_runs{0}, b_runs{0};
  const Primitive& p =
      register_primitive(prim("test_pair", 2, [](std::span<const TensorType> in, const Attrs&) {
        return std::vector<TensorType>{in[0]};
      }));
  register_kernel(p, sig({DTypeSet::floating(), DTypeSet::floating()}),
                  [](std::span<const Tensor> in, const Attrs&) {
                    ++b_runs;
                    return std::vector<Tensor>{in[0]};
                  });
  register_kernel(p, sig({float32, DTypeSet::all()}), [](std::span<const Tensor> in, const Attrs&) {
    ++a_runs;
    return std::vector<Tensor>{in[0]};
  });
  (void)bind1(p, {tensor({1.0f}), tensor({1.0f})});
  EXPECT_EQ(b_runs.load(), 1);
  EXPECT_EQ(a_runs.load(), 0);
  (void)bind1(p, {tensor({1.0f}), tensor({1})});  // only (f32, any) accepts an i32 second input
  EXPECT_EQ(a_runs.load(), 1);
}

TEST(Dispatch, LaterRegistrationWinsTies) {
  const Primitive& p = register_primitive(
      prim("test_tie", 1,
           [](std::span<const TensorType> in, const Attrs&) {
             return std::vector<TensorType>{in[0]};
           }),
      {{sig({DTypeSet::floating()}), [](std::span<const Tensor> in, const Attrs&) {
          return std::vector<Tensor>{full_like(in[0], 1.0)};
        }}});
  EXPECT_EQ(bind1(p, {tensor({5.0f})}).item<float>(), 1.0f);
  register_kernel(p, sig({DTypeSet::floating()}), [](std::span<const Tensor> in, const Attrs&) {
    return std::vector<Tensor>{full_like(in[0], 2.0)};
  });
  EXPECT_EQ(bind1(p, {tensor({5.0f})}).item<float>(), 2.0f);
  // A broader later registration does not beat the narrower one.
  register_kernel(p, sig({DTypeSet::all()}), [](std::span<const Tensor> in, const Attrs&) {
    return std::vector<Tensor>{full_like(in[0], 3.0)};
  });
  EXPECT_EQ(bind1(p, {tensor({5.0f})}).item<float>(), 2.0f);
  EXPECT_EQ(bind1(p, {tensor({5})}).item<int32_t>(), 3);  // but it serves the rest
}

// ---- overriding a built-in -----------------------------------------------------------

std::atomic<int> g_user_add_runs{0};

TEST(Dispatch, UserOverridesBuiltinAdd) {
  // The override computes the right answer (it stays active for the rest of this binary) and
  // counts its runs.
  const Primitive& add_p = primitive("add");
  register_kernel(add_p, sig({float32, float32}), [](std::span<const Tensor> in, const Attrs&) {
    ++g_user_add_runs;
    const std::vector<float> a = in[0].to_vector<float>(), b = in[1].to_vector<float>();
    std::vector<float> r(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) r[i] = a[i] + b[i];
    return std::vector<Tensor>{tensor(r, in[0].shape())};
  });
  const int before = g_user_add_runs.load();
  const Tensor s = add(tensor({1.0f, 2.0f}), tensor({3.0f, 4.5f}));
  EXPECT_EQ(g_user_add_runs.load(), before + 1);
  EXPECT_EQ(s.to_vector<float>(), (F{4.0f, 6.5f}));
  // Operators and broadcasting go through the same primitive (broadcast views reach the kernel).
  const Tensor t = tensor({1.0f, 2.0f}) + 1.0;
  EXPECT_EQ(g_user_add_runs.load(), before + 2);
  EXPECT_EQ(t.to_vector<float>(), (F{2.0f, 3.0f}));
  const Tensor m = add(zeros(Shape{2, 2}), tensor({1.0f, 2.0f}));
  EXPECT_EQ(g_user_add_runs.load(), before + 3);
  EXPECT_EQ(m.to_vector<float>(), (F{1, 2, 1, 2}));
  // Other dtypes keep the built-in kernel.
  const Tensor d = add(tensor({1.0}), tensor({2.0}));
  EXPECT_EQ(g_user_add_runs.load(), before + 3);
  EXPECT_EQ(d.item<double>(), 3.0);
  EXPECT_EQ(add(tensor({1}), tensor({2})).item<int32_t>(), 3);
  EXPECT_EQ(g_user_add_runs.load(), before + 3);
}

std::atomic<int> g_user_slice_runs{0};

// Eager slices, indexing and reshapes make their views without bind while the built-in kernels
// are the only ones (src/ops/shape.cpp); a user kernel over them turns that short path off.
TEST(Dispatch, AUserKernelTurnsOffTheBuiltInWriteInPlace) {
  // A loop that fills a float64 buffer a row at a time writes it in place with scatter_set's
  // built-in in-place form; once a user's float64 kernel overrides scatter_set, every step runs
  // that kernel (the override stays active for the rest of this binary and computes the right
  // answer: x with its rows at the indices set).
  auto fill = jit([](const Tensor& buf) {
    const Tensor zero = tensor(int64_t{0});
    return fori_loop(
        int64_t{0}, int64_t{5},
        [&](const Tensor& i, const Tensor& b) {
          return dynamic_update_slice(b, full({1, 2}, 1.0, float64) + astype(i, float64),
                                      {i, zero});
        },
        buf);
  });
  const Tensor buf = zeros({5, 2}, float64);
  const std::vector<double> want{1, 1, 2, 2, 3, 3, 4, 4, 5, 5};
  EXPECT_EQ(fill(buf).to_vector<double>(), want);
  static std::atomic<int> calls{0};
  register_kernel(primitive("scatter_set"),
                  sig({DTypeSet(float64), DTypeSet(int64), DTypeSet(float64)}),
                  [](std::span<const Tensor> in, const Attrs& a) {
                    ++calls;
                    EXPECT_EQ(a.get_int("axis"), 0);
                    std::vector<double> x = in[0].to_vector<double>();
                    const std::vector<double> u = in[2].to_vector<double>();
                    const std::vector<int64_t> idx = in[1].to_vector<int64_t>();
                    const std::size_t row = u.size() / idx.size();
                    for (std::size_t j = 0; j < idx.size(); ++j)
                      for (std::size_t k = 0; k < row; ++k)
                        x[static_cast<std::size_t>(idx[j]) * row + k] = u[j * row + k];
                    return std::vector<Tensor>{tensor(x, in[0].shape())};
                  });
  EXPECT_EQ(fill(buf).to_vector<double>(), want);
  EXPECT_EQ(calls.load(), 5);
  EXPECT_EQ(buf.to_vector<double>(), std::vector<double>(10, 0.0));
}

TEST(Dispatch, UserOverridesBuiltinViews) {
  const Tensor x = tensor({1.0, 2.0, 3.0, 4.0}, {2, 2});
  EXPECT_EQ(slice(x, {Slice{1, 2, 1}}).to_vector<double>(), (std::vector<double>{3.0, 4.0}));
  // Correct values (a copy of the rows), so that it may stay active for the rest of the binary.
  register_kernel(
      primitive("slice"), sig({float64}), [](std::span<const Tensor> in, const Attrs& a) {
        ++g_user_slice_runs;
        const int64_t start = a.get_ints("start")[0], stop = a.get_ints("stop")[0];
        const int64_t cols = in[0].shape()[1];
        const std::vector<double> v = in[0].to_vector<double>();
        return std::vector<Tensor>{
            tensor(std::vector<double>(v.begin() + start * cols, v.begin() + stop * cols),
                   Shape{stop - start, cols})};
      });
  const int before = g_user_slice_runs.load();
  EXPECT_EQ(slice(x, {Slice{1, 2, 1}}).to_vector<double>(), (std::vector<double>{3.0, 4.0}));
  EXPECT_EQ(g_user_slice_runs.load(), before + 1);
  EXPECT_EQ(index(x, 0).to_vector<double>(), (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(g_user_slice_runs.load(), before + 2);
}

// ---- errors ---------------------------------------------------------------------------

TEST(Dispatch, MissingKernelListsSignatures) {
  const Primitive& p = register_primitive(
      prim("test_f32_only", 2,
           [](std::span<const TensorType> in, const Attrs&) {
             return std::vector<TensorType>{in[0]};
           }),
      {{sig({float32, float32}),
        [](std::span<const Tensor> in, const Attrs&) { return std::vector<Tensor>{in[0]}; }},
       {sig({DTypeSet(float64) | float16, DTypeSet::floating()}),
        [](std::span<const Tensor> in, const Attrs&) { return std::vector<Tensor>{in[0]}; }}});
  EXPECT_EQ(kernel_signatures(p)[0].to_string(), "cpu(f32, f32)");
  EXPECT_EQ(kernel_signatures(p)[1].to_string(), "cpu(f16|f64, f16|bf16|f32|f64)");
  expect_error(
      [&] {
        (void)bind1(p, {tensor({1}), tensor({1.0f})});
      },
      "test_f32_only",
      {"no kernel", "i32, f32", "cpu(f32, f32)", "cpu(f16|f64, f16|bf16|f32|f64)"});
  const std::vector<DType> dts = {bfloat16, float32};
  expect_error([&] { (void)select_kernel(p, Device::cpu, dts); }, "test_f32_only",
               {"no kernel", "bf16, f32", "cpu(f32, f32)"});
  // No kernels at all.
  const Primitive& q = register_primitive(prim(
      "test_no_kernels", 1,
      [](std::span<const TensorType> in, const Attrs&) { return std::vector<TensorType>{in[0]}; }));
  EXPECT_TRUE(kernel_signatures(q).empty());
  expect_error([&] { (void)bind1(q, {tensor({1})}); }, "test_no_kernels",
               {"no kernel", "no kernels registered"});
}

TEST(Dispatch, RegistrationErrors) {
  expect_error(
      [] {
        (void)register_primitive(prim("add", 2, [](std::span<const TensorType> in, const Attrs&) {
          return std::vector<TensorType>{in[0]};
        }));
      },
      "register_primitive", {"duplicate", "'add'"});
  expect_error(
      [] {
        (void)register_primitive(
            prim("test_axpy", 2, [](std::span<const TensorType> in, const Attrs&) {
              return std::vector<TensorType>{in[0]};
            }));
      },
      "register_primitive", {"duplicate", "'test_axpy'"});
  expect_error([] { (void)register_primitive(prim("test_no_rule", 1, nullptr)); },
               "register_primitive", {"type rule"});
  for (const int input : {-1, 1})
    expect_error(
        [input] {
          Primitive p =
              prim("test_bad_in_place", 1, [](std::span<const TensorType> in, const Attrs&) {
                return std::vector<TensorType>{in[0]};
              });
          p.in_place = Primitive::InPlace{
              .input = input, .write = [](std::span<const Tensor>, const Tensor&, const Attrs&) {}};
          (void)register_primitive(std::move(p));
        },
        "register_primitive", {"in-place kernel", "got input " + std::to_string(input), "[0, 1)"});
  expect_error(
      [] {
        Primitive p =
            prim("test_bad_in_place", 1, [](std::span<const TensorType> in, const Attrs&) {
              return std::vector<TensorType>{in[0]};
            });
        p.in_place = Primitive::InPlace{.input = 0};
        (void)register_primitive(std::move(p));
      },
      "register_primitive", {"no write function"});
  EXPECT_EQ(find_primitive("test_bad_in_place"), nullptr);
  EXPECT_EQ(find_primitive("test_no_rule"), nullptr);
  EXPECT_EQ(find_primitive("no_such_primitive"), nullptr);
  expect_error([] { (void)primitive("no_such_primitive"); }, "primitive", {"'no_such_primitive'"});
}

// ---- where a primitive was defined -------------------------------------------------------

// A user's differentiable primitive without derivative or batching rules yet: the errors of
// the transformations that need them name the line that registered it.
const int kNoRulesLine = __LINE__ + 1;
const Primitive& no_rules_p = register_primitive(
    prim("test_no_rules", 1,
         [](std::span<const TensorType> in, const Attrs&) {
           return std::vector<TensorType>{in[0]};
         }),
    {{sig({DTypeSet::floating()}),
      [](std::span<const Tensor> in, const Attrs&) { return std::vector<Tensor>{in[0]}; }}});

TEST(Dispatch, MissingRulesNameWhereThePrimitiveWasDefined) {
  // The file as the compiler was given it (absolute, or relative under ccache), then the line.
  const std::string here = "test_dispatch.cpp:" + std::to_string(kNoRulesLine) + ")";
  EXPECT_NE(no_rules_p.where_defined().find(" (defined at "), std::string::npos);
  EXPECT_NE(no_rules_p.where_defined().find(here), std::string::npos) << no_rules_p.where_defined();
  auto f = [](const Tensor& x) { return sum(bind1(no_rules_p, {x})); };
  const Tensor x = tensor({1.0, 2.0});
  expect_error([&] { (void)grad(f)(x); }, "vjp",
               {"no VJP rule for primitive 'test_no_rules' (defined at ", here});
  expect_error([&] { (void)jvp(f, std::tuple<Tensor>{x}, std::tuple<Tensor>{x}); }, "jvp",
               {"no JVP rule for primitive 'test_no_rules' (defined at ", here});
  expect_error(
      [&] {
        (void)vmap(f)(tensor({1.0, 2.0, 3.0, 4.0}, Shape{2, 2}));
      },
      "vmap", {"no batching rule for primitive 'test_no_rules' (defined at ", here});
  // A built-in's file is named relative to Kiln's source tree: the table entry that defines it.
  EXPECT_EQ(primitive("add").where_defined().rfind(" (defined at src/ops/binary.cpp:", 0), 0u)
      << primitive("add").where_defined();
  EXPECT_EQ(
      primitive("while").where_defined().rfind(" (defined at src/transforms/while_loop.cpp:", 0),
      0u)
      << primitive("while").where_defined();
}

TEST(Dispatch, WrongInputCount) {
  const Tensor x = tensor({1.0f});
  expect_error([&] { (void)bind1(primitive("add"), {x}); }, "add",
               {"wrong number of inputs", "got 1", "expected 2"});
  expect_error(
      [&] {
        (void)bind1(primitive("neg"), {x, x});
      },
      "neg", {"wrong number of inputs", "got 2", "expected 1"});
  expect_error(
      [&] {
        (void)bind1(primitive("concatenate"), {}, {{"axis", int64_t{0}}});
      },
      "concatenate", {"wrong number of inputs", "got 0", "at least 1"});
  expect_error(
      [&] {
        (void)bind1(axpy_p, {x, x, x}, {{"alpha", 1.0}});
      },
      "test_axpy", {"wrong number of inputs", "got 3"});
  // Undefined inputs are named by position.
  expect_error(
      [&] {
        (void)bind1(primitive("add"), {x, Tensor()});
      },
      "add", {"input 1", "undefined"});
}

TEST(Dispatch, KernelOutputsAreChecked) {
  const Primitive& p = register_primitive(
      prim("test_bad_kernel", 1,
           [](std::span<const TensorType> in, const Attrs&) {
             return std::vector<TensorType>{in[0]};
           }),
      {{sig({float32}), [](std::span<const Tensor> in,
                           const Attrs&) { return std::vector<Tensor>{astype(in[0], float64)}; }},
       {sig({float64}),
        [](std::span<const Tensor>, const Attrs&) { return std::vector<Tensor>{}; }}});
  expect_error([&] { (void)bind1(p, {tensor({1.0f})}); }, "test_bad_kernel",
               {"wrong type", "f64[1]", "f32[1]"});
  expect_error([&] { (void)bind1(p, {tensor({1.0})}); }, "test_bad_kernel",
               {"wrong number of outputs", "got 0", "expected 1"});
  // Compiled code runs the kernel against the types its IR holds, which it checks the same way.
  const auto f = jit([&](const Tensor& x) { return bind1(p, {x}); },
                     JitOptions{.name = "bad_kernel", .backend = ir::Backend::llvm});
  expect_error([&] { (void)f(tensor({1.0f})); }, "test_bad_kernel",
               {"wrong type", "f64[1]", "f32[1]"});
  expect_error([&] { (void)f(tensor({1.0})); }, "test_bad_kernel",
               {"wrong number of outputs", "got 0", "expected 1"});
}

// Compiled code knows every value's type: its kernel calls run no type rule, as bind does.
TEST(Dispatch, CompiledCallsRunNoTypeRule) {
  auto rule_calls = std::make_shared<int>(0);
  const Primitive& p =
      register_primitive(prim("test_counted_rule", 1,
                              [rule_calls](std::span<const TensorType> in, const Attrs&) {
                                ++*rule_calls;
                                return std::vector<TensorType>{in[0]};
                              }),
                         {{sig({float32}), [](std::span<const Tensor> in, const Attrs&) {
                             return std::vector<Tensor>{in[0] * 2.0f};
                           }}});
  const Tensor x = tensor({1.0f, -3.0f});
  (void)bind1(p, {x});
  EXPECT_EQ(*rule_calls, 1);
  const auto f = jit([&](const Tensor& v) { return bind1(p, {v}); },
                     JitOptions{.name = "counted_rule", .backend = ir::Backend::llvm});
  (void)f(x);  // traces and compiles, which may apply the rule
  const int after_compiling = *rule_calls;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(f(x).data<float>()[1], -6.0f);
  EXPECT_EQ(*rule_calls, after_compiling);
}

TEST(Dispatch, VariadicUserPrimitive) {
  // sum_all(xs...) = elementwise sum of any number (>= 1) of same-typed inputs.
  const Primitive& p = register_primitive(
      prim(
          "test_sum_all", 1,
          [](std::span<const TensorType> in, const Attrs&) {
            for (const TensorType& t : in)
              if (t != in[0]) fail("test_sum_all", "inputs differ: got ", t, " and ", in[0]);
            return std::vector<TensorType>{in[0]};
          },
          true),
      {{sig({DTypeSet::numeric()}, true), [](std::span<const Tensor> in, const Attrs&) {
          Tensor acc = in[0];
          for (std::size_t i = 1; i < in.size(); ++i) acc = add(acc, in[i]);
          return std::vector<Tensor>{acc.contiguous()};
        }}});
  EXPECT_EQ(kernel_signatures(p)[0].to_string(), "cpu(u8|u32|i32|i64|f16|bf16|f32|f64, ...)");
  const Tensor a = tensor({1, 2}), b = tensor({10, 20}), c = tensor({100, 200});
  EXPECT_EQ(bind1(p, {a}).to_vector<int32_t>(), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(bind1(p, {a, b, c}).to_vector<int32_t>(), (std::vector<int32_t>{111, 222}));
  expect_error([&] { (void)bind1(p, {}); }, "test_sum_all", {"at least 1"});
  expect_error([&] { (void)bind1(p, {tensor({true})}); }, "test_sum_all", {"no kernel", "bool"});
}

TEST(Dispatch, EveryPrimitiveHasATypeRuleAndAKernel) {
  const std::vector<const Primitive*> all = all_primitives();
  std::set<std::string> names;
  for (const Primitive* p : all) {
    ASSERT_NE(p, nullptr);
    EXPECT_FALSE(p->name.empty());
    EXPECT_TRUE(static_cast<bool>(p->type_rule)) << p->name;
    EXPECT_TRUE(names.insert(p->name).second) << "duplicate " << p->name;
    EXPECT_EQ(find_primitive(p->name), p) << p->name;
    EXPECT_GE(p->arity, 0) << p->name;
    if (p->name == "test_no_kernels") continue;  // registered above on purpose
    const std::vector<KernelSignature> sigs = kernel_signatures(*p);
    EXPECT_FALSE(sigs.empty()) << p->name << " has no kernel";
    for (const KernelSignature& s : sigs) {
      EXPECT_EQ(s.device, Device::cpu) << p->name;
      if (!s.variadic)
        EXPECT_EQ(static_cast<int>(s.inputs.size()), p->arity) << p->name;
      else
        EXPECT_EQ(s.inputs.size(), 1u) << p->name;
    }
  }
  // Ids index the registry.
  for (std::size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i]->id, static_cast<int>(i));
}

// Every built-in primitive is in the registry, whichever ops this program calls: the linker
// takes from a static libkiln.a only the object files something references, and primitives
// that registered themselves at load time went missing there (make test-static).
TEST(Dispatch, EveryBuiltInPrimitiveIsRegistered) {
  std::set<std::string> names;
  for (const Primitive* p : all_primitives()) names.insert(p->name);
  for (const char* n : {"neg",
                        "abs",
                        "sign",
                        "exp",
                        "log",
                        "log1p",
                        "expm1",
                        "sqrt",
                        "rsqrt",
                        "sin",
                        "cos",
                        "tan",
                        "tanh",
                        "sigmoid",
                        "erf",
                        "floor",
                        "ceil",
                        "round",
                        "not",
                        "isnan",
                        "convert",
                        "add",
                        "sub",
                        "mul",
                        "div",
                        "pow",
                        "max",
                        "min",
                        "eq",
                        "ne",
                        "lt",
                        "le",
                        "gt",
                        "ge",
                        "and",
                        "or",
                        "xor",
                        "select",
                        "reduce_sum",
                        "reduce_prod",
                        "reduce_max",
                        "reduce_min",
                        "reduce_and",
                        "reduce_or",
                        "argmax",
                        "argmin",
                        "reshape",
                        "transpose",
                        "broadcast_to",
                        "slice",
                        "flip",
                        "concatenate",
                        "pad",
                        "gather",
                        "scatter_add",
                        "gather_along",
                        "scatter_add_along",
                        "matmul",
                        "conv",
                        "conv_input_grad",
                        "conv_weight_grad",
                        "max_pool2d",
                        "avg_pool2d",
                        "max_pool2d_grad",
                        "random_bits",
                        "random_uniform",
                        "random_split",
                        "random_fold_in",
                        "random_permutation",
                        "check_labels",
                        "call",
                        "checkpoint",
                        "custom_jvp",
                        "custom_vjp",
                        "stop_gradient",
                        "psum",
                        "pmax",
                        "axis_index",
                        "all_gather",
                        "pmin",
                        "ppermute",
                        "all_to_all",
                        "psum_scatter",
                        "cond",
                        "while",
                        "while_grad",
                        "scan"})
    EXPECT_TRUE(names.count(n)) << n << " is not registered";
}

// ---- attributes ------------------------------------------------------------------------

TEST(Attrs, SortedTypedAndPrinted) {
  Attrs a{{"zeta", int64_t{3}}, {"alpha", 2.0}, {"axes", std::vector<int64_t>{0, -1}}};
  a.set("dtype", float16);
  a.set("name", std::string("x"));
  a.set("flag", true);
  std::vector<std::string> keys;
  for (const auto& kv : a.items()) keys.push_back(kv.first);
  EXPECT_EQ(keys, (std::vector<std::string>{"alpha", "axes", "dtype", "flag", "name", "zeta"}));
  EXPECT_EQ(a.to_string(), "{alpha=2.0, axes=[0, -1], dtype=f16, flag=true, name=\"x\", zeta=3}");
  EXPECT_EQ(a.get_int("zeta"), 3);
  EXPECT_EQ(a.get_double("alpha"), 2.0);
  EXPECT_EQ(a.get_ints("axes"), (std::vector<int64_t>{0, -1}));
  EXPECT_EQ(a.get_dtype("dtype"), float16);
  EXPECT_TRUE(a.get_bool("flag"));
  EXPECT_TRUE(a.has("name"));
  EXPECT_FALSE(a.has("nope"));
  a.set("zeta", int64_t{4});  // replaces
  EXPECT_EQ(a.get_int("zeta"), 4);
  EXPECT_EQ(a.items().size(), 6u);
  expect_error([&] { (void)a.at("nope"); }, "attrs", {"'nope'"});
  expect_error([&] { (void)a.get_int("alpha"); }, "attrs", {"'alpha'", "2.0"});
  EXPECT_EQ(Attrs{}.to_string(), "");
  EXPECT_TRUE(Attrs{}.empty());
  EXPECT_EQ((Attrs{{"b", 1.0}, {"a", int64_t{1}}}), (Attrs{{"a", int64_t{1}}, {"b", 1.0}}));
  EXPECT_EQ(attr_to_string(AttrValue{0.5}), "0.5");
  EXPECT_EQ(attr_to_string(AttrValue{1e300}), "1.0000000000000001e+300");
  EXPECT_EQ(attr_to_string(AttrValue{int64_t{-7}}), "-7");
}

}  // namespace
