// Random well-typed IR programs, the compiled-vs-interpreted check of one program, the
// minimiser that shrinks a failing program, and backends that exist to prove the checks can
// fail (docs/DESIGN.md, "Compiler", Correctness).
//
// Everything takes the backend under test as a `Factory`, so the tests can plug in the LLVM
// backend (`backend(ir::Backend::llvm)`) or a deliberately faulty one (`tampered`).
#pragma once

#include <kiln/kiln.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "compare.h"

namespace kiln::testing {

using Factory =
    std::function<std::shared_ptr<const ir::Executable>(std::shared_ptr<const ir::Function>)>;
// ir::compile with the given backend.
Factory backend(ir::Backend b);

// ---- backends that exist to test the testers ----------------------------------------------

// Changes the outputs of one top-level equation (given its inputs); returns them unchanged
// when it does not apply.
using Tamper = std::function<std::vector<Tensor>(const ir::Equation&, std::span<const Tensor> ins,
                                                 std::vector<Tensor> outs)>;
// An executable that evaluates equation by equation like the interpreter and passes each
// top-level equation's outputs through `tamper` (sub-functions run untouched).
Factory tampered(Tamper tamper);
// Faults: every float32/float64 result of `prim` n ulps up (towards +inf); `prim` computed as
// `with` (the same inputs and attributes: reduce_max as reduce_min).
Tamper ulps_up(std::string prim, int n);
Tamper computed_as(std::string prim, std::string with);
// A backend that ignores its arguments' strides: `inner` run on each non-contiguous
// argument's buffer read as if it were contiguous from the view's first element (where that
// stays inside the buffer), as a code generator that assumed dense inputs would.
Factory ignoring_strides(Factory inner);
// Differences the rules allow, which the checks must accept: transcendental results moved
// towards zero by up to kTranscendentalUlps, float32/float64 reduce_sum accumulated in eight
// lanes of the input's own dtype, in reverse order.
Tamper allowed_differences(uint64_t seed);

// ---- checking one program -----------------------------------------------------------------

// Arguments for parameters of these types, deterministic in `seed`: floats uniform in
// [-2, 2], integers in [-8, 8] (unsigned [0, 16]), bool half true.
std::vector<Tensor> inputs_for(const std::vector<TensorType>& types, uint64_t seed);

// Rule::exact when every float operation in f (sub-functions included) is exact in IEEE
// arithmetic and nothing adds many float terms; Rule::program otherwise.
Rule rule_of(const ir::Function& f);

// The least precise float dtype among f's values (sub-functions included): the precision
// the program rule's bound is stated in. float64 when f computes no floats.
DType least_precise(const ir::Function& f);

// Runs f through `compiled` and through `reference` on args and compares result j by
// tolerance(j). Empty when they agree, including when both raise an Error; otherwise what
// differs.
using ToleranceFor = std::function<Tolerance(std::size_t result)>;
std::optional<std::string> check_program(
    std::shared_ptr<const ir::Function> f, std::span<const Tensor> args, const Factory& compiled,
    const ToleranceFor& tolerance, const Factory& reference = backend(ir::Backend::interpreter));
// The same against the interpreter, every result by `rule` (rule_of(f) when unset) in the
// precision least_precise(f).
std::optional<std::string> check_program(std::shared_ptr<const ir::Function> f,
                                         std::span<const Tensor> args, const Factory& compiled,
                                         std::optional<Rule> rule = std::nullopt);

// ---- random programs ----------------------------------------------------------------------

// A random program: 1-3 parameters (mostly float32; some float64, int32, bool), ranks <= 4,
// <= 64 per axis and <= 4096 elements per value; 4-24 steps of elementwise mixes, broadcasts
// of lower-rank values, layout ops, reductions with keepdims-style broadcasts back (softmax
// and layer-norm patterns), selects from comparisons, converts, matmuls, and cond / while /
// scan with small bodies; exp and log only see bounded arguments, so results are
// well-conditioned. Traced, optimised (as jit hands functions to ir::compile) and verified.
std::shared_ptr<const ir::Function> random_program(uint64_t seed);

// ---- minimising ---------------------------------------------------------------------------

// Shrinks f while `fails` holds: drops results, returns an equation's input instead of its
// result, replaces equations' outputs by an earlier value of the same type or by a new
// parameter (then drops what nothing uses), and halves parameter axes where the program's
// type rules allow, until no single step keeps it failing. Returns f itself when nothing can
// go.
std::shared_ptr<const ir::Function> minimise(
    std::shared_ptr<const ir::Function> f,
    const std::function<bool(std::shared_ptr<const ir::Function>)>& fails);

// The predicate the minimiser uses for compiled-vs-interpreted failures: check_program on
// inputs_for(f's parameter types, seed) reports a difference.
std::function<bool(std::shared_ptr<const ir::Function>)> fails_under(Factory compiled,
                                                                     uint64_t seed);

// ---- the random-program run ---------------------------------------------------------------

struct RandomRunOptions {
  uint64_t seed = 1;
  int64_t count = 100;
  Factory compiled;
  // Where minimised failures are written (created when needed).
  std::filesystem::path failure_dir;
  // Stop early (and say so) after this much wall-clock time; 0: never.
  double time_budget_s = 0;
  // Stop after this many failures; the first 5 are minimised and written.
  int64_t max_failures = 20;
};
struct RandomFailure {
  uint64_t seed;          // random_program(seed) fails
  std::string message;    // what differed, on the original program
  std::string minimised;  // ir::print of the minimised program
  std::filesystem::path file;
};
struct RandomRunReport {
  int64_t checked = 0;
  int64_t exact = 0;  // of which compared bit-exactly (Rule::exact)
  bool out_of_time = false;
  std::vector<RandomFailure> failures;
};
// Program i uses seed options.seed * 1000003 + i; inputs the same seed. Failures are
// minimised and written as random_<seed>.kir.
RandomRunReport run_random_programs(const RandomRunOptions& options);

}  // namespace kiln::testing
