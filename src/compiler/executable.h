// The LLVM backend's ir::Executable: fused groups as native kernels, other equations through
// their registered kernels, intermediates in a reused arena (docs/DESIGN.md, "Compiler").
#pragma once

#include <memory>
#include <span>

#include "kiln/ir.h"

namespace kiln::compiler {

// Calls of one compiled function in a row, as a loop makes them: the arguments from
// `first_fixed` on are the same tensors at every call, checked and bound once for all of them;
// the caller keeps them alive and unchanged, and donates none of them. A Calls must not
// outlive the Code that made it.
class Calls {
 public:
  virtual ~Calls() = default;
  // Runs with `args` and writes result i into dests[i]: a contiguous tensor of that result's
  // type that overlaps no argument, except as Code::updates_in_place allows. Fused kernels
  // write there directly; other results are copied in.
  virtual void run_into(std::span<const Tensor> args, std::span<const Tensor> dests) = 0;
};

// Compiled code: an executable that can also write its results into the caller's buffers,
// which is how the loop drivers (loops.h) reuse one step's carry and ys memory.
class Code : public ir::Executable {
 public:
  // A series of calls whose arguments from `first_fixed` on do not change between them; the
  // series keeps one call's working memory and bindings until it is destroyed.
  virtual std::unique_ptr<Calls> calls(std::size_t first_fixed) const = 0;
  // The i for which result i is argument i updated by kernels that write in place
  // (Primitive::in_place), with nothing reading argument i after them. A caller of
  // Calls::run_into that passes args[i] as dests[i] too (the same memory, shared with no other
  // argument or destination) donates it: the call writes the update into it, a block rather than
  // the whole buffer, while nothing else that the call does not know of holds its memory.
  virtual const std::vector<std::size_t>& updates_in_place() const = 0;
};

// Compiles f and every sub-function it holds (bodies of control flow, call, checkpoint and
// custom rules).
std::shared_ptr<const ir::Executable> compile(std::shared_ptr<const ir::Function> f);

// While a compiled function runs on this thread, the compiled code of one of its
// sub-functions; null otherwise (ir::evaluate then interprets).
const Code* compiled_sub_function(const ir::Function& f);

}  // namespace kiln::compiler
