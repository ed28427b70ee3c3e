// Complex numbers: the primitives complex (re, im -> z), real, imag, conj and complex_abs, and
// the public ops on them (complex, real, imag, conj, angle; abs of a complex tensor goes to
// complex_abs). Derivatives follow JAX's convention (docs/DESIGN.md, "Complex numbers"): a
// cotangent pairs with a tangent as Re(sum(ct * t)), without conjugation, so each VJP below is
// the transpose of its JVP under that pairing.
#include <cmath>
#include <complex>

#include "detail/dtype_dispatch.h"
#include "detail/elementwise.h"
#include "kiln/math_ops.h"
#include "kiln/ops.h"
#include "ops/primitives.h"
#include "ops/rules.h"

namespace kiln {
namespace {

using ops::Ins;
using ops::Ts;
using ops::Types;

void expect_complex(std::string_view op, const TensorType& t) {
  ops::expect_dtype(op, t, DTypeSet::complex(), "a complex dtype (complex64, complex128)");
}

// A kernel applying f to every element of a complex tensor; the result is real (the parts'
// dtype) or complex.
template <bool RealResult, typename F>
std::vector<KernelRegistration> complex_map(F f) {
  Kernel k = [f](Ins in, const Attrs&) {
    const DType d = in[0].dtype();
    Tensor out = empty(in[0].shape(), RealResult ? real_part_dtype(d) : d);
    detail::visit_complex(d, [&]<typename C>() {
      using Out = std::conditional_t<RealResult, typename C::value_type, C>;
      detail::map_unary<C, Out>(in[0], out, f);
    });
    return std::vector<Tensor>{out};
  };
  return {{ops::cpu({DTypeSet::complex()}), std::move(k)}};
}

TypeRule part_rule(std::string op) {
  return [op](Types in, const Attrs&) {
    expect_complex(op, in[0]);
    return std::vector<TensorType>{{real_part_dtype(in[0].dtype), in[0].shape}};
  };
}

// conj(z) / |z|, and 0 at z = 0: d|z| = Re(conj(z) dz) / |z| (0 at 0, as JAX takes it).
Tensor unit_conj(const Tensor& z, const Tensor& magnitude) {
  const Tensor zero = magnitude == 0.0;
  const Tensor safe = where(zero, scalar_like(magnitude, 1.0), magnitude);
  return astype(where(zero, scalar_like(magnitude, 0.0), 1.0 / safe), z.dtype()) *
         bind1(prim::conj(), {z});
}

}  // namespace

const Primitive& prim::complex() {
  static const Primitive& p = detail::register_builtin(
      {.name = "complex",
       .arity = 2,
       .type_rule =
           [](Types in, const Attrs&) {
             ops::expect_same_types("complex", in);
             ops::expect_dtype("complex", in[0], ops::kSingleOrDouble, "float32 or float64");
             return std::vector<TensorType>{{to_complex(in[0].dtype), in[0].shape}};
           },
       .jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> Ts {
         return {bind1(prim::complex(), {t[0] ? *t[0] : zeros_like(r.inputs[0]),
                                         t[1] ? *t[1] : zeros_like(r.inputs[1])})};
       },
       // Re(ct (dre + i dim)) = Re(ct) dre - Im(ct) dim.
       .vjp = [](const RuleArgs&, std::span<const Tangent> ct) -> Ts {
         return {bind1(prim::real(), {*ct[0]}), -bind1(prim::imag(), {*ct[0]})};
       },
       .batch = ops::batch_elementwise},
      {{ops::cpu({ops::kSingleOrDouble, ops::kSingleOrDouble}), [](Ins in, const Attrs&) {
          Tensor out = empty(in[0].shape(), to_complex(in[0].dtype()));
          detail::visit_complex(out.dtype(), [&]<typename C>() {
            using R = typename C::value_type;
            detail::map_binary<R, C>(in[0], in[1], out, [](R re, R im) { return C(re, im); });
          });
          return std::vector<Tensor>{out};
        }}});
  return p;
}

const Primitive& prim::real() {
  static const Primitive& p =
      detail::register_builtin({.name = "real",
                                .arity = 1,
                                .type_rule = part_rule("real"),
                                .jvp = ops::linear_jvp,
                                .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> Ts {
                                  return {astype(*ct[0], r.inputs[0].dtype())};
                                },
                                .batch = ops::batch_elementwise},
                               complex_map<true>([](auto z) { return z.real(); }));
  return p;
}

const Primitive& prim::imag() {
  static const Primitive& p =
      detail::register_builtin({.name = "imag",
                                .arity = 1,
                                .type_rule = part_rule("imag"),
                                .jvp = ops::linear_jvp,
                                // Re(u dz) = ct Im(dz) for u = -i ct.
                                .vjp = [](const RuleArgs&, std::span<const Tangent> ct) -> Ts {
                                  return {bind1(prim::complex(), {zeros_like(*ct[0]), -*ct[0]})};
                                },
                                .batch = ops::batch_elementwise},
                               complex_map<true>([](auto z) { return z.imag(); }));
  return p;
}

const Primitive& prim::conj() {
  static const Primitive& p =
      detail::register_builtin({.name = "conj",
                                .arity = 1,
                                .type_rule =
                                    [](Types in, const Attrs&) {
                                      expect_complex("conj", in[0]);
                                      return std::vector<TensorType>{in[0]};
                                    },
                                .jvp = ops::linear_jvp,
                                .vjp = [](const RuleArgs&, std::span<const Tangent> ct) -> Ts {
                                  return {bind1(prim::conj(), {*ct[0]})};
                                },
                                .batch = ops::batch_elementwise,
                                .algebra = {.involution = true, .cheap_arithmetic = true}},
                               complex_map<false>([](auto z) { return std::conj(z); }));
  return p;
}

const Primitive& prim::complex_abs() {
  static const Primitive& p = detail::register_builtin(
      {.name = "complex_abs",
       .arity = 1,
       .type_rule = part_rule("complex_abs"),
       .jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> Ts {
         return {bind1(prim::real(), {unit_conj(r.inputs[0], r.outputs[0]) * *t[0]})};
       },
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> Ts {
         return {astype(*ct[0], r.inputs[0].dtype()) * unit_conj(r.inputs[0], r.outputs[0])};
       },
       .batch = ops::batch_elementwise},
      complex_map<true>([](auto z) { return std::abs(z); }));  // hypot: no overflow
  return p;
}

Tensor complex(const Tensor& re, const Tensor& im, Loc loc) {
  const detail::CallSite site(loc);
  if (is_complex(re.dtype()) || is_complex(im.dtype()))
    fail("complex", "complex parts: got ", re.type(), " and ", im.type(),
         ", expected real parts (float or integer dtypes)");
  auto [a, b] = ops::promote_broadcast("complex", re, im, loc);
  const DType d = ops::single_or_double(a.dtype());  // no complex of 16-bit floats
  return bind1(prim::complex(), {ops::cast_if_needed(a, d, loc), ops::cast_if_needed(b, d, loc)},
               {}, loc);
}

Tensor real(const Tensor& x, Loc loc) {
  return is_complex(x.dtype()) ? bind1(prim::real(), {x}, {}, loc) : x;
}

Tensor imag(const Tensor& x, Loc loc) {
  return is_complex(x.dtype()) ? bind1(prim::imag(), {x}, {}, loc) : zeros_like(x);
}

Tensor conj(const Tensor& x, Loc loc) {
  return is_complex(x.dtype()) ? bind1(prim::conj(), {x}, {}, loc) : x;
}

Tensor angle(const Tensor& x, Loc loc) {
  const detail::CallSite site(loc);
  if (is_complex(x.dtype())) return atan2(imag(x, loc), real(x, loc), loc);
  const Tensor f = ops::cast_if_needed(x, to_floating(x.dtype()), loc);
  return atan2(zeros_like(f), f, loc);
}

}  // namespace kiln
