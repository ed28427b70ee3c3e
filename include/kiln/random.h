// Counter-based, splittable random numbers (Threefry-2x32, as in JAX).
//
// A key is a uint32[2] tensor (or uint32[..., 2] for a batch of keys). The same key always
// gives the same numbers, whatever the thread count or machine. Never reuse a key for two
// draws: split it.
#pragma once

#include <utility>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::random {

Tensor key(uint64_t seed);
// Two new keys from one.
std::pair<Tensor, Tensor> split(const Tensor& key, Loc loc = Loc::current());
// n new keys, stacked: uint32[n, 2].
Tensor split(const Tensor& key, int64_t n, Loc loc = Loc::current());
// A new key derived from key and data (e.g. a step number).
Tensor fold_in(const Tensor& key, uint32_t data, Loc loc = Loc::current());

// Raw uint32 bits.
Tensor bits(const Tensor& key, const Shape& shape, Loc loc = Loc::current());
// Uniform in [lo, hi).
Tensor uniform(const Tensor& key, const Shape& shape, DType dtype = float32, double lo = 0.0,
               double hi = 1.0, Loc loc = Loc::current());
// Standard normal (Box-Muller).
Tensor normal(const Tensor& key, const Shape& shape, DType dtype = float32,
              Loc loc = Loc::current());
// True with probability p.
Tensor bernoulli(const Tensor& key, double p, const Shape& shape, Loc loc = Loc::current());
// Integers uniform in [lo, hi).
Tensor randint(const Tensor& key, const Shape& shape, int64_t lo, int64_t hi, DType dtype = int32,
               Loc loc = Loc::current());
// A random permutation of 0..n-1 (int64).
Tensor permutation(const Tensor& key, int64_t n, Loc loc = Loc::current());

}  // namespace kiln::random
