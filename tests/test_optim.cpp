// kiln::optim: SGD (momentum, Nesterov, dampening, weight decay), Adam (L2), AdamW against a
// double-precision reference loop written from the PyTorch documentation's formulas and against
// numbers printed by PyTorch itself; learning-rate schedules at analytic values; clipping by
// global norm; jit(update) against the eager update; a jitted train step (value_and_grad +
// update) on linear regression; the state as a tree (names, checkpoint round trip); errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numbers>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/optim.h"
#include "testing.h"

// The test model: two tensors and a vector, 11 values in flatten order (w, b, extra[0]).
struct Net {
  kiln::Tensor w;                   // [2, 3]
  kiln::Tensor b;                   // [3]
  std::vector<kiln::Tensor> extra;  // {[2]}
};
KILN_TREE(Net, w, b, extra);

namespace stack {
struct Layer {
  kiln::Tensor w;
};
KILN_TREE(Layer, w);
struct Stack {
  std::vector<Layer> layers;
};
KILN_TREE(Stack, layers);
}  // namespace stack

struct Linear {
  kiln::Tensor w;  // [3, 1]
  kiln::Tensor b;  // [1]
};
KILN_TREE(Linear, w, b);

namespace {

using kiln::testing::expect_allclose;

using namespace kiln;
using kiln::optim::Optimizer;
using kiln::optim::OptState;
using kiln::optim::Schedule;
using kiln::testing::expect_error;

constexpr int kN = 11;
constexpr int kSteps = 5;

// The same synthetic problem as tests/reference/optim_torch.py.
double p0(int j) { return 0.5 * std::cos(0.3 * j + 0.1); }
double grad_value(int k, int j) { return std::sin(0.7 * j + 1.3 * k + 0.2) + 0.05 * j - 0.1 * k; }

std::vector<double> initial_values() {
  std::vector<double> v(kN);
  for (int j = 0; j < kN; ++j) v[j] = p0(j);
  return v;
}
std::vector<double> grad_values(int k) {
  std::vector<double> v(kN);
  for (int j = 0; j < kN; ++j) v[j] = grad_value(k, j);
  return v;
}

Net make_net(const std::vector<double>& v, DType dt) {
  auto part = [&](int from, int n, Shape s) {
    return astype(tensor(std::vector<double>(v.begin() + from, v.begin() + from + n), s), dt);
  };
  return Net{part(0, 6, {2, 3}), part(6, 3, {3}), {part(9, 2, {2})}};
}

std::vector<double> flat(const Net& n) {
  std::vector<double> out;
  for (const Tensor& t : tree_leaves(n)) {
    const std::vector<double> v = t.to_vector<double>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// ---- the reference: a plain double loop from the formulas in the PyTorch docs -----------------

struct Ref {
  enum Kind { sgd, adam, adamw } kind = sgd;
  std::function<double(int)> lr;  // learning rate of update k (0-based)
  double momentum = 0, dampening = 0, wd = 0;
  bool nesterov = false;
  double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  std::optional<double> clip;
  int decayed = kN;  // weight decay applies to the first `decayed` values (6: only w, a matrix)
};

// Parameters after `steps` updates.
std::vector<double> reference(const Ref& c, int steps) {
  std::vector<double> p = initial_values(), buf(kN, 0.0), m(kN, 0.0), v(kN, 0.0);
  for (int k = 0; k < steps; ++k) {
    std::vector<double> g = grad_values(k);
    if (c.clip) {  // torch.nn.utils.clip_grad_norm_
      double sq = 0;
      for (double x : g) sq += x * x;
      const double coef = std::min(1.0, *c.clip / (std::sqrt(sq) + 1e-6));
      for (double& x : g) x *= coef;
    }
    const double lr = c.lr(k);
    const int t = k + 1;
    for (int j = 0; j < kN; ++j) {
      if (c.kind == Ref::sgd) {  // torch.optim.SGD
        double d = g[j] + c.wd * p[j];
        if (c.momentum != 0) {
          buf[j] = k == 0 ? d : c.momentum * buf[j] + (1 - c.dampening) * d;
          d = c.nesterov ? d + c.momentum * buf[j] : buf[j];
        }
        p[j] -= lr * d;
      } else {  // torch.optim.Adam / AdamW
        double d = g[j];
        const double wd = j < c.decayed ? c.wd : 0.0;
        if (c.kind == Ref::adamw)
          p[j] *= 1 - lr * wd;
        else
          d += wd * p[j];
        m[j] = c.b1 * m[j] + (1 - c.b1) * d;
        v[j] = c.b2 * v[j] + (1 - c.b2) * d * d;
        const double m_hat = m[j] / (1 - std::pow(c.b1, t));
        const double v_hat = v[j] / (1 - std::pow(c.b2, t));
        p[j] -= lr * m_hat / (std::sqrt(v_hat) + c.eps);
      }
    }
  }
  return p;
}

std::function<double(int)> const_lr(double lr) {
  return [lr](int) { return lr; };
}

// Printed by tests/reference/optim_torch.py with torch.optim.SGD / Adam / AdamW (+ StepLR and
// clip_grad_norm_) of PyTorch 1.13 (Debian python3-torch), float64: parameters after 5 updates.
const std::map<std::string, std::vector<double>>& torch_results() {
  // clang-format off
  static const std::map<std::string, std::vector<double>> r = {
      {"sgd", {0.60349099574555076, 0.52925919973649072, 0.41683907510123264, 0.27758687991259207, 0.12246363886168717, -0.039299162490853475, -0.19989918690824673, -0.35158410181546651, -0.48529330135734222, -0.59040633461503766, -0.65611948349348115}},
      {"sgd_momentum", {0.44908293644829628, 0.3723290793888418, 0.32410815892743466, 0.28188574587889764, 0.20729144386689613, 0.067985921727885909, -0.14248729101493485, -0.39661652042182172, -0.6408567971866348, -0.81629997607166149, -0.88276177094925157}},
      {"sgd_nesterov", {0.50691930762063686, 0.41551357251762588, 0.34714844312840976, 0.28443015007367595, 0.19429435318613264, 0.047377652769928315, -0.16353024199486407, -0.41504669583630366, -0.65918904503725573, -0.84142867763828277, -0.92271830554641121}},
      {"sgd_momentum_dampening_wd", {0.4470443458102582, 0.36166802132914649, 0.30546279208328381, 0.2609109269557553, 0.19207871867720025, 0.065314146740779344, -0.13031232569745591, -0.3728495774987402, -0.61281605482470991, -0.7919863899596995, -0.86717943438279554}},
      {"sgd_nesterov_wd", {0.50169360831228837, 0.42747434986617305, 0.3544035129157409, 0.27274198159854646, 0.16468525648768736, 0.01629114717341712, -0.17164513591137681, -0.37926891777232347, -0.57234924271874088, -0.71418052890058115, -0.77948012735174976}},
      {"sgd_step_lr", {0.46636921113342633, 0.40199962008981061, 0.33754177153742931, 0.26590977739860605, 0.17037708693846415, 0.036264080369279812, -0.13751577387621597, -0.33289620159179728, -0.51615065276477812, -0.64924150874578024, -0.70409138252490044}},
      {"adam", {0.47545176283125951, 0.44055958192919598, 0.36793093104082236, 0.26350200533649037, 0.1357722963686781, 0.0087668843795196683, -0.14694280021825945, -0.29443652461302927, -0.41330066430222284, -0.50630128071409108, -0.53269278201535397}},
      {"adam_l2", {0.47597027294753419, 0.442293245812449, 0.3694674921643491, 0.26404828613641435, 0.13484422865561466, 0.0064235832924262083, -0.1489670461440159, -0.29455038703117431, -0.41156585707360011, -0.50297679608773793, -0.52854145442767764}},
      {"adamw", {0.47304995319679466, 0.4383386376606942, 0.36608548579578465, 0.26219405472515456, 0.13511672120567766, 0.0087594939620223716, -0.14620198249703173, -0.29299782656126871, -0.41129792119251396, -0.50385845411855956, -0.53011200367866729}},
      {"adam_clip", {0.47549787475545052, 0.44097775961003383, 0.3677958427460265, 0.26226697615192246, 0.13474787540872715, 0.0086345588756246185, -0.14704273491134848, -0.29303751220878294, -0.41277253135006947, -0.5064721144447788, -0.53259338465863304}},
  };
  // clang-format on
  return r;
}

struct Case {
  std::string name;  // the key in torch_results(), when PyTorch has the same configuration
  std::function<Optimizer()> make;
  Ref ref;
};

double warmup_cosine_lr(int k) {  // warmup_cosine_decay(0, 0.2, 2, 5, 0.02), analytically
  if (k < 2) return 0.2 * k / 2.0;
  const double t = std::min(k - 2, 3) / 3.0;
  return 0.02 + (0.2 - 0.02) * 0.5 * (1 + std::cos(std::numbers::pi * t));
}

std::vector<Case> cases() {
  namespace o = kiln::optim;
  std::vector<Case> c;
  c.push_back({"sgd", [] { return o::sgd({.lr = 0.1}); }, {.lr = const_lr(0.1)}});
  c.push_back({"sgd_momentum",
               [] { return o::sgd({.lr = 0.05, .momentum = 0.9}); },
               {.lr = const_lr(0.05), .momentum = 0.9}});
  c.push_back({"sgd_nesterov",
               [] { return o::sgd({.lr = 0.05, .momentum = 0.9, .nesterov = true}); },
               {.lr = const_lr(0.05), .momentum = 0.9, .nesterov = true}});
  c.push_back(
      {"sgd_momentum_dampening_wd",
       [] { return o::sgd({.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01}); },
       {.lr = const_lr(0.05), .momentum = 0.9, .dampening = 0.1, .wd = 0.01}});
  c.push_back(
      {"sgd_nesterov_wd",
       [] { return o::sgd({.lr = 0.05, .momentum = 0.8, .nesterov = true, .weight_decay = 0.1}); },
       {.lr = const_lr(0.05), .momentum = 0.8, .wd = 0.1, .nesterov = true}});
  c.push_back({"sgd_step_lr",
               [] { return o::sgd({.lr = o::step_decay(0.1, 2, 0.5)}); },
               {.lr = [](int k) { return 0.1 * std::pow(0.5, k / 2); }}});
  c.push_back({"",  // no PyTorch counterpart: warmup + cosine, momentum and clipping together
               [] {
                 return o::sgd({.lr = o::warmup_cosine_decay(0.0, 0.2, 2, 5, 0.02),
                                .momentum = 0.9,
                                .clip_norm = 1.0});
               },
               {.lr = warmup_cosine_lr, .momentum = 0.9, .clip = 1.0}});
  c.push_back(
      {"adam", [] { return o::adam({.lr = 0.01}); }, {.kind = Ref::adam, .lr = const_lr(0.01)}});
  c.push_back(
      {"adam_l2",
       [] {
         return o::adam({.lr = 0.01, .b1 = 0.8, .b2 = 0.99, .eps = 1e-6, .weight_decay = 0.1});
       },
       {.kind = Ref::adam, .lr = const_lr(0.01), .wd = 0.1, .b1 = 0.8, .b2 = 0.99, .eps = 1e-6}});
  c.push_back({"adamw",
               [] { return o::adamw({.lr = 0.01, .weight_decay = 0.1}); },
               {.kind = Ref::adamw, .lr = const_lr(0.01), .wd = 0.1}});
  c.push_back(
      {"",  // decay on w (a matrix) only, not on b or extra (vectors)
       [] { return o::adamw({.lr = 0.01, .weight_decay = 0.3, .decay_on = o::DecayOn::matrices}); },
       {.kind = Ref::adamw, .lr = const_lr(0.01), .wd = 0.3, .decayed = 6}});
  c.push_back(
      {"",
       [] { return o::adam({.lr = 0.01, .weight_decay = 0.3, .decay_on = o::DecayOn::matrices}); },
       {.kind = Ref::adam, .lr = const_lr(0.01), .wd = 0.3, .decayed = 6}});
  c.push_back({"adam_clip",
               [] { return o::adam({.lr = 0.01, .clip_norm = 1.0}); },
               {.kind = Ref::adam, .lr = const_lr(0.01), .clip = 1.0}});
  c.push_back(
      {"",  // AdamW with a schedule
       [] { return o::adamw({.lr = o::step_decay(0.02, 2, 0.5), .weight_decay = 0.3}); },
       {.kind = Ref::adamw, .lr = [](int k) { return 0.02 * std::pow(0.5, k / 2); }, .wd = 0.3}});
  return c;
}

std::string label(const Case& c, std::size_t i) {
  return c.name.empty() ? "case " + std::to_string(i) : c.name;
}

// ---- optimisers against the references ---------------------------------------------------------

TEST(Optim, ReferenceLoopMatchesTorch) {
  const auto all = cases();
  int checked = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i].name.empty()) continue;
    expect_allclose(reference(all[i].ref, kSteps), torch_results().at(all[i].name),
                    {.rtol = 0, .atol = 1e-13}, label(all[i], i));
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(torch_results().size()));
}

TEST(Optim, Float64MatchesReferenceEveryStep) {
  const auto all = cases();
  for (std::size_t i = 0; i < all.size(); ++i) {
    SCOPED_TRACE(label(all[i], i));
    const Optimizer opt = all[i].make();
    Net p = make_net(initial_values(), float64);
    OptState<Net> s = opt.init(p);
    for (int k = 0; k < kSteps; ++k) {
      std::tie(p, s) = opt.update(p, make_net(grad_values(k), float64), s);
      expect_allclose(flat(p), reference(all[i].ref, k + 1), {.rtol = 0, .atol = 1e-13},
                      "step " + std::to_string(k));
      EXPECT_EQ(s.step.dtype(), int32);
      EXPECT_EQ(s.step.item<int>(), k + 1);
    }
    if (!all[i].name.empty())
      expect_allclose(flat(p), torch_results().at(all[i].name), {.rtol = 0, .atol = 1e-13},
                      "torch");
  }
}

TEST(Optim, Float32MatchesReference) {
  const auto all = cases();
  for (std::size_t i = 0; i < all.size(); ++i) {
    SCOPED_TRACE(label(all[i], i));
    const Optimizer opt = all[i].make();
    Net p = make_net(initial_values(), float32);
    OptState<Net> s = opt.init(p);
    for (int k = 0; k < kSteps; ++k)
      std::tie(p, s) = opt.update(p, make_net(grad_values(k), float32), s);
    for (const Tensor& t : tree_leaves(p)) EXPECT_EQ(t.dtype(), float32);
    for (const auto& [name, slot] : s.slots)
      for (const Tensor& t : tree_leaves(slot)) EXPECT_EQ(t.dtype(), float32) << name;
    expect_allclose(flat(p), reference(all[i].ref, kSteps), {.rtol = 0, .atol = 2e-6}, "float32");
  }
}

TEST(Optim, JitUpdateEqualsEagerUpdate) {
  const auto all = cases();
  for (std::size_t i = 0; i < all.size(); ++i) {
    SCOPED_TRACE(label(all[i], i));
    const Optimizer opt = all[i].make();
    auto step = jit(
        [opt](const Net& p, const Net& g, const OptState<Net>& s) { return opt.update(p, g, s); });
    Net pe = make_net(initial_values(), float32);
    OptState<Net> se = opt.init(pe);
    Net pj = pe;
    OptState<Net> sj = se;
    for (int k = 0; k < kSteps; ++k) {
      const Net g = make_net(grad_values(k), float32);
      std::tie(pe, se) = opt.update(pe, g, se);
      std::tie(pj, sj) = step(pj, g, sj);
      expect_allclose(flat(pj), flat(pe), {.rtol = 0, .atol = 1e-7},
                      "params, step " + std::to_string(k));
      ASSERT_EQ(sj.slots.size(), se.slots.size());
      for (const auto& [name, slot] : se.slots)
        expect_allclose(flat(sj.slots.at(name)), flat(slot), {.rtol = 0, .atol = 1e-7},
                        "slot " + name);
      EXPECT_EQ(sj.step.dtype(), int32);
      EXPECT_EQ(sj.step.item<int>(), se.step.item<int>());
    }
    EXPECT_EQ(step.cache_size(), 1u) << "the step is a traced value: no recompiles";
  }
}

TEST(Optim, JittedTrainStepConvergesOnLinearRegression) {
  // y = x w* + b* with 64 examples of 3 features; the loss and the update compile together.
  const int64_t n = 64;
  const Tensor x = tensor(kiln::testing::random_values(n * 3, 7), Shape{n, 3});
  const Tensor xf = astype(x, float32);
  const Tensor w_true = tensor({1.5f, -2.0f, 0.5f}, Shape{3, 1});
  const Tensor yf = matmul(xf, w_true) + 0.3f;
  auto loss = [](const Linear& p, const Tensor& x, const Tensor& y) {
    return mean(square(matmul(x, p.w) + p.b - y));
  };
  for (const Optimizer& opt :
       {optim::sgd({.lr = 0.1, .momentum = 0.9, .nesterov = true}),
        optim::adam({.lr = optim::warmup_cosine_decay(0.0, 0.1, 10, 300, 0.001), .clip_norm = 1.0}),
        optim::adamw({.lr = 0.05, .weight_decay = 1e-4})}) {
    SCOPED_TRACE(opt.name());
    auto train_step = jit([&](Linear p, OptState<Linear> s, Tensor x, Tensor y) {
      auto [l, g] = value_and_grad(loss)(p, x, y);
      auto [p2, s2] = opt.update(p, g, s);
      return std::tuple{l, p2, s2};
    });
    Linear p{zeros({3, 1}), zeros({1})};
    OptState<Linear> s = opt.init(p);
    Tensor l;
    float first = 0;
    for (int i = 0; i < 300; ++i) {
      std::tie(l, p, s) = train_step(p, s, xf, yf);
      if (i == 0) first = l.item<float>();
    }
    EXPECT_GT(first, 1.0f);
    EXPECT_LT(l.item<float>(), 1e-4f);
    EXPECT_EQ(s.step.item<int>(), 300);
    EXPECT_EQ(train_step.cache_size(), 1u);
    EXPECT_NEAR(p.w.to_vector<float>()[1], -2.0f, 2e-2f);
  }
}

// ---- edge cases of the update ------------------------------------------------------------

TEST(Optim, UndefinedGradientLeavesTheParameterAlone) {
  const Optimizer opt = optim::sgd({.lr = 0.1, .momentum = 0.9});
  Net p = make_net(initial_values(), float64);
  OptState<Net> s = opt.init(p);
  Net g = make_net(grad_values(0), float64);
  g.extra[0] = Tensor();
  auto [p2, s2] = opt.update(p, g, s);
  EXPECT_TRUE(p2.extra[0].shares_storage_with(p.extra[0]));
  EXPECT_TRUE(
      s2.slots.at("momentum").extra[0].shares_storage_with(s.slots.at("momentum").extra[0]));
  const std::vector<double> want = reference({.lr = const_lr(0.1), .momentum = 0.9}, 1);
  const std::vector<double> all = flat(p2);
  expect_allclose({all.begin(), all.begin() + 9}, {want.begin(), want.begin() + 9},
                  {.rtol = 0, .atol = 1e-13}, "updated");
  // The tail is the untouched parameter.
  EXPECT_DOUBLE_EQ(all[9], p0(9));
  EXPECT_DOUBLE_EQ(all[10], p0(10));
}

TEST(Optim, TensorAndStaticLeaves) {
  // A bare Tensor is a tree; static leaves in the model pass through unchanged.
  const Optimizer opt = optim::adam({.lr = 0.1});
  Tensor p = tensor({1.0f, -1.0f});
  OptState<Tensor> s = opt.init(p);
  EXPECT_EQ(tree_names(s), (std::vector<std::string>{"step", "slots.mu", "slots.nu"}));
  std::tie(p, s) = opt.update(p, tensor({0.5f, -0.5f}), s);
  // The first Adam step moves each coordinate by lr against the sign of its gradient.
  const std::vector<float> pv = p.to_vector<float>();
  expect_allclose({pv.begin(), pv.end()}, {0.9, -0.9}, {.rtol = 0, .atol = 1e-6}, "adam step 1");

  using WithStatic = std::tuple<Tensor, int, std::string>;
  const Optimizer sgd = optim::sgd({.lr = 1.0});
  WithStatic q{tensor({2.0f}), 3, "relu"};
  auto qs = sgd.init(q);
  auto [q2, qs2] = sgd.update(q, WithStatic{tensor({0.5f}), 3, "relu"}, qs);
  EXPECT_FLOAT_EQ(std::get<0>(q2).item<float>(), 1.5f);
  EXPECT_EQ(std::get<1>(q2), 3);
  EXPECT_EQ(std::get<2>(q2), "relu");
}

// ---- the state as a tree -----------------------------------------------------------------------

TEST(OptimState, TreeNames) {
  const Net p = make_net(initial_values(), float32);
  EXPECT_EQ(tree_names(optim::adam().init(p)),
            (std::vector<std::string>{"step", "slots.mu.w", "slots.mu.b", "slots.mu.extra.0",
                                      "slots.nu.w", "slots.nu.b", "slots.nu.extra.0"}));
  EXPECT_EQ(tree_names(optim::sgd({.lr = 0.1, .momentum = 0.9}).init(p)),
            (std::vector<std::string>{"step", "slots.momentum.w", "slots.momentum.b",
                                      "slots.momentum.extra.0"}));
  EXPECT_EQ(tree_names(optim::sgd({.lr = 0.1}).init(p)), (std::vector<std::string>{"step"}));
  const stack::Stack model{{{zeros({4, 3})}, {zeros({3})}}};
  EXPECT_EQ(tree_names(optim::adamw().init(model)),
            (std::vector<std::string>{"step", "slots.mu.layers.0.w", "slots.mu.layers.1.w",
                                      "slots.nu.layers.0.w", "slots.nu.layers.1.w"}));
  EXPECT_EQ(tree_structure(optim::sgd({.lr = 0.1, .momentum = 0.5}).init(model)).to_string(),
            "OptState{step: *, slots: {\"momentum\": Stack{layers: [Layer{w: *}, Layer{w: *}]}}}");
}

TEST(OptimState, InitialState) {
  const Net p = make_net(initial_values(), float32);
  const OptState<Net> s = optim::adam().init(p);
  EXPECT_EQ(s.step.type().to_string(), "i32[]");
  EXPECT_EQ(s.step.item<int>(), 0);
  for (const auto& [name, slot] : s.slots) {
    const auto leaves = tree_leaves(slot);
    const auto params = tree_leaves(p);
    ASSERT_EQ(leaves.size(), params.size());
    for (std::size_t i = 0; i < leaves.size(); ++i) {
      EXPECT_EQ(leaves[i].type(), params[i].type()) << name;
      for (float v : leaves[i].to_vector<float>()) EXPECT_EQ(v, 0.0f);
    }
  }
}

TEST(OptimState, CheckpointRoundTripContinuesIdentically) {
  // What a checkpoint does: flatten to (names, leaves), rebuild from the structure, go on.
  const Optimizer opt = optim::adam({.lr = 0.01});
  Net p = make_net(initial_values(), float64);
  OptState<Net> s = opt.init(p);
  for (int k = 0; k < 2; ++k) std::tie(p, s) = opt.update(p, make_net(grad_values(k), float64), s);
  auto [leaves, def] = tree_flatten(s);
  std::vector<Tensor> copies;
  for (const Tensor& t : leaves) copies.push_back(tensor(t.to_vector<double>(), t.shape()));
  copies[0] = tensor(s.step.item<int>());
  OptState<Net> restored = tree_unflatten<OptState<Net>>(def, copies);
  for (int k = 2; k < kSteps; ++k)
    std::tie(p, restored) = opt.update(p, make_net(grad_values(k), float64), restored);
  expect_allclose(flat(p), torch_results().at("adam"), {.rtol = 0, .atol = 1e-13}, "resumed");
}

// ---- schedules ------------------------------------------------------------------------------

TEST(Schedule, ConstantAndImplicitConversion) {
  const Schedule a = 0.25;
  EXPECT_EQ(a(0), 0.25);
  EXPECT_EQ(a(1000), 0.25);
  EXPECT_EQ(a.constant_value(), 0.25);
  EXPECT_EQ(optim::constant(3e-4)(7), 3e-4);
  EXPECT_EQ(a(tensor(3)).type().to_string(), "f64[]");
  EXPECT_FALSE(optim::step_decay(1, 1, 0.5).constant_value().has_value());
}

TEST(Schedule, StepDecay) {
  const Schedule s = optim::step_decay(0.1, 3, 0.5);
  for (int k : {0, 1, 2}) EXPECT_DOUBLE_EQ(s(k), 0.1) << k;
  for (int k : {3, 4, 5}) EXPECT_DOUBLE_EQ(s(k), 0.05) << k;
  EXPECT_DOUBLE_EQ(s(6), 0.025);
  EXPECT_DOUBLE_EQ(s(10), 0.1 * 0.125);
  EXPECT_DOUBLE_EQ(s(300), 0.1 * std::pow(0.5, 100));
}

TEST(Schedule, CosineDecay) {
  const Schedule s = optim::cosine_decay(1.0, 10, 0.1);
  EXPECT_DOUBLE_EQ(s(0), 1.0);
  EXPECT_DOUBLE_EQ(s(5), 0.55);
  EXPECT_DOUBLE_EQ(s(3), 0.1 + 0.45 * (1 + std::cos(0.3 * std::numbers::pi)));
  EXPECT_NEAR(s(10), 0.1, 1e-15);
  EXPECT_NEAR(s(11), 0.1, 1e-15);  // clamped after decay_steps
  EXPECT_NEAR(s(1000), 0.1, 1e-15);
  EXPECT_NEAR(optim::cosine_decay(2.0, 4)(2), 1.0, 1e-15);
  EXPECT_NEAR(optim::cosine_decay(2.0, 4)(4), 0.0, 1e-15);
}

TEST(Schedule, LinearWarmup) {
  const Schedule s = optim::linear_warmup(4, 0.2);
  EXPECT_DOUBLE_EQ(s(0), 0.0);
  EXPECT_DOUBLE_EQ(s(1), 0.05);
  EXPECT_DOUBLE_EQ(s(2), 0.1);
  EXPECT_DOUBLE_EQ(s(3), 0.15);
  EXPECT_DOUBLE_EQ(s(4), 0.2);
  EXPECT_DOUBLE_EQ(s(100), 0.2);
  const Schedule from = optim::linear_warmup(4, 0.2, 0.02);
  EXPECT_DOUBLE_EQ(from(0), 0.02);
  EXPECT_DOUBLE_EQ(from(2), 0.11);
  EXPECT_DOUBLE_EQ(from(4), 0.2);
  EXPECT_DOUBLE_EQ(optim::linear_warmup(0, 0.3)(0), 0.3);
}

TEST(Schedule, WarmupThenCosine) {
  // Ramp to after(0) = 1 over 5 steps; the cosine then sees step - 5.
  const Schedule s = optim::linear_warmup(5, optim::cosine_decay(1.0, 10));
  EXPECT_DOUBLE_EQ(s(0), 0.0);
  EXPECT_DOUBLE_EQ(s(2), 0.4);
  EXPECT_DOUBLE_EQ(s(5), 1.0);
  EXPECT_NEAR(s(10), 0.5, 1e-15);
  EXPECT_NEAR(s(15), 0.0, 1e-15);
  EXPECT_NEAR(s(40), 0.0, 1e-15);
  // optax.warmup_cosine_decay_schedule(0, 1, 5, 15, 0.1): decay_steps counts the warmup.
  const Schedule w = optim::warmup_cosine_decay(0.0, 1.0, 5, 15, 0.1);
  const Schedule composed = optim::linear_warmup(5, optim::cosine_decay(1.0, 10, 0.1));
  for (int k = 0; k <= 20; ++k) EXPECT_DOUBLE_EQ(w(k), composed(k)) << k;
  EXPECT_NEAR(w(10), 0.55, 1e-15);
  for (int k = 0; k <= 20; ++k) {
    const double want =
        k < 5 ? k / 5.0
              : 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * std::min(k - 5, 10) / 10.0));
    EXPECT_NEAR(w(k), want, 1e-15) << k;
  }
}

TEST(Schedule, Join) {
  const Schedule s =
      optim::join({optim::constant(1.0), 2.0, optim::step_decay(3.0, 1, 0.5)}, {2, 5});
  EXPECT_EQ(s(0), 1.0);
  EXPECT_EQ(s(1), 1.0);
  EXPECT_EQ(s(2), 2.0);
  EXPECT_EQ(s(4), 2.0);
  EXPECT_EQ(s(5), 3.0);
  EXPECT_EQ(s(6), 1.5);
  EXPECT_EQ(s(7), 0.75);
}

TEST(Schedule, CustomCallable) {
  const Schedule s = [](const Tensor& step) { return astype(step, float32) * 0.5f; };
  EXPECT_EQ(s(4), 2.0);
  EXPECT_EQ(s(tensor(4)).dtype(), float64);
  // A custom schedule drives the optimiser: lr = step / 2 means no move on the first update.
  const Optimizer opt = optim::sgd({.lr = s});
  EXPECT_EQ(opt.learning_rate(3), 1.5);
  Tensor p = tensor({1.0f});
  auto st = opt.init(p);
  std::tie(p, st) = opt.update(p, tensor({1.0f}), st);
  EXPECT_EQ(p.item<float>(), 1.0f);
  std::tie(p, st) = opt.update(p, tensor({1.0f}), st);
  EXPECT_EQ(p.item<float>(), 0.5f);
}

TEST(Schedule, UnderJit) {
  const Schedule s = optim::warmup_cosine_decay(0.01, 1.0, 3, 12, 0.05);
  auto f = jit([s](const Tensor& step) { return s(step); });
  for (int k : {0, 1, 2, 3, 4, 7, 12, 50}) EXPECT_DOUBLE_EQ(f(tensor(k)).item<double>(), s(k)) << k;
  EXPECT_EQ(f.cache_size(), 1u);
  const Optimizer opt = optim::adam({.lr = s});
  auto lr = jit([opt](const Tensor& step) { return opt.learning_rate(step); });
  EXPECT_DOUBLE_EQ(lr(tensor(5)).item<double>(), s(5));
  EXPECT_DOUBLE_EQ(opt.learning_rate(5), s(5));
}

TEST(Schedule, Errors) {
  expect_error([] { Schedule()(0); }, "optim.schedule", {"not set"});
  expect_error([] { optim::step_decay(0.1, 0, 0.5); }, "optim.step_decay",
               {"step_size must be positive: got 0"});
  expect_error([] { optim::cosine_decay(0.1, -1); }, "optim.cosine_decay", {"got -1"});
  expect_error([] { optim::linear_warmup(-2, 0.1); }, "optim.linear_warmup", {"got -2"});
  expect_error(
      [] {
        optim::join({1.0, 2.0}, {});
      },
      "optim.join", {"got 2 schedules and 0 boundaries"});
  expect_error([] { optim::join({1.0, 2.0, 3.0}, {4, 2}); }, "optim.join", {"non-decreasing"});
  expect_error([] { optim::warmup_cosine_decay(0, 1, 10, 10); }, "optim.warmup_cosine_decay",
               {"warmup_steps=10, decay_steps=10"});
  const Schedule vector_valued = [](const Tensor&) { return zeros({2}); };
  expect_error([&] { vector_valued(1); }, "optim.schedule", {"got f32[2]", "real scalar"});
  expect_error([] { Schedule(0.1)(tensor(1.0f)); }, "optim.schedule",
               {"integer scalar: got f32[]"});
  expect_error([] { Schedule(0.1)(int64_t{-1}); }, "optim.schedule", {"got -1"});
}

// ---- clipping ----------------------------------------------------------------------------

TEST(Clip, GlobalNorm) {
  const Net g = make_net(grad_values(1), float32);
  double sq = 0;
  for (double v : grad_values(1)) sq += v * v;
  const Tensor n = optim::global_norm(g);
  EXPECT_EQ(n.type().to_string(), "f32[]");
  EXPECT_NEAR(n.item<double>(), std::sqrt(sq), 1e-5);
  EXPECT_EQ(optim::global_norm(make_net(grad_values(1), float64)).dtype(), float64);
  EXPECT_NEAR(optim::global_norm(make_net(grad_values(1), float64)).item<double>(), std::sqrt(sq),
              1e-14);
  EXPECT_EQ(optim::global_norm(std::vector<Tensor>{}).item<float>(), 0.0f);
  EXPECT_EQ(optim::global_norm(std::vector<Tensor>{tensor({3.0f}), Tensor(), tensor({4.0f})})
                .item<float>(),
            5.0f);
  // bfloat16 leaves are summed in float32.
  EXPECT_EQ(optim::global_norm(astype(tensor({3.0f, 4.0f}), bfloat16)).dtype(), float32);
}

TEST(Clip, BelowAndAboveTheThreshold) {
  const std::vector<double> gv = grad_values(2);
  double sq = 0;
  for (double v : gv) sq += v * v;
  const double norm = std::sqrt(sq);
  const Net g = make_net(gv, float64);
  // Below: unchanged (the coefficient is clamped to exactly 1).
  EXPECT_EQ(flat(optim::clip_by_global_norm(g, 2 * norm)), gv);
  EXPECT_EQ(flat(optim::clip_by_global_norm(g, norm + 1e-3)), gv);
  // Above: scaled by max_norm / (norm + 1e-6), as torch.nn.utils.clip_grad_norm_.
  const double coef = (norm / 4) / (norm + 1e-6);
  std::vector<double> want;
  for (double v : gv) want.push_back(v * coef);
  const Net clipped = optim::clip_by_global_norm(g, norm / 4);
  expect_allclose(flat(clipped), want, {.rtol = 0, .atol = 1e-15}, "clipped");
  EXPECT_NEAR(optim::global_norm(clipped).item<double>(), norm / 4, 1e-6);
  // Under jit: same values, and one compiled program for both cases.
  auto f = jit([](const Net& x, const Tensor& dummy) {
    return std::pair{optim::clip_by_global_norm(x, 1.0), optim::global_norm(x) + dummy};
  });
  const Net small = make_net(std::vector<double>(kN, 0.01), float64);
  const auto [c1, n1] = f(g, tensor(0.0));
  const auto [c2, n2] = f(small, tensor(0.0));
  expect_allclose(flat(c1), flat(optim::clip_by_global_norm(g, 1.0)), {.rtol = 0, .atol = 1e-15},
                  "jit above");
  EXPECT_EQ(flat(c2), flat(small));
  EXPECT_NEAR(n1.item<double>(), norm, 1e-14);
  EXPECT_EQ(f.cache_size(), 1u);
  // Undefined leaves pass through.
  const auto partial = optim::clip_by_global_norm(
      std::vector<Tensor>{tensor({3.0f}), Tensor(), tensor({4.0f})}, 1.0);
  EXPECT_FALSE(partial[1].defined());
  EXPECT_NEAR(partial[0].item<float>(), 0.6f, 1e-6);
  expect_error([&] { optim::clip_by_global_norm(g, 0.0); }, "optim.clip_by_global_norm",
               {"max_norm must be positive and finite: got 0"});
}

// ---- errors ------------------------------------------------------------------------------

TEST(OptimErrors, MismatchedGradients) {
  const Optimizer opt = optim::adam();
  const stack::Stack p{{{zeros({4, 3})}, {zeros({3})}}};
  const auto s = opt.init(p);
  expect_error(
      [&] {
        opt.update(p, stack::Stack{{{zeros({3, 4})}, {zeros({3})}}}, s);
      },
      "optim.update",
      {"gradient for 'layers.0.w' has the wrong shape: got f32[3,4], expected f32[4,3]"});
  expect_error(
      [&] {
        opt.update(p, stack::Stack{{{zeros({4, 3})}, {zeros({3}, float64)}}}, s);
      },
      "optim.update",
      {"gradient for 'layers.1.w' has the wrong dtype: got f64[3], expected f32[3]"});
  expect_error(
      [&] {
        opt.update(p, stack::Stack{{{zeros({4, 3})}}}, s);
      },
      "optim.update",
      {"the gradients do not have the parameters' structure: at .layers: vector of 1 vs "
       "2 children (gradients vs parameters)"});
  // The same check under jit, at trace time.
  auto step = jit([opt](const stack::Stack& p, const stack::Stack& g,
                        const OptState<stack::Stack>& s) { return opt.update(p, g, s); });
  expect_error(
      [&] {
        step(p, stack::Stack{{{zeros({3, 4})}, {zeros({3})}}}, s);
      },
      "optim.update", {"gradient for 'layers.0.w' has the wrong shape"});
  // A root tensor.
  expect_error(
      [&] {
        const Tensor t = zeros({2});
        optim::sgd({.lr = 0.1}).update(t, zeros({3}), optim::sgd({.lr = 0.1}).init(t));
      },
      "optim.update", {"gradient for (root) has the wrong shape: got f32[3], expected f32[2]"});
}

TEST(OptimErrors, MismatchedState) {
  const Net p = make_net(initial_values(), float32);
  const Net g = make_net(grad_values(0), float32);
  const auto momentum_state = optim::sgd({.lr = 0.1, .momentum = 0.9}).init(p);
  expect_error([&] { optim::adam().update(p, g, momentum_state); }, "optim.update",
               {"the state has the wrong slots for adam: got {\"momentum\"}, expected {\"mu\", "
                "\"nu\"}"});
  auto bad_step = optim::adam().init(p);
  bad_step.step = tensor(0.0f);
  expect_error([&] { optim::adam().update(p, g, bad_step); }, "optim.update",
               {"state.step must be an i32 scalar: got f32[]"});
  expect_error([&] { optim::adam().update(p, g, OptState<Net>{}); }, "optim.update",
               {"state.step must be an i32 scalar: got an undefined tensor"});
  auto bad_slot = optim::adam().init(p);
  bad_slot.slots.at("nu").b = zeros({4});
  expect_error([&] { optim::adam().update(p, g, bad_slot); }, "optim.update",
               {"state slot \"nu\" for 'b' has the wrong shape: got f32[4], expected f32[3]"});
  auto short_slot = optim::adam().init(p);
  short_slot.slots.at("mu").extra.clear();
  expect_error([&] { optim::adam().update(p, g, short_slot); }, "optim.update",
               {"state slot \"mu\" does not have the parameters' structure: at .extra"});
}

TEST(OptimErrors, IntegerParameters) {
  const std::vector<Tensor> p{tensor({1.0f}), tensor({1, 2})};
  expect_error([&] { optim::adam().init(p); }, "optim.init",
               {"parameter '1' has dtype i32", "expected a floating-point tensor"});
}

TEST(OptimErrors, Options) {
  expect_error([] { optim::sgd({}); }, "optim.sgd", {"the learning rate is not set"});
  expect_error([] { optim::sgd({.lr = -0.1}); }, "optim.sgd", {"invalid learning rate: got -0.1"});
  expect_error([] { optim::sgd({.lr = 0.1, .nesterov = true}); }, "optim.sgd",
               {"Nesterov momentum requires a momentum and zero dampening"});
  expect_error([] { optim::sgd({.lr = 0.1, .momentum = 0.9, .dampening = 0.5, .nesterov = true}); },
               "optim.sgd", {"dampening=0.5"});
  expect_error([] { optim::sgd({.lr = 0.1, .momentum = -1}); }, "optim.sgd",
               {"invalid momentum: got -1"});
  expect_error([] { optim::adam({.b1 = 1.0}); }, "optim.adam", {"invalid b1: got 1"});
  expect_error([] { optim::adam({.b2 = -0.5}); }, "optim.adam", {"invalid b2"});
  expect_error([] { optim::adamw({.eps = -1e-8}); }, "optim.adamw", {"invalid eps"});
  expect_error([] { optim::adamw({.weight_decay = -1}); }, "optim.adamw", {"invalid weight_decay"});
  expect_error([] { optim::adam({.clip_norm = 0.0}); }, "optim.adam",
               {"clip_norm must be positive and finite: got 0"});
}

TEST(Optim, NamesAndCopies) {
  const Optimizer a = optim::adamw();
  const Optimizer b = a;  // shares the algorithm
  EXPECT_EQ(&a.algorithm(), &b.algorithm());
  EXPECT_EQ(a.name(), "adamw");
  EXPECT_EQ(a.slot_names(), (std::vector<std::string>{"mu", "nu"}));
  EXPECT_EQ(optim::sgd({.lr = 1}).name(), "sgd");
  EXPECT_TRUE(optim::sgd({.lr = 1}).slot_names().empty());
  EXPECT_DOUBLE_EQ(a.learning_rate(0), 1e-3);
}

}  // namespace
