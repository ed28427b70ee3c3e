#include "detail/trace_hooks.h"

#include "ir/trace.h"

namespace kiln::detail {

void throw_concrete_value_error(std::string_view what, const Tensor& t) {
  if (t.impl()->tracer->escaped()) throw_escaped(what, t);
  fail(what, "needs a concrete value, but got a traced tensor ", t.type(),
       ", expected a concrete tensor: inside a traced function (jit, grad, vmap) values are "
       "abstract; use kiln::cond / kiln::while_loop for data-dependent control flow");
}

}  // namespace kiln::detail
