// Models are trees: a user-defined model is a struct of layers registered with KILN_TREE, and
// grad, jit and vmap take it as it is. Parameter names come from the tree paths, the optimiser
// state is a tree too, and both go to one safetensors checkpoint.
#include <kiln/io.h>
#include <kiln/kiln.h>

#include <cstdio>
#include <filesystem>
#include <iostream>

using namespace kiln;

// A user-defined layer: any tree with a call operator works inside Sequential.
struct Residual {
  nn::Linear inner;
  Tensor operator()(const Tensor& x) const { return x + nn::relu(inner(x)); }
};
KILN_TREE(Residual, inner);

struct Model {
  nn::Sequential<nn::Linear, nn::Activation, Residual> features;
  nn::Linear classifier;
  Tensor operator()(const Tensor& x) const { return classifier(features(x)); }
};
KILN_TREE(Model, features, classifier);

struct Checkpoint {
  Model model;
  optim::OptState<Model> optimizer;
};
KILN_TREE(Checkpoint, model, optimizer);

int main() {
  const Tensor k = random::split(random::key(0), 4);
  Model model{nn::Sequential(nn::Linear(4, 16, index(k, 0)), nn::GELU(),
                             Residual{nn::Linear(16, 16, index(k, 1))}),
              nn::Linear(16, 3, index(k, 2))};
  std::cout << nn::summary(model, zeros({8, 4})) << "\n";

  const Tensor x = random::normal(index(k, 3), {32, 4});
  // A learnable toy labelling: 0, 1 or 2 by the sign of the sum and the size of x[:, 0].
  const Tensor y = astype(sum(x, {1}) > 0.0, int64) + astype(index(transpose(x), 0) > 1.0, int64);
  auto loss = [](const Model& m, const Tensor& x, const Tensor& y) {
    return nn::cross_entropy(m(x), y);
  };

  // grad returns a Model-shaped tree of gradients: same names, same shapes.
  const Model g = grad(loss)(model, x, y);
  std::cout << "d loss / d features.2.inner.weight has shape "
            << g.features.get<2>().inner.weight.shape() << "\n";

  // Per-example gradients: vmap over the batch, the model shared.
  auto per_example = vmap(grad(loss), in_axes(none, 0, 0));
  const Model pg = per_example(model, expand_dims(x, 1), expand_dims(y, 1));
  std::cout << "per-example gradient of classifier.weight: " << pg.classifier.weight.shape()
            << "\n";

  // A jitted training step: loss, gradients and the Adam update compiled together.
  const optim::Optimizer opt = optim::adam({.lr = 1e-2});
  Checkpoint state{model, opt.init(model)};
  auto step = jit([&opt](const Checkpoint& s, const Tensor& x, const Tensor& y) {
    auto [l, grads] =
        value_and_grad([&](const Model& m) { return nn::cross_entropy(m(x), y); })(s.model);
    auto [m, o] = opt.update(s.model, grads, s.optimizer);
    return std::pair{Checkpoint{m, o}, l};
  });
  Tensor l;
  for (int i = 0; i < 200; ++i) std::tie(state, l) = step(state, x, y);
  std::printf("loss after 200 Adam steps: %.4f (from %.4f)\n", l.item<double>(),
              loss(model, x, y).item<double>());

  // One checkpoint with every parameter and the optimiser state, by name.
  const std::string path =
      (std::filesystem::temp_directory_path() / "kiln_nn_basics.safetensors").string();
  io::save(path, state);
  for (const auto& [name, t] : nn::named_parameters(state))
    if (name.rfind("optimizer.slots.mu.", 0) != 0 && name.rfind("optimizer.slots.nu.", 0) != 0)
      std::cout << "  " << name << " " << t.type() << "\n";
  const Checkpoint loaded = io::load(path, Checkpoint{model, opt.init(model)});
  std::printf("the reloaded model's loss: %.4f\n", loss(loaded.model, x, y).item<double>());
  std::filesystem::remove(path);
  return l.item<double>() < 0.5 * loss(model, x, y).item<double>() ? 0 : 1;
}
