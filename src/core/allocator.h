// Tensor storage allocation: large blocks are cached for reuse instead of going back to the
// system, because a fresh block costs a page fault per page on first touch (docs/DESIGN.md,
// "Memory and threads").
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "kiln/runtime.h"

namespace kiln::detail {

// Requests of at least this many bytes are cached when freed; smaller ones go to malloc/free,
// whose own free lists already reuse them without returning pages to the kernel (those of at
// most 4 KiB through a short list per thread first: allocator.cpp).
inline constexpr std::size_t kCachedMinBytes = std::size_t{256} << 10;

// The size of the block that serves a request of nbytes: nbytes rounded up to 64 below
// kCachedMinBytes, and to the next 2^k * {1, 1.25, 1.5, 1.75} from there on, so that a block
// wastes less than a fifth of itself and freed blocks fit later requests of similar size.
// nbytes <= SIZE_MAX / 4.
std::size_t block_bytes(std::size_t nbytes);

// A 64-byte aligned block for nbytes (0 included), counted in memory_stats(). Throws std::bad_alloc
// when the system cannot satisfy it even after the cache is released.
void* allocate_block(std::size_t nbytes);
// Gives back a block from allocate_block(nbytes), with the same nbytes. Never throws.
void free_block(void* data, std::size_t nbytes) noexcept;

// Changes the bound on cached bytes (evicting down to it); 0 disables caching and empties the
// calling thread's small blocks (other threads' lists empty as they are used). Tests use it;
// users set KILN_ALLOCATOR_CACHE_LIMIT.
void set_cache_limit(int64_t bytes);

// The machine's physical memory in bytes (SIZE_MAX when unknown).
std::size_t physical_memory();

// Parses the value of environment variable `name` (nullptr: unset) as an integer in
// [min, max]. An invalid value (not a whole decimal integer, or out of range) prints one
// warning line on stderr naming the variable and is ignored (nullopt), as PyTorch treats an
// invalid OMP_NUM_THREADS.
std::optional<int64_t> parse_env_int(std::string_view name, const char* value, int64_t min,
                                     int64_t max);

}  // namespace kiln::detail
