// libFuzzer target: kiln::data::read_idx on arbitrary bytes, raw or gzip'd (docs/DATA.md).
//
// Every input must either load or raise kiln::Error; a crash, a sanitizer report, a leak or any
// other exception is a bug. A file that loads strictly must load the same, with nothing skipped,
// when damaged records may be skipped; a file that loads must have as many bytes as it declares.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kiln/data.h"
#include "memory_file.h"

namespace {

[[noreturn]] void bug(const char* what) {
  std::fprintf(stderr, "fuzz_idx: %s\n", what);
  std::abort();
}

// Small enough that a declared size under it is decompressed quickly.
constexpr int64_t kMaxBytes = int64_t{1} << 24;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  namespace kd = kiln::data;
  static MemoryFile file;
  const std::string& path = file.hold(data, size);
  kd::IdxReport report;
  kiln::Tensor lenient;
  try {
    lenient = kd::read_idx(path, {.on_error = kd::OnError::skip, .max_bytes = kMaxBytes}, &report);
  } catch (const kiln::Error&) {
    return 0;  // rejected cleanly
  }
  if (lenient.rank() < 1 ||
      lenient.numel() * static_cast<int64_t>(kiln::dtype_size(lenient.dtype())) > 4 * kMaxBytes)
    bug("a loaded tensor is not what a file under the limit can hold");
  kiln::Tensor strict;
  try {
    strict = kd::read_idx(path, {.max_bytes = kMaxBytes});
  } catch (const kiln::Error&) {
    if (report.error.empty()) bug("a file read without problems when skipping fails strictly");
    return 0;
  }
  if (report.skipped != 0 || !report.error.empty()) bug("a file that loads strictly had skips");
  const std::size_t n = static_cast<std::size_t>(strict.numel()) * kiln::dtype_size(strict.dtype());
  if (strict.type() != lenient.type() ||
      (n > 0 && std::memcmp(strict.raw_data(), lenient.raw_data(), n) != 0))
    bug("strict and lenient reads differ");
  return 0;
}
