#include "distributed/shared_memory.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

namespace kiln::distributed {
namespace {

// One cache line per member's counter, so that members do not write the same line.
constexpr std::size_t kLine = 64;
// Segments grow in steps of at least this much, so that growing is rare.
constexpr std::size_t kGrain = std::size_t{1} << 20;
// Larger collectives take MPI's transport: a segment stays allocated until finalize, so this
// bounds the shared memory each process keeps (every member decides alike: the sizes come
// from the collective's attributes).
constexpr std::size_t kMaxBytes = std::size_t{64} << 20;
// The counters are atomics shared between processes: only sound when lock-free.
static_assert(std::atomic_ref<int64_t>::is_always_lock_free);

// Read once: every process of a job must see the same value (mpirun passes the environment).
bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_SHARED_MEMORY_COLLECTIVES");
    return !v || std::strcmp(v, "0") != 0;
  }();
  return on;
}

// Per communicator: its segments, or nullptr where its members are not all on this host; and
// the communicators in the order their segments were made, the same on every process (made at
// collectives in lockstep), which is the order freeing them (collective calls) must follow.
// Never destroyed: distributed::finalize, an atexit handler registered before this is made,
// frees the segments, and must find the registry still there.
struct Registry {
  std::map<MPI_Comm, std::unique_ptr<SharedSegments>> by_comm;
  std::vector<MPI_Comm> made;
};
Registry& registry() {
  static auto* r = new Registry;
  return *r;
}

}  // namespace

SharedSegments* shared_segments(MPI_Comm comm, std::size_t bytes, const Arrival& a) {
  if (!enabled() || bytes > kMaxBytes) return nullptr;
  Registry& r = registry();
  auto it = r.by_comm.find(comm);
  if (it == r.by_comm.end()) {
    // key 0: members keep their order, so a member's index is its rank in comm.
    MPI_Comm node = MPI_COMM_NULL;
    check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), a,
          "MPI_Comm_split_type");
    int here = 0, all = 0;
    MPI_Comm_size(node, &here);
    MPI_Comm_size(comm, &all);
    std::unique_ptr<SharedSegments> s;
    if (here == all)
      s = std::make_unique<SharedSegments>(node, a);
    else
      MPI_Comm_free(&node);
    it = r.by_comm.emplace(comm, std::move(s)).first;
    r.made.push_back(comm);
  }
  if (it->second) it->second->reserve(bytes, a);
  return it->second.get();
}

void release_shared_segments() {
  Registry& r = registry();
  for (MPI_Comm comm : r.made) r.by_comm.erase(comm);
  r.made.clear();
}

SharedSegments::SharedSegments(MPI_Comm node, const Arrival& a) : node_(node) {
  MPI_Comm_size(node_, &size_);
  MPI_Comm_rank(node_, &index_);
  bases_.assign(static_cast<std::size_t>(size_), nullptr);
  // The counters live in member 0's memory; it zeroes them before anyone reads them.
  void* mine = nullptr;
  check(MPI_Win_allocate_shared(index_ == 0 ? static_cast<MPI_Aint>(kLine) * size_ : 0, 1,
                                MPI_INFO_NULL, node_, &mine, &counters_),
        a, "MPI_Win_allocate_shared");
  MPI_Aint bytes = 0;
  int unit = 0;
  void* base = nullptr;
  check(MPI_Win_shared_query(counters_, 0, &bytes, &unit, &base), a, "MPI_Win_shared_query");
  counter_base_ = static_cast<std::byte*>(base);
  if (index_ == 0) std::memset(counter_base_, 0, kLine * static_cast<std::size_t>(size_));
  check(MPI_Barrier(node_), a, "MPI_Barrier");
}

SharedSegments::~SharedSegments() {
  if (data_ != MPI_WIN_NULL) MPI_Win_free(&data_);
  MPI_Win_free(&counters_);
  MPI_Comm_free(&node_);
}

void SharedSegments::reserve(std::size_t bytes, const Arrival& a) {
  if (bytes <= capacity_) return;
  // Nothing is left pointing at the old segments if making the new ones fails.
  if (data_ != MPI_WIN_NULL) MPI_Win_free(&data_);
  capacity_ = 0;
  std::fill(bases_.begin(), bases_.end(), nullptr);
  const std::size_t want = std::max(bytes + bytes / 2, kGrain);
  MPI_Info info = MPI_INFO_NULL;
  MPI_Info_create(&info);
  MPI_Info_set(info, "alloc_shared_noncontig", "true");  // each segment on its owner's pages
  void* mine = nullptr;
  const int rc =
      MPI_Win_allocate_shared(static_cast<MPI_Aint>(want), 1, info, node_, &mine, &data_);
  MPI_Info_free(&info);
  check(rc, a, "MPI_Win_allocate_shared");
  for (int q = 0; q < size_; ++q) {
    MPI_Aint size = 0;
    int unit = 0;
    void* base = nullptr;
    check(MPI_Win_shared_query(data_, q, &size, &unit, &base), a, "MPI_Win_shared_query");
    bases_[static_cast<std::size_t>(q)] = static_cast<std::byte*>(base);
  }
  capacity_ = want;
}

int64_t& SharedSegments::counter(int member) const {
  return *reinterpret_cast<int64_t*>(counter_base_ + kLine * static_cast<std::size_t>(member));
}

void SharedSegments::written(const Arrival& a) {
  ++epoch_;
  std::atomic_ref<int64_t>(counter(index_)).store(epoch_, std::memory_order_release);
  wait_for(a, [&] {
    for (int q = 0; q < size_; ++q)
      if (std::atomic_ref<int64_t>(counter(q)).load(std::memory_order_acquire) < epoch_)
        return false;
    return true;
  });
}

}  // namespace kiln::distributed
