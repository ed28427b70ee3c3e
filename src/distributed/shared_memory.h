// Internal to src/distributed: all-gather and reduce-scatter among processes on one host
// through shared memory instead of MPI's transport (docs/DESIGN.md, "pmap and the distributed
// runtime"). Each member of a communicator whose processes all run on this host has a segment
// the others read: a collective copies its data into its own segment, meets the others at a
// barrier of counters in shared memory (no MPI call), and reads theirs. The collective's
// rendezvous (distributed::arrive) comes first, so every member has finished the previous
// collective, and nobody still reads a segment when its owner writes it again.
#pragma once

#include <cstddef>
#include <vector>

#include "distributed/runtime.h"

namespace kiln::distributed {

class SharedSegments;

// The shared segments of comm's members, each at least `bytes` long (grown together when a
// collective needs more), or nullptr where comm's processes do not all run on this host, for
// more than 64 MB, or with KILN_SHARED_MEMORY_COLLECTIVES=0 (which every process of the job
// must see alike). Every member calls it at the same collective `a`, after its rendezvous,
// with the same `bytes`; an MPI failure making the segments is an Error naming `a`.
SharedSegments* shared_segments(MPI_Comm comm, std::size_t bytes, const Arrival& a);
// Frees every segment (distributed::finalize, before the communicators).
void release_shared_segments();

class SharedSegments {
 public:
  SharedSegments(MPI_Comm node, const Arrival& a);
  ~SharedSegments();
  SharedSegments(const SharedSegments&) = delete;
  SharedSegments& operator=(const SharedSegments&) = delete;

  int size() const { return size_; }
  std::byte* segment(int member) const { return bases_[static_cast<std::size_t>(member)]; }
  // Makes every segment at least `bytes` long (all members together).
  void reserve(std::size_t bytes, const Arrival& a);
  // This member's segment is written: waits until every member's is (with arrive's fault
  // checks), so that reading theirs is safe.
  void written(const Arrival& a);

 private:
  int64_t& counter(int member) const;

  MPI_Comm node_ = MPI_COMM_NULL;
  int size_ = 1, index_ = 0;
  MPI_Win counters_ = MPI_WIN_NULL, data_ = MPI_WIN_NULL;
  std::byte* counter_base_ = nullptr;
  std::size_t capacity_ = 0;
  std::vector<std::byte*> bases_;
  int64_t epoch_ = 0;  // collectives through these segments so far
};

}  // namespace kiln::distributed
