// libFuzzer target for the IR text form (docs/DESIGN.md, "Text form"). Every input either
// parses or raises kiln::Error; a parsed function must verify, print, parse again and print
// the same. Small programs whose running time the IR bounds are evaluated as well, so that the
// type rules' promises to the kernels are fuzzed too.
#include <kiln/kiln.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string_view>

using namespace kiln;

namespace {

// Evaluation bounds: elements of any one value, and equations run (loop trips included).
constexpr int64_t kMaxValueElements = 64;
constexpr int64_t kMaxWork = 4096;

[[noreturn]] void die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_ir: %s\n%s\n", what, detail.c_str());
  std::abort();
}

bool small(const ir::Value& v) { return v.type.shape.numel() <= kMaxValueElements; }

// Equations one evaluation of f runs, or nullopt when it may not run: a value too large, a
// while loop (its trip count depends on the values), or more work than kMaxWork.
std::optional<int64_t> work(const ir::Function& f) {
  for (const ir::Value& v : f.params)
    if (!small(v)) return std::nullopt;
  int64_t total = 0;
  for (const ir::Equation& e : f.equations) {
    if (e.prim->name == "while" || e.prim->name == "while_grad") return std::nullopt;
    for (const ir::Value& v : e.outputs)
      if (!small(v)) return std::nullopt;
    const int64_t trips = e.prim->name == "scan" ? e.attrs.get_int("length") : 1;
    if (trips < 0 || trips > kMaxWork) return std::nullopt;
    int64_t inner = 0;
    for (const auto& [name, value] : e.attrs.items())
      if (const auto* fn = std::get_if<FunctionRef>(&value)) {
        const std::optional<int64_t> w = work(**fn);
        if (!w) return std::nullopt;
        inner += *w;
      }
    total += 1 + trips * inner;
    if (total > kMaxWork) return std::nullopt;
  }
  return total;
}

// Arguments with varied values: small integers (non-negative for unsigned dtypes, so that
// the conversion is exact), alternating truth values for bool.
Tensor argument(const TensorType& t) {
  const int64_t n = t.shape.numel();
  std::vector<double> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] = t.dtype == bool_       ? static_cast<double>(i % 2)
                                     : is_unsigned(t.dtype) ? static_cast<double>(i % 7)
                                                            : static_cast<double>(i % 7 - 3);
  return astype(tensor(v, t.shape), t.dtype);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // The built-in primitives register from static initialisers of objects the parser does not
  // reference; without whole-archive linking (fuzz/CMakeLists.txt) every seed would fail.
  for (const char* name : {"add", "matmul", "reduce_sum", "call", "cond", "while", "scan", "conv"})
    if (!find_primitive(name)) die("a built-in primitive is not linked in", name);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // An exact-size heap copy without a NUL: AddressSanitizer reports any read past the view.
  const std::unique_ptr<char[]> buffer(new char[size]);
  if (size) std::memcpy(buffer.get(), data, size);
  std::shared_ptr<ir::Function> f;
  try {
    f = ir::parse(std::string_view(buffer.get(), size));
  } catch (const Error&) {
    return 0;
  }
  const std::string printed = ir::print(*f);
  std::shared_ptr<ir::Function> again;
  try {
    again = ir::parse(printed);
    ir::verify(*again);
  } catch (const Error& e) {
    die("the printed form of a parsed function does not parse", e.what() + ("\n" + printed));
  }
  if (ir::print(*again) != printed)
    die("printing is not stable", printed + "\n---\n" + ir::print(*again));

  if (!work(*f)) return 0;
  std::vector<Tensor> args;
  for (const ir::Value& p : f->params) args.push_back(argument(p.type));
  try {
    const std::vector<Tensor> results = ir::evaluate(*f, args);
    for (std::size_t i = 0; i < results.size(); ++i)
      if (results[i].type() != f->results[i].type)
        die("evaluate returned another type than the IR declares", printed);
  } catch (const Error&) {
    // Errors of kernels at run time (an index out of range, ...) are fine.
  }
  return 0;
}
