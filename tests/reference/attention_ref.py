"""PyTorch 1.13 values for tests/test_attention.cpp: scaled dot-product attention (written out
as PyTorch 2's math path, which 1.13 lacks) and torch.nn.MultiheadAttention.

Weights and inputs are drawn here (float64) and stored with the outputs, so the C++ tests
load the same weights into Kiln's layers; gradients are those of sum(out * cot) with a stored
cotangent `cot`.
"""
import math
import sys

import numpy as np
import torch

import reference_file

torch.manual_seed(15)
torch.set_default_dtype(torch.float64)
out = {}


def put(name, t):
    out[name] = t.detach().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


def sdpa_math(q, k, v, attn_mask=None, is_causal=False, key_padding_mask=None, scale=None):
    """softmax(q k^T * scale + mask) v, a fully masked row giving 0 (Kiln's documented choice)."""
    L, S = q.shape[-2], k.shape[-2]
    s = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    keep = torch.ones(s.shape, dtype=torch.bool)
    if is_causal:
        keep = keep & torch.ones(L, S, dtype=torch.bool).tril()
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            keep = keep & attn_mask
        else:
            s = s + attn_mask
    if key_padding_mask is not None:
        keep = keep & ~key_padding_mask.unsqueeze(-2)
    # Rows with every key masked: weights 0 (and no NaN in the gradients).
    any_kept = keep.any(-1, keepdim=True)
    s = s.masked_fill(~keep, -math.inf).masked_fill(~any_kept, 0.0)
    w = torch.softmax(s, -1) * any_kept
    return w, w @ v


def sdpa_case(name, qs, ks, vs, **kw):
    q, k, v = torch.randn(qs), torch.randn(ks), torch.randn(vs)
    for key, val in list(kw.items()):
        if isinstance(val, torch.Tensor):
            put(f"{name}/{key}", val)
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    w, o = sdpa_math(q, k, v, **kw)
    cot = torch.randn(o.shape)
    (o * cot).sum().backward()
    for n, t in (
        ("q", q),
        ("k", k),
        ("v", v),
        ("out", o),
        ("weights", w),
        ("cot", cot),
        ("grad_q", q.grad),
        ("grad_k", k.grad),
        ("grad_v", v.grad),
    ):
        put(f"{name}/{n}", t)


sdpa_case("sdpa_plain", (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7))
sdpa_case("sdpa_broadcast", (2, 3, 4, 5), (1, 3, 6, 5), (1, 3, 6, 7))
sdpa_case("sdpa_scale", (2, 4, 5), (2, 6, 5), (2, 6, 3), scale=0.7)
sdpa_case("sdpa_causal", (2, 5, 4), (2, 5, 4), (2, 5, 3), is_causal=True)
sdpa_case("sdpa_causal_rect", (2, 4, 3), (2, 6, 3), (2, 6, 3), is_causal=True)
bool_mask = torch.rand(4, 6) > 0.4
bool_mask[1] = False  # a fully masked row
bool_mask[0, 0] = True
sdpa_case("sdpa_bool_mask", (2, 4, 5), (2, 6, 5), (2, 6, 3), attn_mask=bool_mask)
sdpa_case("sdpa_float_mask", (2, 4, 5), (2, 6, 5), (2, 6, 3), attn_mask=torch.randn(2, 4, 6))
kpm = torch.tensor(
    [[False, False, True, False, True, True], [False, True, False, False, False, False]]
).reshape(2, 1, 6)
sdpa_case("sdpa_kpm", (2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 3), key_padding_mask=kpm)
sdpa_case(
    "sdpa_causal_kpm",
    (2, 3, 4, 5),
    (2, 3, 4, 5),
    (2, 3, 4, 3),
    is_causal=True,
    key_padding_mask=torch.tensor(
        [[True, False, False, False], [False, False, True, True]]
    ).reshape(2, 1, 4),
)


def mha_case(
    name,
    E,
    H,
    L,
    S,
    N,
    kdim=None,
    vdim=None,
    batch_first=False,
    bias=True,
    kpm=None,
    attn_mask=None,
    **kw,
):
    m = torch.nn.MultiheadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim, batch_first=batch_first)
    with torch.no_grad():  # PyTorch zeroes the biases: give them values
        for p in m.parameters():
            p.copy_(torch.randn(p.shape) * 0.5)
    for pname, p in m.named_parameters():
        put(f"{name}/param/{pname}", p)

    def shape(T, d):
        return (N, T, d) if batch_first else (T, N, d)

    q = torch.randn(shape(L, E))
    k = torch.randn(shape(S, kdim or E))
    v = torch.randn(shape(S, vdim or E))
    put(f"{name}/query", q), put(f"{name}/key", k), put(f"{name}/value", v)
    if kpm is not None:
        put(f"{name}/key_padding_mask", kpm)
    if attn_mask is not None:
        put(f"{name}/attn_mask", attn_mask)
    o, w = m(q, k, v, key_padding_mask=kpm, attn_mask=attn_mask, average_attn_weights=True)
    _, wh = m(q, k, v, key_padding_mask=kpm, attn_mask=attn_mask, average_attn_weights=False)
    put(f"{name}/out", o), put(f"{name}/weights", w), put(f"{name}/head_weights", wh)


mha_case("mha_self", 8, 2, 4, 4, 3)
mha_mask = torch.rand(4, 5) > 0.6
mha_mask[:, 0] = False  # every query keeps key 0: PyTorch's NaN rows stay out of the reference
mha_case(
    "mha_masks",
    8,
    4,
    4,
    5,
    2,
    kpm=torch.tensor([[False, True, False, False, True], [False, False, False, True, False]]),
    attn_mask=mha_mask,
)
mha_case("mha_float_mask", 6, 2, 3, 5, 2, attn_mask=torch.randn(2 * 2, 3, 5))
mha_case("mha_kvdim", 6, 3, 3, 5, 2, kdim=4, vdim=7, batch_first=True)
mha_case("mha_nobias", 4, 1, 2, 3, 2, bias=False, batch_first=True)


reference_file.write(sys.argv[1], out)
