#!/usr/bin/python3
"""Reference values for tests/test_conv_nd.cpp from PyTorch 1.13 (Debian's python3-torch):
conv1d/conv3d, conv_transpose1d/2d/3d, adaptive_avg_pool2d and F.interpolate (nearest,
bilinear), each with its inputs (seeded here and stored), an output cotangent r and the
gradients of sum(y * r) with respect to the inputs. Values in float64; resampling also in
float32 (PyTorch computes its source indices in float for float32 inputs).
"""
import sys

import torch
import torch.nn.functional as F

from reference_file import write

torch.manual_seed(15)
out = {}


def with_grads(name, f, *inputs):
    xs = [t.clone().requires_grad_(True) for t in inputs]
    y = f(*xs)
    r = torch.randn(y.shape, dtype=y.dtype)
    (y * r).sum().backward()
    out[f"{name}/y"] = y.detach().numpy()
    out[f"{name}/r"] = r.numpy()
    for i, (t, x) in enumerate(zip(inputs, xs)):
        out[f"{name}/in{i}"] = t.numpy()
        out[f"{name}/grad{i}"] = x.grad.numpy()


def randn(*shape):
    return torch.randn(shape, dtype=torch.float64)


CONVS = {
    "conv1d": (F.conv1d, (2, 4, 9), (6, 2, 3), dict(stride=2, padding=1, dilation=2, groups=2)),
    "conv1d_plain": (F.conv1d, (3, 2, 6), (4, 2, 2), {}),
    "conv3d": (
        F.conv3d,
        (2, 4, 5, 6, 7),
        (6, 2, 3, 2, 3),
        dict(stride=(1, 2, 1), padding=(1, 0, 1), dilation=(1, 1, 2), groups=2),
    ),
    "conv3d_plain": (F.conv3d, (1, 2, 4, 4, 4), (3, 2, 2, 2, 2), {}),
    "conv3d_depthwise": (F.conv3d, (2, 3, 3, 4, 5), (3, 1, 3, 3, 3), dict(padding=1, groups=3)),
    "conv_transpose1d": (
        F.conv_transpose1d,
        (2, 4, 5),
        (4, 3, 3),
        dict(stride=2, padding=1, output_padding=1, groups=2),
    ),
    "conv_transpose2d": (
        F.conv_transpose2d,
        (2, 4, 5, 6),
        (4, 3, 4, 3),
        dict(stride=(2, 1), padding=(1, 0), output_padding=(1, 0), dilation=(1, 2), groups=2),
    ),
    # output_padding >= stride (allowed as it is < dilation): cropped and zero-extended.
    "conv_transpose2d_wide": (
        F.conv_transpose2d,
        (1, 2, 4, 4),
        (2, 3, 3, 3),
        dict(stride=(1, 2), padding=(0, 1), output_padding=(1, 1), dilation=(2, 1)),
    ),
    "conv_transpose3d": (
        F.conv_transpose3d,
        (1, 4, 3, 4, 3),
        (4, 2, 2, 3, 2),
        dict(stride=2, padding=(0, 1, 0), output_padding=(1, 0, 1), groups=2),
    ),
}
for name, (f, xs, ws, kw) in CONVS.items():
    with_grads(name, lambda x, w, f=f, kw=kw: f(x, w, **kw), randn(*xs), randn(*ws))

x = randn(2, 3, 7, 10)
for oh, ow in [(3, 4), (7, 10), (1, 1), (5, 3), (9, 13)]:
    with_grads(f"adaptive/{oh}x{ow}", lambda t, s=(oh, ow): F.adaptive_avg_pool2d(t, s), x)

# name: (size, scale_factor, mode, align_corners)
RESIZES = {
    "nearest_size": ((7, 3), None, "nearest", None),
    "nearest_double": ((8, 10), None, "nearest", None),
    "nearest_scale": (None, (1.7, 0.6), "nearest", None),
    "nearest_scale_same_size": (None, (1.2, 1.1), "nearest", None),
    "bilinear_size": ((7, 9), None, "bilinear", False),
    "bilinear_size_corners": ((7, 9), None, "bilinear", True),
    "bilinear_down": ((3, 2), None, "bilinear", False),
    "bilinear_scale": (None, (1.5, 0.6), "bilinear", False),
    "bilinear_scale_corners": (None, (2.0, 2.0), "bilinear", True),
    "bilinear_one_corners": ((1, 1), None, "bilinear", True),
}
x = randn(2, 3, 4, 5)
for name, (size, scale, mode, corners) in RESIZES.items():
    for dt, tag in [(torch.float64, "f64"), (torch.float32, "f32")]:
        with_grads(
            f"resize/{name}/{tag}",
            lambda t, size=size, scale=scale, mode=mode, corners=corners: F.interpolate(
                t, size=size, scale_factor=scale, mode=mode, align_corners=corners
            ),
            x.to(dt),
        )

write(sys.argv[1], out)
