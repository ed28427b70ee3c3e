// Internal to src/transforms: what the flat core's files share beyond kiln/impl/transforms.h.
#pragma once

#include <vector>

#include "kiln/transforms.h"

namespace kiln::detail {

// A tuple TreeDef of these children.
TreeDef tuple_of(std::vector<TreeDef> children);
std::vector<TensorType> types_of(std::span<const Tensor> ts);

// jvp_call with a tangent per leaf given directly (nullopt: zero, nothing computed for it).
JvpFlat jvp_along(const TreeDef& args_def, const std::vector<Tensor>& leaves,
                  std::vector<Tangent> tangents, const FlatFn& fn);

// The leaf ranges of the arguments in argnums; an Error names `op` for an index out of range.
std::vector<LeafRange> picked_ranges(std::string_view op, const std::vector<int>& argnums,
                                     const TreeDef& args_def);

}  // namespace kiln::detail
