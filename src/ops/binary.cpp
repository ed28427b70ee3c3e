// Binary elementwise primitives and `select`. The primitives take operands of one dtype and
// shape; the public ops promote dtypes and broadcast shapes (as views) before binding.
#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>

#include "detail/elementwise.h"
#include "detail/wrapping.h"
#include "kiln/ops.h"
#include "math/vector_math.h"
#include "ops/elementwise_rules.h"
#include "ops/primitives.h"
#include "ops/rules.h"

namespace kiln {
namespace {

using ops::arithmetic;
using ops::binary;
using ops::define_binary;
using ops::Domain;
using ops::map_t;
using ops::Operands;
using ops::plus;
namespace lw = lowering;

using detail::wrapping;  // integers wrap on overflow, as in numpy

// The derivative of max(a, b) with respect to a: 1 where a wins, 1/2 at ties (as in JAX).
Tensor max_weight(const Tensor& a, const Tensor& b) {
  return astype(a > b, a.dtype()) + astype(a == b, a.dtype()) * 0.5;
}

// Each differentiable functor has `jvp(a, b, y, ta, tb)` and `vjp(a, b, y, ct)`; `lower` is
// its compiled form (kiln/lowering.h).
struct Add {
  static constexpr Domain domain = Domain::numeric;
  static constexpr bool complex = true;
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site& s) {
    return b.add(s.in, x[0], x[1]);
  }
  static constexpr Algebra algebra{.right_identity = -0.0,
                                   .left_identity = -0.0,
                                   .commutative = true,
                                   .cheap_arithmetic = true,
                                   .adds = true};
  static Tangent jvp(const Tensor&, const Tensor&, const Tensor&, const Tangent& ta,
                     const Tangent& tb) {
    return plus(ta, tb);
  }
  static ops::Ts vjp(const Tensor&, const Tensor&, const Tensor&, const Tensor& ct) {
    return {ct, ct};
  }
  template <typename T>
  T operator()(T a, T b) const {
    return wrapping(a, b, std::plus<>{});
  }
};
struct Sub {
  static constexpr Domain domain = Domain::numeric;
  static constexpr bool complex = true;
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site& s) {
    return b.sub(s.in, x[0], x[1]);
  }
  static constexpr Algebra algebra{.right_identity = 0.0, .cheap_arithmetic = true};
  static Tangent jvp(const Tensor&, const Tensor&, const Tensor&, const Tangent& ta,
                     const Tangent& tb) {
    return plus(ta, map_t(tb, [](const Tensor& t) { return -t; }));
  }
  static ops::Ts vjp(const Tensor&, const Tensor&, const Tensor&, const Tensor& ct) {
    return {ct, -ct};
  }
  template <typename T>
  T operator()(T a, T b) const {
    return wrapping(a, b, std::minus<>{});
  }
};
struct Mul {
  static constexpr Domain domain = Domain::numeric;
  static constexpr bool complex = true;
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site& s) {
    return b.mul(s.in, x[0], x[1]);
  }
  static constexpr Algebra algebra{.right_identity = 1.0,
                                   .left_identity = 1.0,
                                   .integer_zero_absorbs = true,
                                   .commutative = true,
                                   .cheap_arithmetic = true};
  static Tangent jvp(const Tensor& a, const Tensor& b, const Tensor&, const Tangent& ta,
                     const Tangent& tb) {
    return plus(map_t(ta, [&](const Tensor& t) { return t * b; }),
                map_t(tb, [&](const Tensor& t) { return a * t; }));
  }
  static ops::Ts vjp(const Tensor& a, const Tensor& b, const Tensor&, const Tensor& ct) {
    return {ct * b, a * ct};
  }
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_same_v<T, uint8_t>)
      return static_cast<T>(static_cast<unsigned>(a) * b);
    else
      return wrapping(a, b, std::multiplies<>{});
  }
};
// Integer division truncates; the kernel rejects zero divisors before the loop runs.
struct Div {
  static constexpr Domain domain = Domain::numeric;
  static constexpr bool complex = true;
  static constexpr Algebra algebra{.right_identity = 1.0, .cheap_arithmetic = true};
  static Tangent jvp(const Tensor&, const Tensor& b, const Tensor& y, const Tangent& ta,
                     const Tangent& tb) {
    return plus(map_t(ta, [&](const Tensor& t) { return t / b; }),
                map_t(tb, [&](const Tensor& t) { return -(t * y / b); }));
  }
  static ops::Ts vjp(const Tensor&, const Tensor& b, const Tensor& y, const Tensor& ct) {
    return {ct / b, -(ct * y / b)};
  }
  static constexpr bool checks_zero_divisor = true;
  static constexpr Domain lowered = Domain::floating;  // integers check their divisors
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site&) { return b.div(x[0], x[1]); }
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
      if (b == T{-1}) return wrapping(T{0}, a, std::minus<>{});  // MIN / -1 wraps
    }
    return static_cast<T>(a / b);
  }
};
// d(a^b)/da = b a^(b-1), taken as 0 at a = b = 0 (a^0 = 1 for every a), the one point
// where it is 0 * inf. Only that point is replaced, and in the inputs too: the unselected
// b a^(b-1) would hold inf there, and its rules multiply the zero cotangent select gives it
// by that inf, a NaN in reverse-over-reverse of a^0 at 0. (Replacing every b == 0 zeroes the
// mixed derivative d2(a^b)/da db = 1/a at b = 0.)
// d(a^b)/db = log(a) a^b, taken as 0 where a <= 0 (no real logarithm; a^b is 0 or NaN there).
Tensor pow_da(const Tensor& a, const Tensor& b) {
  const Tensor origin = (a == 0.0) && (b == 0.0);
  const Tensor safe_a = where(origin, scalar_like(a, 1.0), a);
  return where(origin, scalar_like(a, 0.0), b * pow(safe_a, b - 1.0));
}
Tensor pow_db(const Tensor& a, const Tensor& y) {
  const Tensor positive = a > 0.0;
  return where(positive, log(where(positive, a, scalar_like(a, 1.0))) * y, scalar_like(a, 0.0));
}
struct Pow {
  static constexpr Domain domain = Domain::numeric;
  static Tangent jvp(const Tensor& a, const Tensor& b, const Tensor& y, const Tangent& ta,
                     const Tangent& tb) {
    return plus(map_t(ta, [&](const Tensor& t) { return t * pow_da(a, b); }),
                map_t(tb, [&](const Tensor& t) { return t * pow_db(a, y); }));
  }
  static ops::Ts vjp(const Tensor& a, const Tensor& b, const Tensor& y, const Tensor& ct) {
    return {ct * pow_da(a, b), ct * pow_db(a, y)};
  }
  static constexpr bool checks_negative_exponent = true;
  // Floats run SLEEF's vector pow (map_pow); integers exponentiate by squaring, wrapping like
  // multiplication.
  static constexpr bool vector_pow = true;
  static constexpr Domain lowered = Domain::floating;  // integers check their exponents
  static constexpr bool transcendental = true;
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site& s) {
    return b.call(lw::MathFunction::pow, s.in, x);
  }
  template <typename T>
  T operator()(T a, T b) const {
    static_assert(std::is_integral_v<T>, "float pow runs map_pow");
    T result{1};
    auto e = static_cast<std::make_unsigned_t<T>>(b);
    while (e) {
      if (e & 1u) result = Mul{}(result, a);
      a = Mul{}(a, a);
      e >>= 1u;
    }
    return result;
  }
};
// maximum/minimum propagate NaN, like numpy.
struct Max {
  static constexpr Domain domain = Domain::numeric;
  static constexpr Algebra algebra{.cheap_arithmetic = true};
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site& s) {
    return b.max(s.in, x[0], x[1]);
  }
  static Tangent jvp(const Tensor& a, const Tensor& b, const Tensor&, const Tangent& ta,
                     const Tangent& tb) {
    const Tensor w = max_weight(a, b);
    return plus(map_t(ta, [&](const Tensor& t) { return t * w; }),
                map_t(tb, [&](const Tensor& t) { return t * (1.0 - w); }));
  }
  static ops::Ts vjp(const Tensor& a, const Tensor& b, const Tensor&, const Tensor& ct) {
    const Tensor w = max_weight(a, b);
    return {ct * w, ct * (1.0 - w)};
  }
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>)
      if (a != a || b != b) return a + b;
    return a > b ? a : b;
  }
};
struct Min {
  static constexpr Domain domain = Domain::numeric;
  static constexpr Algebra algebra{.cheap_arithmetic = true};
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site& s) {
    return b.min(s.in, x[0], x[1]);
  }
  static Tangent jvp(const Tensor& a, const Tensor& b, const Tensor&, const Tangent& ta,
                     const Tangent& tb) {
    const Tensor w = max_weight(b, a);
    return plus(map_t(ta, [&](const Tensor& t) { return t * w; }),
                map_t(tb, [&](const Tensor& t) { return t * (1.0 - w); }));
  }
  static ops::Ts vjp(const Tensor& a, const Tensor& b, const Tensor&, const Tensor& ct) {
    const Tensor w = max_weight(b, a);
    return {ct * w, ct * (1.0 - w)};
  }
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>)
      if (a != a || b != b) return a + b;
    return a < b ? a : b;
  }
};
// Equality also holds for complex values (takes_complex); ordering does not.
#define KILN_COMPARE(Name, expr, comparison, is_commutative, takes_complex)                    \
  struct Name {                                                                                \
    static constexpr Domain domain = Domain::real;                                             \
    static constexpr bool complex = takes_complex;                                             \
    static constexpr bool bool_result = true;                                                  \
    static constexpr Algebra algebra{.commutative = is_commutative, .cheap_arithmetic = true}; \
    static lw::Value lower(lw::Builder& b, Operands x, const lw::Site& s) {                    \
      return b.compare(lw::Comparison::comparison, s.in, x[0], x[1]);                          \
    }                                                                                          \
    template <typename T>                                                                      \
    bool operator()(T a, T b) const {                                                          \
      return expr;                                                                             \
    }                                                                                          \
  };
KILN_COMPARE(Eq, a == b, eq, true, true)
KILN_COMPARE(Ne, a != b, ne, true, true)
KILN_COMPARE(Lt, a < b, lt, false, false)
KILN_COMPARE(Le, a <= b, le, false, false)
KILN_COMPARE(Gt, a > b, gt, false, false)
KILN_COMPARE(Ge, a >= b, ge, false, false)
#undef KILN_COMPARE
struct And {
  static constexpr Domain domain = Domain::boolean;
  static constexpr Algebra algebra{.commutative = true, .cheap_arithmetic = true};
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site&) {
    return b.bit_and(x[0], x[1]);
  }
  bool operator()(bool a, bool b) const { return a && b; }
};
struct Or {
  static constexpr Domain domain = Domain::boolean;
  static constexpr Algebra algebra{.commutative = true, .cheap_arithmetic = true};
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site&) {
    return b.bit_or(x[0], x[1]);
  }
  bool operator()(bool a, bool b) const { return a || b; }
};
struct Xor {
  static constexpr Domain domain = Domain::boolean;
  static constexpr Algebra algebra{.commutative = true, .cheap_arithmetic = true};
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site&) {
    return b.bit_xor(x[0], x[1]);
  }
  bool operator()(bool a, bool b) const { return a != b; }
};

}  // namespace

// The table: accessor (src/ops/primitives.h), functor, IR name. A primitive's definition is its
// line here.
#define KILN_BINARY(accessor, F, name)                                  \
  const Primitive& prim::accessor() {                                   \
    static const Primitive& p = define_binary<F>(name, Loc::current()); \
    return p;                                                           \
  }
KILN_BINARY(add, Add, "add")
KILN_BINARY(sub, Sub, "sub")
KILN_BINARY(mul, Mul, "mul")
KILN_BINARY(div, Div, "div")
KILN_BINARY(pow, Pow, "pow")
KILN_BINARY(max, Max, "max")
KILN_BINARY(min, Min, "min")
KILN_BINARY(eq, Eq, "eq")
KILN_BINARY(ne, Ne, "ne")
KILN_BINARY(lt, Lt, "lt")
KILN_BINARY(le, Le, "le")
KILN_BINARY(gt, Gt, "gt")
KILN_BINARY(ge, Ge, "ge")
KILN_BINARY(and_, And, "and")
KILN_BINARY(or_, Or, "or")
KILN_BINARY(xor_, Xor, "xor")
#undef KILN_BINARY

namespace {

// c ? a : b through the bits, so that loops over it vectorise into masked blends.
template <typename T>
T blend(bool c, T a, T b) {
  if constexpr (sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8) {
    using U = std::conditional_t<
        sizeof(T) == 1, uint8_t,
        std::conditional_t<sizeof(T) == 2, uint16_t,
                           std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>>;
    const U m = static_cast<U>(U{0} - static_cast<U>(c));
    return std::bit_cast<T>(static_cast<U>((std::bit_cast<U>(a) & m) | (std::bit_cast<U>(b) & ~m)));
  } else {
    return c ? a : b;
  }
}

}  // namespace

// select(pred, on_true, on_false): elementwise choice; all three have one shape.
const Primitive& prim::select() {
  static const Primitive& p = detail::register_builtin(
      {.name = "select",
       .arity = 3,
       .type_rule =
           [](std::span<const TensorType> in, const Attrs&) {
             ops::expect_dtype("select", in[0], bool_, "a bool predicate");
             if (in[1] != in[2] || in[0].shape != in[1].shape)
               fail("select", "operands differ: got ", ops::types_str(in),
                    ", expected a bool predicate and two values of one dtype, all of one shape");
             return std::vector<TensorType>{in[1]};
           },
       .jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> ops::Ts {
         const Tensor& p = r.inputs[0];
         const Tensor zero = scalar_like(r.outputs[0], 0.0);
         return {where(p, t[1] ? *t[1] : zero, t[2] ? *t[2] : zero)};
       },
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
         const Tensor zero = scalar_like(*ct[0], 0.0);
         return {std::nullopt, where(r.inputs[0], *ct[0], zero), where(r.inputs[0], zero, *ct[0])};
       },
       .batch = ops::batch_elementwise,
       .algebra = {.cheap_arithmetic = true},
       .lowering =
           lw::Lowering{.elementwise = [](lw::Builder& b, Operands x,
                                          const lw::Site&) { return b.select(x[0], x[1], x[2]); }}},
      {{ops::cpu({bool_, DTypeSet::all(), DTypeSet::all()}),
        [](std::span<const Tensor> in, const Attrs&) {
          Tensor out = empty(in[1].type());
          detail::visit_any_dtype(in[1].dtype(), [&]<typename T>() {
            const bool* pc = static_cast<const bool*>(in[0].raw_data());
            const T* px = static_cast<const T*>(in[1].raw_data());
            const T* py = static_cast<const T*>(in[2].raw_data());
            T* po = static_cast<T*>(out.raw_data());
            detail::for_each_row<4>(
                out.shape().dims(),
                {&out.strides(), &in[0].strides(), &in[1].strides(), &in[2].strides()},
                [&](const std::array<int64_t, 4>& off, int64_t n,
                    const std::array<int64_t, 4>& st) {
                  const bool* c = pc + off[1];
                  const T* x = px + off[2];
                  const T* y = py + off[3];
                  T* o = po + off[0];
                  // Bit blends, not branches: with a random mask (relu and its gradient) the
                  // branchy loop mispredicted on every other element and ran 6x slower.
                  if (st[0] == 1 && st[1] == 1 && st[2] == 1 && st[3] == 1) {
                    for (int64_t k = 0; k < n; ++k) o[k] = blend(c[k], x[k], y[k]);
                  } else if (st[0] == 1 && st[1] == 1 && st[2] == 1 && st[3] == 0) {
                    const T b = *y;
                    for (int64_t k = 0; k < n; ++k) o[k] = blend(c[k], x[k], b);
                  } else if (st[0] == 1 && st[1] == 1 && st[2] == 0 && st[3] == 1) {
                    const T a = *x;
                    for (int64_t k = 0; k < n; ++k) o[k] = blend(c[k], a, y[k]);
                  } else {
                    for (int64_t k = 0; k < n; ++k)
                      o[k * st[0]] = c[k * st[1]] ? x[k * st[2]] : y[k * st[3]];
                  }
                });
          });
          return std::vector<Tensor>{out};
        }}});
  return p;
}

namespace {

Tensor logical(const Primitive& p, const Tensor& a, const Tensor& b, Loc loc) {
  const detail::CallSite site(loc);
  return binary(p, ops::cast_if_needed(a, bool_, loc), ops::cast_if_needed(b, bool_, loc), loc);
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b, Loc loc) { return arithmetic(prim::add(), a, b, loc); }
Tensor sub(const Tensor& a, const Tensor& b, Loc loc) { return arithmetic(prim::sub(), a, b, loc); }
Tensor mul(const Tensor& a, const Tensor& b, Loc loc) { return arithmetic(prim::mul(), a, b, loc); }
Tensor div(const Tensor& a, const Tensor& b, Loc loc) { return arithmetic(prim::div(), a, b, loc); }
Tensor pow(const Tensor& a, const Tensor& b, Loc loc) { return arithmetic(prim::pow(), a, b, loc); }
Tensor maximum(const Tensor& a, const Tensor& b, Loc loc) {
  return arithmetic(prim::max(), a, b, loc);
}
Tensor minimum(const Tensor& a, const Tensor& b, Loc loc) {
  return arithmetic(prim::min(), a, b, loc);
}
Tensor equal(const Tensor& a, const Tensor& b, Loc loc) { return binary(prim::eq(), a, b, loc); }
Tensor not_equal(const Tensor& a, const Tensor& b, Loc loc) {
  return binary(prim::ne(), a, b, loc);
}
Tensor less(const Tensor& a, const Tensor& b, Loc loc) { return binary(prim::lt(), a, b, loc); }
Tensor less_equal(const Tensor& a, const Tensor& b, Loc loc) {
  return binary(prim::le(), a, b, loc);
}
Tensor greater(const Tensor& a, const Tensor& b, Loc loc) { return binary(prim::gt(), a, b, loc); }
Tensor greater_equal(const Tensor& a, const Tensor& b, Loc loc) {
  return binary(prim::ge(), a, b, loc);
}
Tensor logical_and(const Tensor& a, const Tensor& b, Loc loc) {
  return logical(prim::and_(), a, b, loc);
}
Tensor logical_or(const Tensor& a, const Tensor& b, Loc loc) {
  return logical(prim::or_(), a, b, loc);
}
Tensor logical_xor(const Tensor& a, const Tensor& b, Loc loc) {
  return logical(prim::xor_(), a, b, loc);
}

Tensor clip(const Tensor& x, const Tensor& lo, const Tensor& hi, Loc loc) {
  const detail::CallSite site(loc);
  return minimum(maximum(x, lo, loc), hi, loc);
}
Tensor clip(const Tensor& x, double lo, double hi, Loc loc) {
  const detail::CallSite site(loc);
  return clip(x, scalar_like(x, lo, true), scalar_like(x, hi, true), loc);
}

Tensor where(const Tensor& cond, const Tensor& x, const Tensor& y, Loc loc) {
  const detail::CallSite site(loc);
  auto [a, b] = ops::promote_broadcast("where", x, y, loc);
  Tensor c = ops::cast_if_needed(cond, bool_, loc);
  const Shape s = broadcast_shapes("where", c.shape(), a.shape());
  return bind1(prim::select(),
               {broadcast_to(c, s, loc), broadcast_to(a, s, loc), broadcast_to(b, s, loc)}, {},
               loc);
}

Tensor scalar_like(const Tensor& like, double value, bool is_floating) {
  const DType dt = weak_scalar_dtype(like.dtype(), is_floating);
  return full(Shape{}, value, dt);
}

}  // namespace kiln
