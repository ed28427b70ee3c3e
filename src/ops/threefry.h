// Threefry-2x32 and the key helpers shared by the random primitives (src/ops/random.cpp,
// src/ops/random_distributions.cpp).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln::rng {

struct Pair {
  uint32_t a, b;
};

inline uint32_t rotl(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

inline Pair threefry(Pair key, Pair count) {
  constexpr int kRot[2][4] = {{13, 15, 26, 6}, {17, 29, 16, 24}};
  const uint32_t ks[3] = {key.a, key.b, key.a ^ key.b ^ 0x1BD11BDAu};
  uint32_t x0 = count.a + ks[0], x1 = count.b + ks[1];
  for (int block = 0; block < 5; ++block) {
    for (int r : kRot[block % 2]) {
      x0 += x1;
      x1 = rotl(x1, r);
      x1 ^= x0;
    }
    x0 += ks[(block + 1) % 3];
    x1 += ks[(block + 2) % 3] + static_cast<uint32_t>(block + 1);
  }
  return {x0, x1};
}

// Domains of the counter's high word, so that bits, split, fold_in, permutation and the
// per-element streams of rejection samplers drawn from one key never share a counter (bits
// uses high words below 2^31).
constexpr uint32_t kSplitDomain = 0xFFFFFFFFu;
constexpr uint32_t kFoldDomain = 0xFFFFFFFEu;
constexpr uint32_t kPermDomain = 0xFFFFFFFDu;
constexpr uint32_t kElementDomain = 0xFFFFFFFCu;

// Word i of the stream of `key`: counters (j, hi) give two words each.
inline uint32_t stream_word(Pair key, int64_t i) {
  const auto j = static_cast<uint64_t>(i) >> 1;
  const Pair r = threefry(key, {static_cast<uint32_t>(j), static_cast<uint32_t>(j >> 32)});
  return (i & 1) ? r.b : r.a;
}

// A double in (0, 1) from two words: 53 bits, offset by half a step so neither 0 nor 1 occurs
// (logs of it and of 1 - it are finite).
inline double open_unit(Pair words) {
  const uint64_t w = (static_cast<uint64_t>(words.a) << 32) | words.b;
  return (static_cast<double>(w >> 11) + 0.5) * 0x1p-53;
}
// Such a double from counter i of `key` (stream words 2i and 2i + 1).
inline double open_unit_at(Pair key, int64_t i) {
  const auto c = static_cast<uint64_t>(i);
  return open_unit(threefry(key, {static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32)}));
}

inline void expect_key(std::string_view op, const TensorType& k) {
  if (k.dtype != uint32 || k.shape.rank() < 1 || k.shape[k.shape.rank() - 1] != 2)
    fail(op, "invalid key: got ", k,
         ", expected a u32[2] key (or u32[..., 2] for a batch), "
         "from kiln::random::key or split");
}

inline Shape batch_of(const Shape& key) {
  return Shape(std::vector<int64_t>(key.begin(), key.end() - 1));
}
inline Shape concat(const Shape& a, const Shape& b) {
  std::vector<int64_t> d = a.dims();
  d.insert(d.end(), b.begin(), b.end());
  return Shape(d);
}

// Calls f(key, out_offset) for each key in a [..., 2] key tensor.
template <typename F>
void for_each_key(const Tensor& keys, int64_t per_key, F f) {
  const Tensor k = keys.contiguous();
  const uint32_t* p = k.data<const uint32_t>();
  const int64_t n = k.numel() / 2;
  for (int64_t i = 0; i < n; ++i) f(Pair{p[2 * i], p[2 * i + 1]}, i * per_key);
}

}  // namespace kiln::rng
