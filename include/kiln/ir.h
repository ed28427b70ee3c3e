// The typed IR every transformation reads and writes: functional SSA, one equation per
// primitive application, sub-functions held as attributes of higher-order primitives.
//
//   func @f(%x: f32[3], %y: f32[3]) -> f32[] {
//     %0 = sin %x : f32[3]
//     %1 = mul %0, %y : f32[3]
//     %2 = reduce_sum %1 {axes=[0]} : f32[]
//     return %2
//   }
#pragma once

#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/primitive.h"

namespace kiln::ir {

// An SSA value: an id unique within its function, and its type.
struct Value {
  int id = -1;
  TensorType type;
  bool operator==(const Value& o) const { return id == o.id; }
};

// A concrete tensor the function closes over (captured or created while tracing).
struct Constant {
  Value value;
  Tensor tensor;
};

// Where the user called the op that produced an equation, when known.
struct SourceLoc {
  std::string file;
  int line = 0;
  bool known() const { return line > 0; }
};

struct Equation {
  const Primitive* prim = nullptr;
  Attrs attrs;  // sub-functions of higher-order primitives are attributes too
  std::vector<Value> inputs;
  std::vector<Value> outputs;
  SourceLoc loc;
};

struct Function {
  std::string name = "f";
  std::vector<Value> params;
  std::vector<std::string> param_names;  // for printing; may be empty
  std::vector<Constant> constants;
  std::vector<Equation> equations;
  std::vector<Value> results;

  // A fresh id above every id in use.
  int next_id() const;
  std::vector<TensorType> param_types() const;
  std::vector<TensorType> result_types() const;
};

// How deeply sub-functions may nest: those of the top-level function are at level 1. parse
// and verify raise an Error beyond it, so that no recursive walk over IR (printing, passes,
// evaluation, AD, vmap) can run out of stack; docs/DESIGN.md ("Text form") has the figures.
inline constexpr int kMaxNesting = 64;

// Checks SSA form, that every equation's output types are what its type rule infers, that
// results have the types of the values they return, and the nesting limit. Throws
// Error("verify", ...) naming the equation.
void verify(const Function& f);

// The text form; parse(print(f)) computes what f computes and prints identically. parse
// returns a verified function, or raises Error("parse", ...) giving the line:column of the
// first problem (docs/DESIGN.md, "Text form").
std::string print(const Function& f);
std::ostream& operator<<(std::ostream& os, const Function& f);
std::shared_ptr<Function> parse(std::string_view text);

// Traces `body` on abstract parameters of the given types. Values of an enclosing trace that
// the body uses become extra trailing parameters; `captures` holds what to pass for them.
struct Traced {
  std::shared_ptr<Function> function;
  std::vector<Tensor> captures;
};
Traced trace_function(std::string name, const std::vector<TensorType>& params,
                      const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& body,
                      const std::vector<std::string>& param_names = {});
// True while a trace records on this thread (ops then build IR instead of computing).
bool tracing();

// Optimisation passes, each IR -> IR (src/ir/passes.cpp); `optimize` runs them all until
// the program stops shrinking.
Function dce(const Function& f);             // drops what no result depends on
Function cse(const Function& f);             // merges equal equations
Function fold_constants(const Function& f);  // evaluates equations on constants (small results)
// Rewrites exact in IEEE arithmetic: x*1, x/1, x+(-0), x-(+0) -> x (not x+(+0): -0+0 is +0);
// integer x*0 -> 0 (floats keep it: inf*0 is NaN); neg(neg(x)) -> x;
// transpose of transpose, reshape of reshape, broadcast of broadcast -> one step or none.
Function simplify(const Function& f);
// A sum of zero pads of pieces that tile a range of one axis -> one concatenate (and a pad for
// what they leave at the ends): reverse mode's sum of a split's cotangents (src/ir/pad_sums.cpp).
// Exact but for signed zeros: a piece's -0 stays -0, where the sum gave +0.
Function fold_pad_sums(const Function& f);
// Sibling scans over the same operands whose carries evolve identically become one scan
// (src/ir/merge_scans.cpp): reverse mode's forward scan and the primal scan it recomputes.
Function merge_scans(const Function& f);
// A checkpoint with a policy (CheckpointPolicy, kiln/transforms.h) and its pullback: the
// forward equation also returns what the pullback reads except the policy's primitives'
// results, which the pullback recomputes (src/ir/checkpoint_policies.cpp).
Function apply_checkpoint_policies(const Function& f);
Function optimize(const Function& f);
// Equations that compute a sub-function of theirs (Algebra::computes: checkpoint, custom_jvp,
// custom_vjp) replaced by its equations: their rules matter only to transformations, which
// have run when a function is compiled, and inlined bodies fuse with what surrounds them.
Function inline_calls(const Function& f);
// f with `pass` applied to each sub-function its equations hold (bodies of control flow,
// call, checkpoint and custom rules), each distinct body once.
Function map_sub_functions(const Function& f, const std::function<Function(const Function&)>& pass);

// Evaluates f by binding each equation's primitive in order: with concrete arguments and no
// active trace it runs kernels; under a trace it records into that trace.
std::vector<Tensor> evaluate(const Function& f, std::span<const Tensor> args);
// The same, returning every value of f indexed by value id (what reverse mode keeps).
std::vector<Tensor> evaluate_values(const Function& f, std::span<const Tensor> args);

// What runs an optimised function: native code from the LLVM backend (src/compiler/), or
// the interpreter, which stays as the reference the compiler is tested against.
enum class Backend { interpreter, llvm };

// What a backend made of a function: `jit(f).compiled(args...)` shows it.
struct CompiledInfo {
  Backend backend = Backend::interpreter;
  // Partitioning, LLVM (unless cached) and loading the code; for a loop body or branch, its
  // own partitioning only (its program's top level counts the program's LLVM).
  double compile_ms = 0;
  bool from_cache = false;  // the program's native code was read from KILN_CACHE_DIR
  // One fused loop nest: the equations it holds (indices into the function's equations),
  // the bytes it reads and writes, and the text its kernel was generated from.
  struct Group {
    std::vector<int> equations;
    int64_t bytes_read = 0;
    int64_t bytes_written = 0;
    std::string kernel;
    // Outputs written over the memory of an input whose last reader this group is (IR value
    // ids): its arena slot, or (arena false) its buffer, a kernel's output, when at run time
    // nothing else holds it; see docs/DESIGN.md, "Compiler".
    struct InPlace {
      int output = -1;
      int input = -1;
      bool arena = true;
    };
    std::vector<InPlace> in_place;
  };
  std::vector<Group> groups;
  int64_t kernels = 0;  // distinct native kernels: groups with the same kernel text share one
  // Equations run through their primitive's registered kernel (matmul, convolution, control
  // flow, user primitives, ...), in order; under the interpreter, all of them.
  std::vector<int> kernel_calls;
  // Of those, the ones whose primitive writes its result over an input they read last
  // (Primitive::in_place), when at run time nothing else holds that input's memory.
  std::vector<int> kernel_calls_in_place;
  // Results that a loop driver may have written over the argument of the same index (the
  // carry of a loop that updates a buffer a position at a time): see docs/DESIGN.md, "Compiler".
  std::vector<int> results_in_place;
  int64_t arena_bytes = 0;  // scratch memory for intermediates, reused on every call
  // Images stored channel-blocked between the steps that make and read them (IR value ids):
  // see docs/DESIGN.md, "Channel-blocked values".
  std::vector<int> channel_blocked;
};
std::ostream& operator<<(std::ostream& os, const CompiledInfo& info);

class Executable {
 public:
  virtual ~Executable() = default;
  virtual std::vector<Tensor> run(std::span<const Tensor> args) const = 0;
  virtual const CompiledInfo& info() const = 0;
};
// A backend turns a Function into an Executable: ir::compile (kiln/transforms.h, the jit
// layer, which holds the backends) picks one.

}  // namespace kiln::ir
