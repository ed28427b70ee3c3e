// The body of vector_loops.h's loops, instantiated by each vector_loops_<isa>.cpp for its
// vector types. Nothing here may have external linkage beyond the loops themselves (an inline
// function compiled for a wider set could be picked by the linker for baseline code).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "math/vector_loops.h"

#define KILN_VECTOR_LOOPS(suffix, T, V, W, load, store)                      \
  void unary_##suffix(AnyFn f, const T* in, T* out, int64_t n) {             \
    const auto fn = reinterpret_cast<V (*)(V)>(f);                           \
    int64_t i = 0;                                                           \
    for (; i + W <= n; i += W) store(out + i, fn(load(in + i)));             \
    if (i == n) return;                                                      \
    alignas(64) T x[W] = {};                                                 \
    for (int64_t k = i; k < n; ++k) x[k - i] = in[k];                        \
    store(x, fn(load(x)));                                                   \
    for (int64_t k = i; k < n; ++k) out[k] = x[k - i];                       \
  }                                                                          \
  void binary_##suffix(AnyFn f, const T* a, const T* b, T* out, int64_t n) { \
    const auto fn = reinterpret_cast<V (*)(V, V)>(f);                        \
    int64_t i = 0;                                                           \
    for (; i + W <= n; i += W) store(out + i, fn(load(a + i), load(b + i))); \
    if (i == n) return;                                                      \
    alignas(64) T x[W] = {}, y[W] = {};                                      \
    for (int64_t k = i; k < n; ++k) {                                        \
      x[k - i] = a[k];                                                       \
      y[k - i] = b[k];                                                       \
    }                                                                        \
    store(x, fn(load(x), load(y)));                                          \
    for (int64_t k = i; k < n; ++k) out[k] = x[k - i];                       \
  }
