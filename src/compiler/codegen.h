// LLVM IR for fusion groups: one function per group, vectorised at the host's width, with
// SLEEF's vector functions for transcendental ops (docs/DESIGN.md, "Compiler").
#pragma once

#include <cstdint>
#include <string>

#include "compiler/fusion.h"

namespace llvm {
class Module;
}

namespace kiln::compiler {

// A group's kernel: `buffers` holds the group's inputs (Group::inputs order) then its outputs
// (Group::outputs order); it computes indices [begin, end) of its range, and adds their terms
// of the group's totals into `totals` (Group::totals; the caller zeroes it, adds the calls'
// arrays and stores the totals: the kernel does not write their outputs).
using KernelFn = void (*)(char* const* buffers, int64_t begin, int64_t end, double* totals);

// The index range a kernel splits across threads: the elements of an elementwise group, the
// kept indices of a reduction group.
int64_t kernel_range(const Group& g);
// Roughly how much work one index of that range is, for parallel_for's grain.
int64_t kernel_cost(const Group& g);

// Adds the group's kernel to `m` as the external function `name`.
void emit_group(llvm::Module& m, const Group& g, const std::string& name);

}  // namespace kiln::compiler
