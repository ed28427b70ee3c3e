// What ZeRO-3 saves (docs/DISTRIBUTED.md, "Sharded training"): a process's memory during a
// training step is its 1/N of the parameters, gradients and optimiser state plus one layer's
// gathered weights, not the whole model's. Measured with memory_stats() around one compiled
// step of a deep, narrow MLP (the weights dominate: one example of activations), and against
// plain data parallelism, which needs every parameter's gradient and moments at once; with the
// collectives overlapped (the default), a layer more gathered ahead and two whole gradients
// waiting for their reduce-scatters. Run as 1 process and under `mpirun -np 2` and `-np 3`
// (tests/CMakeLists.txt).
#include <gtest/gtest.h>
#include <kiln/kiln.h>
#include <kiln/zero.h>

#include <cstdio>
#include <optional>
#include <vector>

#include "../testing.h"

using namespace kiln;

namespace {

constexpr int64_t kWidth = 256, kLayers = 16;

struct Deep {
  std::vector<nn::Linear> layers;
};
KILN_TREE(Deep, layers);

Deep make_model() {
  const Tensor keys = random::split(random::key(11), kLayers);
  Deep d;
  for (int64_t l = 0; l < kLayers; ++l) d.layers.emplace_back(kWidth, kWidth, index(keys, l));
  return d;
}

// Each layer's output through tanh; the loss is the last output's squared norm.
template <class Layer>
Tensor deep_loss(const Deep& d, const Tensor& x, const Layer& layer) {
  Tensor h = x;
  for (std::size_t l = 0; l < d.layers.size(); ++l) h = layer(l, d.layers[l], h);
  return sum(square(h));
}

int64_t bytes(const Deep& d) {
  int64_t n = 0;
  for (const Tensor& t : tree_leaves(d)) n += t.numel() * 4;
  return n;
}

// The most bytes in use during one call of `step` beyond those in use before it (the inputs
// included), after a first call that compiles.
template <class Step>
int64_t transient_bytes(const Step& step) {
  step();
  const int64_t before = memory_stats().bytes_in_use;
  reset_peak_memory_stats();
  step();
  return memory_stats().peak_bytes_in_use - before;
}

TEST(ZeroMemory, StageThreeHoldsItsShareAndOneLayer) {
  const int rank = distributed::process_index(), n = distributed::process_count();
  const Deep full = make_model();
  // SGD: no moments, so that the new parameters do not hide the backward pass's peak.
  const optim::Optimizer sgd = optim::sgd({.lr = 0.1});
  const Tensor x = expand_dims(random::normal(random::key(12), {1, kWidth}), 0);  // per process

  // Plain data parallelism: every process holds and updates everything.
  struct State {
    Deep params;
    optim::OptState<Deep> opt;
  };
  auto dp_step = pmap(
      [&sgd](const Deep& p, const optim::OptState<Deep>& o, const Tensor& xs) {
        const Deep g = tree_map(
            [](const Tensor& t) { return pmean(t, "dp"); }, grad([&](const Deep& q) {
              return deep_loss(q, xs, [](std::size_t, const nn::Linear& w, const Tensor& h) {
                return tanh(w(h));
              });
            })(p));
        return sgd.update(p, g, o);
      },
      axis_name("dp"), in_axes(none, none, 0), out_axes(none));
  Deep dp_params = full;
  optim::OptState<Deep> dp_opt = sgd.init(full);
  const int64_t dp =
      transient_bytes([&] { std::tie(dp_params, dp_opt) = dp_step(dp_params, dp_opt, x); });

  // ZeRO-3: pieces in, pieces out; each layer gathered under checkpoint, which recomputes
  // everything or, with the policy, only the gather.
  const distributed::ShardLayout layout(full, n);
  std::vector<distributed::ShardLayout> layer_layouts;
  for (const nn::Linear& l : full.layers) layer_layouts.emplace_back(l, n);
  const distributed::Zero zero(sgd, 3, "dp", layout);
  const auto local = [](const Tensor& t) { return expand_dims(t, 0); };
  auto zero_bytes = [&](const std::optional<CheckpointPolicy>& policy) {
    auto zero_step = pmap(
        [&](const Deep& pieces, const optim::OptState<Deep>& o, const Tensor& xs) {
          const Deep g = grad([&](const Deep& q) {
            return deep_loss(q, xs, [&](std::size_t l, const nn::Linear& held, const Tensor& h) {
              return checkpoint(
                  [&](const nn::Linear& w, const Tensor& in) {
                    return tanh(distributed::gather(w, layer_layouts[l], "dp")(in));
                  },
                  policy)(held, h);
            });
          })(pieces);
          return zero.update(pieces, g, o);
        },
        axis_name("dp"), in_axes(0, 0, 0), out_axes(0));
    Deep pieces = tree_map(local, distributed::shard(full, layout, rank));
    optim::OptState<Deep> zero_opt = tree_map(local, zero.init(full, rank));
    return transient_bytes([&] { std::tie(pieces, zero_opt) = zero_step(pieces, zero_opt, x); });
  };
  // The collectives in place: the least memory (docs/DISTRIBUTED.md, "Overlap").
  int64_t z3 = 0, z3_policy = 0, z3_keep_all = 0;
  {
    const kiln::testing::EnvVar ahead("KILN_GATHER_AHEAD", "0"), defer("KILN_DEFER_SCATTERS", "0");
    z3 = zero_bytes(std::nullopt);
    z3_policy = zero_bytes(CheckpointPolicy{{"all_gather"}});
    z3_keep_all = zero_bytes(CheckpointPolicy{});
  }
  // Overlapped, the default: the next layer gathered ahead, and up to two whole gradients
  // waiting for their reduce-scatters.
  const int64_t z3_overlapped = zero_bytes(std::nullopt);

  // The step's new parameters and its gradients, each 1/N, plus one layer's weights and their
  // full gradient before the reduce-scatter, with a layer to spare. (Without the checkpoint
  // every layer's gathered weights live until the backward pass: 4.48 MB against a bound of
  // 3.60 MB on 3 processes. On 2, 1/N of the new parameters and gradients is the model's size
  // and hides that difference.)
  const int64_t model = bytes(full), layer = kWidth * (kWidth + 1) * 4;
  const int64_t share = 2 * model / n + 2 * kLayers * 2 * 4;  // + padding
  const int64_t bound = share + 3 * layer;
  if (rank == 0)
    std::printf(
        "%d processes: model %.2f MB; one step's memory beyond its inputs: ZeRO-3 %.2f MB, "
        "keeping activations %.2f MB, keeping everything %.2f MB (bound %.2f MB), "
        "overlapped %.2f MB (bound %.2f MB), data parallelism %.2f MB\n",
        n, model / 1e6, z3 / 1e6, z3_policy / 1e6, z3_keep_all / 1e6, bound / 1e6,
        z3_overlapped / 1e6, (bound + 3 * layer) / 1e6, dp / 1e6);
  EXPECT_LE(z3, bound);
  EXPECT_LE(z3_overlapped, bound + 3 * layer);
  // The policy keeps each layer's activations (one example: 1 KB a layer), not its weights;
  // a policy that recomputes nothing keeps the gathered weights too, which shows on 3
  // processes (as without the checkpoint).
  EXPECT_LE(z3_policy, bound + kLayers * kWidth * 4 * 2);
  if (n > 2) EXPECT_GT(z3_keep_all, bound + kLayers * kWidth * 4 * 2);
  // Data parallelism needs the whole model's new parameters and gradients: the bound must tell the
  // two apart wherever there is something to save.
  if (n > 1) EXPECT_GT(dp, bound);
}

}  // namespace
