// The machinery of elementwise primitive families (src/ops/unary.cpp, binary.cpp, math.cpp):
// a family is a table of functors, each turned into a primitive by define_unary or
// define_binary, which derive its type rule, per-dtype kernels, JVP, VJP, batching rule and
// compiled lowering from what the functor declares.
//
// A functor declares `domain` (the dtypes its kernel takes) and a scalar function on
// detail::compute_t<T>, or a vectorised `chunk` for unary ones. Optional members:
//   both:   `complex` (the scalar function also holds for std::complex: the primitive takes
//           complex64 and complex128 too, and its derivative rules hold unchanged because they
//           are holomorphic and derivatives follow JAX's convention, docs/DESIGN.md);
//   unary:  `scale(x, y, t)` (dy/dx applied to t), `linear`, `bool_result`;
//   binary: `jvp(a, b, y, ta, tb)` and `vjp(a, b, y, ct)`, `bool_result`,
//           `checks_zero_divisor` (integer kernels reject a zero in b), `vector_pow`;
//   both:   `lower(builder, operands, site)`, the compiled lowering (kiln/lowering.h), with
//           `lowered` (the Domain it lowers when narrower than `domain`) and `transcendental`
//           (it calls a math function).
// Functors without derivatives make non-differentiable primitives (zero derivative).
#pragma once

#include <algorithm>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "detail/elementwise.h"
#include "kiln/ops.h"
#include "math/vector_math.h"
#include "ops/primitives.h"
#include "ops/rules.h"

namespace kiln::ops {

// integral: the integer dtypes; bits: those and bool (bitwise operations).
enum class Domain {
  floating,
  numeric,
  integral,
  bits,
  boolean,
  real
};  // real: every non-complex dtype

inline DTypeSet domain_set(Domain d) {
  switch (d) {
    case Domain::floating:
      return DTypeSet::floating();
    case Domain::numeric:
      return DTypeSet::numeric();
    case Domain::integral:
      return DTypeSet::integral();
    case Domain::bits:
      return DTypeSet::integral() | bool_;
    case Domain::boolean:
      return DTypeSet(bool_);
    case Domain::real:
      return DTypeSet::real();
  }
  return {};
}
inline std::string_view domain_desc(Domain d) {
  switch (d) {
    case Domain::floating:
      return "a floating dtype (f16, bf16, f32, f64)";
    case Domain::numeric:
      return "a numeric dtype (not bool)";
    case Domain::integral:
      return "an integer dtype";
    case Domain::bits:
      return "an integer or bool dtype";
    case Domain::boolean:
      return "bool";
    case Domain::real:
      return "a real dtype";
  }
  return "";
}

template <typename T>
constexpr bool in_domain(Domain d) {
  switch (d) {
    case Domain::real:
      return true;
    case Domain::boolean:
      return std::is_same_v<T, bool>;
    case Domain::integral:
      return std::is_integral_v<T> && !std::is_same_v<T, bool>;
    case Domain::bits:
      return std::is_integral_v<T>;
    case Domain::numeric:
      return !std::is_same_v<T, bool>;
    case Domain::floating:
      return std::is_floating_point_v<detail::compute_t<T>>;
  }
  return false;
}

template <typename F>
constexpr bool takes_complex() {
  if constexpr (requires { F::complex; })
    return F::complex;
  else
    return false;
}

// The dtypes a functor's primitive accepts, and how its errors describe them.
template <typename F>
DTypeSet accepted(Domain d) {
  return takes_complex<F>() ? domain_set(d) | DTypeSet::complex() : domain_set(d);
}
template <typename F>
std::string accepted_desc(Domain d) {
  return std::string(domain_desc(d)) + (takes_complex<F>() ? " or a complex dtype" : "");
}

// Runs f.template operator()<T>() for the element type of d, complex included when the
// functor takes complex values.
template <typename F, typename G>
void visit_accepted(DType d, G&& g) {
  if constexpr (takes_complex<F>()) {
    if (is_complex(d)) return detail::visit_complex(d, std::forward<G>(g));
  }
  detail::visit_dtype(d, std::forward<G>(g));
}

template <typename F>
constexpr bool bool_result() {
  if constexpr (requires { F::bool_result; })
    return F::bool_result;
  else
    return false;
}

// What a functor's `lower` works with (kiln/lowering.h).
namespace lw = kiln::lowering;
using Operands = std::span<const lw::Value>;

// Integer dtypes whose comparisons and shifts are signed.
inline bool signed_integer(DType d) { return d == int32 || d == int64; }

// The functor's compiled lowering, when it declares one.
template <typename F>
void add_lowering(Primitive& p) {
  if constexpr (requires { &F::lower; }) {
    lw::Lowering l{.elementwise = &F::lower};
    if constexpr (requires { F::lowered; }) l.dtypes = domain_set(F::lowered);
    if constexpr (requires { F::transcendental; }) l.transcendental = F::transcendental;
    p.lowering = std::move(l);
  }
}

// Elements per chunk: gathered strided or 16-bit inputs, and scratch values of vectorised
// functions, live in stack buffers of this many compute-type values.
inline constexpr int64_t kChunk = 256;

// ---- unary ------------------------------------------------------------------------------

template <typename F>
constexpr bool has_derivative() {
  return requires(const Tensor& t) { F::scale(t, t, t); };
}

template <typename F>
constexpr bool chunked() {
  return requires(const float* x, float* y) { F::chunk(x, y, int64_t{0}); };
}

template <typename F>
constexpr bool linear() {
  if constexpr (requires { F::linear; })
    return F::linear;
  else
    return false;
}

// y = F::chunk(x) over tensors of any layout: contiguous float and double rows are passed
// straight through, anything else (strided rows, float16/bfloat16) goes through a stack buffer
// of compute-type values, kChunk at a time; rows are split across threads by for_each_row.
template <typename F, typename T>
void map_chunks(const Tensor& in, const Tensor& out) {
  using C = detail::compute_t<T>;
  const T* pi = static_cast<const T*>(in.raw_data());
  T* po = static_cast<T*>(out.raw_data());
  detail::for_each_row<2>(
      out.shape().dims(), {&out.strides(), &in.strides()},
      [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
        T* o = po + off[0];
        const T* x = pi + off[1];
        if constexpr (std::is_same_v<T, C>) {
          if (st[0] == 1 && st[1] == 1) {
            F::chunk(x, o, n);
            return;
          }
        }
        C buf[kChunk];
        for (int64_t b = 0; b < n; b += kChunk) {
          const int64_t m = std::min(kChunk, n - b);
          for (int64_t k = 0; k < m; ++k) buf[k] = static_cast<C>(x[(b + k) * st[1]]);
          F::chunk(buf, buf, m);
          for (int64_t k = 0; k < m; ++k) o[(b + k) * st[0]] = static_cast<T>(buf[k]);
        }
      });
}

template <typename F>
const Primitive& define_unary(std::string name, Loc loc) {
  TypeRule rule = [name](std::span<const TensorType> in, const Attrs&) {
    expect_dtype(name, in[0], accepted<F>(F::domain), accepted_desc<F>(F::domain));
    return std::vector<TensorType>{{bool_result<F>() ? bool_ : in[0].dtype, in[0].shape}};
  };
  Kernel kernel = [](std::span<const Tensor> in, const Attrs&) {
    const DType out_dtype = bool_result<F>() ? bool_ : in[0].dtype();
    Tensor out = empty(in[0].shape(), out_dtype);
    visit_accepted<F>(in[0].dtype(), [&]<typename T>() {
      if constexpr (detail::is_complex_v<T>) {
        detail::map_unary<T, std::conditional_t<bool_result<F>(), bool, T>>(in[0], out, F{});
      } else if constexpr (in_domain<T>(F::domain)) {
        using Out = std::conditional_t<bool_result<F>(), bool, T>;
        if constexpr (chunked<F>())
          map_chunks<F, T>(in[0], out);
        else
          detail::map_unary<T, Out>(in[0], out, F{});
      }
    });
    return std::vector<Tensor>{out};
  };
  Primitive p{.name = std::move(name), .arity = 1, .type_rule = std::move(rule)};
  p.batch = batch_elementwise;
  if constexpr (requires { F::algebra; }) p.algebra = F::algebra;
  add_lowering<F>(p);
  if constexpr (has_derivative<F>()) {
    auto apply = [](const RuleArgs& r, std::span<const Tangent> t) -> std::vector<Tangent> {
      return {F::scale(r.inputs[0], r.outputs[0], *t[0])};
    };
    if constexpr (linear<F>())
      p.jvp = linear_jvp;
    else
      p.jvp = apply;
    p.vjp = apply;
  } else {
    p.differentiable = false;
  }
  return detail::register_builtin(std::move(p),
                                  {{cpu({accepted<F>(F::domain)}), std::move(kernel)}}, loc);
}

// Public unary ops on floats promote integer and bool inputs to float32 first, like numpy.
inline Tensor float_op(const Primitive& p, const Tensor& x, Loc loc) {
  const detail::CallSite site(loc);
  return bind1(p, {cast_if_needed(x, to_floating(x.dtype()), loc)}, {}, loc);
}
// Rounding is the identity on integers.
inline Tensor rounding_op(const Primitive& p, const Tensor& x, Loc loc) {
  const detail::CallSite site(loc);
  if (is_complex(x.dtype()))
    fail(p.name, "unsupported dtype: got ", x.type(), ", expected a real dtype");
  if (!is_floating(x.dtype())) return x;
  return bind1(p, {x}, {}, loc);
}

// ---- binary -----------------------------------------------------------------------------

// Applies f to a tangent unless it is a symbolic zero.
template <typename F>
Tangent map_t(const Tangent& t, F f) {
  return t ? Tangent(f(*t)) : std::nullopt;
}
inline Tangent plus(const Tangent& a, const Tangent& b) {
  if (!a) return b;
  if (!b) return a;
  return *a + *b;
}

// Rejects integer inputs the scalar function has no defined answer for.
template <typename F, typename T>
void check_operands(std::string_view name, const Tensor& b) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    constexpr bool zero = requires { F::checks_zero_divisor; };
    constexpr bool negative = requires { F::checks_negative_exponent; }
    &&std::is_signed_v<T>;
    if constexpr (zero || negative) {
      for (T v : b.to_vector<T>()) {
        if (zero && v == T{0})
          fail(name, "integer division by zero: got a zero in the divisor ", b.type(),
               ", expected non-zero divisors (or use a float dtype)");
        if (negative && v < T{0})
          fail(name, "integer to a negative power: got a negative exponent in ", b.type(),
               ", expected exponents >= 0 (or use a float dtype)");
      }
    }
  }
}

// out = pow(a, b) for a floating T through the vector table (src/math/vector_math.h):
// contiguous float and double rows go straight in; other rows (strided, broadcast, 16-bit) are
// gathered into compute-type stack buffers kChunk at a time, computed, and scattered back.
template <typename T>
void map_pow(const Tensor& a, const Tensor& b, const Tensor& out) {
  using C = detail::compute_t<T>;
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  T* po = static_cast<T*>(out.raw_data());
  detail::for_each_row<3>(
      out.shape().dims(), {&out.strides(), &a.strides(), &b.strides()},
      [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
        T* o = po + off[0];
        const T* x = pa + off[1];
        const T* y = pb + off[2];
        if constexpr (std::is_same_v<T, C>) {
          if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
            math::apply_pow(x, y, o, n);
            return;
          }
        }
        C xb[kChunk], yb[kChunk];
        for (int64_t s = 0; s < n; s += kChunk) {
          const int64_t m = std::min(kChunk, n - s);
          for (int64_t k = 0; k < m; ++k) {
            xb[k] = static_cast<C>(x[(s + k) * st[1]]);
            yb[k] = static_cast<C>(y[(s + k) * st[2]]);
          }
          math::apply_pow(xb, yb, xb, m);
          for (int64_t k = 0; k < m; ++k) o[(s + k) * st[0]] = static_cast<T>(xb[k]);
        }
      });
}

template <typename F>
const Primitive& define_binary(std::string name, Loc loc) {
  TypeRule rule = [name](std::span<const TensorType> in, const Attrs&) {
    expect_same_types(name, in);
    expect_dtype(name, in[0], accepted<F>(F::domain), accepted_desc<F>(F::domain));
    return std::vector<TensorType>{{bool_result<F>() ? bool_ : in[0].dtype, in[0].shape}};
  };
  Kernel kernel = [name](std::span<const Tensor> in, const Attrs&) {
    Tensor out = empty(in[0].shape(), bool_result<F>() ? bool_ : in[0].dtype());
    visit_accepted<F>(in[0].dtype(), [&]<typename T>() {
      if constexpr (detail::is_complex_v<T>) {
        detail::map_binary<T, std::conditional_t<bool_result<F>(), bool, T>>(in[0], in[1], out,
                                                                             F{});
      } else if constexpr (in_domain<T>(F::domain)) {
        check_operands<F, T>(name, in[1]);
        using Out = std::conditional_t<bool_result<F>(), bool, T>;
        if constexpr (requires { F::vector_pow; } && std::is_floating_point_v<detail::compute_t<T>>)
          map_pow<T>(in[0], in[1], out);
        else
          detail::map_binary<T, Out>(in[0], in[1], out, F{});
      }
    });
    return std::vector<Tensor>{out};
  };
  const DTypeSet set = accepted<F>(F::domain);
  Primitive p{.name = std::move(name), .arity = 2, .type_rule = std::move(rule)};
  p.batch = batch_elementwise;
  if constexpr (requires { F::algebra; }) p.algebra = F::algebra;
  add_lowering<F>(p);
  if constexpr (requires(const Tensor& t) { F::vjp(t, t, t, t); }) {
    p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> Ts {
      return {F::jvp(r.inputs[0], r.inputs[1], r.outputs[0], t[0], t[1])};
    };
    p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> Ts {
      return F::vjp(r.inputs[0], r.inputs[1], r.outputs[0], *ct[0]);
    };
  } else {
    p.differentiable = false;
  }
  return detail::register_builtin(std::move(p), {{cpu({set, set}), std::move(kernel)}}, loc);
}

// Binary public ops: operands promoted to their common dtype and broadcast.
inline Tensor binary(const Primitive& p, const Tensor& a, const Tensor& b, Loc loc) {
  const detail::CallSite site(loc);
  auto [x, y] = promote_broadcast(p.name, a, b, loc);
  return bind1(p, {x, y}, {}, loc);
}

// Arithmetic on bool operands computes in int32, like numpy's bool + bool.
inline Tensor arithmetic(const Primitive& p, const Tensor& a, const Tensor& b, Loc loc) {
  const detail::CallSite site(loc);
  auto [x, y] = promote_broadcast(p.name, a, b, loc);
  if (x.dtype() == bool_) {
    x = astype(x, int32, loc);
    y = astype(y, int32, loc);
  }
  return bind1(p, {x, y}, {}, loc);
}

}  // namespace kiln::ops
