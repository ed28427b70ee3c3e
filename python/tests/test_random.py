"""kiln.random from Python: JAX's signatures, determinism, splitting, and the distributions'
moments and supports checked against their analytic values."""
import math

import numpy as np
import pytest

import kiln as kl
from kiln import random as kr

N = 200_000


def moments(t):
    a = np.asarray(t).astype(np.float64)
    return a.mean(), a.std()


def test_keys_split_and_fold_in():
    key = kr.key(0)
    assert key.shape == (2,) and key.dtype == kl.uint32
    assert kr.PRNGKey(0).tolist() == key.tolist()
    k1, k2 = kr.split(key)
    assert k1.shape == (2,) and k1.tolist() != k2.tolist()
    keys = kr.split(key, 3)
    assert keys.shape == (3, 2)
    a, b, c = kr.split(key, num=3)
    assert len({tuple(k.tolist()) for k in (a, b, c)}) == 3
    assert kr.fold_in(key, 7).tolist() == kr.fold_in(key, 7).tolist()
    assert kr.fold_in(key, 7).tolist() != kr.fold_in(key, 8).tolist()
    # The same key gives the same numbers; different keys different ones.
    assert kr.normal(k1, (4,)).tolist() == kr.normal(k1, (4,)).tolist()
    assert kr.normal(k1, (4,)).tolist() != kr.normal(k2, (4,)).tolist()
    assert kr.bits(key, (3,)).dtype == kl.uint32


@pytest.mark.parametrize("dtype", [kl.float32, kl.float64, kl.float16])
def test_uniform_and_normal(dtype):
    key = kr.key(1)
    u = kr.uniform(key, (N,), dtype=dtype, minval=-2.0, maxval=3.0)
    assert u.dtype == dtype and u.shape == (N,)
    a = np.asarray(u).astype(np.float64)
    assert a.min() >= -2.0 and a.max() < 3.0 + 1e-3
    mean, std = moments(u)
    assert abs(mean - 0.5) < 0.02 and abs(std - 5 / math.sqrt(12)) < 0.02
    n = kr.normal(key, shape=(N,), dtype=dtype)
    mean, std = moments(n)
    assert abs(mean) < 0.01 and abs(std - 1) < 0.01
    assert kr.normal(key).shape == () and kr.normal(key).dtype == kl.float32
    assert kr.normal(key, 3).shape == (3,)


def test_discrete_distributions():
    key = kr.key(2)
    b = kr.bernoulli(key, 0.3, (N,))
    assert b.dtype == kl.bool_ and abs(np.asarray(b).mean() - 0.3) < 0.01
    p = np.array([0.1, 0.9], np.float32)
    bp = np.asarray(kr.bernoulli(key, p, (N, 2)))
    np.testing.assert_allclose(bp.mean(axis=0), p, atol=0.01)
    assert kr.bernoulli(key, p).shape == (2,)
    r = kr.randint(key, (N,), 3, 9)
    a = np.asarray(r)
    assert r.dtype == kl.int32 and a.min() == 3 and a.max() == 8
    np.testing.assert_allclose(np.bincount(a - 3) / N, np.full(6, 1 / 6), atol=0.01)
    assert kr.randint(key, (2,), 0, 5, dtype=kl.int64).dtype == kl.int64
    perm = np.asarray(kr.permutation(key, 10))
    assert sorted(perm.tolist()) == list(range(10))
    x = np.arange(12).reshape(4, 3)
    shuffled = np.asarray(kr.permutation(key, x))
    assert sorted(map(tuple, shuffled.tolist())) == sorted(map(tuple, x.tolist()))
    cols = np.asarray(kr.permutation(key, x, axis=1))
    assert sorted(cols[0].tolist()) == [0, 1, 2]


def test_categorical_and_choice():
    key = kr.key(3)
    probs = np.array([0.2, 0.5, 0.3])
    draws = np.asarray(kr.categorical(key, np.log(probs), shape=(N,)))
    np.testing.assert_allclose(np.bincount(draws, minlength=3) / N, probs, atol=0.01)
    logits = np.log(np.array([[0.9, 0.1], [0.1, 0.9]]))
    assert kr.categorical(key, logits).shape == (2,)
    assert kr.categorical(key, logits, axis=0).shape == (2,)
    c = np.asarray(kr.choice(key, 5, (N,)))
    np.testing.assert_allclose(np.bincount(c) / N, np.full(5, 0.2), atol=0.01)
    w = np.asarray(kr.choice(key, 3, (N,), p=probs))
    np.testing.assert_allclose(np.bincount(w, minlength=3) / N, probs, atol=0.01)
    no = np.asarray(kr.choice(key, 10, (10,), replace=False))
    assert sorted(no.tolist()) == list(range(10))
    a = np.arange(12.0).reshape(3, 4)
    rows = np.asarray(kr.choice(key, a, (2,), replace=False))
    assert rows.shape == (2, 4) and all(r.tolist() in a.tolist() for r in rows)
    picked = np.asarray(kr.choice(key, a, (5, 2), axis=1))
    assert picked.shape == (3, 5, 2)
    assert set(picked[0].ravel().tolist()) <= set(a[0].tolist())


def test_continuous_distributions():
    key = kr.key(4)
    t = np.asarray(kr.truncated_normal(key, -1.0, 2.0, (N,)))
    assert t.min() >= -1.0 and t.max() <= 2.0
    # Mean of N(0, 1) truncated to [a, b]: (phi(a) - phi(b)) / (Phi(b) - Phi(a)).
    phi = lambda v: math.exp(-v * v / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    Phi = lambda v: 0.5 * (1 + math.erf(v / math.sqrt(2)))  # noqa: E731
    assert abs(t.mean() - (phi(-1) - phi(2)) / (Phi(2) - Phi(-1))) < 0.01
    g = kr.gamma(key, 3.0, (N,))
    assert g.dtype == kl.float32
    mean, std = moments(g)
    assert abs(mean - 3) < 0.03 and abs(std - math.sqrt(3)) < 0.03
    g2 = kr.gamma(key, np.array([0.5, 2.0]), dtype=kl.float64)
    assert g2.shape == (2,) and g2.dtype == kl.float64
    lg = np.asarray(kr.loggamma(key, 2.0, (N,)))
    assert abs(np.exp(lg).mean() - 2) < 0.03
    bt = kr.beta(key, 2.0, 5.0, (N,))
    mean, _ = moments(bt)
    assert abs(mean - 2 / 7) < 0.005
    d = np.asarray(kr.dirichlet(key, np.array([1.0, 2.0, 3.0]), (N,)))
    assert d.shape == (N, 3)
    np.testing.assert_allclose(d.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(d.mean(axis=0), [1 / 6, 2 / 6, 3 / 6], atol=0.01)
    # Python numbers are parameters as floats; integer tensors and arrays raise, as for
    # categorical's logits.
    assert kr.gamma(key, 2, (3,)).dtype == kl.float32
    assert kr.beta(key, 2, 5, (3,)).dtype == kl.float32
    for call in (
        lambda: kr.gamma(key, np.array([1, 2])),
        lambda: kr.gamma(key, kl.asarray([1, 2])),
        lambda: kr.loggamma(key, np.array([1, 2])),
        lambda: kr.beta(key, np.array([2]), 5.0),
        lambda: kr.dirichlet(key, np.array([1, 2, 3])),
        lambda: kr.categorical(key, np.array([1, 2])),
    ):
        with pytest.raises(kl.Error, match="expected a floating dtype"):
            call()
    cov = np.array([[2.0, 0.6], [0.6, 1.0]])
    mv = np.asarray(kr.multivariate_normal(key, np.array([1.0, -1.0]), cov, (N,)))
    np.testing.assert_allclose(mv.mean(axis=0), [1.0, -1.0], atol=0.02)
    np.testing.assert_allclose(np.cov(mv.T), cov, atol=0.03)


def test_errors():
    with pytest.raises(kl.Error, match=r"\[randint\].*got.*expected"):
        kr.randint(kr.key(0), (2,), 5, 5)


def test_exponential_laplace_gumbel_poisson():
    key = kr.key(11)
    # Mean and standard deviation of the standard distributions: exponential (1, 1),
    # Laplace (0, sqrt 2), Gumbel (Euler's gamma, pi / sqrt 6).
    cases = (
        (kr.exponential, 1.0, 1.0),
        (kr.laplace, 0.0, math.sqrt(2)),
        (kr.gumbel, 0.5772156649015329, math.pi / math.sqrt(6)),
    )
    for fn, mean, std in cases:
        for dtype in (kl.float32, kl.float64):
            s = fn(key, (N,), dtype=dtype)
            assert s.dtype == dtype and s.shape == (N,)
            assert np.isfinite(np.asarray(s)).all()
            m, sd = moments(s)
            assert abs(m - mean) < 0.03 and abs(sd - std) < 0.03, (fn, m, sd)
        np.testing.assert_array_equal(np.asarray(fn(key, (5,))), np.asarray(fn(key, (5,))))
        assert fn(key, (4,), dtype=kl.bfloat16).dtype == kl.bfloat16
    assert np.asarray(kr.exponential(key, (N,))).min() >= 0
    for lam in (0.0, 0.3, 4.0, 10.0, 37.5, 1e5):
        p = kr.poisson(key, lam, (N,))
        assert p.dtype == kl.int32
        v = np.asarray(p).astype(np.float64)
        assert v.min() >= 0
        # The mean is within 4 standard errors; the variance equals the mean.
        assert abs(v.mean() - lam) <= 4 * math.sqrt(lam / N) + 1e-12, (lam, v.mean())
        assert abs(v.var() - lam) <= 0.05 * lam + 1e-12, (lam, v.var())
    # Frequencies against the pmf, on both sides of the switch of methods at lam = 10.
    from scipy import stats

    for lam in (4.0, 37.5):
        v = np.asarray(kr.poisson(key, lam, (N,)))
        ks = np.arange(int(lam + 4 * math.sqrt(lam)))
        pmf = stats.poisson.pmf(ks, lam)
        freq = np.array([(v == k).mean() for k in ks])
        assert np.all(np.abs(freq - pmf) <= 5 * np.sqrt(pmf / N) + 1e-4), lam
    assert kr.poisson(key, 3.0, (2, 3), dtype=kl.int64).dtype == kl.int64
    keys = kr.split(key, 3)
    np.testing.assert_array_equal(
        np.asarray(kl.vmap(lambda k: kr.poisson(k, 12.0, (4,)))(keys)),
        np.stack([np.asarray(kr.poisson(keys[i], 12.0, (4,))) for i in range(3)]),
    )
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(kl.Error, match=r"\[random_poisson\] rate out of range"):
            kr.poisson(key, bad, (2,))
    with pytest.raises(kl.Error, match=r"expected int32 or int64"):
        kr.poisson(key, 1.0, (2,), dtype=kl.float32)
