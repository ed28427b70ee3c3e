// The examples' handling of several processes (mpirun): who speaks, and what a process count
// needs from the flags.
#pragma once

#include <kiln/distributed.h>

#include <cstdint>
#include <optional>
#include <string>

namespace mpirun {

// Under mpirun every process runs the program; process 0 prints and writes for all of them.
inline bool leader() { return kiln::distributed::process_index() == 0; }

// What is wrong with this process count for a run of `batch_size` `units` per step over all
// processes, if anything: several processes without --data-parallel (each would train alone
// and write the same files), or a batch that they do not divide.
inline std::optional<std::string> count_problem(bool data_parallel, int64_t batch_size,
                                                const std::string& units) {
  const int processes = kiln::distributed::process_count();
  if (processes > 1 && !data_parallel)
    return "started as " + std::to_string(processes) +
           " processes: add --data-parallel to train on all of them";
  if (batch_size % processes != 0)
    return "--batch-size (" + units + " per step over all processes) must be divisible by the " +
           std::to_string(processes) + " processes, got " + std::to_string(batch_size);
  return std::nullopt;
}

}  // namespace mpirun
