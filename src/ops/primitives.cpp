// Registering every built-in primitive: the registry's one call into ops (core/builtins.h).
#include "ops/primitives.h"

namespace kiln::detail {

void register_builtin_primitives() {
#define KILN_REGISTER_PRIMITIVE(name) (void)prim::name();
  KILN_BUILTIN_PRIMITIVES(KILN_REGISTER_PRIMITIVE)
#undef KILN_REGISTER_PRIMITIVE
}

}  // namespace kiln::detail
