// Internal to src/ir: what the optimisation passes share (src/ir/passes.cpp).
#pragma once

#include "kiln/ir.h"

namespace kiln::ir {

// f without its equations: what a pass starts from before it writes the equations anew (a copy
// of f would copy every equation only to drop it, a large share of a long program's passes).
Function without_equations(const Function& f);

}  // namespace kiln::ir
