// kiln.random: counter-based, splittable random numbers (Threefry-2x32), with JAX's signatures
// (`normal(key, shape=(), dtype=float32)`). A key is a uint32[2] tensor; never draw twice from
// one key: split it.
#include "bindings.h"

namespace kiln::python {
namespace {

Tensor key_arg(py::object key) { return to_tensor(key); }

// A floating parameter tensor (gamma's a, dirichlet's alpha): Python numbers become float32,
// or `dtype` when given; integer and bool tensors and arrays stay as they are, so the sampler
// raises for them (as categorical's logits and the C++ API do).
Tensor parameter(py::object value, py::object dtype) {
  const std::optional<DType> d = to_optional_dtype(dtype);
  const bool number = (py::isinstance<py::int_>(value) && !py::isinstance<py::bool_>(value)) ||
                      py::isinstance<py::float_>(value);
  return to_tensor(value, number ? d.value_or(float32) : d);
}

}  // namespace

void bind_random(py::module_& m) {
  py::module_ r = m.def_submodule("random", R"doc(
Random numbers from explicit keys, as in JAX: `key = kiln.random.key(0)`, `k1, k2 =
kiln.random.split(key)`, `kiln.random.normal(k1, (3, 4))`. The same key always gives the same
numbers, on any thread count; draws are traceable (jit) and batch under vmap over keys.)doc");
  r.def(
      "key", [](uint64_t seed) { return random::key(seed); }, py::arg("seed"),
      "A key (uint32[2]) from an integer seed.");
  r.attr("PRNGKey") = r.attr("key");
  r.def(
      "split",
      [](py::object key, py::object num) -> py::object {
        if (num.is_none()) {
          auto [a, b] = random::split(key_arg(key), Loc{});
          return py::make_tuple(a, b);
        }
        return py::cast(random::split(key_arg(key), to_int(num), Loc{}));
      },
      py::arg("key"), py::arg("num") = py::none(),
      "split(key): a tuple of two new keys; split(key, n): n keys stacked, uint32[n, 2] (which "
      "unpacks as `a, b, c = split(key, 3)`).");
  r.def(
      "fold_in",
      [](py::object key, int64_t data) {
        return random::fold_in(key_arg(key), static_cast<uint32_t>(data), Loc{});
      },
      py::arg("key"), py::arg("data"), "A new key derived from key and an integer (a step).");
  r.def(
      "bits",
      [](py::object key, py::object shape) {
        return random::bits(key_arg(key), to_shape(shape), Loc{});
      },
      py::arg("key"), py::arg("shape") = py::tuple(), "Raw uint32 bits.");
  r.def(
      "uniform",
      [](py::object key, py::object shape, py::object dtype, double minval, double maxval) {
        return random::uniform(key_arg(key), to_shape(shape),
                               to_optional_dtype(dtype).value_or(float32), minval, maxval, Loc{});
      },
      py::arg("key"), py::arg("shape") = py::tuple(), py::arg("dtype") = py::none(),
      py::arg("minval") = 0.0, py::arg("maxval") = 1.0, "Uniform in [minval, maxval).");
  r.def(
      "normal",
      [](py::object key, py::object shape, py::object dtype) {
        return random::normal(key_arg(key), to_shape(shape),
                              to_optional_dtype(dtype).value_or(float32), Loc{});
      },
      py::arg("key"), py::arg("shape") = py::tuple(), py::arg("dtype") = py::none(),
      "Standard normal.");
  r.def(
      "bernoulli",
      [](py::object key, py::object p, py::object shape) {
        if (!PyFloat_Check(p.ptr()) && !PyLong_Check(p.ptr())) {
          // Per-element probabilities: uniform draws below them.
          const Tensor probs = parameter(p, py::none());
          const Shape s = shape.is_none() ? probs.shape() : to_shape(shape);
          return less(random::uniform(key_arg(key), s, probs.dtype(), 0.0, 1.0, Loc{}), probs,
                      Loc{});
        }
        return random::bernoulli(key_arg(key), p.cast<double>(),
                                 shape.is_none() ? Shape{} : to_shape(shape), Loc{});
      },
      py::arg("key"), py::arg("p") = 0.5, py::arg("shape") = py::none(),
      "True with probability p (a number or a tensor; shape defaults to p's).");
  r.def(
      "randint",
      [](py::object key, py::object shape, int64_t minval, int64_t maxval, py::object dtype) {
        return random::randint(key_arg(key), to_shape(shape), minval, maxval,
                               to_optional_dtype(dtype).value_or(int32), Loc{});
      },
      py::arg("key"), py::arg("shape"), py::arg("minval"), py::arg("maxval"),
      py::arg("dtype") = py::none(), "Integers uniform in [minval, maxval).");
  r.def(
      "permutation",
      [](py::object key, py::object x, int64_t axis) {
        if (is_int(x)) return random::permutation(key_arg(key), to_int(x), Loc{});
        const Tensor t = to_tensor(x);
        return take(t, random::permutation(key_arg(key), t.dim(static_cast<int>(axis)), Loc{}),
                    axis, Loc{});
      },
      py::arg("key"), py::arg("x"), py::arg("axis") = 0,
      "A random permutation of 0..x-1 (an int x, int64), or x shuffled along `axis`.");
  r.def(
      "categorical",
      [](py::object key, py::object logits, int64_t axis, py::object shape) {
        if (shape.is_none())
          return random::categorical(key_arg(key), to_tensor(logits), axis, Loc{});
        return random::categorical(key_arg(key), to_tensor(logits), axis, to_shape(shape), Loc{});
      },
      py::arg("key"), py::arg("logits"), py::arg("axis") = -1, py::arg("shape") = py::none(),
      "Indices (int64) drawn with unnormalised log-probabilities `logits` along `axis`.");
  using Standard = Tensor (*)(const Tensor&, const Shape&, DType, Loc);
  const std::tuple<const char*, Standard, const char*> standard[] = {
      {"exponential", &random::exponential, "Standard exponential samples (rate 1)."},
      {"laplace", &random::laplace, "Standard Laplace samples (density exp(-|x|) / 2)."},
      {"gumbel", &random::gumbel, "Standard Gumbel samples (CDF exp(-exp(-x)))."},
  };
  for (const auto& [name, fn, doc] : standard)
    r.def(
        name,
        [fn = fn](py::object key, py::object shape, py::object dtype) {
          return fn(key_arg(key), to_shape(shape), to_optional_dtype(dtype).value_or(float32),
                    Loc{});
        },
        py::arg("key"), py::arg("shape") = py::tuple(), py::arg("dtype") = py::none(), doc);
  r.def(
      "poisson",
      [](py::object key, double lam, py::object shape, py::object dtype) {
        return random::poisson(key_arg(key), lam, to_shape(shape),
                               to_optional_dtype(dtype).value_or(int32), Loc{});
      },
      py::arg("key"), py::arg("lam"), py::arg("shape") = py::tuple(), py::arg("dtype") = py::none(),
      "Poisson(lam) counts (int32 by default), lam a float >= 0.");
  r.def(
      "truncated_normal",
      [](py::object key, double lower, double upper, py::object shape, py::object dtype) {
        return random::truncated_normal(key_arg(key), lower, upper, to_shape(shape),
                                        to_optional_dtype(dtype).value_or(float32), Loc{});
      },
      py::arg("key"), py::arg("lower"), py::arg("upper"), py::arg("shape") = py::tuple(),
      py::arg("dtype") = py::none(), "A standard normal truncated to [lower, upper].");
  using Sampler1 = Tensor (*)(const Tensor&, const Tensor&, Loc);
  using Sampler1Shaped = Tensor (*)(const Tensor&, const Tensor&, const Shape&, Loc);
  const struct {
    const char* name;
    Sampler1 fn;
    Sampler1Shaped shaped;
    const char* doc;
  } one_parameter[] = {
      {"gamma", &random::gamma, &random::gamma,
       "Gamma(a, 1) samples; shape defaults to a's (a broadcasts to it)."},
      {"loggamma", &random::loggamma, &random::loggamma,
       "log of Gamma(a, 1) samples, finite where gamma underflows (tiny a)."},
      {"dirichlet", &random::dirichlet, &random::dirichlet,
       "Dirichlet(alpha) samples, alpha [..., K]: shape + [K], each row summing to 1."},
  };
  for (const auto& s : one_parameter)
    r.def(
        s.name,
        [fn = s.fn, shaped = s.shaped](py::object key, py::object a, py::object shape,
                                       py::object dtype) {
          const Tensor p = parameter(a, dtype);
          if (shape.is_none()) return fn(key_arg(key), p, Loc{});
          return shaped(key_arg(key), p, to_shape(shape), Loc{});
        },
        py::arg("key"), py::arg("a"), py::arg("shape") = py::none(), py::arg("dtype") = py::none(),
        s.doc);
  r.def(
      "beta",
      [](py::object key, py::object a, py::object b, py::object shape, py::object dtype) {
        const Tensor pa = parameter(a, dtype), pb = parameter(b, dtype);
        if (shape.is_none()) return random::beta(key_arg(key), pa, pb, Loc{});
        return random::beta(key_arg(key), pa, pb, to_shape(shape), Loc{});
      },
      py::arg("key"), py::arg("a"), py::arg("b"), py::arg("shape") = py::none(),
      py::arg("dtype") = py::none(), "Beta(a, b) samples.");
  r.def(
      "choice",
      [](py::object key, py::object a, py::object shape, bool replace, py::object p, int64_t axis) {
        std::optional<Tensor> probs;
        if (!p.is_none()) probs = to_tensor(p);
        if (is_int(a))
          return random::choice(key_arg(key), to_int(a), to_shape(shape), replace, probs, Loc{});
        const Tensor t = to_tensor(a);
        const int ax = normalize_axis("choice", axis, t.rank());
        const Shape s = to_shape(shape);
        const Tensor r =
            random::choice(key_arg(key), moveaxis(t, ax, 0, Loc{}), s, replace, probs, Loc{});
        // The drawn axes stand where `axis` was, as in JAX.
        Axes perm;
        for (int i = 0; i < ax; ++i) perm.push_back(s.rank() + i);
        for (int i = 0; i < s.rank(); ++i) perm.push_back(i);
        for (int i = s.rank() + ax; i < r.rank(); ++i) perm.push_back(i);
        return transpose(r, perm, Loc{});
      },
      py::arg("key"), py::arg("a"), py::arg("shape") = py::tuple(), py::arg("replace") = true,
      py::arg("p") = py::none(), py::arg("axis") = 0,
      "Draws from range(a) (an int; int64 indices) or from a's entries along `axis`, with or "
      "without replacement, uniformly or with probabilities p.");
  r.def(
      "multivariate_normal",
      [](py::object key, py::object mean, py::object cov, py::object shape) {
        if (shape.is_none())
          return random::multivariate_normal(key_arg(key), to_tensor(mean), to_tensor(cov), Loc{});
        return random::multivariate_normal(key_arg(key), to_tensor(mean), to_tensor(cov),
                                           to_shape(shape), Loc{});
      },
      py::arg("key"), py::arg("mean"), py::arg("cov"), py::arg("shape") = py::none(),
      "Samples of N(mean, cov): mean + L z with L the Cholesky factor of cov.");
}

}  // namespace kiln::python
