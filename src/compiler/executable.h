// The LLVM backend's ir::Executable: fused groups as native kernels, other equations through
// their registered kernels, intermediates in a reused arena (docs/DESIGN.md, "Compiler").
#pragma once

#include <memory>

#include "kiln/ir.h"

namespace kiln::compiler {

// Compiles f and every sub-function it holds (bodies of control flow, call, checkpoint and
// custom rules).
std::shared_ptr<const ir::Executable> compile(std::shared_ptr<const ir::Function> f);

// While a compiled function runs on this thread, the compiled executable of one of its
// sub-functions; null otherwise (ir::evaluate then interprets).
const ir::Executable* compiled_sub_function(const ir::Function& f);

}  // namespace kiln::compiler
