// Partial evaluation of IR by known inputs: what reverse mode through loops uses to move a
// step's forward recomputation out of the backward body (docs/DESIGN.md, "Reverse mode
// through scan stores residuals").
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "kiln/ir.h"
#include "kiln/primitive.h"

namespace kiln::ir {

// f split by which of its parameters are known ahead of the rest:
//   known:   (f's known parameters, in order) -> residuals
//   unknown: (f's parameters..., residuals...) -> f's results
// so that unknown(p, known(p_known)) == f(p). `known` holds every equation that reads only
// known parameters and constants; `unknown` redoes the ones cheaper to redo than to store —
// layout ops (views), and arithmetic without transcendental functions that reads at most one
// value varying per step (tanh's 1 - y² from y) — from what it has — and those `recompute`
// picks (a checkpoint policy's primitives).
struct KnownSplit {
  FunctionRef known;
  FunctionRef unknown;
  std::size_t num_residuals = 0;
};
KnownSplit split_known(const Function& f, const std::vector<bool>& param_known,
                       const std::function<bool(const Equation&)>& recompute = {});

// a's body with b's appended over the same parameters (b's read a's, in order), returning a's
// results then b's: where b recomputes part of a, CSE then merges the two.
Function concat_bodies(const Function& a, const Function& b);

// Which of f's parameters its equations or results read, by position.
std::vector<bool> params_read(const Function& f);

}  // namespace kiln::ir
