#!/usr/bin/python3
"""Reference values for tests/test_nn_functions.cpp from PyTorch 1.13 (Debian's python3-torch):
activations, GroupNorm, the losses and label-smoothed cross entropy; RMSNorm (absent from
PyTorch 1.13) from its definition in numpy, float64. Inputs are generated here and stored
with the outputs; gradients are torch.autograd's of sum(output * r) for a stored r.

Usage: nn_functions_ref.py OUT.safetensors
"""
import sys
import warnings

import numpy as np
import torch
import torch.nn.functional as F

import reference_file

# kl_div's reduction='mean' warns that it is not the KL divergence; it is tested on purpose.
warnings.filterwarnings("ignore", message="reduction: 'mean'")
rng = np.random.RandomState(15)
out = {}

DTYPES = {"f32": (np.float32, torch.float32), "f64": (np.float64, torch.float64)}


def grad_of(fn, inputs, r):
    """Outputs of fn and d sum(fn(*inputs) * r) / d inputs."""
    ts = [torch.tensor(a, requires_grad=True) for a in inputs]
    y = fn(*ts)
    (y * torch.tensor(r)).sum().backward()
    return y.detach().numpy(), [t.grad.numpy() for t in ts]


# ---- activations: values and gradients at a grid, the far tails and the thresholds ----
x = np.concatenate([np.linspace(-6, 6, 25), [-30.0, -20.5, -0.7, 0.3, 4.9, 5.1, 19.9, 20.5, 30.0]])
ACTIVATIONS = {
    "gelu": lambda t: F.gelu(t),
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
    "elu": F.elu,
    "elu_half": lambda t: F.elu(t, alpha=0.5),
    "leaky_relu": F.leaky_relu,
    "leaky_relu_02": lambda t: F.leaky_relu(t, 0.2),
    "softplus": F.softplus,
    "softplus_b2_t5": lambda t: F.softplus(t, beta=2.0, threshold=5.0),
    "softplus_b05": lambda t: F.softplus(t, beta=0.5),
}
for dname, (np_t, _) in DTYPES.items():
    xd = x.astype(np_t)
    out[f"act/{dname}/x"] = xd
    for name, fn in ACTIVATIONS.items():
        y, (g,) = grad_of(fn, [xd], np.ones_like(xd))
        out[f"act/{dname}/{name}"] = y
        out[f"act/{dname}/{name}/grad"] = g

# ---- GroupNorm: [2, 6, 3, 2] in 3 groups (affine and not), [3, 4] in 2 groups ----
for dname, (np_t, _) in DTYPES.items():
    gx = rng.normal(size=(2, 6, 3, 2)).astype(np_t) * 2 + 0.5
    w = rng.normal(size=6).astype(np_t)
    b = rng.normal(size=6).astype(np_t)
    r = rng.normal(size=gx.shape).astype(np_t)
    y, (gxg, gw, gb) = grad_of(lambda a, c, d: F.group_norm(a, 3, c, d, eps=1e-5), [gx, w, b], r)
    out.update(
        {
            f"gn/{dname}/x": gx,
            f"gn/{dname}/w": w,
            f"gn/{dname}/b": b,
            f"gn/{dname}/r": r,
            f"gn/{dname}/y": y,
            f"gn/{dname}/gx": gxg,
            f"gn/{dname}/gw": gw,
            f"gn/{dname}/gb": gb,
        }
    )
    out[f"gn/{dname}/plain"] = F.group_norm(torch.tensor(gx), 3).numpy()
    x2 = rng.normal(size=(3, 4)).astype(np_t)
    out[f"gn/{dname}/x2"] = x2
    out[f"gn/{dname}/y2"] = F.group_norm(torch.tensor(x2), 2, eps=0.1).numpy()

# ---- RMSNorm (numpy, float64): x / sqrt(mean(x^2) + eps) * w over the last axis ----
rx = rng.normal(size=(3, 5)) * 3
rw = rng.normal(size=5)
out["rms/x"], out["rms/w"] = rx, rw
out["rms/y"] = rx / np.sqrt(np.mean(rx * rx, axis=-1, keepdims=True) + 1e-6) * rw

# ---- huber ----
hp = np.array([-3.0, -1.0, -0.4, 0.0, 0.2, 0.5, 0.9, 2.5, 7.0])
ht = np.array([0.0, 0.2, 0.1, 0.0, -0.3, 1.5, 0.9, 0.0, 1.0])
out["huber/p"], out["huber/t"] = hp, ht
for delta, tag in ((1.0, "d1"), (0.5, "d05")):
    for red in ("none", "sum", "mean"):
        y, (gp, gt) = grad_of(
            lambda a, b: F.huber_loss(a, b, reduction=red, delta=delta),
            [hp, ht],
            np.ones(() if red != "none" else hp.shape),
        )
        out[f"huber/{tag}/{red}"], out[f"huber/{tag}/{red}/gp"] = y, gp
        out[f"huber/{tag}/{red}/gt"] = gt

# ---- kl_div: log-probabilities [4, 5]; the target has a zero; both target forms ----
ki = F.log_softmax(torch.tensor(rng.normal(size=(4, 5))), -1).numpy()
kt = F.softmax(torch.tensor(rng.normal(size=(4, 5))), -1).numpy()
kt[1, 2] = 0.0
out["kl/input"], out["kl/target"], out["kl/log_target"] = ki, kt, np.log(kt + 0.5)
for red in ("none", "sum", "mean", "batchmean"):
    r = np.ones(() if red != "none" else ki.shape)
    y, (gi, gt) = grad_of(lambda a, b: F.kl_div(a, b, reduction=red), [ki, kt], r)
    out[f"kl/{red}"], out[f"kl/{red}/gi"], out[f"kl/{red}/gt"] = y, gi, gt
    y, (gi, gt) = grad_of(
        lambda a, b: F.kl_div(a, b, reduction=red, log_target=True), [ki, np.log(kt + 0.5)], r
    )
    out[f"kl/log/{red}"], out[f"kl/log/{red}/gi"], out[f"kl/log/{red}/gt"] = y, gi, gt
edge = F.kl_div(
    torch.tensor([-1.0, -np.inf, -2.0, 0.5], dtype=torch.float64),
    torch.tensor([0.0, 0.0, -0.5, 0.3], dtype=torch.float64),
    reduction="none",
)
out["kl/edge"] = edge.numpy()

# ---- nll_loss and cross entropy: classes last here (PyTorch's axis 1 moved to the end) ----
logits = rng.normal(size=(2, 3, 5)) * 2
labels = np.array([[1, -100, 4], [0, 2, -100]], dtype=np.int64)
lp = F.log_softmax(torch.tensor(logits), -1).numpy()
out["nll/logp"], out["nll/labels"], out["nll/logits"] = lp, labels, logits
for red in ("none", "sum", "mean"):
    r = np.ones(() if red != "none" else labels.shape)
    y, (g,) = grad_of(
        lambda a: F.nll_loss(a.permute(0, 2, 1), torch.tensor(labels), reduction=red), [lp], r
    )
    out[f"nll/{red}"], out[f"nll/{red}/grad"] = y, g
out["nll/labels_wrapped"] = labels % 5
out["nll/ignore2"] = F.nll_loss(
    torch.tensor(lp).permute(0, 2, 1), torch.tensor(labels % 5), ignore_index=2
).numpy()
for e in (0.0, 0.1, 0.3, 1.0):
    y, (g,) = grad_of(
        lambda a: F.cross_entropy(a.permute(0, 2, 1), torch.tensor(labels), label_smoothing=e),
        [logits],
        np.ones(()),
    )
    out[f"ce/{e}"], out[f"ce/{e}/grad"] = y, g

reference_file.write(sys.argv[1], out)
