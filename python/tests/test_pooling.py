"""Pooling and resampling against PyTorch 1.13's torch.nn.functional: values, indices and float64
gradients (PyTorch's autograd), with PyTorch's keyword arguments."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln as kl

R = np.random.default_rng(7)


def same(got, expected, tol=1e-12):
    expected = expected.detach().numpy()
    got = np.asarray(got)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    if np.issubdtype(expected.dtype, np.integer):
        np.testing.assert_array_equal(got, expected)
    else:
        np.testing.assert_allclose(got, expected, rtol=tol, atol=tol, equal_nan=True)


def check(name, x, tol=1e-12, **kw):
    """Values and the float64 gradient of a weighted sum, against PyTorch."""
    t = torch.from_numpy(x).requires_grad_()
    expected = getattr(F, name)(t, **kw)
    same(getattr(kl, name)(x, **kw), expected, tol)
    w = R.standard_normal(tuple(expected.shape))
    (expected * torch.from_numpy(w)).sum().backward()
    grad = kl.grad(lambda a: kl.sum(getattr(kl, name)(a, **kw) * w))(x)
    same(grad, t.grad, tol)


X1 = R.standard_normal((2, 3, 11))
X2 = R.standard_normal((2, 3, 7, 8))
X3 = R.standard_normal((2, 2, 5, 6, 7))

MAX_OPTIONS = [
    dict(kernel_size=3, stride=2, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=2, stride=1, dilation=2),
    dict(kernel_size=(3, 2), stride=(2, 3), padding=(1, 1), dilation=(2, 1), ceil_mode=True),
    # The last window would start in the right padding: ceil_mode drops it.
    dict(kernel_size=2, stride=2, padding=1, ceil_mode=True),
]


@pytest.mark.parametrize("kw", MAX_OPTIONS)
def test_max_pool2d_options(kw):
    check("max_pool2d", X2, **kw)
    values, indices = kl.max_pool2d(X2, return_indices=True, **kw)
    expected, expected_indices = F.max_pool2d(torch.from_numpy(X2), return_indices=True, **kw)
    same(values, expected)
    same(indices, expected_indices)
    assert indices.dtype == kl.int64


AVG_OPTIONS = [
    dict(kernel_size=3, stride=2, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
    dict(kernel_size=3, padding=1, divisor_override=5),
    dict(kernel_size=(3, 2), stride=(2, 3), padding=(1, 1), ceil_mode=True),
    dict(kernel_size=2, stride=2, padding=1, ceil_mode=True),
]


@pytest.mark.parametrize("kw", AVG_OPTIONS)
def test_avg_pool2d_options(kw):
    check("avg_pool2d", X2, **kw)


def test_max_pool_ties_nan_and_infinities_pick_pytorchs_element():
    x = np.array([[[[1, 1, np.nan, 2], [np.nan, 0, 3, 3], [-np.inf, -np.inf, 5, 5]]]])
    for kw in [
        dict(kernel_size=2, stride=1, ceil_mode=True),
        dict(kernel_size=3, stride=2, padding=1, return_indices=True),
    ]:
        kw["return_indices"] = True
        for got, expected in zip(kl.max_pool2d(x, **kw), F.max_pool2d(torch.from_numpy(x), **kw)):
            same(got, expected)
    # All -inf: the first element inside the input, never the padding.
    x = np.full((1, 1, 3, 3), -np.inf)
    for got, expected in zip(
        kl.max_pool2d(x, 2, padding=1, ceil_mode=True, return_indices=True),
        F.max_pool2d(torch.from_numpy(x), 2, padding=1, ceil_mode=True, return_indices=True),
    ):
        same(got, expected)


def test_max_pool_window_wholly_in_the_padding_is_minus_infinity():
    # Dilation can step over the input: such a window has no element, so its maximum is -inf
    # (PyTorch's value and index), and the other windows' gradients are unchanged.
    for name, x, kw in [
        ("max_pool1d", np.ones((1, 1, 1)), dict(kernel_size=2, stride=1, padding=1, dilation=2)),
        (
            "max_pool2d",
            R.standard_normal((1, 2, 1, 3)),
            dict(kernel_size=2, stride=1, padding=1, dilation=(2, 1)),
        ),
    ]:
        got = getattr(kl, name)(x, return_indices=True, **kw)
        expected = getattr(F, name)(torch.from_numpy(x), return_indices=True, **kw)
        assert np.isneginf(np.asarray(got[0])).any()
        same(got[0], expected[0])
        same(got[1], expected[1])
        finite = np.isfinite(expected[0].numpy())
        grad = kl.grad(lambda a: kl.sum(kl.where(finite, getattr(kl, name)(a, **kw), 0.0)))(x)
        t = torch.from_numpy(x).requires_grad_()
        getattr(F, name)(t, **kw)[torch.from_numpy(finite)].sum().backward()
        same(grad, t.grad)


@pytest.mark.parametrize(
    "name,kw",
    [
        ("max_pool1d", dict(kernel_size=3, stride=2, padding=1)),
        ("max_pool1d", dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, dilation=2)),
        ("avg_pool1d", dict(kernel_size=3, stride=2, padding=1)),
        (
            "avg_pool1d",
            dict(kernel_size=4, stride=3, padding=2, ceil_mode=True, count_include_pad=False),
        ),
        ("adaptive_max_pool1d", dict(output_size=4)),
        ("adaptive_avg_pool1d", dict(output_size=4)),
    ],
)
def test_1d_pools(name, kw):
    check(name, X1, **kw)


@pytest.mark.parametrize(
    "name,kw",
    [
        (
            "max_pool3d",
            dict(kernel_size=(2, 3, 2), stride=(1, 2, 2), padding=(1, 1, 0), ceil_mode=True),
        ),
        ("max_pool3d", dict(kernel_size=2, dilation=(1, 2, 1))),
        (
            "avg_pool3d",
            dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
        ),
        ("avg_pool3d", dict(kernel_size=(2, 3, 2), divisor_override=3)),
        ("adaptive_max_pool3d", dict(output_size=(2, 4, 3))),
        ("adaptive_avg_pool3d", dict(output_size=(2, 4, 3))),
    ],
)
def test_3d_pools(name, kw):
    check(name, X3, **kw)


@pytest.mark.parametrize("size", [(3, 5), (7, 8), (10, 3)])
def test_adaptive_max_pool2d(size):
    check("adaptive_max_pool2d", X2, output_size=size)
    for got, expected in zip(
        kl.adaptive_max_pool2d(X2, size, return_indices=True),
        F.adaptive_max_pool2d(torch.from_numpy(X2), size, return_indices=True),
    ):
        same(got, expected)


def test_indices_of_1d_and_3d_max_pools():
    for name, x, kw in [
        ("max_pool1d", X1, dict(kernel_size=3, stride=2, ceil_mode=True)),
        ("max_pool3d", X3, dict(kernel_size=3, stride=2, padding=1)),
        ("adaptive_max_pool1d", X1, dict(output_size=5)),
        ("adaptive_max_pool3d", X3, dict(output_size=(3, 2, 4))),
    ]:
        got = getattr(kl, name)(x, return_indices=True, **kw)
        expected = getattr(F, name)(torch.from_numpy(x), return_indices=True, **kw)
        same(got[0], expected[0])
        same(got[1], expected[1])


def test_composite_pools_under_jit_and_vmap():
    def f(x):
        return kl.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True) + kl.avg_pool2d(
            x, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False
        )

    x = X2.astype(np.float32)
    eager = np.asarray(f(x))
    np.testing.assert_allclose(np.asarray(kl.jit(f)(x)), eager, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(kl.vmap(f)(x[:, None])), eager[:, None], rtol=1e-6, atol=1e-6
    )


def test_pooling_errors():
    with pytest.raises(kl.Error, match=r"\[avg_pool2d\] padding larger than half the kernel"):
        kl.avg_pool2d(X2, 2, padding=2, ceil_mode=True)
    with pytest.raises(kl.Error, match=r"\[max_pool3d\] input must have rank 5"):
        kl.max_pool3d(X2, 2)
    with pytest.raises(kl.Error, match=r"\[max_pool1d\] output size below 1"):
        kl.max_pool1d(X1, 4, dilation=4)
    with pytest.raises(kl.Error, match=r"\[avg_pool2d\] divisor_override of 0"):
        kl.avg_pool2d(X2, 2, divisor_override=0)
    with pytest.raises(kl.Error, match=r"\[adaptive_max_pool2d\] non-positive output size"):
        kl.adaptive_max_pool2d(X2, (0, 2))
    with pytest.raises(kl.Error, match=r"\[max_pool2d\] non-positive kernel, stride or dilation"):
        kl.max_pool2d(X2, 2, dilation=0)
    # 1-d pooling by the 2-d primitive: the errors still name the 1-d call and its sizes.
    with pytest.raises(
        kl.Error,
        match=r"\[max_pool1d\] padding larger than half the kernel: " r"got padding 2 for kernel 2",
    ):
        kl.max_pool1d(X1, 2, padding=2)
    with pytest.raises(kl.Error, match=r"\[avg_pool1d\] output size below 1"):
        kl.avg_pool1d(X1, 12)
    with pytest.raises(kl.Error, match=r"\[max_pool1d\] size overflows"):
        kl.max_pool1d(X1, 2, stride=2**63 - 1, ceil_mode=True)
    with pytest.raises(kl.Error, match=r"\[adaptive_max_pool1d\] window table too large"):
        kl.adaptive_max_pool1d(X1, 2**60)  # before: a loop over 2^60 windows
    with pytest.raises(kl.Error, match=r"\[max_pool1d\] window table too large"):
        kl.max_pool1d(X1, 2**60, padding=2**59, ceil_mode=True)


@pytest.mark.parametrize(
    "kw",
    [
        dict(kernel_size=3),
        dict(kernel_size=(2, 3), dilation=(2, 1), padding=(3, 1), stride=(2, 3)),
    ],
)
def test_unfold_and_fold(kw):
    check("unfold", X2, **kw)
    cols = F.unfold(torch.from_numpy(X2), **kw).detach().numpy()
    check("fold", cols, output_size=(7, 8), **kw)


def test_pixel_shuffle_and_unshuffle():
    check("pixel_shuffle", R.standard_normal((2, 12, 3, 4)), upscale_factor=2)
    check("pixel_unshuffle", X2[:, :, :6, :], downscale_factor=2)


def test_unfold_fold_and_shuffle_errors():
    with pytest.raises(kl.Error, match=r"\[fold\] input does not match the windows"):
        kl.fold(np.ones((1, 9, 5)), (4, 4), kernel_size=3)
    with pytest.raises(kl.Error, match=r"\[unfold\] output size below 1"):
        kl.unfold(X2, kernel_size=9)
    # PyTorch's rule: every spatial axis non-empty, even when the padding would make windows.
    with pytest.raises(kl.Error, match=r"\[unfold\] empty spatial axis"):
        kl.unfold(np.ones((1, 1, 0, 4)), kernel_size=2, padding=1)
    # Sizes whose arithmetic overflows int64, and tables larger than memory, are Errors.
    with pytest.raises(kl.Error, match=r"\[unfold\] size overflows"):
        kl.unfold(X2, kernel_size=2, padding=2**62)
    with pytest.raises(kl.Error, match=r"\[fold\] size overflows"):
        kl.fold(np.ones((1, 1, 1)), (2**40, 2**40), kernel_size=1, stride=2**40)
    with pytest.raises(kl.Error, match=r"\[pixel_shuffle\] channels not divisible"):
        kl.pixel_shuffle(X2, 2)
    with pytest.raises(kl.Error, match=r"\[pixel_unshuffle\] image not divisible"):
        kl.pixel_unshuffle(X2, 2)


@pytest.mark.parametrize(
    "kw",
    [
        dict(size=(5, 11), mode="bicubic"),
        dict(size=(5, 11), mode="bicubic", align_corners=True),
        dict(scale_factor=1.7, mode="bicubic"),
        dict(size=(7, 3), mode="bicubic"),
        dict(size=(5, 11), mode="nearest-exact"),
        dict(scale_factor=1.7, mode="nearest-exact"),
        dict(size=(3, 5), mode="area"),
        dict(scale_factor=0.6, mode="area"),
    ],
)
def test_interpolate_modes(kw):
    check("interpolate", X2, **kw)
    x = X2.astype(np.float32)
    same(kl.interpolate(x, **kw), F.interpolate(torch.from_numpy(x), **kw), tol=1e-5)


def test_interpolate_mode_errors():
    with pytest.raises(kl.Error, match=r"\[interpolate\] unknown mode: got 'cubic'"):
        kl.interpolate(X2, size=(3, 3), mode="cubic")
    with pytest.raises(kl.Error, match=r"\[interpolate\] align_corners with a mode other"):
        kl.interpolate(X2, size=(3, 3), mode="area", align_corners=True)


@pytest.mark.parametrize(
    "x,kw",
    [
        (X1, dict(size=5)),
        (X1, dict(size=22)),
        (X1, dict(scale_factor=1.7)),
        (X1, dict(scale_factor=0.6)),
        (X1, dict(size=7, mode="nearest-exact")),
        (X1, dict(scale_factor=1.7, mode="nearest-exact")),
        (X1, dict(size=17, mode="linear")),
        (X1, dict(size=17, mode="linear", align_corners=True)),
        (X1, dict(size=4, mode="linear")),
        (X1, dict(scale_factor=2.5, mode="linear")),
        (X1, dict(scale_factor=0.6, mode="linear", align_corners=True)),
        (X1, dict(size=4, mode="area")),
        (X1, dict(scale_factor=0.7, mode="area")),
        (X3, dict(size=(3, 8, 4))),
        (X3, dict(scale_factor=1.5)),
        (X3, dict(scale_factor=(1.5, 0.7, 2.2))),
        (X3, dict(size=(7, 4, 9), mode="nearest-exact")),
        (X3, dict(scale_factor=(0.6, 1.3, 1.7), mode="nearest-exact")),
        (X3, dict(size=(7, 4, 9), mode="trilinear")),
        (X3, dict(size=(7, 4, 9), mode="trilinear", align_corners=True)),
        (X3, dict(size=(1, 6, 3), mode="trilinear", align_corners=True)),
        (X3, dict(scale_factor=1.7, mode="trilinear")),
        (X3, dict(scale_factor=(0.6, 1.3, 2.5), mode="trilinear")),
        (X3, dict(scale_factor=(0.6, 1.3, 2.5), mode="trilinear", align_corners=True)),
        (X3, dict(size=(3, 4, 5), mode="area")),
        (X3, dict(scale_factor=0.6, mode="area")),
    ],
)
def test_interpolate_1d_and_3d(x, kw):
    check("interpolate", x, **kw)
    x32 = x.astype(np.float32)
    same(kl.interpolate(x32, **kw), F.interpolate(torch.from_numpy(x32), **kw), tol=1e-5)


def test_interpolate_1d_and_3d_under_jit_and_vmap():
    f = lambda a: kl.interpolate(a, scale_factor=(0.6, 1.3, 2.5), mode="trilinear")
    same(
        kl.jit(f)(X3),
        F.interpolate(torch.from_numpy(X3), scale_factor=(0.6, 1.3, 2.5), mode="trilinear"),
    )
    g = lambda a: kl.interpolate(a, size=17, mode="linear", align_corners=True)
    xs = np.stack([X1, -2 * X1])
    batched = np.asarray(kl.vmap(g)(xs))
    for i in range(2):
        same(batched[i], torch.from_numpy(np.asarray(g(xs[i]))))


@pytest.mark.parametrize(
    "x,mode,expected",
    [
        (X2, "linear", r"linear needs a 3-d input: got f64\[2,3,7,8\], expected \[N, C, W\]"),
        (
            X3,
            "bilinear",
            r"bilinear needs a 4-d input: got f64\[2,2,5,6,7\], expected \[N, C, H, W\]",
        ),
        (X3, "bicubic", r"bicubic needs a 4-d input"),
        (
            X1,
            "trilinear",
            r"trilinear needs a 5-d input: got f64\[2,3,11\], expected \[N, C, D, H, W\]",
        ),
        (X2, "trilinear", r"trilinear needs a 5-d input"),
    ],
)
def test_interpolate_mode_and_rank_mismatch(x, mode, expected):
    with pytest.raises(kl.Error, match=r"\[interpolate\] " + expected):
        kl.interpolate(x, scale_factor=2.0, mode=mode)


def test_interpolate_1d_and_3d_errors():
    with pytest.raises(
        kl.Error, match=r"\[interpolate\] size has 2 values: got \[3, 4\], " r"expected 1 or 3"
    ):
        kl.interpolate(X3, size=(3, 4))
    with pytest.raises(kl.Error, match=r"\[interpolate\] scale_factor has 2 values"):
        kl.interpolate(X1, scale_factor=(2.0, 2.0), mode="linear")
    with pytest.raises(
        kl.Error,
        match=r"\[interpolate\] align_corners with a mode other than "
        r"linear, bilinear, bicubic or trilinear: got align_corners=true with area",
    ):
        kl.interpolate(X1, size=4, mode="area", align_corners=True)
    with pytest.raises(
        kl.Error,
        match=r"\[interpolate\] input must have rank 3, 4 or 5: got " r"f64\[2,3,7,8,1,1\]",
    ):
        kl.interpolate(X2.reshape(2, 3, 7, 8, 1, 1), size=2)
    with pytest.raises(kl.Error, match=r"\[interpolate\] unknown mode: got 'cubic'"):
        kl.interpolate(X1, size=4, mode="cubic")
