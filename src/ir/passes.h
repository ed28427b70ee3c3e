// Internal: what the IR passes share (src/ir/passes.cpp; also the compiler's rewrite before it
// partitions, src/compiler/thin_products.cpp).
#pragma once

#include "kiln/ir.h"

namespace kiln::ir {

// f without its equations: what a pass starts from before it writes the equations anew (a copy
// of f would copy every equation only to drop it, a large share of a long program's passes).
Function without_equations(const Function& f);

// Whether a transpose's perm swaps the last two axes and keeps the others.
bool swaps_last_two(const std::vector<int64_t>& perm);

}  // namespace kiln::ir
