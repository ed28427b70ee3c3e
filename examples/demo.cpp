// `make demo`: trains a classifier on Fashion-MNIST with the native data pipeline and a jitted
// training step (value_and_grad of the loss + the optimiser update), evaluates it on the
// 10,000 test images after every epoch, and writes a checkpoint, a CSV of the metrics and an
// SVG of the training curves. `--resume DIR` continues from a checkpoint and reaches the same
// weights as an uninterrupted run. `--dtype bf16` (or f16) trains in mixed precision: float32
// master weights, the forward and backward passes in 16 bits, dynamic loss scaling for f16
// (docs/NN.md, "Mixed precision"). `mpirun -np N demo --data-parallel` trains on N processes:
// each takes 1/N of every batch, and pmap averages the gradients (docs/DISTRIBUTED.md,
// "Data-parallel training"). `demo --help` lists the flags.
#include <kiln/distributed.h>
#include <kiln/io.h>
#include <kiln/kiln.h>
#include <kiln/optim.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>
#include <string>

#include "support/mpirun.h"
#include "support/report.h"

using namespace kiln;
using mpirun::leader;
namespace fs = std::filesystem;

// ---- the model: an optional convolutional part, then fully connected layers ----------------

using Features = nn::Sequential<nn::Conv2d, nn::Activation, nn::MaxPool2d,  //
                                nn::Conv2d, nn::Activation, nn::MaxPool2d>;

struct Net {
  std::optional<Features> features;  // cnn only
  std::vector<nn::Linear> head;      // relu between the layers

  Tensor operator()(Tensor x) const {
    if (features) x = (*features)(x);
    x = nn::Flatten{}(x);
    for (std::size_t i = 0; i < head.size(); ++i) {
      x = head[i](x);
      if (i + 1 < head.size()) x = nn::relu(x);
    }
    return x;
  }
};
KILN_TREE(Net, features, head);

Net make_net(const std::string& kind, const Tensor& key) {
  const Tensor k = random::split(key, 4);
  if (kind == "mlp")
    return {std::nullopt,
            {nn::Linear(784, 512, index(k, 0)), nn::Linear(512, 512, index(k, 1)),
             nn::Linear(512, 10, index(k, 2))}};
  const nn::Conv2d::Options same{.padding = {1, 1}};
  return {Features(nn::Conv2d(1, 32, {3, 3}, index(k, 0), same), nn::ReLU(), nn::MaxPool2d{},
                   nn::Conv2d(32, 64, {3, 3}, index(k, 1), same), nn::ReLU(), nn::MaxPool2d{}),
          {nn::Linear(64 * 7 * 7, 128, index(k, 2)), nn::Linear(128, 10, index(k, 3))}};
}

// What a checkpoint holds: "model.features.0.weight", "optimizer.slots.mu.head.1.bias", ...
struct TrainState {
  Net model;  // float32 master weights, whatever --dtype computes in
  optim::OptState<Net> optimizer;
  std::optional<optim::LossScale> loss_scale;  // --dtype f16 only
};
KILN_TREE(TrainState, model, optimizer, loss_scale);

// ---- flags ---------------------------------------------------------------------------------

struct Flags {
  int epochs = 5;
  int64_t batch_size = 64;
  double lr = 1e-3;
  uint64_t seed = 0;
  std::string out = "demo-out";
  std::string model = "cnn";
  std::string dtype = "f32";  // what the forward and backward passes compute in
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::optional<std::string> resume;
  int64_t limit = 0;            // the first N images of each split only (quick checks); 0: all
  int stop_after = 0;           // stop after this many epochs, as if interrupted; 0: never
  bool data_parallel = false;   // one of process_count() processes started by mpirun
  std::set<std::string> given;  // flags set on the command line

  // The run's settings, stored in the checkpoint so that --resume continues the same run.
  std::map<std::string, std::string> settings() const {
    return {{"epochs", std::to_string(epochs)},
            {"batch_size", std::to_string(batch_size)},
            {"lr", std::to_string(lr)},
            {"seed", std::to_string(seed)},
            {"model", model},
            {"dtype", dtype},
            {"limit", std::to_string(limit)}};
  }
  void restore(const std::map<std::string, std::string>& m) {
    for (const char* key : {"epochs", "batch_size", "lr", "seed", "model", "dtype", "limit"}) {
      const std::string flag =
          std::string("--") + (key == std::string("batch_size") ? "batch-size" : key);
      if (given.count(flag) || !m.count(key)) continue;
      set(flag, m.at(key));
    }
  }
  void set(const std::string& flag, const std::string& v) {
    if (flag == "--epochs")
      epochs = std::stoi(v);
    else if (flag == "--batch-size")
      batch_size = std::stoll(v);
    else if (flag == "--lr")
      lr = std::stod(v);
    else if (flag == "--seed")
      seed = std::stoull(v);
    else if (flag == "--out")
      out = v;
    else if (flag == "--model")
      model = v;
    else if (flag == "--dtype")
      dtype = v;
    else if (flag == "--resume")
      resume = v;
    else if (flag == "--data")
      data = v;
    else if (flag == "--limit")
      limit = std::stoll(v);
    else if (flag == "--stop-after")
      stop_after = std::stoi(v);
    else
      throw std::invalid_argument("unknown flag " + flag);
  }
};

const char* kUsage = R"(usage: demo [flags]
Trains a classifier on Fashion-MNIST and evaluates it on the test set after every epoch.
  --epochs N        epochs to train in total (default 5)
  --batch-size N    images per step, over all processes (default 64); under --data-parallel
                    each of the N processes takes batch-size / N of them
  --lr X            Adam learning rate, cosine-decayed to 0 over the run (default 0.001)
  --seed N          seed of the initial weights and the shuffling (default 0)
  --out DIR         where to write checkpoint.safetensors, metrics.csv, curves.svg
                    (default demo-out, or the --resume directory)
  --model KIND      cnn (default) or mlp (784-512-512-10)
  --dtype D         f32 (default), bf16 or f16: mixed precision with float32 master weights
                    (f16 with dynamic loss scaling)
  --resume DIR      continue the run saved in DIR: model, optimiser, data position and the
                    settings above (flags given explicitly override them)
  --data DIR        the IDX files (default /usr/share/datasets/fashion-mnist)
  --limit N         use only the first N images of each split (quick checks)
  --stop-after N    stop after epoch N as if interrupted (continue with --resume)
  --data-parallel   train on every process mpirun started (mpirun -np N demo --data-parallel):
                    the same model on each, every process computes the gradient of its part
                    of the batch and they average them; process 0 prints and writes the files.
                    A checkpoint resumes under any process count, with or without mpirun.
  --help            this text
)";

[[noreturn]] void usage_error(const std::string& why) {
  if (leader()) std::fprintf(stderr, "demo: %s (try --help)\n", why.c_str());
  std::exit(2);
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      if (leader()) std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (a == "--data-parallel") {
      f.data_parallel = true;
      continue;
    }
    if (i + 1 >= argc) usage_error(a + " needs a value");
    try {
      f.set(a, argv[++i]);
    } catch (const std::exception& e) {
      usage_error(a.rfind("--", 0) == 0 && std::string(e.what()).rfind("unknown", 0) != 0
                      ? "bad value for " + a + ": " + argv[i]
                      : "unknown flag " + a);
    }
    f.given.insert(a);
  }
  if (f.resume) {
    if (!f.given.count("--out")) f.out = *f.resume;
    f.restore(io::load_tensors(*f.resume + "/checkpoint.safetensors").metadata);
  }
  if (f.model != "cnn" && f.model != "mlp")
    usage_error("--model must be cnn or mlp, got " + f.model);
  if (f.dtype != "f32" && f.dtype != "bf16" && f.dtype != "f16")
    usage_error("--dtype must be f32, bf16 or f16, got " + f.dtype);
  if (f.epochs < 1 || f.batch_size < 1 || !(f.lr > 0) || f.limit < 0)
    usage_error("--epochs, --batch-size and --lr must be positive, --limit not negative");
  if (const auto problem = mpirun::count_problem(f.data_parallel, f.batch_size, "images"))
    usage_error(*problem);
  return f;
}

// ---- data ----------------------------------------------------------------------------------

// A split's images, the first --limit of them.
data::Pipeline images(const Flags& f, const std::string& split) {
  data::Pipeline p = data::from_idx(f.data + "/" + split + "-images-idx3-ubyte.gz",
                                    f.data + "/" + split + "-labels-idx1-ubyte.gz");
  return f.limit > 0 ? p.take(f.limit) : p;
}

// To float [1, 28, 28] with the training set's mean and standard deviation.
data::Pipeline normalized(const data::Pipeline& p) {
  return p.map(data::image::normalize({0.2860f}, {0.3530f}).then(data::image::to_chw()));
}

// The training data. `batches` is the run's sequence of --batch-size batches, shuffled per
// epoch, which one process iterates; under --data-parallel process p of N iterates `local`
// instead, the images p, p + N, p + 2N, ... of each of those batches (batch_size / N of them),
// so that the N processes' step k covers batch k exactly. Their positions (epoch, batches
// done) are equal, so the checkpoint holds `batches`'s state whatever the process count.
struct TrainData {
  data::Pipeline batches;
  data::Pipeline local;

  data::PipelineState state() const {
    const data::PipelineState here = local.state();
    return {batches.state().fingerprint, here.epoch, here.position};
  }
  // Raises Error for the state of other data (other --data, --limit, --seed or --batch-size).
  void restore(const data::PipelineState& s) {
    batches.restore(s);
    local.restore({local.state().fingerprint, s.epoch, s.position});
  }
};

TrainData train_set(const Flags& f, int processes, int index) {
  const data::Pipeline shuffled = images(f, "train").shuffle(f.seed);
  const data::Pipeline batches =
      normalized(shuffled).batch(f.batch_size, /*drop_remainder=*/true).prefetch(4);
  if (processes == 1) return {batches, batches};
  // Sharding the images (not the batches) puts each batch's images into the same step on
  // every process; the images past the last whole batch go first, so that every shard has
  // the same number of steps.
  const int64_t used = *batches.size() * f.batch_size;
  return {batches, normalized(shuffled.take(used).shard(processes, index))
                       .batch(f.batch_size / processes, /*drop_remainder=*/true)
                       .prefetch(4)};
}

// This process's part of the test set: evaluation is split like training (see main).
data::Pipeline test_set(const Flags& f, int processes, int index) {
  const data::Pipeline p = images(f, "t10k");
  return normalized(processes > 1 ? p.shard(processes, index) : p).batch(1000);
}

// data::write_file replaces a file atomically (temporary file, fsync, rename).
void write_text(const std::string& path, const std::string& text) {
  data::write_file(path, {reinterpret_cast<const uint8_t*>(text.data()), text.size()});
}

// ---- training ------------------------------------------------------------------------------

int main(int argc, char** argv) {
  distributed::initialize();  // one process unless mpirun started several
  const int processes = distributed::process_count(), rank = distributed::process_index();
  const Flags flags = parse_flags(argc, argv);
  // Adam's moments of weights whose gradients stay zero decay through the denormal range, where
  // the CPU takes a slow path on every operation: flushed to zero, as XLA computes on CPU
  // (bench/demo_torch.py sets PyTorch the same way; docs/DESIGN.md, "Denormals").
  set_flush_denormal(true);
  TrainData train_data = train_set(flags, processes, rank);
  data::Pipeline test_data = test_set(flags, processes, rank);
  const int64_t steps_per_epoch = *train_data.batches.size();

  const optim::Optimizer opt =
      optim::adam({.lr = optim::cosine_decay(flags.lr, flags.epochs * steps_per_epoch)});
  // Mixed precision: the parameters stay float32 (the optimiser's small updates would round
  // away in 16 bits); each step casts them and the images to `compute`, and the loss is taken
  // in float32. float16's narrow range needs the loss scaled (bfloat16 has float32's range).
  const DType compute = flags.dtype == "bf16" ? bfloat16 : flags.dtype == "f16" ? float16 : float32;
  const optim::LossScaler scaler;
  TrainState state;
  state.model = make_net(flags.model, random::key(flags.seed));
  state.optimizer = opt.init(state.model);
  if (compute == float16) state.loss_scale = scaler.init();
  std::vector<report::Epoch> history;
  int first_epoch = 0;

  if (flags.resume) {
    const std::string path = *flags.resume + "/checkpoint.safetensors";
    state = io::load(path, state);  // names, dtypes and shapes checked against `state`
    const io::TensorFile file = io::load_tensors(path);
    first_epoch = std::stoi(file.metadata.at("epochs_done"));
    train_data.restore(data::PipelineState::parse(file.metadata.at("data")));
    history = report::from_csv(*flags.resume + "/metrics.csv");
    history.resize(static_cast<std::size_t>(first_epoch));
    if (leader())
      std::printf("resumed from %s after epoch %d (model %s, batch size %lld, lr %g, seed %llu)\n",
                  path.c_str(), first_epoch, flags.model.c_str(),
                  static_cast<long long>(flags.batch_size), flags.lr,
                  static_cast<unsigned long long>(flags.seed));
  }

  if (leader())
    std::printf(
        "%s on Fashion-MNIST (%s): %lld parameters, %lld steps of %lld images per epoch%s\n%s\n",
        flags.model.c_str(), flags.dtype.c_str(),
        static_cast<long long>(nn::parameter_count(state.model)),
        static_cast<long long>(steps_per_epoch), static_cast<long long>(flags.batch_size),
        flags.data_parallel ? (", data-parallel on " + std::to_string(processes) +
                               (processes == 1 ? " process" : " processes"))
                                  .c_str()
                            : "",
        nn::summary(state.model, zeros({1, 1, 28, 28})).c_str());

  // The logits of the model computed in `compute`, as float32.
  auto logits_of = [compute](const Net& model, const Tensor& x) {
    const Net cast = tree_map([compute](const Tensor& p) { return astype(p, compute); }, model);
    return astype(cast(astype(x, compute)), float32);
  };
  // One step on the images x, labels y: loss and gradients, `combine`d over the processes
  // (the identity on one), then the optimiser. The state stays identical on every process:
  // each applies the same combined gradients to the same state.
  auto step = [&opt, &scaler, &logits_of](const TrainState& s, const Tensor& x, const Tensor& y,
                                          const auto& combine) {
    auto loss_fn = [&](const Net& model) {
      const Tensor logits = logits_of(model, x);
      const Tensor loss = nn::cross_entropy(logits, y);
      const Tensor scaled = s.loss_scale ? scaler.scale(loss, *s.loss_scale) : loss;
      return std::pair{scaled, std::pair{loss, nn::accuracy(logits, y)}};
    };
    auto [scaled_aux, local_grads] = value_and_grad(loss_fn, has_aux)(s.model);
    const Net grads = tree_map(combine, local_grads);
    const Tensor loss = combine(scaled_aux.second.first);
    const Tensor accuracy = combine(scaled_aux.second.second);
    if (!s.loss_scale) {
      auto [model, optimizer] = opt.update(s.model, grads, s.optimizer);
      return std::tuple{TrainState{model, optimizer, std::nullopt}, loss, accuracy};
    }
    // f16: unscale the gradients; a step whose gradients overflowed is skipped (and the scale
    // lowered), without C++ control flow on values. An overflow on any process reaches the
    // combined gradients, so every process skips the same steps.
    auto [unscaled, finite] = scaler.unscale(grads, *s.loss_scale);
    auto [model, optimizer] = opt.update(s.model, unscaled, s.optimizer);
    return std::tuple{TrainState{optim::select(finite, model, s.model),
                                 optim::select(finite, optimizer, s.optimizer),
                                 scaler.update(*s.loss_scale, finite)},
                      loss, accuracy};
  };
  // Compiled once for the batch shape. Under --data-parallel each process brings one example
  // along the "dp" axis (its part of the batch) and the step pmeans over the processes; the
  // results are the same on every process, so they come back without the axis (out_axes none).
  auto train_step = jit([&step](const TrainState& s, const Tensor& x, const Tensor& y) {
    return step(s, x, y, [](const Tensor& t) { return t; });
  });
  auto parallel_step = pmap(
      [&step](const TrainState& s, const Tensor& x, const Tensor& y) {
        return step(s, x, y, [](const Tensor& t) { return pmean(t, "dp"); });
      },
      axis_name("dp"), in_axes(none, 0, 0), out_axes(none));
  auto eval_step = jit([&logits_of](const Net& model, const Tensor& x, const Tensor& y) {
    const Tensor logits = logits_of(model, x);
    return std::pair{nn::cross_entropy(logits, y), nn::accuracy(logits, y)};
  });
  // The test set is split like the training data: each process evaluates its 1/N of it and
  // one psum adds up the sums, N times faster than every process evaluating all of it.
  auto add_up =
      pmap([](const Tensor& sums) { return psum(sums, "dp"); }, axis_name("dp"), out_axes(none));

  // Process 0 writes the files; the others' progress bars draw into nothing.
  if (leader()) fs::create_directories(flags.out);
  std::FILE* const progress = leader() ? stderr : std::fopen("/dev/null", "w");
  const int last_epoch =
      flags.stop_after > 0 ? std::min(flags.stop_after, flags.epochs) : flags.epochs;
  for (int epoch = first_epoch; epoch < last_epoch; ++epoch) {
    ProgressBar bar("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(flags.epochs),
                    steps_per_epoch * flags.batch_size, "img", progress);
    double loss_sum = 0, acc_sum = 0;
    int64_t steps = 0;
    char metrics[96];
    for (data::Batch& batch : train_data.local) {
      const Tensor &x = batch.at("image"), &y = batch.at("label");
      Tensor loss, acc;
      std::tie(state, loss, acc) = flags.data_parallel
                                       ? parallel_step(state, expand_dims(x, 0), expand_dims(y, 0))
                                       : train_step(state, x, y);
      loss_sum += loss.item<double>(), acc_sum += acc.item<double>(), ++steps;
      std::snprintf(metrics, sizeof metrics, "loss %.4f  acc %.2f%%", loss_sum / steps,
                    100 * acc_sum / steps);
      bar.update(steps * flags.batch_size, metrics);
    }
    bar.finish(metrics);

    double test_loss = 0, test_acc = 0, seen = 0;
    for (data::Batch& batch : test_data) {
      const auto n = static_cast<double>(batch.at("label").shape()[0]);
      auto [l, a] = eval_step(state.model, batch.at("image"), batch.at("label"));
      test_loss += l.item<double>() * n, test_acc += a.item<double>() * n, seen += n;
    }
    if (flags.data_parallel) {
      const std::vector<double> sums =
          add_up(expand_dims(tensor({test_loss, test_acc, seen}), 0)).to_vector<double>();
      test_loss = sums[0], test_acc = sums[1], seen = sums[2];
    }
    history.push_back({epoch + 1, loss_sum / steps, acc_sum / steps, test_loss / seen,
                       test_acc / seen, bar.elapsed_seconds(), bar.rate()});
    if (!leader()) continue;
    const report::Epoch& e = history.back();
    std::printf(
        "epoch %d: train loss %.4f acc %.2f%% | test loss %.4f acc %.2f%% | %.1f s, %.0f img/s\n",
        e.epoch, e.train_loss, 100 * e.train_accuracy, e.test_loss, 100 * e.test_accuracy,
        e.seconds, e.images_per_second);

    // The checkpoint and the metrics are replaced atomically after every epoch.
    std::map<std::string, std::string> metadata = flags.settings();
    metadata["epochs_done"] = std::to_string(epoch + 1);
    metadata["data"] = train_data.state().to_string();
    io::save(flags.out + "/checkpoint.safetensors", state, metadata);
    write_text(flags.out + "/metrics.csv", report::to_csv(history));
    write_text(flags.out + "/curves.svg",
               report::to_svg(history, "Kiln " + flags.model + " on Fashion-MNIST"));
  }

  double total = 0;
  for (const report::Epoch& e : history) total += e.seconds;
  if (leader())
    std::printf(
        "%s: test accuracy %.2f%% after %d of %d epochs, %s of training; wrote "
        "%s/{checkpoint.safetensors,metrics.csv,curves.svg}\n",
        last_epoch < flags.epochs ? "stopped" : "done", 100 * history.back().test_accuracy,
        static_cast<int>(history.size()), flags.epochs, format_duration(total).c_str(),
        flags.out.c_str());
  return 0;
}
