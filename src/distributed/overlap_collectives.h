// The pass that overlaps collectives with computation: jit runs it on what it compiles
// (docs/DESIGN.md, "Overlapping collectives").
#pragma once

#include "kiln/ir.h"

namespace kiln::distributed {

// In f and every sub-function, each process_all_gather over more than one process becomes a
// process_all_gather_start, placed as early as its operand and KILN_GATHER_AHEAD allow (the
// number of gathers in flight beside the one in use, default 1; 0: gathers stay whole), and a
// process_all_gather_done where the gather was. Each process_reduce_scatter over more than one
// process becomes a process_reduce_scatter_start where it was and a
// process_reduce_scatter_done as late as what reads it allows (unless KILN_DEFER_SCATTERS=0).
// Calls are inlined first (ir::inline_calls), so that the collectives of checkpoints' bodies
// are in the function they run in; f without such collectives comes back as it is.
ir::Function overlap_collectives(const ir::Function& f);

}  // namespace kiln::distributed
