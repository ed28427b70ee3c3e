#include "detail/trace_hooks.h"

namespace kiln::detail {

void throw_concrete_value_error(std::string_view what, const Tensor& t) {
  fail(what, "needs a concrete value, but got a traced tensor ", t.type(),
       ", expected a concrete tensor: inside a traced function (jit, grad, vmap) values are "
       "abstract; use kiln::cond / kiln::while_loop for data-dependent control flow");
}

}  // namespace kiln::detail
