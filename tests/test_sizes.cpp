// Sizes: every shape is checked where it is made (sizes >= 0, at most Shape::kMaxNumel
// elements), arithmetic on user-given sizes and steps never overflows, and an allocation that
// cannot be satisfied raises an Error naming the op and the size (docs/DESIGN.md, "Sizes").
// Each test is a reproducer that crashed, overflowed or answered wrongly before.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "testing.h"

using namespace kiln;

namespace {

using kiln::testing::expect_error;

using F = std::vector<float>;
using I64 = std::vector<int64_t>;

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t k62 = int64_t{1} << 62;

// A tensor of `shape` that holds one element: broadcast views cost no memory at any size.
Tensor huge_view(const Shape& shape) { return broadcast_to(zeros({}), shape); }

// ---- shapes ---------------------------------------------------------------------

TEST(Sizes, ShapeNumelIsCheckedArithmetic) {
  EXPECT_EQ((Shape{2, 3, 4}.numel()), 24);
  EXPECT_EQ((Shape{}.numel()), 1);
  EXPECT_EQ((Shape{0, int64_t{1} << 40}.numel()), 0);
  EXPECT_EQ((Shape{Shape::kMaxNumel}.numel()), Shape::kMaxNumel);
  // (2^62 + 1) * 4 = 2^64 + 4 wrapped to 4 before.
  expect_error(
      [] {
        (void)Shape{k62 + 1, 4}.numel();
      },
      "shape", {"too many elements", "[4611686018427387905, 4]", "1152921504606846975"});
  expect_error([] { (void)Shape{Shape::kMaxNumel + 1}.numel(); }, "shape", {"too many elements"});
  expect_error([] { (void)Shape{3, -2}.numel(); }, "shape", {"negative dimension", "[3, -2]"});
  // An empty shape whose other sizes overflow: its strides would (numpy refuses it too).
  expect_error([] { Shape{0, k62, k62}.check("test"); }, "test", {"shape too large", "[0, "});
}

TEST(Sizes, CreationRefusesHugeShapesNamingTheFunction) {
  // zeros({2^62}) allocated 0 bytes (2^62 * 4 wrapped) and wrote past them (ASan).
  expect_error([] { (void)zeros({k62}); }, "zeros", {"too many elements", "[4611686018427387904]"});
  // 2^32 * 2^32 wrapped to 0 elements: sum(ones(...)) answered 0.
  expect_error(
      [] {
        (void)sum(ones({int64_t{1} << 32, int64_t{1} << 32}));
      },
      "ones", {"too many elements", "[4294967296, 4294967296]"});
  expect_error([] { (void)full({k62 + 1, 4}, 1.0); }, "full", {"too many elements"});
  expect_error([] { (void)empty(Shape{k62 + 1, 4}); }, "empty", {"too many elements"});
  expect_error([] { (void)empty(Shape{2, -1}); }, "empty", {"negative dimension", "[2, -1]"});
  expect_error([] { (void)zeros({0, k62, k62}); }, "zeros", {"shape too large"});
  // Shape [2^62 + 1, 4] took 4 values before.
  expect_error(
      [] {
        (void)tensor(F{1, 2, 3, 4}, Shape{k62 + 1, 4});
      },
      "tensor", {"too many elements", "[4611686018427387905, 4]"});
  expect_error([] { (void)tensor(F{}, Shape{-3}); }, "tensor", {"negative dimension"});
  expect_error([] { (void)linspace(0.0, 1.0, k62); }, "linspace", {"too many elements"});
  expect_error([] { (void)eye(int64_t{1} << 40, int64_t{1} << 40); }, "eye", {"too many elements"});
  expect_error([] { (void)arange(k62); }, "arange", {"too many elements"});
  // The count was converted to int64_t unchecked: undefined beyond 2^63.
  expect_error([] { (void)arange(0.0, 1e300); }, "arange", {"too many elements", "1e+300"});
  expect_error([] { (void)arange(-1e308, 1e308, 1e-308); }, "arange", {"too many elements"});
  // Zero-size tensors with huge other sizes stay fine.
  EXPECT_EQ(zeros({0, int64_t{1} << 40}).numel(), 0);
  EXPECT_EQ(arange(5.0, 2.0).numel(), 0);
}

TEST(Sizes, AllocationsBeyondMemoryRaiseErrorsNamingOpAndBytes) {
  // 2^57 float64 elements are a valid shape, 2^60 bytes: more than any machine's memory.
  expect_error([] { (void)zeros({int64_t{1} << 57}, float64); }, "zeros",
               {"cannot allocate", "f64[144115188075855872]", "1152921504606846976 bytes"});
  expect_error([] { (void)empty(Shape{int64_t{1} << 50}, uint8); }, "empty",
               {"cannot allocate", "1125899906842624 bytes"});
  // Kernels allocate through empty/full; the error names the primitive the user called.
  const Tensor x = huge_view({int64_t{1} << 45});
  expect_error(
      [&] {
        (void)concatenate({x, x});
      },
      "concatenate", {"cannot allocate", "f32[70368744177664]", "281474976710656 bytes"});
  expect_error(
      [] {
        (void)pad(zeros({2}), {{0, int64_t{1} << 50}});
      },
      "pad", {"cannot allocate", "f32[1125899906842626]"});
  expect_error([&] { (void)exp(x); }, "exp", {"cannot allocate"});
}

// A kernel whose scratch buffer cannot be had (std::bad_alloc): bind turns it into an Error.
TEST(Sizes, KernelBadAllocBecomesAnErrorNamingThePrimitive) {
  static const Primitive& p = register_primitive(  // static: once, also with --gtest_repeat
      Primitive{.name = "test_sizes_greedy",
                .arity = 1,
                .type_rule = [](std::span<const TensorType> in,
                                const Attrs&) { return std::vector<TensorType>{in[0]}; }},
      {{KernelSignature{.device = Device::cpu, .inputs = {DTypeSet::all()}, .variadic = false},
        [](std::span<const Tensor>, const Attrs&) -> std::vector<Tensor> {
          throw std::bad_alloc();
        }}});
  expect_error([&] { (void)bind1(p, {zeros({3})}); }, "test_sizes_greedy",
               {"out of memory", "f32[3]"});
}

// ---- shapes made by ops -----------------------------------------------------------

TEST(Sizes, BroadcastToRefusesNegativeAndHugeTargets) {
  // Ended in std::length_error before.
  expect_error([] { (void)broadcast_to(zeros({}), Shape{-3}); }, "broadcast_to",
               {"negative dimension", "[-3]"});
  expect_error([] { (void)broadcast_to(zeros({}), Shape{k62}); }, "broadcast_to",
               {"too many elements", "[4611686018427387904]"});
  expect_error(
      [] {
        (void)broadcast_to(zeros({1}), Shape{k62 + 1, 4, 1});
      },
      "broadcast_to", {"too many elements"});
  EXPECT_EQ(huge_view({Shape::kMaxNumel}).numel(), Shape::kMaxNumel);
}

TEST(Sizes, BroadcastingTwoValidShapesCanOverflow) {
  // [2^40, 1] + [1, 2^40] is [2^40, 2^40]: 2^80 elements wrapped to 0, an empty answer.
  const Tensor a = huge_view({int64_t{1} << 40, 1}), b = huge_view({1, int64_t{1} << 40});
  expect_error([&] { (void)add(a, b); }, "add",
               {"too many elements", "[1099511627776, 1099511627776]"});
}

TEST(Sizes, ReshapeChecksTheTargetAndTheInferredSize) {
  const Tensor x = arange(12);
  // (2^62 + 1) * 4 * 3 wrapped to 12: the reshape succeeded with a bogus shape.
  expect_error(
      [&] {
        (void)reshape(x, Shape{k62 + 1, 4, -1});
      },
      "reshape", {"cannot infer the -1"});
  expect_error(
      [&] {
        (void)reshape(arange(4), Shape{k62 + 1, 4});
      },
      "reshape", {"too many elements"});
  expect_error([&] { (void)reshape(x, Shape{k62, k62, -1}); }, "reshape", {"cannot infer"});
  expect_error(
      [&] {
        (void)reshape(x, Shape{-2, -1});
      },
      "reshape", {"negative dimension", "[-2, -1]"});
  expect_error([&] { (void)reshape(x, Shape{-4, -3}); }, "reshape", {"negative dimension"});
  EXPECT_EQ(reshape(x, Shape{2, -1, 2}).shape(), (Shape{2, 3, 2}));
  // The primitive itself, as parsed IR would state it.
  expect_error(
      [&] {
        (void)bind1(primitive("reshape"), {x}, {{"shape", I64{-1, -12}}});
      },
      "reshape", {"negative dimension"});
}

TEST(Sizes, ConcatenateAndPadSumsAreChecked) {
  // Nine axes of 2^60 - 1 sum past 2^63.
  const Tensor v = huge_view({Shape::kMaxNumel});
  expect_error([&] { (void)concatenate(std::vector<Tensor>(9, v)); }, "concatenate",
               {"size overflows"});
  expect_error([&] { (void)concatenate({v, v}); }, "concatenate", {"too many elements"});
  expect_error([] { (void)pad(zeros({2}), {{kMax, kMax}}); }, "pad", {"size overflows"});
  expect_error([] { (void)pad(zeros({2}), {{kMax - 1, 0}}); }, "pad", {"size overflows"});
  EXPECT_EQ(pad(zeros({2}), {{1, 2}}).shape(), (Shape{5}));
}

TEST(Sizes, OneHotChecksItsOutputShape) {
  const Tensor labels = tensor({0, 2, 1});
  // arange(2^62) was filled element by element before failing, or overflowed.
  expect_error([&] { (void)one_hot(labels, k62); }, "one_hot",
               {"too many elements", "[3, 4611686018427387904]"});
  expect_error([&] { (void)one_hot(labels, int64_t{1} << 59); }, "one_hot", {"too many elements"});
}

TEST(Sizes, OneHotOfByteLabelsWithMoreClassesThanTheirRange) {
  // The classes were built in the labels' dtype: arange(300) as uint8 saturates at 255, so
  // label 255 matched classes 255..299. Reference: a plain loop.
  const Tensor labels = tensor(std::vector<uint8_t>{255, 3});
  const std::vector<float> got = one_hot(labels, 300).to_vector<float>();
  std::vector<float> want(600, 0.f);
  want[255] = 1.f;
  want[300 + 3] = 1.f;
  EXPECT_EQ(got, want);
}

// ---- random primitives with sizes from attributes (parsed IR, direct bind) ------------

TEST(Sizes, RandomPermutationOfHugeLengthIsRefused) {
  const Tensor key = random::key(1);
  // Allocated 2^62 * 8 bytes wrapped to 0 and wrote the permutation past them.
  expect_error([&] { (void)random::permutation(key, k62); }, "random_permutation",
               {"too many elements", "[4611686018427387904]"});
  expect_error(
      [&] {
        (void)bind1(primitive("random_bits"), {key}, {{"shape", I64{k62 + 1, 4}}});
      },
      "random_bits", {"too many elements"});
  expect_error([&] { (void)random::split(key, k62); }, "random_split", {"too many elements"});
  // Traced: the type rule refuses it while recording.
  expect_error(
      [&] {
        (void)ir::trace_function("f", {key.type()}, [](const std::vector<Tensor>& a) {
          return std::vector<Tensor>{random::permutation(a[0], k62)};
        });
      },
      "random_permutation", {"too many elements"});
}

TEST(Sizes, RandomPermutationFromParsedIrIsRefused) {
  const std::string text =
      "func @f(%k: u32[2]) -> i64[4611686018427387904] {\n"
      "  %0 = random_permutation %k {n=4611686018427387904} : i64[4611686018427387904]\n"
      "  return %0\n"
      "}";
  try {
    const auto f = ir::parse(text);
    const Tensor key = random::key(1);
    (void)ir::evaluate(*f, std::vector<Tensor>{key});
    ADD_FAILURE() << "expected a kiln::Error";
  } catch (const Error& e) {
    // The parser may refuse the declared type itself; either way no crash.
    EXPECT_NE(std::string(e.what()).find("4611686018427387904"), std::string::npos) << e.what();
  }
}

TEST(Sizes, RandintOverTheWholeInt64Range) {
  // hi - lo overflowed (to -1): every value came out as INT64_MIN.
  const std::vector<int64_t> v =
      random::randint(random::key(7), {64}, kMin, kMax, int64).to_vector<int64_t>();
  int positive = 0;
  for (int64_t x : v) {
    EXPECT_LT(x, kMax);
    positive += x > 0;
  }
  EXPECT_GT(positive, 0);  // each is positive with probability 1/2: 2^-64 to fail
  EXPECT_LT(positive, 64);
}

// ---- slicing with extreme steps -------------------------------------------------------

TEST(Sizes, SliceStepOfInt64Min) {
  const Tensor x = arange(10);
  // -step is undefined for INT64_MIN. numpy: x[::-2**63] -> [9], x[5::-2**63] -> [5],
  // x[::2**63-1] -> [0], x[3:1:-2**63] -> [3], x[1:3:-2**63] -> [].
  EXPECT_EQ(slice(x, {Slice{std::nullopt, std::nullopt, kMin}}).to_vector<int64_t>(), I64{9});
  EXPECT_EQ(slice(x, {Slice{5, std::nullopt, kMin}}).to_vector<int64_t>(), I64{5});
  EXPECT_EQ(slice(x, {Slice{std::nullopt, std::nullopt, kMax}}).to_vector<int64_t>(), I64{0});
  EXPECT_EQ(slice(x, {Slice{3, 1, kMin}}).to_vector<int64_t>(), I64{3});
  EXPECT_EQ(slice(x, {Slice{1, 3, kMin}}).numel(), 0);
  EXPECT_EQ(slice(x, {Slice{kMin, kMax, kMax}}).to_vector<int64_t>(), I64{0});
  EXPECT_EQ(slice(x, {Slice{kMax, kMin, kMin}}).to_vector<int64_t>(), I64{9});
  // Ordinary steps still work: numpy x[8:1:-3] -> [8, 5, 2].
  EXPECT_EQ(slice(x, {Slice{8, 1, -3}}).to_vector<int64_t>(), (I64{8, 5, 2}));
}

TEST(Sizes, SlicePrimitiveWithHugeStep) {
  const Tensor x = arange(10, float32);
  const Attrs a{{"start", I64{2}}, {"stop", I64{10}}, {"step", I64{kMax}}};
  // stop - start + step - 1 overflowed in the type rule and the kernel.
  EXPECT_EQ(bind1(primitive("slice"), {x}, a).to_vector<float>(), F{2});
  // Its transpose put the element at start and padded it to a whole step (2^63 - 1 elements).
  const Tensor g = grad([&](const Tensor& t) { return sum(bind1(primitive("slice"), {t}, a)); })(x);
  EXPECT_EQ(g.to_vector<float>(), (F{0, 0, 1, 0, 0, 0, 0, 0, 0, 0}));
  const Tensor h = grad([](const Tensor& t) {
    return sum(slice(t, {Slice{std::nullopt, std::nullopt, kMin}}));
  })(x);
  EXPECT_EQ(h.to_vector<float>(), (F{0, 0, 0, 0, 0, 0, 0, 0, 0, 1}));
}

// ---- convolution geometry from attributes ------------------------------------------------

TEST(Sizes, ConvDilatedKernelExtentIsChecked) {
  // dilation * (KH - 1) = 2^30 * (2^40 - 1) overflowed.
  const Tensor x = huge_view({1, 1, int64_t{1} << 40, 1});
  const Tensor w = huge_view({1, 1, int64_t{1} << 40, 1});
  expect_error(
      [&] {
        (void)conv2d(x, w, Conv2dOptions{.dilation = {int64_t{1} << 30, 1}});
      },
      "conv2d", {"size overflows"});
}

TEST(Sizes, ConvInputGradGroupsAreChecked) {
  // C/groups * groups = 4 * 2^62 overflowed.
  const Attrs a{{"stride", I64{1, 1}},
                {"padding", I64{0, 0}},
                {"dilation", I64{1, 1}},
                {"groups", k62},
                {"input_size", I64{1, 1}}};
  expect_error(
      [&] {
        (void)bind1(primitive("conv_input_grad"), {zeros({1, 1, 1, 1}), zeros({1, 4, 1, 1})}, a);
      },
      "conv2d_input_grad", {"size overflows"});
}

}  // namespace
