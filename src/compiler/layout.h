// The coalesced form of a fusion group's loops: size-1 axes dropped and neighbours that every
// access walks contiguously merged, so that the code generator's loops are few and long.
#pragma once

#include <cstdint>
#include <vector>

#include "compiler/fusion.h"

namespace kiln::compiler {

// The group's domain and accesses over the merged axes.
struct Layout {
  std::vector<int64_t> domain;
  std::vector<bool> reduced;
  std::vector<Access> loads;    // per node (loads only; others empty)
  std::vector<Access> outputs;  // per group output
  std::vector<Access> totals;   // per node (totals only): into their slots
};

Layout coalesce(const Group& g);

}  // namespace kiln::compiler
