// The MPI runtime: start-up, the process group's communicators, and the driver every
// process-level collective goes through, with its checks and fault handling (docs/DESIGN.md,
// "pmap and the distributed runtime").
#include "distributed/runtime.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "distributed/collective_thread.h"
#include "distributed/shared_memory.h"
#include "kiln/distributed.h"
#include "kiln/error.h"

namespace kiln::distributed {
namespace {

// What each process brings to a rendezvous: fixed-size, exchanged as bytes.
enum class Kind : int32_t { collective, finalize, failed };
struct Header {
  int64_t sequence = 0;  // how many rendezvous this process went through before
  Kind kind = Kind::collective;
  int32_t dtype = 0;
  int32_t rank = 0;  // of the operand
  int32_t pad = 0;
  int64_t value = 0;     // a per-process number the caller wants gathered (not compared)
  int64_t dims[6] = {};  // -1 where processes may differ; a rank over 6 hashes the rest into [5]
  char collective[24] = {};
  char axis[24] = {};
  char text[192] = {};  // failed: the error message
};

struct Peer {
  int64_t pid = 0;
  char host[64] = {};
};

struct World {
  std::mutex mutex;                      // collectives run one at a time (MPI_THREAD_SERIALIZED)
  std::atomic<bool> initialized{false};  // read without the mutex: kernels holding it ask
  bool owns_mpi = false;                 // we called MPI_Init, so finalize ends MPI
  bool finalized = false;
  // MPI may be called from the collectives' thread (MPI_THREAD_SERIALIZED or more).
  bool serialized = false;
  int rank = 0, size = 1;
  MPI_Comm data = MPI_COMM_NULL, control = MPI_COMM_NULL;
  std::map<std::vector<int64_t>, MPI_Comm> groups;  // communicator() of each rank list
  int64_t sequence = 0;
  std::vector<Peer> peers;
  // Set once a process failed or left: collectives cannot complete any more.
  std::optional<std::string> broken;
  std::terminate_handler previous_terminate = nullptr;
};
World& state() {
  static World w;
  return w;
}

std::atomic<int> g_waiting{0};  // threads inside a rendezvous (this one and the collectives')
std::atomic<bool> g_sigterm{false};

extern "C" void on_sigterm(int sig) {
  // Inside a rendezvous the driver turns it into an Error; elsewhere it ends the process.
  if (g_waiting.load() > 0) {
    g_sigterm.store(true);
    return;
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

bool launched_by_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

double seconds_from_env(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (end == v || *end || !(s > 0))
    fail("distributed", name, " is not a positive number of seconds: got '", v, "'");
  return s;
}

void copy_text(char* to, std::size_t n, std::string_view from) {
  const std::size_t k = std::min(n - 1, from.size());
  std::memcpy(to, from.data(), k);
  to[k] = '\0';
}

// A process on this host that has ended (no /proc entry, or a zombie).
bool gone(const Peer& p) {
  std::ifstream stat("/proc/" + std::to_string(p.pid) + "/stat");
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  const std::size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return false;
  const char s = line[paren + 2];
  return s == 'Z' || s == 'X';
}

std::string describe(const Header& h) {
  std::ostringstream os;
  if (h.kind == Kind::finalize) return "finalize";
  os << h.collective << " over '" << h.axis << "' (collective #" << h.sequence << ")";
  if (std::strcmp(h.collective, "pmap") == 0) return os.str();
  os << " of " << static_cast<DType>(h.dtype) << "[";
  for (int d = 0; d < std::min(h.rank, 6); ++d)
    os << (d ? "," : "") << (h.dims[d] < 0 ? std::string("*") : std::to_string(h.dims[d]));
  if (h.rank > 6) os << ",...";
  os << "]";
  return os.str();
}

bool same_operand(const Header& a, const Header& b) {
  if (a.dtype != b.dtype || a.rank != b.rank) return false;
  for (int d = 0; d < 6; ++d)
    if (a.dims[d] != b.dims[d]) return false;
  return true;
}

[[noreturn]] void broken_fail(World& w, std::string_view op, std::string why) {
  w.broken = why;
  fail(op, why);
}

// Polls `done` until it holds, failing (and marking the group broken) when a fault means it
// never will: SIGTERM from the launcher, a peer on this host that has exited, or the
// deadline. `where` says what this process waits in, for the messages.
void wait_until(World& w, std::string_view op, double timeout, const std::function<bool()>& done,
                const std::function<std::string()>& where) {
  struct Waiting {
    Waiting() { ++g_waiting; }
    ~Waiting() { --g_waiting; }
  } waiting;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto next_check = start + std::chrono::milliseconds(20);
  for (long spin = 0;; ++spin) {
    if (done()) return;
    if (g_sigterm.load())
      broken_fail(
          w, op,
          "the launcher is ending the job (SIGTERM: another process failed) while " + where());
    const auto now = Clock::now();
    if (now >= next_check) {
      next_check = now + std::chrono::milliseconds(20);
      for (int p = 0; p < w.size; ++p) {
        const Peer& peer = w.peers[static_cast<std::size_t>(p)];
        if (p != w.rank && std::strcmp(peer.host, w.peers[w.rank].host) == 0 && gone(peer))
          broken_fail(w, op,
                      "process " + std::to_string(p) + " (pid " + std::to_string(peer.pid) +
                          ") has exited while " + where());
      }
      if (std::chrono::duration<double>(now - start).count() > timeout) {
        std::ostringstream os;
        os << "no answer from every process within " << timeout
           << " s (KILN_COLLECTIVE_TIMEOUT) while " << where();
        broken_fail(w, op, os.str());
      }
    }
    // Spin briefly for latency, then yield: with more processes than cores the one we wait
    // for needs this core. A collective started ahead that nobody waits for yet leaves the
    // core to the computation beside it.
    if (on_collective_thread() && !awaited())
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    else if (spin > 2000)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// Exchanges headers with every process. Returns them in process order once all have arrived;
// raises an Error (and marks the group broken) when a fault means they never will.
std::vector<Header> rendezvous(World& w, const Header& mine, std::string_view op, double timeout) {
  std::vector<Header> all(static_cast<std::size_t>(w.size));
  MPI_Request request;
  int rc = MPI_Iallgather(&mine, sizeof(Header), MPI_BYTE, all.data(), sizeof(Header), MPI_BYTE,
                          w.control, &request);
  if (rc != MPI_SUCCESS) broken_fail(w, op, "MPI_Iallgather failed at the rendezvous");
  // Only a fault needs the words (this runs for every collective).
  const auto where = [&] {
    return std::string("process ") + std::to_string(w.rank) + " waits in " + describe(mine);
  };
  wait_until(
      w, op, timeout,
      [&] {
        int done = 0;
        if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
          broken_fail(w, op, "MPI_Test failed while " + where());
        return done != 0;
      },
      where);
  return all;
}

Header header(World& w, Kind kind, const Arrival* a) {
  Header h;
  h.sequence = w.sequence++;
  h.kind = kind;
  if (!a) return h;
  h.dtype = static_cast<int32_t>(a->dtype);
  h.rank = static_cast<int32_t>(a->dims.size());
  std::size_t folded = 0;
  for (std::size_t d = 0; d < a->dims.size(); ++d) {
    if (d < 6)
      h.dims[d] = a->dims[d];
    else
      folded = folded * 1000003u + static_cast<std::size_t>(a->dims[d]);
  }
  if (a->dims.size() > 6) h.dims[5] ^= static_cast<int64_t>(folded & 0x3fffffffffffffff);
  copy_text(h.collective, sizeof h.collective, a->collective);
  copy_text(h.axis, sizeof h.axis, a->axis);
  return h;
}

// Another process failed or left, as its header says: the group is broken.
std::optional<std::string> fault_in(const std::vector<Header>& all, int self) {
  for (std::size_t p = 0; p < all.size(); ++p) {
    if (static_cast<int>(p) == self) continue;
    if (all[p].kind == Kind::failed)
      return "process " + std::to_string(p) + " failed: " + all[p].text;
    if (all[p].kind == Kind::finalize)
      return "process " + std::to_string(p) +
             " has finished (returned from main or called distributed::finalize)";
  }
  return std::nullopt;
}

// Tells the others that this process ends with an uncaught exception, so that they fail
// with its message instead of waiting, then lets the previous handler end it.
void on_terminate() {
  World& w = state();
  // The others meet the queued collectives first. One that is still running after the
  // deadline keeps MPI busy on the collectives' thread: then the others learn from the
  // launcher instead.
  if (w.initialized && w.size > 1 && !w.finalized &&
      finish_queued_within(std::min(30.0, seconds_from_env("KILN_COLLECTIVE_TIMEOUT", 300))) &&
      !w.broken) {
    std::string what = "an uncaught exception";
    if (std::exception_ptr e = std::current_exception()) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        what = ex.what();
      } catch (...) {
      }
    }
    Header h = header(w, Kind::failed, nullptr);
    copy_text(h.text, sizeof h.text, what);
    try {
      rendezvous(w, h, "distributed",
                 std::min(30.0, seconds_from_env("KILN_COLLECTIVE_TIMEOUT", 300)));
      // Give the others a moment to report before the launcher ends the job.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    } catch (...) {
    }
  }
  if (w.previous_terminate) w.previous_terminate();
  std::abort();
}

void finalize_at_exit() {
  try {
    finalize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::fflush(nullptr);
    std::_Exit(1);
  }
}

}  // namespace

void initialize() {
  World& w = state();
  if (w.initialized.load()) return;
  const std::lock_guard lock(w.mutex);
  if (w.initialized.load()) return;
  int already = 0;
  MPI_Initialized(&already);
  if (!already && !launched_by_mpirun()) {  // one process, no MPI
    w.initialized.store(true);
    return;
  }
  int provided = MPI_THREAD_SINGLE;
  if (!already) {
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
      fail("distributed::initialize", "MPI_Init_thread failed");
    w.owns_mpi = true;
  } else {
    MPI_Query_thread(&provided);  // as the program that started MPI asked
  }
  w.serialized = provided >= MPI_THREAD_SERIALIZED;
  MPI_Comm_dup(MPI_COMM_WORLD, &w.data);
  MPI_Comm_dup(MPI_COMM_WORLD, &w.control);
  MPI_Comm_set_errhandler(w.data, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(w.control, MPI_ERRORS_RETURN);
  MPI_Comm_rank(w.data, &w.rank);
  MPI_Comm_size(w.data, &w.size);
  Peer me;
  me.pid = static_cast<int64_t>(getpid());
  gethostname(me.host, sizeof me.host - 1);
  w.peers.resize(static_cast<std::size_t>(w.size));
  MPI_Allgather(&me, sizeof(Peer), MPI_BYTE, w.peers.data(), sizeof(Peer), MPI_BYTE, w.control);
  w.previous_terminate = std::set_terminate(on_terminate);
  struct sigaction old = {};
  sigaction(SIGTERM, nullptr, &old);
  if (old.sa_handler == SIG_DFL) std::signal(SIGTERM, on_sigterm);
  if (w.owns_mpi) std::atexit(finalize_at_exit);
  w.initialized.store(true);
}

bool initialized() { return state().initialized; }

bool collectives_may_run_ahead() {
  initialize();
  return state().serialized;
}

int process_index() {
  initialize();
  return state().rank;
}

int process_count() {
  initialize();
  return state().size;
}

void finalize() {
  World& w = state();
  stop_collective_thread();
  const std::lock_guard lock(w.mutex);
  if (!w.initialized || w.finalized || w.data == MPI_COMM_NULL) return;
  w.finalized = true;
  std::optional<std::string> problem = w.broken;
  if (!problem) {
    try {
      const std::vector<Header> all =
          rendezvous(w, header(w, Kind::finalize, nullptr), "distributed::finalize",
                     seconds_from_env("KILN_COLLECTIVE_TIMEOUT", 300));
      for (std::size_t p = 0; !problem && p < all.size(); ++p)
        if (all[p].kind == Kind::failed)
          problem = "process " + std::to_string(p) + " failed: " + all[p].text;
        else if (all[p].kind == Kind::collective)
          problem = "process " + std::to_string(p) + " still waits in " + describe(all[p]) +
                    ", but this process (" + std::to_string(w.rank) + ") has finished";
    } catch (const Error& e) {
      problem = e.what();
    }
  }
  if (problem) {
    // Another process will never finalize, and MPI_Finalize would wait for it.
    w.broken = problem;
    fail("distributed::finalize", *problem);
  }
  release_shared_segments();
  for (auto& [ranks, comm] : w.groups) MPI_Comm_free(&comm);
  w.groups.clear();
  MPI_Comm_free(&w.data);
  MPI_Comm_free(&w.control);
  if (w.owns_mpi) MPI_Finalize();
}

namespace {

// Every process's header for this collective, after the fault checks and the check that all
// are at the same collective; the caller compares the rest.
std::vector<Header> gather(World& w, const Header& mine, const std::string& op) {
  if (w.finalized) fail(op, "over '", mine.axis, "': distributed::finalize was called before");
  if (w.broken) fail(op, "over '", mine.axis, "': the process group is broken: ", *w.broken);
  std::vector<Header> all =
      rendezvous(w, mine, op, seconds_from_env("KILN_COLLECTIVE_TIMEOUT", 300));
  if (std::optional<std::string> fault = fault_in(all, w.rank))
    broken_fail(
        w, op,
        *fault + ", while process " + std::to_string(w.rank) + " waits in " + describe(mine));
  for (std::size_t p = 0; p < all.size(); ++p) {
    const Header& h = all[p];
    if (h.sequence != mine.sequence || std::strcmp(h.collective, mine.collective) != 0 ||
        std::strcmp(h.axis, mine.axis) != 0)
      fail(op, "processes reached different collectives: process ", w.rank, " is at ",
           describe(mine), ", process ", p, " at ", describe(h),
           "; expected every process to run the same collectives in the same order");
  }
  return all;
}

// Gathers variable-length text from every process (all of them call it together).
std::vector<std::string> gather_text(World& w, const std::string& mine) {
  const int n = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<std::size_t>(w.size)), starts(lengths.size());
  MPI_Allgather(&n, 1, MPI_INT, lengths.data(), 1, MPI_INT, w.control);
  int total = 0;
  for (std::size_t p = 0; p < lengths.size(); ++p) starts[p] = total, total += lengths[p];
  std::string all(static_cast<std::size_t>(total), '\0');
  MPI_Allgatherv(mine.data(), n, MPI_CHAR, all.data(), lengths.data(), starts.data(), MPI_CHAR,
                 w.control);
  std::vector<std::string> out;
  for (std::size_t p = 0; p < lengths.size(); ++p)
    out.push_back(
        all.substr(static_cast<std::size_t>(starts[p]), static_cast<std::size_t>(lengths[p])));
  return out;
}

}  // namespace

std::unique_lock<std::mutex> arrive(const Arrival& a) {
  World& w = state();
  finish_queued();  // collectives run in the order the program issued them
  std::unique_lock lock(w.mutex);
  if (w.size == 1) return lock;
  const std::string op(a.collective);
  const Header mine = header(w, Kind::collective, &a);
  const std::vector<Header> all = gather(w, mine, op);
  for (std::size_t p = 0; p < all.size(); ++p) {
    const Header& h = all[p];
    if (!same_operand(h, mine))
      fail(op, "processes disagree on the operand over '", a.axis, "': got ", describe(mine),
           " on process ", w.rank, " and ", describe(h), " on process ", p,
           ", expected the same dtype and shape on every process");
  }
  return lock;
}

void wait_for(const Arrival& a, const std::function<bool()>& done) {
  World& w = state();
  const std::string op(a.collective);
  wait_until(w, op, seconds_from_env("KILN_COLLECTIVE_TIMEOUT", 300), done, [&] {
    return "process " + std::to_string(w.rank) + " waits for the others' data in " + op +
           " over '" + std::string(a.axis) + "'";
  });
}

detail::ProcessSpan exchange_sizes(int64_t local, std::size_t signature_hash,
                                   const std::function<std::string()>& signature,
                                   std::string_view axis) {
  initialize();
  World& w = state();
  finish_queued();
  const std::lock_guard lock(w.mutex);
  if (w.size == 1) return {{local}, 0};
  Header mine = header(w, Kind::collective, nullptr);
  copy_text(mine.collective, sizeof mine.collective, "pmap");
  copy_text(mine.axis, sizeof mine.axis, axis);
  mine.value = local;
  mine.dims[0] = static_cast<int64_t>(signature_hash >> 1);
  const std::vector<Header> all = gather(w, mine, "pmap");
  detail::ProcessSpan span{{}, w.rank};
  bool same = true;
  for (const Header& h : all) {
    span.sizes.push_back(h.value);
    same = same && h.dims[0] == mine.dims[0];
  }
  if (!same) {
    const std::string own = signature();
    const std::vector<std::string> text = gather_text(w, own);
    for (std::size_t p = 0; p < text.size(); ++p)
      if (text[p] != own)
        fail("pmap", "processes call pmap over '", axis, "' with different arguments: got ", own,
             " on process ", w.rank, " and ", text[p], " on process ", p,
             ", expected the same structure, dtypes and per-example shapes on every process");
  }
  return span;
}

MPI_Comm world() { return state().data; }

MPI_Comm communicator(const std::vector<int64_t>& ranks) {
  World& w = state();
  if (ranks.empty()) return w.data;
  if (auto it = w.groups.find(ranks); it != w.groups.end()) return it->second;
  const std::vector<int> members(ranks.begin(), ranks.end());
  MPI_Group everyone = MPI_GROUP_NULL, some = MPI_GROUP_NULL;
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_group(w.data, &everyone);
  MPI_Group_incl(everyone, static_cast<int>(members.size()), members.data(), &some);
  const int rc = MPI_Comm_create_group(w.data, some, 0, &comm);
  MPI_Group_free(&some);
  MPI_Group_free(&everyone);
  if (rc != MPI_SUCCESS || comm == MPI_COMM_NULL)
    broken_fail(w, "distributed", "MPI_Comm_create_group failed for the processes of a mesh axis");
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return w.groups.emplace(ranks, comm).first->second;
}

void check(int rc, const Arrival& a, std::string_view call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(rc, text, &n);
  broken_fail(state(), a.collective,
              std::string(call) + " over '" + std::string(a.axis) +
                  "' failed: " + std::string(text, static_cast<std::size_t>(n)));
}

MPI_Datatype mpi_type(DType d) {
  switch (d) {
    case bool_:
    case uint8:
      return MPI_UINT8_T;
    case uint32:
      return MPI_UINT32_T;
    case int32:
      return MPI_INT32_T;
    case int64:
      return MPI_INT64_T;
    case float16:
    case bfloat16:
      return MPI_UINT16_T;
    case float32:
      return MPI_FLOAT;
    case float64:
      return MPI_DOUBLE;
    case complex64:
      return MPI_C_FLOAT_COMPLEX;
    case complex128:
      return MPI_C_DOUBLE_COMPLEX;
  }
  fail("distributed", "no MPI datatype for ", d);
}

}  // namespace kiln::distributed
