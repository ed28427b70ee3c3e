"""Every operation on kiln's top level and in kiln.linalg, against numpy (or PyTorch, in float64,
where numpy has no such function), with Python keyword arguments."""
import inspect

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln as kl

R = np.random.default_rng(1)


def close(got, expected, tol=1e-5, dtype=None):
    assert isinstance(got, kl.Tensor), type(got)
    expected = np.asarray(expected)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    if dtype is not None:
        assert got.dtype == dtype
    g = np.asarray(got)
    if expected.dtype == np.bool_ or np.issubdtype(expected.dtype, np.integer):
        np.testing.assert_array_equal(g, expected)
    else:
        np.testing.assert_allclose(
            g.astype(np.float64), expected.astype(np.float64), rtol=tol, atol=tol, equal_nan=True
        )


def torch64(fn, x):
    return fn(torch.from_numpy(np.asarray(x, np.float64))).numpy()


# name, reference, domain (low, high)
UNARY = [
    ("negative", np.negative, (-3, 3)),
    ("neg", np.negative, (-3, 3)),
    ("abs", np.abs, (-3, 3)),
    ("absolute", np.abs, (-3, 3)),
    ("sign", np.sign, (-3, 3)),
    ("exp", np.exp, (-3, 3)),
    ("log", np.log, (0.1, 5)),
    ("log1p", np.log1p, (-0.5, 3)),
    ("expm1", np.expm1, (-1, 1)),
    ("sqrt", np.sqrt, (0, 5)),
    ("rsqrt", lambda x: 1 / np.sqrt(x), (0.1, 5)),
    ("sin", np.sin, (-3, 3)),
    ("cos", np.cos, (-3, 3)),
    ("tan", np.tan, (-1, 1)),
    ("tanh", np.tanh, (-3, 3)),
    ("sigmoid", lambda x: 1 / (1 + np.exp(-x)), (-5, 5)),
    ("erf", lambda x: torch64(torch.special.erf, x), (-2, 2)),
    ("floor", np.floor, (-3, 3)),
    ("ceil", np.ceil, (-3, 3)),
    ("square", np.square, (-3, 3)),
    ("trunc", np.trunc, (-3, 3)),
    ("log2", np.log2, (0.1, 5)),
    ("log10", np.log10, (0.1, 5)),
    ("exp2", np.exp2, (-3, 3)),
    ("sinh", np.sinh, (-2, 2)),
    ("cosh", np.cosh, (-2, 2)),
    ("arcsin", np.arcsin, (-0.9, 0.9)),
    ("asin", np.arcsin, (-0.9, 0.9)),
    ("arccos", np.arccos, (-0.9, 0.9)),
    ("arctan", np.arctan, (-3, 3)),
    ("arcsinh", np.arcsinh, (-3, 3)),
    ("arccosh", np.arccosh, (1.1, 4)),
    ("arctanh", np.arctanh, (-0.9, 0.9)),
    ("erfinv", lambda x: torch64(torch.special.erfinv, x), (-0.9, 0.9)),
    ("lgamma", lambda x: torch64(torch.lgamma, x), (0.1, 5)),
    ("gammaln", lambda x: torch64(torch.lgamma, x), (0.1, 5)),
    ("digamma", lambda x: torch64(torch.digamma, x), (0.5, 5)),
    ("softplus", lambda x: np.logaddexp(0, x), (-5, 5)),
    ("log_sigmoid", lambda x: -np.logaddexp(0, -x), (-5, 5)),
    ("stop_gradient", lambda x: x, (-3, 3)),
    ("ravel", np.ravel, (-3, 3)),
    ("flatten", np.ravel, (-3, 3)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,ref,domain", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name, ref, domain, dtype):
    x = R.uniform(*domain, (3, 4)).astype(dtype)
    got = getattr(kl, name)(x)
    close(got, ref(x.astype(np.float64)), tol=2e-5 if dtype == np.float32 else 1e-10)
    assert got.dtype == (kl.float32 if dtype == np.float32 else kl.float64)
    close(getattr(kl, name)(x=kl.asarray(x)), ref(x.astype(np.float64)), tol=2e-5)


def test_unary_on_integers_and_bools():
    i = np.array([-2, 0, 3], np.int32)
    close(kl.abs(i), np.abs(i), dtype=kl.int32)
    close(kl.sqrt(np.array([1, 4, 9], np.int32)), [1.0, 2.0, 3.0], dtype=kl.float32)
    b = np.array([True, False])
    close(kl.logical_not(b), ~b)
    close(kl.bitwise_not(i), ~i)
    close(kl.invert(b), ~b)
    f = np.array([1.0, np.nan, np.inf, -np.inf], np.float32)
    close(kl.isnan(f), np.isnan(f))
    close(kl.isinf(f), np.isinf(f))
    close(kl.isfinite(f), np.isfinite(f))
    close(kl.nan_to_num(f), np.nan_to_num(f))
    close(
        kl.nan_to_num(f, nan=-1.0, posinf=9.0, neginf=-9.0),
        np.nan_to_num(f, nan=-1.0, posinf=9.0, neginf=-9.0),
    )
    v = np.array([0.5, 2.0])
    close(kl.polygamma(2, v), torch.polygamma(2, torch.from_numpy(v)).numpy())


BINARY = [
    ("add", np.add),
    ("subtract", np.subtract),
    ("sub", np.subtract),
    ("multiply", np.multiply),
    ("mul", np.multiply),
    ("divide", np.divide),
    ("true_divide", np.true_divide),
    ("floor_divide", np.floor_divide),
    ("remainder", np.remainder),
    ("mod", np.mod),
    ("fmod", np.fmod),
    ("power", np.power),
    ("pow", np.power),
    ("maximum", np.maximum),
    ("minimum", np.minimum),
    ("equal", np.equal),
    ("not_equal", np.not_equal),
    ("less", np.less),
    ("less_equal", np.less_equal),
    ("greater", np.greater),
    ("greater_equal", np.greater_equal),
    ("arctan2", np.arctan2),
    ("atan2", np.arctan2),
    ("hypot", np.hypot),
    ("copysign", np.copysign),
    ("logaddexp", np.logaddexp),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("name,ref", BINARY, ids=[b[0] for b in BINARY])
def test_binary(name, ref, dtype):
    integer = np.issubdtype(dtype, np.integer)
    if integer and name in ("arctan2", "atan2", "hypot", "copysign", "logaddexp"):
        dtype = np.float32
    lo = 1 if integer else 0.5
    x = R.uniform(-4, 4, (2, 3, 4)) if not integer else R.integers(-6, 7, (2, 3, 4))
    y = (
        R.uniform(lo, 3, (3, 1)) * R.choice([-1, 1], (3, 1))
        if not integer
        else R.integers(1, 4, (3, 1)) * R.choice([-1, 1], (3, 1))
    )
    if name in ("power", "pow"):
        x, y = np.abs(x) + lo, np.abs(y) % 3
    x, y = x.astype(dtype), y.astype(dtype)
    expected = ref(x, y)
    if name in ("divide", "true_divide") and integer:
        expected = expected.astype(np.float32)
    fn = getattr(kl, name)
    close(fn(x, y), expected, tol=1e-5)
    close(fn(kl.asarray(x), y=kl.asarray(y)), expected, tol=1e-5)


@pytest.mark.parametrize(
    "name,ref",
    [
        ("logical_and", np.logical_and),
        ("logical_or", np.logical_or),
        ("logical_xor", np.logical_xor),
        ("bitwise_and", np.bitwise_and),
        ("bitwise_or", np.bitwise_or),
        ("bitwise_xor", np.bitwise_xor),
    ],
)
def test_logical_and_bitwise(name, ref):
    a, b = R.integers(0, 2, (4, 5)).astype(bool), R.integers(0, 2, (5,)).astype(bool)
    close(getattr(kl, name)(a, b), ref(a, b))
    if name.startswith("bitwise"):
        i, j = R.integers(-50, 50, (4, 5)).astype(np.int32), R.integers(0, 50, 5).astype(np.int32)
        close(getattr(kl, name)(i, j), ref(i, j))


def test_shifts_and_products():
    a, s = np.array([1, -8, 100], np.int32), np.array([1, 2, 3], np.int32)
    close(kl.left_shift(a, s), np.left_shift(a, s))
    close(kl.right_shift(a, s), np.right_shift(a, s))
    x, y = R.standard_normal((2, 3, 4)), R.standard_normal((4, 5))
    close(kl.matmul(x, y), x @ y, tol=1e-10)
    v4 = R.standard_normal(4)
    close(kl.matmul(v4, y), v4 @ y, tol=1e-10)
    v = R.standard_normal(3)
    close(kl.outer(v, x[0, 0]), np.outer(v, x[0, 0]), tol=1e-10)
    close(kl.kron(x[0, :2, :2], y[:2, :3]), np.kron(x[0, :2, :2], y[:2, :3]), tol=1e-10)
    close(kl.einsum("bij,jk->bik", x, y), np.einsum("bij,jk->bik", x, y), tol=1e-10)
    close(kl.einsum("ii->i", y[:4, :4]), np.einsum("ii->i", y[:4, :4]), tol=1e-10)
    close(kl.einsum("...j,jk", x, y), np.einsum("...j,jk", x, y), tol=1e-10)
    close(kl.tensordot(x, y, axes=1), np.tensordot(x, y, axes=1), tol=1e-10)
    close(
        kl.tensordot(x, x, axes=([0, 2], [0, 2])),
        np.tensordot(x, x, axes=([0, 2], [0, 2])),
        tol=1e-10,
    )


def test_weak_scalars_in_functions():
    h = np.array([1.0, 2.0], np.float16)
    assert kl.add(h, 1.0).dtype == kl.float16
    assert kl.multiply(3, np.array([1, 2], np.uint8)).dtype == kl.uint8
    assert kl.maximum(np.array([1, 5], np.int32), 2).dtype == kl.int32
    assert kl.add(1, 2.5).dtype == kl.float32
    close(kl.where(np.array([True, False]), h, 0.0), np.array([1.0, 0.0]), dtype=kl.float16)
    assert kl.add(np.array([1.0], np.float32), np.array([1.0], np.float64)).dtype == kl.float64


AXES = [None, 0, -1, (0, 2), (), (1,)]


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=[repr(a) for a in AXES])
@pytest.mark.parametrize(
    "name,ref",
    [
        ("sum", np.sum),
        ("mean", np.mean),
        ("prod", np.prod),
        ("max", np.max),
        ("min", np.min),
        ("amax", np.amax),
        ("amin", np.amin),
        ("any", np.any),
        ("all", np.all),
        ("var", np.var),
        ("std", np.std),
    ],
)
def test_reductions(name, ref, axis, keepdims):
    x = R.uniform(0.5, 1.5, (2, 3, 4))
    if name in ("any", "all"):
        x = x > 1.0
    close(
        getattr(kl, name)(x, axis=axis, keepdims=keepdims),
        ref(x, axis=axis, keepdims=keepdims),
        tol=1e-10,
    )


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.bool_])
def test_reduction_dtypes(dtype):
    x = R.integers(0, 3, (3, 4)).astype(dtype)
    got = kl.sum(x, axis=0)
    expected = np.sum(x, axis=0)
    np.testing.assert_array_equal(np.asarray(got), expected)
    close(kl.mean(x, axis=1), np.mean(x, axis=1), tol=1e-6)
    close(kl.max(x, axis=1, keepdims=True), np.max(x, axis=1, keepdims=True))


def test_other_reductions():
    x = R.standard_normal((3, 4, 5))
    close(kl.var(x, axis=1, ddof=1), np.var(x, axis=1, ddof=1), tol=1e-10)
    close(kl.std(x, ddof=1), np.std(x, ddof=1), tol=1e-10)
    close(kl.logsumexp(x, axis=(0, 1)), np.log(np.sum(np.exp(x), axis=(0, 1))), tol=1e-10)
    for name, ref in (("argmax", np.argmax), ("argmin", np.argmin)):
        close(getattr(kl, name)(x), ref(x))
        close(getattr(kl, name)(x, axis=1), ref(x, axis=1))
        close(getattr(kl, name)(x, axis=-1, keepdims=True), ref(x, axis=-1, keepdims=True))
    close(kl.cumsum(x, axis=1), np.cumsum(x, axis=1), tol=1e-10)
    close(kl.cumsum(x), np.cumsum(x), tol=1e-10)
    close(kl.cumprod(x, axis=0), np.cumprod(x, axis=0), tol=1e-10)
    close(kl.cummax(x, axis=2), np.maximum.accumulate(x, axis=2))
    close(kl.cummin(x, axis=2), np.minimum.accumulate(x, axis=2))
    close(kl.cumlogsumexp(x, axis=1), np.logaddexp.accumulate(x, axis=1), tol=1e-10)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    close(kl.softmax(x, axis=1), e / e.sum(axis=1, keepdims=True), tol=1e-10)
    close(kl.log_softmax(x), torch64(lambda t: torch.log_softmax(t, -1), x), tol=1e-10)
    close(kl.quantile(x, 0.3, axis=1), np.quantile(x, 0.3, axis=1), tol=1e-10)
    close(kl.quantile(x, 0.7), np.quantile(x, 0.7), tol=1e-10)
    close(kl.median(x, axis=2, keepdims=True), np.median(x, axis=2, keepdims=True), tol=1e-10)
    close(kl.sort(x, axis=1), np.sort(x, axis=1))
    close(kl.sort(x, descending=True), -np.sort(-x, axis=-1))
    ties = np.array([3, 1, 2, 1, 3, 0], np.int32)
    close(kl.argsort(ties), np.argsort(ties, kind="stable"))
    values, indices = kl.top_k(x, 2)
    tv, ti = torch.topk(torch.from_numpy(x), 2)
    close(values, tv.numpy())
    close(indices, ti.numpy())
    s, v = np.array([1.0, 2.0, 2.0, 5.0]), np.array([[2.0, 0.0], [6.0, 1.0]])
    close(kl.searchsorted(s, v), np.searchsorted(s, v))
    close(kl.searchsorted(s, v, side="right"), np.searchsorted(s, v, side="right"))


def test_creation():
    close(kl.zeros(3), np.zeros(3, np.float32), dtype=kl.float32)
    close(kl.zeros((2, 3), dtype=kl.int32), np.zeros((2, 3), np.int32), dtype=kl.int32)
    close(kl.ones((2, 1), dtype=np.float64), np.ones((2, 1)), dtype=kl.float64)
    assert kl.empty((4, 0), dtype="int64").shape == (4, 0)
    close(kl.full((2, 2), 7), np.full((2, 2), 7, np.int32), dtype=kl.int32)
    close(kl.full(3, 1.5), np.full(3, 1.5), dtype=kl.float32)
    close(kl.full((2, 3), np.array([1.0, 2.0, 3.0])), np.tile([1.0, 2.0, 3.0], (2, 1)))
    x = kl.asarray(np.ones((2, 3), np.int64))
    close(kl.zeros_like(x), np.zeros((2, 3), np.int64), dtype=kl.int64)
    close(kl.ones_like(x, dtype=kl.float16), np.ones((2, 3)), dtype=kl.float16)
    close(kl.full_like(x, 4), np.full((2, 3), 4), dtype=kl.int64)
    close(kl.arange(5), np.arange(5), dtype=kl.int32)
    close(kl.arange(1, 7, 2), np.arange(1, 7, 2), dtype=kl.int32)
    close(kl.arange(0.0, 1.0, 0.25), np.arange(0.0, 1.0, 0.25), dtype=kl.float32)
    close(kl.arange(3, dtype=kl.float64), np.arange(3.0), dtype=kl.float64)
    close(kl.linspace(0, 1, 5), np.linspace(0, 1, 5), dtype=kl.float32)
    close(kl.linspace(-1, 1, num=4, dtype=kl.float64), np.linspace(-1, 1, 4), dtype=kl.float64)
    close(kl.eye(3), np.eye(3))
    close(kl.eye(2, 4, dtype=kl.int32), np.eye(2, 4, dtype=np.int32))
    a = np.arange(3.0)
    c = kl.array(a)
    a[0] = 9
    assert float(c[0]) == 0.0  # a copy


def test_shapes():
    x = R.standard_normal((2, 3, 4))
    close(kl.reshape(x, (4, -1)), x.reshape(4, -1))
    close(kl.reshape(x, 24), x.reshape(24))
    close(kl.transpose(x), x.T)
    close(kl.transpose(x, axes=(1, 2, 0)), x.transpose(1, 2, 0))
    close(kl.swapaxes(x, 0, 2), x.swapaxes(0, 2))
    close(kl.moveaxis(x, 0, -1), np.moveaxis(x, 0, -1))
    close(kl.broadcast_to(x[0, 0], (5, 4)), np.broadcast_to(x[0, 0], (5, 4)))
    close(kl.expand_dims(x, 1), np.expand_dims(x, 1))
    close(kl.expand_dims(x, (0, -1)), np.expand_dims(x, (0, -1)))
    close(kl.squeeze(x[:, :1, None]), np.squeeze(x[:, :1, None]))
    close(kl.squeeze(x[:, :1], axis=1), np.squeeze(x[:, :1], axis=1))
    close(kl.concatenate([x, x[:1]], axis=0), np.concatenate([x, x[:1]], axis=0))
    close(kl.stack((x[0], x[1]), axis=-1), np.stack((x[0], x[1]), axis=-1))
    for got, expected in zip(kl.split(x, 2, axis=2), np.split(x, 2, axis=2)):
        close(got, expected)
    for got, expected in zip(kl.split(x, [1, 3], axis=-1), np.split(x, [1, 3], axis=-1)):
        close(got, expected)
    close(kl.flip(x), np.flip(x))
    close(kl.flip(x, axis=(0, 2)), np.flip(x, axis=(0, 2)))
    for mode in ("constant", "reflect", "edge", "wrap"):
        close(
            kl.pad(x, ((0, 1), (2, 1), (1, 0)), mode=mode),
            np.pad(x, ((0, 1), (2, 1), (1, 0)), mode=mode),
        )
    close(kl.pad(x, 1, constant_values=3.0), np.pad(x, 1, constant_values=3.0))
    close(kl.pad(x, (1, 2)), np.pad(x, (1, 2)))
    close(kl.tile(x[0], (2, 1, 2)), np.tile(x[0], (2, 1, 2)))
    close(kl.repeat(x, 2, axis=1), np.repeat(x, 2, axis=1))
    close(kl.repeat(x, 3), np.repeat(x, 3))
    close(kl.roll(x, 2, axis=2), np.roll(x, 2, axis=2))
    close(kl.roll(x, -5), np.roll(x, -5))
    gx, gy = kl.meshgrid(np.arange(3.0), np.arange(2.0))
    ex, ey = np.meshgrid(np.arange(3.0), np.arange(2.0))
    close(gx, ex)
    close(gy, ey)
    gi = kl.meshgrid(np.arange(3.0), np.arange(2.0), indexing="ij")
    close(gi[0], np.meshgrid(np.arange(3.0), np.arange(2.0), indexing="ij")[0])


def test_diagonals_and_triangles():
    m = R.standard_normal((4, 4))
    b = R.standard_normal((2, 3, 4))
    close(kl.diagonal(m, offset=1), np.diagonal(m, offset=1))
    close(kl.diagonal(b, axis1=1, axis2=2), np.diagonal(b, axis1=1, axis2=2))
    close(kl.diag(m[0]), np.diag(m[0]))
    close(kl.diag(m, k=-1), np.diag(m, k=-1))
    close(kl.trace(m), np.trace(m), tol=1e-10)
    close(
        kl.trace(b, offset=1, axis1=1, axis2=2), np.trace(b, offset=1, axis1=1, axis2=2), tol=1e-10
    )
    close(kl.tril(b), np.tril(b))
    close(kl.triu(b, k=1), np.triu(b, k=1))


def test_gather_and_scatter():
    x = R.standard_normal((4, 5))
    idx = np.array([[3, 0], [1, 1]])
    close(kl.take(x, idx), np.take(x, idx))
    close(kl.take(x, idx, axis=1), np.take(x, idx, axis=1))
    ia = R.integers(0, 5, (4, 2))
    close(kl.take_along_axis(x, ia, axis=1), np.take_along_axis(x, ia, axis=1))
    rows = np.array([0, 2, 0])
    upd = R.standard_normal((3, 5))
    expected = x.copy()
    np.add.at(expected, rows, upd)
    close(kl.scatter_add(x, rows, upd), expected, tol=1e-10)
    close(kl.scatter(x, rows, upd, mode="add"), expected, tol=1e-10)
    for mode, ufunc in (("mul", np.multiply), ("max", np.maximum), ("min", np.minimum)):
        e = x.copy()
        ufunc.at(e, rows, upd)
        close(kl.scatter(x, rows, upd, mode=mode), e, tol=1e-10)
    e = x.copy()
    e[[0, 2]] = upd[[2, 1]]  # set: the last of repeated indices wins
    close(kl.scatter(x, rows, upd), e)
    cols = np.array([4, 1])
    e = x.copy()
    e[:, cols] += 1.0
    close(kl.scatter_add(x, cols, np.ones((4, 2)), axis=1), e, tol=1e-10)
    labels = np.array([2, 0, 1])
    close(kl.one_hot(labels, 4), np.eye(4, dtype=np.float32)[labels], dtype=kl.float32)
    close(kl.one_hot(labels, 3, dtype=kl.int32), np.eye(3, dtype=np.int32)[labels])


def test_dynamic_slices():
    x = np.arange(20.0).reshape(4, 5)
    close(kl.dynamic_slice(x, (1, 2), (2, 2)), x[1:3, 2:4])
    close(kl.dynamic_slice(x, (3, 4), (2, 2)), x[2:4, 3:5])  # clamped into x, as in JAX
    e = x.copy()
    e[2:4, 0:2] = -1.0
    close(kl.dynamic_update_slice(x, -np.ones((2, 2)), (2, 0)), e)
    close(kl.dynamic_update_slice(x, -np.ones((2, 2)), (kl.asarray(5), kl.asarray(-1))), e)


def test_nonzero_family():
    x = np.array([[0, 3, 0], [1, 0, 2]], np.int32)
    close(kl.argwhere(x), np.argwhere(x))
    close(kl.argwhere(x, size=5, fill_value=-1), np.concatenate([np.argwhere(x), -np.ones((2, 2))]))
    for got, expected in zip(kl.nonzero(x), np.nonzero(x)):
        close(got, expected)
    assert [t.shape for t in kl.nonzero(x, size=4)] == [(4,), (4,)]
    v = np.array([1, 3, 1, 0, 7], np.int32)
    close(kl.bincount(v), np.bincount(v))
    close(kl.bincount(v, length=4), np.bincount(v, minlength=8)[:4])
    w = np.linspace(0, 1, 5)
    close(
        kl.bincount(v, weights=w, minlength=10), np.bincount(v, weights=w, minlength=10), tol=1e-10
    )


def test_where_clip_round_astype():
    x = R.standard_normal((3, 4)).astype(np.float32)
    close(kl.where(x > 0, x, -x), np.where(x > 0, x, -x))
    close(kl.where(x > 0, 1.0, 0.0), np.where(x > 0, 1.0, 0.0), dtype=kl.float32)
    close(kl.clip(x, -0.5, 0.5), np.clip(x, -0.5, 0.5))
    close(kl.clip(x, min=0.0), np.clip(x, 0.0, None))
    close(kl.clip(x, max=np.full(4, 0.1, np.float32)), np.clip(x, None, 0.1))
    h = np.array([0.5, 1.5, 2.5, -0.5, 1.2345], np.float64)
    close(kl.round(h), np.round(h))
    close(kl.round(h, decimals=2), np.round(h, 2), tol=1e-12)
    close(kl.astype(x, kl.int32), x.astype(np.int32), dtype=kl.int32)
    close(kl.astype(x, "float64"), x.astype(np.float64), dtype=kl.float64)


def test_convolution_string_paddings_against_torch():
    # "same" with odd and even totals (kernel 4, dilation 1 / kernel 3, dilation 2), "valid".
    x = R.standard_normal((2, 2, 7, 6))
    for kh, kw, dil in ((4, 3, (1, 2)), (2, 5, 1), (3, 3, 2)):
        w = R.standard_normal((3, 2, kh, kw))
        for padding in ("same", "valid"):
            want = F.conv2d(
                torch.from_numpy(x), torch.from_numpy(w), padding=padding, dilation=dil
            ).numpy()
            close(kl.conv2d(x, w, padding=padding, dilation=dil), want, tol=1e-9)
    x1, w1 = R.standard_normal((2, 3, 10)), R.standard_normal((4, 3, 4))
    close(
        kl.conv1d(x1, w1, padding="same"),
        F.conv1d(torch.from_numpy(x1), torch.from_numpy(w1), padding="same").numpy(),
        tol=1e-9,
    )
    x3, w3 = R.standard_normal((1, 2, 5, 6, 4)), R.standard_normal((3, 2, 2, 3, 2))
    close(
        kl.conv3d(x3, w3, padding="same"),
        F.conv3d(torch.from_numpy(x3), torch.from_numpy(w3), padding="same").numpy(),
        tol=1e-9,
    )
    with pytest.raises(kl.Error, match=r"\[conv2d\] padding='same' needs stride 1"):
        kl.conv2d(x, w, stride=2, padding="same")
    with pytest.raises(kl.Error, match=r"\[conv2d\] padding is an int, 2 ints, 'same' or 'valid'"):
        kl.conv2d(x, w, padding="full")
    # Gradients through the extra padding: against finite differences of the padded input.
    g = kl.grad(lambda x: kl.sum(kl.conv2d(x, w1[:1, :2, None, :], padding="same") ** 2))(x)
    tx = torch.from_numpy(x).requires_grad_()
    (F.conv2d(tx, torch.from_numpy(w1[:1, :2, None, :]), padding="same") ** 2).sum().backward()
    close(g, tx.grad.numpy(), tol=1e-9)


def test_convolution_and_pooling_against_torch():
    x = R.standard_normal((2, 4, 9, 8))
    w = R.standard_normal((6, 2, 3, 3))
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    close(
        kl.conv2d(x, w, stride=(2, 1), padding=1, dilation=(1, 2), groups=2),
        F.conv2d(tx, tw, stride=(2, 1), padding=1, dilation=(1, 2), groups=2).numpy(),
        tol=1e-9,
    )
    x1, w1 = R.standard_normal((2, 3, 10)), R.standard_normal((4, 3, 3))
    close(
        kl.conv1d(x1, w1, stride=2, padding=1),
        F.conv1d(torch.from_numpy(x1), torch.from_numpy(w1), stride=2, padding=1).numpy(),
        tol=1e-9,
    )
    x3, w3 = R.standard_normal((1, 2, 5, 6, 4)), R.standard_normal((3, 2, 2, 3, 2))
    close(
        kl.conv3d(x3, w3, padding=(1, 0, 1)),
        F.conv3d(torch.from_numpy(x3), torch.from_numpy(w3), padding=(1, 0, 1)).numpy(),
        tol=1e-9,
    )
    wt = R.standard_normal((4, 3, 3, 3))
    close(
        kl.conv_transpose2d(x, wt, stride=2, padding=1, output_padding=1),
        F.conv_transpose2d(tx, torch.from_numpy(wt), stride=2, padding=1, output_padding=1).numpy(),
        tol=1e-9,
    )
    wt1 = R.standard_normal((3, 2, 3))
    close(
        kl.conv_transpose1d(x1, wt1, stride=2),
        F.conv_transpose1d(torch.from_numpy(x1), torch.from_numpy(wt1), stride=2).numpy(),
        tol=1e-9,
    )
    wt3 = R.standard_normal((2, 2, 2, 2, 2))
    close(
        kl.conv_transpose3d(x3, wt3, stride=(1, 2, 1)),
        F.conv_transpose3d(torch.from_numpy(x3), torch.from_numpy(wt3), stride=(1, 2, 1)).numpy(),
        tol=1e-9,
    )
    close(
        kl.max_pool2d(x, kernel_size=3, stride=2, padding=1),
        F.max_pool2d(tx, 3, stride=2, padding=1).numpy(),
    )
    close(kl.avg_pool2d(x, kernel_size=(2, 3)), F.avg_pool2d(tx, (2, 3)).numpy(), tol=1e-10)
    close(kl.adaptive_avg_pool2d(x, (4, 3)), F.adaptive_avg_pool2d(tx, (4, 3)).numpy(), tol=1e-10)
    close(
        kl.interpolate(x, size=(5, 11), mode="bilinear"),
        F.interpolate(tx, size=(5, 11), mode="bilinear").numpy(),
        tol=1e-9,
    )
    close(kl.interpolate(x, scale_factor=2), F.interpolate(tx, scale_factor=2).numpy())


@pytest.mark.parametrize("size", [(2**60, 2), (2, 2**40), (2**31, 2**31)])
def test_adaptive_avg_pool2d_of_a_size_no_memory_holds_raises_kiln_error(size):
    x = kl.ones((1, 1, 5, 7))
    with pytest.raises(kl.Error, match=r"\[adaptive_avg_pool2d\]|\[shape\]"):
        kl.adaptive_avg_pool2d(x, size)


def test_linalg():
    a = R.standard_normal((3, 4, 4))
    spd = a @ a.transpose(0, 2, 1) + 4 * np.eye(4)
    b = R.standard_normal((3, 4, 2))
    la = kl.linalg
    close(la.cholesky(spd), np.linalg.cholesky(spd), tol=1e-9)
    lower = np.tril(spd)
    close(la.triangular_solve(lower, b, lower=True), np.linalg.solve(lower, b), tol=1e-9)
    close(
        la.solve_triangular(lower, b, lower=True, transpose=True),
        np.linalg.solve(lower.transpose(0, 2, 1), b),
        tol=1e-9,
    )
    close(la.solve(a, b), np.linalg.solve(a, b), tol=1e-9)
    close(la.inv(a), np.linalg.inv(a), tol=1e-9)
    sign, logdet = la.slogdet(a)
    es, el = np.linalg.slogdet(a)
    close(sign, es)
    close(logdet, el, tol=1e-9)
    close(la.det(a), np.linalg.det(a), tol=1e-9)
    w, v = la.eigh(spd)
    close(w, np.linalg.eigvalsh(spd), tol=1e-9)
    close(
        kl.matmul(kl.matmul(v, w[..., None] * kl.transpose(v, (0, 2, 1))), np.eye(4)), spd, tol=1e-9
    )
    m = R.standard_normal((5, 3))
    q, r = la.qr(m)
    eq, er = np.linalg.qr(m)
    close(kl.abs(q), np.abs(eq), tol=1e-9)
    close(kl.abs(r), np.abs(er), tol=1e-9)
    assert la.qr(m, mode="complete")[0].shape == (5, 5)
    u, s, vh = la.svd(m, full_matrices=False)
    close(s, np.linalg.svd(m, compute_uv=False), tol=1e-9)
    close(kl.matmul(u * s, vh), m, tol=1e-9)
    close(la.svd(m, compute_uv=False), np.linalg.svd(m, compute_uv=False), tol=1e-9)
    close(la.svdvals(m), np.linalg.svd(m, compute_uv=False), tol=1e-9)
    close(la.pinv(m), np.linalg.pinv(m), tol=1e-9)
    y = R.standard_normal(5)
    close(la.lstsq(m, y), np.linalg.lstsq(m, y, rcond=None)[0], tol=1e-9)
    for ord_ in (None, 1, 2, np.inf, -np.inf, 0, 3.5):
        close(la.norm(y, ord=ord_), np.linalg.norm(y, ord=ord_), tol=1e-9)
    for ord_ in ("fro", "nuc", 1, -1, 2, -2, np.inf):
        close(la.norm(m, ord=ord_), np.linalg.norm(m, ord=ord_), tol=1e-9)
    close(
        la.norm(a, axis=(1, 2), keepdims=True),
        np.linalg.norm(a, axis=(1, 2), keepdims=True),
        tol=1e-9,
    )
    close(la.matrix_power(a, 3), np.linalg.matrix_power(a, 3), tol=1e-9)
    close(la.matrix_power(a, -2), np.linalg.matrix_power(a, -2), tol=1e-7)


def test_methods_bound_from_functions():
    x = kl.asarray(R.standard_normal((3, 4)))
    close(x.sum(axis=0), np.asarray(x).sum(axis=0), tol=1e-10)
    close(x.take(np.array([1, 0]), axis=1), np.asarray(x)[:, [1, 0]])
    close(x.exp(), np.exp(np.asarray(x)), tol=1e-10)
    assert "axis" in (kl.Tensor.sum.__doc__ or "")


def test_errors_name_op_and_python_line():
    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(kl.Error) as info:
        kl.add(np.ones((2, 3)), np.ones((4,)))
    message = str(info.value)
    assert message.startswith("[add] ")
    assert "got" in message and "expected" in message
    assert f"test_ops.py:{line})" in message
    assert info.value.op == "add"
    with pytest.raises(kl.Error, match=r"\[pad\] unknown mode: got 'mirror', expected"):
        kl.pad(np.ones(3), 1, mode="mirror")
    with pytest.raises(kl.Error, match=r"\[conv2d\] stride needs one int or 2"):
        kl.conv2d(np.ones((1, 1, 3, 3)), np.ones((1, 1, 1, 1)), stride=(1, 1, 1))
    with pytest.raises(kl.Error, match=r"\[shape\] a shape is an int or a sequence"):
        kl.zeros(1.5)


def test_long_operations_release_the_gil():
    import threading
    import time

    a = kl.asarray(R.standard_normal((900, 900)))
    kl.matmul(a, a)  # warm up
    stamps, stop = [], threading.Event()

    def tick():
        while not stop.is_set():
            stamps.append(time.perf_counter())
            time.sleep(0.0005)

    thread = threading.Thread(target=tick)
    thread.start()
    time.sleep(0.01)
    spans = []
    for op in (lambda: kl.matmul(a, a), lambda: kl.linalg.inv(a), lambda: kl.linalg.svdvals(a)):
        start = time.perf_counter()
        op()
        spans.append((start, time.perf_counter()))
    stop.set()
    thread.join()
    # With the GIL held for a whole call, no tick could land strictly inside it.
    for s, e in spans:
        assert any(s + 0.002 < t < e - 0.002 for t in stamps), (s, e)


def test_numpy_names():
    import scipy.special as sp

    x = R.standard_normal((3, 4, 5))
    close(kl.logcumsumexp(x, axis=1), np.logaddexp.accumulate(x, axis=1), tol=1e-10)
    for n, axis in ((1, -1), (2, 0), (0, 1), (7, 2)):
        close(kl.diff(x, n=n, axis=axis), np.diff(x, n=n, axis=axis), tol=1e-10)
    close(
        kl.diff(x, axis=1, prepend=0.5, append=x[:, :2]),
        np.diff(x, axis=1, prepend=0.5, append=x[:, :2]),
        tol=1e-10,
    )
    b = np.array([True, True, False, True])
    close(kl.diff(b), np.diff(b))
    close(kl.diff(np.array([1, 4, 9], np.int32)), np.diff(np.array([1, 4, 9], np.int32)))
    u, v = R.standard_normal((4, 3)), R.standard_normal((2, 1, 3))
    close(kl.cross(u, v), np.cross(u, v), tol=1e-10)
    close(kl.cross(u.T, v.T[:, 0, :1], axis=0), np.cross(u.T, v.T[:, 0, :1], axis=0), tol=1e-10)
    a2, b1, b3 = R.standard_normal((2, 3, 4)), R.standard_normal(4), R.standard_normal((5, 4, 2))
    for p, q in ((a2, b1), (a2, b3), (b1, b1), (a2[0], b3[0]), (a2, 2.0), (b1, a2[0].T)):
        close(kl.dot(p, q), np.dot(p, q), tol=1e-10)
    e = np.array([-3.0, 0.0, 0.5, 6.0, 26.0])
    np.testing.assert_allclose(np.asarray(kl.erfc(e)), sp.erfc(e), rtol=1e-14)  # the tail too
    xs, ys = np.array([0.0, 0.0, 0.0, 2.0, 1.5, 0.0]), np.array([0.0, 3.0, np.nan, 0.5, 0.0, -1.0])
    close(kl.xlogy(xs, ys), sp.xlogy(xs, ys), tol=1e-14)
    # The custom derivative under jit and vmap: d/dx x log y = log y, also at x = 0.
    dx = kl.jit(kl.vmap(kl.grad(lambda p, q: kl.xlogy(p, q))))(
        np.array([0.0, 2.0]), np.array([0.5, 3.0])
    )
    close(dx, np.log([0.5, 3.0]), tol=1e-14)


def test_nan_reductions():
    x = R.standard_normal((4, 5))
    x[0, 1] = x[2, 2] = x[2, 4] = np.nan
    x[3, :] = np.nan
    with np.errstate(all="ignore"), pytest.warns(RuntimeWarning):
        for name in ("nansum", "nanprod", "nanmean", "nanmax", "nanmin", "nanvar", "nanstd"):
            ref = getattr(np, name)
            for axis in (None, 0, 1):
                close(getattr(kl, name)(x, axis=axis), ref(x, axis=axis), tol=1e-10)
            close(
                getattr(kl, name)(x, axis=1, keepdims=True),
                ref(x, axis=1, keepdims=True),
                tol=1e-10,
            )
        close(kl.nanvar(x, axis=1, ddof=1), np.nanvar(x, axis=1, ddof=1), tol=1e-10)
    ints = np.array([[1, 5], [3, 2]], np.int32)
    close(kl.nansum(ints, axis=0), np.nansum(ints, axis=0))
    close(kl.nanmax(ints), np.nanmax(ints))


def test_isclose():
    a = np.array([1.0, 1.0, np.inf, np.inf, np.nan, 1e-9, 0.0, 1.0, -np.inf])
    b = np.array([1.0 + 1e-6, 1.1, np.inf, -np.inf, np.nan, 0.0, 1e-7, np.inf, -np.inf])
    close(kl.isclose(a, b), np.isclose(a, b))
    close(kl.isclose(a, b, equal_nan=True), np.isclose(a, b, equal_nan=True))
    close(kl.isclose(a, b, rtol=0.2, atol=0.0), np.isclose(a, b, rtol=0.2, atol=0.0))
    close(kl.isclose(np.array([1, 2], np.int32), 2), np.isclose(np.array([1, 2]), 2))
    assert bool(kl.allclose(a[:3], a[:3])) and not bool(kl.allclose(a, b))
    assert bool(kl.allclose(a, a, equal_nan=True))
    f = kl.jit(lambda p, q: kl.allclose(p, q, atol=0.2))
    assert bool(f(np.ones(3), np.full(3, 1.1)))


def test_unique():
    x = np.array([[3.0, 1.0, np.nan], [1.0, -0.0, 0.0], [np.nan, 7.0, 3.0]])
    close(kl.unique(x), np.unique(x))
    values, inverse, counts = kl.unique(x, return_inverse=True, return_counts=True)
    ref = np.unique(x, return_inverse=True, return_counts=True)
    for got, want in zip((values, inverse, counts), ref):
        close(got, want)
    ints = np.array([5, 2, 2, 9, 5, 5], np.int32)
    close(kl.unique(ints), np.unique(ints))
    # Under jit the size is given (jnp.unique(size=)): padded with fill_value or the minimum.
    f = kl.jit(lambda t: kl.unique(t, size=5))
    close(f(ints), np.array([2, 5, 9, 2, 2], np.int32))
    g = kl.jit(lambda t: kl.unique(t, return_counts=True, size=2, fill_value=-1))
    v, c = g(ints)
    close(v, np.array([2, 5], np.int32))
    close(c, np.array([2, 3]))
    close(kl.unique(np.zeros((0,))), np.unique(np.zeros((0,))))
    rows = np.array([[1, 1, 4], [3, 2, 3]], np.int32)
    close(
        kl.vmap(lambda r: kl.unique(r, size=3, fill_value=0))(rows),
        np.array([[1, 4, 0], [2, 3, 0]], np.int32),
    )
    with pytest.raises(kl.Error, match=r"\[unique\].*expected a size"):
        kl.jit(lambda t: kl.unique(t))(ints)
