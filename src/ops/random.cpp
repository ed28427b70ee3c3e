// Counter-based random primitives on Threefry-2x32 (20 rounds, as in JAX and Random123).
// Every primitive takes keys of shape [..., 2] (uint32), so a batch of keys needs no extra
// rule: the leading axes are carried through. Each output element depends only on the key and
// its index, never on thread scheduling.
#include "kiln/random.h"

#include <cmath>
#include <numbers>

#include "detail/dtype_dispatch.h"
#include "detail/parallel.h"
#include "kiln/ops.h"
#include "ops/primitives.h"
#include "ops/rules.h"
#include "ops/threefry.h"

namespace kiln {
namespace {

using namespace rng;

Shape attr_shape(const Attrs& a) { return Shape(a.get_ints("shape")); }

}  // namespace

const Primitive& prim::random_bits() {
  static const Primitive& p = detail::register_builtin(
      {.name = "random_bits",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             expect_key("random_bits", in[0]);
             return std::vector<TensorType>{{uint32, concat(batch_of(in[0].shape), attr_shape(a))}};
           },
       .differentiable = false,
       .batch = ops::batch_leading([](const Attrs& a, const Tensor&) { return a; })},
      {{ops::cpu({uint32}), [](ops::Ins in, const Attrs& a) {
          const int64_t per = attr_shape(a).numel();
          Tensor out = empty(concat(batch_of(in[0].shape()), attr_shape(a)), uint32);
          uint32_t* po = out.data<uint32_t>();
          for_each_key(in[0], per, [&](Pair key, int64_t base) {
            detail::parallel_for(
                per,
                [&](int64_t b, int64_t e) {
                  for (int64_t i = b; i < e; ++i) po[base + i] = stream_word(key, i);
                },
                16);
          });
          return std::vector<Tensor>{out};
        }}});
  return p;
}

// Uniform floats in [0, 1): the top mantissa-width bits of a word, scaled, so every value is
// exactly representable and 1.0 is never produced.
const Primitive& prim::random_uniform() {
  static const Primitive& p = detail::register_builtin(
      {.name = "random_uniform",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             expect_key("random_uniform", in[0]);
             const DType dt = a.get_dtype("dtype");
             if (!is_floating(dt))
               fail("random_uniform", "non-float dtype: got ", dt, ", expected a floating dtype");
             return std::vector<TensorType>{{dt, concat(batch_of(in[0].shape), attr_shape(a))}};
           },
       .differentiable = false,
       .batch = ops::batch_leading([](const Attrs& a, const Tensor&) { return a; })},
      {{ops::cpu({uint32}), [](ops::Ins in, const Attrs& a) {
          const DType dt = a.get_dtype("dtype");
          const int64_t per = attr_shape(a).numel();
          Tensor out = empty(concat(batch_of(in[0].shape()), attr_shape(a)), dt);
          detail::visit_floating(dt, [&]<typename T>() {
            T* po = out.data<T>();
            constexpr int bits = std::is_same_v<T, double>  ? 53
                                 : std::is_same_v<T, float> ? 24
                                 : std::is_same_v<T, Half>  ? 11
                                                            : 8;
            for_each_key(in[0], per, [&](Pair key, int64_t base) {
              detail::parallel_for(
                  per,
                  [&](int64_t b, int64_t e) {
                    for (int64_t i = b; i < e; ++i) {
                      double u;
                      if constexpr (bits > 32) {
                        const uint64_t w = (static_cast<uint64_t>(stream_word(key, 2 * i)) << 32) |
                                           stream_word(key, 2 * i + 1);
                        u = static_cast<double>(w >> (64 - bits)) * std::ldexp(1.0, -bits);
                      } else {
                        u = static_cast<double>(stream_word(key, i) >> (32 - bits)) *
                            std::ldexp(1.0, -bits);
                      }
                      if constexpr (std::is_same_v<T, double>)
                        po[base + i] = u;
                      else
                        po[base + i] = T(static_cast<float>(u));
                    }
                  },
                  16);
            });
          });
          return std::vector<Tensor>{out};
        }}});
  return p;
}

const Primitive& prim::random_split() {
  static const Primitive& p = detail::register_builtin(
      {.name = "random_split",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             expect_key("random_split", in[0]);
             const int64_t n = a.get_int("n");
             if (n < 0) fail("random_split", "negative count: got n=", n, ", expected n >= 0");
             return std::vector<TensorType>{{uint32, concat(batch_of(in[0].shape), Shape{n, 2})}};
           },
       .differentiable = false,
       .batch = ops::batch_leading([](const Attrs& a, const Tensor&) { return a; })},
      {{ops::cpu({uint32}), [](ops::Ins in, const Attrs& a) {
          const int64_t n = a.get_int("n");
          Tensor out = empty(concat(batch_of(in[0].shape()), Shape{n, 2}), uint32);
          uint32_t* po = out.data<uint32_t>();
          for_each_key(in[0], 2 * n, [&](Pair key, int64_t base) {
            for (int64_t j = 0; j < n; ++j) {
              const Pair r = threefry(key, {static_cast<uint32_t>(j), kSplitDomain});
              po[base + 2 * j] = r.a;
              po[base + 2 * j + 1] = r.b;
            }
          });
          return std::vector<Tensor>{out};
        }}});
  return p;
}

const Primitive& prim::random_fold_in() {
  static const Primitive& p = detail::register_builtin(
      {.name = "random_fold_in",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs&) {
             expect_key("random_fold_in", in[0]);
             return std::vector<TensorType>{in[0]};
           },
       .differentiable = false,
       .batch = ops::batch_leading([](const Attrs& a, const Tensor&) { return a; })},
      {{ops::cpu({uint32}), [](ops::Ins in, const Attrs& a) {
          const auto data = static_cast<uint32_t>(a.get_int("data"));
          Tensor out = empty(in[0].type());
          uint32_t* po = out.data<uint32_t>();
          for_each_key(in[0], 2, [&](Pair key, int64_t base) {
            const Pair r = threefry(key, {data, kFoldDomain});
            po[base] = r.a;
            po[base + 1] = r.b;
          });
          return std::vector<Tensor>{out};
        }}});
  return p;
}

// Fisher-Yates with 64-bit draws (modulo bias below 2^-32 for any n that fits in memory).
const Primitive& prim::random_permutation() {
  static const Primitive& p = detail::register_builtin(
      {.name = "random_permutation",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             expect_key("random_permutation", in[0]);
             const int64_t n = a.get_int("n");
             if (n < 0)
               fail("random_permutation", "negative length: got n=", n, ", expected n >= 0");
             return std::vector<TensorType>{{int64, concat(batch_of(in[0].shape), Shape{n})}};
           },
       .differentiable = false,
       .batch = ops::batch_leading([](const Attrs& a, const Tensor&) { return a; })},
      {{ops::cpu({uint32}), [](ops::Ins in, const Attrs& a) {
          const int64_t n = a.get_int("n");
          Tensor out = empty(concat(batch_of(in[0].shape()), Shape{n}), int64);
          int64_t* po = out.data<int64_t>();
          for_each_key(in[0], n, [&](Pair key, int64_t base) {
            int64_t* p = po + base;
            for (int64_t i = 0; i < n; ++i) p[i] = i;
            for (int64_t i = n - 1; i > 0; --i) {
              const Pair r = threefry(
                  key, {static_cast<uint32_t>(i), kPermDomain ^ static_cast<uint32_t>(i >> 32)});
              const uint64_t w = (static_cast<uint64_t>(r.a) << 32) | r.b;
              std::swap(p[i], p[static_cast<int64_t>(w % static_cast<uint64_t>(i + 1))]);
            }
          });
          return std::vector<Tensor>{out};
        }}});
  return p;
}

namespace random {

Tensor key(uint64_t seed) {
  return tensor(
      std::vector<uint32_t>{static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(seed)},
      Shape{2});
}

Tensor split(const Tensor& key, int64_t n, Loc loc) {
  const detail::CallSite site(loc);
  return bind1(prim::random_split(), {key}, {{"n", n}}, loc);
}

std::pair<Tensor, Tensor> split(const Tensor& key, Loc loc) {
  const detail::CallSite site(loc);
  const Tensor keys = split(key, 2, loc);
  const int axis = keys.rank() - 2;
  std::vector<Tensor> parts = kiln::split(keys, 2, axis, loc);
  return {squeeze(parts[0], {axis}, loc), squeeze(parts[1], {axis}, loc)};
}

Tensor fold_in(const Tensor& key, uint32_t data, Loc loc) {
  const detail::CallSite site(loc);
  return bind1(prim::random_fold_in(), {key}, {{"data", int64_t{data}}}, loc);
}

Tensor bits(const Tensor& key, const Shape& shape, Loc loc) {
  const detail::CallSite site(loc);
  return bind1(prim::random_bits(), {key}, {{"shape", shape.dims()}}, loc);
}

Tensor uniform(const Tensor& key, const Shape& shape, DType dtype, double lo, double hi, Loc loc) {
  const detail::CallSite site(loc);
  Tensor u = bind1(prim::random_uniform(), {key}, {{"shape", shape.dims()}, {"dtype", dtype}}, loc);
  if (lo == 0.0 && hi == 1.0) return u;
  return add(mul(u, scalar_like(u, hi - lo), loc), scalar_like(u, lo), loc);
}

Tensor normal(const Tensor& key, const Shape& shape, DType dtype, Loc loc) {
  const detail::CallSite site(loc);
  if (!is_floating(dtype))
    fail("normal", "non-float dtype: got ", dtype, ", expected a floating dtype");
  // Box-Muller in at least float32 (f16's 11-bit uniforms would clip the tails).
  const DType work = dtype == float64 ? float64 : float32;
  const auto [k1, k2] = split(key, loc);
  const Tensor u1 = uniform(k1, shape, work, 0.0, 1.0, loc);
  const Tensor u2 = uniform(k2, shape, work, 0.0, 1.0, loc);
  const Tensor r =
      sqrt(mul(log(sub(scalar_like(u1, 1.0), u1, loc), loc), scalar_like(u1, -2.0), loc), loc);
  const Tensor z = mul(r, cos(mul(u2, scalar_like(u2, 2.0 * std::numbers::pi), loc), loc), loc);
  return astype(z, dtype, loc);
}

Tensor bernoulli(const Tensor& key, double p, const Shape& shape, Loc loc) {
  const detail::CallSite site(loc);
  const Tensor u = uniform(key, shape, float64, 0.0, 1.0, loc);
  return less(u, scalar_like(u, p), loc);
}

Tensor randint(const Tensor& key, const Shape& shape, int64_t lo, int64_t hi, DType dtype,
               Loc loc) {
  const detail::CallSite site(loc);
  if (hi <= lo || !is_integral(dtype))
    fail("randint", "invalid range or dtype: got [", lo, ", ", hi, ") as ", dtype,
         ", expected lo < hi and an integer dtype");
  const Tensor u = uniform(key, shape, float64, 0.0, 1.0, loc);
  // hi - lo in double: in int64_t it overflows for ranges wider than 2^63 (lo = INT64_MIN).
  const double range = static_cast<double>(hi) - static_cast<double>(lo);
  const Tensor v = floor(
      add(mul(u, scalar_like(u, range), loc), scalar_like(u, static_cast<double>(lo)), loc), loc);
  return astype(minimum(v, scalar_like(v, static_cast<double>(hi - 1)), loc), dtype, loc);
}

Tensor permutation(const Tensor& key, int64_t n, Loc loc) {
  const detail::CallSite site(loc);
  return bind1(prim::random_permutation(), {key}, {{"n", n}}, loc);
}

}  // namespace random
}  // namespace kiln
