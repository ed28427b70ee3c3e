// The size from which compiled loops stream their stores (detail/streaming.h).
#include "detail/streaming.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>

#include "core/allocator.h"

namespace kiln::detail {

namespace {

// The largest cache level's size as the kernel reports it (sysfs: per core complex on AMD,
// where glibc's sysconf reports the whole socket's), else sysconf's, else 32 MiB.
int64_t last_level_cache_bytes() {
  int best_level = 0;
  int64_t best = 0;
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level_file(dir + "level"), size_file(dir + "size");
    int level = 0;
    int64_t size = 0;
    std::string unit;
    if (!(level_file >> level) || !(size_file >> size)) continue;
    size_file >> unit;  // "32768K"
    if (!unit.empty() && unit[0] == 'K') size <<= 10;
    if (!unit.empty() && unit[0] == 'M') size <<= 20;
    if (level > best_level && size > 0) best_level = level, best = size;
  }
  if (best > 0) return best;
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return l3 > 0 ? l3 : int64_t{32} << 20;
}

}  // namespace

int64_t streaming_bytes() {
  static const int64_t bytes = [] {
    if (auto v = parse_env_int("KILN_STREAMING_BYTES", std::getenv("KILN_STREAMING_BYTES"), 0,
                               std::numeric_limits<int64_t>::max()))
      return *v;
    return last_level_cache_bytes() / 2;
  }();
  return bytes;
}

}  // namespace kiln::detail
