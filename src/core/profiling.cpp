#include "core/profiling.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

namespace kiln::detail {

std::atomic<bool> g_profiling{false};

namespace {

struct Recording {
  std::mutex mutex;
  std::map<std::pair<uint64_t, int>, ProfileRow> rows;
};
// Never destroyed: compiled functions may still run (and the exit table is printed) while
// static objects are torn down.
Recording& recording() {
  static auto* r = new Recording;
  return *r;
}

void print_at_exit() { std::fputs(stop_profile().table().c_str(), stderr); }

}  // namespace

void init_profiling() {
  const char* v = std::getenv("KILN_PROFILE");
  if (!v || std::string_view(v) == "0" || std::string_view(v).empty()) return;
  if (std::string_view(v) != "1") {
    std::fprintf(stderr, "kiln: KILN_PROFILE=%s ignored, expected 0 or 1\n", v);
    return;
  }
  begin_profile();
  std::atexit(print_at_exit);
}

uint64_t next_profile_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

void record_step(uint64_t function, int step, double seconds,
                 const std::function<ProfileRow()>& describe) {
  Recording& r = recording();
  std::lock_guard lock(r.mutex);
  if (!g_profiling.load(std::memory_order_relaxed)) return;  // stopped while the step ran
  auto [it, fresh] = r.rows.try_emplace({function, step});
  if (fresh) {
    it->second = describe();
    it->second.step = step;
  }
  ++it->second.calls;
  it->second.seconds += seconds;
}

void begin_profile() {
  Recording& r = recording();
  std::lock_guard lock(r.mutex);
  r.rows.clear();
  g_profiling.store(true, std::memory_order_relaxed);
}

std::vector<ProfileRow> take_profile() {
  Recording& r = recording();
  std::lock_guard lock(r.mutex);
  g_profiling.store(false, std::memory_order_relaxed);
  // Per function (in order of first compilation), longest steps first.
  std::vector<std::pair<std::pair<uint64_t, int>, ProfileRow>> rows(r.rows.begin(), r.rows.end());
  r.rows.clear();
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    if (a.first.first != b.first.first) return a.first.first < b.first.first;
    return a.second.seconds > b.second.seconds;
  });
  // Functions of the same name (two jits left unnamed) are told apart as "name (2)", ....
  std::map<std::string, std::vector<uint64_t>> ids_of;
  for (const auto& [key, row] : rows) {
    std::vector<uint64_t>& ids = ids_of[row.function];
    if (std::find(ids.begin(), ids.end(), key.first) == ids.end()) ids.push_back(key.first);
  }
  std::vector<ProfileRow> out;
  for (auto& [key, row] : rows) {
    const std::vector<uint64_t>& ids = ids_of[row.function];
    const auto nth = std::find(ids.begin(), ids.end(), key.first) - ids.begin();
    if (nth > 0) row.function += " (" + std::to_string(nth + 1) + ")";
    out.push_back(std::move(row));
  }
  return out;
}

}  // namespace kiln::detail
