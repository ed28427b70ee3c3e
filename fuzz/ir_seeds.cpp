// Writes the seed corpus of fuzz_ir: the printed IR of real programs (a gradient step of an
// MLP, control flow and its derivatives, vmap, custom rules, convolutions, every dtype), each
// as traced and as optimised. Built against the ordinary build (clang 16 with -fopenmp, as in
// build-fuzz, rejects the lambdas of grad that capture structured bindings):
//   c++ -std=c++20 -Iinclude fuzz/ir_seeds.cpp -Lbuild -lkiln -Wl,-rpath,$PWD/build \
//     -o build/ir_seeds && build/ir_seeds fuzz/corpus/ir
#include <kiln/kiln.h>

#include <cstdio>
#include <fstream>
#include <iostream>

using namespace kiln;
using P = std::pair<Tensor, Tensor>;

namespace {

struct Seeds {
  std::string dir;
  int count = 0;

  void add(const std::string& name, const ir::Function& f) {
    write(name, f);
    write(name + "_opt", ir::optimize(f));
  }
  void write(const std::string& name, const ir::Function& f) {
    const std::string text = ir::print(f);
    // A seed the parser refuses would only seed the error paths.
    if (ir::print(*ir::parse(text)) != text) fail("ir_seeds", "@", name, " does not round-trip");
    std::ofstream(dir + "/" + name + ".ir") << text << "\n";
    ++count;
  }
};

Tensor normal(uint64_t seed, const Shape& shape) {
  return random::normal(random::key(seed), shape);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus directory>\n", argv[0]);
    return 2;
  }
  Seeds s{argv[1]};
  const Tensor x = normal(1, {4, 3}), w1 = normal(2, {3, 5}), b1 = normal(3, {5}),
               w2 = normal(4, {5, 2}), v = normal(5, {3});
  const Tensor labels = tensor({0, 1, 1, 0});

  auto mlp_loss = [](const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& x,
                     const Tensor& y) {
    return nn::cross_entropy(matmul(nn::relu(matmul(x, w1) + b1), w2), y);
  };
  s.add("mlp_grad", trace(grad(mlp_loss, argnums<0, 1, 2>), w1, b1, w2, x, labels));
  s.add("mlp_value_and_grad", trace(value_and_grad(mlp_loss), w1, b1, w2, x, labels));

  auto loop = [](const Tensor& a) {
    return while_loop([](const P& c) { return sum(c.second) < 100.f; },
                      [](const P& c) {
                        return P{c.first + 1, c.second * 1.5f + 0.25f};
                      },
                      P{tensor(0), a})
        .second;
  };
  s.add("while_loop", trace(loop, v));
  s.add("while_loop_grad", trace(grad([&](const Tensor& a) { return sum(loop(a)); }), v));

  auto rnn = [](const Tensor& h0, const Tensor& xs) {
    auto [h, ys] = scan(
        [](const Tensor& h, const Tensor& x) {
          return P{tanh(h * 0.5f + x), h * x};
        },
        h0, xs);
    return sum(h) + sum(ys);
  };
  s.add("scan", trace(rnn, v, x));
  s.add("scan_grad", trace(grad(rnn, argnums<0, 1>), v, x));
  s.add("scan_reverse", trace(
                            [](const Tensor& xs) {
                              return scan(
                                         [](const Tensor& c, const Tensor& x) {
                                           return P{c + x, c};
                                         },
                                         tensor(0.f), xs, ScanOptions{.reverse = true})
                                  .second;
                            },
                            v));
  s.add("fori_loop",
        trace(
            [](const Tensor& a) {
              return fori_loop(
                  0, 3, [](const Tensor& i, const Tensor& c) { return c * astype(i, float32); }, a);
            },
            v));

  auto branchy = [](const Tensor& a) {
    return cond(
        sum(a) > 0.f, [](const Tensor& t) { return sin(t) * 2.f; },
        [](const Tensor& t) { return exp(-t); }, a);
  };
  s.add("cond", trace(branchy, v));
  s.add("cond_grad", trace(grad([&](const Tensor& a) { return sum(branchy(a)); }), v));
  s.add("switch", trace(
                      [](const Tensor& i, const Tensor& a) {
                        return switch_(
                            i, [&] { return a; }, [&] { return a * a; }, [&] { return -a; });
                      },
                      tensor(1), v));

  auto per_example = [](const Tensor& w, const Tensor& row) { return sum(tanh(matmul(row, w))); };
  s.add("vmap", trace([&](const Tensor& w,
                          const Tensor& xs) { return vmap(per_example, in_axes(none, 0))(w, xs); },
                      w1, x));
  s.add("vmap_grad",
        trace([&](const Tensor& w,
                  const Tensor& xs) { return vmap(grad(per_example), in_axes(none, 0))(w, xs); },
              w1, x));
  s.add("vmap_cond", trace(vmap(branchy), x));

  auto clipped = custom_vjp([](const Tensor& a) { return a * a; },
                            [](const std::tuple<Tensor>& p, const Tensor&, const Tensor& ct) {
                              return std::make_tuple(clip(ct * std::get<0>(p) * 2.f, -1.0, 1.0));
                            });
  s.add("custom_vjp", trace(clipped, v));
  s.add("custom_vjp_grad", trace(grad([&](const Tensor& a) { return sum(clipped(a)); }), v));
  auto saved = custom_vjp(  // the residual form: fwd's cos(a) is a result, read by bwd
      [](const Tensor& a) { return sin(a); },
      [](const Tensor& a) { return std::make_pair(sin(a), cos(a)); },
      [](const Tensor& cos_a, const Tensor& ct) { return std::make_tuple(ct * cos_a); });
  s.add("custom_vjp_residuals_grad",
        trace(grad([&](const Tensor& a) { return sum(saved(a)); }), v));
  auto smooth = custom_jvp([](const Tensor& a) { return log1p(exp(a)); },
                           [](const std::tuple<Tensor>& p, const std::tuple<Tensor>& t) {
                             return std::get<0>(t) * sigmoid(std::get<0>(p));
                           });
  s.add("custom_jvp",
        trace([&](const Tensor& a,
                  const Tensor& t) { return jvp(smooth, std::make_tuple(a), std::make_tuple(t)); },
              v, v));
  auto remat = checkpoint([](const Tensor& t) { return sin(cos(t)); });
  s.add("checkpoint", trace(remat, v));
  s.add("checkpoint_grad",
        trace(grad([&](const Tensor& a) { return sum(remat(a) * stop_gradient(a)); }), v));
  s.add("hessian", trace(hessian([](const Tensor& a) { return sum(a * a * a); }), v));
  auto inner = jit([](const Tensor& a) { return softmax(a, -1); }, "inner");
  s.add("nested_jit", trace([&](const Tensor& a) { return inner(a) + inner(a * 2.f); }, x));

  const Tensor image = normal(6, {2, 1, 6, 6}), kernel = normal(7, {3, 1, 3, 3});
  s.add("conv_pool_grad",
        trace(grad([](const Tensor& k, const Tensor& img) {
                return mean(max_pool2d(nn::relu(conv2d(img, k, {.padding = {1, 1}})))) +
                       mean(avg_pool2d(img));
              }),
              kernel, image));

  s.add("random", trace(
                      [](const Tensor& key) {
                        auto [a, b] = random::split(key);
                        return random::normal(a, {3}) +
                               random::uniform(random::fold_in(b, 3), {3}) +
                               astype(random::permutation(b, 3), float32) +
                               astype(random::bits(a, {3}), float32);
                      },
                      random::key(0)));
  s.add("dtypes",
        trace(
            [](const Tensor& a, const Tensor& i) {
              const Tensor big = tensor(std::vector<int64_t>{9007199254740993LL, -3}, Shape{2});
              const Tensor h = astype(a, float16) * astype(tensor(0.5), float16);
              const Tensor b = astype(a, bfloat16) + astype(tensor(-65504.0), bfloat16);
              const Tensor u =
                  astype(i, uint8) + astype(tensor(std::vector<int>{255, 0}, Shape{2}), uint8);
              const Tensor m = where(a > 0.f, astype(h, float32), astype(b, float32));
              return std::make_tuple(m, astype(i, int64) * big, u, astype(a, float64) / 3.0,
                                     logical_and(a > 0.f, i < 1), astype(i, uint32) + 7u);
            },
            normal(8, {2}), tensor({1, -2})));
  s.add("gather", trace(grad([](const Tensor& a, const Tensor& idx) {
                          return sum(take(a, idx, 0)) + sum(one_hot(idx, 3) * 2.f) +
                                 sum(flip(pad(a, {{1, 2}}), {0}));
                        }),
                        v, tensor({2, 0, 1})));
  s.add("shapes", trace(
                      [](const Tensor& a) {
                        const Tensor r = reshape(a, {2, 6});
                        return transpose(
                            concatenate({r, broadcast_to(expand_dims(sum(r, {0}), 0), {3, 6})}, 0));
                      },
                      normal(9, {3, 4})));

  std::printf("wrote %d seeds to %s\n", s.count, argv[1]);
}
