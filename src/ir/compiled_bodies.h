// Compiled sub-functions for ir::evaluate: while a backend's compiled function runs on this
// thread, the bodies it hands to kernels (loop bodies, called functions) run as compiled code.
// The backend sits above ir, so it installs its table for the duration of a run instead of ir
// calling into it.
#pragma once

#include <memory>
#include <unordered_map>

#include "kiln/ir.h"

namespace kiln::ir {

// The compiled code of each sub-function of one compiled function, by body.
using CompiledBodies = std::unordered_map<const Function*, std::shared_ptr<const Executable>>;

// Makes `bodies` the active table on this thread until destroyed (scopes nest).
class ActiveCompiledBodies {
 public:
  explicit ActiveCompiledBodies(const CompiledBodies* bodies);
  ~ActiveCompiledBodies();
  ActiveCompiledBodies(const ActiveCompiledBodies&) = delete;
  ActiveCompiledBodies& operator=(const ActiveCompiledBodies&) = delete;

 private:
  const CompiledBodies* saved_;
};

// The active table's code for `body`; null when no table is active or `body` is not in it.
const Executable* compiled_body(const Function& body);

}  // namespace kiln::ir
