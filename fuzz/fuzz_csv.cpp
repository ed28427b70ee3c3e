// libFuzzer target: kiln::data::from_csv on arbitrary bytes (docs/DATA.md), then every sample and
// batch of the pipeline.
//
// Every input must either load or raise kiln::Error; a crash, a sanitizer report, a leak or any
// other exception is a bug. A file that loads strictly must load the same rows, nothing skipped,
// when bad lines may be skipped; a file that loads is read again with its columns selected in
// reverse, the first one kept as text and the second typed int32, which must not crash either.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "kiln/data.h"
#include "memory_file.h"

namespace {

namespace kd = kiln::data;

[[noreturn]] void bug(const char* what) {
  std::fprintf(stderr, "fuzz_csv: %s\n", what);
  std::abort();
}

// Iterates the pipeline and its batches (text columns padded); returns the row count.
int64_t drain(kd::Pipeline& p, const std::vector<std::string>& text) {
  int64_t rows = 0;
  std::vector<std::string> names;
  for (kd::Sample& s : p) {
    if (rows == 0) names = s.names();
    if (s.names() != names) bug("rows with different fields");
    ++rows;
  }
  kd::BatchOptions options;
  for (const auto& t : text) options.pad.emplace_back(t, 0.0);
  int64_t batched = 0;
  for (kd::Batch& b : p.batch(3, options)) batched += b.at(names.at(0)).shape()[0];
  if (batched != rows || p.size() != rows) bug("row counts disagree");
  return rows;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  static MemoryFile file;
  const std::string& path = file.hold(data, size);
  std::optional<kd::Pipeline> lenient;
  try {
    lenient = kd::from_csv(path, {.on_error = kd::OnError::skip});
  } catch (const kiln::Error&) {
    return 0;  // rejected cleanly
  }
  std::optional<kd::Pipeline> strict;
  try {
    strict = kd::from_csv(path);
  } catch (const kiln::Error&) {
  }
  try {
    const int64_t rows = drain(*lenient, {});
    if (strict && (strict->size() != rows || lenient->stats().skipped != 0))
      bug("a file that loads strictly loads differently when skipping");
    if (rows == 0) return 0;
    const std::vector<std::string> names = lenient->get(0).names();
    // Padding the text column adds a field <name>_length: a column of that name makes that a
    // usage error (test_data checks it), not a failure to iterate.
    if (std::find(names.begin(), names.end(), names[0] + "_length") != names.end()) return 0;
    kd::CsvOptions options{.select = {names.rbegin(), names.rend()},
                           .text_columns = {names[0]},
                           .on_error = kd::OnError::skip};
    if (names.size() > 1) options.types = {{names[1], kiln::int32}};
    kd::Pipeline again = kd::from_csv(path, options);
    drain(again, {names[0]});
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    bug("a loaded file failed to iterate");
  }
  return 0;
}
