#include "kiln/dtype.h"

#include <array>
#include <bit>
#include <ostream>

#include "kiln/error.h"

namespace kiln {
namespace {

struct DTypeInfo {
  std::string_view name;
  std::size_t size;
};
constexpr std::array<DTypeInfo, kNumDTypes> kInfo{{
    {"bool", 1},
    {"u8", 1},
    {"u32", 4},
    {"i32", 4},
    {"i64", 8},
    {"f16", 2},
    {"bf16", 2},
    {"f32", 4},
    {"f64", 8},
    {"c64", 8},
    {"c128", 16},
}};

const DTypeInfo& info(DType d) { return kInfo[static_cast<std::size_t>(d)]; }

}  // namespace

std::string_view dtype_name(DType d) { return info(d).name; }
std::size_t dtype_size(DType d) { return info(d).size; }
std::ostream& operator<<(std::ostream& os, DType d) { return os << dtype_name(d); }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (kInfo[static_cast<std::size_t>(i)].name == name) return static_cast<DType>(i);
  return std::nullopt;
}

bool is_floating(DType d) { return d == float16 || d == bfloat16 || d == float32 || d == float64; }
bool is_complex(DType d) { return d == complex64 || d == complex128; }
bool is_inexact(DType d) { return is_floating(d) || is_complex(d); }
bool is_integral(DType d) { return d == uint8 || d == uint32 || d == int32 || d == int64; }
bool is_unsigned(DType d) { return d == uint8 || d == uint32 || d == bool_; }

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (a == bool_) return b;
  if (b == bool_) return a;
  // Complex joins above every float: the complex whose parts hold the wider float.
  if (is_complex(a) || is_complex(b))
    return to_complex(promote_types(real_part_dtype(a), real_part_dtype(b)));
  const bool fa = is_floating(a), fb = is_floating(b);
  if (fa && !fb) return a;  // integers join below every float (JAX's lattice)
  if (fb && !fa) return b;
  if (fa && fb) {
    if (a == float64 || b == float64) return float64;
    return float32;  // f16 with bf16, or either with f32
  }
  // Two different integer types.
  auto both = [&](DType x, DType y) { return (a == x && b == y) || (a == y && b == x); };
  if (both(uint8, uint32)) return uint32;
  if (both(uint8, int32)) return int32;
  if (both(uint32, int32)) return int64;  // the smallest type that holds both ranges
  return int64;                           // anything with int64
}

DType weak_scalar_dtype(DType d, bool scalar_is_floating) {
  if (scalar_is_floating) return is_inexact(d) ? d : float32;
  return d == bool_ ? int32 : d;
}

DType to_floating(DType d) { return is_inexact(d) ? d : float32; }

DType to_complex(DType d) {
  if (is_complex(d)) return d;
  return d == float64 ? complex128 : complex64;
}

DType real_part_dtype(DType d) {
  if (d == complex64) return float32;
  if (d == complex128) return float64;
  return d;
}

DTypeSet DTypeSet::floating() { return DTypeSet(float16) | bfloat16 | float32 | float64; }
DTypeSet DTypeSet::integral() { return DTypeSet(uint8) | uint32 | int32 | int64; }
DTypeSet DTypeSet::numeric() { return floating() | integral(); }
DTypeSet DTypeSet::complex() { return DTypeSet(complex64) | complex128; }
DTypeSet DTypeSet::real() { return numeric() | bool_; }

std::string DTypeSet::to_string() const {
  if (*this == all()) return "any";
  std::string s;
  for (int i = 0; i < kNumDTypes; ++i) {
    if (!contains(static_cast<DType>(i))) continue;
    if (!s.empty()) s += "|";
    s += dtype_name(static_cast<DType>(i));
  }
  return s.empty() ? "none" : s;
}

// IEEE binary16 <-> binary32 with round-to-nearest-even, including subnormals, inf and NaN.
Half::Half(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or NaN
    bits = static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
    return;
  }
  if (absx >= 0x477ff000u) {  // rounds to >= 65520: overflow to inf
    bits = static_cast<uint16_t>(sign | 0x7c00u);
    return;
  }
  if (absx < 0x38800000u) {  // result is subnormal (or zero) in half
    // Add 0.5 in the magic position so the FPU rounds to nearest even for us.
    const float magic = std::bit_cast<float>(0x3f000000u);  // 0.5
    const float v = std::bit_cast<float>(absx) + magic;
    bits = static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(v) - 0x3f000000u));
    return;
  }
  uint32_t mant_odd = (absx >> 13) & 1u;
  uint32_t v = absx + 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
  bits = static_cast<uint16_t>(sign | (v >> 13));
}

Half::operator float() const {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exp = (bits >> 10) & 0x1fu;
  const uint32_t mant = bits & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {  // subnormal: value = mant * 2^-24
      const float f = static_cast<float>(mant) * 5.9604644775390625e-08f;
      out = sign | std::bit_cast<uint32_t>(f);
    }
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(out);
}

}  // namespace kiln
