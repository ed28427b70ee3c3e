"""kiln.linalg's compositions and factorisations beyond numpy.linalg's core set, against numpy,
scipy and PyTorch (float64)."""
import numpy as np
import pytest
import scipy.linalg
import torch

import kiln as kl

R = np.random.default_rng(7)
la = kl.linalg
INF = np.inf


def close(got, expected, tol=1e-9):
    assert isinstance(got, kl.Tensor), type(got)
    expected = np.asarray(expected)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=tol, atol=tol)


def test_multi_dot_matches_numpy_and_picks_the_cheapest_order():
    a, b, c, d = (R.standard_normal(s) for s in [(10, 100), (100, 5), (5, 50), (50, 3)])
    close(la.multi_dot([a, b, c, d]), np.linalg.multi_dot([a, b, c, d]))
    v, w = R.standard_normal(10), R.standard_normal(3)
    close(la.multi_dot([v, a, b, c, d, w]), np.linalg.multi_dot([v, a, b, c, d, w]))
    close(la.multi_dot([v, a, b]), np.linalg.multi_dot([v, a, b]))
    close(la.multi_dot([a, b, c, d, w]), np.linalg.multi_dot([a, b, c, d, w]))
    close(la.multi_dot([a, b]), a @ b)
    # (x y) z: 10*100*5 + 10*5*50 = 7500 multiplications; x (y z) needs 75000.
    text = kl.jit(lambda x, y, z: la.multi_dot([x, y, z])).lower(
        np.zeros((10, 100)), np.zeros((100, 5)), np.zeros((5, 50))
    )
    assert "matmul %arg0, %arg1 : f64[10,5]" in text, text
    # x (y z): 5*100*3 + 10*5*3 = 1650; (x y) z needs 10*5*100 + 10*100*3 = 8000.
    text = kl.jit(lambda x, y, z: la.multi_dot([x, y, z])).lower(
        np.zeros((10, 5)), np.zeros((5, 100)), np.zeros((100, 3))
    )
    assert "matmul %arg1, %arg2 : f64[5,3]" in text, text


def test_multi_dot_errors():
    with pytest.raises(kl.Error, match=r"\[multi_dot\] too few operands"):
        la.multi_dot([np.zeros((2, 2))])
    with pytest.raises(kl.Error, match=r"\[multi_dot\] shapes do not chain"):
        la.multi_dot([np.zeros((2, 3)), np.zeros((2, 3))])
    with pytest.raises(kl.Error, match=r"\[multi_dot\] operand 1 has the wrong rank"):
        la.multi_dot([np.zeros((2, 3)), np.zeros(3), np.zeros((3, 2))])


@pytest.mark.parametrize("ord_", [2, 1, INF, -INF, 0, 3, 0.5, -1])
def test_vector_norm_matches_torch(ord_):
    x = R.standard_normal((3, 4, 5))
    t = torch.from_numpy(x)
    close(la.vector_norm(x, ord=ord_), torch.linalg.vector_norm(t, ord=ord_).numpy())
    close(la.vector_norm(x, ord=ord_, axis=1), torch.linalg.vector_norm(t, ord=ord_, dim=1).numpy())
    close(
        la.vector_norm(x, ord=ord_, axis=(0, 2), keepdims=True),
        torch.linalg.vector_norm(t, ord=ord_, dim=(0, 2), keepdim=True).numpy(),
    )


@pytest.mark.parametrize("ord_", ["fro", "nuc", 1, -1, 2, -2, INF, -INF])
def test_matrix_norm_matches_torch(ord_):
    x = R.standard_normal((2, 4, 3))
    t = torch.from_numpy(x)
    close(la.matrix_norm(x, ord=ord_), torch.linalg.matrix_norm(t, ord=ord_).numpy())
    close(
        la.matrix_norm(x, ord=ord_, axis=(0, 2), keepdims=True),
        torch.linalg.matrix_norm(t, ord=ord_, dim=(0, 2), keepdim=True).numpy(),
    )


def test_norm_errors_name_the_function():
    with pytest.raises(kl.Error, match=r"\[vector_norm\] invalid ord for a vector norm"):
        la.vector_norm(np.zeros(3), ord="fro")
    with pytest.raises(kl.Error, match=r"\[vector_norm\] duplicate axis"):
        la.vector_norm(np.zeros((2, 3)), axis=(1, -1))
    with pytest.raises(kl.Error, match=r"\[matrix_norm\] invalid ord for a matrix norm"):
        la.matrix_norm(np.zeros((2, 3)), ord=3)
    with pytest.raises(kl.Error, match=r"\[matrix_norm\] not matrices"):
        la.matrix_norm(np.zeros(3))


@pytest.mark.parametrize("p", [None, 2, -2, 1, -1, INF, -INF, "fro", "nuc"])
def test_cond_matches_numpy(p):
    a = R.standard_normal((3, 4, 4))
    close(la.cond(a, p), np.linalg.cond(a, p), tol=1e-8)


@pytest.mark.parametrize("p", [1, -1, INF, -INF, "fro", "nuc"])
def test_cond_of_singular_matrices_is_inf_as_numpys(p):
    # Singular, with a NaN (numpy keeps its NaN), and regular.
    a = np.stack([[[1.0, 2.0], [2.0, 4.0]], [[np.nan, 1.0], [0.0, 1.0]], [[2.0, 1.0], [0.0, 1.0]]])
    if p == "nuc":  # numpy's svd raises on the NaNs: the singular one is inf analytically
        expected = [INF, np.nan, np.linalg.cond(a[2], p)]
    else:
        expected = np.linalg.cond(a, p)
    close(la.cond(a, p), expected)


def test_cond_of_rectangular_matrices_and_errors():
    a = R.standard_normal((5, 3))
    close(la.cond(a), np.linalg.cond(a))
    close(la.cond(a, -2), np.linalg.cond(a, -2))
    with pytest.raises(kl.Error, match=r"\[cond\] not square matrices"):
        la.cond(a, 1)


def test_matrix_rank_matches_numpy():
    u = R.standard_normal((4, 6, 2))
    low = u @ R.standard_normal((4, 2, 5))  # rank 2
    full = R.standard_normal((4, 6, 5))
    for a in (low, full, np.zeros((3, 3))):
        got = la.matrix_rank(a)
        assert got.dtype == kl.int64
        np.testing.assert_array_equal(np.asarray(got), np.linalg.matrix_rank(a))
    s = np.linalg.svd(full, compute_uv=False)
    tol = float(np.median(s))
    np.testing.assert_array_equal(
        np.asarray(la.matrix_rank(full, tol)), np.linalg.matrix_rank(full, tol)
    )
    # rtol: relative to the largest singular value (numpy 2's argument).
    np.testing.assert_array_equal(
        np.asarray(la.matrix_rank(full, rtol=0.5)), np.sum(s > 0.5 * s[..., :1], axis=-1)
    )
    close(la.matrix_rank(np.eye(3, dtype=np.float32) * 1e-8), np.array(3))
    with pytest.raises(kl.Error, match=r"\[matrix_rank\] both tol and rtol given"):
        la.matrix_rank(full, 1.0, rtol=0.1)


@pytest.mark.parametrize("lower", [True, False])
def test_cho_solve_matches_scipy(lower):
    m = R.standard_normal((3, 4, 4))
    a = m @ m.transpose(0, 2, 1) + 4 * np.eye(4)
    b = R.standard_normal((3, 4, 2))
    for i in range(3):
        c = scipy.linalg.cho_factor(a[i], lower=lower)
        factor = np.tril(c[0]) if lower else np.triu(c[0])
        close(la.cho_solve((factor, lower), b[i]), scipy.linalg.cho_solve(c, b[i]))
        close(la.cho_solve((factor, lower), b[i, :, 0]), scipy.linalg.cho_solve(c, b[i, :, 0]))
    close(la.cho_solve(la.cholesky(a), b), np.linalg.solve(a, b))
    close(la.cho_solve((la.cholesky(a), 1), b), np.linalg.solve(a, b))


def test_eigvalsh_matches_numpy():
    m = R.standard_normal((3, 5, 5))
    a = m + m.transpose(0, 2, 1)
    close(la.eigvalsh(a), np.linalg.eigvalsh(a))


def test_lu_factor_and_lu_match_scipy():
    a = R.standard_normal((3, 5, 5))
    for i in range(3):
        lu, piv = la.lu_factor(a[i])
        elu, epiv = scipy.linalg.lu_factor(a[i])
        close(lu, elu)
        assert piv.dtype == kl.int32
        np.testing.assert_array_equal(np.asarray(piv), epiv)
        p, l, u = la.lu(a[i])
        for got, expected in zip((p, l, u), scipy.linalg.lu(a[i])):
            close(got, expected)
    # Batched: each matrix as alone.
    lu, piv = la.lu_factor(a)
    close(lu, np.stack([scipy.linalg.lu_factor(m)[0] for m in a]))
    p, l, u = la.lu(a)
    close(kl.matmul(p, kl.matmul(l, u)), a)
    # Singular: factored all the same, a zero on U's diagonal.
    s = np.array([[1.0, 2.0], [2.0, 4.0]])
    with np.errstate(all="ignore"), pytest.warns(scipy.linalg.LinAlgWarning):
        elu, epiv = scipy.linalg.lu_factor(s)
    close(la.lu_factor(s)[0], elu)


@pytest.mark.parametrize("trans", [0, 1, 2])
def test_lu_solve_matches_scipy(trans):
    a = R.standard_normal((4, 4))
    b = R.standard_normal((4, 3))
    f = la.lu_factor(a)
    ef = scipy.linalg.lu_factor(a)
    close(la.lu_solve(f, b, trans=trans), scipy.linalg.lu_solve(ef, b, trans=trans))
    close(la.lu_solve(f, b[:, 0], trans=trans), scipy.linalg.lu_solve(ef, b[:, 0], trans=trans))
    # A batch of factors against one right-hand side.
    batch = R.standard_normal((2, 4, 4))
    expected = np.linalg.solve(
        batch if trans == 0 else batch.transpose(0, 2, 1), np.broadcast_to(b, (2, 4, 3))
    )
    close(la.lu_solve(la.lu_factor(batch), b, trans=trans), expected)


def test_lu_errors():
    with pytest.raises(kl.Error, match=r"\[lu_factor\] not square matrices"):
        la.lu_factor(np.zeros((2, 3)))
    lu, piv = la.lu_factor(np.eye(3))
    with pytest.raises(kl.Error, match=r"\[lu_solve\] shapes do not match"):
        la.lu_solve((lu, piv), np.zeros(2))
    with pytest.raises(kl.Error, match=r"\[lu_solve\] pivots do not match the factor"):
        la.lu_solve((lu, kl.zeros((2,), dtype=kl.int32)), np.zeros(3))
    with pytest.raises(kl.Error, match=r"\[lu_solve\] unknown trans"):
        la.lu_solve((lu, piv), np.zeros(3), trans=3)
    with pytest.raises(kl.Error, match=r"\[lu_pivots_to_permutation\] pivot out of range"):
        la.lu_solve((lu, kl.full((3,), 5, dtype=kl.int32)), np.zeros(3))


@pytest.mark.parametrize("scale", [0.01, 1.0, 30.0, 1e4])
def test_expm_matches_scipy(scale):
    a = R.standard_normal((3, 4, 4)) * scale / 4
    got = la.expm(a)
    expected = np.stack([scipy.linalg.expm(m) for m in a])
    np.testing.assert_allclose(
        np.asarray(got),
        expected,
        rtol=1e-9 if scale < 100 else 1e-6,
        atol=1e-12 * np.abs(expected).max(),
    )
    f = la.expm(a.astype(np.float32))
    assert f.dtype == kl.float32


def test_expm_special_matrices():
    close(la.expm(np.zeros((3, 3))), np.eye(3))
    d = np.diag([1.0, -2.0, 0.5])
    close(la.expm(d), np.diag(np.exp([1.0, -2.0, 0.5])))
    close(la.expm(-1e3 * np.eye(2)), np.zeros((2, 2)))
    nilpotent = np.array([[0.0, 1.0], [0.0, 0.0]])
    close(la.expm(nilpotent), np.eye(2) + nilpotent)
    assert np.isnan(np.asarray(la.expm(np.full((2, 2), np.nan)))).all()
    assert la.expm(np.zeros((2, 0, 0))).shape == (2, 0, 0)
    with pytest.raises(kl.Error, match=r"\[expm\] not square matrices"):
        la.expm(np.zeros((2, 3)))
