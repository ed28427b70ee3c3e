// Internal to src/distributed: the MPI world the process-level collectives run in, and the
// driver every one of them goes through (docs/DESIGN.md, "pmap and the distributed runtime").
#pragma once

// Only MPI's C API (its C++ bindings are deprecated and warn).
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/impl/interpreters.h"
#include "kiln/shape.h"

namespace kiln::distributed {

// What a process brings to a collective; every process must bring the same. Dimensions that
// legitimately differ between processes (the local example count) are given as -1.
struct Arrival {
  std::string_view collective;  // the user-facing name: psum, all_gather, ...
  std::string_view axis;        // the named axis, for messages
  DType dtype = float32;
  std::vector<int64_t> dims;
};

// Waits until every process has reached this collective, polling for faults (a process that
// failed or left, a dead peer on this host, SIGTERM, the KILN_COLLECTIVE_TIMEOUT deadline),
// and checks that all brought the same; raises the same Error on every process otherwise.
// Call it before the collective's MPI call and hold the returned lock through that call
// (collectives run one at a time); with one process it returns at once.
[[nodiscard]] std::unique_lock<std::mutex> arrive(const Arrival& a);

// Inside a collective, after arrive: polls `done` until it holds, with arrive's fault checks
// (a peer on this host that has exited, SIGTERM, KILN_COLLECTIVE_TIMEOUT).
void wait_for(const Arrival& a, const std::function<bool()>& done);

// pmap's start: every process's local example count along the axis, after checking that all
// call with the same signature (argument structure, dtypes, per-example shapes): its hash is
// compared, its text only made for the message when they differ.
detail::ProcessSpan exchange_sizes(int64_t local, std::size_t signature_hash,
                                   const std::function<std::string()>& signature,
                                   std::string_view axis);

// Whether collectives may run on the collectives' thread: MPI was started with
// MPI_THREAD_SERIALIZED or more (Kiln asks for it; a program that starts MPI itself may not).
bool collectives_may_run_ahead();

// The communicator payloads use (a duplicate of MPI_COMM_WORLD, errors returned).
MPI_Comm world();
// The communicator of the processes with these ranks in MPI_COMM_WORLD, in this order (this
// process among them), made at its first use (by all of them together: a collective's
// payload, after its rendezvous) and kept until finalize. Empty ranks: world().
MPI_Comm communicator(const std::vector<int64_t>& ranks);
// Raises an Error naming the collective when an MPI call returned an error code.
void check(int rc, const Arrival& a, std::string_view call);

// The MPI datatype of a dtype's elements (bool as bytes); float16 and bfloat16 have none
// (collectives that compute widen them to float32 first).
MPI_Datatype mpi_type(DType d);

}  // namespace kiln::distributed
