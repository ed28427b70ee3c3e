#include "core/profiling.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::detail {

std::atomic<bool> g_profiling{false};

namespace {

using Rows = std::map<std::pair<uint64_t, int>, ProfileRow>;
// The profiles being recorded, outermost (KILN_PROFILE's) first; each step goes into all.
struct Recording {
  std::mutex mutex;
  std::vector<Rows> open;
};
// Never destroyed: compiled functions may still run (and the exit table is printed) while
// static objects are torn down.
Recording& recording() {
  static auto* r = new Recording;
  return *r;
}

// The outermost profile: KILN_PROFILE's, under any a program left open.
void print_at_exit() {
  Profile p = stop_profile();
  while (g_profiling.load(std::memory_order_relaxed)) p = stop_profile();
  std::fputs(p.table().c_str(), stderr);
}

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
  std::optional<ProfileRow> described;
  for (Rows& rows : r.open) {  // none when the profile stopped while the step ran
    auto [it, fresh] = rows.try_emplace({function, step});
    if (fresh) {
      if (!described) described = describe();
      it->second = *described;
      it->second.step = step;
      it->second.first_seconds = seconds;
    }
    ++it->second.calls;
    it->second.seconds += seconds;
  }
}

void begin_profile() {
  Recording& r = recording();
  std::lock_guard lock(r.mutex);
  r.open.emplace_back();
  g_profiling.store(true, std::memory_order_relaxed);
}

std::vector<ProfileRow> take_profile() {
  Recording& r = recording();
  std::lock_guard lock(r.mutex);
  if (r.open.empty()) return {};
  // Per function (in order of first compilation), longest steps first (after their first calls).
  std::vector<std::pair<std::pair<uint64_t, int>, ProfileRow>> rows(r.open.back().begin(),
                                                                    r.open.back().end());
  r.open.pop_back();
  g_profiling.store(!r.open.empty(), std::memory_order_relaxed);
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    if (a.first.first != b.first.first) return a.first.first < b.first.first;
    return a.second.later_seconds() > b.second.later_seconds();
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
