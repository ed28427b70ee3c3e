// How the registry and the built-in primitives meet, and how compiled code runs a kernel
// without `bind`'s per-call checks. The registry (primitive.cpp) defines
// what an accessor registers with; ops defines the one function that registers them all
// (src/ops/primitives.cpp), which the registry calls before any look-up by name, walk or user
// registration. That call is the registry's only reference to a layer above: it keeps names
// resolving whatever the program has called so far, and keeps every primitive's object file
// in a link against the static library, which drops object files nobody references.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kiln/primitive.h"

namespace kiln::detail {

// Calls every built-in primitive's accessor (prim::add(), ...): defined by ops.
void register_builtin_primitives();

// What an accessor registers its primitive with: register_primitive without registering the
// built-ins first (the accessor is itself part of doing that). `loc` becomes
// Primitive::defined_at; a table-driven family passes its table entry's.
const Primitive& register_builtin(Primitive primitive, std::vector<KernelRegistration> kernels = {},
                                  Loc loc = Loc::current());

// Whether `primitive` runs only the kernels it was registered with: no register_kernel has
// added one that could win its dispatch. Eager short paths that skip bind (view ops) take
// this as their licence.
bool builtin_kernels_only(const Primitive& primitive);

// What `bind` does once the inputs are checked: selects the kernel for the inputs' dtypes,
// runs it and checks its outputs against `out_types`, inferring them by the type rule when
// not given. Compiled code passes the types its IR already holds, so a call pays for no
// type rule.
std::vector<Tensor> run_kernel(const Primitive& primitive, std::span<const Tensor> inputs,
                               const Attrs& attrs,
                               std::optional<std::span<const TensorType>> out_types, Loc loc);

// A count that every register_kernel raises: what was chosen from the registry at one count
// (choose_kernel) still holds while the count is the same.
uint64_t kernel_version();

// The kernel `primitive` would select for these dtypes, and what the compiled executable asks
// of the registry besides, read under one lock at `version`. Compiled code keeps a step's
// choice and looks again only when the version moves, instead of taking the registry's lock
// two or three times a step.
struct KernelChoice {
  const Kernel* kernel = nullptr;  // nullptr when none would be selected: run_kernel raises
  bool builtin_only = false;       // builtin_kernels_only
  // A built-in running only its own kernels: no user's code runs when it is bound
  // (register_primitive's kernels and register_kernel's are a user's).
  bool builtin_code = false;
  uint64_t version = 0;  // kernel_version() starts at 1: a default choice is stale
};
KernelChoice choose_kernel(const Primitive& primitive, std::span<const DType> dtypes);

// run_kernel with the kernel chosen already (choose_kernel's, for the inputs' dtypes) and the
// outputs' types known.
std::vector<Tensor> run_chosen(const Primitive& primitive, const Kernel& kernel,
                               std::span<const Tensor> inputs, const Attrs& attrs,
                               std::span<const TensorType> out_types, Loc loc);

}  // namespace kiln::detail
