// Non-temporal ("streaming") stores for outputs too large to stay in cache (docs/DESIGN.md,
// "Streaming stores"): an ordinary store to a line not in cache first reads the line, which a
// streaming store skips.
#pragma once

#include <cstdint>

namespace kiln::detail {

// Compiled loops write outputs of at least this many bytes with streaming stores: half the
// last-level cache (an output that large, with its inputs, would not stay there for its
// reader anyway), or KILN_STREAMING_BYTES (0: every output that can be).
int64_t streaming_bytes();

}  // namespace kiln::detail
