// Printing tensors and trees: numpy's array2string as the reference (tests/reference/
// printing_ref.py), print options, and the nested layout of trees.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "testing.h"

// A registered struct outside namespace kiln: KILN_TREE gives it operator<<.
namespace app {
struct Params {
  kiln::Tensor w, b;
  int64_t width = 0;
};
KILN_TREE(Params, w, b, width);
}  // namespace app

namespace kiln {
namespace {

using testing::expect_error;

std::string text_of(const io::TensorFile& file, const std::string& name) {
  const std::vector<uint8_t> bytes = testing::at(file, name + "/text").to_vector<uint8_t>();
  return std::string(bytes.begin(), bytes.end());
}

PrintOptions options_of(const io::TensorFile& file, const std::string& name) {
  const std::vector<double> o = testing::at(file, name + "/options").to_vector<double>();
  return PrintOptions{.precision = static_cast<int>(o[0]),
                      .threshold = static_cast<int64_t>(o[1]),
                      .edgeitems = static_cast<int64_t>(o[2]),
                      .linewidth = static_cast<int64_t>(o[3]),
                      .suppress = o[4] != 0};
}

TEST(Printing, MatchesNumpy) {
  const io::TensorFile file = testing::reference("printing");
  int cases = 0;
  for (const io::NamedTensor& entry : file.tensors) {
    const std::string& key = entry.name;
    if (!key.ends_with("/options")) continue;
    const std::string name = key.substr(0, key.size() - 8);
    const ScopedPrintOptions scope(options_of(file, name));
    EXPECT_EQ(to_string(testing::at(file, name + "/x")), text_of(file, name)) << name;
    ++cases;
  }
  EXPECT_GE(cases, 40);
}

// Element by element: every finite float16, and float32 / float64 across magnitudes.
TEST(Printing, ScalarsMatchNumpy) {
  const io::TensorFile file = testing::reference("printing");
  for (const char* name : {"scalars_f16", "scalars_f32", "scalars_f64"}) {
    const Tensor x = testing::at(file, std::string(name) + "/x");
    std::istringstream want(text_of(file, name));
    std::string line;
    int64_t mismatches = 0;
    const std::vector<double> values = x.to_vector<double>();  // exact for every dtype here
    for (std::size_t i = 0; i < values.size(); ++i) {
      std::getline(want, line);
      const std::string got = to_string(full(Shape{}, values[i], x.dtype()));
      if (got != line && ++mismatches <= 5)
        ADD_FAILURE() << name << "[" << i << "]: " << got << " vs numpy " << line;
    }
    EXPECT_EQ(mismatches, 0) << name;
  }
}

TEST(Printing, Bfloat16ShortestDigits) {
  // bfloat16 keeps 8 significant bits. 0.1 is stored as 205 * 2^-11 = 0.10009765625 (values
  // within 2^-12 read back as it: "0.1" does); 1/3 as 171 * 2^-9 = 0.333984375 (0.333 lies
  // outside its half-spacing 2^-10, 0.334 inside); 25.7 as 206 * 2^-3 = 25.75, which 25.7 and
  // 25.8 both read back as, at equal distance: the tie goes to the even digit, as in printf.
  const Tensor x = astype(tensor({0.1, 1.0 / 3.0, 25.7}), bfloat16);
  EXPECT_EQ(to_string(x), "[ 0.1  ,  0.334, 25.8  ]");
  // Digits before the point are exact, as numpy prints them: 1e6 is stored as 244 * 2^12.
  EXPECT_EQ(to_string(astype(tensor(1e6), bfloat16)), "999424.");
  EXPECT_EQ(to_string(astype(tensor(-2.5), bfloat16)), "-2.5");
}

TEST(Printing, BoolsTracersAndEmpty) {
  EXPECT_EQ(to_string(tensor({true, true})), "[true, true]");
  EXPECT_EQ(to_string(tensor(false)), "false");
  EXPECT_EQ(to_string(zeros(Shape{2, 0})), "[]");
  std::string traced;
  (void)jit([&](const Tensor& x) {
    traced = to_string(x);
    return x;
  })(ones(Shape{2}));
  EXPECT_EQ(traced, "Tracer(f32[2])");
}

TEST(PrintOptions, ScopedRestoresAndErrorsLeaveOptionsUnchanged) {
  const PrintOptions before = get_printoptions();
  EXPECT_EQ(before.precision, 8);
  EXPECT_EQ(before.threshold, 1000);
  EXPECT_EQ(before.edgeitems, 3);
  EXPECT_EQ(before.linewidth, 75);
  {
    const ScopedPrintOptions p({.precision = 3});
    EXPECT_EQ(to_string(tensor({1.0 / 3.0})), "[0.333]");
    {
      const ScopedPrintOptions q({.precision = 1, .threshold = 4, .edgeitems = 1});
      EXPECT_EQ(to_string(tensor({0.25, 0.5, 1.0, 2.0, 4.0})), "[0.2, ..., 4. ]");
    }
    EXPECT_EQ(get_printoptions().precision, 3);
  }
  EXPECT_EQ(to_string(tensor({1.0 / 3.0})), "[0.33333333]");
  expect_error([] { set_printoptions({.precision = -1}); }, "set_printoptions",
               {"precision", "got -1", "0 to 100"});
  expect_error([] { set_printoptions({.threshold = -5}); }, "set_printoptions", {"threshold"});
  expect_error([] { set_printoptions({.edgeitems = 0}); }, "set_printoptions", {"edgeitems"});
  expect_error([] { set_printoptions({.linewidth = 0}); }, "set_printoptions", {"linewidth"});
  expect_error([] { const ScopedPrintOptions bad({.precision = 101}); }, "set_printoptions",
               {"precision"});
  EXPECT_EQ(get_printoptions().precision, 8);
  set_printoptions({.precision = 2});
  EXPECT_EQ(to_string(tensor({1.0 / 3.0})), "[0.33]");
  set_printoptions({});
}

// ---- trees ----------------------------------------------------------------------------------

TEST(PrintTree, OneLineWhenItFits) {
  const app::Params p{tensor({1.0f, 2.5f}), tensor(0.5f), 3};
  std::ostringstream os;
  os << p;  // found next to app::Params through KILN_TREE
  EXPECT_EQ(os.str(), "Params{w: [1. , 2.5], b: 0.5, width: 3}");
  EXPECT_EQ(to_string(std::vector<Tensor>{tensor({1, 2}), Tensor()}),
            "[[1, 2], Tensor(undefined)]");
  std::map<std::string, std::tuple<Tensor, std::string>> m{{"a b", {tensor(2), "relu"}}};
  EXPECT_EQ(to_string(m), "{\"a b\": (2, \"relu\")}");
  EXPECT_EQ(to_string(std::optional<Tensor>()), "optional()");
  EXPECT_EQ(to_string(std::array<double, 2>{0.5, 3.0}), "array[0.5, 3.0]");
  EXPECT_EQ(to_string(std::vector<Tensor>{}), "[]");
  std::ostringstream vec;
  vec << std::vector<Tensor>{tensor({7})};  // argument-dependent lookup through Tensor
  EXPECT_EQ(vec.str(), "[[7]]");
}

TEST(PrintTree, NestedLayoutWithKeys) {
  const app::Params p{tensor({1, 2, 3, 4}, Shape{2, 2}), tensor({0.5}), 2};
  EXPECT_EQ(to_string(p),
            "Params{\n"
            "  w: [[1, 2],\n"
            "      [3, 4]],\n"
            "  b: [0.5],\n"
            "  width: 2\n"
            "}");
  const std::map<std::string, std::vector<app::Params>> model{{"layers", {p, p}}};
  EXPECT_EQ(to_string(model),
            "{\n"
            "  \"layers\": [\n"
            "    Params{\n"
            "      w: [[1, 2],\n"
            "          [3, 4]],\n"
            "      b: [0.5],\n"
            "      width: 2\n"
            "    },\n"
            "    Params{\n"
            "      w: [[1, 2],\n"
            "          [3, 4]],\n"
            "      b: [0.5],\n"
            "      width: 2\n"
            "    }\n"
            "  ]\n"
            "}");
}

TEST(PrintTree, WrapsAtTheLineWidthAndUsesThePrintOptions) {
  const std::vector<Tensor> v{arange(8), arange(8)};
  EXPECT_EQ(to_string(v), "[[0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 4, 5, 6, 7]]");
  const ScopedPrintOptions narrow({.threshold = 4, .edgeitems = 1, .linewidth = 20});
  EXPECT_EQ(to_string(v),
            "[\n"
            "  [0, ..., 7],\n"
            "  [0, ..., 7]\n"
            "]");
}

}  // namespace
}  // namespace kiln
