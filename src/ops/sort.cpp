// Sorting, scans and selection: the primitives sort (values and the stable permutation),
// cumsum, cumprod, cummax, cummin (values and the running arg-extreme), cumlogsumexp and
// searchsorted; and the ops composed from them: argsort, top_k, median, quantile, std.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <memory>
#include <numbers>
#include <utility>

#include "detail/dtype_dispatch.h"
#include "detail/parallel.h"
#include "kiln/indexing.h"
#include "kiln/ops.h"
#include "ops/axis_lines.h"
#include "ops/primitives.h"
#include "ops/rules.h"

namespace kiln {
namespace {

// A long single line is split across threads; many lines run one per thread.
bool may_split(int64_t n) {
  return n >= 2 * detail::kParallelGrain && detail::thread_count() > 1 && !omp_in_parallel() &&
         !detail::serial_thread;
}

// ---- sort ---------------------------------------------------------------------------------

// An unsigned key whose order is numpy's sort order of the values: NaN last (every NaN alike),
// -0 equal to +0 (so a stable sort keeps them in input order), integers by value.
template <typename T>
using key_t = std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>;
template <typename T>
key_t<T> sort_key(T v) {
  using K = key_t<T>;
  using C = detail::compute_t<T>;
  if constexpr (std::is_floating_point_v<C>) {
    using F = std::conditional_t<sizeof(T) == 8, double, float>;
    const F f = static_cast<F>(static_cast<C>(v));
    if (f != f) return std::numeric_limits<K>::max();
    const K bits = f == 0 ? K{0} : std::bit_cast<K>(f);
    constexpr K sign = K{1} << (8 * sizeof(K) - 1);
    return (bits & sign) ? ~bits : bits | sign;
  } else if constexpr (std::is_signed_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<K>(static_cast<U>(static_cast<U>(v) ^ (U{1} << (8 * sizeof(T) - 1))));
  } else {
    return static_cast<K>(v);
  }
}

template <typename K, typename I>
struct Item {
  K key;
  I index;
};

// How many keys have each value of each byte.
template <typename K>
using ByteCounts = std::array<std::array<int64_t, 256>, sizeof(K)>;

// Stable LSD radix sort of items by key, one byte per pass. A byte every key shares (one
// count is n) is skipped. On one thread each pass takes its offsets from `counts`; over
// several, each thread counts its contiguous part again and scatters it to its own offsets.
// Returns the buffer (a or tmp) that holds the result.
template <typename K, typename I>
Item<K, I>* radix_sort(Item<K, I>* a, Item<K, I>* tmp, int64_t n, const ByteCounts<K>& counts,
                       int threads) {
  std::vector<int64_t> offset(static_cast<std::size_t>(threads) * 256);
  for (int byte = 0; byte < static_cast<int>(sizeof(K)); ++byte) {
    const auto& h = counts[static_cast<std::size_t>(byte)];
    if (std::find(h.begin(), h.end(), n) != h.end()) continue;
    const int shift = 8 * byte;
    if (threads == 1) {
      int64_t at = 0;
      for (std::size_t v = 0; v < 256; ++v) offset[v] = std::exchange(at, at + h[v]);
      for (int64_t i = 0; i < n; ++i) tmp[offset[(a[i].key >> shift) & 0xff]++] = a[i];
    } else {
      std::fill(offset.begin(), offset.end(), 0);
#pragma omp parallel num_threads(threads)
      {
        detail::apply_flush_denormal();
        // The runtime may give fewer threads than asked for: the team divides the work.
        const int team = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t b = n * t / team, e = n * (t + 1) / team;
        int64_t* c = offset.data() + static_cast<std::ptrdiff_t>(t) * 256;
        for (int64_t i = b; i < e; ++i) ++c[(a[i].key >> shift) & 0xff];
#pragma omp barrier
#pragma omp single
        {
          int64_t at = 0;
          for (std::size_t v = 0; v < 256; ++v)
            for (std::size_t u = 0; u < static_cast<std::size_t>(team); ++u) {
              int64_t& slot = offset[u * 256 + v];
              slot = std::exchange(at, at + slot);
            }
        }
        for (int64_t i = b; i < e; ++i) tmp[c[(a[i].key >> shift) & 0xff]++] = a[i];
      }
    }
    std::swap(a, tmp);
  }
  return a;
}

// Sorts every line of x into values and indices (int64). Items index elements with I.
template <typename T, typename I>
void sort_kernel(const Tensor& x, const ops::AxisLines& L, bool descending, const Tensor& values,
                 const Tensor& indices) {
  using K = key_t<T>;
  using It = Item<K, I>;
  const T* px = x.data<const T>();
  T* pv = values.data<T>();
  int64_t* pi = indices.data<int64_t>();
  const int64_t n = L.n, inner = L.inner;
  auto sort_line = [&](int64_t line, It* buf, It* tmp, int threads) {
    const int64_t off = L.base(line);
    const T* src = px + off;
    auto key_of = [&](int64_t j) {
      const K k = sort_key(src[j * inner]);
      return descending ? static_cast<K>(~k) : k;
    };
    const It* sorted = buf;
    if (n < 256) {
      for (int64_t j = 0; j < n; ++j) buf[j] = It{key_of(j), static_cast<I>(j)};
      std::stable_sort(buf, buf + n, [](const It& p, const It& q) { return p.key < q.key; });
    } else {
      // Inside the loop over lines this parallel_for runs serially.
      ByteCounts<K> counts{};
      detail::parallel_for(n, [&](int64_t b, int64_t e) {
        ByteCounts<K> local{};
        for (int64_t j = b; j < e; ++j) {
          const K k = key_of(j);
          buf[j] = It{k, static_cast<I>(j)};
          for (std::size_t byte = 0; byte < sizeof(K); ++byte)
            ++local[byte][(k >> (8 * byte)) & 0xff];
        }
#pragma omp critical(kiln_sort_counts)
        for (std::size_t byte = 0; byte < sizeof(K); ++byte)
          for (std::size_t v = 0; v < 256; ++v) counts[byte][v] += local[byte][v];
      });
      sorted = radix_sort(buf, tmp, n, counts, threads);
    }
    // Values are read back from x, so -0 and NaN payloads survive the sort.
    detail::parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j) {
        const auto src_j = static_cast<int64_t>(sorted[j].index);
        pv[off + j * inner] = src[src_j * inner];
        pi[off + j * inner] = src_j;
      }
    });
  };
  if (L.count() == 1 && may_split(n)) {
    std::unique_ptr<It[]> buf(new It[static_cast<std::size_t>(n)]),
        tmp(new It[static_cast<std::size_t>(n)]);
    sort_line(0, buf.get(), tmp.get(), detail::thread_count());
    return;
  }
  detail::parallel_for(
      L.count(),
      [&](int64_t b, int64_t e) {
        std::unique_ptr<It[]> buf(new It[static_cast<std::size_t>(n)]),
            tmp(new It[static_cast<std::size_t>(n)]);
        for (int64_t line = b; line < e; ++line) sort_line(line, buf.get(), tmp.get(), 1);
      },
      n * 8);
}

const DTypeSet kSortable = DTypeSet::numeric() | bool_;

// The derivative of a gather through an index output (sort's permutation, cummax's running
// argmax): the tangent gathered, the cotangent scattered back.
ops::Ts gather_jvp(const RuleArgs& r, std::span<const Tangent> t) {
  return {bind1(prim::gather_along(), {*t[0], r.outputs[1]}, {{"axis", r.attrs.get_int("axis")}}),
          std::nullopt};
}
ops::Ts gather_vjp(const RuleArgs& r, std::span<const Tangent> ct) {
  return {bind1(prim::scatter_add_along(),
                {ops::zeros_of(r.inputs[0].type()), r.outputs[1], *ct[0]},
                {{"axis", r.attrs.get_int("axis")}})};
}
BatchRule batch_axis() {
  return ops::batch_leading(
      [](const Attrs& a, const Tensor&) { return ops::shift_int(a, "axis"); });
}

}  // namespace

// sort{axis, descending}(x) -> (values, indices): a stable sort along one axis, NaN last
// (first when descending), ties in input order either way.
const Primitive& prim::sort() {
  static const Primitive& p = detail::register_builtin(
      Primitive{.name = "sort",
                .arity = 1,
                .type_rule =
                    [](ops::Types in, const Attrs& a) {
                      ops::expect_dtype("sort", in[0], kSortable, "a numeric or bool dtype");
                      normalize_axis("sort", a.get_int("axis"), in[0].shape.rank());
                      a.get_bool("descending");
                      return std::vector<TensorType>{in[0], {int64, in[0].shape}};
                    },
                .jvp = gather_jvp,
                .vjp = gather_vjp,
                .batch = batch_axis()},
      {{ops::cpu({kSortable}), [](ops::Ins in, const Attrs& a) {
          const Tensor x = in[0].contiguous();
          const ops::AxisLines L =
              ops::axis_lines(x.shape(), normalize_axis("sort", a.get_int("axis"), x.rank()));
          Tensor values = empty(x.type()), indices = empty(x.shape(), int64);
          detail::visit_dtype(x.dtype(), [&]<typename T>() {
            if (L.n <= std::numeric_limits<uint32_t>::max())
              sort_kernel<T, uint32_t>(x, L, a.get_bool("descending"), values, indices);
            else
              sort_kernel<T, uint64_t>(x, L, a.get_bool("descending"), values, indices);
          });
          return std::vector<Tensor>{values, indices};
        }}});
  return p;
}

namespace {

// ---- cumulative scans -----------------------------------------------------------------------

// Each scan is an associative combine over a state S: lift(x_j, j) makes one element's state,
// value(s) the output. A line is cut into chunks of kScanChunk elements; chunk c starts from
// the combined totals of the chunks before it, each total reduced in four lanes. That result
// is the same whether the chunks of a long line run on one thread or several, and whether a
// line is alone or in a batch. Only a scan that computes much per element (kSplit:
// cumlogsumexp's exp and log1p) splits one long line across threads; the others stream
// memory at one pass, where a second thread measured slower (bench_sort, docs/PERFORMANCE.md).
constexpr int64_t kScanChunk = int64_t{1} << 14;

// Sums and products of floats accumulate in double, of integers in 64 bits (wrapping), as the
// reductions do.
template <typename T>
using acc_t = std::conditional_t<std::is_floating_point_v<detail::compute_t<T>>, double, uint64_t>;
template <typename T>
acc_t<T> to_acc(T v) {
  if constexpr (std::is_same_v<acc_t<T>, uint64_t>)
    return static_cast<uint64_t>(static_cast<int64_t>(v));
  else
    return static_cast<double>(static_cast<detail::compute_t<T>>(v));
}
template <typename T, typename A>
T from_acc(A v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return T(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

template <typename T>
struct SumScan {
  static constexpr bool kBlocked = true, kSplit = false;
  using S = acc_t<T>;
  static S identity() { return S{0}; }
  static S lift(T v, int64_t) { return to_acc(v); }
  static S combine(S a, S b) { return a + b; }
  static T value(S s) { return from_acc<T>(s); }
};
template <typename T>
struct ProdScan {
  static constexpr bool kBlocked = true, kSplit = false;
  using S = acc_t<T>;
  static S identity() { return S{1}; }
  static S lift(T v, int64_t) { return to_acc(v); }
  static S combine(S a, S b) { return a * b; }
  static T value(S s) { return from_acc<T>(s); }
};
// log(exp(a) + exp(b)) without overflow; -inf is the identity, inf + inf stays inf.
template <typename T>
struct LogSumExpScan {
  static constexpr bool kBlocked = false, kSplit = true;
  using S = double;
  static S identity() { return -std::numeric_limits<double>::infinity(); }
  static S lift(T v, int64_t) { return static_cast<double>(static_cast<detail::compute_t<T>>(v)); }
  static S combine(S a, S b) {
    if (a == b) return a + std::numbers::ln2;
    const double m = std::max(a, b);
    if (m == -std::numeric_limits<double>::infinity() || a != a || b != b) return a + b;
    return m + std::log1p(std::exp(-std::abs(a - b)));
  }
  static T value(S s) { return from_acc<T>(s); }
};
// The running extreme and where it is: NaN wins, and among equal values (NaNs, ±0) the
// earliest index, like numpy's maximum.accumulate; the rule does not depend on the order of
// combining, so lanes and chunks may combine in any grouping.
template <typename T, bool IsMax>
struct ExtremeScan {
  static constexpr bool kBlocked = false, kSplit = false;
  using C = detail::compute_t<T>;
  struct S {
    C v;
    int64_t i;  // -1: no element yet
  };
  static S identity() { return {C{}, -1}; }
  static S lift(T v, int64_t j) { return {static_cast<C>(v), j}; }
  static S combine(S a, S b) {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    const bool an = a.v != a.v, bn = b.v != b.v;  // NOLINT: NaN test that works for integers
    if (an != bn) return an ? a : b;
    if (an) return a.i < b.i ? a : b;
    // Equal values: numpy's maximum/minimum return the later one (so -0 and +0 come out as
    // numpy.maximum.accumulate gives them); the index stays the earliest's.
    if (a.v == b.v) return a.i < b.i ? S{b.v, a.i} : S{a.v, b.i};
    return (IsMax ? b.v > a.v : b.v < a.v) ? b : a;
  }
  static T value(S s) { return static_cast<T>(s.v); }
};
template <typename Op>
concept Indexed = requires(typename Op::S s) {
  s.i;
};

template <typename Op, typename T>
void scan_kernel(const Tensor& x, const ops::AxisLines& L, const Tensor& y, const Tensor* index) {
  using S = typename Op::S;
  const T* px = x.data<const T>();
  T* py = y.data<T>();
  int64_t* pi = index ? index->data<int64_t>() : nullptr;
  const int64_t n = L.n, inner = L.inner;
  const int64_t chunks = (n + kScanChunk - 1) / kScanChunk;
  auto total = [&](const T* src, int64_t c) {
    const int64_t b = c * kScanChunk, e = std::min(n, b + kScanChunk);
    S lane[4] = {Op::identity(), Op::identity(), Op::identity(), Op::identity()};
    int64_t j = b;
    for (; j + 4 <= e; j += 4)
      for (int k = 0; k < 4; ++k)
        lane[k] = Op::combine(lane[k], Op::lift(src[(j + k) * inner], j + k));
    for (; j < e; ++j) lane[0] = Op::combine(lane[0], Op::lift(src[j * inner], j));
    return Op::combine(Op::combine(lane[0], lane[1]), Op::combine(lane[2], lane[3]));
  };
  auto scan = [&](int64_t off, int64_t c, S s) {
    const int64_t b = c * kScanChunk, e = std::min(n, b + kScanChunk);
    int64_t j = b;
    if constexpr (Op::kBlocked) {
      // Four elements at a time: their running combine does not wait for s, so the chain
      // through s is one combine per four elements instead of one per element.
      for (; j + 4 <= e; j += 4) {
        S p[4];
        p[0] = Op::lift(px[off + j * inner], j);
        for (int k = 1; k < 4; ++k)
          p[k] = Op::combine(p[k - 1], Op::lift(px[off + (j + k) * inner], j + k));
        for (int k = 0; k < 4; ++k) py[off + (j + k) * inner] = Op::value(Op::combine(s, p[k]));
        s = Op::combine(s, p[3]);
      }
    }
    for (; j < e; ++j) {
      const int64_t at = off + j * inner;
      s = Op::combine(s, Op::lift(px[at], j));
      py[at] = Op::value(s);
      if constexpr (Indexed<Op>) pi[at] = s.i;
    }
  };
  if (Op::kSplit && L.count() == 1 && chunks > 1 && may_split(n)) {
    // One parallel region: each thread totals its run of chunks, one thread turns the totals
    // into each chunk's start, each thread scans its run.
    std::vector<S> start(static_cast<std::size_t>(chunks));
    const int threads = static_cast<int>(std::min<int64_t>(detail::thread_count(), chunks));
#pragma omp parallel num_threads(threads)
    {
      detail::apply_flush_denormal();
      // The runtime may give fewer threads than asked for: the team divides the chunks.
      const int64_t team = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t cb = chunks * t / team, ce = chunks * (t + 1) / team;
      for (int64_t c = cb; c < ce; ++c) start[static_cast<std::size_t>(c)] = total(px, c);
#pragma omp barrier
#pragma omp single
      {
        S acc = Op::identity();
        for (S& st : start) st = std::exchange(acc, Op::combine(acc, st));
      }
      for (int64_t c = cb; c < ce; ++c) scan(0, c, start[static_cast<std::size_t>(c)]);
    }
    return;
  }
  detail::parallel_for(
      L.count(),
      [&](int64_t b, int64_t e) {
        for (int64_t line = b; line < e; ++line) {
          const int64_t off = L.base(line);
          S acc = Op::identity();
          for (int64_t c = 0; c < chunks; ++c) {
            scan(off, c, acc);
            if (c + 1 < chunks) acc = Op::combine(acc, total(px + off, c));
          }
        }
      },
      n);
}

// Shifts t by d along axis (toward higher indices, or lower when `back`), filling with `fill`.
Tensor shifted(const Tensor& t, int axis, int64_t d, double fill, bool back = false) {
  const int64_t n = t.shape()[axis];
  d = std::min(d, n);
  std::vector<Slice> sl(static_cast<std::size_t>(axis + 1));
  sl.back() = back ? Slice{d, n, 1} : Slice{0, n - d, 1};
  std::vector<std::pair<int64_t, int64_t>> w(static_cast<std::size_t>(t.rank()), {0, 0});
  w[static_cast<std::size_t>(axis)] =
      back ? std::pair<int64_t, int64_t>{0, d} : std::pair<int64_t, int64_t>{d, 0};
  return pad(slice(t, sl), w, fill);
}

// h_i = a_i h_{i-1} + b_i along axis (h_{-1} = 0), as a log-depth scan of primitives
// (Hillis-Steele): exact where a has zeros, and differentiable again.
Tensor linear_recurrence(Tensor a, Tensor b, int axis) {
  const int64_t n = a.shape()[axis];
  for (int64_t d = 1; d < n; d *= 2) {
    b = b + a * shifted(b, axis, d, 0.0);
    if (2 * d < n) a = a * shifted(a, axis, d, 1.0);
  }
  return b;
}
// Its transpose in b: g_j = ct_j + a_{j+1} g_{j+1}, the same recurrence run from the end.
Tensor linear_recurrence_transposed(const Tensor& a, const Tensor& ct, int axis) {
  const Axes ax{axis};
  return flip(linear_recurrence(flip(shifted(a, axis, 1, 0.0, true), ax), flip(ct, ax), axis), ax);
}

int axis_attr(const RuleArgs& r) {
  return normalize_axis(r.primitive.name, r.attrs.get_int("axis"), r.inputs[0].rank());
}

// Derivatives of the scans whose tangent map is a linear recurrence dy = L_a(t * w):
// cumprod (a = x, w = the exclusive cumprod) and cumlogsumexp (a = exp(y_{i-1} - y_i),
// w = exp(x - y)). The VJP is w * L_a^T(ct).
struct Recurrence {
  Tensor a, w;
};
Recurrence cumprod_recurrence(const RuleArgs& r) {
  return {r.inputs[0], shifted(r.outputs[0], axis_attr(r), 1, 1.0)};
}
// Where y is -inf every element so far is -inf: those positions get weight 0, not NaN.
Recurrence cumlogsumexp_recurrence(const RuleArgs& r) {
  const Tensor &x = r.inputs[0], &y = r.outputs[0];
  const Tensor zero = scalar_like(y, 0.0);
  const Tensor dead = y == -INFINITY;
  const Tensor prev = shifted(y, axis_attr(r), 1, -INFINITY);
  return {where(dead, zero, exp(where(dead, zero, prev - y))),
          where(dead, zero, exp(where(dead, zero, x - y)))};
}
template <Recurrence (*Of)(const RuleArgs&)>
ops::Ts recurrence_jvp(const RuleArgs& r, std::span<const Tangent> t) {
  const Recurrence k = Of(r);
  return {linear_recurrence(k.a, *t[0] * k.w, axis_attr(r))};
}
template <Recurrence (*Of)(const RuleArgs&)>
ops::Ts recurrence_vjp(const RuleArgs& r, std::span<const Tangent> ct) {
  const Recurrence k = Of(r);
  return {k.w * linear_recurrence_transposed(k.a, *ct[0], axis_attr(r))};
}

template <template <typename> class Op>
const Primitive& define_scan(std::string name, DTypeSet domain, std::string_view desc, JvpRule jvp,
                             VjpRule vjp, Loc loc) {
  TypeRule rule = [name, domain, desc](ops::Types in, const Attrs& a) {
    ops::expect_dtype(name, in[0], domain, desc);
    normalize_axis(name, a.get_int("axis"), in[0].shape.rank());
    return std::vector<TensorType>{in[0]};
  };
  Kernel kernel = [name](ops::Ins in, const Attrs& a) {
    const Tensor x = in[0].contiguous();
    const ops::AxisLines L =
        ops::axis_lines(x.shape(), normalize_axis(name, a.get_int("axis"), x.rank()));
    Tensor y = empty(x.type());
    detail::visit_dtype(x.dtype(), [&]<typename T>() {
      if constexpr (!std::is_same_v<T, bool>) scan_kernel<Op<T>, T>(x, L, y, nullptr);
    });
    return std::vector<Tensor>{y};
  };
  return detail::register_builtin({.name = std::move(name),
                                   .arity = 1,
                                   .type_rule = std::move(rule),
                                   .jvp = std::move(jvp),
                                   .vjp = std::move(vjp),
                                   .batch = batch_axis()},
                                  {{ops::cpu({domain}), std::move(kernel)}}, loc);
}

// cummax/cummin{axis}(x) -> (values, indices of the running extreme).
template <bool IsMax>
const Primitive& define_extreme_scan(std::string name, Loc loc) {
  TypeRule rule = [name](ops::Types in, const Attrs& a) {
    ops::expect_dtype(name, in[0], DTypeSet::numeric(), "a numeric dtype");
    normalize_axis(name, a.get_int("axis"), in[0].shape.rank());
    return std::vector<TensorType>{in[0], {int64, in[0].shape}};
  };
  Kernel kernel = [name](ops::Ins in, const Attrs& a) {
    const Tensor x = in[0].contiguous();
    const ops::AxisLines L =
        ops::axis_lines(x.shape(), normalize_axis(name, a.get_int("axis"), x.rank()));
    Tensor y = empty(x.type()), index = empty(x.shape(), int64);
    detail::visit_dtype(x.dtype(), [&]<typename T>() {
      if constexpr (!std::is_same_v<T, bool>)
        scan_kernel<ExtremeScan<T, IsMax>, T>(x, L, y, &index);
    });
    return std::vector<Tensor>{y, index};
  };
  return detail::register_builtin({.name = std::move(name),
                                   .arity = 1,
                                   .type_rule = std::move(rule),
                                   .jvp = gather_jvp,
                                   .vjp = gather_vjp,
                                   .batch = batch_axis()},
                                  {{ops::cpu({DTypeSet::numeric()}), std::move(kernel)}}, loc);
}

}  // namespace

// cumsum is linear: its transpose is the cumulative sum from the end.
const Primitive& prim::cumsum() {
  static const Primitive& p = define_scan<SumScan>(
      "cumsum", DTypeSet::numeric(), "a numeric dtype", ops::linear_jvp,
      [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
        const Axes ax{axis_attr(r)};
        return {flip(bind1(prim::cumsum(), {flip(*ct[0], ax)}, r.attrs), ax)};
      },
      Loc::current());
  return p;
}
const Primitive& prim::cumprod() {
  static const Primitive& p = define_scan<ProdScan>(
      "cumprod", DTypeSet::numeric(), "a numeric dtype", recurrence_jvp<cumprod_recurrence>,
      recurrence_vjp<cumprod_recurrence>, Loc::current());
  return p;
}
const Primitive& prim::cumlogsumexp() {
  static const Primitive& p =
      define_scan<LogSumExpScan>("cumlogsumexp", DTypeSet::floating(), "a floating dtype",
                                 recurrence_jvp<cumlogsumexp_recurrence>,
                                 recurrence_vjp<cumlogsumexp_recurrence>, Loc::current());
  return p;
}
const Primitive& prim::cummax() {
  static const Primitive& p = define_extreme_scan<true>("cummax", Loc::current());
  return p;
}
const Primitive& prim::cummin() {
  static const Primitive& p = define_extreme_scan<false>("cummin", Loc::current());
  return p;
}

// searchsorted{right}(sorted, values): for each value, the index in the 1-d `sorted` before
// which it goes to keep the order (numpy's order: NaN last); `right` puts it after equal
// elements instead of before.
const Primitive& prim::searchsorted() {
  static const Primitive& p = detail::register_builtin(
      Primitive{.name = "searchsorted",
                .arity = 2,
                .type_rule =
                    [](ops::Types in, const Attrs& a) {
                      a.get_bool("right");
                      ops::expect_dtype("searchsorted", in[0], DTypeSet::numeric(),
                                        "a numeric dtype");
                      if (in[0].shape.rank() != 1 || in[1].dtype != in[0].dtype)
                        fail("searchsorted", "bad operands: got ", ops::types_str(in),
                             ", expected a 1-d sorted sequence and values of its dtype");
                      return std::vector<TensorType>{{int64, in[1].shape}};
                    },
                .differentiable = false,
                .batch = [](const BatchArgs& b) -> std::vector<Batched> {
                  // Each example's own sequence: one search per example; shared sequence:
                  // the values' batch axis passes through.
                  if (b.dims[0]) return ops::batch_by_loop(b);
                  return {{bind1(b.primitive, {b.inputs[0], b.inputs[1]}, b.attrs), b.dims[1]}};
                }},
      {{ops::cpu({DTypeSet::numeric(), DTypeSet::numeric()}), [](ops::Ins in, const Attrs& a) {
          const Tensor s = in[0].contiguous(), v = in[1].contiguous();
          Tensor out = empty(v.shape(), int64);
          const bool right = a.get_bool("right");
          detail::visit_dtype(s.dtype(), [&]<typename T>() {
            if constexpr (!std::is_same_v<T, bool>) {
              std::vector<key_t<T>> keys(static_cast<std::size_t>(s.numel()));
              const T* ps = s.data<const T>();
              for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = sort_key(ps[i]);
              const T* pv = v.data<const T>();
              int64_t* po = out.data<int64_t>();
              detail::parallel_for(
                  v.numel(),
                  [&](int64_t b, int64_t e) {
                    for (int64_t i = b; i < e; ++i) {
                      const key_t<T> k = sort_key(pv[i]);
                      const auto it = right ? std::upper_bound(keys.begin(), keys.end(), k)
                                            : std::lower_bound(keys.begin(), keys.end(), k);
                      po[i] = it - keys.begin();
                    }
                  },
                  32);
            }
          });
          return std::vector<Tensor>{out};
        }}});
  return p;
}

namespace {

int sort_axis(std::string_view op, const Tensor& x, int64_t axis) {
  return normalize_axis(op, axis, x.rank());
}
// x flattened when no axis is given (numpy's axis=None), with the axis to work along.
std::pair<Tensor, int> along(std::string_view op, const Tensor& x, std::optional<int64_t> axis,
                             Loc loc) {
  if (!axis) return {reshape(x, Shape{x.numel()}, loc), 0};
  return {x, normalize_axis(op, *axis, x.rank())};
}

}  // namespace

SortResult sort_with_indices(const Tensor& x, int64_t axis, bool descending, Loc loc) {
  const detail::CallSite site(loc);
  std::vector<Tensor> r =
      bind(prim::sort(), {x},
           {{"axis", int64_t{sort_axis("sort", x, axis)}}, {"descending", descending}}, loc);
  return {r[0], r[1]};
}
Tensor sort(const Tensor& x, int64_t axis, bool descending, Loc loc) {
  const detail::CallSite site(loc);
  return sort_with_indices(x, axis, descending, loc).values;
}
Tensor argsort(const Tensor& x, int64_t axis, bool descending, Loc loc) {
  const detail::CallSite site(loc);
  return sort_with_indices(x, axis, descending, loc).indices;
}

SortResult top_k(const Tensor& x, int64_t k, Loc loc) {
  const detail::CallSite site(loc);
  if (x.rank() == 0) fail("top_k", "0-d input: got ", x.type(), ", expected at least one axis");
  const int64_t n = x.shape()[x.rank() - 1];
  if (k < 0 || k > n)
    fail("top_k", "k out of range: got k = ", k, " for ", x.type(), ", expected 0 <= k <= ", n,
         " (the size of the last axis)");
  const SortResult s = sort_with_indices(x, -1, true, loc);
  std::vector<Slice> sl(static_cast<std::size_t>(x.rank()));
  sl.back() = Slice{0, k, 1};
  return {slice(s.values, sl, loc), slice(s.indices, sl, loc)};
}

Tensor searchsorted(const Tensor& sorted, const Tensor& values, Side side, Loc loc) {
  const detail::CallSite site(loc);
  const DType common = promote_types(sorted.dtype(), values.dtype());
  return bind1(prim::searchsorted(),
               {ops::cast_if_needed(sorted, common, loc), ops::cast_if_needed(values, common, loc)},
               {{"right", side == Side::right}}, loc);
}

namespace {

Tensor scan(const Primitive& p, const Tensor& x, std::optional<int64_t> axis, Loc loc) {
  const detail::CallSite site(loc);
  const auto [v, a] = along(p.name, x, axis, loc);
  return bind1(p, {v}, {{"axis", int64_t{a}}}, loc);
}
// Sums and products of bool count in int64, like numpy.
Tensor numeric(const Tensor& x, Loc loc) { return x.dtype() == bool_ ? astype(x, int64, loc) : x; }

}  // namespace

Tensor cumsum(const Tensor& x, std::optional<int64_t> axis, Loc loc) {
  return scan(prim::cumsum(), numeric(x, loc), axis, loc);
}
Tensor cumprod(const Tensor& x, std::optional<int64_t> axis, Loc loc) {
  return scan(prim::cumprod(), numeric(x, loc), axis, loc);
}
Tensor cummax(const Tensor& x, std::optional<int64_t> axis, Loc loc) {
  const detail::CallSite site(loc);
  const auto [v, a] = along("cummax", numeric(x, loc), axis, loc);
  return bind(prim::cummax(), {v}, {{"axis", int64_t{a}}}, loc)[0];
}
Tensor cummin(const Tensor& x, std::optional<int64_t> axis, Loc loc) {
  const detail::CallSite site(loc);
  const auto [v, a] = along("cummin", numeric(x, loc), axis, loc);
  return bind(prim::cummin(), {v}, {{"axis", int64_t{a}}}, loc)[0];
}
Tensor cumlogsumexp(const Tensor& x, std::optional<int64_t> axis, Loc loc) {
  return scan(prim::cumlogsumexp(), ops::cast_if_needed(x, to_floating(x.dtype()), loc), axis, loc);
}

// The sorted elements at floor and ceil of q (n - 1), interpolated linearly (numpy's default
// method, with its two-sided lerp); NaN where the axis holds a NaN (it sorts last).
Tensor quantile(const Tensor& x, double q, std::optional<int64_t> axis, bool keepdims, Loc loc) {
  const detail::CallSite site(loc);
  if (!(q >= 0.0 && q <= 1.0))
    fail("quantile", "q out of range: got ", q, ", expected 0 <= q <= 1");
  const Tensor xf = ops::cast_if_needed(x, to_floating(x.dtype()), loc);
  const auto [v, a] = along("quantile", xf, axis, loc);
  const int64_t n = v.shape()[a];
  if (n == 0)
    fail("quantile", "empty axis: got ", x.type(), " along axis ", a,
         ", expected at least one element");
  const Tensor sorted = sort(v, a, false, loc);
  const double pos = q * static_cast<double>(n - 1);
  const auto lo = static_cast<int64_t>(std::floor(pos));
  const int64_t hi = std::min(lo + 1, n - 1);
  const double t = pos - static_cast<double>(lo);
  // Structured bindings are captured by an init-capture: clang 16 rejects them under OpenMP.
  auto at = [&, a = a](int64_t i) {
    return take(sorted, full(Shape{}, static_cast<double>(i), int64), a, loc);
  };
  const Tensor below = at(lo), above = at(hi);
  const Tensor step = above - below;
  Tensor r = t >= 0.5 ? above - step * (1.0 - t) : below + step * t;
  r = where(isnan(at(n - 1), loc), scalar_like(r, std::numeric_limits<double>::quiet_NaN()), r,
            loc);
  if (!keepdims) return r;
  if (!axis)
    return reshape(r, Shape(std::vector<int64_t>(static_cast<std::size_t>(x.rank()), 1)), loc);
  return expand_dims(r, a, loc);
}
Tensor median(const Tensor& x, std::optional<int64_t> axis, bool keepdims, Loc loc) {
  const detail::CallSite site(loc);
  return quantile(x, 0.5, axis, keepdims, loc);
}

namespace {

// The flattened x sorted, with each sorted element's index among the distinct values.
struct Runs {
  SortResult sorted;
  Tensor starts;    // bool: the element differs from the one before it
  Tensor position;  // int64: the number of runs of equal values before this one's
  int64_t count;    // the number of values kept: `size`, or all distinct ones
};

Runs runs_of(const Tensor& x, std::optional<int64_t> size, Loc loc) {
  if (size && *size < 0) fail("unique", "negative size: got ", *size, ", expected size >= 0");
  if (!size && x.is_traced())
    fail("unique", "the number of distinct values of a traced ", x.type(),
         " is unknown: got size=None, expected a size (and fill_value) under jit or vmap");
  const int64_t n = x.numel();
  const SortResult s = sort_with_indices(reshape(x, Shape{n}, loc), 0, false, loc);
  // A run starts where an element differs from the one before; NaNs (sorted last) are one run.
  Tensor starts = full(Shape{std::min<int64_t>(n, 1)}, 1.0, bool_);
  if (n > 1) {
    const Tensor later = slice(s.values, {Slice{1, std::nullopt, 1}}, loc);
    const Tensor earlier = slice(s.values, {Slice{0, -1, 1}}, loc);
    Tensor differs = not_equal(later, earlier, loc);
    if (is_floating(x.dtype()))
      differs =
          logical_and(differs, logical_not(isnan(later, loc) && isnan(earlier, loc), loc), loc);
    starts = concatenate({starts, differs}, 0, loc);
  }
  const Tensor position = cumsum(starts, 0, loc) - int64_t{1};
  const int64_t count = size ? *size : sum(starts, {}, false, loc).item<int64_t>();
  return {s, starts, position, count};
}

// The first `count` distinct values, padded with fill_value (default: the smallest element).
Tensor distinct_values(const Runs& r, const Tensor& x, std::optional<double> fill_value, Loc loc) {
  const Tensor& sorted = r.sorted.values;
  const Tensor fill = fill_value || sorted.numel() == 0
                          ? full(Shape{}, fill_value.value_or(0.0), x.dtype())
                          : index(sorted, 0, loc);
  // The first element of each run is written to its position, the others (and the runs cut
  // off by size) to an extra slot at `count`, dropped afterwards.
  const Tensor extra = full(Shape{}, static_cast<double>(r.count), int64);
  const Tensor slot = where(logical_and(r.starts, r.position < extra, loc), r.position, extra, loc);
  const Tensor written =
      scatter(broadcast_to(fill, Shape{r.count + 1}, loc), slot, sorted, 0, ScatterMode::set, loc);
  return slice(written, {Slice{0, r.count, 1}}, loc);
}

}  // namespace

Tensor unique(const Tensor& x, std::optional<int64_t> size, std::optional<double> fill_value,
              Loc loc) {
  const detail::CallSite site(loc);
  return distinct_values(runs_of(x, size, loc), x, fill_value, loc);
}

UniqueResult unique_all(const Tensor& x, std::optional<int64_t> size,
                        std::optional<double> fill_value, Loc loc) {
  const detail::CallSite site(loc);
  const Runs r = runs_of(x, size, loc);
  const Tensor inverse = scatter(zeros(Shape{x.numel()}, int64), r.sorted.indices, r.position, 0,
                                 ScatterMode::set, loc);
  return {distinct_values(r, x, fill_value, loc), inverse,
          bincount(r.position, r.count, std::nullopt, loc)};
}

Tensor std(const Tensor& x, const Axes& axes, bool keepdims, int64_t ddof, Loc loc) {
  const detail::CallSite site(loc);
  return sqrt(var(x, axes, keepdims, ddof, loc), loc);
}

}  // namespace kiln
