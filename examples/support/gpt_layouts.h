// How the GPT job's training state lies over the processes, each way a Layout with one compiled
// step: the whole state in one process or replicated in every one (--data-parallel), its
// optimiser state and at stage 3 its weights in pieces (--zero, ZeRO/FSDP), or its blocks over
// a mesh (--tensor-parallel, Megatron's layout). Every layout takes the step's whole batch and
// gives the same training to within round-off; the whole state comes back on every process for
// evaluation, checkpoints and sampling (docs/DISTRIBUTED.md).
#pragma once

#include <kiln/distributed.h>
#include <kiln/kiln.h>
#include <kiln/optim.h>
#include <kiln/sharded_checkpoint.h>
#include <kiln/zero.h>

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gpt_model.h"

namespace gpt {

// What a checkpoint holds: "model.transformer.h.0.attn.c_attn.weight", "optimizer.slots.mu...".
struct TrainState {
  Model model;
  optim::OptState<Model> optimizer;
};
KILN_TREE(TrainState, model, optimizer);

// What every layout trains with.
struct Recipe {
  optim::AdamWOptions adamw;  // clipping included
  int64_t accum = 1;          // micro-batches per step, their gradients averaged
  double dropout = 0.0;
  DType compute = float32;  // what the forward and backward passes compute in
};

// The model's parameters in `dtype`: float32 master weights cast for a mixed-precision pass
// (the gradients flow back through the cast to float32).
inline Model cast(const Model& m, DType dtype) {
  return tree_map([dtype](const Tensor& p) { return astype(p, dtype); }, m);
}

// Rows [part * n, (part + 1) * n) of axis 1, with a leading axis of 1: this process's share of
// each batch [count, B, T], as pmap takes it.
inline Tensor share(const Tensor& x, int part, int parts) {
  const int64_t n = x.shape()[1] / parts;
  return expand_dims(slice(x, {Slice(), Slice(part * n, (part + 1) * n)}), 0);
}

// The loss and gradients of one step's micro-batches x[i], y[i], averaged, with respect to
// `params`, whose loss on a micro-batch loss_of(params, x, y, dropout) computes.
template <class LossOf>
std::pair<Tensor, Model> gradients(const Recipe& r, const Model& params, const Tensor& x,
                                   const Tensor& y, const Tensor& key, const LossOf& loss_of) {
  Tensor loss;
  Model grads;
  const Tensor keys = random::split(key, r.accum);
  for (int64_t i = 0; i < r.accum; ++i) {
    std::optional<Dropout> drop;
    if (r.dropout > 0) drop = Dropout{r.dropout, index(keys, i)};
    auto [l, g] = value_and_grad(
        [&](const Model& m) { return loss_of(m, index(x, i), index(y, i), drop); })(params);
    loss = i == 0 ? l : loss + l;
    grads = i == 0 ? g : tree_map([](const Tensor& a, const Tensor& b) { return a + b; }, grads, g);
  }
  if (r.accum > 1) {
    const double inv = 1.0 / static_cast<double>(r.accum);
    grads = tree_map([inv](const Tensor& g) { return g * inv; }, grads);
    loss = loss * inv;
  }
  return {loss, grads};
}

// The model's loss in the recipe's compute dtype.
inline auto model_loss(DType compute) {
  return
      [compute](const Model& m, const Tensor& x, const Tensor& y,
                const std::optional<Dropout>& drop) { return loss(cast(m, compute), x, y, drop); };
}

// A sharded checkpoint's first piece: the step count, written by process 0.
inline std::vector<distributed::Piece> step_pieces(const Tensor& step) {
  const distributed::Mesh replicas({{"processes", distributed::process_count()}});
  return distributed::block_pieces(step, {distributed::spec()}, replicas, "optimizer.step");
}
inline void append(std::vector<distributed::Piece>& out, std::vector<distributed::Piece> more) {
  for (distributed::Piece& p : more) out.push_back(std::move(p));
}

// The compiled functions of a layout that spreads the state: (this process's model, its
// optimiser state, x, y, dropout key) -> (the same, updated, and the loss); and the whole state
// from every process's parts.
using SpreadStep = std::function<std::tuple<Model, optim::OptState<Model>, Tensor>(
    const Model&, const optim::OptState<Model>&, const Tensor&, const Tensor&, const Tensor&)>;
using SpreadWhole = std::function<TrainState(const Model&, const optim::OptState<Model>&)>;

class Layout {
 public:
  virtual ~Layout() = default;
  // One training step on the step's windows x, y [accum, B, T] (every process passes all of
  // them and takes its share); the loss, the mean over the processes. Dropout's key is
  // random::key(key_seed) in one process; each process of data parallelism draws its own
  // masks for its rows, from random::key(key_seed + its index).
  virtual Tensor step(const Tensor& x, const Tensor& y, uint64_t key_seed) = 0;
  // The whole state, on every process (a collective where the state is spread).
  virtual TrainState whole() = 0;
  // Whether checkpoints are sharded (checkpoint/, each process writing pieces()) rather than
  // the whole state in one file.
  virtual bool sharded() const { return false; }
  virtual std::vector<distributed::Piece> pieces() { return {}; }
};

// The whole state in this process; with `data_parallel`, in every process, each taking its
// share of every batch, the gradients and the loss pmeaned over the processes ("dp").
class Replicated : public Layout {
 public:
  Replicated(TrainState state, const Recipe& r, bool data_parallel)
      : state_(std::move(state)), data_parallel_(data_parallel) {
    auto step = [r, opt = optim::adamw(r.adamw)](const TrainState& s, const Tensor& x,
                                                 const Tensor& y, const Tensor& key,
                                                 const auto& reduce) {
      auto [loss, grads] = gradients(r, s.model, x, y, key, model_loss(r.compute));
      grads = tree_map(reduce, grads);
      auto [model, optimizer] = opt.update(s.model, grads, s.optimizer);
      return std::pair{TrainState{model, optimizer}, reduce(loss)};
    };
    // Compiled once. Under data parallelism the results are the same on every process, so
    // they come back without pmap's axis.
    if (data_parallel)
      step_ = pmap(
          [step](const TrainState& s, const Tensor& x, const Tensor& y, const Tensor& key) {
            return step(s, x, y, key, [](const Tensor& t) { return pmean(t, "dp"); });
          },
          axis_name("dp"), in_axes(none, 0, 0, 0), out_axes(none));
    else
      step_ = jit(
          [step](const TrainState& s, const Tensor& x, const Tensor& y, const Tensor& key) {
            return step(s, x, y, key, [](const Tensor& t) { return t; });
          },
          "gpt_train_step");
  }

  Tensor step(const Tensor& x, const Tensor& y, uint64_t key_seed) override {
    const int rank = distributed::process_index(), n = distributed::process_count();
    const Tensor key = random::key(key_seed + static_cast<uint64_t>(rank));
    Tensor loss;
    if (!data_parallel_) {
      std::tie(state_, loss) = step_(state_, x, y, key);
      return loss;
    }
    std::tie(state_, loss) =
        step_(state_, share(x, rank, n), share(y, rank, n), expand_dims(key, 0));
    return loss;
  }
  TrainState whole() override { return state_; }

 private:
  TrainState state_;
  bool data_parallel_;
  std::function<std::pair<TrainState, Tensor>(const TrainState&, const Tensor&, const Tensor&,
                                              const Tensor&)>
      step_;
};

// ZeRO stage 1-3 over the processes ("dp"): this process holds its pieces of the optimiser state
// (slots with a leading axis of 1, as pmap takes per-process values; the step count is the
// same everywhere) and the whole weights, or at stage 3 its pieces of them.
class Zero : public Layout {
 public:
  Zero(const TrainState& state, const Recipe& r, int stage)
      : processes_(distributed::process_count()),
        rank_(distributed::process_index()),
        sharded_weights_(stage == 3),
        zero_(optim::adamw(r.adamw), stage, "dp",
              distributed::ShardLayout(state.model, processes_)) {
    const auto per_process = [](const Tensor& t) { return expand_dims(t, 0); };
    model_ = sharded_weights_
                 ? tree_map(per_process, distributed::shard(state.model, zero_.layout(), rank_))
                 : state.model;
    opt_ = zero_.shard_state(state.optimizer, rank_);
    for (auto& [name, slot] : opt_.slots) slot = tree_map(per_process, slot);

    // ZeRO-3's loss gathers the embeddings and the final LayerNorm for the whole step (the LM
    // head reads the token embedding last) and each block's weights only while the block runs.
    const auto outer = [](const Model& m) {
      return std::tuple{m.transformer.wte, m.transformer.wpe, m.transformer.ln_f};
    };
    const distributed::ShardLayout outer_layout(outer(state.model), processes_);
    std::vector<distributed::ShardLayout> block_layouts;
    for (const Block& b : state.model.transformer.h) block_layouts.emplace_back(b, processes_);
    const DType compute = r.compute;
    const auto to_compute = [compute](const Tensor& p) { return astype(p, compute); };
    const auto sharded_loss = [=](const Model& pieces, const Tensor& x, const Tensor& y,
                                  const std::optional<Dropout>& drop) {
      Model m = pieces;
      std::tie(m.transformer.wte, m.transformer.wpe, m.transformer.ln_f) =
          tree_map(to_compute, distributed::gather(outer(pieces), outer_layout, "dp"));
      return loss(m, x, y, drop, [&](int64_t l, const Block& held) {
        return tree_map(to_compute, distributed::gather(
                                        held, block_layouts[static_cast<std::size_t>(l)], "dp"));
      });
    };

    const std::optional<int> weights_axis =
        sharded_weights_ ? std::optional<int>(0) : std::optional<int>();
    const std::size_t model_leaves = tree_leaves(state.model).size();
    LeafAxes opt_axes{{std::nullopt}};  // the step, then the slots' pieces
    opt_axes.axes.resize(1 + state.optimizer.slots.size() * model_leaves, 0);
    OutAxes out{std::vector<std::optional<int>>(model_leaves, weights_axis)};
    out.axes.insert(out.axes.end(), opt_axes.axes.begin(), opt_axes.axes.end());
    out.axes.push_back(std::nullopt);  // the loss
    const distributed::Zero& zero = zero_;
    const bool sharded_weights = sharded_weights_;
    step_ = pmap(
        [=, &zero](const Model& params, const optim::OptState<Model>& o, const Tensor& x,
                   const Tensor& y, const Tensor& key) {
          auto [loss, grads] = sharded_weights
                                   ? gradients(r, params, x, y, key, sharded_loss)
                                   : gradients(r, params, x, y, key, model_loss(r.compute));
          auto [model, optimizer] = zero.update(params, grads, o);
          return std::tuple{model, optimizer, pmean(loss, "dp")};
        },
        axis_name("dp"), in_axes(weights_axis, opt_axes, 0, 0, 0), out);
    whole_ = pmap(
        [&zero, sharded_weights](const Model& params, const optim::OptState<Model>& o) {
          return TrainState{
              sharded_weights ? distributed::gather(params, zero.layout(), "dp") : params,
              zero.gather_state(o)};
        },
        axis_name("dp"), in_axes(weights_axis, opt_axes), out_axes(none));
  }
  Zero(const Zero&) = delete;  // the compiled functions refer to zero_
  Zero& operator=(const Zero&) = delete;

  Tensor step(const Tensor& x, const Tensor& y, uint64_t key_seed) override {
    const Tensor key = random::key(key_seed + static_cast<uint64_t>(rank_));
    Tensor loss;
    std::tie(model_, opt_, loss) = step_(model_, opt_, share(x, rank_, processes_),
                                         share(y, rank_, processes_), expand_dims(key, 0));
    return loss;
  }
  TrainState whole() override { return whole_(model_, opt_); }
  bool sharded() const override { return true; }
  // The step (process 0), the model (its pieces, or process 0 the whole), the slots' pieces.
  std::vector<distributed::Piece> pieces() override {
    std::vector<distributed::Piece> out = step_pieces(opt_.step);
    const distributed::Mesh replicas({{"processes", processes_}});
    const auto mine = [](const Tensor& t) { return index(t, 0); };  // without the process axis
    if (sharded_weights_)
      append(out,
             distributed::zero_pieces(tree_map(mine, model_), zero_.layout(), rank_, "model."));
    else
      append(out, distributed::block_pieces(model_,
                                            std::vector<distributed::Spec>(
                                                tree_leaves(model_).size(), distributed::spec()),
                                            replicas, "model."));
    for (const auto& [name, slot] : opt_.slots)
      append(out, distributed::zero_pieces(tree_map(mine, slot), zero_.layout(), rank_,
                                           "optimizer.slots." + name + "."));
    return out;
  }

 private:
  int processes_, rank_;
  bool sharded_weights_;
  distributed::Zero zero_;
  Model model_;
  optim::OptState<Model> opt_;
  SpreadStep step_;
  SpreadWhole whole_;
};

// Megatron's layout over the mesh's "model" axis, data parallelism over its "data" axis: this
// process holds its blocks of the model and of AdamW's moments (gpt_model.h, "tensor
// parallelism"). The step differentiates the whole shard_map and clips by the norm over every
// process's blocks, then updates the blocks. Dropout takes the one-process run's masks, each
// process its blocks of them, so every mesh trains as one process does.
class TensorParallel : public Layout {
 public:
  TensorParallel(const TrainState& state, const Recipe& r, const Config& config,
                 std::vector<distributed::MeshAxis> axes)
      : mesh_(std::move(axes)) {
    using distributed::LeafSpecs;
    using distributed::spec;
    const int64_t M = mesh_.size("model");
    if (config.vocab % M != 0)
      throw std::runtime_error(
          "--tensor-parallel splits the vocabulary of " + std::to_string(config.vocab) +
          " tokens over model=" + std::to_string(M) + ": expected a multiple of it");
    const std::vector<distributed::Spec> specs = parallel_specs(state.model, "model");
    std::vector<distributed::Spec> opt_specs{spec()};  // the step, then the slots
    for (std::size_t i = 0; i < state.optimizer.slots.size(); ++i)
      opt_specs.insert(opt_specs.end(), specs.begin(), specs.end());
    const DType compute = r.compute;
    const int64_t accum = r.accum;
    const double rate = r.dropout;
    // The masks of every micro-batch (none without dropout), laid out over the mesh.
    std::vector<distributed::Spec> mask_specs;
    if (rate > 0)
      for (int64_t i = 0; i < accum; ++i)
        for (const distributed::Spec& s : dropout_specs(config, "data", "model"))
          mask_specs.push_back(s);
    auto loss_of_blocks = shard_map(
        [compute, accum, rate](const Model& p, const Tensor& x, const Tensor& y,
                               const std::vector<DropoutMasks>& masks) {
          const Model pc = cast(p, compute);
          Tensor total;
          for (int64_t i = 0; i < accum; ++i) {
            const DropoutMasks* drop = rate > 0 ? &masks[static_cast<std::size_t>(i)] : nullptr;
            const Tensor l = parallel_loss(pc, index(x, i), index(y, i), "model", rate, drop);
            total = i == 0 ? l : total + l;
          }
          if (accum > 1) total = total * (1.0 / static_cast<double>(accum));
          return pmean(total, "data");
        },
        mesh_,
        distributed::in_specs(LeafSpecs{specs}, spec(none, "data"), spec(none, "data"),
                              LeafSpecs{mask_specs}),
        distributed::out_specs(spec()));
    // The sum of squares of the whole gradient: a split leaf's blocks add up over the model
    // axis, a replicated one counts once.
    auto squares = shard_map(
        [specs](const Model& g) {
          const std::vector<Tensor> leaves = tree_leaves(g);
          Tensor split = zeros({}), whole = zeros({});
          for (std::size_t i = 0; i < leaves.size(); ++i) {
            Tensor& into = specs[i].names("model") ? split : whole;
            into = into + sum(square(astype(leaves[i], float32)));
          }
          return psum(split, "model") + whole;
        },
        mesh_, distributed::in_specs(LeafSpecs{specs}), distributed::out_specs(spec()));
    // The same AdamW without its clipping, which needs every process's blocks.
    optim::AdamWOptions unclipped = r.adamw;
    unclipped.clip_norm = std::nullopt;
    const optim::Optimizer adamw = optim::adamw(unclipped);
    const std::optional<double> clip = r.adamw.clip_norm;
    const distributed::Mesh mesh = mesh_;  // a copy: the step must not refer to a member
    const int64_t D = mesh_.size("data");
    step_ = jit(
        [=](const Model& p, const optim::OptState<Model>& o, const Tensor& x, const Tensor& y,
            const Tensor& key) {
          // The one-process run's masks for the whole batch of each micro-batch, this
          // process's blocks of them.
          std::vector<DropoutMasks> masks;
          if (rate > 0) {
            const Tensor keys = random::split(key, accum);
            const int64_t B = x.shape()[1] * D, T = x.shape()[2];
            const std::vector<distributed::Spec> each = dropout_specs(config, "data", "model");
            for (int64_t i = 0; i < accum; ++i) {
              auto [leaves, def] =
                  tree_flatten(dropout_masks({rate, index(keys, i)}, B, T, config));
              for (std::size_t k = 0; k < leaves.size(); ++k)
                leaves[k] = distributed::local_block(leaves[k], mesh, each[k]);
              masks.push_back(tree_unflatten<DropoutMasks>(def, leaves));
            }
          }
          auto [loss, g] =
              value_and_grad([&](const Model& b) { return loss_of_blocks(b, x, y, masks); })(p);
          if (clip) {  // torch.nn.utils.clip_grad_norm_'s factor, as optim's clipping
            const Tensor coef = minimum(*clip / (sqrt(squares(g)) + 1e-6), 1.0);
            g = tree_map([&coef](const Tensor& t) { return t * astype(coef, t.dtype()); }, g);
          }
          auto [model, next] = adamw.update(p, g, o);
          return std::tuple{model, next, loss};
        },
        "gpt_train_step");
    whole_ = shard_map(
        [M](const Model& p, const optim::OptState<Model>& o) {
          TrainState s{parallel_whole(p, "model", M), {o.step, {}}};
          for (const auto& [name, slot] : o.slots)
            s.optimizer.slots.emplace(name, parallel_whole(slot, "model", M));
          return s;
        },
        mesh_, distributed::in_specs(LeafSpecs{specs}, LeafSpecs{opt_specs}),
        distributed::out_specs(spec()));
    blocks_ = parallel_blocks(state.model, mesh_, "model");
    opt_.step = state.optimizer.step;
    for (const auto& [name, slot] : state.optimizer.slots)
      opt_.slots.emplace(name, parallel_blocks(slot, mesh_, "model"));
  }

  Tensor step(const Tensor& x, const Tensor& y, uint64_t key_seed) override {
    const distributed::Spec rows = distributed::spec(none, "data");
    Tensor loss;
    std::tie(blocks_, opt_, loss) =
        step_(blocks_, opt_, distributed::local_block(x, mesh_, rows),
              distributed::local_block(y, mesh_, rows), random::key(key_seed));
    return loss;
  }
  TrainState whole() override { return whole_(blocks_, opt_); }
  bool sharded() const override { return true; }
  // The step (process 0), then the model's and each slot's blocks.
  std::vector<distributed::Piece> pieces() override {
    std::vector<distributed::Piece> out = step_pieces(opt_.step);
    append(out, parallel_pieces(blocks_, mesh_, "model", "model."));
    for (const auto& [name, slot] : opt_.slots)
      append(out, parallel_pieces(slot, mesh_, "model", "optimizer.slots." + name + "."));
    return out;
  }

 private:
  distributed::Mesh mesh_;
  Model blocks_;
  optim::OptState<Model> opt_;
  SpreadStep step_;
  SpreadWhole whole_;
};

}  // namespace gpt
