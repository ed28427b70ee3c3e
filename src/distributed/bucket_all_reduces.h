// The all-reduce bucketing pass: jit runs it after ir::optimize (docs/DESIGN.md, "pmap and
// the distributed runtime").
#pragma once

#include "kiln/ir.h"

namespace kiln::distributed {

// Independent all-reduces over processes of one reduction and dtype become one per bucket of
// KILN_ALLREDUCE_BUCKET_MB (default 4) megabytes, in f and every sub-function.
ir::Function bucket_all_reduces(const ir::Function& f);

}  // namespace kiln::distributed
