// A user-defined primitive, added to Kiln through the public API only (kiln/primitive.h), the
// way the built-ins are defined: the Huber function, elementwise, with a threshold `delta`:
//
//   huber(x) = x^2 / 2                   where |x| <= delta
//              delta * (|x| - delta / 2)  elsewhere
//
// Kiln has no such primitive; composed from abs/where/square it costs several passes and
// temporaries, and its derivative rules would be those of the pieces. As one primitive it is one
// pass, and its derivative is written once: clip(x, -delta, delta).
//
// One definition holds everything the system needs: the type rule (and the errors a user sees),
// the CPU kernels (float32 and float64), the JVP and VJP rules, the batching rule, and the
// compiled lowering (kiln/lowering.h), so that jit fuses it into loops with its neighbours
// instead of calling the kernel (tests/test_compiler.cpp checks it fuses). The public
// function `huber` wraps bind1, so it runs eagerly and records under jit/grad/vmap like any op.
// examples/custom_primitive.cpp uses it; tests/primitive_samples.cpp has a sample of it, so the
// per-primitive walks (tests/test_ad_rules.cpp, tests/test_vmap.cpp) check its rules against
// finite differences and a loop over examples, like every built-in's.
#pragma once

#include <kiln/kiln.h>

#include <cmath>
#include <span>
#include <vector>

namespace example {

namespace huber_detail {

inline double delta_of(const kiln::Attrs& attrs) { return attrs.get_double("delta"); }

// Accepts float32 and float64 (the dtypes with a kernel) and a finite delta > 0.
inline std::vector<kiln::TensorType> type_rule(std::span<const kiln::TensorType> in,
                                               const kiln::Attrs& attrs) {
  const double delta = delta_of(attrs);
  if (!(delta > 0.0 && std::isfinite(delta)))
    kiln::fail("huber", "delta must be positive and finite: got ", delta,
               ", expected a finite number > 0");
  if (in[0].dtype != kiln::float32 && in[0].dtype != kiln::float64)
    kiln::fail("huber", "unsupported dtype: got ", in[0], ", expected float32 or float64");
  return {in[0]};
}

// The kernel receives any strided view of the input and returns a new tensor of exactly the
// type the rule inferred.
template <typename T>
std::vector<kiln::Tensor> kernel(std::span<const kiln::Tensor> in, const kiln::Attrs& attrs) {
  const kiln::Tensor x = in[0].contiguous();
  kiln::Tensor y = kiln::empty(x.type());
  const T* src = x.data<const T>();
  T* dst = y.data<T>();
  const T delta = static_cast<T>(delta_of(attrs));
  for (int64_t i = 0; i < x.numel(); ++i) {
    const T a = std::abs(src[i]);
    dst[i] = a <= delta ? T(0.5) * src[i] * src[i] : delta * (a - T(0.5) * delta);
  }
  return {y};
}

// The kernel's formula, operation by operation, for jit's fused loops: the builder emits one
// element's instructions, and compiled results have the kernel's bits.
inline kiln::lowering::Value lower(kiln::lowering::Builder& b,
                                   std::span<const kiln::lowering::Value> x,
                                   const kiln::lowering::Site& site) {
  using kiln::lowering::Comparison;
  const kiln::DType d = site.in;
  const kiln::lowering::Value delta = b.constant(d, delta_of(site.attrs));
  const kiln::lowering::Value half = b.constant(d, 0.5);
  const kiln::lowering::Value a = b.abs(x[0]);
  const kiln::lowering::Value inside = b.mul(d, b.mul(d, half, x[0]), x[0]);
  const kiln::lowering::Value outside = b.mul(d, delta, b.sub(d, a, b.mul(d, half, delta)));
  return b.select(b.compare(Comparison::le, d, a, delta), inside, outside);
}

// d huber / dx, written with public ops: it traces under jit, batches under vmap, and its own
// derivative (1 inside [-delta, delta], 0 outside) comes from clip's rules, so derivatives of
// any order work.
inline kiln::Tensor derivative(const kiln::Tensor& x, const kiln::Attrs& attrs) {
  const double delta = delta_of(attrs);
  return kiln::clip(x, -delta, delta);
}

const kiln::Primitive& register_huber();

}  // namespace huber_detail

// The primitive, registered on its first use: a function-local static is initialised once,
// thread-safely, in every program that calls it, so nothing depends on the order of static
// initialisation or on the linker keeping an object file (Kiln's built-ins are registered the
// same way).
inline const kiln::Primitive& huber_primitive() {
  static const kiln::Primitive& p = huber_detail::register_huber();
  return p;
}

// The public op: huber(x) elementwise, for float32 and float64 tensors. Errors name the
// caller's line, as the built-in ops' do.
inline kiln::Tensor huber(const kiln::Tensor& x, double delta = 1.0,
                          kiln::Loc loc = kiln::Loc::current()) {
  return kiln::bind1(huber_primitive(), {x}, {{"delta", delta}}, loc);
}

inline const kiln::Primitive& huber_detail::register_huber() {
  using namespace kiln;
  Primitive p;
  p.name = "huber";
  p.arity = 1;
  p.type_rule = type_rule;
  // Forward mode: the output tangent is f'(x) t.
  p.jvp = [](const RuleArgs& a, std::span<const Tangent> tangents) -> std::vector<Tangent> {
    return {*tangents[0] * derivative(a.inputs[0], a.attrs)};
  };
  // Reverse mode: the input cotangent is f'(x) ct (the Jacobian is diagonal).
  p.vjp = [](const RuleArgs& a, std::span<const Tangent> cotangents) -> std::vector<Tangent> {
    return {*cotangents[0] * derivative(a.inputs[0], a.attrs)};
  };
  // Batching: elementwise, so the batch axis is just one more axis of the input, wherever it
  // is, and the output keeps it. (The rule only runs when the input is batched.)
  p.batch = [](const BatchArgs& a) -> std::vector<Batched> {
    return {{bind1(huber_primitive(), {a.inputs[0]}, a.attrs), a.dims[0]}};
  };
  // Compiled: an elementwise lowering for the dtypes the kernels take.
  p.lowering = lowering::Lowering{.elementwise = lower, .dtypes = DTypeSet(float32) | float64};
  return register_primitive(std::move(p),
                            {{KernelSignature{Device::cpu, {float32}}, kernel<float>},
                             {KernelSignature{Device::cpu, {float64}}, kernel<double>}});
}

}  // namespace example
