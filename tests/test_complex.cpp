// Complex dtypes, fft and eig against independent references: complex<double> arithmetic in
// C++, the DFT as a direct O(n^2) sum, analytic eigenvalues and A V = V diag(w). The rules'
// derivatives are checked by the registry walks (tests/primitive_samples_complex.cpp).
#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include <cmath>
#include <complex>
#include <numbers>
#include <random>
#include <vector>

#include "testing.h"

namespace kiln {
namespace {

using C = std::complex<double>;
using Cs = std::vector<C>;

Cs values(const Tensor& t) { return astype(t, complex128).to_vector<C>(); }

void expect_near(const Cs& got, const Cs& want, double tol, std::string_view what = "") {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_LE(std::abs(got[i] - want[i]), tol * std::max(1.0, std::abs(want[i])))
        << what << " [" << i << "]: got " << got[i] << ", want " << want[i];
}

Cs random_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  Cs v(n);
  for (C& z : v) z = {normal(rng), normal(rng)};
  return v;
}

// The DFT of each row of x [rows, n], by its definition (sign -1 forward, +1 inverse).
Cs dft_rows(const Cs& x, std::size_t rows, std::size_t n, int sign) {
  Cs out(rows * n);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t k = 0; k < n; ++k) {
      C s = 0;
      for (std::size_t j = 0; j < n; ++j)
        s +=
            x[r * n + j] * std::polar(1.0, sign * 2 * std::numbers::pi *
                                               static_cast<double>(j * k) / static_cast<double>(n));
      out[r * n + k] = s;
    }
  return out;
}

TEST(ComplexDType, PromotionJoinsAboveEveryFloat) {
  EXPECT_EQ(promote_types(float32, complex64), complex64);
  EXPECT_EQ(promote_types(float64, complex64), complex128);
  EXPECT_EQ(promote_types(int64, complex64), complex64);
  EXPECT_EQ(promote_types(bfloat16, complex128), complex128);
  EXPECT_EQ(promote_types(complex64, complex128), complex128);
  EXPECT_EQ(dtype_size(complex64), 8u);
  EXPECT_EQ(dtype_size(complex128), 16u);
  EXPECT_EQ(dtype_from_name("c64"), complex64);
  EXPECT_FALSE(is_floating(complex64));
  EXPECT_TRUE(is_inexact(complex128));
}

TEST(ComplexDType, ArithmeticMatchesStdComplex) {
  const Cs a = random_values(12, 1), b = random_values(12, 2);
  const Tensor x = tensor(a, Shape{3, 4}), y = tensor(b, Shape{3, 4});
  Cs sum, diff, prod, quot, neg;
  for (std::size_t i = 0; i < a.size(); ++i) {
    sum.push_back(a[i] + b[i]);
    diff.push_back(a[i] - b[i]);
    prod.push_back(a[i] * b[i]);
    quot.push_back(a[i] / b[i]);
    neg.push_back(-a[i]);
  }
  expect_near(values(x + y), sum, 1e-15, "add");
  expect_near(values(x - y), diff, 1e-15, "sub");
  expect_near(values(x * y), prod, 1e-15, "mul");
  expect_near(values(x / y), quot, 1e-14, "div");
  expect_near(values(-x), neg, 1e-15, "neg");
  // A real operand promotes: float64 + complex64 is complex128, the real part added.
  const Tensor r = reshape(arange(0.0, 12.0, 1.0, float64), Shape{3, 4});
  const Tensor mixed = astype(x, complex64) + r;
  EXPECT_EQ(mixed.dtype(), complex128);
  Cs want;
  for (std::size_t i = 0; i < a.size(); ++i)
    want.push_back(C(std::complex<float>(a[i])) + static_cast<double>(i));
  expect_near(values(mixed), want, 1e-15, "f64 + c64");
  // A C++ double next to a complex tensor is weak: the tensor keeps its dtype.
  EXPECT_EQ((astype(x, complex64) * 2.0).dtype(), complex64);
}

TEST(ComplexDType, PartsAbsAngleAndConj) {
  const Cs a = random_values(6, 3);
  const Tensor z = tensor(a, Shape{2, 3});
  std::vector<double> re, im, mag, arg;
  Cs cj;
  for (const C& v : a) {
    re.push_back(v.real());
    im.push_back(v.imag());
    mag.push_back(std::abs(v));
    arg.push_back(std::arg(v));
    cj.push_back(std::conj(v));
  }
  testing::expect_allclose(real(z), tensor(re, Shape{2, 3}), {}, "real");
  testing::expect_allclose(imag(z), tensor(im, Shape{2, 3}), {}, "imag");
  testing::expect_allclose(abs(z), tensor(mag, Shape{2, 3}), {}, "abs");
  testing::expect_allclose(angle(z), tensor(arg, Shape{2, 3}), {}, "angle");
  expect_near(values(conj(z)), cj, 0.0, "conj");
  expect_near(values(complex(real(z), imag(z))), a, 0.0, "complex(re, im)");
  // |z| does not overflow where re^2 + im^2 would (hypot).
  const Tensor big = tensor(std::vector<std::complex<float>>{{3e30f, 4e30f}});
  EXPECT_NEAR(abs(big).item<double>() / 5e30, 1.0, 1e-6);
  // numpy's answers for real inputs: real(x) = x, imag(x) = 0, angle of a negative is pi.
  const Tensor x = tensor({-1.0, 2.0});
  EXPECT_EQ(imag(x).to_vector<double>(), (std::vector<double>{0.0, 0.0}));
  EXPECT_NEAR(angle(x).to_vector<double>()[0], std::numbers::pi, 1e-12);
}

TEST(ComplexDType, ReductionsMatmulAndConversion) {
  const Cs a = random_values(6, 4), b = random_values(6, 5);
  const Tensor x = tensor(a, Shape{2, 3}), y = tensor(b, Shape{3, 2});
  Cs rows(2), mm(4);
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 3; ++k) {
      rows[static_cast<std::size_t>(i)] += a[static_cast<std::size_t>(i * 3 + k)];
      for (int j = 0; j < 2; ++j)
        mm[static_cast<std::size_t>(i * 2 + j)] +=
            a[static_cast<std::size_t>(i * 3 + k)] * b[static_cast<std::size_t>(k * 2 + j)];
    }
  expect_near(values(sum(x, {1})), rows, 1e-15, "sum");
  expect_near(values(mean(x, {1})), {rows[0] / 3.0, rows[1] / 3.0}, 1e-15, "mean");
  expect_near(values(matmul(x, y)), mm, 1e-14, "matmul (zgemm)");
  expect_near(values(matmul(astype(x, complex64), astype(y, complex64))), mm, 1e-6, "cgemm");
  // complex -> real keeps the real part (numpy's astype); real -> complex has imaginary 0.
  EXPECT_EQ(astype(x, float64).to_vector<double>()[1], a[1].real());
  EXPECT_EQ(values(astype(tensor({2.5}), complex64))[0], C(2.5, 0.0));
  EXPECT_EQ(astype(tensor(std::vector<C>{{0, 1}, {0, 0}}), bool_).to_vector<bool>(),
            (std::vector<bool>{true, false}));
}

TEST(ComplexDType, UnsupportedOperationsRaiseNamedErrors) {
  const Tensor z = tensor(random_values(4, 6));
  EXPECT_THROW(exp(z), Error);
  EXPECT_THROW(maximum(z, z), Error);
  EXPECT_THROW(less(z, z), Error);
  EXPECT_THROW(max(z), Error);
  try {
    (void)sin(z);
    FAIL() << "sin of complex128 did not raise";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[sin]"), std::string::npos) << e.what();
  }
}

TEST(ComplexDType, PrintsAndRoundTripsThroughTheTextIr) {
  const Tensor z = tensor(std::vector<C>{{1.5, -2.0}, {0.0, 0.25}});
  EXPECT_EQ(to_string(z), "[1.5-2.j  , 0. +0.25j]");  // numpy's repr, without "array(...)"
  // A function holding a complex constant prints, parses back and computes the same.
  const Tensor c = tensor(std::vector<C>{{1.0, -3.5e-7}, {-0.0, 2.0}});
  const ir::Traced traced = ir::trace_function(
      "scale", {TensorType{complex128, Shape{2}}},
      [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * c}; });
  const std::string text = ir::print(*traced.function);
  const std::shared_ptr<ir::Function> g = ir::parse(text);
  EXPECT_EQ(ir::print(*g), text);
  const std::vector<Tensor> in{tensor(std::vector<C>{{2.0, 1.0}, {1.0, -1.0}})};
  expect_near(values(ir::evaluate(*g, in)[0]), values(in[0] * c), 0.0, "parsed constant");
}

TEST(Fft, MatchesTheDirectSum) {
  for (std::size_t n : {1u, 2u, 5u, 8u, 12u}) {
    const Cs x = random_values(3 * n, static_cast<unsigned>(n));
    const Tensor t = tensor(x, Shape{3, static_cast<int64_t>(n)});
    const Cs want = dft_rows(x, 3, n, -1);
    expect_near(values(fft::fft(t)), want, 1e-12, "fft");
    Cs inv = dft_rows(x, 3, n, +1);
    for (C& v : inv) v /= static_cast<double>(n);
    expect_near(values(fft::ifft(t)), inv, 1e-12, "ifft");
    // ortho scales both ways by 1/sqrt(n); forward puts 1/n on the forward transform.
    Cs ortho = want;
    for (C& v : ortho) v /= std::sqrt(static_cast<double>(n));
    expect_near(values(fft::fft(t, std::nullopt, -1, fft::Norm::ortho)), ortho, 1e-12, "ortho");
    expect_near(values(fft::ifft(fft::fft(t, std::nullopt, -1, fft::Norm::forward), std::nullopt,
                                 -1, fft::Norm::forward)),
                x, 1e-12, "forward norm round trip");
    // float32 input gives complex64.
    EXPECT_EQ(fft::fft(astype(real(t), float32)).dtype(), complex64);
  }
}

TEST(Fft, CropsPadsAndTransformsAnyAxis) {
  const Cs x = random_values(4 * 6, 7);
  const Tensor t = tensor(x, Shape{4, 6});
  // n = 4 crops each row to its first 4 points; n = 9 pads with zeros.
  for (int64_t n : {4, 9}) {
    Cs sized(static_cast<std::size_t>(4 * n));
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t j = 0; j < std::min<int64_t>(n, 6); ++j)
        sized[static_cast<std::size_t>(r * n + j)] = x[static_cast<std::size_t>(r * 6 + j)];
    expect_near(values(fft::fft(t, n)), dft_rows(sized, 4, static_cast<std::size_t>(n), -1), 1e-12,
                "n = " + std::to_string(n));
  }
  // Along axis 0: the transform of the transpose, transposed back.
  expect_near(values(fft::fft(t, std::nullopt, 0)), values(transpose(fft::fft(transpose(t)))),
              1e-12, "axis 0");
  // fft2 is fft along both axes.
  expect_near(values(fft::fft2(t)), values(fft::fft(fft::fft(t, std::nullopt, 0), std::nullopt, 1)),
              1e-12, "fft2");
  expect_near(values(fft::ifftn(fft::fftn(t))), x, 1e-12, "ifftn(fftn(x))");
}

TEST(Fft, RealTransformsMatchTheComplexOnes) {
  for (int64_t n : {1, 6, 7}) {
    const Tensor x = random::normal(random::key(static_cast<uint64_t>(n)), Shape{2, n}, float64);
    const Cs full = values(fft::fft(x));
    Cs half;
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t k = 0; k <= n / 2; ++k)
        half.push_back(full[static_cast<std::size_t>(r * n + k)]);
    expect_near(values(fft::rfft(x)), half, 1e-12, "rfft");
    testing::expect_allclose(fft::irfft(fft::rfft(x), n), x, {.rtol = 1e-12, .atol = 1e-12},
                             "irfft(rfft(x))");
    testing::expect_allclose(fft::irfftn(fft::rfftn(x), std::vector<int64_t>{2, n}), x,
                             {.rtol = 1e-12, .atol = 1e-12}, "irfftn(rfftn(x))");
  }
  // irfft ignores the imaginary part of frequency 0 (and of n/2 for even n), as numpy does.
  const Tensor spectrum = tensor(std::vector<C>{{1.0, 5.0}, {2.0, 1.0}, {0.5, -3.0}});
  testing::expect_allclose(
      fft::irfft(spectrum, 4),
      fft::irfft(tensor(std::vector<C>{{1.0, 0.0}, {2.0, 1.0}, {0.5, 0.0}}), 4),
      {.rtol = 1e-15, .atol = 1e-15}, "ignored imaginary parts");
  // and is the real part of the inverse of the Hermitian extension.
  const Cs ext{{1.0, 0.0}, {2.0, 1.0}, {0.5, 0.0}, {2.0, -1.0}};
  Cs want = dft_rows(ext, 1, 4, +1);
  std::vector<double> re;
  for (const C& v : want) re.push_back(v.real() / 4.0);
  testing::expect_allclose(fft::irfft(spectrum, 4), tensor(re), {.rtol = 1e-14, .atol = 1e-14});
}

TEST(Fft, FrequenciesAndShifts) {
  testing::expect_allclose(fft::fftfreq(5, 0.5, float64), tensor({0.0, 0.4, 0.8, -0.8, -0.4}), {},
                           "fftfreq odd");
  testing::expect_allclose(fft::fftfreq(4, 1.0, float64), tensor({0.0, 0.25, -0.5, -0.25}), {},
                           "fftfreq even");
  testing::expect_allclose(fft::rfftfreq(5, 1.0, float64), tensor({0.0, 0.2, 0.4}), {}, "rfftfreq");
  const Tensor f = fft::fftfreq(5, 1.0, float64);
  testing::expect_allclose(fft::fftshift(f), tensor({-0.4, -0.2, 0.0, 0.2, 0.4}), {}, "fftshift");
  testing::expect_allclose(fft::ifftshift(fft::fftshift(f)), f, {}, "ifftshift");
}

TEST(Fft, BadArgumentsRaise) {
  const Tensor z = tensor(random_values(4, 8));
  EXPECT_THROW(fft::fft(z, 0), Error);
  EXPECT_THROW(fft::rfft(z), Error);  // complex input to a real transform
  EXPECT_THROW(fft::fftn(z, std::nullopt, std::vector<int64_t>{0, 0}), Error);
  EXPECT_THROW(fft::fftn(z, std::vector<int64_t>{2, 2}, std::vector<int64_t>{0}), Error);
  EXPECT_THROW(fft::fft(z, std::nullopt, 3), Error);
  EXPECT_THROW(fft::irfft(tensor(random_values(1, 9))), Error);  // 2 * (1 - 1) = 0 points
}

TEST(Fft, BatchesUnderVmapAndCompiles) {
  const Tensor x = random::normal(random::key(3), Shape{4, 7}, float64);
  const auto f = [](const Tensor& v) { return fft::irfft(fft::rfft(v) * fft::rfft(v), 7); };
  std::vector<Tensor> rows;
  for (int64_t i = 0; i < 4; ++i) rows.push_back(f(index(x, i)));
  testing::expect_allclose(vmap(f)(x), stack(rows), {.rtol = 1e-12, .atol = 1e-12}, "vmap");
  testing::expect_allclose(jit(f)(x), f(x), {.rtol = 0, .atol = 0}, "jit");
}

TEST(Eig, SatisfiesTheDefinitionAndMatchesAnalyticValues) {
  const Tensor a = random::normal(random::key(11), Shape{2, 5, 5}, float64);
  const linalg::Eig e = linalg::eig(a);
  ASSERT_EQ(e.eigenvalues.dtype(), complex128);
  const Tensor ac = astype(a, complex128);
  expect_near(values(matmul(ac, e.eigenvectors)),
              values(e.eigenvectors * expand_dims(e.eigenvalues, -2)), 1e-12, "A V = V diag(w)");
  // Unit columns.
  testing::expect_allclose(sum(real(e.eigenvectors * conj(e.eigenvectors)), {-2}),
                           ones(Shape{2, 5}, float64), {.rtol = 1e-12, .atol = 1e-12}, "|v| = 1");
  // A rotation by theta has eigenvalues e^(+-i theta).
  const double th = 0.7;
  const Tensor rot = tensor({std::cos(th), -std::sin(th), std::sin(th), std::cos(th)}, Shape{2, 2});
  Cs w = values(linalg::eigvals(rot));
  std::sort(w.begin(), w.end(), [](C p, C q) { return p.imag() < q.imag(); });
  expect_near(w, {std::polar(1.0, -th), std::polar(1.0, th)}, 1e-14, "rotation");
  // Complex input: a triangular matrix's eigenvalues are its diagonal.
  const Tensor tri = tensor(std::vector<C>{{1, 1}, {2, 0}, {0, 0}, {-3, 0.5}}, Shape{2, 2});
  Cs tw = values(linalg::eigvals(tri));
  std::sort(tw.begin(), tw.end(), [](C p, C q) { return p.real() < q.real(); });
  expect_near(tw, {{-3, 0.5}, {1, 1}}, 1e-14, "triangular");
  // float32 gives complex64; NaN input gives NaN, a non-square matrix raises.
  EXPECT_EQ(linalg::eigvals(astype(rot, float32)).dtype(), complex64);
  const Tensor nan = full(Shape{2, 2}, std::nan(""), float64);
  EXPECT_TRUE(std::isnan(values(linalg::eigvals(nan))[0].real()));
  EXPECT_THROW(linalg::eig(zeros(Shape{2, 3}, float64)), Error);
}

TEST(ComplexDType, NormsLossScalingAndTreeNormsUseMagnitudes) {
  const Tensor z = tensor(std::vector<C>{{3, 4}, {0, -1}, {6, 8}});  // |z| = 5, 1, 10
  EXPECT_NEAR(linalg::norm(z).item<double>(), std::sqrt(126.0), 1e-12);
  EXPECT_NEAR(linalg::vector_norm(z, 1).item<double>(), 16.0, 1e-12);
  EXPECT_NEAR(linalg::vector_norm(z, INFINITY).item<double>(), 10.0, 1e-12);
  const Tensor m = reshape(concatenate({z, tensor(std::vector<C>{{0, 2}})}), Shape{2, 2});
  EXPECT_NEAR(linalg::matrix_norm(m, 1).item<double>(), 15.0, 1e-12);  // max column sum of |m|
  EXPECT_THROW(linalg::matrix_norm(m, 2), Error);  // singular values of complex: not supported
  EXPECT_NEAR(tree_norm(std::vector<Tensor>{z}).item<double>(), std::sqrt(126.0), 1e-12);
  // Unscaling keeps the imaginary parts.
  const optim::LossScale state{full(Shape{}, 2.0, float32), zeros(Shape{}, int32)};
  const auto [unscaled, finite] = optim::LossScaler().unscale(std::vector<Tensor>{z}, state);
  expect_near(values(unscaled[0]), {{1.5, 2}, {0, -0.5}, {3, 4}}, 1e-7, "unscaled");
  EXPECT_TRUE(finite.item<bool>());
  // nan_to_num replaces NaN and infinities in each part.
  const Tensor bad = tensor(std::vector<C>{{std::nan(""), INFINITY}, {1, -INFINITY}});
  const Cs fixed = values(nan_to_num(bad, {.nan = 0.0, .posinf = 7.0, .neginf = -7.0}));
  expect_near(fixed, {{0, 7}, {1, -7}}, 0.0, "nan_to_num");
}

TEST(ComplexGrad, RealLossesFollowJaxsConvention) {
  // f(z) = |z|^2 = x^2 + y^2: JAX's grad is df/dx - i df/dy = 2 conj(z).
  const Tensor z = tensor(std::vector<C>{{3.0, 4.0}, {-1.0, 0.5}});
  const Tensor g = grad([](const Tensor& v) { return sum(real(v * conj(v))); })(z);
  expect_near(values(g), {{6.0, -8.0}, {-2.0, -1.0}}, 1e-15, "grad |z|^2");
  // Parseval: sum |fft(x)|^2 = n sum x^2, so the gradient for real x is 2 n x.
  const Tensor x = random::normal(random::key(5), Shape{6}, float64);
  const Tensor gx = grad([](const Tensor& v) { return sum(square(abs(fft::fft(v)))); })(x);
  testing::expect_allclose(gx, x * 12.0, {.rtol = 1e-12, .atol = 1e-12}, "Parseval");
}

}  // namespace
}  // namespace kiln
