// The compiled loop drivers (src/compiler/loops.cpp): scan, while / fori_loop and cond run by
// a compiled function against the interpreter's kernels (the reference semantics), with
// several carries, xs and ys, captures, strided operands, nesting, derivatives and batching;
// that a step allocates no tensor memory; that errors raised inside a loop read the same; and
// the series of calls the drivers make (compiler::Code::calls), driven directly.
#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include "compare.h"
#include "compiler/executable.h"
#include "program_generator.h"
#include "testing.h"

using namespace kiln;

namespace {

using Ts = std::vector<Tensor>;
using kiln::testing::expect_allclose;

// f traced on args and optimised as jit does, then run by the LLVM backend and by the
// interpreter: the results must agree (bit for bit when f only does IEEE-exact arithmetic,
// else by the program rule), or both must raise an Error.
template <class F, class... Args>
void expect_like_interpreter(const std::string& what, F f, const Args&... args) {
  const auto fn = std::make_shared<const ir::Function>(ir::optimize(trace(f, args...)));
  ir::verify(*fn);
  const Ts in{args...};
  const auto m = kiln::testing::check_program(fn, in, kiln::testing::backend(ir::Backend::llvm));
  EXPECT_FALSE(m) << what << ": " << *m << "\n" << ir::print(*fn);
}

Tensor draw(uint64_t seed, const Shape& s, DType d = float32) {
  return random::normal(random::key(seed), s, d);
}

// Carries of three dtypes, one of them a square matrix that the body reads transposed (a step
// must not write the buffer it reads); xs of two dtypes, one read through a transpose (not
// contiguous); ys that are a fused value, a carry passed through, an xs slice passed through
// and a matmul's output; a capture that is a transposed view.
Ts many_carries_xs_ys(const Tensor& a, const Tensor& b, const Tensor& m, const Tensor& w,
                      bool reverse) {
  using Carry = std::tuple<Tensor, Tensor, Tensor>;
  using Xs = std::tuple<Tensor, Tensor, Tensor>;
  const Tensor wt = transpose(w);
  auto [c, ys] = scan(
      [&](const Carry& c, const Xs& x) {
        const auto& [h, n, s] = c;
        const auto& [xa, xb, xm] = x;
        const Tensor h2 = transpose(h) * 0.5f + reshape(xa * xm, Shape{3, 3});
        const Tensor n2 = n + xb;
        const Tensor s2 = s * 0.75 + astype(xb, float64);
        return std::pair{Carry{h2, n2, s2}, std::tuple{h2, n, xa, matmul(h2, wt)}};
      },
      Carry{reshape(tensor(std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8}), Shape{3, 3}),
            zeros({}, int32), ones({}, float64)},
      Xs{a, b, transpose(m)}, ScanOptions{.reverse = reverse});
  const auto& [h, n, s] = c;
  const auto& [y0, y1, y2, y3] = ys;
  return {h, n, s, y0, y1, y2, y3};
}

}  // namespace

TEST(CompiledLoops, ScanWithManyCarriesXsYsForwardAndReverse) {
  const Tensor a = draw(1, {7, 9}), m = draw(3, {9, 7}), w = draw(4, {3, 3});
  const Tensor b = astype(draw(2, {7}) * 4.0f, int32);
  for (bool reverse : {false, true})
    expect_like_interpreter(
        reverse ? "reverse" : "forward",
        [reverse](const Tensor& a, const Tensor& b, const Tensor& m, const Tensor& w) {
          return many_carries_xs_ys(a, b, m, w, reverse);
        },
        a, b, m, w);
}

TEST(CompiledLoops, ScanStepsInOrderAndStacksYsAtTheirIndex) {
  // A running sum with the index of each step as its y, against a plain loop: ys stay in xs
  // order and the carry visits xs from the end with `reverse`.
  const std::vector<float> xv{1, 2, 4, 8, 16};
  auto f = [](const Tensor& xs, bool reverse) {
    return scan(
        [](const Tensor& c, const Tensor& x) {
          const Tensor n = c * 2.0f + x;
          return std::pair{n, n};
        },
        zeros({}, float32), xs, ScanOptions{.reverse = reverse});
  };
  for (bool reverse : {false, true}) {
    auto g = jit([&](const Tensor& xs) { return f(xs, reverse); },
                 JitOptions{.backend = ir::Backend::llvm});
    const auto [c, ys] = g(tensor(xv));
    std::vector<float> want(xv.size());
    float acc = 0;
    for (std::size_t t = 0; t < xv.size(); ++t) {
      const std::size_t i = reverse ? xv.size() - 1 - t : t;
      acc = acc * 2 + xv[i];
      want[i] = acc;
    }
    EXPECT_EQ(c.item<float>(), acc);
    EXPECT_EQ(ys.to_vector<float>(), want);
  }
}

TEST(CompiledLoops, ScanOfLengthZeroAndOneAndEmptySlices) {
  auto f = [](const Tensor& c0, const Tensor& xs) {
    return scan(
        [](const Tensor& c, const Tensor& x) {
          return std::pair{c + x, std::tuple{c * x, x}};
        },
        c0, xs);
  };
  const Tensor c0 = draw(5, {4});
  for (int64_t n : {0, 1}) {
    const Tensor xs = draw(6, {n, 4});
    expect_like_interpreter("length " + std::to_string(n), f, c0, xs);
    const auto [c, ys] = jit(f, JitOptions{.backend = ir::Backend::llvm})(c0, xs);
    EXPECT_EQ(std::get<0>(ys).shape(), Shape({n, 4}));
    if (n == 0) {
      EXPECT_EQ(c.to_vector<float>(), c0.to_vector<float>());
    }
  }
  // Steps over empty slices (xs [3, 0]: views of no memory), and an empty carry.
  expect_like_interpreter("empty slices", f, zeros({0}), zeros({3, 0}));
  // No xs at all: fori_loop with static bounds, including an empty range.
  for (int64_t hi : {0, 1, 6})
    expect_like_interpreter(
        "fori_loop to " + std::to_string(hi),
        [hi](const Tensor& c0) {
          return fori_loop(
              0, hi, [](const Tensor& i, const Tensor& c) { return c * 0.5f + astype(i, float32); },
              c0);
        },
        c0);
}

TEST(CompiledLoops, NestedScans) {
  auto f = [](const Tensor& xs, const Tensor& m) {
    return scan(
        [&](const Tensor& c, const Tensor& x) {
          auto [ci, yi] = scan(
              [&](const Tensor& d, const Tensor& row) {
                const Tensor n = d * 0.5f + row * x;
                return std::pair{n, sum(n)};
              },
              c, m, ScanOptions{.reverse = true});
          return std::pair{ci, yi};
        },
        zeros({3}), xs);
  };
  expect_like_interpreter("nested", f, draw(7, {5, 3}), draw(8, {4, 3}));
  expect_like_interpreter("grad of nested", grad([&](const Tensor& xs, const Tensor& m) {
                            auto [c, ys] = f(xs, m);
                            return sum(c) + sum(ys * ys);
                          }),
                          draw(7, {5, 3}), draw(8, {4, 3}));
}

TEST(CompiledLoops, ScanInsideCondAndCondInsideScan) {
  auto scan_in_cond = [](const Tensor& x, const Tensor& xs) {
    return cond(
        sum(x) > 0.0f,
        [&](const Tensor& v) {
          return scan(
              [](const Tensor& c, const Tensor& e) {
                return std::pair{c * e + 1.0f, c};
              },
              v, xs);
        },
        [&](const Tensor& v) {
          return std::pair{v * 2.0f, xs * 3.0f};
        },
        x);
  };
  const Tensor x = draw(9, {4}), xs = draw(10, {6, 4});
  expect_like_interpreter("scan in cond (one branch)", scan_in_cond, x, xs);
  expect_like_interpreter("scan in cond (the other)", scan_in_cond, x * -1.0f, xs);
  // A cond per step on the carry, and a switch whose index (from xs) is clamped.
  auto cond_in_scan = [](const Tensor& c0, const Tensor& xs, const Tensor& k) {
    return scan(
        [](const Tensor& c, const std::pair<Tensor, Tensor>& x) {
          const Tensor n = cond(
              sum(c) > 0.0f, [&] { return c * 0.5f - x.first; },
              [&] { return c * -1.0f + x.first; });
          const Tensor y = switch_(
              x.second, [&] { return n + 1.0f; }, [&] { return n * 3.0f; }, [&] { return n - c; });
          return std::pair{n, y};
        },
        c0, std::pair{xs, k});
  };
  const Tensor k = tensor(std::vector<int32_t>{-3, 0, 1, 2, 7, 1});
  expect_like_interpreter("cond and switch in scan", cond_in_scan, x, xs, k);
}

TEST(CompiledLoops, WhileAndForiWithDataDependentTripCounts) {
  auto grow = [](const Tensor& x, const Tensor& limit) {
    using Carry = std::pair<Tensor, Tensor>;
    return while_loop([&](const Carry& c) { return sum(abs(c.second)) < limit; },
                      [&](const Carry& c) {
                        return Carry{c.first + 1, transpose(c.second) * 1.5f + 0.25f};
                      },
                      Carry{zeros({}, int32), x});
  };
  const Tensor x = draw(11, {3, 3});
  for (float limit : {0.0f, 5.0f, 1e4f})  // no step, a few, many
    expect_like_interpreter("while to " + std::to_string(limit), grow, x, full({}, limit));
  auto fori = [](const Tensor& x, const Tensor& lo, const Tensor& hi) {
    return fori_loop(
        lo, hi, [&](const Tensor& i, const Tensor& c) { return c * 0.5f + astype(i, float32) * x; },
        x);
  };
  for (auto [lo, hi] : {std::pair{2, 9}, std::pair{4, 4}, std::pair{5, -1}})
    expect_like_interpreter("fori_loop " + std::to_string(lo) + ".." + std::to_string(hi), fori, x,
                            tensor(int32_t(lo)), tensor(int32_t(hi)));
}

TEST(CompiledLoops, GradVjpJvpVmapOfEachLoop) {
  const Tensor a = draw(12, {7, 9}), m = draw(14, {9, 7}), w = draw(15, {3, 3});
  const Tensor b = astype(draw(13, {7}) * 4.0f, int32);
  for (bool reverse : {false, true}) {
    auto loss = [reverse, &b](const Tensor& a, const Tensor& m, const Tensor& w) {
      const Ts r = many_carries_xs_ys(a, b, m, w, reverse);
      return sum(r[0]) + sum(r[3] * r[6]) + astype(r[2], float32);
    };
    expect_like_interpreter("grad of scan", grad(loss, argnums<0, 1, 2>), a, m, w);
    expect_like_interpreter(
        "vjp of scan",
        [&](const Tensor& a, const Tensor& m, const Tensor& w) {
          auto [y, pullback] = vjp(loss, a, m, w);
          return pullback(y * 0.0f + 1.5f);
        },
        a, m, w);
    expect_like_interpreter(
        "jvp of scan",
        [&](const Tensor& a, const Tensor& m, const Tensor& w) {
          return jvp(loss, std::tuple{a, m, w}, std::tuple{a * 0.0f + 1.0f, m * 0.0f, w}).second;
        },
        a, m, w);
  }
  auto loop = [](const Tensor& x, const Tensor& s) {
    using Carry = std::pair<Tensor, Tensor>;
    const Carry r =
        while_loop([](const Carry& c) { return logical_and(sum(c.second) < 20.0f, c.first < 30); },
                   [&](const Carry& c) {
                     return Carry{c.first + 1,
                                  c.second * s + cond(
                                                     c.first < 2, [&] { return c.second * 0.0f; },
                                                     [&] { return c.second * 0.0f + s * 0.25f; })};
                   },
                   Carry{zeros({}, int32), abs(x)});
    return sum(r.second);
  };
  const Tensor x = draw(16, {4}), s = full({}, 1.25f);
  expect_like_interpreter("while", loop, x, s);
  expect_like_interpreter("grad of while (while_grad)", grad(loop, argnums<0, 1>), x, s);
  expect_like_interpreter(
      "jvp of while",
      [&](const Tensor& x, const Tensor& s) {
        return jvp(loop, std::tuple{x, s}, std::tuple{x * 0.0f + 1.0f, s}).second;
      },
      x, s);
  // vmap: batched xs and carries of a scan; per-example trip counts of a while; a batched and a
  // shared predicate of a cond.
  auto rnn = [](const Tensor& h0, const Tensor& xs) {
    return scan(
        [](const Tensor& h, const Tensor& x) {
          return std::pair{tanh(h + x), h * x};
        },
        h0, xs);
  };
  expect_like_interpreter("vmap of scan", vmap(rnn, in_axes(0, 1)), draw(17, {5, 3}),
                          draw(18, {4, 5, 3}));
  expect_like_interpreter("vmap of grad of scan",
                          vmap(grad([&](const Tensor& h0, const Tensor& xs) {
                                 auto [h, ys] = rnn(h0, xs);
                                 return sum(h) + sum(ys);
                               }),
                               in_axes(0, none)),
                          draw(17, {5, 3}), draw(18, {4, 3}));
  expect_like_interpreter("vmap of while", vmap(loop, in_axes(0, none)), draw(19, {6, 4}) * 3.0f,
                          s);
  expect_like_interpreter("vmap of grad of while", vmap(grad(loop), in_axes(0, none)),
                          draw(19, {6, 4}) * 3.0f, s);
  auto pick = [](const Tensor& x, const Tensor& p) {
    return cond(
        p > 0.0f,
        [&] {
          return fori_loop(
              0, 3, [&](const Tensor&, const Tensor& c) { return c * x; }, x);
        },
        [&] { return x - 1.0f; });
  };
  expect_like_interpreter("vmap of cond, batched predicate", vmap(pick, in_axes(0, 0)),
                          draw(20, {5, 3}), draw(21, {5}));
  expect_like_interpreter("vmap of cond, shared predicate", vmap(pick, in_axes(0, none)),
                          draw(20, {5, 3}), full({}, 1.0f));
  expect_like_interpreter("grad of cond",
                          grad([&](const Tensor& x, const Tensor& p) { return sum(pick(x, p)); }),
                          draw(20, {3}), full({}, 1.0f));
}

TEST(CompiledLoops, AnErrorInsideALoopReadsAsTheInterpretersDoes) {
  // take with an index the loop computes: out of range at step 3.
  auto f = [](const Tensor& x, const Tensor& k) {
    return scan(
        [&](const Tensor& c, const Tensor& kk) {
          return std::pair{c + 1, take(x, reshape(c + kk, Shape{1}))};
        },
        zeros({}, int32), k);
  };
  const Tensor x = draw(22, {4}), k = tensor(std::vector<int32_t>{0, 0, 0, 2, 0});
  auto message = [&](ir::Backend b) {
    try {
      jit(f, JitOptions{.backend = b})(x, k);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string interpreted = message(ir::Backend::interpreter);
  EXPECT_NE(interpreted.find("index out of range: got 5"), std::string::npos) << interpreted;
  EXPECT_EQ(message(ir::Backend::llvm), interpreted);
}

TEST(CompiledLoops, AMalformedLoopEquationRaisesTheInterpretersError) {
  // IR built by hand (not through verify) with a loop equation its type rule rejects: the
  // compiled driver checks the operands as bind does, with the same message.
  auto f = [](const Tensor& c, const Tensor& xs) {
    auto [h, ys] = scan(
        [](const Tensor& c, const Tensor& x) {
          return std::pair{c + x, c};
        },
        c, xs);
    return std::pair{h, while_loop([](const Tensor& v) { return sum(v) < 10.0f; },
                                   [](const Tensor& v) { return v + 1.0f; }, h)};
  };
  const Ts in{draw(25, {4}), draw(26, {5, 4})};
  const ir::Function traced = trace(f, in[0], in[1]);
  auto with = [&](const std::string& prim, const std::string& attr, AttrValue value) {
    auto bad = std::make_shared<ir::Function>(traced);
    for (ir::Equation& e : bad->equations)
      if (e.prim->name == prim) e.attrs.set(attr, value);
    return std::shared_ptr<const ir::Function>(bad);
  };
  const FunctionRef body = [&] {
    for (const ir::Equation& e : traced.equations)
      if (e.prim->name == "while") return e.attrs.get<FunctionRef>("body_fn");
    return FunctionRef();
  }();
  ASSERT_TRUE(body);
  const std::vector<std::pair<std::shared_ptr<const ir::Function>, std::string>> cases{
      {with("scan", "length", int64_t{3}), "[scan] xs 0 does not match"},
      {with("scan", "num_carry", int64_t{7}), "[scan] num_carry + num_xs exceed the operands"},
      {with("while", "cond_fn", body), "[while] cond_fn must return one bool scalar"}};
  for (const auto& [fn, want] : cases) {
    auto message = [&](ir::Backend b) {
      try {
        ir::compile(fn, {.backend = b})->run(in);
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    const std::string interpreted = message(ir::Backend::interpreter);
    EXPECT_EQ(interpreted.rfind(want, 0), 0u) << interpreted;
    EXPECT_EQ(message(ir::Backend::llvm), interpreted);
  }
}

TEST(CompiledLoops, AStepAllocatesNoTensorMemory) {
  // The tensor allocations of a call do not grow with the number of steps: carries alternate
  // between two buffer sets, ys go into their stacked outputs, xs are read in place.
  auto scan_fn = [](const Tensor& c0, const Tensor& xs) {
    return scan(
        [](const std::pair<Tensor, Tensor>& c, const Tensor& x) {
          const Tensor n = c.first * 0.5f + x;
          return std::pair{std::pair{n, c.second + 1}, std::tuple{n * 2.0f, c.first}};
        },
        std::pair{c0, zeros({}, int32)}, xs);
  };
  auto fori_fn = [](const Tensor& c0, const Tensor& n) {
    return fori_loop(
        zeros({}, int32), n, [](const Tensor&, const Tensor& c) { return c * 0.5f + 1.0f; }, c0);
  };
  const Tensor c0 = draw(23, {64});
  auto allocations = [](auto&& call) {
    call();  // compile, and fill the allocator's cache
    const int64_t before = memory_stats().allocations;
    call();
    return memory_stats().allocations - before;
  };
  std::vector<int64_t> per_call;
  for (int64_t n : {3, 300}) {
    const Tensor xs = draw(24, {n, 64});
    auto js = jit(scan_fn, JitOptions{.backend = ir::Backend::llvm});
    auto jf = jit(fori_fn, JitOptions{.backend = ir::Backend::llvm});
    const Tensor count = tensor(int32_t(n));
    per_call.push_back(allocations([&] { js(c0, xs); }));
    per_call.push_back(allocations([&] { jf(c0, count); }));
    auto jstatic = jit(
        [n](const Tensor& c) {
          return fori_loop(
              0, n, [](const Tensor&, const Tensor& v) { return v * 0.5f + 1.0f; }, c);
        },
        JitOptions{.backend = ir::Backend::llvm});
    per_call.push_back(allocations([&] { jstatic(c0); }));
  }
  EXPECT_EQ(per_call[3], per_call[0]) << "scan";
  EXPECT_EQ(per_call[4], per_call[1]) << "while";
  EXPECT_EQ(per_call[5], per_call[2]) << "fori_loop";
  EXPECT_LT(per_call[3], 20) << "scan";
}

// A loop that writes a buffer a block at a time (dynamic_update_slice along one axis: a
// scatter of rows) updates its carry in place: each case against the interpreter, the ones
// where the old buffer is still needed (read after the update, the update a view of it,
// carries that swap places, the carry also a ys) included.
TEST(CompiledLoops, ABufferWrittenABlockAtATimeGivesTheInterpretersResults) {
  const Tensor zero = tensor(int64_t{0});
  auto row_of = [&](const Tensor& buf, const Tensor& i) {
    return dynamic_slice(buf, {maximum(i - 1, 0), zero}, Shape{1, 3}) * 0.5f + astype(i, float32);
  };
  auto fill = [&](const Tensor& buf) {
    return fori_loop(
        int64_t{0}, int64_t{8},
        [&](const Tensor& i, const Tensor& b) {
          return dynamic_update_slice(b, row_of(b, i), {i, zero});
        },
        buf);
  };
  auto read_after = [&](const Tensor& buf) {
    return fori_loop(
        int64_t{0}, int64_t{5},
        [&](const Tensor& i, const Tensor& b) {
          return dynamic_update_slice(b, row_of(b, i), {i, zero}) + b * 0.25f;
        },
        buf);
  };
  auto update_is_a_view = [&](const Tensor& buf) {
    return fori_loop(
        int64_t{0}, int64_t{2},
        [&](const Tensor&, const Tensor& b) {
          // Rows 0-2 shifted down by one: in place, rows 1 and 2 would be read after they are
          // written (in the second step, whose carry the loop owns).
          return dynamic_update_slice(b, slice(b, {Slice(0, 3), Slice()}),
                                      {tensor(int64_t{1}), zero});
        },
        buf);
  };
  auto swapped = [&](const Tensor& a, const Tensor& b) {
    using Carry = std::pair<Tensor, Tensor>;
    return fori_loop(
        int64_t{0}, int64_t{5},
        [&](const Tensor& i, const Carry& c) {
          return Carry{dynamic_update_slice(c.second, row_of(c.first, i), {i, zero}), c.first};
        },
        Carry{a, b});
  };
  auto two_blocks = [&](const Tensor& buf) {
    return fori_loop(
        int64_t{0}, int64_t{6},
        [&](const Tensor& i, const Tensor& b) {
          const Tensor once = dynamic_update_slice(b, row_of(b, i), {i, zero});
          return dynamic_update_slice(once, row_of(once, i + 1) * -1.0f, {i + 2, zero});
        },
        buf);
  };
  auto scan_fill = [&](const Tensor& buf, const Tensor& xs) {
    return scan(
        [&](const std::pair<Tensor, Tensor>& c, const Tensor& x) {
          const Tensor b = dynamic_update_slice(c.first, reshape(x, Shape{1, 3}), {c.second, zero});
          return std::pair{std::pair{b, c.second + 1}, std::tuple{sum(b), c.first}};
        },
        std::pair{buf, zeros({}, int64)}, xs);
  };
  // The old buffer passed through by kernels (a cond branch, and a while of no steps, returning
  // their operand) and traced before the update, so that the update is the buffer's last
  // reader: read after the update by a fused group (the write in place must be refused), or
  // itself the other carry (the refused update lands in the donated buffer only after that
  // carry is copied out of it).
  auto passed_through = [&](bool read_by_a_group) {
    return [&, read_by_a_group](const Tensor& buf, const Tensor& flag) {
      using Carry = std::pair<Tensor, Tensor>;
      return fori_loop(
          int64_t{0}, int64_t{4},
          [&](const Tensor& i, const Carry& c) {
            const Tensor& b = c.first;
            const Tensor kept = cond(
                flag, [](const Tensor& x) { return x; }, [](const Tensor& x) { return x * 2.0f; },
                b);
            const Tensor none = read_by_a_group
                                    ? while_loop([](const Tensor&) { return tensor(false); },
                                                 [](const Tensor& x) { return x + 1.0f; }, b)
                                    : Tensor();
            const Tensor updated = dynamic_update_slice(b, row_of(b, i), {i, zero});
            return Carry{updated, read_by_a_group ? kept + none : kept};
          },
          Carry{buf, buf});
    };
  };
  // Tensor bounds: the loop runs as a while, whose driver donates the carry too.
  auto fill_while = [&](const Tensor& buf, const Tensor& n) {
    return fori_loop(
        tensor(int64_t{0}), n,
        [&](const Tensor& i, const Tensor& b) {
          return dynamic_update_slice(b, row_of(b, i), {i, zero});
        },
        buf);
  };
  const Tensor buf = draw(40, {8, 3}), other = draw(41, {8, 3});
  expect_like_interpreter("the old buffer a kernel's output", passed_through(true), buf,
                          tensor(true));
  expect_like_interpreter("fill through a while", fill_while, buf, tensor(int64_t{8}));
  expect_like_interpreter("the old buffer another carry", passed_through(false), buf, tensor(true));
  expect_like_interpreter("fill", fill, buf);
  expect_like_interpreter("old buffer read after the update", read_after, buf);
  expect_like_interpreter("the update a view of the buffer", update_is_a_view, buf);
  expect_like_interpreter("carries that swap", swapped, buf, other);
  expect_like_interpreter("two blocks a step", two_blocks, buf);
  expect_like_interpreter("scan, the old buffer also a ys", scan_fill, buf, draw(42, {8, 3}));
}

TEST(CompiledLoops, ABufferWrittenABlockAtATimeIsNotCopiedAtEachStep) {
  // A step of this scan allocates nothing but what a copy of its carry would take (the rows
  // are views of xs, the position a constant, the ys written into their stacked output): were
  // the carry copied at each step (a scatter's kernel writes into new memory), a call would
  // allocate once per step; written in place, the allocations do not grow with the steps.
  auto fill = [](const Tensor& buf, const Tensor& xs) {
    const Tensor zero = tensor(int64_t{0}), two = tensor(int64_t{2});
    return scan(
        [&](const Tensor& b, const Tensor& x) {
          return std::pair{dynamic_update_slice(b, x, {two, zero}), std::tuple{sum(x)}};
        },
        buf, xs);
  };
  auto jf = jit(fill, JitOptions{.backend = ir::Backend::llvm});
  const Tensor buf = draw(43, {4, 64}), kept = buf + 0.0f;
  std::vector<int64_t> per_call;
  for (int64_t n : {3, 300}) {
    const Tensor xs = draw(44, {n, 1, 64});
    jf(buf, xs);
    const int64_t before = memory_stats().allocations;
    const auto out = jf(buf, xs);
    per_call.push_back(memory_stats().allocations - before);
    const auto want = fill(buf, xs);
    expect_allclose(out.first, want.first, {.rtol = 0, .atol = 0}, "n = " + std::to_string(n));
  }
  EXPECT_EQ(per_call[1], per_call[0]);
  // The loop updates its own copy of the carry: the caller's is as it was.
  expect_allclose(buf, kept, {.rtol = 0, .atol = 0}, "the caller's carry");
  auto fill_while = [](const Tensor& b, const Tensor& n) {
    const Tensor zero = tensor(int64_t{0});
    return fori_loop(
        zero, n,
        [&](const Tensor& i, const Tensor& c) {
          return dynamic_update_slice(c, reshape(astype(i, float32), {1, 1}) + zeros({1, 64}),
                                      {i, zero});
        },
        b);
  };
  const Tensor filled =
      jit(fill_while, JitOptions{.backend = ir::Backend::llvm})(buf, tensor(int64_t{3}));
  expect_allclose(filled, fill_while(buf, tensor(int64_t{3})), {.rtol = 0, .atol = 0},
                  "through a while");
  expect_allclose(buf, kept, {.rtol = 0, .atol = 0}, "the caller's carry, through a while");
}

// A convolution keeps its operand's reordered copy for the other passes of the call, and so
// holds the operand; a write in place over it forgets that copy first. The step that convolves
// the buffer it then writes a plane of allocates what the step that convolves another carry
// does: were the write refused, it would allocate a copy of the buffer each step.
TEST(CompiledLoops, AConvolutionOfTheBufferLeavesItToBeWrittenInPlace) {
  const Tensor w = draw(45, {8, 16, 3, 3}), zero = tensor(int64_t{0}), two = tensor(int64_t{2});
  auto step = [&](bool same) {
    return [&, same](const std::pair<Tensor, Tensor>& c, const Tensor& x) {
      const Tensor y = conv2d(same ? c.first : c.second, w, {.padding = {1, 1}});
      return std::pair{
          std::pair{dynamic_update_slice(c.first, x, {zero, two, zero, zero}), c.second},
          std::tuple{sum(y)}};
    };
  };
  std::vector<int64_t> more_steps;  // allocations of 100 more steps
  for (bool same : {true, false}) {
    auto run = [&, same](const std::pair<Tensor, Tensor>& c0, const Tensor& xs) {
      return scan(step(same), c0, xs);
    };
    auto jr = jit(run, JitOptions{.backend = ir::Backend::llvm});
    const std::pair c0{draw(46, {1, 16, 6, 6}), draw(47, {1, 16, 6, 6})};
    std::vector<int64_t> per_call;
    for (int64_t n : {3, 103}) {
      const Tensor xs = draw(48, {n, 1, 1, 6, 6});
      jr(c0, xs);
      const int64_t before = memory_stats().allocations;
      const auto out = jr(c0, xs);
      per_call.push_back(memory_stats().allocations - before);
      const auto want = run(c0, xs);
      expect_allclose(out.first.first, want.first.first, {.rtol = 0, .atol = 0});
      expect_allclose(std::get<0>(out.second), std::get<0>(want.second), {.rtol = 1e-5});
    }
    more_steps.push_back(per_call[1] - per_call[0]);
  }
  EXPECT_EQ(more_steps[0], more_steps[1]);
}

TEST(CompiledLoops, OnlyABufferNothingElseReadsIsWrittenInPlace) {
  // What the compiler marks: result 0 written over argument 0 where the update is all that
  // reads it; no mark where the old buffer is read after the update, where the update is a
  // view of it, or where the updated buffer is another argument's. A call never writes over
  // its caller's arguments (only a loop donates its own carry).
  const Tensor zero = tensor(int64_t{0});
  const Tensor buf = draw(45, {6, 3}), row = draw(46, {1, 3}), i = tensor(int64_t{2});
  const JitOptions llvm{.backend = ir::Backend::llvm};
  auto update = [&](const Tensor& b, const Tensor& r, const Tensor& at) {
    return dynamic_update_slice(b, r, {at, zero});
  };
  const ir::CompiledInfo info = jit(update, llvm).compiled(buf, row, i);
  EXPECT_EQ(info.results_in_place, std::vector<int>{0}) << info;
  EXPECT_EQ(info.kernel_calls_in_place.size(), 1u) << info;
  const Tensor before = buf.contiguous() + 0.0f;
  const Tensor out = jit(update, llvm)(buf, row, i);
  expect_allclose(buf, before, {.rtol = 0, .atol = 0}, "the caller's buffer");
  expect_allclose(out, update(buf, row, i), {.rtol = 0, .atol = 0}, "the update");
  auto read_after = [&](const Tensor& b, const Tensor& r, const Tensor& at) {
    return std::pair{dynamic_update_slice(b, r, {at, zero}), sum(b)};
  };
  EXPECT_TRUE(jit(read_after, llvm).compiled(buf, row, i).results_in_place.empty());
  auto of_itself = [&](const Tensor& b, const Tensor& at) {
    return dynamic_update_slice(b, slice(b, {Slice(0, 1), Slice()}), {at, zero});
  };
  EXPECT_TRUE(jit(of_itself, llvm).compiled(buf, i).kernel_calls_in_place.empty());
  auto crossed = [&](const Tensor& a, const Tensor& b, const Tensor& at) {
    return std::pair{dynamic_update_slice(b, slice(a, {Slice(0, 1), Slice()}), {at, zero}), a};
  };
  EXPECT_TRUE(jit(crossed, llvm).compiled(buf, buf * 2.0f, i).results_in_place.empty());
}

TEST(CompiledLoops, AStepReadsItsCapturesAsTheFirstStepDidAndNeverWritesOverThem) {
  // A loop's steps run as a series (Code::calls) that binds the captures and the constants at
  // its first step only: every later step must read them as the first did. The body's update
  // of a capture reads it last, so the compiler lets that kernel write in place; the loop holds
  // the capture for its next step, so the write must not happen. Through a scan (the
  // captures after the xs) and a fori_loop with tensor bounds (a while: its test and its body,
  // two series).
  const Tensor w = draw(47, {6, 3}), row = draw(48, {1, 3});
  const Tensor lo = tensor(int64_t{0}), hi = tensor(int64_t{6});
  auto step = [](const Tensor& w, const Tensor& row, const Tensor& i, const Tensor& acc) {
    const Tensor updated =
        dynamic_update_slice(w, row * astype(i, float32), {astype(i, int64), tensor(int64_t{0})});
    return acc + matmul(transpose(updated), updated) + tensor(std::vector<float>{1, 2, 3});
  };
  auto scanned = [&](const Tensor& w, const Tensor& row) {
    auto [acc, ys] = scan(
        [&](const Tensor& acc, const Tensor& i) {
          const Tensor next = step(w, row, i, acc);
          return std::pair{next, sum(next)};
        },
        zeros({3, 3}), arange(6));
    return Ts{acc, ys};
  };
  auto looped = [&](const Tensor& w, const Tensor& row, const Tensor& lo, const Tensor& hi) {
    return fori_loop(
        lo, hi, [&](const Tensor& i, const Tensor& acc) { return step(w, row, i, acc); },
        zeros({3, 3}));
  };
  expect_like_interpreter("scan", scanned, w, row);
  expect_like_interpreter("while", looped, w, row, lo, hi);
  const JitOptions llvm{.backend = ir::Backend::llvm};
  const Tensor before = w.contiguous() + 0.0f;
  (void)jit(scanned, llvm)(w, row);
  (void)jit(looped, llvm)(w, row, lo, hi);
  expect_allclose(w, before, {.rtol = 0, .atol = 0}, "the captured buffer");
}

TEST(CompiledLoops, ALoopCalledAgainAfterAStepRaisedGivesTheInterpretersResults) {
  // A kernel that raises at the fourth step leaves that step's frame half filled (its inputs
  // gathered, its views bound); the loop's next call, a new series of the same body, must not
  // start from it.
  const Tensor w = draw(49, {5, 3});
  auto f = [](const Tensor& w, const Tensor& at) {
    auto [acc, ys] = scan(
        [&](const Tensor& acc, const Tensor& i) {
          const Tensor row = take(w, reshape(i + at, {1}));
          return std::pair{acc + matmul(row, transpose(w)), sum(row)};
        },
        zeros({1, 5}), arange(4));
    return Ts{acc, ys};
  };
  auto compiled = jit(f, JitOptions{.backend = ir::Backend::llvm});
  EXPECT_THROW(compiled(w, tensor(int64_t{2})), Error);  // index 5 of 5 rows at i = 3
  const Tensor at = tensor(int64_t{1});
  const Ts got = compiled(w, at), want = f(w, at);
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    expect_allclose(got[i], want[i], {.rtol = 0, .atol = 0}, "result " + std::to_string(i));
}

TEST(CompiledLoops, ASeriesStartsAfreshAfterACallRaisesAndNeverWritesOverAFixedArgument) {
  // A series as the drivers make one, called directly, with argument 1 fixed and passed as a
  // transposed view: the first call binds a contiguous copy of it, the only holder of that
  // memory, and the update reads it last, so the plan lets the update's kernel write in place.
  // The series must not: every call reads that argument again. And a call that raises (an
  // index out of range in the gather) leaves its frame half filled: the series' next call
  // must not start from it.
  auto f = [](const Tensor& at, const Tensor& w) {
    const Tensor row = take(w, reshape(at, {1}));
    return dynamic_update_slice(w, row * 2.0f, {at, tensor(int64_t{0})});
  };
  const Tensor w = transpose(draw(50, {3, 5}));
  const auto fn =
      std::make_shared<const ir::Function>(ir::optimize(trace(f, tensor(int64_t{0}), w)));
  const auto exe = compiler::compile(fn);
  const auto* code = dynamic_cast<const compiler::Code*>(exe.get());
  ASSERT_NE(code, nullptr);
  ASSERT_EQ(exe->info().kernel_calls_in_place.size(), 1u) << exe->info();
  const std::unique_ptr<compiler::Calls> calls = code->calls(1);
  auto call = [&](int64_t at) {
    const Ts args{tensor(at), w};
    const Ts dests{zeros({5, 3})};
    calls->run_into(args, dests);
    return dests[0];
  };
  for (const int64_t at : {int64_t{1}, int64_t{3}})
    expect_allclose(call(at), f(tensor(at), w), {.rtol = 0, .atol = 0}, "at " + std::to_string(at));
  EXPECT_THROW(call(7), Error);
  expect_allclose(call(2), f(tensor(int64_t{2}), w), {.rtol = 0, .atol = 0}, "after the raise");
}
