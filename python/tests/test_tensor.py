"""kiln.Tensor from Python: properties, conversions, operators, indexing and repr, against
numpy on the same values."""
import inspect
import operator

import numpy as np
import pytest

import kiln as kl


def rng():
    return np.random.default_rng(0)


def check(t, expected, dtype=None):
    assert isinstance(t, kl.Tensor)
    expected = np.asarray(expected)
    assert t.shape == expected.shape
    if dtype is not None:
        assert t.dtype == dtype
    np.testing.assert_allclose(
        np.asarray(t).astype(np.float64), expected.astype(np.float64), rtol=1e-6, atol=1e-6
    )


def test_properties():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = kl.asarray(a)
    assert t.dtype == kl.float32 and t.dtype.name == "float32"
    assert t.shape == (2, 3, 4) and t.ndim == 3 and t.size == 24 and len(t) == 2
    assert t.itemsize == 4 and t.nbytes == 96
    assert t.tolist() == a.tolist()
    assert kl.asarray(np.float64(2.5)).item() == 2.5
    assert isinstance(kl.asarray(np.int64(3)).item(), int)
    assert kl.asarray(np.array([True])).item() is True
    assert [row.shape for row in t] == [(3, 4), (3, 4)]
    k1, k2, k3 = kl.asarray(np.arange(3))
    assert (int(k1), int(k2), int(k3)) == (0, 1, 2)


def test_scalar_conversions():
    assert float(kl.asarray(np.float32(1.5))) == 1.5
    assert int(kl.asarray(np.array([7], np.int64))) == 7
    assert int(kl.asarray(-2.7)) == -2
    assert bool(kl.asarray(np.array([[1.0]])))
    assert not bool(kl.asarray(0))
    assert [10, 20, 30][kl.asarray(2)] == 30  # __index__
    with pytest.raises(kl.Error, match=r"\[bool\].*got .*expected one element"):
        bool(kl.asarray(np.ones(2)))
    with pytest.raises(kl.Error, match=r"\[float\].*got f32\[3\], expected one element"):
        float(kl.asarray(np.ones(3, np.float32)))
    with pytest.raises(kl.Error, match=r"\[index\].*got f32\[\]"):
        operator.index(kl.asarray(1.0))
    with pytest.raises(TypeError):
        len(kl.asarray(1.0))


DTYPES = [np.float32, np.float64, np.int32, np.int64, np.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "op",
    [
        operator.add,
        operator.sub,
        operator.mul,
        operator.truediv,
        operator.floordiv,
        operator.mod,
        operator.pow,
        operator.lt,
        operator.le,
        operator.gt,
        operator.ge,
        operator.eq,
        operator.ne,
    ],
)
def test_binary_operators(op, dtype):
    r = rng()
    a = r.uniform(1, 5, (3, 4)).astype(dtype)
    b = r.uniform(1, 3, (4,)).astype(dtype)  # broadcasts
    if op is operator.pow and np.issubdtype(dtype, np.integer):
        b = np.array([0, 1, 2, 3], dtype)
    x, y = kl.asarray(a), kl.asarray(b)
    expected = op(a, b)
    tol = 2e-3 if dtype == np.float16 else 1e-6
    for got in (op(x, y), op(x, b), op(a, y)):  # tensor-tensor, and numpy on either side
        assert isinstance(got, kl.Tensor)
        assert got.shape == expected.shape
        if expected.dtype == np.bool_:
            assert got.dtype == kl.bool_
            np.testing.assert_array_equal(np.asarray(got), expected)
        else:
            np.testing.assert_allclose(
                np.asarray(got).astype(np.float64), expected.astype(np.float64), rtol=tol, atol=tol
            )


@pytest.mark.parametrize(
    "dtype,kl_dtype",
    [
        (np.float16, kl.float16),
        (np.int32, kl.int32),
        (np.float32, kl.float32),
        (np.uint8, kl.uint8),
    ],
)
def test_python_scalars_are_weak(dtype, kl_dtype):
    a = np.array([1, 2, 3], dtype)
    t = kl.asarray(a)
    for got in (t + 2, 2 + t, t * 3, t - 1, 5 - t, t // 2, t % 2):
        assert got.dtype == kl_dtype
    np.testing.assert_array_equal(np.asarray(5 - t), (5 - a).astype(dtype))
    # A Python float next to integers gives a float; next to float16 keeps float16.
    assert (t * 2.0).dtype == (kl_dtype if np.issubdtype(dtype, np.floating) else kl.float32)
    # True division of integers gives floats, as in Python.
    assert (t / 2).dtype in (kl.float16, kl.float32)
    np.testing.assert_allclose(np.asarray(t / 2).astype(np.float64), a / 2, rtol=1e-3)


def test_unary_and_bitwise_operators():
    a = np.array([[-1.5, 2.0], [0.0, -3.25]], np.float32)
    t = kl.asarray(a)
    check(-t, -a)
    check(abs(t), np.abs(a))
    check(+t, a)
    m = np.array([True, False, True])
    np.testing.assert_array_equal(np.asarray(~kl.asarray(m)), ~m)
    i = np.array([5, -3, 12], np.int32)
    j = np.array([3, 6, 1], np.int32)
    for op in (operator.and_, operator.or_, operator.xor, operator.lshift, operator.rshift):
        np.testing.assert_array_equal(np.asarray(op(kl.asarray(i), kl.asarray(j))), op(i, j))
    np.testing.assert_array_equal(np.asarray(~kl.asarray(i)), ~i)
    np.testing.assert_array_equal(np.asarray(kl.asarray(m) & True), m & True)


def test_matmul_operator():
    r = rng()
    a, b = r.standard_normal((2, 3, 4)).astype(np.float32), r.standard_normal((4, 5))
    b = b.astype(np.float32)
    check(kl.asarray(a) @ kl.asarray(b), a @ b)
    check(a @ kl.asarray(b), a @ b)
    check(kl.asarray(a) @ b, a @ b)


def test_compound_assignment_rebinds():
    a = np.ones(3, np.float32)
    t = kl.asarray(a)
    u = t
    u += 1
    u *= 3
    assert u is not t
    np.testing.assert_array_equal(np.asarray(t), np.ones(3))  # the original is untouched
    np.testing.assert_array_equal(np.asarray(u), np.full(3, 6.0))
    assert not hasattr(kl.Tensor, "__iadd__")


def test_comparison_with_non_arrays():
    t = kl.asarray(np.ones(2))
    assert (t == None) is False  # noqa: E711
    assert (t != "a") is True


A = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
INDICES = [
    0,
    -1,
    (1, 2),
    (slice(None), 1),
    slice(1, None),
    (Ellipsis, 0),
    (0, Ellipsis, -2),
    (slice(None, None, -1),),
    (slice(None), slice(None, None, -2), slice(3, 0, -1)),
    (slice(-3, None), None, 1),
    (None, Ellipsis, None),
    (1, slice(0, 3, 2), None, -1),
    ([0, 1, 1],),
    (slice(None), [2, 0]),
    (slice(None), [[0, 1], [2, 2]], slice(1, 3)),
    ([1, 0], [2, 1]),
    ([1, 0], slice(None), [3, 1]),
    (0, slice(None), [1, 2]),
    (Ellipsis, [4, 0, -1]),
    (1, [0, -1], [[2], [3]]),
    (slice(None), 1, [0, 3]),
    (np.array([1, 0]),),
    (None, [1]),
    (slice(10, 20),),
    (slice(-10, 2),),
]


@pytest.mark.parametrize("index", INDICES, ids=[repr(i) for i in INDICES])
def test_indexing_matches_numpy(index):
    t = kl.asarray(A)
    got = t[index]
    expected = A[index]
    assert got.shape == expected.shape
    np.testing.assert_array_equal(np.asarray(got), expected)


def test_tensor_and_bool_indices():
    t = kl.asarray(A)
    idx = np.array([[1, 0], [0, 1]])
    np.testing.assert_array_equal(np.asarray(t[kl.asarray(idx)]), A[idx])
    np.testing.assert_array_equal(np.asarray(t[:, kl.asarray(np.array([2, -1]))]), A[:, [2, -1]])
    mask = A > 60
    np.testing.assert_array_equal(np.asarray(t[kl.asarray(mask)]), A[mask])
    np.testing.assert_array_equal(np.asarray(t[t > 60]), A[mask])
    m2 = np.array([True, False, True])
    np.testing.assert_array_equal(np.asarray(t[:, m2]), A[:, m2])
    np.testing.assert_array_equal(np.asarray(t[1, m2, 2:]), A[1, m2, 2:])
    np.testing.assert_array_equal(np.asarray(t[[]]), A[[]])


def test_index_errors():
    t = kl.asarray(A)
    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(kl.Error) as info:
        t[2]
    message = str(info.value)
    assert message.startswith("[getitem] index out of bounds")
    assert "got 2, expected -2 <= index < 2" in message
    assert f"test_tensor.py:{line}" in message
    with pytest.raises(kl.Error, match=r"\[getitem\] too many indices.*got 5, expected at most 4"):
        t[0, 0, 0, 0, 0]
    with pytest.raises(kl.Error, match=r"\[getitem\] index out of bounds.*got 7"):
        t[:, [0, 7]]
    with pytest.raises(kl.Error, match=r"\[getitem\] tensor indices must be integers"):
        t[kl.asarray(np.array([0.5]))]
    with pytest.raises(kl.Error, match=r"\[getitem\] bool mask shape"):
        t[np.array([True, False, True])]


def test_views_share_memory():
    a = np.zeros((4, 5), np.float32)
    t = kl.asarray(a)
    v = t[1:3, ::2]
    a[1, 2] = 7.0
    assert float(v[0, 1]) == 7.0
    assert t.T.shape == (5, 4)
    np.testing.assert_array_equal(np.asarray(t.T), a.T)


def test_methods():
    a = rng().standard_normal((3, 4, 2)).astype(np.float32)
    t = kl.asarray(a)
    check(t.reshape(4, 6), a.reshape(4, 6))
    check(t.reshape((2, -1)), a.reshape(2, -1))
    check(t.transpose(), a.transpose())
    check(t.transpose(1, 0, 2), a.transpose(1, 0, 2))
    check(t.transpose((2, 0, 1)), a.transpose(2, 0, 1))
    check(t.sum(axis=(0, 2), keepdims=True), a.sum(axis=(0, 2), keepdims=True))
    check(t.mean(1), a.mean(1))
    check(t.max(axis=-1), a.max(axis=-1))
    check(t.min(), a.min())
    check(t.var(axis=0, ddof=1), a.var(axis=0, ddof=1))
    check(t.std(), a.std())
    check(t.argmax(axis=1), a.argmax(axis=1))
    check(t.cumsum(axis=1), a.cumsum(axis=1))
    check(t.astype(kl.int32), a.astype(np.int32), kl.int32)
    check(t.astype(np.float64), a, kl.float64)
    check(t.astype("float16"), a.astype(np.float16), kl.float16)
    check(t.ravel(), a.ravel())
    check(t.squeeze(), a)
    check(t.swapaxes(0, 2), a.swapaxes(0, 2))
    check(t.clip(-0.5, 0.5), a.clip(-0.5, 0.5))
    check(t.round(2), a.round(2))
    check(t.copy(), a)
    assert not np.shares_memory(np.asarray(t.copy()), np.asarray(t))
    assert isinstance(t.numpy(), np.ndarray)


def numpy_repr(a):
    # numpy's repr, renamed: continuation lines indent one more for "Tensor(" than "array(".
    return repr(a).replace("array(", "Tensor(").replace("\n      ", "\n       ")


def test_repr_matches_numpy():
    a = np.array([[1.0, 2.5], [-3.0, 4.0]], np.float32)
    assert repr(kl.asarray(a)) == numpy_repr(a)
    i = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert repr(kl.asarray(i)) == numpy_repr(i)
    assert repr(kl.asarray(np.array([True, False]))) == "Tensor([ True, False], dtype=bool)"
    assert repr(kl.asarray(np.float64(1.5))) == "Tensor(1.5, dtype=float64)"
    assert repr(kl.zeros((0, 3))) == "Tensor([], shape=(0, 3), dtype=float32)"
    assert str(kl.asarray(a)) == str(a)
    b = kl.asarray(a).astype(kl.bfloat16)
    assert repr(b) == "Tensor([[ 1. ,  2.5],\n        [-3. ,  4. ]], dtype=bfloat16)"


def test_bfloat16_converts_through_array():
    a = np.array([1.0, 2.5, -3.0], np.float32)
    b = kl.asarray(a).astype(kl.bfloat16)
    c = np.asarray(b)
    assert c.dtype == np.float32
    np.testing.assert_array_equal(c, a)
    assert np.array(b, dtype=np.float64).dtype == np.float64
    assert b.tolist() == [1.0, 2.5, -3.0]
    with pytest.raises(BufferError):
        memoryview(b)


def test_numpy_defers_to_tensor_operators():
    a = np.ones(3, np.float32)
    t = kl.asarray(np.arange(3, dtype=np.float32))
    for got in (a + t, a * t, a < t, a @ t):
        assert isinstance(got, kl.Tensor)
    # ufuncs convert through __array__, giving numpy arrays (as for JAX arrays).
    assert isinstance(np.sin(t), np.ndarray)


@pytest.mark.parametrize("convert", [bool, float, int])
def test_traced_values_name_kiln_cond(convert):
    with pytest.raises(kl.Error, match=r"got a traced tensor.*kiln\.cond / kiln\.while_loop"):
        kl.jit(lambda x: x * convert(x))(kl.asarray(1.0))


def test_traced_repr_shows_the_type():
    seen = []
    kl.jit(lambda x: seen.append(repr(x)) or x)(kl.zeros((2, 3)))
    assert seen == ["Tensor(traced, shape=(2, 3), dtype=float32)"]


def test_at_updates_like_jax():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = kl.asarray(a)
    e = a.copy()
    e[1, ::2] = -1.0
    np.testing.assert_array_equal(np.asarray(t.at[1, ::2].set(-1.0)), e)
    np.testing.assert_array_equal(np.asarray(t), a)  # t itself is unchanged
    e = a.copy()
    np.add.at(e, ([0, 0, 2], [1, 1, 3]), 10.0)
    np.testing.assert_array_equal(np.asarray(t.at[[0, 0, 2], [1, 1, 3]].add(10.0)), e)
    e = a.copy()
    e[a > 6] *= 2
    np.testing.assert_array_equal(np.asarray(t.at[t > 6].multiply(2)), e)
    e = a.copy()
    e[:, 1] = np.minimum(e[:, 1], [0.0, 100.0, 5.0])
    np.testing.assert_array_equal(np.asarray(t.at[:, 1].min(np.array([0.0, 100.0, 5.0]))), e)
    np.testing.assert_array_equal(
        np.asarray(t.at[..., -1].max(9.0)), np.where(np.arange(4) == 3, np.maximum(a, 9.0), a)
    )
    np.testing.assert_array_equal(np.asarray(t.at[2].get()), a[2])
    assert t.at[0].set(1).dtype == kl.float32


def test_indexing_traces_and_differentiates():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    f = kl.jit(lambda x, i: x[1:, ::-2][i, None] + x[..., [0, 2]].sum())
    np.testing.assert_array_equal(
        np.asarray(f(kl.asarray(a), kl.asarray(2))), a[1:, ::-2][2, None] + a[..., [0, 2]].sum()
    )
    # A traced index out of range is clamped, as in JAX.
    np.testing.assert_array_equal(
        np.asarray(kl.jit(lambda x, i: x[i])(kl.asarray(a), kl.asarray(7))), a[3]
    )
    g = kl.grad(lambda x: (x[::2, [1, 1, 4]] ** 2).sum())(kl.asarray(a))
    expected = np.zeros_like(a)
    np.add.at(expected, (np.arange(0, 4, 2)[:, None], [1, 1, 4]), 2 * a[::2][:, [1, 1, 4]])
    np.testing.assert_array_equal(np.asarray(g), expected)
    h = kl.vmap(lambda row: row[[0, -1]] * 2 + row.at[0].set(100.0)[:2])(kl.asarray(a))
    np.testing.assert_array_equal(
        np.asarray(h), a[:, [0, -1]] * 2 + np.stack([np.full(4, 100.0), a[:, 1]], 1)
    )
    with pytest.raises(
        kl.Error,
        match=r"\[getitem\] a bool mask gives a shape that depends on "
        r"values: got a traced mask bool\[4,6\]",
    ):
        kl.jit(lambda x: x[x > 3])(kl.asarray(a))


def test_dtypes_compare_with_numpy_and_names():
    assert kl.float32 == np.float32 and kl.float32 == "float32" and kl.int64 == np.dtype("int64")
    assert kl.float32 != kl.float64 and kl.bool_ == bool and not (kl.int32 == None)  # noqa: E711
    assert np.dtype(kl.float16) == np.float16
    assert np.zeros(2, dtype=kl.uint8).dtype == np.uint8
    assert kl.bfloat16.dtype is None
    assert len({kl.float32, kl.float32, kl.int32}) == 2


def test_immutability_pickling_and_round():
    import copy
    import pickle

    t = kl.asarray(np.array([[1.25, 2.5]], np.float32))
    with pytest.raises(kl.Error, match=r"\[setitem\] tensors are immutable.*x.at\[index\]"):
        t[0, 0] = 1.0
    u = pickle.loads(pickle.dumps(t))
    assert u.dtype == kl.float32 and u.tolist() == t.tolist()
    b = pickle.loads(pickle.dumps(t.astype(kl.bfloat16)))
    assert b.dtype == kl.bfloat16 and b.tolist() == [[1.25, 2.5]]
    d = copy.deepcopy(t)
    np.asarray(d)[0, 0] = 7.0
    assert float(t[0, 0]) == 1.25
    np.testing.assert_array_equal(np.asarray(round(t, 1)), np.round(np.asarray(t), 1))
    assert round(kl.asarray(2.5)).item() == 2.0


def random_index(r, shape):
    """A random numpy index for an array of `shape`: ints, slices, None, ..., int lists, masks."""
    entries, axis, ellipsis = [], 0, False
    while axis < len(shape) and r.random() < 0.8:
        kind = r.integers(0, 6)
        n = shape[axis]
        if kind == 0:
            entries.append(int(r.integers(-n, n)))
        elif kind == 1:
            step = int(r.choice([-3, -2, -1, 1, 2, 3]))
            start, stop = (
                None if r.random() < 0.3 else int(r.integers(-n - 2, n + 2)) for _ in range(2)
            )
            entries.append(slice(start, stop, step))
        elif kind == 2:
            entries.append(None)
            continue
        elif kind == 3 and not ellipsis:
            ellipsis = True
            entries.append(Ellipsis)
            rest = len(shape) - axis - int(r.integers(0, len(shape) - axis + 1))
            axis += rest
            continue
        elif kind == 4:
            entries.append(r.integers(-n, n, int(r.integers(1, 4))).tolist())
        else:
            entries.append(r.random(n) < 0.5)
        axis += 1
    return tuple(entries)


def test_random_indices_match_numpy():
    r = np.random.default_rng(7)
    a = r.standard_normal((3, 4, 5, 2)).astype(np.float32)
    t = kl.asarray(a)
    checked = 0
    for _ in range(400):
        index = random_index(r, a.shape)
        try:
            expected = a[index]
        except IndexError:  # e.g. int lists that do not broadcast together
            continue
        got = t[index]
        assert got.shape == expected.shape, index
        np.testing.assert_array_equal(np.asarray(got), expected, err_msg=repr(index))
        checked += 1
    assert checked > 200


# ---- Python ints and floats converted exactly ----------------------------------------------------


def test_python_ints_convert_exactly_or_overflow():
    big = 2**53 + 1  # not a float64: a detour through double gives 2**53
    assert kl.asarray(big, dtype=kl.int64).item() == big
    assert (kl.asarray(np.array(1, np.int64)) + big).item() == big + 1
    assert (big - kl.asarray(np.array(1, np.int64))).item() == big - 1
    assert kl.asarray(-(2**63), dtype=kl.int64).item() == -(2**63)
    assert kl.asarray([big, 1], dtype=kl.int64).tolist() == [big, 1]
    assert (
        kl.asarray(2**31 - 1).item() == 2**31 - 1 and kl.asarray(2**31 - 1).dtype == kl.int32
    )
    assert kl.asarray(4294967295, dtype=kl.uint32).item() == 4294967295
    assert kl.asarray(big, dtype=kl.float64).item() == float(big)  # rounded once, as float()
    assert kl.asarray(2**70, dtype=kl.float32).item() == float(np.float32(2**70))
    assert (kl.asarray(np.float32(1)) + 2**70).item() == float(np.float32(2**70))
    # Python ints default to int32 (as JAX's without x64): one that does not fit overflows.
    for value, dtype in [
        (2**31, None),
        (-(2**31) - 1, None),
        (2**70, None),
        (2**63, kl.int64),
        (256, kl.uint8),
        (-1, kl.uint32),
        (2**32, kl.uint32),
    ]:
        with pytest.raises(OverflowError, match=f"Python int {value} too large to convert to"):
            kl.asarray(value, dtype=dtype)
    for values in ([2**31, 1], [1, -(2**31) - 1], [2**63]):
        with pytest.raises(OverflowError, match="too large to convert to int32"):
            kl.asarray(values)
    assert kl.asarray([2**31 - 1, -(2**31)]).tolist() == [2**31 - 1, -(2**31)]
    i32 = kl.asarray(np.array([1, 2], np.int32))
    with pytest.raises(OverflowError, match="too large to convert to int32"):
        i32 + 2**40
    with pytest.raises(OverflowError, match="too large to convert to int32"):
        2**31 * i32
    with pytest.raises(OverflowError, match="too large to convert to uint8"):
        kl.asarray(np.array([1], np.uint8)) + 256
    assert (i32 + (2**31 - 3)).tolist() == [2**31 - 2, 2**31 - 1]
    assert (kl.asarray(np.array([True])) + 5).tolist() == [6]


def test_int_of_floats_is_pythons():
    for value in (1e30, -3.0e20, 2.0**62, -2.7, 0.5):
        assert int(kl.asarray(value)) == int(float(np.float32(value)))
        assert int(kl.asarray(value, dtype=kl.float64)) == int(value)
    with pytest.raises(ValueError, match="NaN"):
        int(kl.asarray(float("nan")))
    for inf in (float("inf"), float("-inf")):
        with pytest.raises(OverflowError, match="infinity"):
            int(kl.asarray(inf))


# ---- a Tensor made without __init__ -------------------------------------------------------------

UNINITIALISED_PROGRAM = r"""
import inspect, operator, pickle, sys
import numpy as np
import kiln as kl

bare = kl.Tensor.__new__(kl.Tensor)
class Sub(kl.Tensor):
    pass
sub = Sub.__new__(Sub)
good = kl.asarray(np.ones((2, 2), np.float32))
arguments = [(), (good,), (1,), (1.5,), (0, 1), ((1, 4),), (kl.float32,), (slice(None),),
             (None,), (good, good)]
tried = 0
for t in (bare, sub):
    for name in sorted(dir(kl.Tensor)):
        if name in ("__new__", "__init__", "__init_subclass__", "__subclasshook__", "__class__",
                    "__getattribute__", "__setattr__", "__delattr__", "__dir__", "__sizeof__",
                    "__format__", "__reduce_ex__", "__getstate__"):
            continue
        try:
            attr = getattr(t, name)
        except (TypeError, kl.Error):
            tried += 1
            continue
        if not callable(attr):
            continue
        for args in arguments:
            tried += 1
            try:
                attr(*args)
            except (TypeError, kl.Error, ValueError, NotImplementedError, BufferError):
                pass
    for use in (lambda: np.asarray(t), lambda: memoryview(t), lambda: good + t, lambda: t + good,
                lambda: t + 1, lambda: -t, lambda: t[0], lambda: t < 1, lambda: 1 < t,
                lambda: good[t], lambda: bool(t), lambda: kl.sin(t), lambda: kl.jit(kl.sin)(t),
                lambda: kl.tree.leaves([t]), lambda: kl.grad(lambda x: x)(t),
                lambda: pickle.dumps(t), lambda: repr(t), lambda: str(t), lambda: hash(t),
                lambda: __import__('torch').from_dlpack(t), lambda: kl.from_dlpack(t),
                lambda: t == t,
                lambda: [1, 2][t], lambda: kl.asarray(t), lambda: kl.vmap(kl.sin)(t)):
        tried += 1
        try:
            use()
        except (TypeError, kl.Error, ValueError, BufferError):
            pass
print(tried)
"""


def test_uninitialised_tensor_raises_for_every_method():
    # In a subprocess, so that a crash fails this test instead of ending pytest.
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", UNINITIALISED_PROGRAM], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert int(run.stdout) > 1000
