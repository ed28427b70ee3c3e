// The process-level collectives: primitives whose kernels are MPI calls, with their type,
// derivative and batching rules (docs/DESIGN.md, "pmap and the distributed runtime"). With
// one process each is the identity on its local rows. Every kernel first meets the other
// processes at distributed::arrive, which checks that all bring the same collective and
// operand and turns faults into Errors; then it makes one blocking MPI call, or, for
// all_gather and psum_scatter among processes on one host, copies through shared memory
// (shared_memory.h), 1.5-1.8x faster than MPI's transport there (bench_gather_scatter).
#include "distributed/collectives.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "distributed/collective_thread.h"
#include "distributed/runtime.h"
#include "distributed/shared_memory.h"
#include "ir/trace.h"
#include "kiln/distributed.h"
#include "ops/primitives.h"
#include "ops/rules.h"

namespace kiln {
namespace {

using distributed::Arrival;
using Sizes = std::vector<int64_t>;

const std::string& over(const Attrs& a) { return a.get<std::string>("over"); }
const Sizes& sizes(const Attrs& a) { return a.get_ints("sizes"); }

// The processes a collective spans: attribute `group`, their ranks in MPI_COMM_WORLD in axis
// order (a mesh axis), or every process when it is absent.
struct Group {
  const Sizes* ranks = nullptr;
  explicit Group(const Attrs& a) : ranks(a.has("group") ? &a.get_ints("group") : nullptr) {}
  int size() const {
    return ranks ? static_cast<int>(ranks->size()) : distributed::process_count();
  }
  // This process's position among them.
  int index() const {
    const int me = distributed::process_index();
    if (!ranks) return me;
    for (std::size_t p = 0; p < ranks->size(); ++p)
      if ((*ranks)[p] == me) return static_cast<int>(p);
    fail("distributed", "process ", me, " is not among the processes of its own collective: got ",
         attr_to_string(*ranks), ", expected a group holding it");
  }
  // Every member must call it at the same collective: the first call makes the communicator.
  MPI_Comm comm() const { return distributed::communicator(ranks ? *ranks : Sizes{}); }
};

int64_t offset_of(const Sizes& s, int p) {
  int64_t o = 0;
  for (int q = 0; q < p; ++q) o += s[static_cast<std::size_t>(q)];
  return o;
}
int64_t total(const Sizes& s) { return offset_of(s, static_cast<int>(s.size())); }

// The local row count of this process, after checking `sizes` against the process group.
int64_t local_rows(std::string_view op, const Attrs& a) {
  const Sizes& s = sizes(a);
  const Group g(a);
  const int n = g.size();
  if (static_cast<int>(s.size()) != n)
    fail(op, "sizes lists ", s.size(), " processes: got ", attr_to_string(s), ", expected ", n,
         " entries, one local example count per process");
  for (int64_t k : s)
    if (k < 0) fail(op, "negative example count in sizes: got ", attr_to_string(s));
  return s[static_cast<std::size_t>(g.index())];
}

void expect_rows(std::string_view op, const TensorType& t, int axis, int64_t want,
                 std::string_view what) {
  if (t.shape.rank() <= axis || t.shape[axis] != want)
    fail(op, "operand ", t, " does not hold ", what, " along axis ", axis, ": got ",
         t.shape.rank() <= axis ? std::string("no such axis") : std::to_string(t.shape[axis]),
         ", expected ", want);
}

// Elements per row: the product of the dimensions from `from` on.
int64_t elems_from(const Shape& s, int from) {
  int64_t n = 1;
  for (int d = from; d < s.rank(); ++d) n *= s[d];
  return n;
}

int to_int(std::string_view op, int64_t n, std::string_view what) {
  if (n > INT_MAX)
    fail(op, what, " too large for one MPI call: got ", n, ", expected at most ", INT_MAX);
  return static_cast<int>(n);
}

// A contiguous MPI datatype of `bytes` bytes, freed with the scope.
struct RowType {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  RowType(std::string_view op, int64_t bytes) {
    MPI_Type_contiguous(to_int(op, bytes, "row bytes"), MPI_BYTE, &type);
    MPI_Type_commit(&type);
  }
  ~RowType() { MPI_Type_free(&type); }
  RowType(const RowType&) = delete;
  RowType& operator=(const RowType&) = delete;
};

// float16 and bfloat16 are summed in float32 (MPI has no half types).
bool is_half(DType d) { return d == float16 || d == bfloat16; }

std::vector<int64_t> dims_with(const Shape& s, std::initializer_list<int> varying) {
  std::vector<int64_t> d = s.dims();
  for (int k : varying) d[static_cast<std::size_t>(k)] = -1;
  return d;
}

std::byte* bytes(const Tensor& t) { return static_cast<std::byte*>(t.raw_data()); }

Attrs with_sizes(const std::string& axis, const detail::ProcessSpan& span) {
  Attrs a{{"over", axis}, {"sizes", span.sizes}};
  if (!span.group.empty()) a.set("group", span.group);
  return a;
}

// ---- all_reduce ----------------------------------------------------------------------------

distributed::Reduce reduce_of(const Attrs& a) {
  const std::string& op = a.get<std::string>("op");
  if (op == "sum") return distributed::Reduce::sum;
  if (op == "max") return distributed::Reduce::max;
  if (op == "min") return distributed::Reduce::min;
  fail("process_all_reduce", "unknown reduction: got '", op, "', expected sum, max or min");
}
const char* user_name(distributed::Reduce r) {
  return r == distributed::Reduce::sum ? "psum" : r == distributed::Reduce::max ? "pmax" : "pmin";
}

std::vector<Tensor> all_reduce_kernel(ops::Ins in, const Attrs& a) {
  const distributed::Reduce r = reduce_of(a);
  const Tensor& x = in[0];
  const detail::TracingPaused concrete;
  const Tensor src = (is_half(x.dtype()) ? astype(x, float32) : x).contiguous();
  Tensor out = empty(src.type());
  const Arrival arrival{user_name(r), over(a), x.dtype(), x.shape().dims()};
  const Group g(a);
  if (g.size() == 1) {
    std::memcpy(out.raw_data(), src.raw_data(),
                static_cast<std::size_t>(src.numel()) * dtype_size(src.dtype()));
  } else {
    const auto lock = distributed::arrive(arrival);
    const MPI_Comm comm = g.comm();  // made by every member together, whatever they send
    const MPI_Op op = r == distributed::Reduce::sum   ? MPI_SUM
                      : r == distributed::Reduce::max ? MPI_MAX
                                                      : MPI_MIN;
    const std::size_t es = dtype_size(src.dtype());
    // MPI counts are int: a larger buffer goes in pieces (the same pieces on every process).
    constexpr int64_t kPiece = int64_t{1} << 30;
    for (int64_t done = 0; done < src.numel(); done += kPiece) {
      const int n = static_cast<int>(std::min(kPiece, src.numel() - done));
      distributed::check(MPI_Allreduce(bytes(src) + done * es, bytes(out) + done * es, n,
                                       distributed::mpi_type(src.dtype()), op, comm),
                         arrival, "MPI_Allreduce");
    }
  }
  return {is_half(x.dtype()) ? astype(out, x.dtype()) : out};
}

Attrs reduce_attrs(distributed::Reduce r, const detail::ProcessSpan& span,
                   const std::string& axis) {
  Attrs a{{"op", std::string(r == distributed::Reduce::sum   ? "sum"
                             : r == distributed::Reduce::max ? "max"
                                                             : "min")},
          {"over", axis}};
  if (!span.group.empty()) a.set("group", span.group);
  return a;
}

// max/min: the derivative is shared equally by the processes holding the extreme value. The
// sums run over the same processes as the reduction.
struct ExtremeShare {
  Tensor hit, ties;
  Attrs sum;
  explicit ExtremeShare(const RuleArgs& r) : sum(r.attrs) {
    sum.set("op", std::string("sum"));
    hit = astype(r.inputs[0] == r.outputs[0], r.inputs[0].dtype());
    ties = bind1(r.primitive, {hit}, sum);
  }
  Tensor tangent(const RuleArgs& r, const Tensor& t) const {
    return bind1(r.primitive, {t * hit}, sum) / ties;
  }
  Tensor cotangent(const RuleArgs& r, const Tensor& ct) const {
    return hit * bind1(r.primitive, {ct}, sum) / ties;
  }
};

// ---- all_gather, reduce_scatter ------------------------------------------------------------

// The result of gathering x (contiguous) by attributes `a`: empty, filled by gather_into.
Tensor gathered_like(const Tensor& x, const Attrs& a) {
  std::vector<int64_t> dims = x.shape().dims();
  dims[0] = total(sizes(a));
  return empty(Shape(dims), x.dtype());
}

void gather_into(const Tensor& x, const Attrs& a, Tensor& out) {
  const Sizes& s = sizes(a);
  const int64_t row = elems_from(x.shape(), 1) * static_cast<int64_t>(dtype_size(x.dtype()));
  const Group g(a);
  if (g.size() == 1) {
    std::memcpy(out.raw_data(), x.raw_data(), static_cast<std::size_t>(row * x.shape()[0]));
    return;
  }
  const Arrival arrival{"all_gather", over(a), x.dtype(), dims_with(x.shape(), {0})};
  const auto lock = distributed::arrive(arrival);
  const MPI_Comm comm = g.comm();  // made by every member together, whatever they send
  if (row == 0) return;
  // A member's index in the segments is its index in the group (same order).
  const int me = g.index();
  if (distributed::SharedSegments* shm = distributed::shared_segments(
          comm, static_cast<std::size_t>(*std::max_element(s.begin(), s.end()) * row), arrival)) {
    std::memcpy(shm->segment(me), x.raw_data(),
                static_cast<std::size_t>(s[static_cast<std::size_t>(me)] * row));
    shm->written(arrival);
    for (int p = 0; p < g.size(); ++p)
      std::memcpy(bytes(out) + offset_of(s, p) * row, p == me ? bytes(x) : shm->segment(p),
                  static_cast<std::size_t>(s[static_cast<std::size_t>(p)] * row));
    return;
  }
  std::vector<int> counts, starts;
  for (std::size_t p = 0; p < s.size(); ++p) {
    counts.push_back(to_int("all_gather", s[p], "rows per process"));
    starts.push_back(to_int("all_gather", offset_of(s, static_cast<int>(p)), "row offset"));
  }
  const RowType t("all_gather", row);
  distributed::check(MPI_Allgatherv(x.raw_data(), counts[static_cast<std::size_t>(me)], t.type,
                                    out.raw_data(), counts.data(), starts.data(), t.type, comm),
                     arrival, "MPI_Allgatherv");
}

std::vector<Tensor> all_gather_kernel(ops::Ins in, const Attrs& a) {
  const Tensor x = in[0].contiguous();
  Tensor out = gathered_like(x, a);
  gather_into(x, a, out);
  return {out};
}

// This process's block of the element-wise sum of every member's `src` (all in shared
// segments but its own), added in member order: the same bits on any host and run.
template <class T>
void sum_block(distributed::SharedSegments& shm, const Tensor& src, int me, int64_t begin,
               int64_t n, Tensor& out) {
  T* to = static_cast<T*>(out.raw_data());
  const auto from = [&](int q) {
    return (q == me ? static_cast<const T*>(src.raw_data())
                    : reinterpret_cast<const T*>(shm.segment(q))) +
           begin;
  };
  std::memcpy(to, from(0), static_cast<std::size_t>(n) * sizeof(T));
  for (int q = 1; q < shm.size(); ++q) {
    const T* add = from(q);
    for (int64_t i = 0; i < n; ++i) to[i] += add[i];
  }
}

// This process's rows of the sum over processes of src (float32 or wider: half types are
// summed in float32), into out; `operand` is what the caller was given, for the rendezvous.
void scatter_into(const Tensor& src, const TensorType& operand, const Attrs& a, Tensor& out) {
  const Sizes& s = sizes(a);
  const Group g(a);
  const int me = g.index();
  const int64_t row = elems_from(src.shape(), 1);
  const std::size_t es = dtype_size(src.dtype());
  if (g.size() == 1) {
    std::memcpy(out.raw_data(), src.raw_data(), static_cast<std::size_t>(src.numel()) * es);
    return;
  }
  const Arrival arrival{"psum_scatter", over(a), operand.dtype, operand.shape.dims()};
  const auto lock = distributed::arrive(arrival);
  const MPI_Comm comm = g.comm();  // made by every member together, whatever they send
  const std::size_t all_bytes = static_cast<std::size_t>(src.numel()) * es;
  distributed::SharedSegments* shm = src.dtype() == float32 || src.dtype() == float64
                                         ? distributed::shared_segments(comm, all_bytes, arrival)
                                         : nullptr;
  if (shm) {
    std::memcpy(shm->segment(me), src.raw_data(), all_bytes);
    shm->written(arrival);
    const int64_t begin = offset_of(s, me) * row, n = s[static_cast<std::size_t>(me)] * row;
    if (src.dtype() == float32)
      sum_block<float>(*shm, src, me, begin, n, out);
    else
      sum_block<double>(*shm, src, me, begin, n, out);
  } else if (src.numel() > 0) {
    std::vector<int> counts;
    for (int64_t k : s) counts.push_back(to_int("psum_scatter", k * row, "elements per process"));
    distributed::check(MPI_Reduce_scatter(src.raw_data(), out.raw_data(), counts.data(),
                                          distributed::mpi_type(src.dtype()), MPI_SUM, comm),
                       arrival, "MPI_Reduce_scatter");
  }
}

// The operand to sum (half types widened) and its empty result.
struct Scatter {
  Tensor src, out;
  Scatter(const Tensor& x, const Attrs& a) {
    const detail::TracingPaused concrete;
    src = (is_half(x.dtype()) ? astype(x, float32) : x).contiguous();
    std::vector<int64_t> dims = src.shape().dims();
    dims[0] = sizes(a)[static_cast<std::size_t>(Group(a).index())];
    out = empty(Shape(dims), src.dtype());
  }
};

std::vector<Tensor> reduce_scatter_kernel(ops::Ins in, const Attrs& a) {
  Scatter s(in[0], a);
  scatter_into(s.src, in[0].type(), a, s.out);
  const detail::TracingPaused concrete;
  return {is_half(in[0].dtype()) ? astype(s.out, in[0].dtype()) : s.out};
}

// Collectives started ahead of their use, by their results' addresses: queued on the
// collectives' thread, waited for by their done (docs/DESIGN.md, "Overlapping collectives").
class Started {
 public:
  // Queues fill(), which writes `result`; the queued call holds the tensors it captures, so
  // the executor reuses none of their buffers meanwhile.
  void add(const Tensor& result, std::function<void()> fill) {
    Entry e{distributed::run_ahead(std::move(fill)), result.storage()};
    std::lock_guard lock(mutex_);
    started_[result.raw_data()] = std::move(e);
  }
  // Waits for the collective writing `result`; raises its Error. One not started ahead (with
  // one process, or of a type that runs in place) has nothing to wait for.
  void wait(const Tensor& result) {
    std::shared_future<void> done;
    {
      std::lock_guard lock(mutex_);
      const auto it = started_.find(result.raw_data());
      if (it == started_.end()) return;
      // An entry whose done never ran (its step failed) may name memory used again since.
      const bool same = it->second.storage.lock() == result.storage();
      done = std::move(it->second.done);
      started_.erase(it);
      if (!same) return;
    }
    distributed::await(done);
  }

 private:
  struct Entry {
    std::shared_future<void> done;
    std::weak_ptr<Storage> storage;  // of the result: tells a stale entry from this one
  };
  std::mutex mutex_;
  std::unordered_map<const void*, Entry> started_;
};
Started& started() {
  static Started s;
  return s;
}

// Whether a start queues its collective, rather than running it in place: it spans other
// processes, has data (`whole`: of the same size on every one, so that all decide alike), and
// MPI may be called from the collectives' thread.
bool runs_ahead(const Tensor& whole, const Attrs& a) {
  return Group(a).size() > 1 && whole.numel() > 0 && distributed::collectives_may_run_ahead();
}

std::vector<Tensor> all_gather_start_kernel(ops::Ins in, const Attrs& a) {
  const Tensor x = in[0].contiguous();
  Tensor out = gathered_like(x, a);
  if (runs_ahead(out, a))
    started().add(out, [x, a, out]() mutable { gather_into(x, a, out); });
  else
    gather_into(x, a, out);
  return {out};
}

std::vector<Tensor> reduce_scatter_start_kernel(ops::Ins in, const Attrs& a) {
  // Half types are summed in float32 and narrowed after: in place.
  if (is_half(in[0].dtype()) || !runs_ahead(in[0], a)) return reduce_scatter_kernel(in, a);
  Scatter s(in[0], a);
  started().add(s.out,
                [s, type = in[0].type(), a]() mutable { scatter_into(s.src, type, a, s.out); });
  return {s.out};
}

std::vector<Tensor> done_kernel(ops::Ins in, const Attrs&) {
  started().wait(in[0]);
  return {in[0]};
}

// ---- all_to_all ----------------------------------------------------------------------------

// y [N, L_me, R...] -> z [L_me, N, R...], z[i, j] = y_q[offset_me + i, j - offset_q] for the
// process q owning example j.
std::vector<Tensor> all_to_all_kernel(ops::Ins in, const Attrs& a) {
  const Tensor y = in[0].contiguous();
  const Sizes& s = sizes(a);
  const Group g(a);
  const int me = g.index(), n_proc = static_cast<int>(s.size());
  const int64_t mine = s[static_cast<std::size_t>(me)], n = total(s);
  std::vector<int64_t> dims = y.shape().dims();
  dims[0] = mine, dims[1] = n;
  Tensor z = empty(Shape(dims), y.dtype());
  const int64_t unit = elems_from(y.shape(), 2) * static_cast<int64_t>(dtype_size(y.dtype()));
  // From process q: y_q[offset_me : offset_me + mine] = [mine, L_q, R...], back to back.
  std::vector<int64_t> from(static_cast<std::size_t>(n_proc) + 1, 0);
  for (int q = 0; q < n_proc; ++q)
    from[static_cast<std::size_t>(q) + 1] =
        from[static_cast<std::size_t>(q)] + mine * s[static_cast<std::size_t>(q)];
  Tensor received = y;
  if (n_proc > 1) {
    const Arrival arrival{"all_to_all", over(a), y.dtype(), dims_with(y.shape(), {1})};
    const auto lock = distributed::arrive(arrival);
    const MPI_Comm comm = g.comm();  // made by every member together, whatever they send
    received = empty(Shape({from.back() * unit}), uint8);
    if (unit > 0) {
      std::vector<int> send_counts, send_starts, recv_counts, recv_starts;
      for (int q = 0; q < n_proc; ++q) {
        const int64_t lq = s[static_cast<std::size_t>(q)];
        send_counts.push_back(to_int("all_to_all", lq * mine, "blocks per process"));
        send_starts.push_back(to_int("all_to_all", offset_of(s, q) * mine, "block offset"));
        recv_counts.push_back(to_int("all_to_all", mine * lq, "blocks per process"));
        recv_starts.push_back(
            to_int("all_to_all", from[static_cast<std::size_t>(q)], "block offset"));
      }
      const RowType t("all_to_all", unit);
      distributed::check(
          MPI_Alltoallv(y.raw_data(), send_counts.data(), send_starts.data(), t.type,
                        received.raw_data(), recv_counts.data(), recv_starts.data(), t.type, comm),
          arrival, "MPI_Alltoallv");
    }
  }
  // One process: y itself is [mine, mine, R...] and z = y.
  for (int q = 0; q < n_proc; ++q) {
    const int64_t lq = s[static_cast<std::size_t>(q)], oq = offset_of(s, q);
    for (int64_t i = 0; i < mine; ++i)
      std::memcpy(bytes(z) + (i * n + oq) * unit,
                  bytes(received) + (from[static_cast<std::size_t>(q)] + i * lq) * unit,
                  static_cast<std::size_t>(lq * unit));
  }
  return {z};
}

// ---- permute -------------------------------------------------------------------------------

using Pairs = std::vector<std::pair<int64_t, int64_t>>;

Pairs pairs_of(const Attrs& a) {
  const std::vector<int64_t>& flat = a.get_ints("perm");
  Pairs p;
  for (std::size_t k = 0; k + 1 < flat.size(); k += 2) p.emplace_back(flat[k], flat[k + 1]);
  return p;
}
std::vector<int64_t> flat_pairs(std::span<const std::pair<int64_t, int64_t>> perm) {
  std::vector<int64_t> flat;
  for (const auto& [from, to] : perm) flat.push_back(from), flat.push_back(to);
  return flat;
}

int owner(const Sizes& s, int64_t example) {
  int64_t end = 0;
  for (std::size_t p = 0; p < s.size(); ++p)
    if (example < (end += s[p])) return static_cast<int>(p);
  fail("ppermute", "example index out of range: got ", example, ", expected one below ", end);
}

std::vector<Tensor> permute_kernel(ops::Ins in, const Attrs& a) {
  const Tensor x = in[0].contiguous();
  const Sizes& s = sizes(a);
  const Group g(a);
  const int me = g.index(), n_proc = static_cast<int>(s.size());
  const int64_t base = offset_of(s, me);
  Tensor out = ops::zeros_of(x.type()).contiguous();
  const std::size_t row =
      static_cast<std::size_t>(elems_from(x.shape(), 1)) * dtype_size(x.dtype());
  // Rows to each peer and the rows expected from each, in pair order on both sides.
  std::vector<std::vector<int64_t>> send(static_cast<std::size_t>(n_proc)), recv(send.size());
  for (const auto& [from, to] : pairs_of(a)) {
    const int src = owner(s, from), dst = owner(s, to);
    if (src == me && dst == me)
      std::memcpy(bytes(out) + (to - base) * static_cast<int64_t>(row),
                  bytes(x) + (from - base) * static_cast<int64_t>(row), row);
    else if (src == me)
      send[static_cast<std::size_t>(dst)].push_back(from - base);
    else if (dst == me)
      recv[static_cast<std::size_t>(src)].push_back(to - base);
  }
  if (n_proc == 1) return {out};
  const Arrival arrival{"ppermute", over(a), x.dtype(), dims_with(x.shape(), {0})};
  const auto lock = distributed::arrive(arrival);
  const MPI_Comm comm = g.comm();  // made by every member together, whatever they send
  std::vector<std::vector<std::byte>> outgoing(send.size()), incoming(recv.size());
  std::vector<MPI_Request> requests;
  for (int q = 0; q < n_proc; ++q) {
    const auto k = static_cast<std::size_t>(q);
    if (!recv[k].empty()) {
      incoming[k].resize(recv[k].size() * row);
      requests.emplace_back();
      distributed::check(
          MPI_Irecv(incoming[k].data(),
                    to_int("ppermute", static_cast<int64_t>(incoming[k].size()), "bytes per peer"),
                    MPI_BYTE, q, 0, comm, &requests.back()),
          arrival, "MPI_Irecv");
    }
    if (!send[k].empty()) {
      for (int64_t r : send[k]) {
        const std::byte* p = bytes(x) + r * static_cast<int64_t>(row);
        outgoing[k].insert(outgoing[k].end(), p, p + row);
      }
      requests.emplace_back();
      distributed::check(
          MPI_Isend(outgoing[k].data(),
                    to_int("ppermute", static_cast<int64_t>(outgoing[k].size()), "bytes per peer"),
                    MPI_BYTE, q, 0, comm, &requests.back()),
          arrival, "MPI_Isend");
    }
  }
  distributed::check(
      MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE), arrival,
      "MPI_Waitall");
  for (std::size_t q = 0; q < recv.size(); ++q)
    for (std::size_t i = 0; i < recv[q].size(); ++i)
      std::memcpy(bytes(out) + recv[q][i] * static_cast<int64_t>(row), incoming[q].data() + i * row,
                  row);
  return {out};
}

// Batching outside a pmap: the batch axis sits after the axes the collective moves.
BatchRule batch_at(int axis) {
  return [axis](const BatchArgs& b) -> std::vector<Batched> {
    const Tensor x = moveaxis(ops::batch_first(b.inputs[0], b.dims[0], b.size), 0, axis);
    return {{bind1(b.primitive, {x}, b.attrs), axis}};
  };
}

}  // namespace

const Primitive& prim::process_all_reduce() {
  static const Primitive& p = detail::register_builtin(
      {.name = "process_all_reduce",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             reduce_of(a);
             return std::vector<TensorType>{in[0]};
           },
       .jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> ops::Ts {
         if (reduce_of(r.attrs) == distributed::Reduce::sum) return ops::linear_jvp(r, t);
         return {ExtremeShare(r).tangent(r, *t[0])};
       },
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
         if (reduce_of(r.attrs) == distributed::Reduce::sum)
           return {bind1(r.primitive, {*ct[0]}, r.attrs)};
         return {ExtremeShare(r).cotangent(r, *ct[0])};
       },
       .batch = ops::batch_elementwise,
       .foldable = false},
      {{ops::cpu({DTypeSet::numeric()}), all_reduce_kernel}});
  return p;
}

namespace {

// The rules of process_all_gather, under `name`: the gather itself and its start.
Primitive gather_rules(std::string name) {
  return {.name = name,
          .arity = 1,
          .type_rule =
              [name](ops::Types in, const Attrs& a) {
                expect_rows(name, in[0], 0, local_rows(name, a), "this process's examples");
                std::vector<int64_t> d = in[0].shape.dims();
                d[0] = total(sizes(a));
                return std::vector<TensorType>{{in[0].dtype, Shape(d)}};
              },
          .jvp = ops::linear_jvp,
          .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
            return {bind1(prim::process_reduce_scatter(), {*ct[0]}, r.attrs)};
          },
          .batch = batch_at(1),
          .foldable = false};
}

// The rules of process_reduce_scatter, under `name`: the scatter itself and its start.
Primitive scatter_rules(std::string name) {
  return {.name = name,
          .arity = 1,
          .type_rule =
              [name](ops::Types in, const Attrs& a) {
                const int64_t mine = local_rows(name, a);
                expect_rows(name, in[0], 0, total(sizes(a)), "every process's examples");
                std::vector<int64_t> d = in[0].shape.dims();
                d[0] = mine;
                return std::vector<TensorType>{{in[0].dtype, Shape(d)}};
              },
          .jvp = ops::linear_jvp,
          .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
            return {bind1(prim::process_all_gather(), {*ct[0]}, r.attrs)};
          },
          .batch = batch_at(1),
          .foldable = false};
}

// A collective's done: the identity, once the collective its start queued has finished.
Primitive done_rules(std::string name) {
  return {.name = std::move(name),
          .arity = 1,
          .type_rule = [](ops::Types in, const Attrs&) { return std::vector<TensorType>{in[0]}; },
          .jvp = ops::linear_jvp,
          .vjp = [](const RuleArgs&, std::span<const Tangent> ct) -> ops::Ts { return {*ct[0]}; },
          .batch = ops::batch_elementwise,
          .foldable = false};
}

}  // namespace

const Primitive& prim::process_all_gather() {
  static const Primitive& p = detail::register_builtin(
      gather_rules("process_all_gather"), {{ops::cpu({DTypeSet::all()}), all_gather_kernel}});
  return p;
}

const Primitive& prim::process_reduce_scatter() {
  static const Primitive& p =
      detail::register_builtin(scatter_rules("process_reduce_scatter"),
                               {{ops::cpu({DTypeSet::numeric()}), reduce_scatter_kernel}});
  return p;
}

// process_all_gather and process_reduce_scatter in two steps, made by overlap_collectives for
// what jit compiles: the start's value is the collective's, but only its done may read it
// (docs/DESIGN.md, "Overlapping collectives").
const Primitive& prim::process_all_gather_start() {
  static const Primitive& p =
      detail::register_builtin(gather_rules("process_all_gather_start"),
                               {{ops::cpu({DTypeSet::all()}), all_gather_start_kernel}});
  return p;
}

const Primitive& prim::process_reduce_scatter_start() {
  static const Primitive& p =
      detail::register_builtin(scatter_rules("process_reduce_scatter_start"),
                               {{ops::cpu({DTypeSet::numeric()}), reduce_scatter_start_kernel}});
  return p;
}

const Primitive& prim::process_all_gather_done() {
  static const Primitive& p = detail::register_builtin(
      done_rules("process_all_gather_done"), {{ops::cpu({DTypeSet::all()}), done_kernel}});
  return p;
}

const Primitive& prim::process_reduce_scatter_done() {
  static const Primitive& p = detail::register_builtin(
      done_rules("process_reduce_scatter_done"), {{ops::cpu({DTypeSet::all()}), done_kernel}});
  return p;
}

const Primitive& prim::process_all_to_all() {
  static const Primitive& p = detail::register_builtin(
      {.name = "process_all_to_all",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             const int64_t mine = local_rows("process_all_to_all", a), n = total(sizes(a));
             expect_rows("process_all_to_all", in[0], 0, n, "every process's examples");
             expect_rows("process_all_to_all", in[0], 1, mine, "this process's examples");
             std::vector<int64_t> d = in[0].shape.dims();
             d[0] = mine, d[1] = n;
             return std::vector<TensorType>{{in[0].dtype, Shape(d)}};
           },
       .jvp = ops::linear_jvp,
       // Its transpose is itself between two swaps of the leading axes.
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
         return {swapaxes(bind1(r.primitive, {swapaxes(*ct[0], 0, 1)}, r.attrs), 0, 1)};
       },
       .batch = batch_at(2),
       .foldable = false},
      {{ops::cpu({DTypeSet::all()}), all_to_all_kernel}});
  return p;
}

const Primitive& prim::process_permute() {
  static const Primitive& p = detail::register_builtin(
      {.name = "process_permute",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             expect_rows("process_permute", in[0], 0, local_rows("process_permute", a),
                         "this process's examples");
             const int64_t n = total(sizes(a));
             for (const auto& [from, to] : pairs_of(a))
               if (from < 0 || from >= n || to < 0 || to >= n)
                 fail("process_permute", "example index out of range: got (", from, ", ", to,
                      "), expected indices in [0, ", n, ")");
             return std::vector<TensorType>{in[0]};
           },
       .jvp = ops::linear_jvp,
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
         Pairs inverse;
         for (const auto& [from, to] : pairs_of(r.attrs)) inverse.emplace_back(to, from);
         Attrs a = r.attrs;
         a.set("perm", flat_pairs(inverse));
         return {bind1(r.primitive, {*ct[0]}, a)};
       },
       .batch = batch_at(1),
       .foldable = false},
      {{ops::cpu({DTypeSet::all()}), permute_kernel}});
  return p;
}

// The identity, for shard_map's replicas: only its transpose communicates.
std::vector<Tensor> identity_kernel(ops::Ins in, const Attrs&) { return {in[0]}; }

const Primitive& prim::process_broadcast() {
  static const Primitive& p = detail::register_builtin(
      {.name = "process_broadcast",
       .arity = 1,
       .type_rule = [](ops::Types in, const Attrs&) { return std::vector<TensorType>{in[0]}; },
       .jvp = ops::linear_jvp,
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
         Attrs sum = r.attrs;
         sum.set("op", std::string("sum"));
         return {bind1(prim::process_all_reduce(), {*ct[0]}, sum)};
       },
       .batch = ops::batch_elementwise,
       .foldable = false},
      {{ops::cpu({DTypeSet::all()}), identity_kernel}});
  return p;
}

const Primitive& prim::process_replicated() {
  static const Primitive& p = detail::register_builtin(
      {.name = "process_replicated",
       .arity = 1,
       .type_rule = [](ops::Types in, const Attrs&) { return std::vector<TensorType>{in[0]}; },
       .jvp = ops::linear_jvp,
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
         return {*ct[0] / scalar_like(*ct[0], static_cast<double>(total(sizes(r.attrs))))};
       },
       .batch = ops::batch_elementwise,
       .foldable = false},
      {{ops::cpu({DTypeSet::all()}), identity_kernel}});
  return p;
}

namespace distributed {

Tensor broadcast_over(const Tensor& x, const detail::ProcessSpan& span, const std::string& axis) {
  return bind1(prim::process_broadcast(), {x}, with_sizes(axis, span), Loc{});
}
Tensor replicated_over(const Tensor& x, const detail::ProcessSpan& span, const std::string& axis) {
  return bind1(prim::process_replicated(), {x}, with_sizes(axis, span), Loc{});
}

// Loc{}: the equations stand for the user's collective, not for a line of this file.
Tensor all_reduce(const Tensor& x, Reduce op, const detail::ProcessSpan& span,
                  const std::string& axis) {
  return bind1(prim::process_all_reduce(), {x}, reduce_attrs(op, span, axis), Loc{});
}
Tensor all_gather(const Tensor& local, const detail::ProcessSpan& span, const std::string& axis) {
  return bind1(prim::process_all_gather(), {local}, with_sizes(axis, span), Loc{});
}
Tensor reduce_scatter(const Tensor& x, const detail::ProcessSpan& span, const std::string& axis) {
  return bind1(prim::process_reduce_scatter(), {x}, with_sizes(axis, span), Loc{});
}
Tensor all_to_all(const Tensor& y, const detail::ProcessSpan& span, const std::string& axis) {
  return bind1(prim::process_all_to_all(), {y}, with_sizes(axis, span), Loc{});
}
Tensor permute(const Tensor& local, std::span<const std::pair<int64_t, int64_t>> perm,
               const detail::ProcessSpan& span, const std::string& axis) {
  Attrs a = with_sizes(axis, span);
  a.set("perm", flat_pairs(perm));
  return bind1(prim::process_permute(), {local}, a, Loc{});
}

}  // namespace distributed
}  // namespace kiln
