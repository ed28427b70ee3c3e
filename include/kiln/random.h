// Counter-based, splittable random numbers (Threefry-2x32, as in JAX).
//
// A key is a uint32[2] tensor (or uint32[..., 2] for a batch of keys). The same key always
// gives the same numbers, whatever the thread count or machine. Never reuse a key for two
// draws: split it.
#pragma once

#include <optional>
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

// Standard exponential (rate 1), standard Laplace (density e^-|x| / 2) and standard Gumbel
// (CDF exp(-exp(-x))) samples, by inverting the CDF at a uniform computed in float32 (float64
// for float64; 16-bit dtypes round the float32 result). Always finite. Scale and shift them
// (`loc + scale * x`) for other parameters; they are differentiable in those.
Tensor exponential(const Tensor& key, const Shape& shape, DType dtype = float32,
                   Loc loc = Loc::current());
Tensor laplace(const Tensor& key, const Shape& shape, DType dtype = float32,
               Loc loc = Loc::current());
Tensor gumbel(const Tensor& key, const Shape& shape, DType dtype = float32,
              Loc loc = Loc::current());
// Poisson(lam) counts, int32 or int64: Knuth's method below lam = 10, Hoermann's transformed
// rejection (PTRS, as numpy and JAX) from 10. lam >= 0 and finite (lam = 0 gives zeros), and
// small enough that the counts fit the dtype (about 2.1e9 for int32).
Tensor poisson(const Tensor& key, double lam, const Shape& shape, DType dtype = int32,
               Loc loc = Loc::current());

// ---- distributions -----------------------------------------------------------------------
// Every sampler is deterministic in its key and keyed per element, so vmap over keys gives
// what a loop over the keys gives, and jit gives what eager gives. Derivatives: none with
// respect to the key; the distribution parameters (logits, alpha, p) get a ZERO gradient (the
// samplers are non-differentiable primitives; a reparameterised gamma gradient is not done).
// A batch of keys (u32[B..., 2]) puts the batch axes B... in front of the sample shape.

// Indices (int64) drawn from the categorical distributions with unnormalised log-probabilities
// `logits` along `axis` (Gumbel-max). The result has logits' shape without `axis`, or `shape`
// when given (logits without `axis` broadcast to it). A -inf logit is never drawn (a row of
// all -inf gives index 0); floating logits only.
Tensor categorical(const Tensor& key, const Tensor& logits, int64_t axis = -1,
                   Loc loc = Loc::current());
Tensor categorical(const Tensor& key, const Tensor& logits, int64_t axis, const Shape& shape,
                   Loc loc = Loc::current());
// Standard normal truncated to [lower, upper] (lower < upper; either may be infinite), by the
// inverse CDF in float64 on the side of zero where it is accurate. Intervals wholly beyond
// ~37 standard deviations, or holding under ~1e-12 of the mass below them, use the leading
// (exponentially tilted) approximation of the density there.
Tensor truncated_normal(const Tensor& key, double lower, double upper, const Shape& shape,
                        DType dtype = float32, Loc loc = Loc::current());
// Gamma(alpha, 1) of alpha's (floating) dtype: Marsaglia-Tsang, with alpha < 1 drawn as
// Gamma(alpha + 1) * U^(1/alpha). `shape` defaults to alpha's; alpha broadcasts to it.
// alpha <= 0 or NaN gives NaN; alpha = inf gives inf; tiny alpha underflows to 0 (use
// loggamma then).
Tensor gamma(const Tensor& key, const Tensor& alpha, Loc loc = Loc::current());
Tensor gamma(const Tensor& key, const Tensor& alpha, const Shape& shape, Loc loc = Loc::current());
// log of a Gamma(alpha, 1) sample, finite where gamma() underflows (alpha down to ~1e-300).
Tensor loggamma(const Tensor& key, const Tensor& alpha, Loc loc = Loc::current());
Tensor loggamma(const Tensor& key, const Tensor& alpha, const Shape& shape,
                Loc loc = Loc::current());
// Beta(a, b) through two log-gamma draws (exact for tiny a, b). `shape` defaults to the
// broadcast of a's and b's shapes.
Tensor beta(const Tensor& key, const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor beta(const Tensor& key, const Tensor& a, const Tensor& b, const Shape& shape,
            Loc loc = Loc::current());
// Dirichlet(alpha) with alpha [..., K]: result shape + [K] (shape defaults to alpha's batch
// shape), normalised log-gamma draws, so each row sums to 1.
Tensor dirichlet(const Tensor& key, const Tensor& alpha, Loc loc = Loc::current());
Tensor dirichlet(const Tensor& key, const Tensor& alpha, const Shape& shape,
                 Loc loc = Loc::current());
// Indices (int64) in [0, n) of the given shape, with or without replacement, uniformly or
// with probabilities proportional to the weights p (1-d, length n, non-negative). Without
// replacement, shape.numel() <= n (and <= the count of non-zero weights, checked when drawn):
// uniform draws take a prefix of a permutation, weighted ones the top of Gumbel-perturbed
// log-weights.
Tensor choice(const Tensor& key, int64_t n, const Shape& shape, bool replace = true,
              std::optional<Tensor> p = std::nullopt, Loc loc = Loc::current());
// Elements of `a` along axis 0 at such indices: result shape + a.shape[1:].
Tensor choice(const Tensor& key, const Tensor& a, const Shape& shape, bool replace = true,
              std::optional<Tensor> p = std::nullopt, Loc loc = Loc::current());

// ---- multivariate normal (src/ops/random_multivariate.cpp) ----
// Draws from N(mean, cov), mean [..., d], cov [..., d, d] symmetric positive definite:
// mean + L z with L = linalg::cholesky(cov) and z = normal(key, shape + [d]). shape defaults to
// the broadcast batch shape of mean and cov (to which it must otherwise broadcast); the result
// is shape + [d] in their promoted floating dtype. Differentiable in mean and cov
// (reparameterised). A cov that is not positive definite gives NaN samples (cholesky's rule).
Tensor multivariate_normal(const Tensor& key, const Tensor& mean, const Tensor& cov,
                           Loc loc = Loc::current());
Tensor multivariate_normal(const Tensor& key, const Tensor& mean, const Tensor& cov,
                           const Shape& shape, Loc loc = Loc::current());

}  // namespace kiln::random
