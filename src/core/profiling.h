// The recorder behind kiln/profile.h: compiled functions report each step's wall time here
// while a profile is on (docs/DESIGN.md, "Profiles").
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "kiln/profile.h"

namespace kiln::detail {

extern std::atomic<bool> g_profiling;
// Reads KILN_PROFILE once (and starts the process's profile when it is 1).
void init_profiling();

// Whether steps are being recorded: one relaxed load once KILN_PROFILE has been read.
inline bool profiling() {
  static const bool env_read = (init_profiling(), true);
  (void)env_read;
  return g_profiling.load(std::memory_order_relaxed);
}

// A number naming one compiled function for the process's life (addresses are reused).
uint64_t next_profile_id();
// Adds one call of step `step` of the compiled function `function` (from next_profile_id)
// taking `seconds`. `describe` fills the row's function, fused, what,
// flops and bytes; it runs on the step's first record only.
void record_step(uint64_t function, int step, double seconds,
                 const std::function<ProfileRow()>& describe);

// Opens a profile; steps go into every open one.
void begin_profile();
// Closes the innermost open profile and returns its rows, sorted as Profile::rows (none when
// none is open).
std::vector<ProfileRow> take_profile();

}  // namespace kiln::detail
