// Worker-thread stages: parallel maps and prefetching.
#pragma once

#include <functional>
#include <memory>

#include "data/node.h"

namespace kiln::data::detail {

// Elements start, start+1, ... of `view`, fetched by `threads` workers `chunk` at a time.
std::unique_ptr<Cursor> make_parallel_indexed(std::shared_ptr<const Indexed> view, int64_t start,
                                              int threads, int chunk, bool ordered,
                                              StageCounters* stats);

// fn(element, index) over a stream: workers take `chunk` elements at a time from `input` (one
// worker at a time), then transform them in parallel. `first_index` is the index of the input's
// next element.
using IndexFn = std::function<Sample(Sample, int64_t index)>;
std::unique_ptr<Cursor> make_parallel_stream(std::unique_ptr<Cursor> input, int64_t first_index,
                                             IndexFn fn, int threads, int chunk, bool ordered,
                                             StageCounters* stats);

// Runs `input` on a background thread, keeping up to `depth` elements ready.
std::unique_ptr<Cursor> make_prefetch(std::unique_ptr<Cursor> input, int64_t depth,
                                      StageCounters* stats);

}  // namespace kiln::data::detail
