// pmap across processes (run as 1 process and under mpirun with 2 and 3): every result is
// checked against a single-process reference that runs the same function with vmap over the
// whole axis, which every process can compute from the same global data.
#include <kiln/kiln.h>

#include <cstring>

#include "../testing.h"

namespace kiln {
namespace {

using testing::expect_allclose;
using testing::expect_error;

// How the axis is split over processes: one example each, or process p holding p + 1.
struct Split {
  std::vector<int64_t> sizes;
  int64_t offset = 0, local = 0, total = 0;
};
Split split(bool uneven) {
  Split s;
  const int me = distributed::process_index();
  for (int p = 0; p < distributed::process_count(); ++p) {
    const int64_t n = uneven ? p + 1 : 1;
    if (p < me) s.offset += n;
    if (p == me) s.local = n;
    s.sizes.push_back(n);
    s.total += n;
  }
  return s;
}

// The same global data on every process.
Tensor global_data(const Split& s, std::vector<int64_t> example, uint32_t seed) {
  example.insert(example.begin(), s.total);
  const Shape shape(example);
  return tensor(testing::random_values(shape.numel(), seed), shape);
}
Tensor mine(const Tensor& global, const Split& s) {
  return slice(global, {Slice{s.offset, s.offset + s.local}});
}

class Pmap : public ::testing::TestWithParam<bool> {};  // param: uneven split
INSTANTIATE_TEST_SUITE_P(Splits, Pmap, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Uneven" : "OnePerProcess"; });

TEST_P(Pmap, CollectivesMatchVmapOverTheWholeAxis) {
  const Split s = split(GetParam());
  const Tensor x = global_data(s, {4}, 1);
  auto f = [](const Tensor& v) {
    const Tensor i = astype(axis_index("dp"), float64);
    return std::tuple{v - pmean(v, "dp") + pmax(v, "dp") * i, psum(v * v, "dp"),
                      all_gather(v, "dp")};
  };
  const auto [a, b, c] = pmap(f, axis_name("dp"))(mine(x, s));
  const auto [ra, rb, rc] = vmap(f, axis_name("dp"))(x);
  expect_allclose(a, mine(ra, s), {.rtol = 5e-13, .atol = 5e-13}, "centered + pmax * index");
  expect_allclose(b, mine(rb, s), {.rtol = 5e-13, .atol = 5e-13}, "psum");
  expect_allclose(c, mine(rc, s), {.rtol = 0, .atol = 0}, "all_gather");
}

// pmin, ppermute, all_to_all and psum_scatter: their local parts, combined across processes.
TEST_P(Pmap, ExchangingCollectivesMatchVmapOverTheWholeAxis) {
  const Split s = split(GetParam());
  const int64_t n = s.total;
  const Tensor x = global_data(s, {2, n}, 11);    // example: [2, N]
  std::vector<std::pair<int64_t, int64_t>> perm;  // example 0 receives nothing
  for (int64_t i = 0; i + 1 < n; ++i) perm.emplace_back(i, i + 1);
  auto f = [perm](const Tensor& v) {
    return std::tuple{pmin(v, "dp"), ppermute(v, "dp", perm), all_to_all(v, "dp", 1, 0),
                      psum_scatter(v, "dp", 1)};
  };
  const auto [a, b, c, d] = pmap(f, axis_name("dp"))(mine(x, s));
  const auto [ra, rb, rc, rd] = vmap(f, axis_name("dp"))(x);
  expect_allclose(a, mine(ra, s), {.rtol = 0, .atol = 0}, "pmin");
  expect_allclose(b, mine(rb, s), {.rtol = 0, .atol = 0}, "ppermute");
  expect_allclose(c, mine(rc, s), {.rtol = 0, .atol = 0}, "all_to_all");
  expect_allclose(d, mine(rd, s), {.rtol = 5e-13, .atol = 5e-13}, "psum_scatter");
  // Their transposes communicate too: the gradient of the sum over all processes.
  auto g = [perm](const Tensor& v) {
    return sin(psum_scatter(all_to_all(ppermute(v, "dp", perm), "dp", 1, 0), "dp", 0)) *
           sum(pmin(v, "dp"), {1});
  };
  const Tensor got =
      grad([&](const Tensor& v) { return sum(pmap(g, axis_name("dp"))(v)); })(mine(x, s));
  const Tensor want = grad([&](const Tensor& v) { return sum(vmap(g, axis_name("dp"))(v)); })(x);
  expect_allclose(got, mine(want, s), {.rtol = 5e-13, .atol = 5e-13}, "grad through the exchanges");
  // Over "dp" from inside a vmap "inner": the rules for another axis, then the exchange.
  auto two = [perm](const Tensor& u) {
    return vmap(
        [perm](const Tensor& v) {
          return all_to_all(v, "dp", 0, 0) * psum_scatter(v, "dp", 0) + ppermute(v, "dp", perm) -
                 pmin(v, "dp") * psum(v, "inner");
        },
        axis_name("inner"))(u);
  };
  const Tensor y = global_data(s, {3, n}, 12);  // example: 3 inner examples of [N]
  expect_allclose(pmap(two, axis_name("dp"))(mine(y, s)), mine(vmap(two, axis_name("dp"))(y), s),
                  {.rtol = 5e-13, .atol = 5e-13}, "pmap(vmap) with two axis names");
}

// vmap of a pmapped function: the process-level collectives' own batching rules. Checked
// against a loop that calls the pmapped function once per vmap example.
TEST_P(Pmap, VmapOfPmap) {
  const Split s = split(GetParam());
  const int64_t n = s.total;
  const Tensor x = global_data(s, {2, n}, 13);  // local [L, 2, N]: vmap over axis 1
  std::vector<std::pair<int64_t, int64_t>> perm;
  for (int64_t i = 0; i < n; ++i) perm.emplace_back(i, (i + 1) % n);
  auto f = [perm](const Tensor& v) {
    return psum(v, "dp") * ppermute(v, "dp", perm) + sum(all_gather(v, "dp"), {0}) +
           all_to_all(v, "dp", 0, 0) * pmax(v, "dp") + psum_scatter(v, "dp", 0);
  };
  const auto p = pmap(f, axis_name("dp"));
  const Tensor got =
      vmap([&](const Tensor& u) { return p(u); }, in_axes(1), out_axes(1))(mine(x, s));
  std::vector<Tensor> loop;
  for (int64_t b = 0; b < 2; ++b) loop.push_back(p(index(moveaxis(mine(x, s), 1, 0), b)));
  expect_allclose(got, stack(loop, 1), {.rtol = 5e-13, .atol = 5e-13}, "vmap(pmap(f))");
}

TEST_P(Pmap, DtypesOfTheReductions) {
  const Split s = split(GetParam());
  const Tensor x = global_data(s, {3}, 2);
  for (DType d : {float32, float16, bfloat16, int32, int64, uint8}) {
    const Tensor xd = astype(x * 10.0 + 20.0, d);
    auto f = [](const Tensor& v) { return std::pair{psum(v, "dp"), pmax(v, "dp")}; };
    const auto [sum_p, max_p] = pmap(f, axis_name("dp"))(mine(xd, s));
    const auto [sum_v, max_v] = vmap(f, axis_name("dp"))(xd);
    EXPECT_EQ(sum_p.dtype(), d);
    // Halves are summed in float32 and rounded once, as vmap's sum does.
    const double tol = d == float16 ? 1e-3 : d == bfloat16 ? 1e-2 : 1e-6;
    expect_allclose(sum_p, mine(sum_v, s), {.rtol = tol / 2, .atol = tol / 2},
                    "psum in " + std::string(dtype_name(d)));
    expect_allclose(max_p, mine(max_v, s), {.rtol = 0, .atol = 0},
                    "pmax in " + std::string(dtype_name(d)));
  }
}

TEST_P(Pmap, SharedArgumentsAndOutAxes) {
  const Split s = split(GetParam());
  const Tensor x = global_data(s, {2, 3}, 3), w = tensor(testing::random_values(3, 4), {3});
  auto f = [](const Tensor& w, const Tensor& v) { return psum(v, "dp") * w + v; };
  const Tensor got =
      pmap(f, in_axes(none, 1), out_axes(2), axis_name("dp"))(w, moveaxis(mine(x, s), 0, 1));
  const Tensor want = vmap(f, in_axes(none, 1), out_axes(2), axis_name("dp"))(w, moveaxis(x, 0, 1));
  expect_allclose(got, slice(want, {Slice{}, Slice{}, Slice{s.offset, s.offset + s.local}}),
                  {.rtol = 5e-13, .atol = 5e-13}, "in_axes(none, 1), out_axes(2)");
}

// grad of a function of pmap's local results: each process's loss is the sum of its own
// results, and reverse mode through the collectives gives the gradient of the sum over all
// processes, as grad of the vmapped function over the whole axis does.
TEST_P(Pmap, GradOfPmap) {
  const Split s = split(GetParam());
  const Tensor x = global_data(s, {3}, 5);
  auto f = [](const Tensor& v) { return sin(v) * pmean(v * v, "dp") + pmax(v, "dp"); };
  const Tensor got =
      grad([&](const Tensor& v) { return sum(pmap(f, axis_name("dp"))(v)); })(mine(x, s));
  const Tensor want = grad([&](const Tensor& v) { return sum(vmap(f, axis_name("dp"))(v)); })(x);
  expect_allclose(got, mine(want, s), {.rtol = 5e-13, .atol = 5e-13}, "grad(pmap(f))");
  const Tensor gathered = grad([&](const Tensor& v) {
    return sum(pmap([](const Tensor& e) { return all_gather(e, "dp") * 2.0; }, axis_name("dp"))(v));
  })(mine(x, s));
  expect_allclose(gathered, full_like(gathered, 2.0 * static_cast<double>(s.total)),
                  {.rtol = 5e-13, .atol = 5e-13}, "grad through all_gather");
}

TEST_P(Pmap, PmapOfGradAndOfVmapWithTwoAxisNames) {
  const Split s = split(GetParam());
  const Tensor x = global_data(s, {2, 3}, 6), w = tensor(testing::random_values(3, 7), {3});
  auto loss = [](const Tensor& w, const Tensor& v) {
    return sum(tanh(w * v) * psum(v, "inner")) + sum(w * pmean(v, "dp"));
  };
  auto per_example = [&](const Tensor& w, const Tensor& v) {
    return vmap([&](const Tensor& u) { return grad(loss)(w, u); }, axis_name("inner"))(v);
  };
  auto step = [&](const Tensor& w, const Tensor& v) { return pmean(per_example(w, v), "dp"); };
  const Tensor got = pmap(step, in_axes(none, 0), axis_name("dp"))(w, mine(x, s));
  const Tensor want = vmap(step, in_axes(none, 0), axis_name("dp"))(w, x);
  expect_allclose(got, mine(want, s), {.rtol = 5e-13, .atol = 5e-13},
                  "pmap(vmap(grad(f))) with pmean over dp");
}

TEST_P(Pmap, JitInsideAndOutside) {
  const Split s = split(GetParam());
  const Tensor x = global_data(s, {5}, 8);
  auto inner = jit([](const Tensor& v) { return exp(v) / psum(exp(v), "dp"); });
  auto f = [&](const Tensor& v) { return inner(v) * 3.0; };
  const Tensor want = vmap(f, axis_name("dp"))(x);
  const auto p = pmap(f, axis_name("dp"));
  expect_allclose(p(mine(x, s)), mine(want, s), {.rtol = 5e-13, .atol = 5e-13}, "pmap(jit(f))");
  expect_allclose(jit([&](const Tensor& v) { return p(v); })(mine(x, s)), mine(want, s),
                  {.rtol = 5e-13, .atol = 5e-13}, "jit(pmap(jit(f)))");
}

// The same program gives bitwise the same result run to run, and on every process.
TEST_P(Pmap, ReductionsAreDeterministicAndTheSameOnEveryProcess) {
  const Split s = split(GetParam());
  const Tensor x = astype(global_data(s, {1 << 16}, 9), float32);
  const auto p = pmap([](const Tensor& v) { return psum(v * 1.1f, "dp"); }, axis_name("dp"));
  const Tensor first = p(mine(x, s)).contiguous(), second = p(mine(x, s)).contiguous();
  ASSERT_EQ(std::memcmp(first.raw_data(), second.raw_data(), first.numel() * sizeof(float)), 0);
  const Tensor everywhere = pmap([](const Tensor& v) { return all_gather(v, "dp"); },
                                 axis_name("dp"))(index(first, 0) + zeros({s.local, 1 << 16}));
  for (int64_t p = 0; p < s.total; ++p)
    ASSERT_EQ(std::memcmp(index(index(everywhere, 0), p).contiguous().raw_data(),
                          index(first, 0).contiguous().raw_data(), (1 << 16) * sizeof(float)),
              0)
        << "example " << p << " differs";
}

// A pmapped function with static storage is destroyed at exit, after the compiler's
// singletons were: it must still drop its code cleanly (it crashed at exit under mpirun, and
// ASan reports the use after free of the destroyed JIT).
const auto g_static_psum = pmap([](const Tensor& v) { return psum(v, "dp"); }, axis_name("dp"));

TEST(PmapLifetime, StaticPmappedFunctionOutlivesMain) {
  const Tensor got = g_static_psum(ones({1, 3}));
  expect_allclose(got, full({1, 3}, distributed::process_count()), {.rtol = 0, .atol = 0},
                  "psum of ones");
}

int64_t count(const ir::Function& f, const std::string& prim) {
  int64_t n = 0;
  for (const ir::Equation& e : f.equations) n += e.prim->name == prim;
  return n;
}

// One example per process, gathers and reduce-scatters growing from 1 KB to 4 MB a process (on
// one host the shared segments grow with them), and in bfloat16 (summed in float32): every
// element against values computed here from the ranks.
TEST(PmapCollectives, GathersAndScattersOfGrowingSizes) {
  const int rank = distributed::process_index();
  const int64_t n = distributed::process_count();
  for (const DType dt : {float32, bfloat16})
    for (const int64_t floats : {int64_t{256}, int64_t{1} << 20}) {
      // Process r brings (r + 1) + k / floats at element k: all elements differ, exactly.
      const Tensor ramp = astype(arange(floats), float32) / static_cast<double>(floats);
      const Tensor mine = astype(expand_dims(ramp + static_cast<double>(rank + 1), 0), dt);
      const Tensor gathered =
          pmap([](const Tensor& x) { return all_gather(x, "p"); }, axis_name("p"))(mine);
      // psum_scatter of [n, floats]: row q of process r's operand is (q + 1)·mine.
      const Tensor rows =
          astype(expand_dims(matmul(reshape(astype(arange(n), float32) + 1.0, {n, 1}),
                                    reshape(astype(mine, float32), {1, floats})),
                             0),
                 dt);
      const Tensor scattered =
          pmap([](const Tensor& x) { return psum_scatter(x, "p"); }, axis_name("p"))(rows);
      const std::vector<double> r = ramp.to_vector<double>();
      std::vector<double> want_gather, want_scatter(static_cast<std::size_t>(floats));
      for (int64_t q = 0; q < n; ++q) {  // what process q brings, rounded to dt as it was
        const std::vector<double> v =
            astype(astype(ramp + static_cast<double>(q + 1), dt), float64).to_vector<double>();
        want_gather.insert(want_gather.end(), v.begin(), v.end());
      }
      for (int64_t k = 0; k < floats; ++k)  // Σ_q (rank + 1)·(q + 1 + ramp_k)
        want_scatter[static_cast<std::size_t>(k)] =
            static_cast<double>(rank + 1) *
            (static_cast<double>(n * (n + 1) / 2) +
             static_cast<double>(n) * r[static_cast<std::size_t>(k)]);
      const std::string what = std::string(dtype_name(dt)) + ", " + std::to_string(floats);
      expect_allclose(astype(gathered, float64), want_gather, {.rtol = 0, .atol = 0},
                      "all_gather " + what);
      const double tol = dt == bfloat16 ? 2e-2 : 1e-6;
      expect_allclose(astype(scattered, float64), want_scatter, {.rtol = tol, .atol = 0},
                      "psum_scatter " + what);
    }
}

// A pmean over a tree of gradients is one MPI call per bucket (4 MB by default), not one per
// tensor; all-reduces that depend on each other stay apart. Values as vmap's.
TEST(PmapBucketing, IndependentAllReducesShareACall) {
  const Split s = split(false);
  std::vector<Tensor> small;
  for (int k = 0; k < 6; ++k) small.push_back(global_data(s, {k + 1, 3}, 20 + k));
  auto mean_all = [](const std::vector<Tensor>& xs) {
    std::vector<Tensor> out;
    for (const Tensor& x : xs) out.push_back(pmean(x * 2.0, "dp"));
    return out;
  };
  std::vector<Tensor> local;
  for (const Tensor& x : small) local.push_back(mine(x, s));
  const auto p = pmap(mean_all, axis_name("dp"));
  // One process holds the whole axis: no communication at all.
  const int64_t one = distributed::process_count() > 1 ? 1 : 0;
  EXPECT_EQ(count(p.lower(local), "process_all_reduce"), one);
  const std::vector<Tensor> got = p(local), want = vmap(mean_all, axis_name("dp"))(small);
  for (std::size_t k = 0; k < got.size(); ++k)
    expect_allclose(got[k], mine(want[k], s), {.rtol = 5e-13, .atol = 5e-13},
                    "bucketed pmean " + std::to_string(k));

  // 3 x 1.5 MB of float32: two buckets.
  std::vector<Tensor> big(3, zeros({1, 3 * (1 << 17)}));
  EXPECT_EQ(count(pmap(mean_all, axis_name("dp")).lower(big), "process_all_reduce"), 2 * one);

  // psum of a psum: the second depends on the first.
  auto chained = [](const Tensor& a, const Tensor& b) {
    const Tensor first = psum(a, "dp");
    return std::pair{first, psum(b * first, "dp")};
  };
  const Tensor a = global_data(s, {3}, 30), b = global_data(s, {3}, 31);
  const auto q = pmap(chained, axis_name("dp"));
  EXPECT_EQ(count(q.lower(mine(a, s), mine(b, s)), "process_all_reduce"), 2 * one);
  const auto [g1, g2] = q(mine(a, s), mine(b, s));
  const auto [w1, w2] = vmap(chained, axis_name("dp"))(a, b);
  expect_allclose(g1, mine(w1, s), {.rtol = 5e-13, .atol = 5e-13}, "first psum");
  expect_allclose(g2, mine(w2, s), {.rtol = 5e-13, .atol = 5e-13}, "psum of a psum");
}

TEST(PmapErrors, MismatchedArgumentsAcrossProcessesAreReportedByName) {
  const int me = distributed::process_index();
  const auto p = pmap([](const Tensor& v) { return psum(v, "dp"); }, axis_name("dp"));
  if (distributed::process_count() > 1) {
    // Process 1 passes another per-example shape: every process gets the Error.
    const Tensor x = zeros({1, me == 1 ? 4 : 3});
    expect_error([&] { p(x); }, "pmap", {"different arguments", "process", "f32[*,3]", "f32[*,4]"});
  }
  // The group is still usable afterwards.
  const Tensor ok = p(ones({1, 2}));
  expect_allclose(ok, full({1, 2}, distributed::process_count()), {.rtol = 0, .atol = 0},
                  "psum after the error");
}

TEST(PmapErrors, UnknownAxisListsTheAxesInScope) {
  const auto p = pmap(
      [](const Tensor& v) {
        return vmap([](const Tensor& u) { return psum(u, "batch"); }, axis_name("inner"))(v);
      },
      axis_name("dp"));
  expect_error([&] { p(ones({1, 2, 3})); }, "psum", {"'batch'", "dp, inner"});
  const auto nested = pmap(
      [](const Tensor& v) {
        return pmap([](const Tensor& u) { return u; }, axis_name("inner"))(v);
      },
      axis_name("dp"));
  expect_error([&] { nested(ones({1, 1, 2})); }, "pmap", {"nested pmap", "'dp'"});
}

TEST(PmapErrors, ProcessCollectivesCheckTheirOperandOnEveryProcess) {
  if (distributed::process_count() == 1) GTEST_SKIP() << "needs two processes";
  // The arguments agree, but process 1's function brings another shape to the all-reduce:
  // every process gets the Error, naming both operands.
  const int me = distributed::process_index();
  const auto p = pmap(
      [me](const Tensor& v) {
        return psum(me == 1 ? concatenate({v, v}) : v, "dp");
      },
      axis_name("dp"));
  expect_error(
      [&] {
        p(ones({1, 2}));
      },
      "psum", {"processes disagree on the operand", "f32[2]", "f32[4]"});
  const auto q = pmap([](const Tensor& v) { return psum(v, "dp"); }, axis_name("dp"));
  expect_allclose(q(ones({1, 2})), full({1, 2}, distributed::process_count()),
                  {.rtol = 0, .atol = 0}, "psum after the error");
}

}  // namespace
}  // namespace kiln
