// The compiled drivers of structured control flow: what a compiled function runs for a `scan`,
// `while` or `cond` equation in place of the interpreter's kernels (docs/DESIGN.md, "Compiler").
// Each step calls the body's compiled code directly (loops.h never returns to ir::evaluate):
// xs slices are views, ys are written into their stacked outputs, and the carry alternates
// between two buffers allocated once per loop, so a step allocates no tensor memory.
#pragma once

#include <span>
#include <vector>

#include "kiln/ir.h"

namespace kiln::compiler::loops {

// Whether `run` drives this primitive (scan, while, cond); the others run their kernels.
bool drives(const Primitive& p);

// Runs equation e (one that `drives` accepts) of a compiled function on concrete inputs, while
// that function runs on this thread (its sub-functions' code comes from
// compiled_sub_function). Results, and the order the bodies run in, are the interpreter
// kernels'.
std::vector<Tensor> run(const ir::Equation& e, std::span<const Tensor> ins);

}  // namespace kiln::compiler::loops
