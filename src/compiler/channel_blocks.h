// Which images compiled code stores channel-blocked, [N, C/b, H, W, b] (docs/DESIGN.md,
// "Channel-blocked values"), and the fusion groups rewritten to read and write them so. Pure
// analysis of a partition: no LLVM, no memory.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "compiler/fusion.h"

namespace kiln::compiler {

struct ChannelBlocks {
  int64_t block = 0;
  std::vector<bool> blocked;  // per value id
};

// Chooses the blocked values of f's partition for channel blocks of `block` (none: nothing is
// blocked) and rewrites, in p, the groups that read or write them over the split domain
// [N, C/b, H, W, b].
ChannelBlocks block_channels(const ir::Function& f, Partition& p, std::optional<int64_t> block);

}  // namespace kiln::compiler
