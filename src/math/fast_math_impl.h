// The algorithms of Kiln's own float32 exp and tanh (fast_math.h), written once over an
// instruction-set policy P. Each fast_math_<isa>.cpp defines its P and the entry points and is
// the only file compiled for that instruction set, so nothing here may have external linkage.
//
// The algorithms take the policy as an object m (m.fma(a, b, c)): the intrinsic policies are
// stateless; the code generator's policy emits LLVM IR through a builder
// (src/compiler/codegen.cpp), so compiled loops compute the same operations inline, bit for bit.
//
// P provides: V (float lanes), I (int32 lanes), Mask; set, add, sub, mul, div, fma (a * b + c,
// fused where the variant is, two roundings where it is not), clamp (NaN passes through), abs,
// copysign, lt, select(mask, a, b), bits / from_bits, iset, iadd, isub, shl, sra. A policy may
// also provide scalef(y, n) = y 2^n rounded once (AVX-512's vscalefps) with has_scalef() saying
// whether it may be used.
#pragma once

#include <cstdint>
#include <cstring>

namespace kiln::math::fast {
namespace {

// e^x = 2^n e^r: n = round(x / ln 2), r = x - n ln 2 (Cody and Waite's two-part ln 2, exact
// first product), e^r by Cephes' degree-6 polynomial on |r| <= ln 2 / 2 (1 + r + r^2 P(r),
// summed small terms first). The caller scales by 2^n.
template <class P>
struct ExpParts {
  typename P::V y;   // e^r
  typename P::V nf;  // n, an integer, as a float
  typename P::I n;
};
template <class P>
inline ExpParts<P> exp_parts(const P& m, typename P::V x) {
  using V = typename P::V;
  const V magic = m.set(0x1.8p23f);  // adding it rounds to an integer, kept in the low bits
  const V t = m.fma(x, m.set(1.44269504088896341f), magic);
  const V n = m.sub(t, magic);
  V r = m.fma(n, m.set(-0.693359375f), x);  // ln 2's leading 9 bits: n times it is exact
  r = m.fma(n, m.set(2.12194440e-4f), r);   // the rest of ln 2, negated
  V p = m.set(1.9875691500e-4f);
  p = m.fma(p, r, m.set(1.3981999507e-3f));
  p = m.fma(p, r, m.set(8.3334519073e-3f));
  p = m.fma(p, r, m.set(4.1665795894e-2f));
  p = m.fma(p, r, m.set(1.6666665459e-1f));
  p = m.fma(p, r, m.set(5.0000001201e-1f));
  return {m.add(m.fma(p, m.mul(r, r), r), m.set(1.0f)), n, m.isub(m.bits(t), m.bits(magic))};
}

// 2^n as a float, for -126 <= n <= 127; +0 for n = -127 (exp's arguments below -175.7).
template <class P>
inline typename P::V pow2(const P& m, typename P::I n) {
  return m.from_bits(m.shl(m.iadd(n, m.iset(127)), 23));
}

// e^r 2^n, rounded once: in one instruction where the policy has it, otherwise by 2^n as one
// power of two where n is a normal number's exponent (`wide` false), and as 2^(n/2) 2^(n - n/2)
// where it may not be (exp's -254 <= n <= 128): both halves are normal numbers, so only the
// last product rounds, the same bits. An operation whose result underflows takes a microcode
// assist (e^-inf, a masked score's, over 2^20 floats ran 3.3x slower than e^0 with the bound at
// -104 and 17x with vscalefps underflowing; a causal softmax 2x slower than an unmasked one), so
// e^-inf and the arguments below -175.7 come without one everywhere, where n <= -253 and a
// half's bits are those of +0, and so do those below about -104.3 in vscalefps's steps, which
// scale +0 from n <= -151, where e^r 2^n < 2^-150.
template <class P>
inline typename P::V scale(const P& m, const ExpParts<P>& e, bool wide) {
  using V = typename P::V;
  if constexpr (requires { m.scalef(e.y, e.nf); })
    if (m.has_scalef()) {
      const V y = wide ? m.select(m.lt(m.set(-151.0f), e.nf), e.y, m.set(0.0f)) : e.y;
      return m.scalef(y, e.nf);
    }
  if (!wide) return m.mul(e.y, pow2(m, e.n));
  const typename P::I n1 = m.sra(e.n, 1);
  return m.mul(m.mul(e.y, pow2(m, n1)), pow2(m, m.isub(e.n, n1)));
}

// exp(x) = e^r 2^n. Arguments are clamped to [-176, 89], beyond which the result is 0 or inf
// anyway (below -104 it is 0); NaN passes.
template <class P>
inline typename P::V exp(const P& m, typename P::V x) {
  return scale(m, exp_parts(m, m.clamp(x, m.set(-176.0f), m.set(89.0f))), true);
}

// tanh(x): x below 2^-12 in magnitude (±0 and denormals included), where x^3/3 is below half
// an ulp of x; Cephes' odd polynomial x + x^3 P(x^2) below 0.625; above, 1 - 2 / (e^(2|x|) + 1)
// with x's sign (tanh(0.625) > 1/2, so the subtraction loses no leading bits). Infinite
// arguments give ±1 (e^(2|x|) = inf), NaN gives NaN.
template <class P>
inline typename P::V tanh(const P& m, typename P::V x) {
  using V = typename P::V;
  const V a = m.abs(x);
  const V one = m.set(1.0f);
  // e^(2|x|) with 2|x| clamped to 20, past which 2 / (e + 1) is below half an ulp of 1 (the
  // result is ±1 either way): 0 <= n <= 29.
  const V e = scale(m, exp_parts(m, m.clamp(m.add(a, a), m.set(0.0f), m.set(20.0f))), false);
  const V large = m.copysign(m.sub(one, m.div(m.set(2.0f), m.add(e, one))), x);
  const V z = m.mul(x, x);
  V p = m.set(-5.70498872745e-3f);
  p = m.fma(p, z, m.set(2.06390887954e-2f));
  p = m.fma(p, z, m.set(-5.37397155531e-2f));
  p = m.fma(p, z, m.set(1.33314422036e-1f));
  p = m.fma(p, z, m.set(-3.33332819422e-1f));
  const V small = m.fma(m.mul(p, z), x, x);
  return m.select(m.lt(a, m.set(0.625f)), m.select(m.lt(a, m.set(0x1p-12f)), x, small), large);
}

// The one-lane policy of the scalar variants; kFused: fma is one rounding (__builtin_fmaf, an
// instruction where the file is compiled with -mfma).
template <bool kFused>
struct Scalar {
  using V = float;
  using I = int32_t;
  using Mask = bool;
  static V set(float v) { return v; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
  static V div(V a, V b) { return a / b; }
  static V fma(V a, V b, V c) {
    if constexpr (kFused)
      return __builtin_fmaf(a, b, c);
    else
      return a * b + c;
  }
  static V clamp(V x, V lo, V hi) {  // NaN fails both tests and passes
    const V m = x < lo ? lo : x;
    return m > hi ? hi : m;
  }
  static I bits(V v) {
    I i;
    std::memcpy(&i, &v, sizeof i);
    return i;
  }
  static V from_bits(I i) {
    V v;
    std::memcpy(&v, &i, sizeof v);
    return v;
  }
  static V abs(V v) { return from_bits(bits(v) & 0x7fffffff); }
  static V copysign(V mag, V s) {
    return from_bits((bits(mag) & 0x7fffffff) | (bits(s) & static_cast<I>(0x80000000u)));
  }
  static Mask lt(V a, V b) { return a < b; }
  static V select(Mask m, V a, V b) { return m ? a : b; }
  static I iset(int32_t v) { return v; }
  // Wrapping, as the vector instructions do (a NaN's bits reach them too).
  static I iadd(I a, I b) {
    return static_cast<I>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
  }
  static I isub(I a, I b) {
    return static_cast<I>(static_cast<uint32_t>(a) - static_cast<uint32_t>(b));
  }
  static I shl(I a, int n) { return static_cast<I>(static_cast<uint32_t>(a) << n); }
  static I sra(I a, int n) { return a >> n; }
};

}  // namespace
}  // namespace kiln::math::fast
