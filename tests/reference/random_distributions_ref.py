#!/usr/bin/python3
"""Reference values for tests/test_random_distributions.cpp, from scipy.stats.

For each distribution case, the deciles of its CDF (ppf at 0.1 .. 0.9; the test bins its
samples there and expects n/10 in each bin) and the chi-square threshold for 9 degrees of
freedom at p = 1e-6. Cases: gamma at several alphas, loggamma (log of a gamma variable) at a
tiny alpha, beta at (a, b) pairs, truncated normal at (lower, upper) pairs, and the marginals
of Dirichlet(1, 2, 3), which are Beta(alpha_i, sum - alpha_i).
"""
import math
import sys

import numpy as np
from scipy import stats

import reference_file

Q = np.arange(1, 10) / 10.0
out = {"chi2_9_isf_1e-6": np.array(stats.chi2.isf(1e-6, 9))}

for alpha in (0.1, 0.5, 1.0, 2.5, 10.0, 1e4):
    out[f"gamma/{alpha:g}"] = stats.gamma.ppf(Q, alpha)
for alpha in (1e-3, 1e-30):
    # log G for tiny alpha: P(G <= x) = x^alpha / Gamma(alpha + 1) (1 + O(x)), and x is below
    # 1e-40 at every decile, so the log-quantiles are (log q + lgamma(alpha + 1)) / alpha
    # (scipy's loggamma.ppf agrees where it is finite and underflows to -inf elsewhere).
    out[f"loggamma/{alpha:g}"] = (np.log(Q) + math.lgamma(1.0 + alpha)) / alpha
for a, b in ((0.5, 0.5), (2.0, 5.0), (0.1, 0.3)):
    out[f"beta/{a:g}_{b:g}"] = stats.beta.ppf(Q, a, b)
for lo, hi in ((-1.0, 2.0), (3.0, np.inf), (-np.inf, -5.0), (10.0, 10.5), (-0.5, 0.5)):
    out[f"truncnorm/{lo:g}_{hi:g}"] = stats.truncnorm.ppf(Q, lo, hi)
alpha = np.array([1.0, 2.0, 3.0])
for i in range(3):
    out[f"dirichlet/{i}"] = stats.beta.ppf(Q, alpha[i], alpha.sum() - alpha[i])

reference_file.write(sys.argv[1], {k: np.asarray(v, dtype=np.float64) for k, v in out.items()})
