// Element types, their promotion lattice and the 16-bit float formats.
#pragma once

#include <complex>
#include <cstdint>
#include <cstring>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>

namespace kiln {

enum class DType : uint8_t {
  bool_,
  uint8,
  uint32,
  int32,
  int64,
  float16,
  bfloat16,
  float32,
  float64,
  complex64,   // interleaved (re, im) float32 pairs, as NumPy and DLPack store them
  complex128,  // interleaved (re, im) float64 pairs
};
inline constexpr int kNumDTypes = 11;

inline constexpr DType bool_ = DType::bool_;
inline constexpr DType uint8 = DType::uint8;
inline constexpr DType uint32 = DType::uint32;
inline constexpr DType int32 = DType::int32;
inline constexpr DType int64 = DType::int64;
inline constexpr DType float16 = DType::float16;
inline constexpr DType bfloat16 = DType::bfloat16;
inline constexpr DType float32 = DType::float32;
inline constexpr DType float64 = DType::float64;
inline constexpr DType complex64 = DType::complex64;
inline constexpr DType complex128 = DType::complex128;

// Short names as printed in IR and messages: "f32", "i64", "bool", ...
std::string_view dtype_name(DType d);
std::optional<DType> dtype_from_name(std::string_view name);
std::ostream& operator<<(std::ostream& os, DType d);
std::size_t dtype_size(DType d);
bool is_floating(DType d);  // real floats only: complex is not floating
bool is_complex(DType d);
bool is_inexact(DType d);   // floating or complex: the dtypes derivatives flow through
bool is_integral(DType d);  // bool is not integral
bool is_unsigned(DType d);

// Join of two dtypes in the promotion lattice (docs/DESIGN.md, "Type promotion").
DType promote_types(DType a, DType b);
// Dtype a weakly typed C++ scalar takes next to a tensor of dtype `d`.
DType weak_scalar_dtype(DType d, bool scalar_is_floating);
// Float dtype that an op like sin or mean computes in for input `d`.
DType to_floating(DType d);
// complex64 for f16/bf16/f32 (and integers), complex128 for f64; complex dtypes map to themselves.
DType to_complex(DType d);
// The float dtype of a complex dtype's parts (complex64 -> f32); real dtypes map to themselves.
DType real_part_dtype(DType d);

// A set of dtypes, used by kernel registrations to say which inputs they accept.
class DTypeSet {
 public:
  constexpr DTypeSet() = default;
  constexpr DTypeSet(DType d) : bits_(1u << static_cast<unsigned>(d)) {}  // NOLINT
  static constexpr DTypeSet all() { return DTypeSet((1u << kNumDTypes) - 1); }
  static DTypeSet floating();
  static DTypeSet integral();
  static DTypeSet numeric();  // integers and real floats: not bool, not complex
  static DTypeSet complex();  // complex64, complex128
  static DTypeSet real();     // everything but complex
  constexpr bool contains(DType d) const { return bits_ & (1u << static_cast<unsigned>(d)); }
  constexpr DTypeSet operator|(DTypeSet o) const { return DTypeSet(bits_ | o.bits_); }
  int size() const { return __builtin_popcount(bits_); }
  std::string to_string() const;
  constexpr bool operator==(const DTypeSet&) const = default;

 private:
  constexpr explicit DTypeSet(unsigned bits) : bits_(bits) {}
  unsigned bits_ = 0;
};

// IEEE binary16, stored as bits; arithmetic goes through float.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float f);  // NOLINT: implicit like a built-in float
  operator float() const;
};

// bfloat16 (the top half of a float32), round-to-nearest-even on conversion.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) {  // NOLINT
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = static_cast<uint16_t>((u >> 16) | 0x40);  // keep NaN a NaN
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      bits = static_cast<uint16_t>(u >> 16);
    }
  }
  operator float() const {  // NOLINT
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// Maps C++ element types to dtypes and back.
template <typename T>
struct dtype_of;
template <>
struct dtype_of<bool> {
  static constexpr DType value = bool_;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = uint8;
};
template <>
struct dtype_of<uint32_t> {
  static constexpr DType value = uint32;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = int32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = int64;
};
template <>
struct dtype_of<Half> {
  static constexpr DType value = float16;
};
template <>
struct dtype_of<BFloat16> {
  static constexpr DType value = bfloat16;
};
template <>
struct dtype_of<float> {
  static constexpr DType value = float32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = float64;
};
template <>
struct dtype_of<std::complex<float>> {
  static constexpr DType value = complex64;
};
template <>
struct dtype_of<std::complex<double>> {
  static constexpr DType value = complex128;
};
template <typename T>
inline constexpr DType dtype_v = dtype_of<T>::value;

}  // namespace kiln
