// Internal to src/distributed: the thread that runs the collectives a compiled step starts
// ahead of their use (process_all_gather_start, process_reduce_scatter_start), so that the
// step computes while they move data (docs/DESIGN.md, "Overlapping collectives").
#pragma once

#include <functional>
#include <future>

namespace kiln::distributed {

// Queues `collective` to run on the collectives' thread after every one queued before it;
// returns at once. Its Error, if it raises one, is in the future.
std::shared_future<void> run_ahead(std::function<void()> collective);

// Waits for a queued collective and raises its Error. While a thread waits here, the
// collectives' thread polls for its peers at full speed; otherwise it polls lazily, leaving
// the core to the computation it runs beside.
void await(const std::shared_future<void>& collective);
// Whether a thread waits for the collectives' thread (in await or in finishing the queue).
bool awaited();

// Waits until every queued collective has finished. Every collective entered on another
// thread calls it first, so that all run in the order the program issued them, the same on
// every process. Errors stay in the collectives' futures.
void finish_queued();

// finish_queued with a deadline: false if the queue is still busy after `seconds`.
bool finish_queued_within(double seconds);

// Whether the caller is the collectives' thread.
bool on_collective_thread();

// Finishes what is queued and ends the thread (distributed::finalize, before MPI ends); a
// collective queued after it is an Error.
void stop_collective_thread();

}  // namespace kiln::distributed
