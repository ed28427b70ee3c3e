// Where a compiled function's time goes: per step (fused loop nest or library call), time,
// GFLOP/s and GB/s, set against the machine's measured FMA peak and copy bandwidth.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

// The machine's limits on `threads` cores at once, measured by running on them.
struct MachinePeak {
  std::string isa;        // the vectors the FMA chains ran in: "avx512", "avx2" or "sse", the
                          // widest of the set Kiln runs at (KILN_ISA may lower it; the
                          // libraries follow their own variables, DNNL_MAX_CPU_ISA and
                          // OPENBLAS_CORETYPE)
  int threads = 1;        // cores measured at once
  double fma_gflops = 0;  // float32 FMA peak, summed over the threads (2 FLOPs per FMA lane)
  double copy_gbps = 0;   // streaming copy (memcpy of 24 MiB per thread, less beyond 10
                          // threads): bytes read plus written per second, summed over them
};
// Measured on first request for a thread count (about 0.3 s), then cached; threads in
// [1, kMaxThreads] (kiln/runtime.h), else an Error.
MachinePeak machine_peak(int threads);

// One step of one compiled function, over the calls made while profiling.
struct ProfileRow {
  std::string function;  // the IR function's name; "name (2)", ... for others of that name
  int step = 0;  // its position among the function's steps; -1: the call's own work around them
  bool fused = false;  // a fused loop nest (else a kernel call)
  std::string what;    // fused: its primitives; a kernel call: the primitive and its types
  int64_t calls = 0;
  double seconds = 0;        // wall time over all calls
  double first_seconds = 0;  // the first call this profile recorded, part of `seconds`: the
                             // process's first pays one-time costs (a library generating its
                             // kernel for the shape, fresh pages)
  double flops = 0;          // per call, 2 per multiply-add; 0 where the primitive declares none
  double bytes = 0;          // per call: bytes read plus written
  // The steady state: the calls after the first and their time (the one call, or none, if
  // called at most once: later_calls() is then 1).
  int64_t later_calls() const;
  double later_seconds() const;
};

struct Profile {
  std::vector<ProfileRow> rows;  // by function, then by later_seconds, longest first
  MachinePeak peak;              // for the thread count at stop_profile
  // Per function: its steps with ms per call, share of the function's time, GFLOP/s and % of
  // the FMA peak, GB/s and % of the copy bandwidth, over the calls after the first (all of
  // them, where there was one), and the first call's ms apart.
  std::string table() const;
};

// Starts a profile: every compiled function's steps from now on are recorded into it. Profiles
// nest: one started inside another records the steps of its span into both. The open profiles
// are one stack for the process, whichever thread starts or stops them. With the
// environment variable KILN_PROFILE=1 an outermost profile starts with the process's first
// compiled call and is printed to stderr as a table at exit.
void start_profile();
// Ends the innermost open profile (KILN_PROFILE's when no other is open) and returns what it
// recorded; empty when none is open.
Profile stop_profile();

// Runs f with profiling on and returns the profile.
template <typename F>
Profile profile(F&& f) {
  start_profile();
  try {
    f();
  } catch (...) {
    stop_profile();
    throw;
  }
  return stop_profile();
}

}  // namespace kiln
