// Memory planning for a compiled function: the offset of each intermediate in one arena,
// reused by liveness (docs/DESIGN.md, "Compiler"). Pure: it sees sizes and lifetimes, no IR.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace kiln::compiler {

// A value as the planner sees it. Steps are numbered in the order they run; a buffer is live
// from the step that writes it through the step of its last use.
struct Buffer {
  int64_t bytes = 0;
  int64_t alignment = 1;     // a power of two: the offset is a multiple of it
  std::size_t defined = 0;   // the step that writes it
  std::size_t last_use = 0;  // the last step that reads it; `defined` when none does
  // Not the arena's: an argument, a constant, a result or a value a kernel reads or makes
  // (memory of its own), or a value without memory (a view, a group's internal value).
  bool excluded = false;
  // A buffer made by an earlier step that dies at step `defined`, which this one is written
  // over in place, element by element: this one takes its slot when that is safe (it has one
  // that nothing else took over, as large and as aligned as this one needs).
  std::optional<std::size_t> overwrites;
};

struct MemoryPlan {
  std::vector<std::optional<int64_t>> offsets;  // per buffer; none for excluded ones
  int64_t arena_bytes = 0;
};

// Greedy interval assignment, in order of `defined` (ties in the order given): a buffer takes
// over the slot it overwrites, else the smallest slot whose last holder's last use is before
// `defined` and that fits it, else a new slot at the end of the arena, of its bytes rounded up
// to its alignment. Throws an Error for an invalid description (an alignment that is no power
// of two, a last use before the defining step, an unknown index).
MemoryPlan plan_memory(std::span<const Buffer> buffers);

}  // namespace kiln::compiler
