"""grid_sample and affine_grid against PyTorch 1.13's torch.nn.functional: values in float64 and
float32, and float64 gradients w.r.t. the input and the grid (PyTorch's autograd)."""
import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln as kl

R = np.random.default_rng(11)


def close(got, expected, tol):
    expected = expected.detach().numpy()
    got = np.asarray(got)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)


def check_grid_sample(x, grid, **kw):
    """Values (f64, f32) and the gradients of a weighted sum w.r.t. input and grid."""
    tx = torch.from_numpy(x).requires_grad_()
    tg = torch.from_numpy(grid).requires_grad_()
    expected = F.grid_sample(tx, tg, **kw)
    close(kl.grid_sample(x, grid, **kw), expected, 1e-12)
    x32, g32 = x.astype(np.float32), grid.astype(np.float32)
    close(
        kl.grid_sample(x32, g32, **kw),
        F.grid_sample(torch.from_numpy(x32), torch.from_numpy(g32), **kw),
        1e-5,
    )
    w = R.standard_normal(tuple(expected.shape))
    (expected * torch.from_numpy(w)).sum().backward()
    gx, gg = kl.grad(lambda a, g: kl.sum(kl.grid_sample(a, g, **kw) * w), argnums=(0, 1))(x, grid)
    close(gx, tx.grad, 1e-10)
    close(gg, tg.grad, 1e-10)


# Odd sizes; the grid reaches past [-1, 1] so every padding mode matters.
X4 = R.standard_normal((2, 3, 5, 7))
G4 = R.uniform(-1.6, 1.6, (2, 4, 3, 2))
X5 = R.standard_normal((2, 2, 3, 4, 5))
G5 = R.uniform(-1.6, 1.6, (2, 3, 2, 4, 3))
PADDINGS = ["zeros", "border", "reflection"]


@pytest.mark.parametrize(
    "mode,padding_mode,align_corners",
    itertools.product(["bilinear", "nearest", "bicubic"], PADDINGS, [False, True]),
)
def test_grid_sample_2d(mode, padding_mode, align_corners):
    check_grid_sample(X4, G4, mode=mode, padding_mode=padding_mode, align_corners=align_corners)


@pytest.mark.parametrize(
    "mode,padding_mode,align_corners",
    itertools.product(["bilinear", "nearest"], PADDINGS, [False, True]),
)
def test_grid_sample_3d(mode, padding_mode, align_corners):
    check_grid_sample(X5, G5, mode=mode, padding_mode=padding_mode, align_corners=align_corners)


@pytest.mark.parametrize("padding_mode", PADDINGS)
def test_grid_sample_far_outside_and_single_pixel_axes(padding_mode):
    # Points many reflections away, and an axis of one pixel (a zero span to reflect over).
    x = R.standard_normal((1, 2, 1, 6))
    grid = R.uniform(-7.0, 7.0, (1, 3, 5, 2))
    for align_corners in (False, True):
        for mode in ("bilinear", "bicubic"):
            check_grid_sample(
                x, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners
            )


def test_grid_sample_zeros_padding_never_reads_outside_values():
    # Taps outside the input contribute an exact zero even next to an infinite pixel.
    x = X4.copy()
    x[:, :, 0, 0] = np.inf
    grid = np.concatenate([G4, np.full((2, 1, 3, 2), -3.0)], axis=1)
    for mode in ("bilinear", "nearest", "bicubic"):
        expected = F.grid_sample(
            torch.from_numpy(x), torch.from_numpy(grid), mode=mode, align_corners=False
        )
        got = np.asarray(kl.grid_sample(x, grid, mode=mode))
        np.testing.assert_array_equal(got[:, :, 4:], 0.0)
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-12, atol=1e-12)


def test_grid_sample_under_jit_and_vmap():
    f = lambda a, g: kl.grid_sample(a, g, padding_mode="reflection")
    close(
        kl.jit(f)(X4, G4),
        F.grid_sample(
            torch.from_numpy(X4),
            torch.from_numpy(G4),
            padding_mode="reflection",
            align_corners=False,
        ),
        1e-12,
    )
    xs, gs = np.stack([X4, 2 * X4]), np.stack([G4, -G4])
    batched = kl.vmap(f)(xs, gs)
    for i in range(2):
        np.testing.assert_allclose(
            np.asarray(batched)[i], np.asarray(f(xs[i], gs[i])), rtol=1e-12, atol=1e-12
        )


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("size", [(2, 3, 5, 4), (2, 1, 1, 3), (2, 3, 3, 4, 5)])
def test_affine_grid(size, align_corners):
    theta = R.standard_normal((2, len(size) - 2, len(size) - 1))
    t = torch.from_numpy(theta).requires_grad_()
    expected = F.affine_grid(t, size, align_corners=align_corners)
    close(kl.affine_grid(theta, size, align_corners=align_corners), expected, 1e-12)
    w = R.standard_normal(tuple(expected.shape))
    (expected * torch.from_numpy(w)).sum().backward()
    close(
        kl.grad(lambda a: kl.sum(kl.affine_grid(a, size, align_corners=align_corners) * w))(theta),
        t.grad,
        1e-12,
    )


def test_affine_grid_then_grid_sample():
    theta = np.array([[[0.8, -0.3, 0.1], [0.4, 1.1, -0.2]]] * 2)
    kw = dict(mode="bilinear", padding_mode="border", align_corners=False)
    expected = F.grid_sample(
        torch.from_numpy(X4),
        F.affine_grid(torch.from_numpy(theta), (2, 3, 6, 4), align_corners=False),
        **kw,
    )
    close(kl.grid_sample(X4, kl.affine_grid(theta, (2, 3, 6, 4)), **kw), expected, 1e-12)


def test_grid_sample_errors():
    with pytest.raises(
        kl.Error,
        match=r"\[grid_sample\] grid does not fit the input: got grid "
        r"f64\[2,4,3,3\].*expected \[2, \*, \*, 2\]",
    ):
        kl.grid_sample(X4, R.standard_normal((2, 4, 3, 3)))
    with pytest.raises(kl.Error, match=r"\[grid_sample\] grid does not fit the input"):
        kl.grid_sample(X4, R.standard_normal((2, 4, 3, 3, 2)))
    with pytest.raises(kl.Error, match=r"\[grid_sample\] grid does not fit the input"):
        kl.grid_sample(X4, R.standard_normal((3, 4, 3, 2)))
    with pytest.raises(
        kl.Error,
        match=r"\[grid_sample\] input must have rank 4 or 5: got "
        r"f64\[3,5,7\], expected \[N, C, H, W\] or \[N, C, D, H, W\]",
    ):
        kl.grid_sample(X4[0], G4[0])
    with pytest.raises(kl.Error, match=r"\[grid_sample\] unknown mode: got 'cubic'"):
        kl.grid_sample(X4, G4, mode="cubic")
    with pytest.raises(kl.Error, match=r"\[grid_sample\] unknown padding_mode: got 'wrap'"):
        kl.grid_sample(X4, G4, padding_mode="wrap")
    with pytest.raises(kl.Error, match=r"\[grid_sample\] bicubic needs a 4-d input"):
        kl.grid_sample(X5, G5, mode="bicubic")
    with pytest.raises(kl.Error, match=r"\[grid_sample\] bad dtypes"):
        kl.grid_sample(X4.astype(np.float32), G4)
    with pytest.raises(kl.Error, match=r"\[affine_grid\] theta does not fit size"):
        kl.affine_grid(np.zeros((2, 3, 4)), (2, 3, 5, 4))
    with pytest.raises(kl.Error, match=r"\[affine_grid\] size must have 4 or 5 entries"):
        kl.affine_grid(np.zeros((2, 2, 3)), (2, 3, 5))
