"""Complex dtypes (complex64, complex128), kiln.fft and kiln.linalg.eig against NumPy, PyTorch,
analytic values and central finite differences in float64."""
import math

import numpy as np
import pytest
import torch

import kiln as kl

R = np.random.default_rng(2026)
fft = kl.fft
COMPLEX = [kl.complex64, kl.complex128]
NP_OF = {kl.complex64: np.complex64, kl.complex128: np.complex128}
REAL_OF = {kl.complex64: kl.float32, kl.complex128: kl.float64}
TOL = {kl.float32: 2e-5, kl.complex64: 2e-5, kl.float64: 1e-12, kl.complex128: 1e-12}
NORMS = [None, "backward", "ortho", "forward"]


def crandn(shape, dtype=np.complex128):
    return (R.standard_normal(shape) + 1j * R.standard_normal(shape)).astype(dtype)


def close(got, want, tol=1e-12, dtype=None):
    """got (a Kiln tensor) against want: same shape (and dtype), within tol relative to want's
    largest magnitude (float32 transforms round relative to the whole spectrum, not per entry)."""
    assert isinstance(got, kl.Tensor), type(got)
    if dtype is not None:
        assert got.dtype == dtype, (got.dtype, dtype)
    want = np.asarray(want)
    g = np.asarray(got)
    assert g.shape == want.shape, (g.shape, want.shape)
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    np.testing.assert_allclose(g, want, rtol=tol, atol=tol * scale)


def scalar(t):
    return float(np.asarray(t))


def fd_grad(f, x, h=1e-6):
    """Central differences of the real scalar f at the float64 or complex128 array x; for a
    complex x, JAX's convention d/dRe - i d/dIm."""
    x = np.asarray(x)
    g = np.zeros(x.shape, np.complex128 if np.iscomplexobj(x) else np.float64)
    directions = [1.0, 1j] if np.iscomplexobj(x) else [1.0]
    for idx in np.ndindex(x.shape):
        for d in directions:
            xp, xm = x.copy(), x.copy()
            xp[idx] += h * d
            xm[idx] -= h * d
            slope = (f(xp) - f(xm)) / (2 * h)
            g[idx] += slope if d == 1.0 else -1j * slope
    return g


def check_grad(loss, x, tol=1e-6):
    """kl.grad of the Kiln loss at x against central differences of the same loss."""
    got = kl.grad(loss)(kl.asarray(x))
    want = fd_grad(lambda v: scalar(loss(kl.asarray(v))), x)
    assert got.dtype == (kl.complex128 if np.iscomplexobj(x) else kl.float64), got.dtype
    close(got, want, tol)


# ---- dtypes, conversions and interchange ------------------------------------------


@pytest.mark.parametrize("kl_dtype", COMPLEX)
def test_numpy_complex_arrays_are_viewed_without_a_copy(kl_dtype):
    a = crandn((3, 4), NP_OF[kl_dtype])
    t = kl.asarray(a)
    assert t.dtype == kl_dtype and t.shape == (3, 4)
    v = np.asarray(t)
    assert v.dtype == NP_OF[kl_dtype] and np.shares_memory(a, v)
    np.testing.assert_array_equal(v, a)
    a[1, 2] = 5 - 7j
    assert complex(t[1, 2]) == 5 - 7j
    for view in (a.T, a[::2, 1::2], a[::-1, ::-3], a[:, 1]):
        s = kl.asarray(view)
        np.testing.assert_array_equal(np.asarray(s), view)
        np.testing.assert_array_equal(np.asarray(s * 1), view)
        assert np.shares_memory(np.asarray(s), a)
    assert kl.asarray(NP_OF[kl_dtype](1 - 1j)).dtype == kl_dtype  # a NumPy scalar keeps its dtype


def test_python_complex_scalars_and_lists_are_complex64():
    t = kl.asarray(1.5 - 2j)
    assert t.dtype == kl.complex64 and t.shape == ()
    assert complex(t) == 1.5 - 2j and t.item() == 1.5 - 2j
    assert isinstance(t.item(), complex)
    lst = kl.asarray([1, 2.5, 3j, -1 + 1j])
    assert lst.dtype == kl.complex64
    np.testing.assert_array_equal(np.asarray(lst), np.array([1, 2.5, 3j, -1 + 1j], np.complex64))
    nested = kl.asarray([[1j, 2], [3, 4.0]])
    assert nested.dtype == kl.complex64 and nested.shape == (2, 2)
    assert kl.asarray(np.array(1 + 1j)).dtype == kl.complex128  # a NumPy array keeps its dtype


def test_complex_to_python_numbers():
    t = kl.asarray(np.array(3.25 - 0.5j, np.complex128))
    assert complex(t) == 3.25 - 0.5j and t.item() == 3.25 - 0.5j
    with pytest.raises(TypeError):
        float(t)
    with pytest.raises(TypeError):
        int(t)
    # a real tensor converts to a complex number as NumPy's does
    assert complex(kl.asarray(np.float64(2.5))) == 2.5 + 0j


@pytest.mark.parametrize("kl_dtype", COMPLEX)
def test_repr_names_the_dtype_and_shows_both_parts(kl_dtype):
    t = kl.asarray(np.array([1 + 2j, -0.5 - 3j], NP_OF[kl_dtype]))
    text = repr(t)
    assert ("complex64" if kl_dtype == kl.complex64 else "complex128") in text, text
    assert "j" in text and "2" in text and "3" in text, text
    assert "-0.5" in text, text
    for a in (
        np.array([1.5 + 2.7j, -3.2 - 1j]),
        np.array([[1 + 2j, -0.5 - 3j], [1e10j, 0]]),
        np.array([np.nan + 1j, np.inf - np.inf * 1j]),
        np.array(1 - 2j),
        crandn((3, 3)),
    ):
        a = a.astype(NP_OF[kl_dtype])
        assert str(kl.asarray(a)) == str(a), (str(kl.asarray(a)), str(a))


@pytest.mark.parametrize(
    "torch_dtype,kl_dtype", [(torch.complex64, kl.complex64), (torch.complex128, kl.complex128)]
)
def test_dlpack_exchange_with_torch(torch_dtype, kl_dtype):
    a = crandn((2, 3), NP_OF[kl_dtype])
    t = kl.asarray(a)
    p = torch.from_dlpack(t)
    assert p.dtype == torch_dtype and tuple(p.shape) == (2, 3)
    np.testing.assert_array_equal(p.numpy(), a)
    p[0, 1] = -2 + 0.5j  # shared memory
    assert complex(t[0, 1]) == -2 + 0.5j and a[0, 1] == -2 + 0.5j
    q = torch.tensor(crandn((3, 2), NP_OF[kl_dtype]))
    k = kl.from_dlpack(q)
    assert k.dtype == kl_dtype and k.shape == (3, 2)
    q[2, 1] = 4 + 5j  # shared memory
    assert complex(k[2, 1]) == 4 + 5j
    np.testing.assert_array_equal(np.asarray(k * 2), (q * 2).numpy())
    # a strided torch view
    s = kl.from_dlpack(q.T)
    np.testing.assert_array_equal(np.asarray(s), q.T.numpy())


# ---- promotion ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "a_dtype,b_dtype,want",
    [
        (kl.float32, kl.complex64, kl.complex64),
        (kl.float64, kl.complex64, kl.complex128),
        (kl.float32, kl.complex128, kl.complex128),
        (kl.int32, kl.complex64, kl.complex64),
        (kl.int64, kl.complex64, kl.complex64),
        (kl.bool_, kl.complex64, kl.complex64),
        (kl.float16, kl.complex64, kl.complex64),
        (kl.complex64, kl.complex128, kl.complex128),
    ],
)
def test_promotion_between_tensors(a_dtype, b_dtype, want):
    a = kl.asarray(np.array([1, 0, 1, 1])).astype(a_dtype)
    b = kl.asarray(np.array([1 + 2j, -3j, 0.5, 2 - 1j])).astype(b_dtype)
    for got in (a + b, b + a, a * b, b - a):
        assert got.dtype == want, (a_dtype, b_dtype, got.dtype)
    np.testing.assert_allclose(
        np.asarray(a * b), np.array([1, 0, 1, 1]) * np.array([1 + 2j, -3j, 0.5, 2 - 1j]), 1e-6
    )


def test_python_scalars_are_weakly_typed():
    x32 = kl.asarray(np.array([1.0, 2.0], np.float32))
    x64 = kl.asarray(np.array([1.0, 2.0], np.float64))
    assert (x32 + 1j).dtype == kl.complex64
    assert (1j * x32).dtype == kl.complex64
    assert (x64 + 1j).dtype == kl.complex128
    assert (2j - x64).dtype == kl.complex128
    c64 = kl.asarray(np.array([1 + 1j], np.complex64))
    assert (c64 * 2.5).dtype == kl.complex64 and (c64 + 3).dtype == kl.complex64
    assert (c64 * (1 - 1j)).dtype == kl.complex64
    i32 = kl.asarray(np.array([1, 2], np.int32))
    assert (i32 * 1j).dtype == kl.complex64
    np.testing.assert_array_equal(np.asarray(x64 + 1j), np.array([1 + 1j, 2 + 1j]))
    np.testing.assert_array_equal(np.asarray(c64 * (1 - 1j)), np.array([2 + 0j], np.complex64))


# ---- elementwise ops and reductions ---------------------------------------------


@pytest.mark.parametrize("dtype", COMPLEX)
def test_arithmetic_matches_numpy(dtype):
    a, b = crandn((3, 4), NP_OF[dtype]), crandn((4,), NP_OF[dtype])
    ta, tb = kl.asarray(a), kl.asarray(b)
    tol = TOL[dtype]
    close(ta + tb, a + b, tol, dtype)
    close(ta - tb, a - b, tol, dtype)
    close(ta * tb, a * b, tol, dtype)
    close(ta / tb, a / b, tol * 10, dtype)
    close(-ta, -a, tol, dtype)
    close(ta * 2 - 1j, a * 2 - 1j, tol, dtype)
    close(1 / ta, 1 / a, tol * 10, dtype)
    close(kl.square(ta), a * a, tol * 10, dtype)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_products_and_quotients_of_extreme_values_match_numpy(dtype):
    """Division scales (Smith's algorithm, as NumPy), so neither |b|^2 overflows nor
    underflows; products overflow exactly where NumPy's do."""
    a = np.array([1e30 + 1e30j, 1e-30 + 1e-30j, 3 + 4j, 1e20 - 1e20j], NP_OF[dtype])
    b = np.array([1e30 + 1e30j, 1e-30 - 2e-30j, 1e30j, 1e-20 + 1e20j], NP_OF[dtype])
    close(kl.asarray(a) / kl.asarray(b), a / b, TOL[dtype], dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        want = a * b
    np.testing.assert_array_equal(np.asarray(kl.asarray(a) * kl.asarray(b)), want)


@pytest.mark.parametrize("exponent", [2, 3, 0.5])
def test_powers_match_numpy_or_raise_naming_pow(exponent):
    a = crandn((5,))
    try:
        got = kl.asarray(a) ** exponent
    except kl.Error as e:
        assert "[pow]" in str(e), str(e)
        return
    close(got, a**exponent, 1e-12, kl.complex128)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_reductions_match_numpy(dtype):
    a = crandn((3, 4, 5), NP_OF[dtype])
    t = kl.asarray(a)
    tol = TOL[dtype] * 10
    close(kl.sum(t), a.sum(), tol, dtype)
    close(kl.sum(t, axis=1), a.sum(axis=1), tol, dtype)
    close(t.sum(axis=(0, 2), keepdims=True), a.sum(axis=(0, 2), keepdims=True), tol, dtype)
    close(kl.mean(t), a.mean(), tol, dtype)
    close(kl.mean(t, axis=-1), a.mean(axis=-1), tol, dtype)
    close(kl.nansum(t, axis=0), a.sum(axis=0), tol, dtype)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_prod_matches_numpy(dtype):
    a = crandn((3, 4, 5), NP_OF[dtype])
    t = kl.asarray(a)
    close(kl.prod(t, axis=2), a.prod(axis=2), TOL[dtype] * 10, dtype)
    close(kl.prod(t[0, 0]), a[0, 0].prod(), TOL[dtype] * 10, dtype)


def test_var_of_complex_is_real_as_numpy():
    a = crandn((4, 5))
    close(kl.var(kl.asarray(a), axis=1), np.var(a, axis=1), 1e-12, kl.float64)


@pytest.mark.parametrize("name", ["isnan", "isinf", "isfinite"])
def test_classification_of_complex_values_matches_numpy(name):
    nan, inf = np.nan, np.inf
    a = np.array([complex(0, nan), complex(nan, 0), complex(inf, 0), complex(1, -inf), 1 + 1j])
    for dtype in (np.complex64, np.complex128):
        got = getattr(kl, name)(kl.asarray(a.astype(dtype)))
        np.testing.assert_array_equal(np.asarray(got), getattr(np, name)(a))


def test_nansum_of_complex_skips_nan_entries():
    a = np.array([complex(0, np.nan), complex(np.nan, 1), 2 - 1j])
    close(kl.nansum(kl.asarray(a)), np.nansum(a), 1e-15, kl.complex128)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_matmul_matches_numpy(dtype):
    tol = TOL[dtype] * 10
    a, b = crandn((4, 5), NP_OF[dtype]), crandn((5, 3), NP_OF[dtype])
    close(kl.asarray(a) @ kl.asarray(b), a @ b, tol, dtype)
    close(kl.matmul(kl.asarray(a), kl.asarray(b)), a @ b, tol, dtype)
    v = crandn((5,), NP_OF[dtype])
    close(kl.asarray(a) @ kl.asarray(v), a @ v, tol, dtype)
    close(kl.asarray(v) @ kl.asarray(b), v @ b, tol, dtype)
    batch_a, batch_b = crandn((2, 3, 4, 5), NP_OF[dtype]), crandn((3, 5, 2), NP_OF[dtype])
    close(kl.asarray(batch_a) @ kl.asarray(batch_b), batch_a @ batch_b, tol, dtype)
    # transposed (non-contiguous) operands, and a real operand promoted to complex
    close(kl.asarray(a).T @ kl.asarray(a), a.T @ a, tol, dtype)
    r = R.standard_normal((5, 2)).astype(np.float32 if dtype == kl.complex64 else np.float64)
    close(kl.asarray(a) @ kl.asarray(r), a @ r, tol, dtype)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_parts_conj_abs_angle_match_numpy(dtype):
    a = crandn((2, 5), NP_OF[dtype])
    a[0, 0] = -2.0  # angle pi
    a[0, 1] = 0.0  # angle 0
    a[1, 0] = -3j
    t = kl.asarray(a)
    real = REAL_OF[dtype]
    tol = TOL[dtype]
    close(kl.real(t), a.real, 0, real)
    close(kl.imag(t), a.imag, 0, real)
    close(t.real, a.real, 0, real)
    close(t.imag, a.imag, 0, real)
    close(kl.conj(t), np.conj(a), 0, dtype)
    close(t.conj(), np.conj(a), 0, dtype)
    close(kl.conjugate(t), np.conj(a), 0, dtype)
    close(kl.abs(t), np.abs(a), tol, real)
    close(abs(t), np.abs(a), tol, real)
    close(kl.angle(t), np.angle(a), tol, real)


def test_parts_of_real_tensors_follow_numpy():
    x = R.standard_normal((3,))
    close(kl.real(x), x, 0, kl.float64)
    close(kl.imag(x), np.zeros(3), 0, kl.float64)
    close(kl.conj(x), x, 0, kl.float64)
    close(kl.angle(np.array([-1.0, 0.0, 2.0])), np.angle([-1.0, 0.0, 2.0]), 0, kl.float64)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_abs_neither_overflows_nor_underflows(dtype):
    big = np.finfo(np.float32 if dtype == kl.complex64 else np.float64).max / 2
    tiny = np.finfo(np.float32 if dtype == kl.complex64 else np.float64).tiny * 4
    a = np.array([1e30 + 1e30j, big + big * 1j, tiny - tiny * 1j, 3 - 4j, 0], NP_OF[dtype])
    close(kl.abs(kl.asarray(a)), np.abs(a), TOL[dtype], REAL_OF[dtype])
    assert np.all(np.isfinite(np.asarray(kl.abs(kl.asarray(a)))))


@pytest.mark.parametrize("dtype", COMPLEX)
def test_complex_from_parts(dtype):
    rt = REAL_OF[dtype]
    np_real = np.float32 if rt == kl.float32 else np.float64
    re, im = R.standard_normal((2, 3)).astype(np_real), R.standard_normal((3,)).astype(np_real)
    close(kl.complex(re, im), re + 1j * im, 0, dtype)
    # the parts promote: float32 with float64 is complex128
    got = kl.complex(np.ones(2, np.float32), np.ones(2, np.float64))
    assert got.dtype == kl.complex128
    with pytest.raises(kl.Error, match=r"\[complex\]"):
        kl.complex(kl.asarray(crandn(2)), np.ones(2))


@pytest.mark.parametrize("dtype", COMPLEX)
def test_astype_between_real_and_complex(dtype):
    a = crandn((4,), NP_OF[dtype])
    t = kl.asarray(a)
    close(t.astype(REAL_OF[dtype]), a.real, 0, REAL_OF[dtype])
    close(t.astype(kl.float64), a.real.astype(np.float64), 0, kl.float64)
    other = kl.complex128 if dtype == kl.complex64 else kl.complex64
    close(t.astype(other), a.astype(NP_OF[other]), 0, other)
    x = R.standard_normal(4)
    close(kl.asarray(x).astype(dtype), x.astype(NP_OF[dtype]), 0, dtype)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_structural_ops_keep_complex_values(dtype):
    a = crandn((3, 4), NP_OF[dtype])
    b = crandn((2, 4), NP_OF[dtype])
    t = kl.asarray(a)
    close(t[1], a[1], 0, dtype)
    close(t[:, ::2], a[:, ::2], 0, dtype)
    close(t[::-1, 1:3], a[::-1, 1:3], 0, dtype)
    close(t.reshape(4, 3), a.reshape(4, 3), 0, dtype)
    close(t.T, a.T, 0, dtype)
    close(kl.transpose(t), a.T, 0, dtype)
    close(kl.concatenate([t, kl.asarray(b)]), np.concatenate([a, b]), 0, dtype)
    close(kl.stack([t, t]), np.stack([a, a]), 0, dtype)
    mask = a.real > 0
    close(kl.where(mask, t, 0), np.where(mask, a, 0), 0, dtype)
    close(kl.where(mask, t, 1j), np.where(mask, a, 1j), 0, dtype)
    close(kl.broadcast_to(kl.asarray(a[0]), (2, 4)), np.broadcast_to(a[0], (2, 4)), 0, dtype)


def test_equality_of_complex_tensors():
    a = np.array([1 + 2j, 3, 1j], np.complex64)
    b = np.array([1 + 2j, 3j, 1j], np.complex64)
    np.testing.assert_array_equal(np.asarray(kl.asarray(a) == kl.asarray(b)), a == b)
    np.testing.assert_array_equal(np.asarray(kl.asarray(a) != kl.asarray(b)), a != b)


@pytest.mark.parametrize(
    "name,call",
    [
        # the primitives' names: maximum is max, kl.max is reduce_max
        ("max", lambda z: kl.maximum(z, z)),
        ("min", lambda z: kl.minimum(z, z)),
        ("reduce_max", lambda z: kl.max(z)),
        ("max", lambda z: kl.clip(z, 0, 1)),
        ("sort", lambda z: kl.sort(z)),
        ("sort", lambda z: kl.argsort(z)),
        ("argmax", lambda z: kl.argmax(z)),
        ("cumsum", lambda z: kl.cumsum(z)),
        ("sign", lambda z: kl.sign(z)),
        ("lt", lambda z: z < z),
        ("ge", lambda z: kl.greater_equal(z, z)),
    ],
)
def test_unsupported_ops_raise_naming_the_op(name, call):
    z = kl.asarray(np.array([1 + 2j, 3 - 1j], np.complex64))
    with pytest.raises(kl.Error, match=rf"\[{name}\]"):
        call(z)


@pytest.mark.parametrize("name", ["floor", "ceil", "trunc"])
def test_rounding_complex_values_raises_naming_the_op(name):
    z = kl.asarray(np.array([1.5 + 2.7j, -3.2 - 1j], np.complex64))
    with pytest.raises(kl.Error, match=rf"\[{name}\]"):
        getattr(kl, name)(z)


def test_round_of_complex_rounds_both_parts_as_numpy():
    a = np.array([1.5 + 2.7j, -3.2 - 1j, 0.4 - 0.6j])
    close(kl.round(kl.asarray(a)), np.round(a), 0, kl.complex128)


@pytest.mark.parametrize("name", ["exp", "log", "sqrt", "sin", "tanh"])
def test_transcendental_functions_raise_or_match_numpy(name):
    """NumPy computes these for complex values; Kiln must either agree or refuse by name."""
    a = np.array([1 + 2j, -0.5 + 0.25j], np.complex128)
    try:
        got = getattr(kl, name)(kl.asarray(a))
    except kl.Error as e:
        assert f"[{name}]" in str(e), str(e)
        return
    close(got, getattr(np, name)(a), 1e-12, kl.complex128)


# ---- kiln.fft values ---------------------------------------------------------------


def as_kiln(x, dtype):
    """x (complex128 or float64 NumPy) rounded to dtype's precision, as NumPy and as Kiln."""
    np_dtype = {kl.float32: np.float32, kl.float64: np.float64}.get(dtype) or NP_OF[dtype]
    x = x.astype(np_dtype)
    return x, kl.asarray(x)


def complex_out(dtype):
    return {kl.float32: kl.complex64, kl.float64: kl.complex128}.get(dtype, dtype)


ONE_AXIS = ["fft", "ifft", "rfft", "irfft", "hfft", "ihfft"]
REAL_INPUT = {"rfft", "ihfft"}
REAL_OUTPUT = {"irfft", "hfft"}


def input_for(name, shape, dtype):
    """Inputs that name accepts in dtype: real for rfft/ihfft, complex otherwise."""
    if name in REAL_INPUT or name in {"rfftn", "rfft2"}:
        real = dtype if dtype in (kl.float32, kl.float64) else REAL_OF[dtype]
        return as_kiln(R.standard_normal(shape), real)
    cdtype = complex_out(dtype)
    return as_kiln(crandn(shape), cdtype)


def out_dtype(name, dtype):
    c = complex_out(dtype)
    return REAL_OF[c] if name in REAL_OUTPUT or name.startswith("irfft") else c


@pytest.mark.parametrize("dtype", [kl.float32, kl.float64])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("n", [None, 1, 5, 8, 11, 16])
@pytest.mark.parametrize("name", ONE_AXIS)
def test_one_axis_transforms_match_numpy(name, n, norm, dtype):
    for length in (7, 8):
        x, t = input_for(name, (3, length), dtype)
        want = getattr(np.fft, name)(x, n=n, norm=norm)
        close(getattr(fft, name)(t, n=n, norm=norm), want, TOL[dtype], out_dtype(name, dtype))
        # along axis 0 of the transpose: a non-contiguous input
        want0 = getattr(np.fft, name)(x.T, n=n, axis=0, norm=norm)
        close(getattr(fft, name)(t.T, n=n, axis=0, norm=norm), want0, TOL[dtype])


@pytest.mark.parametrize("dtype", [kl.float32, kl.float64])
@pytest.mark.parametrize("name", ONE_AXIS)
def test_one_axis_transforms_of_strided_views_and_batches(name, dtype):
    x, _ = input_for(name, (4, 6, 18), dtype)
    view = x[::2, 1:, ::3]  # NumPy strides, viewed by Kiln without a copy
    for axis in (0, 1, -1):
        want = getattr(np.fft, name)(view, axis=axis)
        close(getattr(fft, name)(kl.asarray(view), axis=axis), want, TOL[dtype])
        sliced = kl.asarray(x)[::2, 1:, ::3]  # Kiln's own strided slice
        want5 = getattr(np.fft, name)(view, 5, axis)
        close(getattr(fft, name)(sliced, axis=axis, n=5), want5, TOL[dtype])


@pytest.mark.parametrize("n", [None, 4, 5, 6, 7, 12, 13])
def test_irfft_ignores_the_imaginary_parts_numpy_ignores(n):
    """A spectrum that is not Hermitian: numpy drops the imaginary part of the zero frequency
    (and of n/2 for even n)."""
    for m in (4, 5):
        x = crandn((2, m))
        x[:, 0] += 3j
        close(fft.irfft(kl.asarray(x), n=n), np.fft.irfft(x, n=n), 1e-12, kl.float64)
        close(fft.hfft(kl.asarray(x), n=n), np.fft.hfft(x, n=n), 1e-12, kl.float64)


MANY_AXES = ["fftn", "ifftn", "rfftn", "irfftn", "fft2", "ifft2", "rfft2", "irfft2"]


SIZES_AND_AXES = [
    (None, None),
    ((5, 6), None),
    ((3, 8), (0, 2)),
    ((7, 4), (-1, 0)),
    (None, (1,)),
    ((9,), (1,)),
    ((4, 2, 5), (2, 0, 1)),
    (None, (0, 1)),
]
# The 2-d forms take exactly two axes (and two sizes).
MANY_AXES_CASES = [
    (name, s, axes)
    for name in MANY_AXES
    for s, axes in SIZES_AND_AXES
    if not name.endswith("2") or all(v is None or len(v) == 2 for v in (s, axes))
]


@pytest.mark.parametrize("dtype", [kl.float32, kl.float64])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("name,s,axes", MANY_AXES_CASES)
def test_many_axes_transforms_match_numpy(name, s, axes, norm, dtype):
    x, t = input_for(name, (4, 5, 6), dtype)
    kwargs = {"s": s, "norm": norm}
    if axes is not None:
        kwargs["axes"] = axes
    want = getattr(np.fft, name)(x, **kwargs)
    close(getattr(fft, name)(t, **kwargs), want, TOL[dtype] * 5, out_dtype(name, dtype))
    # a transposed input
    want_t = getattr(np.fft, name)(x.transpose(2, 0, 1), **kwargs)
    close(getattr(fft, name)(kl.transpose(t, (2, 0, 1)), **kwargs), want_t, TOL[dtype] * 5)


@pytest.mark.parametrize("length", [97, 1009, 1024])
def test_long_float32_transforms_keep_float32_accuracy(length):
    x = R.standard_normal((2, length)).astype(np.float32)
    z = crandn((2, length), np.complex64)
    close(fft.fft(kl.asarray(z)), np.fft.fft(z), 2e-6, kl.complex64)
    close(fft.rfft(kl.asarray(x)), np.fft.rfft(x), 2e-6, kl.complex64)
    close(fft.irfft(kl.asarray(z), n=length), np.fft.irfft(z, n=length), 2e-6, kl.float32)


def test_integer_and_bool_inputs_transform_as_float32():
    """As JAX (and as linalg.eig): complex64 results for integer input, where NumPy widens."""
    x = np.array([3, -1, 4, 1, -5, 9], np.int32)
    close(fft.fft(x), np.fft.fft(x), 1e-6, kl.complex64)
    close(fft.rfft(x.astype(np.int64)), np.fft.rfft(x), 1e-6, kl.complex64)
    close(fft.fft(x > 0), np.fft.fft(x > 0), 1e-6, kl.complex64)


def test_two_axis_forms_take_any_axes_as_numpy():
    z = crandn((4, 6, 3))
    close(fft.ifft2(kl.asarray(z), axes=(0,)), np.fft.ifft2(z, axes=(0,)))
    close(fft.fft2(kl.asarray(z), axes=(2, 0, 1)), np.fft.fft2(z, axes=(2, 0, 1)))


def test_round_trips():
    x = R.standard_normal((3, 10))
    z = crandn((3, 9))
    close(fft.ifft(fft.fft(kl.asarray(z))), z)
    close(fft.irfft(fft.rfft(kl.asarray(x)), n=10), x)
    close(fft.irfftn(fft.rfftn(kl.asarray(x)), s=x.shape), x)
    close(fft.ihfft(fft.hfft(kl.asarray(z), n=17)), np.fft.ihfft(np.fft.hfft(z, n=17)))


@pytest.mark.parametrize("n", [1, 2, 7, 8])
@pytest.mark.parametrize("d", [1.0, 0.25])
def test_frequencies_and_shifts_match_numpy(n, d):
    close(fft.fftfreq(n), np.fft.fftfreq(n), 1e-7, kl.float32)
    close(fft.fftfreq(n, d, dtype=kl.float64), np.fft.fftfreq(n, d), 1e-15, kl.float64)
    close(fft.rfftfreq(n, d=d), np.fft.rfftfreq(n, d), 1e-7, kl.float32)
    close(fft.rfftfreq(n, d, dtype=kl.float64), np.fft.rfftfreq(n, d), 1e-15, kl.float64)
    x = crandn((n, n + 1, 3))
    for axes in (None, 0, (1,), (0, 2), -1):
        close(fft.fftshift(kl.asarray(x), axes=axes), np.fft.fftshift(x, axes=axes), 0)
        close(fft.ifftshift(kl.asarray(x), axes=axes), np.fft.ifftshift(x, axes=axes), 0)


def test_fft_errors_are_kiln_errors():
    z = kl.asarray(crandn((4, 6)))
    x = kl.asarray(R.standard_normal((4, 6)))
    with pytest.raises(kl.Error, match=r"\[fft\]"):
        fft.fft(z, n=0)
    with pytest.raises(kl.Error, match=r"\[ifft\]"):
        fft.ifft(z, n=-3)
    with pytest.raises(kl.Error, match=r"\[rfft\] complex input"):
        fft.rfft(z)
    with pytest.raises(kl.Error, match=r"\[rfftn\]"):
        fft.rfftn(z)
    with pytest.raises(kl.Error, match=r"\[ihfft\]"):
        fft.ihfft(z)
    with pytest.raises(kl.Error, match=r"\[fftn\]"):
        fft.fftn(z, axes=(0, 0))
    with pytest.raises(kl.Error, match=r"\[fftn\]"):
        fft.fftn(z, axes=(1, -1))
    with pytest.raises(kl.Error, match=r"\[fftn\]"):
        fft.fftn(z, s=(4, 4), axes=(0,))
    with pytest.raises(kl.Error, match=r"\[fft\]"):
        fft.fft(z, axis=2)
    with pytest.raises(kl.Error, match=r"\[fft\]"):
        fft.fft(z, norm="bogus")
    with pytest.raises(kl.Error, match=r"\[irfft\]"):
        fft.irfft(kl.asarray(crandn((3, 1))))  # default n = 2 (1 - 1) = 0
    with pytest.raises(kl.Error, match=r"\[fft\]"):
        fft.fft(kl.asarray(np.float64(1.0)))  # a 0-d input has no axis
    with pytest.raises(kl.Error, match=r"\[fft2\]"):
        fft.fft2(x[0])  # one axis only
    with pytest.raises(kl.Error):
        fft.fftfreq(0)


# ---- derivatives ---------------------------------------------------------------------


def weights(shape):
    return kl.asarray(R.standard_normal(shape))


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("n", [None, 5, 9])
@pytest.mark.parametrize("complex_input", [False, True])
def test_grad_of_fft_losses_matches_finite_differences(complex_input, n, norm):
    x = crandn((2, 7)) if complex_input else R.standard_normal((2, 7))
    m = n or 7
    w, w1, w2 = weights((2, m)), weights((2, m)), weights((2, m))
    check_grad(lambda v: kl.sum(kl.abs(fft.fft(v, n=n, norm=norm)) ** 2 * w), x)
    check_grad(
        lambda v: kl.sum(
            kl.real(fft.ifft(v, n=n, norm=norm)) * w1 + kl.imag(fft.ifft(v, n=n, norm=norm)) * w2
        ),
        x,
    )
    # the value itself
    want = np.sum(np.abs(np.fft.fft(x, n=n, norm=norm)) ** 2 * np.asarray(w))
    assert math.isclose(
        scalar(kl.sum(kl.abs(fft.fft(kl.asarray(x), n=n, norm=norm)) ** 2 * w)), want, rel_tol=1e-12
    )


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("n", [None, 6, 9])
def test_grad_of_rfft_and_ihfft_matches_finite_differences(n, norm):
    x = R.standard_normal((2, 8))
    m = (n or 8) // 2 + 1
    w1, w2 = weights((2, m)), weights((2, m))
    for f in (fft.rfft, fft.ihfft):
        check_grad(
            lambda v: kl.sum(kl.real(f(v, n, norm=norm)) * w1 + kl.imag(f(v, n, norm=norm)) * w2),
            x,
        )
        check_grad(lambda v: kl.sum(kl.abs(f(v, n, norm=norm)) ** 2 * w1), x)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("n", [None, 6, 7, 11])
def test_grad_of_irfft_and_hfft_matches_finite_differences(n, norm):
    """Complex input to a real output: the gradient is d/dRe - i d/dIm, including the zero
    derivative of the ignored imaginary parts."""
    z = crandn((2, 5))
    m = n or 8
    w = weights((2, m))
    for f in (fft.irfft, fft.hfft):
        check_grad(lambda v: kl.sum(f(v, n, norm=norm) * w), z)
        check_grad(lambda v: kl.sum(f(v, n, norm=norm) ** 3 * w), z)


@pytest.mark.parametrize("norm", [None, "ortho"])
def test_grad_of_many_axes_transforms_matches_finite_differences(norm):
    z = crandn((3, 4, 2))
    x = R.standard_normal((3, 4, 2))
    w = weights((5, 4, 2))
    check_grad(lambda v: kl.sum(kl.abs(fft.fftn(v, s=(5, 4), axes=(0, 1), norm=norm)) ** 2 * w), z)
    check_grad(lambda v: kl.sum(kl.abs(fft.ifftn(v, s=(5, 4), axes=(0, 1), norm=norm)) * w), x)
    wr = weights((3, 4, 3))
    check_grad(lambda v: kl.sum(kl.real(fft.rfftn(v, s=(4, 4), norm=norm)) * wr), x)
    check_grad(lambda v: kl.sum(kl.imag(fft.rfft2(v, s=(4, 5), norm=norm)) ** 2 * wr), x)
    wi = weights((3, 4, 5))
    check_grad(lambda v: kl.sum(fft.irfftn(v, s=(4, 5), axes=(1, 2), norm=norm) ** 2 * wi), z)
    check_grad(lambda v: kl.sum(fft.irfft2(v, s=(4, 5), norm=norm) * wi), z)


def test_grad_follows_jax_convention_analytically():
    """|c z|^2 = |c|^2 (x^2 + y^2): d/dx - i d/dy = 2 |c|^2 conj(z)."""
    z = crandn((3,))
    got = kl.grad(lambda v: kl.sum(kl.abs(v * (1 + 2j)) ** 2))(z)
    close(got, 10 * np.conj(z), 1e-12, kl.complex128)
    got = kl.grad(lambda v: kl.sum(kl.real(v) * 3 + kl.imag(v) * 5))(z)
    close(got, np.full(3, 3 - 5j), 0, kl.complex128)


def test_jit_with_complex_python_scalars():
    z = crandn((3,))
    close(kl.jit(lambda v: v * 1j + 2)(z), z * 1j + 2, 1e-15, kl.complex128)
    got = kl.jit(lambda v: v * (2 - 1j))(np.ones(2, np.float32))
    close(got, np.full(2, 2 - 1j), 0, kl.complex64)


def test_grad_through_complex_arithmetic_matches_finite_differences():
    z = crandn((4,))
    c = kl.asarray(crandn((4,)))
    check_grad(lambda v: kl.sum(kl.abs(v * c + kl.conj(v) / c) ** 2), z)
    check_grad(lambda v: kl.sum(kl.angle(v) * kl.real(c) + kl.imag(v * v)), z)
    check_grad(lambda v: kl.real(kl.sum(v @ kl.conj(v)) * kl.sum(v * v)), z)
    x = R.standard_normal((3,))
    check_grad(lambda v: kl.abs(kl.sum(kl.complex(v, v**2) * c[:3])), x)


def fd_jvp(f, x, t, h=1e-6):
    return (np.asarray(f(kl.asarray(x + h * t))) - np.asarray(f(kl.asarray(x - h * t)))) / (2 * h)


def test_vjp_of_holomorphic_maps_is_the_transposed_jacobian():
    """JAX's convention: vjp(f)(ct) = ct^T J, linear in ct (no conjugation) for holomorphic f."""
    z, ct = crandn((6,)), crandn((9,))
    for f, jacobian in (
        (lambda v: fft.fft(v, n=9), np.fft.fft(np.eye(6), n=9, axis=0)),
        (
            lambda v: fft.ifft(v, n=9, norm="ortho"),
            np.fft.ifft(np.eye(6), n=9, axis=0, norm="ortho"),
        ),
    ):
        out, pullback = kl.vjp(f, kl.asarray(z))
        got = pullback(kl.asarray(ct))
        got = got[0] if isinstance(got, tuple) else got
        close(got, jacobian.T @ ct, 1e-12, kl.complex128)


def test_grad_keeps_the_input_precision():
    x32 = np.ones(4, np.float32)
    assert kl.grad(lambda v: kl.sum(kl.abs(fft.rfft(v)) ** 2))(x32).dtype == kl.float32
    c64 = np.full(4, 1 - 1j, np.complex64)
    assert kl.grad(lambda v: kl.sum(kl.abs(fft.fft(v)) ** 2))(c64).dtype == kl.complex64
    assert kl.grad(lambda v: kl.sum(kl.real(kl.linalg.eigvals(v))))(np.eye(2)).dtype == kl.float64


def test_jvp_matches_finite_differences():
    x, tx = R.standard_normal((2, 7)), R.standard_normal((2, 7))
    f = lambda v: kl.abs(fft.rfft(v, n=10)) ** 2
    out, tan = kl.jvp(f, (kl.asarray(x),), (kl.asarray(tx),))
    close(out, np.abs(np.fft.rfft(x, n=10)) ** 2, 1e-12)
    close(tan, fd_jvp(f, x, tx), 1e-6)
    z, tz = crandn((2, 6)), crandn((2, 6))
    for g in (
        lambda v: fft.fft(v) * fft.fft(v),
        lambda v: kl.abs(fft.ifft(v, norm="ortho")) ** 3,
        lambda v: fft.irfft(v * v, n=9),
        lambda v: fft.fftn(kl.conj(v), s=(3, 4)),
    ):
        out, tan = kl.jvp(g, (kl.asarray(z),), (kl.asarray(tz),))
        close(out, np.asarray(g(kl.asarray(z))), 1e-12)
        close(tan, fd_jvp(g, z, tz), 1e-6)


def test_vmap_of_transforms_matches_a_loop():
    z = crandn((4, 3, 6))
    x = R.standard_normal((4, 3, 6))
    close(kl.vmap(fft.fft)(kl.asarray(z)), np.stack([np.fft.fft(b) for b in z]))
    close(
        kl.vmap(lambda v: fft.rfft(v, n=8, axis=0), in_axes=2)(kl.asarray(x)),
        np.stack([np.fft.rfft(x[:, :, i], n=8, axis=0) for i in range(6)]),
    )
    close(
        kl.vmap(lambda v: fft.irfftn(v, s=(4, 5)))(kl.asarray(z)),
        np.stack([np.fft.irfftn(b, s=(4, 5)) for b in z]),
    )
    close(
        kl.vmap(kl.grad(lambda v: kl.sum(kl.abs(fft.fft(v)) ** 3)))(kl.asarray(z)),
        np.stack([np.asarray(kl.grad(lambda v: kl.sum(kl.abs(fft.fft(v)) ** 3))(b)) for b in z]),
    )


def test_jit_of_transforms_matches_eager():
    x = R.standard_normal((3, 10))
    w = crandn((6,))

    def filt(v, w):
        return fft.irfft(fft.rfft(v) * w, n=10)

    close(kl.jit(filt)(x, w), np.fft.irfft(np.fft.rfft(x) * w, n=10))
    close(kl.jit(filt)(x, w), np.asarray(filt(kl.asarray(x), kl.asarray(w))))
    z = crandn((4, 5))
    g = kl.jit(lambda v: fft.fftshift(fft.fft2(v, norm="ortho")) * 1j)
    close(g(z), np.fft.fftshift(np.fft.fft2(z, norm="ortho")) * 1j)
    loss = lambda v: kl.sum(kl.abs(fft.fft(v)) ** 2 * kl.arange(5.0))
    close(kl.jit(kl.grad(loss))(z), np.asarray(kl.grad(loss)(kl.asarray(z))), 1e-12)
    assert kl.jit(kl.grad(loss))(z).dtype == kl.complex128


def test_hessian_vector_product_matches_finite_differences_of_the_gradient():
    x, v = R.standard_normal((9,)), R.standard_normal((9,))
    f = lambda u: kl.sum(kl.abs(fft.rfft(u)) ** 3)
    g = kl.grad(f)
    hvp = kl.grad(lambda u: kl.sum(g(u) * kl.asarray(v)))(kl.asarray(x))
    h = 1e-5
    want = (np.asarray(g(kl.asarray(x + h * v))) - np.asarray(g(kl.asarray(x - h * v)))) / (2 * h)
    close(hvp, want, 1e-6)
    _, fwd = kl.jvp(g, (kl.asarray(x),), (kl.asarray(v),))
    close(fwd, want, 1e-6)


def test_grad_of_grad_with_a_complex_input():
    z = crandn((5,))
    a, b = kl.asarray(R.standard_normal(5)), kl.asarray(R.standard_normal(5))
    g = kl.grad(lambda u: kl.sum(kl.abs(fft.fft(u)) ** 3))
    check_grad(lambda u: kl.sum(kl.real(g(u)) * a + kl.imag(g(u)) * b), z, 1e-5)


# ---- linalg.eig ----------------------------------------------------------------------


def sort_eigenvalues(w):
    w = np.asarray(w)
    order = np.lexsort((w.imag, np.round(w.real, 5)), axis=-1)
    return np.take_along_axis(w, order, -1)


def check_eig(a, w, v, tol):
    a, w, v = np.asarray(a), np.asarray(w), np.asarray(v)
    np.testing.assert_allclose(a @ v, v * w[..., None, :], rtol=tol, atol=tol)
    np.testing.assert_allclose(np.linalg.norm(v, axis=-2), 1, rtol=tol, atol=tol)
    np.testing.assert_allclose(
        sort_eigenvalues(w), sort_eigenvalues(np.linalg.eigvals(a)), rtol=tol, atol=tol
    )


@pytest.mark.parametrize(
    "np_dtype,want,tol",
    [
        (np.float32, kl.complex64, 1e-4),
        (np.float64, kl.complex128, 1e-10),
        (np.complex64, kl.complex64, 1e-4),
        (np.complex128, kl.complex128, 1e-10),
    ],
)
@pytest.mark.parametrize("shape", [(1, 1), (5, 5), (3, 4, 4)])
def test_eig_matches_numpy(shape, np_dtype, want, tol):
    a = crandn(shape) if np.issubdtype(np_dtype, np.complexfloating) else R.standard_normal(shape)
    a = a.astype(np_dtype)
    w, v = kl.linalg.eig(a)
    assert w.dtype == want and v.dtype == want
    assert w.shape == shape[:-1] and v.shape == shape
    check_eig(a, w, v, tol)
    close(kl.linalg.eigvals(a), np.asarray(w), 0, want)


def test_jvp_of_eigenvalues_matches_finite_differences():
    a, t = with_a_conjugate_pair(), R.standard_normal((4, 4))
    f = lambda m: kl.stack([kl.sum(kl.abs(kl.linalg.eigvals(m)) ** 3), kl.prod(kl.real(m))])
    _, tan = kl.jvp(f, (kl.asarray(a),), (kl.asarray(t),))
    close(tan, fd_jvp(f, a, t), 1e-6)
    z, tz = crandn((3, 3)), crandn((3, 3))
    g = lambda m: kl.sum(kl.square(kl.linalg.eigvals(m)))  # trace(m^2), holomorphic
    out, tan = kl.jvp(g, (kl.asarray(z),), (kl.asarray(tz),))
    close(out, np.trace(z @ z), 1e-12)
    close(tan, 2 * np.trace(z @ tz), 1e-10)


def test_eig_under_vmap_and_jit_matches_eager():
    a = R.standard_normal((3, 4, 4))
    w, v = kl.linalg.eig(a)
    wv, vv = kl.vmap(kl.linalg.eig)(a)
    close(wv, np.asarray(w), 1e-12, kl.complex128)
    close(vv, np.asarray(v), 1e-12, kl.complex128)
    wj, vj = kl.jit(kl.linalg.eig)(a)
    close(wj, np.asarray(w), 1e-12, kl.complex128)
    close(vj, np.asarray(v), 1e-12, kl.complex128)
    close(kl.jit(kl.linalg.eigvals)(a[0]), np.asarray(w)[0], 1e-12, kl.complex128)


def test_eig_of_integers_is_complex64():
    a = np.array([[0, -1], [1, 0]], np.int32)
    w = kl.linalg.eigvals(a)
    assert w.dtype == kl.complex64
    np.testing.assert_allclose(sort_eigenvalues(w), [-1j, 1j], atol=1e-6)


@pytest.mark.parametrize("theta", [0.3, 1.0, 2.5])
def test_eig_of_a_rotation(theta):
    c, s = math.cos(theta), math.sin(theta)
    w, v = kl.linalg.eig(np.array([[c, -s], [s, c]]))
    np.testing.assert_allclose(
        sort_eigenvalues(w), [np.exp(-1j * theta), np.exp(1j * theta)], atol=1e-14
    )
    check_eig(np.array([[c, -s], [s, c]]), w, v, 1e-12)
    # a triangular matrix's eigenvalues are its diagonal
    t = np.triu(crandn((4, 4)))
    np.testing.assert_allclose(
        sort_eigenvalues(kl.linalg.eigvals(t)), sort_eigenvalues(np.diag(t)), atol=1e-12
    )


def test_eig_of_nan_is_nan_and_non_square_is_an_error():
    a = R.standard_normal((2, 3, 3))
    a[1, 0, 2] = np.nan
    w, v = kl.linalg.eig(a)
    assert np.all(np.isnan(np.asarray(w)[1])) and np.all(np.isnan(np.asarray(v)[1]))
    check_eig(a[0], np.asarray(w)[0], np.asarray(v)[0], 1e-10)
    with pytest.raises(kl.Error, match=r"\[eig"):
        kl.linalg.eig(np.zeros((2, 3)))
    with pytest.raises(kl.Error, match=r"\[eig"):
        kl.linalg.eigvals(np.zeros((3, 2)))
    with pytest.raises(kl.Error, match=r"\[eig"):
        kl.linalg.eig(np.zeros(3))


def with_a_conjugate_pair():
    """A real 4x4 matrix with eigenvalues 1, 2.5 and 0.5 +- 2i, well apart (so that their
    derivatives are well defined)."""
    block = np.zeros((4, 4))
    block[0, 0], block[1, 1] = 1.0, 2.5
    block[2:, 2:] = [[0.5, 2.0], [-2.0, 0.5]]
    q = R.standard_normal((4, 4)) + 3 * np.eye(4)
    return q @ block @ np.linalg.inv(q)


def test_grad_of_eigenvalue_functions_matches_finite_differences():
    a = with_a_conjugate_pair()
    np.testing.assert_allclose(
        sort_eigenvalues(np.linalg.eigvals(a)), [0.5 - 2j, 0.5 + 2j, 1, 2.5], atol=1e-12
    )
    eigvals = kl.linalg.eigvals
    check_grad(lambda m: kl.sum(kl.real(eigvals(m)) ** 2), a)
    check_grad(lambda m: kl.sum(kl.imag(eigvals(m)) ** 2), a)
    check_grad(lambda m: kl.sum(kl.abs(eigvals(m)) ** 3), a)
    z = crandn((4, 4))
    check_grad(lambda m: kl.sum(kl.real(eigvals(m)) ** 2 + kl.imag(eigvals(m))), z)
    check_grad(lambda m: kl.sum(kl.abs(kl.linalg.eig(m)[0]) ** 2), z)


def test_grad_of_phase_independent_eigenvector_functions_matches_finite_differences():
    rows = kl.asarray(R.standard_normal((4, 1)))

    def loss(m):
        w, v = kl.linalg.eig(m)
        # |v_ik|^2 weighted by row and by the column's eigenvalue: independent of each column's
        # phase and of the order of the eigenvalues
        return kl.sum(kl.abs(v) ** 2 * rows * kl.real(w)[None, :])

    check_grad(loss, with_a_conjugate_pair(), 1e-5)
    check_grad(loss, crandn((4, 4)), 1e-5)


def test_python_int_next_to_a_complex_tensor_is_rounded_once_as_next_to_a_float():
    z = kl.asarray(np.array([1 + 2j], np.complex64))
    got = np.asarray(z * 2**64)
    np.testing.assert_allclose(got, np.array([1 + 2j], np.complex64) * np.float32(2.0**64))
    assert (z * 2**64).dtype == kl.complex64


@pytest.mark.parametrize("ord", [None, 1, 3, np.inf])
def test_vector_norms_of_complex_values_match_numpy(ord):
    z = np.random.default_rng(7).standard_normal(6) + 1j * np.random.default_rng(8).standard_normal(
        6
    )
    np.testing.assert_allclose(
        float(kl.linalg.norm(kl.asarray(z), ord=ord)), np.linalg.norm(z, ord=ord), rtol=1e-12
    )


def test_matrix_norms_of_complex_values_match_numpy_or_raise():
    m = np.random.default_rng(9).standard_normal((3, 4)) * (1 + 0.5j)
    for ord in ("fro", 1, -1, np.inf, -np.inf):
        np.testing.assert_allclose(
            float(kl.linalg.norm(kl.asarray(m), ord=ord)), np.linalg.norm(m, ord=ord), rtol=1e-12
        )
    with pytest.raises(kl.Error, match=r"\[norm\]"):
        kl.linalg.norm(kl.asarray(m), ord=2)


def test_nan_to_num_of_complex_values_matches_numpy():
    z = np.array([complex(np.nan, np.inf), complex(1, -np.inf), complex(np.inf, 2)])
    np.testing.assert_array_equal(
        np.asarray(kl.nan_to_num(kl.asarray(z), nan=0.0, posinf=5.0, neginf=-5.0)),
        np.nan_to_num(z, nan=0.0, posinf=5.0, neginf=-5.0),
    )
