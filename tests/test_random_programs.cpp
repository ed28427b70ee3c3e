// Random programs compiled (ir::Backend::llvm) against the interpreter, the minimiser, and the
// regression programs in tests/compiler_regressions/ (program_generator.h).
//
// CI runs a fixed seed and a count sized for its budget (fewer programs in sanitizer and Debug
// builds); a longer run on demand:
//   KILN_RANDOM_PROGRAMS=100000 KILN_RANDOM_SEED=7 build/tests/test_random_programs
// A failing program is minimised, printed and written to a .kir file the message names;
// copy it into tests/compiler_regressions/ to keep it.
#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "compare.h"
#include "program_generator.h"

namespace kiln {
namespace {

using Ts = std::vector<Tensor>;
using testing::Factory;

using testing::kSlowBuild;

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::stoll(v) : fallback;
}

std::filesystem::path failure_dir() {
  return std::filesystem::temp_directory_path() / "kiln_random_programs";
}

std::string describe(const testing::RandomRunReport& r) {
  std::ostringstream os;
  for (const testing::RandomFailure& f : r.failures) {
    os << "random_program(" << f.seed << "): " << f.message << "\n";
    if (!f.minimised.empty())
      os << "minimised, written to " << f.file.string() << " (copy it into "
         << "tests/compiler_regressions/ to keep it):\n"
         << f.minimised << "\n";
  }
  return os.str();
}

// ---- the run -------------------------------------------------------------------------------

TEST(RandomPrograms, CompiledMatchesInterpreter) {
  const bool on_demand = std::getenv("KILN_RANDOM_PROGRAMS") != nullptr;
  testing::RandomRunOptions o{
      .seed = static_cast<uint64_t>(env_int("KILN_RANDOM_SEED", 1)),
      .count = env_int("KILN_RANDOM_PROGRAMS", kSlowBuild ? 150 : 1500),
      .compiled = testing::backend(ir::Backend::llvm),
      .failure_dir = failure_dir(),
      // CI's budget; a run on demand takes as long as it needs.
      .time_budget_s = on_demand ? 0.0 : 40.0,
  };
  const auto start = std::chrono::steady_clock::now();
  const testing::RandomRunReport r = testing::run_random_programs(o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "checked " << r.checked << " random programs (" << r.exact
            << " compared bit-exactly) from seed " << o.seed << " in " << s << " s"
            << (r.out_of_time ? ", stopped by the time budget" : "") << "\n";
  EXPECT_TRUE(r.failures.empty()) << describe(r);
  EXPECT_GE(r.checked, std::min<int64_t>(o.count, 100)) << "too few programs within the budget";
}

// The generator produces what it claims: every kind of step, programs of both rules, all
// well-typed and within the size limits.
TEST(RandomPrograms, GeneratorCoversItsRepertoire) {
  std::map<std::string, int> prims;
  int exact = 0, n = 200;
  std::set<DType> param_dtypes;
  std::function<void(const ir::Function&)> count = [&](const ir::Function& f) {
    for (const ir::Equation& e : f.equations) {
      ++prims[e.prim->name];
      for (const ir::Value& v : e.outputs) {
        EXPECT_LE(v.type.shape.rank(), 4) << ir::print(f);
        EXPECT_LE(v.type.shape.numel(), 4096) << ir::print(f);
      }
      for (const auto& [name, value] : e.attrs.items())
        if (const FunctionRef* g = std::get_if<FunctionRef>(&value)) count(**g);
    }
  };
  for (int i = 0; i < n; ++i) {
    const auto f = testing::random_program(1000 + static_cast<uint64_t>(i));
    ir::verify(*f);
    for (const ir::Value& p : f->params) param_dtypes.insert(p.type.dtype);
    count(*f);
    if (testing::rule_of(*f) == testing::Rule::exact) ++exact;
  }
  for (const char* p : {"add",        "sub",          "mul",     "div",       "max",   "min",
                        "exp",        "log",          "tanh",    "sin",       "pow",   "reduce_sum",
                        "reduce_max", "broadcast_to", "reshape", "transpose", "slice", "select",
                        "gt",         "convert",      "matmul",  "cond",      "while", "scan"})
    EXPECT_GT(prims[p], 0) << "no random program uses " << p;
  for (DType d : {float32, float64, int32, bool_})
    EXPECT_TRUE(param_dtypes.count(d)) << "no parameter of dtype " << d;
  EXPECT_GT(exact, n / 10) << "programs compared bit-exactly";
  EXPECT_LT(exact, n - n / 10) << "programs compared within the program bound";
}

// ---- the checks can fail, and the minimiser shrinks ------------------------------------

// A faulty backend is caught, and its failures shrink to a few equations holding the faulty
// op, written to a file that parses back.
void expect_caught_and_minimised(const testing::Tamper& fault, const std::string& prim) {
  testing::RandomRunOptions o{.seed = 3,
                              .count = 200,
                              .compiled = testing::tampered(fault),
                              .failure_dir = failure_dir() / ("faulty_" + prim),
                              .max_failures = 1};
  const testing::RandomRunReport r = testing::run_random_programs(o);
  ASSERT_FALSE(r.failures.empty()) << "a backend with a faulty " << prim << " went unnoticed";
  const testing::RandomFailure& f = r.failures.front();
  ASSERT_FALSE(f.minimised.empty());
  ASSERT_TRUE(std::filesystem::exists(f.file)) << f.file;
  std::ifstream in(f.file);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto small = ir::parse(text);
  EXPECT_LE(small->equations.size(), 3u) << text;
  EXPECT_TRUE(std::any_of(small->equations.begin(), small->equations.end(),
                          [&](const ir::Equation& e) { return e.prim->name == prim; }))
      << text;
  // Still failing after the round trip through text, and fine with the interpreter.
  EXPECT_TRUE(testing::fails_under(testing::tampered(fault), f.seed)(small)) << text;
  EXPECT_FALSE(testing::fails_under(testing::backend(ir::Backend::interpreter), f.seed)(small));
}

TEST(RandomPrograms, CatchesOneUlpOffInSubAndMinimises) {
  expect_caught_and_minimised(testing::ulps_up("sub", 1), "sub");
}

TEST(RandomPrograms, CatchesAWrongReductionAndMinimises) {
  expect_caught_and_minimised(testing::computed_as("reduce_max", "reduce_min"), "reduce_max");
}

// What a correct compiler may do differently (2-ulp transcendentals, sums in float lanes in
// another order) passes: the program bound is not too tight for the programs generated.
TEST(RandomPrograms, AllowedDifferencesPass) {
  testing::RandomRunOptions o{.seed = 5,
                              .count = kSlowBuild ? 60 : 400,
                              .compiled = testing::tampered(testing::allowed_differences(11)),
                              .failure_dir = failure_dir() / "allowed"};
  const testing::RandomRunReport r = testing::run_random_programs(o);
  EXPECT_TRUE(r.failures.empty()) << describe(r);
}

TEST(Minimiser, KeepsTheFaultyEquationAndDropsTheRest) {
  // sin, a sub in the middle, then more work: a sub 2^14 ulps off is to blame (past the
  // program bound; alone, the sub is checked bit-exactly).
  const TensorType t{float32, Shape{4, 5}};
  auto traced = ir::trace_function("f", {t, t}, [](const Ts& a) {
    const Tensor u = sin(a[0]) * a[1];
    const Tensor v = u - a[1];
    const Tensor w = transpose(v * 2.0 + exp(tanh(u)));
    return Ts{sum(w, {0}), a[0] * 2.0, a[0] + 1.0};
  });
  const auto f = std::make_shared<const ir::Function>(ir::optimize(*traced.function));
  const auto fails = testing::fails_under(testing::tampered(testing::ulps_up("sub", 1 << 14)), 9);
  ASSERT_TRUE(fails(f));
  const auto small = testing::minimise(f, fails);
  ASSERT_EQ(small->equations.size(), 1u) << ir::print(*small);
  EXPECT_EQ(small->equations[0].prim->name, "sub");
  EXPECT_EQ(small->results.size(), 1u);
  EXPECT_EQ(small->params.size(), 2u) << ir::print(*small);
  // Shapes shrink while the fault still shows: to one element per axis.
  for (const ir::Value& p : small->params) EXPECT_LE(p.type.shape.numel(), 2) << ir::print(*small);
}

// ---- regression programs -----------------------------------------------------------------

std::vector<std::string> regression_files() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(KILN_COMPILER_REGRESSIONS_DIR))
    if (e.path().extension() == ".kir") out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

class CompilerRegressions : public ::testing::TestWithParam<std::string> {};

TEST_P(CompilerRegressions, CompiledMatchesInterpreter) {
  const std::filesystem::path path =
      std::filesystem::path(KILN_COMPILER_REGRESSIONS_DIR) / GetParam();
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::shared_ptr<const ir::Function> f = ir::parse(text);
  uint64_t seed = 1469598103934665603ull;  // FNV-1a of the file name: the same inputs everywhere
  for (unsigned char c : GetParam()) seed = (seed ^ c) * 1099511628211ull;
  const Ts args = testing::inputs_for(f->param_types(), seed);
  // The program itself runs (a regression case that only raises tests nothing).
  ASSERT_NO_THROW(ir::evaluate(*f, args)) << text;
  const auto m = testing::check_program(f, args, testing::backend(ir::Backend::llvm));
  EXPECT_FALSE(m) << *m << "\n" << text;
}

INSTANTIATE_TEST_SUITE_P(Files, CompilerRegressions, ::testing::ValuesIn(regression_files()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param.substr(0, info.param.size() - 4);
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

TEST(CompilerRegressionsFolder, HoldsTheSeedPrograms) {
  EXPECT_GE(regression_files().size(), 6u) << KILN_COMPILER_REGRESSIONS_DIR;
}

}  // namespace
}  // namespace kiln
