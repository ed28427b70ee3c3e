// The thread's active table of compiled sub-functions (compiled_bodies.h).
#include "ir/compiled_bodies.h"

namespace kiln::ir {
namespace {
thread_local const CompiledBodies* active = nullptr;
}  // namespace

ActiveCompiledBodies::ActiveCompiledBodies(const CompiledBodies* bodies) : saved_(active) {
  active = bodies;
}
ActiveCompiledBodies::~ActiveCompiledBodies() { active = saved_; }

const Executable* compiled_body(const Function& body) {
  if (!active) return nullptr;
  auto it = active->find(&body);
  return it == active->end() ? nullptr : it->second.get();
}

}  // namespace kiln::ir
