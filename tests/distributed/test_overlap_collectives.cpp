// Overlapping collectives with computation (docs/DESIGN.md, "Overlapping collectives"): in
// what jit compiles, each all-gather over processes starts one gather early and is waited for
// where it was, and each reduce-scatter is waited for where its result is needed. Checked on a
// ZeRO-3 step of a deep MLP whose layers are gathered inside checkpoints (as the GPT's blocks):
// the schedule the pass makes, the same bits as running every collective in place, and the
// compiled steps that run it. Run as 1 process (no collectives: nothing to do) and under
// mpirun with 2 and 3.
#include <gtest/gtest.h>
#include <kiln/kiln.h>
#include <kiln/profile.h>
#include <kiln/zero.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "../testing.h"
#include "distributed/overlap_collectives.h"

namespace kiln {
namespace {

using testing::expect_allclose;

constexpr int64_t kWidth = 32, kLayers = 5;

struct Deep {
  std::vector<nn::Linear> layers;
};
KILN_TREE(Deep, layers);

using testing::EnvVar;

class ZeroStep {
 public:
  ZeroStep()
      : full_(make_model()),
        layout_(full_, distributed::process_count()),
        zero_(optim::adamw({.lr = 1e-2}), 3, "dp", layout_) {
    for (const nn::Linear& l : full_.layers)
      layer_layouts_.emplace_back(l, distributed::process_count());
  }

  // The step under pmap: pieces and optimiser state in, updated pieces and state out.
  auto compiled() const {
    return pmap(
        [this](const Deep& pieces, const optim::OptState<Deep>& o, const Tensor& xs) {
          const Deep g = grad([&](const Deep& q) {
            Tensor h = xs;
            for (std::size_t l = 0; l < q.layers.size(); ++l)
              h = checkpoint(
                  [&, l](const nn::Linear& w, const Tensor& in) {
                    return tanh(distributed::gather(w, layer_layouts_[l], "dp")(in));
                  },
                  CheckpointPolicy{{"all_gather"}})(q.layers[l], h);
            return sum(square(h));
          })(pieces);
          return zero_.update(pieces, g, o);
        },
        axis_name("dp"), in_axes(0, 0, 0), out_axes(0));
  }

  Deep pieces() const {
    return tree_map([](const Tensor& t) { return expand_dims(t, 0); },
                    distributed::shard(full_, layout_, distributed::process_index()));
  }
  optim::OptState<Deep> state() const {
    return tree_map([](const Tensor& t) { return expand_dims(t, 0); },
                    zero_.init(full_, distributed::process_index()));
  }
  Tensor batch(int step) const {
    return expand_dims(
        random::normal(random::key(100 + step * 7 + distributed::process_index()), {2, kWidth}), 0);
  }

 private:
  static Deep make_model() {
    const Tensor keys = random::split(random::key(3), kLayers);
    Deep d;
    for (int64_t l = 0; l < kLayers; ++l) d.layers.emplace_back(kWidth, kWidth, index(keys, l));
    return d;
  }

  Deep full_;
  distributed::ShardLayout layout_;
  std::vector<distributed::ShardLayout> layer_layouts_;
  distributed::Zero zero_;
};

// Positions of one collective's starts and dones in f, in program order.
struct Schedule {
  std::vector<std::size_t> starts, dones;
  int64_t whole = 0;  // the collective left in one piece
  bool dones_read_starts = true;
};
Schedule schedule_of(const ir::Function& f, const std::string& collective) {
  Schedule s;
  std::vector<int> started;
  for (std::size_t i = 0; i < f.equations.size(); ++i) {
    const ir::Equation& e = f.equations[i];
    if (e.prim->name == collective) ++s.whole;
    if (e.prim->name == collective + "_start") {
      s.starts.push_back(i);
      started.push_back(e.outputs[0].id);
    }
    if (e.prim->name == collective + "_done") {
      // The k-th done reads the k-th start's result.
      const std::size_t k = s.dones.size();
      s.dones_read_starts =
          s.dones_read_starts && k < started.size() && e.inputs[0].id == started[k];
      s.dones.push_back(i);
    }
  }
  return s;
}

bool products_between(const ir::Function& f, std::size_t from, std::size_t to) {
  for (std::size_t i = from + 1; i < to; ++i)
    if (f.equations[i].prim->flops) return true;
  return false;
}

// The step as jit compiles it before the pass: checkpoints inlined.
ir::Function inlined_step() {
  const ZeroStep z;
  return ir::inline_calls(z.compiled().lower(z.pieces(), z.state(), z.batch(0)));
}

ir::Function overlapped(const ir::Function& inlined) {
  const ir::Function f = distributed::overlap_collectives(inlined);
  ir::verify(f);
  return f;
}

TEST(OverlapCollectives, EachGatherStartsWhileThePreviousLayerComputes) {
  const ir::Function lowered = inlined_step();
  const int64_t gathers = schedule_of(lowered, "process_all_gather").whole;
  if (distributed::process_count() == 1) {
    EXPECT_EQ(gathers, 0) << "one process holds the whole axis: nothing to gather";
    // Nothing to overlap: the function comes back as it is, calls not inlined.
    const ZeroStep z;
    const ir::Function f = z.compiled().lower(z.pieces(), z.state(), z.batch(0));
    EXPECT_EQ(ir::print(distributed::overlap_collectives(f)), ir::print(f));
    return;
  }
  // Each layer gathered in the forward pass and again in the backward pass.
  EXPECT_EQ(gathers, 2 * kLayers);
  for (const char* ahead : {"1", "2"}) {
    const EnvVar env("KILN_GATHER_AHEAD", ahead);
    const int depth = std::atoi(ahead);
    const ir::Function f = overlapped(lowered);
    const Schedule s = schedule_of(f, "process_all_gather");
    EXPECT_EQ(s.whole, 0) << "every gather split (ahead " << ahead << ")";
    ASSERT_EQ(static_cast<int64_t>(s.starts.size()), gathers);
    ASSERT_EQ(static_cast<int64_t>(s.dones.size()), gathers);
    EXPECT_TRUE(s.dones_read_starts);
    for (std::size_t k = 0; k < s.dones.size(); ++k) {
      EXPECT_LT(s.starts[k], s.dones[k]) << "gather " << k;
      // Started once the gather `depth` before it is done, not before: no more in flight ...
      const std::size_t earliest = k >= static_cast<std::size_t>(depth) ? s.dones[k - depth] : 0;
      if (k >= static_cast<std::size_t>(depth)) {
        EXPECT_GT(s.starts[k], earliest) << "gather " << k << ", ahead " << ahead;
      }
      // ... and right after it, with what its operand needs (the layer's pieces concatenated,
      // hoisted with it): no product waits ahead of it.
      EXPECT_FALSE(products_between(f, earliest, s.starts[k]))
          << "gather " << k << " starts late (ahead " << ahead << ")";
      // Between a layer's start and its done, a layer computes: its products hide the gather.
      if (k > 0) {
        EXPECT_TRUE(products_between(f, s.starts[k], s.dones[k]))
            << "gather " << k << " hides behind nothing (ahead " << ahead << ")";
      }
    }
  }
  const EnvVar off("KILN_GATHER_AHEAD", "0");
  EXPECT_EQ(schedule_of(overlapped(lowered), "process_all_gather").whole, gathers)
      << "KILN_GATHER_AHEAD=0: gathers in place";
}

// The backward pass reduce-scatters each layer's gradient as it is made; its result is needed
// only by the update, so it is waited for late: once the next layer's scatter has started, and
// at the latest before the one after starts (two in flight, whose operands are whole
// gradients).
TEST(OverlapCollectives, EachScatterIsWaitedForLate) {
  const ir::Function lowered = inlined_step();
  const int64_t scatters = schedule_of(lowered, "process_reduce_scatter").whole;
  if (distributed::process_count() == 1) {
    EXPECT_EQ(scatters, 0);
    return;
  }
  EXPECT_EQ(scatters, kLayers);
  const ir::Function f = overlapped(lowered);
  const Schedule s = schedule_of(f, "process_reduce_scatter");
  EXPECT_EQ(s.whole, 0);
  ASSERT_EQ(static_cast<int64_t>(s.starts.size()), scatters);
  ASSERT_EQ(static_cast<int64_t>(s.dones.size()), scatters);
  EXPECT_TRUE(s.dones_read_starts);
  for (std::size_t k = 0; k + 1 < s.starts.size(); ++k) {
    EXPECT_GT(s.dones[k], s.starts[k + 1]) << "scatter " << k;
    if (k + 2 < s.starts.size()) EXPECT_LT(s.dones[k], s.starts[k + 2]) << "scatter " << k;
    // The next layer's gradient is computed meanwhile.
    EXPECT_TRUE(products_between(f, s.starts[k], s.dones[k])) << "scatter " << k;
  }

  const EnvVar off("KILN_DEFER_SCATTERS", "0");
  EXPECT_EQ(schedule_of(overlapped(lowered), "process_reduce_scatter").whole, scatters)
      << "KILN_DEFER_SCATTERS=0: scatters in place";
}

TEST(OverlapCollectives, SameBitsAsInPlace) {
  const ZeroStep z;
  struct Run {
    Deep pieces;
    optim::OptState<Deep> state;
  };
  auto train = [&](const char* ahead, const char* defer) {
    const EnvVar a("KILN_GATHER_AHEAD", ahead), d("KILN_DEFER_SCATTERS", defer);
    const auto step = z.compiled();
    Run r{z.pieces(), z.state()};
    for (int s = 0; s < 3; ++s) std::tie(r.pieces, r.state) = step(r.pieces, r.state, z.batch(s));
    return tree_leaves(r.pieces);
  };
  const std::vector<Tensor> in_place = train("0", "0");
  for (const auto& [ahead, defer] : {std::pair{"1", "1"}, {"3", "1"}, {"1", "0"}, {"0", "1"}}) {
    const std::vector<Tensor> got = train(ahead, defer);
    ASSERT_EQ(got.size(), in_place.size());
    for (std::size_t i = 0; i < got.size(); ++i)
      expect_allclose(got[i], in_place[i], {.rtol = 0, .atol = 0},
                      "piece " + std::to_string(i) + ", ahead " + ahead + ", defer " + defer);
  }
  // And the training moved them: the comparison is not of untouched weights.
  const std::vector<Tensor> initial = tree_leaves(z.pieces());
  EXPECT_GT(max(abs(in_place[0] - initial[0])).item<float>(), 0.0f);
}

// The compiled step runs the starts and dones as its own steps (what the profile reports).
TEST(OverlapCollectives, CompiledStepRunsStartsAndDones) {
  const ZeroStep z;
  const auto step = z.compiled();
  const Deep pieces = z.pieces();
  const optim::OptState<Deep> state = z.state();
  step(pieces, state, z.batch(0));
  const Profile p = profile([&] { step(pieces, state, z.batch(0)); });
  const auto steps = [&](const std::string& what) {
    int64_t n = 0;
    for (const ProfileRow& r : p.rows) n += r.what.rfind(what + " ", 0) == 0;
    return n;
  };
  const bool many = distributed::process_count() > 1;
  EXPECT_EQ(steps("process_all_gather_start"), many ? 2 * kLayers : 0);
  EXPECT_EQ(steps("process_all_gather_done"), many ? 2 * kLayers : 0);
  EXPECT_EQ(steps("process_reduce_scatter_start"), many ? kLayers : 0);
  EXPECT_EQ(steps("process_reduce_scatter_done"), many ? kLayers : 0);
  EXPECT_EQ(steps("process_all_gather"), 0);
  EXPECT_EQ(steps("process_reduce_scatter"), 0);
}

// Collectives inside a loop's body are overlapped within each iteration: a scan whose step
// gathers its weights, computes, and reduce-scatters, against the same program in place.
TEST(OverlapCollectives, LoopBodiesToo) {
  const int me = distributed::process_index();
  const Tensor w = random::normal(random::key(40 + me), {1, 2, 8});   // this process's rows
  const Tensor xs = random::normal(random::key(50 + me), {1, 4, 8});  // 4 steps
  const auto run = [&](const char* setting) {
    const EnvVar a("KILN_GATHER_AHEAD", setting), d("KILN_DEFER_SCATTERS", setting);
    const auto f = pmap(
        [](const Tensor& rows, const Tensor& steps) {
          return scan(
              [&](const Tensor& h, const Tensor& x) {
                const Tensor all = all_gather(rows, "dp");  // [processes, 2, 8]
                const Tensor y = tanh(matmul(all, reshape(h + x, {8, 1})));
                const Tensor mine = psum_scatter(y, "dp");  // this process's [2, 1]
                return std::pair{h + sum(mine), y};
              },
              zeros({8}), steps);
        },
        axis_name("dp"));
    const ir::Function lowered = f.lower(w, xs);
    const auto [h, ys] = f(w, xs);
    return std::tuple{h, ys, lowered};
  };
  const auto [h, ys, lowered] = run("1");
  const auto [h0, ys0, unused] = run("0");
  expect_allclose(h, h0, {.rtol = 0, .atol = 0}, "carry");
  expect_allclose(ys, ys0, {.rtol = 0, .atol = 0}, "outputs");
  // The scan's body is where the collectives are, and the pass reaches it.
  const EnvVar a("KILN_GATHER_AHEAD", "1");
  int64_t starts = 0;
  for (const ir::Equation& e : overlapped(ir::inline_calls(lowered)).equations)
    for (const auto& [name, attr] : e.attrs.items())
      if (const auto* body = std::get_if<FunctionRef>(&attr); body && *body)
        for (const ir::Equation& b : (*body)->equations) starts += b.prim->name.ends_with("_start");
  EXPECT_EQ(starts, distributed::process_count() > 1 ? 2 : 0);
}

// An invalid setting is ignored with a warning, as every KILN_* count is: the default holds.
TEST(OverlapCollectives, BadSettingKeepsTheDefault) {
  const ir::Function lowered = inlined_step();
  const Schedule want = schedule_of(overlapped(lowered), "process_all_gather");
  const EnvVar env("KILN_GATHER_AHEAD", "many");
  const Schedule got = schedule_of(overlapped(lowered), "process_all_gather");
  EXPECT_EQ(got.starts, want.starts);
  EXPECT_EQ(got.dones, want.dones);
}

}  // namespace
}  // namespace kiln
