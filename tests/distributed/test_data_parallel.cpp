// Data-parallel training is training on the combined batch (docs/DISTRIBUTED.md,
// "Equivalence"). Run as 1 process and under `mpirun -np N`, N = 2 and 3 (tests/CMakeLists.txt):
// each process trains a small MLP with Adam for 20 steps under pmap on its B/N examples of every
// batch, pmean-ing the gradients, and also computes itself the reference, the same training on the
// whole batch of B in one process (jit, no collectives). The parameters must agree within a
// float32 round-off bound derived below, and every process must hold bitwise the same ones.
// The same training with the state sharded (ZeRO stages 1-3, kiln/zero.h) must stay within the
// same bound, stage 1 bitwise equal to plain data parallelism.
// Every process runs every test (they meet in collectives); mpi_main.cpp has process 0 report.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kiln/distributed.h"
#include "kiln/kiln.h"
#include "kiln/optim.h"
#include "kiln/zero.h"

using namespace kiln;

namespace {

constexpr int64_t kBatch = 24;  // B: divisible by 2 and 3
constexpr int64_t kIn = 8, kHidden = 16, kClasses = 4;
constexpr int kSteps = 20;
constexpr double kLr = 1e-2, kB1 = 0.9, kB2 = 0.999, kEps = 1e-8;
constexpr double kUnit = 0x1p-24;  // float32's unit round-off u

struct Mlp {
  nn::Linear hidden, out;
  Tensor operator()(const Tensor& x) const { return out(tanh(hidden(x))); }
};
KILN_TREE(Mlp, hidden, out);

Tensor loss(const Mlp& p, const Tensor& x, const Tensor& y) { return nn::cross_entropy(p(x), y); }

// The training data: kSteps batches of B examples ([kSteps, B, kIn], [kSteps, B]), labelled by
// a random linear teacher, the same on every process.
struct Data {
  Tensor x, y;
};
Data make_data() {
  const Tensor k = random::split(random::key(16), 2);
  const Tensor x = random::normal(index(k, 0), {kSteps, kBatch, kIn});
  const Tensor teacher = random::normal(index(k, 1), {kIn, kClasses});
  return {x, argmax(matmul(x, teacher), -1)};
}

// Process p's part of a batch: examples p, p + N, p + 2N, ... (as demo --data-parallel shards).
Tensor part(const Tensor& batch, int p, int n) {
  return take(batch, arange(double(p), double(kBatch), double(n), int64), 0);
}

// The leaves of a tree, in flatten order, as one list of numbers.
template <class T>
std::vector<double> values(const T& tree) {
  std::vector<double> out;
  for (const Tensor& leaf : tree_flatten(tree).first)
    for (const float v : leaf.to_vector<float>()) out.push_back(v);
  return out;
}

const optim::Optimizer& adam() {
  static const optim::Optimizer opt = optim::adam({.lr = kLr, .b1 = kB1, .b2 = kB2, .eps = kEps});
  return opt;
}

// One Adam step on the gradients `combine`d over the processes: the code both runs share.
struct State {
  Mlp params;
  optim::OptState<Mlp> opt;
};
KILN_TREE(State, params, opt);
template <class Combine>
State step(const State& s, const Tensor& x, const Tensor& y, const Combine& combine) {
  const Mlp grads = tree_map(combine, grad(loss)(s.params, x, y));
  auto [params, opt] = adam().update(s.params, grads, s.opt);
  return {params, opt};
}

State initial_state() {
  const Tensor k = random::split(random::key(3), 2);
  Mlp p{nn::Linear(kIn, kHidden, index(k, 0)), nn::Linear(kHidden, kClasses, index(k, 1))};
  return {p, adam().init(p)};
}

Tensor identity(const Tensor& t) { return t; }
Tensor mean_over_processes(const Tensor& t) { return pmean(t, "dp"); }

// (1/B) sum_i |gradient of example i's loss|, elementwise: the scale of the round-off in the
// batch gradient, a sum over the examples.
Mlp gradient_scale(const Mlp& p, const Tensor& x, const Tensor& y) {
  auto one = [](const Mlp& r, const Tensor& xi, const Tensor& yi) {
    return loss(r, expand_dims(xi, 0), expand_dims(yi, 0));
  };
  const Mlp each = vmap(grad(one), in_axes(none, 0, 0))(p, x, y);
  return tree_map([](const Tensor& g) { return mean(abs(g), {0}); }, each);
}

// ---- the round-off bound ---------------------------------------------------------------------
//
// The two runs do the same float32 operations on the same values except in the reductions
// over the batch: the reference sums B per-example terms into each gradient element (and
// scales by 1/B); the data-parallel run sums B/N of them on each process, scales by N/B, adds
// the N partial sums (MPI_Allreduce) and scales by 1/N. A float32 sum of n terms is within
// γ_n Σ|terms| of the exact sum (γ_n = n u / (1 - n u), Higham, Accuracy and Stability §4.2),
// and each scaling adds one rounding; the per-example terms themselves come from the backward
// pass through the two layers (dot products of at most kHidden terms) started from
// differently rounded 1/B and N/B. So the two gradients of one step differ elementwise by at
// most
//     Δg = 2 γ_n S,   n = B + kHidden + 3,   S = (1/B) Σ_i |∇ loss_i|        (1)
// (the 2: each run is within γ_n S of the exact gradient). GradientsMatchTheCombinedBatch
// checks (1) at every step, both gradients taken at the same parameters.
//
// Adam turns gradients into steps through m = β1 m + (1-β1) g, v = β2 v + (1-β2) g²,
// θ -= lr m̂ / (√v̂ + ε). Interval arithmetic carries the gradients' uncertainty [g - Δg,
// g + Δg] through those formulas exactly (in float64, along the reference trajectory): the
// width of the step's interval bounds how far the two runs' steps can differ. Summed over
// the steps, plus the float32 rounding of the updates themselves, it bounds |θ_dp - θ_ref|:
// each run rounds θ (u |θ| per step) and carries m, v with relative errors that grow by about
// 2u a step (≤ 40 u after 20), so the step m̂/(√v̂+ε) by ≤ 2 · (40 + 6) u of it: 4 u |θ| +
// 96 u lr |m̂/(√v̂+ε)| per step for the two runs.
// The bound is first order. A parameter difference δθ also changes the next gradients, by
// H δθ (H the loss's Hessian); the intervals use 2 Δg, and FeedbackStaysWithinTheBound checks
// that |H δθ| ≤ Δg at every step (H δθ by jvp of the gradient along θ_dp - θ_ref).
struct RoundOffBound {
  std::vector<double> m_lo, m_hi, v_lo, v_hi, width;
  int t = 0;

  explicit RoundOffBound(std::size_t n) : m_lo(n), m_hi(n), v_lo(n), v_hi(n), width(n) {}
  // One step with gradients g ± delta at parameters theta.
  void step(const std::vector<double>& g, const std::vector<double>& delta,
            const std::vector<double>& theta) {
    ++t;
    const double bc1 = 1 - std::pow(kB1, t), bc2 = std::sqrt(1 - std::pow(kB2, t));
    for (std::size_t e = 0; e < g.size(); ++e) {
      const double lo = g[e] - delta[e], hi = g[e] + delta[e];
      m_lo[e] = kB1 * m_lo[e] + (1 - kB1) * lo;
      m_hi[e] = kB1 * m_hi[e] + (1 - kB1) * hi;
      const double sq_lo = lo <= 0 && hi >= 0 ? 0 : std::min(lo * lo, hi * hi);
      v_lo[e] = kB2 * v_lo[e] + (1 - kB2) * sq_lo;
      v_hi[e] = kB2 * v_hi[e] + (1 - kB2) * std::max(lo * lo, hi * hi);
      const double den_lo = std::sqrt(v_lo[e]) / bc2 + kEps,
                   den_hi = std::sqrt(v_hi[e]) / bc2 + kEps;
      const double mh_lo = m_lo[e] / bc1, mh_hi = m_hi[e] / bc1;
      const double d_lo = mh_lo >= 0 ? mh_lo / den_hi : mh_lo / den_lo;
      const double d_hi = mh_hi >= 0 ? mh_hi / den_lo : mh_hi / den_hi;
      const double d = std::max(std::abs(d_lo), std::abs(d_hi));
      width[e] += kLr * (d_hi - d_lo) + 4 * kUnit * std::abs(theta[e]) + 96 * kUnit * kLr * d;
    }
  }
};

double gamma(double n) { return n * kUnit / (1 - n * kUnit); }
constexpr double kTerms = kBatch + kHidden + 3;

// ---- the runs --------------------------------------------------------------------------------

struct Runs {
  State parallel, reference;
  RoundOffBound bound{0};
  double worst_gradient_ratio = 0;  // max over steps and elements of |g_dp - g_ref| / Δg
  double worst_feedback_ratio = 0;  // max over steps and elements of |H δθ| / Δg
};

// max(worst, |a - b| / limit) over the elements (|a| / limit without b).
double worst_ratio(double worst, const std::vector<double>& a, const std::vector<double>& b,
                   const std::vector<double>& limit) {
  for (std::size_t e = 0; e < a.size(); ++e)
    worst = std::max(worst, std::abs(a[e] - (b.empty() ? 0 : b[e])) /
                                std::max(limit[e], std::numeric_limits<double>::min()));
  return worst;
}

const Runs& runs() {
  static const Runs r = [] {
    const int rank = distributed::process_index(), n = distributed::process_count();
    const Data data = make_data();
    auto reference_step = jit(
        [](const State& s, const Tensor& x, const Tensor& y) { return step(s, x, y, identity); });
    auto parallel_step = pmap([](const State& s, const Tensor& x,
                                 const Tensor& y) { return step(s, x, y, mean_over_processes); },
                              axis_name("dp"), in_axes(none, 0, 0), out_axes(none));
    auto reference_grad = jit(grad(loss));
    auto scale = jit(gradient_scale);
    auto parallel_grad =
        pmap([](const Mlp& p, const Tensor& x,
                const Tensor& y) { return tree_map(mean_over_processes, grad(loss)(p, x, y)); },
             axis_name("dp"), in_axes(none, 0, 0), out_axes(none));

    Runs out{initial_state(), initial_state(),
             RoundOffBound(values(initial_state().params).size())};
    for (int t = 0; t < kSteps; ++t) {
      const Tensor x = index(data.x, t), y = index(data.y, t);
      const Tensor local_x = expand_dims(part(x, rank, n), 0);
      const Tensor local_y = expand_dims(part(y, rank, n), 0);
      // (1) at the data-parallel run's parameters.
      std::vector<double> delta = values(scale(out.parallel.params, x, y));
      for (double& d : delta) d *= 2 * gamma(kTerms);
      out.worst_gradient_ratio = worst_ratio(
          out.worst_gradient_ratio, values(parallel_grad(out.parallel.params, local_x, local_y)),
          values(reference_grad(out.parallel.params, x, y)), delta);
      // The bound's intervals along the reference trajectory, and H δθ there.
      const Mlp& ref = out.reference.params;
      delta = values(scale(ref, x, y));
      for (double& d : delta) d *= 2 * gamma(kTerms);
      const Mlp diff = tree_map([](const Tensor& a, const Tensor& b) { return a - b; },
                                out.parallel.params, ref);
      auto gradient_at = [&](const Mlp& p) { return grad(loss)(p, x, y); };
      const std::vector<double> feedback =
          values(jvp(gradient_at, std::tuple{ref}, std::tuple{diff}).second);
      out.worst_feedback_ratio = worst_ratio(out.worst_feedback_ratio, feedback, {}, delta);
      for (double& d : delta) d *= 2;
      out.bound.step(values(reference_grad(ref, x, y)), delta, values(ref));

      out.parallel = parallel_step(out.parallel, local_x, local_y);
      out.reference = reference_step(out.reference, x, y);
    }
    return out;
  }();
  return r;
}

// ---- sharded state (ZeRO) --------------------------------------------------------------------

// A process's part of a tree travels through pmap with a leading axis of 1.
template <class T>
T local(const T& tree) {
  return tree_map([](const Tensor& t) { return expand_dims(t, 0); }, tree);
}
template <class T>
T unlocal(const T& tree) {
  return tree_map([](const Tensor& t) { return index(t, 0); }, tree);
}

// The step of a sharded run: parameters full (stages 1, 2) or this process's pieces (3); the
// optimiser state this process's pieces.
struct ZeroState {
  Mlp params;
  optim::OptState<Mlp> opt;
};

// `steps` steps of `opt` sharded at `stage` over the processes; returns the full parameters
// (the same on every process) and this process's state.
ZeroState train_sharded(const optim::Optimizer& opt, int stage, int steps) {
  const int rank = distributed::process_index(), n = distributed::process_count();
  const Data data = make_data();
  const Mlp start = initial_state().params;
  const distributed::Zero zero(opt, stage, "dp", distributed::ShardLayout(start, n));
  auto sharded_step = [zero](const Mlp& p, const optim::OptState<Mlp>& o, const Tensor& x,
                             const Tensor& y) {
    const Mlp g = zero.stage() == 3 ? grad([&](const Mlp& pieces) {
      return loss(distributed::gather(pieces, zero.layout(), "dp"), x, y);
    })(p)
                                    : grad(loss)(p, x, y);
    return zero.update(p, g, o);
  };
  const std::size_t leaves = tree_leaves(start).size();
  const std::size_t state_leaves = tree_leaves(zero.init(start, rank)).size();
  std::vector<std::optional<int>> out(leaves, stage == 3 ? std::optional<int>(0) : std::nullopt);
  out.resize(leaves + state_leaves, 0);
  auto parallel =
      pmap(sharded_step, axis_name("dp"),
           in_axes(stage == 3 ? std::optional<int>(0) : std::nullopt, 0, 0, 0), OutAxes{out});
  ZeroState s{stage == 3 ? local(distributed::shard(start, zero.layout(), rank)) : start,
              local(zero.init(start, rank))};
  for (int t = 0; t < steps; ++t) {
    const Tensor x = index(data.x, t), y = index(data.y, t);
    std::tie(s.params, s.opt) = parallel(s.params, s.opt, expand_dims(part(x, rank, n), 0),
                                         expand_dims(part(y, rank, n), 0));
  }
  if (stage == 3) {
    auto gather = pmap(
        [&zero](const Mlp& pieces) { return distributed::gather(pieces, zero.layout(), "dp"); },
        axis_name("dp"), out_axes(none));
    s.params = gather(s.params);
  }
  s.opt = unlocal(s.opt);
  return s;
}

TEST(Zero, StageOneIsDataParallelismBitwise) {
  // The same pmean-ed gradients and the same elementwise Adam, on pieces: the same bits.
  const std::vector<double> zero = values(train_sharded(adam(), 1, kSteps).params),
                            dp = values(runs().parallel.params);
  ASSERT_EQ(zero.size(), dp.size());
  for (std::size_t e = 0; e < dp.size(); ++e)
    ASSERT_EQ(std::bit_cast<uint64_t>(zero[e]), std::bit_cast<uint64_t>(dp[e]))
        << "parameter " << e;
}

TEST(Zero, EveryStageTrainsLikeOneProcessOnTheCombinedBatch) {
  // Stages 2 and 3 reduce-scatter the gradients: the cross-process sums may be ordered
  // differently from the all-reduce's, which the bound covers.
  const Runs& r = runs();
  const std::vector<double> ref = values(r.reference.params);
  for (const int stage : {1, 2, 3}) {
    const std::vector<double> zero = values(train_sharded(adam(), stage, kSteps).params);
    for (std::size_t e = 0; e < ref.size(); ++e)
      ASSERT_LE(std::abs(zero[e] - ref[e]), r.bound.width[e])
          << "stage " << stage << ", parameter " << e << ": sharded " << zero[e] << ", one process "
          << ref[e];
  }
}

// `steps` steps of `opt`, data-parallel with pmean: what every sharded run must match.
Mlp train_data_parallel(const optim::Optimizer& opt, int steps) {
  const int rank = distributed::process_index(), n = distributed::process_count();
  const Data data = make_data();
  State s = initial_state();
  s.opt = opt.init(s.params);
  auto parallel = pmap(
      [&opt](const State& st, const Tensor& x, const Tensor& y) {
        const Mlp g = tree_map(mean_over_processes, grad(loss)(st.params, x, y));
        auto [params, next] = opt.update(st.params, g, st.opt);
        return State{params, next};
      },
      axis_name("dp"), in_axes(none, 0, 0), out_axes(none));
  for (int t = 0; t < steps; ++t)
    s = parallel(s, expand_dims(part(index(data.x, t), rank, n), 0),
                 expand_dims(part(index(data.y, t), rank, n), 0));
  return s.params;
}

TEST(Zero, MatchesDataParallelismWithAnyOptimiser) {
  // SGD with momentum is not invariant to the gradients' scale (Adam is), so it sees a sum in
  // place of a mean; AdamW clipped by global norm, tight enough to clip every step, checks
  // that the sharded run adds up its pieces' squares over the processes. Against the same
  // optimiser data-parallel: the runs differ in the order of the cross-process sums only.
  const std::vector<optim::Optimizer> optimizers = {
      optim::sgd({.lr = 0.1, .momentum = 0.9}), optim::adamw({.lr = kLr,
                                                              .weight_decay = 0.1,
                                                              .decay_on = optim::DecayOn::matrices,
                                                              .clip_norm = 0.05})};
  const std::vector<double> start = values(initial_state().params);
  for (const optim::Optimizer& opt : optimizers) {
    const std::vector<double> want = values(train_data_parallel(opt, kSteps));
    double moved = 0;
    for (std::size_t e = 0; e < want.size(); ++e)
      moved = std::max(moved, std::abs(want[e] - start[e]));
    for (const int stage : {1, 2, 3}) {
      const std::vector<double> got = values(train_sharded(opt, stage, kSteps).params);
      for (std::size_t e = 0; e < want.size(); ++e)
        ASSERT_NEAR(got[e], want[e], 1e-5 * moved)
            << opt.name() << ", stage " << stage << ", parameter " << e;
    }
  }
}

TEST(Zero, EachProcessHoldsItsShareOfTheState) {
  // Per process, the optimiser state (and under stage 3 the parameters) is 1/N of the full
  // state, plus at most one padding element per leaf.
  const int n = distributed::process_count();
  const Mlp start = initial_state().params;
  int64_t full = 0, leaves = 0;
  for (const Tensor& t : tree_leaves(start)) full += t.numel() * 4, ++leaves;
  for (const int stage : {2, 3}) {
    const ZeroState s = train_sharded(adam(), stage, 1);
    int64_t held = 0;
    for (const auto& [name, slot] : s.opt.slots)
      for (const Tensor& t : tree_leaves(slot)) held += t.numel() * 4;
    EXPECT_LE(held, 2 * (full / n + leaves * 4)) << "stage " << stage;
    EXPECT_GE(held, 2 * full / n) << "stage " << stage;
  }
}

TEST(Zero, RejectsALayoutOfAnotherProcessCount) {
  const int n = distributed::process_count();
  const Mlp start = initial_state().params;
  const distributed::ShardLayout wrong(start, n + 1);
  auto gather =
      pmap([&wrong](const Mlp& pieces) { return distributed::gather(pieces, wrong, "dp"); },
           axis_name("dp"), out_axes(none));
  try {
    gather(local(distributed::shard(start, wrong, 0)));
    FAIL() << "gathered a layout of " << n + 1 << " parts over " << n << " processes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the shard layout has " + std::to_string(n + 1)),
              std::string::npos)
        << e.what();
  }
}

TEST(DataParallel, GradientsMatchTheCombinedBatch) {
  // The pmean of the processes' gradients is the combined batch's gradient within (1) at
  // every step: also the check that each process took its own part and that pmean (not psum)
  // combined them, which Adam's scale invariance would hide from the parameters.
  EXPECT_LE(runs().worst_gradient_ratio, 1.0);
}

TEST(DataParallel, FeedbackStaysWithinTheBound) {
  // The assumption that makes the parameter bound hold: H δθ ≤ Δg (see above).
  EXPECT_LE(runs().worst_feedback_ratio, 1.0);
}

TEST(DataParallel, TrainsLikeOneProcessOnTheCombinedBatch) {
  const Runs& r = runs();
  const std::vector<double> dp = values(r.parallel.params), ref = values(r.reference.params),
                            start = values(initial_state().params);
  double worst = 0, moved = 0;
  for (std::size_t e = 0; e < dp.size(); ++e) {
    EXPECT_LE(std::abs(dp[e] - ref[e]), r.bound.width[e])
        << "parameter " << e << ": data-parallel " << dp[e] << ", one process " << ref[e];
    worst = std::max(worst, std::abs(dp[e] - ref[e]));
    moved = std::max(moved, std::abs(ref[e] - start[e]));
  }
  // The bound must be far below what training moves the parameters, or it checks nothing.
  const double widest = *std::max_element(r.bound.width.begin(), r.bound.width.end());
  EXPECT_LT(widest, 1e-2 * moved);
  if (distributed::process_index() == 0)
    std::printf(
        "%d processes: largest difference %.3g, largest bound %.3g, largest move %.3g; "
        "gradients within %.3g of (1), H δθ within %.3g\n",
        distributed::process_count(), worst, widest, moved, r.worst_gradient_ratio,
        r.worst_feedback_ratio);
}

TEST(DataParallel, EveryProcessHoldsTheSameParameters) {
  // Each process's parameters, gathered: every row bitwise equal to this process's own.
  std::vector<Tensor> flat;
  for (const Tensor& leaf : tree_flatten(runs().parallel).first)
    flat.push_back(reshape(astype(leaf, float64), {-1}));
  auto gather =
      pmap([](const Tensor& t) { return all_gather(t, "dp"); }, axis_name("dp"), out_axes(none));
  const Tensor all = gather(expand_dims(concatenate(flat), 0));
  const int64_t n = all.shape()[0], size = all.shape()[1];
  ASSERT_EQ(n, distributed::process_count());
  const std::vector<double> v = all.to_vector<double>();
  const int rank = distributed::process_index();
  for (int64_t p = 0; p < n; ++p)
    for (int64_t e = 0; e < size; ++e)
      ASSERT_EQ(std::bit_cast<uint64_t>(v[p * size + e]),
                std::bit_cast<uint64_t>(v[rank * size + e]))
          << "process " << p << " differs from process " << rank << " at value " << e;
}

}  // namespace
