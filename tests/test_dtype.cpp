// dtypes: names and sizes, the promotion lattice, weakly typed C++ scalars, and the 16-bit float
// formats (Half against numpy's float16, BFloat16 against hand-computed bit patterns).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kiln/kiln.h"

using namespace kiln;

namespace {

const DType kAll[] = {bool_,    uint8,   uint32,  int32,     int64,     float16,
                      bfloat16, float32, float64, complex64, complex128};

TEST(DType, NamesSizesAndKinds) {
  const char* names[] = {"bool", "u8",  "u32", "i32", "i64", "f16",
                         "bf16", "f32", "f64", "c64", "c128"};
  const std::size_t sizes[] = {1, 1, 4, 4, 8, 2, 2, 4, 8, 8, 16};
  for (int i = 0; i < kNumDTypes; ++i) {
    EXPECT_EQ(dtype_name(kAll[i]), names[i]);
    EXPECT_EQ(dtype_size(kAll[i]), sizes[i]) << names[i];
    ASSERT_TRUE(dtype_from_name(names[i]).has_value()) << names[i];
    EXPECT_EQ(*dtype_from_name(names[i]), kAll[i]);
  }
  EXPECT_FALSE(dtype_from_name("float32").has_value());
  EXPECT_FALSE(dtype_from_name("").has_value());

  EXPECT_FALSE(is_floating(bool_));
  EXPECT_FALSE(is_integral(bool_));
  EXPECT_TRUE(is_unsigned(bool_));
  for (DType d : {uint8, uint32, int32, int64}) {
    EXPECT_TRUE(is_integral(d)) << d;
    EXPECT_FALSE(is_floating(d)) << d;
  }
  EXPECT_TRUE(is_unsigned(uint8));
  EXPECT_TRUE(is_unsigned(uint32));
  EXPECT_FALSE(is_unsigned(int32));
  EXPECT_FALSE(is_unsigned(int64));
  for (DType d : {float16, bfloat16, float32, float64}) {
    EXPECT_TRUE(is_floating(d)) << d;
    EXPECT_FALSE(is_integral(d)) << d;
    EXPECT_FALSE(is_unsigned(d)) << d;
    EXPECT_EQ(to_floating(d), d);
  }
  for (DType d : {bool_, uint8, uint32, int32, int64}) EXPECT_EQ(to_floating(d), float32) << d;
}

TEST(DType, DTypeSet) {
  EXPECT_EQ(DTypeSet::all().size(), 11);
  EXPECT_EQ(DTypeSet::complex().size(), 2);
  EXPECT_EQ(DTypeSet::real().size(), 9);
  EXPECT_FALSE(DTypeSet::numeric().contains(complex64));
  EXPECT_EQ(DTypeSet::floating().size(), 4);
  EXPECT_EQ(DTypeSet::integral().size(), 4);
  EXPECT_EQ(DTypeSet::numeric().size(), 8);
  EXPECT_FALSE(DTypeSet::numeric().contains(bool_));
  EXPECT_TRUE(DTypeSet::floating().contains(bfloat16));
  EXPECT_FALSE(DTypeSet::floating().contains(int64));
  EXPECT_TRUE(DTypeSet::integral().contains(uint32));
  EXPECT_FALSE(DTypeSet::integral().contains(bool_));
  EXPECT_EQ(DTypeSet().size(), 0);
  const DTypeSet s = DTypeSet(float32) | float64;
  EXPECT_TRUE(s.contains(float32));
  EXPECT_TRUE(s.contains(float64));
  EXPECT_FALSE(s.contains(float16));
  EXPECT_EQ(s.to_string(), "f32|f64");
  EXPECT_EQ(DTypeSet::all().to_string(), "any");
  EXPECT_EQ(DTypeSet().to_string(), "none");
}

// The lattice as documented: bool < u8 < {u32, i32} < i64 (u32 with i32 joins at i64); every
// integer and bool sits below every float; f16 with bf16 joins at f32; f32 < f64; every float
// sits below complex64 except f64, which joins it at complex128.
TEST(DType, PromotionLatticeTable) {
  using D = DType;
  // Row/column order: bool u8 u32 i32 i64 f16 bf16 f32 f64 c64 c128 (written out by hand).
  const D b = bool_, u8 = uint8, u32 = uint32, i32 = int32, i64 = int64, h = float16, bf = bfloat16,
          f = float32, d = float64, c = complex64, z = complex128;
  const D table[11][11] = {
      /* bool */ {b, u8, u32, i32, i64, h, bf, f, d, c, z},
      /* u8   */ {u8, u8, u32, i32, i64, h, bf, f, d, c, z},
      /* u32  */ {u32, u32, u32, i64, i64, h, bf, f, d, c, z},
      /* i32  */ {i32, i32, i64, i32, i64, h, bf, f, d, c, z},
      /* i64  */ {i64, i64, i64, i64, i64, h, bf, f, d, c, z},
      /* f16  */ {h, h, h, h, h, h, f, f, d, c, z},
      /* bf16 */ {bf, bf, bf, bf, bf, f, bf, f, d, c, z},
      /* f32  */ {f, f, f, f, f, f, f, f, d, c, z},
      /* f64  */ {d, d, d, d, d, d, d, d, d, z, z},
      /* c64  */ {c, c, c, c, c, c, c, c, z, c, z},
      /* c128 */ {z, z, z, z, z, z, z, z, z, z, z},
  };
  for (int i = 0; i < 11; ++i)
    for (int j = 0; j < 11; ++j)
      EXPECT_EQ(promote_types(kAll[i], kAll[j]), table[i][j])
          << dtype_name(kAll[i]) << " with " << dtype_name(kAll[j]);
}

TEST(DType, PromotionIsALattice) {
  // Commutative, idempotent, associative, and the join is an upper bound of both.
  for (DType a : kAll) {
    EXPECT_EQ(promote_types(a, a), a);
    for (DType b : kAll) {
      const DType ab = promote_types(a, b);
      EXPECT_EQ(ab, promote_types(b, a)) << a << " " << b;
      EXPECT_EQ(promote_types(ab, a), ab) << a << " " << b;
      EXPECT_EQ(promote_types(ab, b), ab) << a << " " << b;
      for (DType c : kAll)
        EXPECT_EQ(promote_types(ab, c), promote_types(a, promote_types(b, c)))
            << a << " " << b << " " << c;
    }
  }
}

TEST(DType, BinaryOpsPromote) {
  const Tensor u = tensor(std::vector<unsigned>{3000000000u, 1}, Shape{2});
  const Tensor i = tensor({-1, 2});
  const Tensor s = add(u, i);
  EXPECT_EQ(s.dtype(), int64);  // u32 + i32 -> i64, with no wrap-around
  EXPECT_EQ(s.to_vector<int64_t>(), (std::vector<int64_t>{2999999999LL, 3}));

  const Tensor h = astype(tensor({1.5f, 2.0f}), float16);
  const Tensor bf = astype(tensor({0.25f, 4.0f}), bfloat16);
  const Tensor hb = mul(h, bf);
  EXPECT_EQ(hb.dtype(), float32);
  EXPECT_EQ(hb.to_vector<float>(), (std::vector<float>{0.375f, 8.0f}));

  EXPECT_EQ(add(tensor({1.0f}), tensor({1.0})).dtype(), float64);
  EXPECT_EQ(add(i, h).dtype(), float16);
  EXPECT_EQ(add(tensor({int64_t{1}, int64_t{2}}), bf).dtype(), bfloat16);
  const Tensor byte = tensor(std::vector<uint8_t>{250, 7}, Shape{2});
  const Tensor bi = add(byte, i);
  EXPECT_EQ(bi.dtype(), int32);
  EXPECT_EQ(bi.to_vector<int32_t>(), (std::vector<int32_t>{249, 9}));
  const Tensor bools = tensor(std::vector<bool>{true, false}, Shape{2});
  EXPECT_EQ(add(bools, byte).dtype(), uint8);
  EXPECT_EQ(add(bools, byte).to_vector<int32_t>(), (std::vector<int32_t>{251, 7}));
  // Comparisons promote too: 3000000000u (u32) is greater than -1 (i32).
  EXPECT_EQ(greater(u, i).to_vector<bool>(), (std::vector<bool>{true, false}));
}

TEST(DType, WeakScalars) {
  EXPECT_EQ(weak_scalar_dtype(float16, true), float16);
  EXPECT_EQ(weak_scalar_dtype(bfloat16, true), bfloat16);
  EXPECT_EQ(weak_scalar_dtype(float64, true), float64);
  EXPECT_EQ(weak_scalar_dtype(int32, true), float32);
  EXPECT_EQ(weak_scalar_dtype(int32, false), int32);
  EXPECT_EQ(weak_scalar_dtype(uint8, false), uint8);
  EXPECT_EQ(weak_scalar_dtype(bool_, false), int32);

  const Tensor f = tensor({1.5f, -2.0f});
  EXPECT_EQ((f * 2.0).dtype(), float32);
  EXPECT_EQ((2.0 * f).dtype(), float32);
  EXPECT_EQ((f * 2.0).to_vector<float>(), (std::vector<float>{3.0f, -4.0f}));
  EXPECT_EQ((f + 1).dtype(), float32);

  const Tensor h = astype(f, float16);
  EXPECT_EQ((h * 2.0).dtype(), float16);
  EXPECT_EQ((h * 2.0).to_vector<float>(), (std::vector<float>{3.0f, -4.0f}));
  EXPECT_EQ((h - 0.5).to_vector<float>(), (std::vector<float>{1.0f, -2.5f}));
  EXPECT_EQ((astype(f, bfloat16) / 2.0).dtype(), bfloat16);
  EXPECT_EQ((tensor({1.0, 2.0}) * 2.0f).dtype(), float64);

  const Tensor i = tensor({1, 2, 3});
  const Tensor scaled = i * 2.5;
  EXPECT_EQ(scaled.dtype(), float32);
  EXPECT_EQ(scaled.to_vector<float>(), (std::vector<float>{2.5f, 5.0f, 7.5f}));
  EXPECT_EQ((i + 1).dtype(), int32);
  EXPECT_EQ((i + 1).to_vector<int32_t>(), (std::vector<int32_t>{2, 3, 4}));
  EXPECT_EQ((10 - i).to_vector<int32_t>(), (std::vector<int32_t>{9, 8, 7}));
  EXPECT_EQ((i + int64_t{1}).dtype(), int32);  // the scalar's C++ width does not matter

  const Tensor b = tensor(std::vector<bool>{true, false}, Shape{2});
  EXPECT_EQ((b + 1).dtype(), int32);
  EXPECT_EQ((b + 1).to_vector<int32_t>(), (std::vector<int32_t>{2, 1}));

  const Tensor u8 = tensor(std::vector<uint8_t>{200, 10}, Shape{2});
  EXPECT_EQ((u8 + 100).dtype(), uint8);
  EXPECT_EQ((u8 + 100).to_vector<int32_t>(), (std::vector<int32_t>{44, 110}));  // wraps mod 256
  EXPECT_EQ((u8 * 0.5).dtype(), float32);

  // Comparisons with weak scalars keep the tensor's dtype for the comparison.
  EXPECT_EQ((i > 1).dtype(), bool_);
  EXPECT_EQ((i > 1).to_vector<bool>(), (std::vector<bool>{false, true, true}));
  EXPECT_EQ((i > 1.5).to_vector<bool>(), (std::vector<bool>{false, true, true}));
}

// ---- Half --------------------------------------------------------------------------

struct HalfCase {
  float in;
  uint16_t bits;
  double value;
};

TEST(Half, RoundingMatchesNumpy) {
  // Each row: numpy produced `bits` and `value` by np.float32(in).astype(np.float16).
  const HalfCase cases[] = {
      {0.0f, 0x0000, 0.0},
      {-0.0f, 0x8000, -0.0},
      {1.0f, 0x3c00, 1.0},
      {-2.0f, 0xc000, -2.0},
      {0.1f, 0x2e66, 0.0999755859375},
      {0.33333334f, 0x3555, 0.333251953125},
      {3.1415927f, 0x4248, 3.140625},
      {65504.0f, 0x7bff, 65504.0},   // largest finite half
      {65519.0f, 0x7bff, 65504.0},   // just below the overflow tie
      {65520.0f, 0x7c00, INFINITY},  // tie rounds to even = inf
      {100000.0f, 0x7c00, INFINITY},
      {-100000.0f, 0xfc00, -INFINITY},
      {6.1035156e-05f, 0x0400, 6.103515625e-05},        // smallest normal
      {5.9604645e-08f, 0x0001, 5.960464477539063e-08},  // smallest subnormal
      {2.9802322e-08f, 0x0000, 0.0},                    // half of it: tie to even = 0
      {2.9802326e-08f, 0x0001, 5.960464477539063e-08},  // just above the tie
      {1e-08f, 0x0000, 0.0},
      {3e-05f, 0x01f7, 2.9981136322021484e-05},  // subnormal
      {-3e-05f, 0x81f7, -2.9981136322021484e-05},
      {1.0004883f, 0x3c00, 1.0},          // 1 + 2^-11: tie to even (down)
      {1.0014648f, 0x3c02, 1.001953125},  // 1 + 3*2^-11: tie to even (up)
      {2049.0f, 0x6800, 2048.0},
      {2051.0f, 0x6802, 2052.0},
      {1e-04f, 0x068e, 0.00010001659393310547},
      {0.5f, 0x3800, 0.5},
      {1000.7f, 0x63d1, 1000.5},
  };
  for (const HalfCase& c : cases) {
    const Half h(c.in);
    EXPECT_EQ(h.bits, c.bits) << "input " << c.in;
    EXPECT_EQ(static_cast<double>(static_cast<float>(h)), c.value) << "input " << c.in;
    EXPECT_EQ(std::signbit(static_cast<float>(h)), std::signbit(c.value)) << "input " << c.in;
  }
  // numpy: np.array([inf, -inf, nan], np.float32).astype(np.float16).view(np.uint16)
  // == [0x7c00, 0xfc00, 0x7e00]; any NaN encoding is acceptable for NaN.
  EXPECT_EQ(Half(INFINITY).bits, 0x7c00);
  EXPECT_EQ(Half(-INFINITY).bits, 0xfc00);
  const Half nan(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan.bits & 0x7c00, 0x7c00);
  EXPECT_NE(nan.bits & 0x03ff, 0);
  EXPECT_TRUE(std::isnan(static_cast<float>(nan)));
  // A signalling-looking NaN whose payload lives only in the low float bits stays a NaN.
  EXPECT_TRUE(std::isnan(static_cast<float>(Half(std::bit_cast<float>(0x7f800001u)))));
}

// Decodes binary16 independently of the library: (-1)^s * 2^(e-15) * (1 + m/1024), etc.
double decode_half(uint16_t bits) {
  const int s = bits >> 15, e = (bits >> 10) & 0x1f, m = bits & 0x3ff;
  double v;
  if (e == 0)
    v = std::ldexp(static_cast<double>(m), -24);
  else if (e == 31)
    v = m ? std::numeric_limits<double>::quiet_NaN() : INFINITY;
  else
    v = std::ldexp(1.0 + m / 1024.0, e - 15);
  return s ? -v : v;
}

TEST(Half, EveryBitPatternDecodesAndRoundTrips) {
  for (uint32_t b = 0; b < 65536; ++b) {
    Half h;
    h.bits = static_cast<uint16_t>(b);
    const float f = h;
    const double want = decode_half(h.bits);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << b;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), want) << std::hex << b;
    ASSERT_EQ(std::signbit(f), std::signbit(want)) << std::hex << b;
    ASSERT_EQ(Half(f).bits, h.bits) << std::hex << b;  // exact values round-trip
  }
}

// Round-to-nearest-even checked against the decoded neighbours, for float inputs spread over
// the whole binary16 range (and beyond, into overflow and underflow).
TEST(Half, RoundsToNearestEven) {
  int checked = 0;
  for (uint32_t fb = 0x2f000000u; fb < 0x47900000u; fb += 0x1357u) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      const float f = std::bit_cast<float>(fb | sign);
      const uint16_t got = Half(f).bits;
      const double x = std::fabs(static_cast<double>(f));
      // Candidates: the largest finite half <= x and the next one up (or inf).
      uint16_t lo = 0;
      for (uint16_t step = 0x4000; step; step >>= 1)
        if (lo + step <= 0x7bff && decode_half(static_cast<uint16_t>(lo + step)) <= x)
          lo = static_cast<uint16_t>(lo + step);
      uint16_t want;
      if (decode_half(lo) == x) {
        want = lo;
      } else {
        const uint16_t hi = static_cast<uint16_t>(lo + 1);
        // Above 65504 the next "value" is 65536 for rounding purposes (IEEE overflow rule).
        const double vhi = lo == 0x7bff ? 65536.0 : decode_half(hi);
        const double dl = x - decode_half(lo), dh = vhi - x;
        if (dl < dh)
          want = lo;
        else if (dh < dl)
          want = hi;
        else
          want = (lo & 1) ? hi : lo;
      }
      if (sign) want = static_cast<uint16_t>(want | 0x8000);
      ASSERT_EQ(got, want) << "input " << f << " (bits " << std::hex << (fb | sign) << ")";
      ++checked;
    }
  }
  EXPECT_GT(checked, 50000);
}

TEST(Half, TensorConversionsMatchNumpy) {
  // numpy: np.array([0.1, 65519, 65520, 3e-5, 2049, -1e5], np.float32).astype(np.float16)
  //        -> [0.0999755859375, 65504, inf, 2.9981136322021484e-05, 2048, -inf]
  const Tensor x = tensor({0.1f, 65519.0f, 65520.0f, 3e-5f, 2049.0f, -1e5f});
  const Tensor h = astype(x, float16);
  EXPECT_EQ(h.dtype(), float16);
  const std::vector<double> got = h.to_vector<double>();
  const std::vector<double> want = {0.0999755859375,        65504.0, INFINITY,
                                    2.9981136322021484e-05, 2048.0,  -INFINITY};
  EXPECT_EQ(got, want);
  // f64 -> f16 goes through the nearest float first; these values are exact in f32.
  EXPECT_EQ(astype(tensor({0.5, -1.25}), float16).to_vector<float>(),
            (std::vector<float>{0.5f, -1.25f}));
  // f16 -> integers: saturating, NaN -> 0 (library contract), truncation toward zero.
  const Tensor hi = astype(tensor({-2.75f, 2.75f, 70000.0f}), float16);
  EXPECT_EQ(astype(hi, int32).to_vector<int32_t>(), (std::vector<int32_t>{-2, 2, 2147483647}));
  EXPECT_EQ(astype(hi, bool_).to_vector<bool>(), (std::vector<bool>{true, true, true}));
}

// ---- BFloat16 ----------------------------------------------------------------------

TEST(BFloat16, RoundingByHand) {
  struct Case {
    uint32_t in;  // float32 bits
    uint16_t out;
  };
  // Hand-computed: keep the top 16 bits, round the low 16 to nearest, ties to even.
  const Case cases[] = {
      {0x3f800000u, 0x3f80},  // 1.0 exact
      {0x40490fdbu, 0x4049},  // pi: low half 0x0fdb < 0x8000 rounds down
      {0x3eaaaaabu, 0x3eab},  // 1/3: low half 0xaaab > 0x8000 rounds up
      {0x3f808000u, 0x3f80},  // tie, 0x3f80 even: stays
      {0x3f818000u, 0x3f82},  // tie, 0x3f81 odd: rounds up to even
      {0x3f808001u, 0x3f81},  // just above the tie
      {0x3f7fffffu, 0x3f80},  // carries into the exponent
      {0x7f7fffffu, 0x7f80},  // FLT_MAX rounds to inf
      {0xff7fffffu, 0xff80},  // -FLT_MAX rounds to -inf
      {0x7f800000u, 0x7f80},  // inf
      {0x80000000u, 0x8000},  // -0
      {0x00000001u, 0x0000},  // smallest float subnormal rounds to 0
      {0x00018000u, 0x0002},  // subnormal tie, odd: up
  };
  for (const Case& c : cases) {
    const BFloat16 b(std::bit_cast<float>(c.in));
    EXPECT_EQ(b.bits, c.out) << std::hex << c.in;
  }
  for (uint32_t nan_bits : {0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x7fff0000u}) {
    const BFloat16 b(std::bit_cast<float>(nan_bits));
    EXPECT_TRUE(std::isnan(static_cast<float>(b))) << std::hex << nan_bits;
  }
  // Decoding is exact: bits << 16.
  for (uint32_t b = 0; b < 65536; b += 7) {
    BFloat16 v;
    v.bits = static_cast<uint16_t>(b);
    const float f = v;
    EXPECT_EQ(std::bit_cast<uint32_t>(f), b << 16);
  }
}

TEST(BFloat16, TensorConversions) {
  // bf16 has 8 significant bits: 257 rounds (tie, even) to 256, 259 to 260; 1/3 -> 0x3eab =
  // 0.333984375.
  const Tensor x = astype(tensor({257.0f, 259.0f, 1.0f / 3.0f, -0.0f}), bfloat16);
  EXPECT_EQ(x.dtype(), bfloat16);
  const std::vector<float> v = x.to_vector<float>();
  EXPECT_EQ(v, (std::vector<float>{256.0f, 260.0f, 0.333984375f, 0.0f}));
  EXPECT_TRUE(std::signbit(v[3]));
  // 1e38f = 0x7e967699 (low half below the tie: down to 0x7e96); 3e38f = 0x7f61b1e6 (up to
  // 0x7f62, still finite: bf16's max is ~3.39e38).
  const Tensor big = astype(tensor({1e38f, 3.0e38f}), bfloat16);
  const std::vector<float> bv = big.to_vector<float>();
  EXPECT_EQ(std::bit_cast<uint32_t>(bv[0]), 0x7e960000u);
  EXPECT_EQ(std::bit_cast<uint32_t>(bv[1]), 0x7f620000u);
  EXPECT_EQ(astype(x, float16).to_vector<float>()[0], 256.0f);
}

}  // namespace
