// The complex rows of the primitive table (primitive_samples.h): the complex-number, Fourier
// and eig primitives, and the complex kernels of the arithmetic ones. The walks draw float64
// inputs and compare float64 outputs, so each sample is a small function from real parts to
// the real and imaginary parts of its result: the AD walk then checks the complex rules under
// JAX's convention (a real function's derivatives), the vmap and compiled walks the rest.
#include "primitive_samples.h"

namespace kiln::samples {
namespace {

Tensor z_of(const Tensor& re, const Tensor& im) { return kiln::complex(re, im); }
Ts parts(const Tensor& z) { return {real(z), imag(z)}; }

Shape some_shape(Gen& g) { return Shape{g.dim(), g.dim(2, 3), g.dim(3, 5)}; }

// A sample whose inputs are `count` real tensors of one shape.
PrimitiveSample parts_sample(std::string prim, std::string label, int count,
                             std::function<Ts(const Ts&)> body,
                             std::function<Shape(Gen&)> shape = some_shape) {
  return {.prim = std::move(prim),
          .label = std::move(label),
          .make =
              [count, shape](Gen& g) {
                const Shape s = shape(g);
                Sample out;
                for (int i = 0; i < count; ++i) out.args.push_back({g.normal(s)});
                return out;
              },
          .body = std::move(body)};
}

// A [n, n] matrix P D P^-1 with well-separated eigenvalues: distinct reals, or (pairs) one
// conjugate pair a +- bi among them; P near the identity, so the eigenvectors are well
// conditioned and LAPACK's order of the eigenvalues stays put under small steps.
Tensor separated(Gen& g, int64_t n, bool pairs) {
  std::vector<double> d(static_cast<std::size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i)
    d[static_cast<std::size_t>(i * n + i)] = 1.0 + 1.5 * static_cast<double>(i);
  if (pairs && n >= 2) d[1] = -2.0, d[static_cast<std::size_t>(n)] = 2.0;  // [[1, -2], [2, 2.5]]
  const Tensor p = eye(n, float64) + g.normal(Shape{n, n}) * 0.1;
  return matmul(matmul(p, tensor(d, Shape{n, n})), linalg::inv(p));
}

Ts eig_parts(const Tensor& a, bool vectors) {  // a real or complex
  const Ts out = bind(primitive("eig"), {a}, {{"vectors", vectors}});
  Ts r = parts(out[0]);
  if (vectors) r.push_back(real(out[1] * conj(out[1])));  // |v|^2: independent of the phase
  return r;
}

}  // namespace

void add_complex_samples(std::vector<PrimitiveSample>& c) {
  c.push_back(parts_sample("complex", "", 2, [](const Ts& a) {
    const Tensor z = bind1(primitive("complex"), {a[0], a[1]});
    return parts(z * z);
  }));
  c.push_back(parts_sample("real", "", 2, [](const Ts& a) {
    const Tensor z = z_of(a[0], a[1]);
    return Ts{bind1(primitive("real"), {z * z})};
  }));
  c.push_back(parts_sample("imag", "", 2, [](const Ts& a) {
    const Tensor z = z_of(a[0], a[1]);
    return Ts{bind1(primitive("imag"), {z * z})};
  }));
  c.push_back(parts_sample("conj", "", 4, [](const Ts& a) {
    return parts(bind1(primitive("conj"), {z_of(a[0], a[1])}) * z_of(a[2], a[3]));
  }));
  // conj bound directly on a complex input, for the walks that take one (the algebra walk checks
  // that it is an involution); the AD walk's real functions are the body sample above.
  c.push_back({.prim = "conj",
               .label = "complex_input",
               .make =
                   [](Gen& g) {
                     const Shape s = some_shape(g);
                     return Sample{{{z_of(g.normal(s), g.normal(s))}}, {}};
                   },
               .ad = {.check = false}});
  PrimitiveSample abs_sample = parts_sample("complex_abs", "", 2, [](const Ts& a) {
    return Ts{bind1(primitive("complex_abs"), {z_of(a[0], a[1])})};
  });
  abs_sample.make = [](Gen& g) {  // away from 0, where |z| has its kink
    const Shape s = some_shape(g);
    return Sample{{{g.away_from_zero(s, 0.3, 1.5)}, {g.away_from_zero(s, 0.3, 1.5)}}, {}};
  };
  c.push_back(abs_sample);

  // The complex kernels of the arithmetic primitives.
  for (const char* op : {"add", "sub", "mul", "div"})
    c.push_back(parts_sample(op, "complex", 4, [op](const Ts& a) {
      const Tensor x = z_of(a[0], a[1]), y = z_of(a[2], a[3]) + 3.0;  // y away from 0 for div
      return parts(bind1(primitive(op), {x, y}));
    }));
  c.push_back(parts_sample("neg", "complex", 2, [](const Ts& a) {
    return parts(bind1(primitive("neg"), {z_of(a[0], a[1])}));
  }));
  c.push_back(parts_sample("reduce_prod", "complex", 2, [](const Ts& a) {
    return parts(
        bind1(primitive("reduce_prod"), {z_of(a[0], a[1])}, {{"axes", std::vector<int64_t>{1}}}));
  }));
  c.push_back(parts_sample("reduce_sum", "complex", 2, [](const Ts& a) {
    return parts(
        bind1(primitive("reduce_sum"), {z_of(a[0], a[1])}, {{"axes", std::vector<int64_t>{0, 2}}}));
  }));
  c.push_back(parts_sample(
      "matmul", "complex", 4,
      [](const Ts& a) {
        const Tensor x = z_of(a[0], a[1]), y = z_of(a[2], a[3]);
        return parts(bind1(primitive("matmul"), {x, swapaxes(y, -1, -2)}));
      },
      [](Gen& g) {
        return Shape{g.dim(1, 2), g.dim(2, 3), 3};
      }));

  // Fourier transforms: odd and even lengths, one and two axes, both directions.
  for (bool inverse : {false, true})
    for (int64_t ndim : {1, 2})
      c.push_back(parts_sample(
          "fft", std::string(inverse ? "inverse" : "forward") + "_" + std::to_string(ndim) + "d", 2,
          [=](const Ts& a) {
            return parts(bind1(primitive("fft"), {z_of(a[0], a[1])},
                               {{"inverse", inverse}, {"ndim", ndim}}));
          }));
  c.push_back(parts_sample("rfft", "", 1,
                           [](const Ts& a) { return parts(bind1(primitive("rfft"), {a[0]})); }));
  c.push_back(parts_sample(
      "rfft", "even", 1, [](const Ts& a) { return parts(bind1(primitive("rfft"), {a[0]})); },
      [](Gen& g) {
        return Shape{g.dim(1, 2), 6};
      }));
  for (int64_t n : {5, 6})
    c.push_back(parts_sample(
        "irfft", n % 2 ? "odd" : "even", 2,
        [n](const Ts& a) {
          return Ts{bind1(primitive("irfft"), {z_of(a[0], a[1])}, {{"n", n}})};
        },
        [n](Gen& g) {
          return Shape{g.dim(1, 2), n / 2 + 1};
        }));

  // eig of real matrices with real eigenvalues and with a conjugate pair, values and vectors.
  for (bool pairs : {false, true})
    for (bool vectors : {false, true}) {
      const std::string label =
          std::string(pairs ? "pair" : "real") + (vectors ? "_vectors" : "_values");
      c.push_back({.prim = "eig",
                   .label = label,
                   .make =
                       [=](Gen& g) {
                         return Sample{{{separated(g, 3, pairs)}}, {}};
                       },
                   .body = [=](const Ts& a) { return eig_parts(a[0], vectors); },
                   .ad = {.fd_rtol = 1e-5, .dot_rtol = 1e-9, .hvp_rtol = 1e-4}});
    }
  // eig of a complex matrix: a real one with separated eigenvalues plus a small imaginary part.
  for (bool vectors : {false, true})
    c.push_back({.prim = "eig",
                 .label = vectors ? "complex_vectors" : "complex_values",
                 .make =
                     [](Gen& g) {
                       return Sample{{{separated(g, 3, false)}, {g.normal(Shape{3, 3}) * 0.1}}, {}};
                     },
                 .body = [=](const Ts& a) { return eig_parts(z_of(a[0], a[1]), vectors); },
                 .ad = {.fd_rtol = 1e-5, .dot_rtol = 1e-9, .hvp_rtol = 1e-4}});
}

}  // namespace kiln::samples
