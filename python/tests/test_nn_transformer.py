"""kiln.nn.TransformerEncoderLayer, TransformerDecoderLayer and their stacks against PyTorch 1.13
with the same weights (copied name by name): outputs and the gradients w.r.t. the inputs and
every parameter, with masks, norm_first, gelu, batch_first and unbatched inputs; dropout."""
import numpy as np
import pytest
import torch

import kiln as kl
from torch_testing import close

torch.set_num_threads(1)
rng = np.random.default_rng(0)
E, H, F = 8, 2, 16


def key(i):
    return kl.random.key(i)


def randn(*shape):
    return rng.standard_normal(shape)


def t(x):
    return None if x is None else torch.from_numpy(np.asarray(x))


def torch_copy(model, ref):
    """Copies every kiln parameter into the torch module of the same names."""
    names = kl.nn.named_parameters(model)
    assert sorted(n for n, _ in names) == sorted(n for n, _ in ref.named_parameters())
    params = dict(ref.named_parameters())
    with torch.no_grad():
        for n, v in names:
            # Randomise the zero-initialised biases and unit norms too: every parameter matters.
            params[n].copy_(t(np.asarray(v) + 0.1 * randn(*v.shape)))
    return model_from(ref, model)


def model_from(ref, model):
    """The kiln model with torch's (randomised) parameters."""
    params = dict(ref.named_parameters())
    names = [n for n, _ in kl.nn.named_parameters(model)]
    _, treedef = kl.tree.flatten(model)
    return kl.tree.unflatten(treedef, [params[n].detach().numpy().copy() for n in names])


def causal(n):
    return np.triu(np.ones((n, n), bool), 1)


def options(batch_first, norm_first, activation):
    return dict(
        dim_feedforward=F,
        dropout=0.0,
        activation=activation,
        batch_first=batch_first,
        norm_first=norm_first,
    )


def layout(x, batch_first, batched):
    """[L, N, E] data in the layer's layout."""
    if not batched:
        return x[:, 0]
    return x.transpose(1, 0, 2) if batch_first else x


CONFIGS = [
    (False, False, "relu", True),
    (True, False, "gelu", True),
    (False, True, "relu", True),
    (True, True, "gelu", True),
    (False, False, "gelu", False),
    (True, True, "relu", False),
]
MASKS = ["none", "causal", "bool", "float", "padding"]


def encoder_masks(kind, L, N, batched):
    if kind == "none":
        return {}, {}
    if kind == "causal":
        return {"is_causal": True}, {"src_mask": causal(L)}
    if kind == "bool":
        m = rng.random((L, L)) < 0.3
        np.fill_diagonal(m, False)
        return {"src_mask": m}, {"src_mask": m}
    if kind == "float":
        m = randn(L, L)
        return {"src_mask": m}, {"src_mask": m}
    pad = np.zeros((N, L), bool)
    pad[0, -2:] = True
    pad = pad if batched else pad[0]
    return {"src_key_padding_mask": pad}, {"src_key_padding_mask": pad}


def compare_grads(grads, ref, tol=1e-8):
    params = dict(ref.named_parameters())
    for n, g in kl.nn.named_parameters(grads):
        close(g, params[n].grad, tol)


@pytest.mark.parametrize("batch_first,norm_first,activation,batched", CONFIGS)
@pytest.mark.parametrize("mask", MASKS)
def test_encoder_layer_matches_torch(batch_first, norm_first, activation, batched, mask):
    L, N = 5, 3
    layer = kl.nn.TransformerEncoderLayer(
        E, H, key(1), dtype=kl.float64, **options(batch_first, norm_first, activation)
    )
    ref = torch.nn.TransformerEncoderLayer(
        E, H, **options(batch_first, norm_first, activation)
    ).double()
    layer = torch_copy(layer, ref)
    src = layout(randn(L, N, E), batch_first, batched)
    ours, theirs = encoder_masks(mask, L, N, batched)
    w = randn(*src.shape)
    tsrc = t(src).requires_grad_()
    want = ref(tsrc, **{k: t(v) for k, v in theirs.items()})
    close(layer(src, **ours), want)
    (want * t(w)).sum().backward()
    g_layer, g_src = kl.grad(lambda m, x: (m(x, **ours) * w).sum(), argnums=(0, 1))(layer, src)
    close(g_src, tsrc.grad)
    compare_grads(g_layer, ref)


def decoder_masks(kind, L, S, N, batched):
    if kind == "none":
        return {}, {}
    if kind == "causal":
        return {"tgt_is_causal": True}, {"tgt_mask": causal(L)}
    if kind == "bool":
        m = rng.random((L, S)) < 0.3
        m[:, 0] = False
        return {"memory_mask": m, "tgt_mask": causal(L)}, {"memory_mask": m, "tgt_mask": causal(L)}
    if kind == "float":
        m, tm = randn(L, S), randn(L, L)
        return {"memory_mask": m, "tgt_mask": tm}, {"memory_mask": m, "tgt_mask": tm}
    tpad, mpad = np.zeros((N, L), bool), np.zeros((N, S), bool)
    tpad[1, -1] = True
    mpad[0, -3:] = True
    if not batched:
        tpad, mpad = tpad[1], mpad[0]
    both = {"tgt_key_padding_mask": tpad, "memory_key_padding_mask": mpad}
    return both, both


@pytest.mark.parametrize("batch_first,norm_first,activation,batched", CONFIGS)
@pytest.mark.parametrize("mask", MASKS)
def test_decoder_layer_matches_torch(batch_first, norm_first, activation, batched, mask):
    L, S, N = 4, 6, 3
    layer = kl.nn.TransformerDecoderLayer(
        E, H, key(2), dtype=kl.float64, **options(batch_first, norm_first, activation)
    )
    ref = torch.nn.TransformerDecoderLayer(
        E, H, **options(batch_first, norm_first, activation)
    ).double()
    layer = torch_copy(layer, ref)
    tgt = layout(randn(L, N, E), batch_first, batched)
    memory = layout(randn(S, N, E), batch_first, batched)
    ours, theirs = decoder_masks(mask, L, S, N, batched)
    w = randn(*tgt.shape)
    ttgt, tmem = t(tgt).requires_grad_(), t(memory).requires_grad_()
    want = ref(ttgt, tmem, **{k: t(v) for k, v in theirs.items()})
    close(layer(tgt, memory, **ours), want)
    (want * t(w)).sum().backward()
    grads = kl.grad(lambda m, x, y: (m(x, y, **ours) * w).sum(), argnums=(0, 1, 2))(
        layer, tgt, memory
    )
    close(grads[1], ttgt.grad)
    close(grads[2], tmem.grad)
    compare_grads(grads[0], ref)


@pytest.mark.parametrize("final_norm", [False, True])
def test_stacks_match_torch(final_norm):
    L, S, N = 4, 5, 2
    opts = options(True, False, "relu")
    norm = kl.nn.LayerNorm(E, dtype=kl.float64) if final_norm else None
    enc = kl.nn.TransformerEncoder(
        kl.nn.TransformerEncoderLayer(E, H, key(3), dtype=kl.float64, **opts), 2, norm
    )
    tenc = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(E, H, **opts),
        2,
        torch.nn.LayerNorm(E) if final_norm else None,
    ).double()
    enc = torch_copy(enc, tenc)
    assert enc.num_layers == 2 and len(enc.layers) == 2
    dec = kl.nn.TransformerDecoder(
        kl.nn.TransformerDecoderLayer(E, H, key(4), dtype=kl.float64, **opts), 2, norm
    )
    tdec = torch.nn.TransformerDecoder(
        torch.nn.TransformerDecoderLayer(E, H, **opts),
        2,
        torch.nn.LayerNorm(E) if final_norm else None,
    ).double()
    dec = torch_copy(dec, tdec)
    src, tgt = randn(N, S, E), randn(N, L, E)
    pad = np.zeros((N, S), bool)
    pad[1, -1] = True
    tsrc, ttgt = t(src).requires_grad_(), t(tgt).requires_grad_()
    tmem = tenc(tsrc, mask=t(causal(S)), src_key_padding_mask=t(pad))
    want = tdec(ttgt, tmem, tgt_mask=t(causal(L)), memory_key_padding_mask=t(pad))
    w = randn(*tgt.shape)

    def run(enc, dec, src, tgt):
        memory = enc(src, mask=causal(S), src_key_padding_mask=pad)
        return dec(tgt, memory, tgt_is_causal=True, memory_key_padding_mask=pad)

    close(run(enc, dec, src, tgt), want)
    (want * t(w)).sum().backward()
    g = kl.grad(lambda *a: (run(*a) * w).sum(), argnums=(0, 1, 2, 3))(enc, dec, src, tgt)
    compare_grads(g[0], tenc)
    compare_grads(g[1], tdec)
    close(g[2], tsrc.grad)
    close(g[3], ttgt.grad)


def test_defaults_init_and_repr():
    layer = kl.nn.TransformerEncoderLayer(16, 4, key(5))
    ref = torch.nn.TransformerEncoderLayer(16, 4)
    assert layer.dropout == 0.1 and layer.activation == "relu" and not layer.norm_first
    assert not layer.batch_first and layer.norm1.eps == 1e-5
    ours = dict(kl.nn.named_parameters(layer))
    for n, p in ref.named_parameters():
        assert tuple(ours[n].shape) == tuple(p.shape), n
    close(ours["self_attn.in_proj_bias"], np.zeros(48), 0)
    close(ours["norm2.weight"], np.ones(16), 0)
    bound = 1 / np.sqrt(16)  # Linear's default: uniform(-1/sqrt(in), 1/sqrt(in))
    assert np.abs(np.asarray(ours["linear1.weight"])).max() <= bound
    assert "dim_feedforward=2048" in repr(layer) and "nhead=4" in repr(layer)
    dec = kl.nn.TransformerDecoderLayer(16, 4, key(6), norm_first=True, activation="gelu")
    assert "norm_first=True" in repr(dec) and "activation=gelu" in repr(dec)
    stack = kl.nn.TransformerEncoder(layer, 3)
    a0, a2 = (dict(kl.nn.named_parameters(stack))[f"layers.{i}.linear1.weight"] for i in (0, 2))
    close(a0, np.asarray(a2), 0)  # copies of one layer, as PyTorch's deep copies
    assert repr(stack) == "TransformerEncoder(num_layers=3, norm=False)"


def test_dropout_is_deterministic_and_off_in_eval():
    layer = kl.nn.TransformerDecoderLayer(E, H, key(7), dim_feedforward=F, dropout=0.3)
    tgt, memory = randn(4, 2, E).astype(np.float32), randn(5, 2, E).astype(np.float32)
    y = np.asarray(layer(tgt, memory))
    close(layer(tgt, memory, ctx=kl.nn.Context.eval()), y, 0)
    y1 = np.asarray(layer(tgt, memory, ctx=kl.nn.Context.train(key(8))))
    y2 = np.asarray(layer(tgt, memory, ctx=kl.nn.Context.train(key(8))))
    y3 = np.asarray(layer(tgt, memory, ctx=kl.nn.Context.train(key(9))))
    np.testing.assert_array_equal(y1, y2)
    assert not np.allclose(y1, y3) and not np.allclose(y1, y)


def test_feed_forward_dropout_keep_rate():
    # norm_first, attention output 0 and a feed-forward block whose activation is all ones
    # through an identity: y - x is the product of the activation's dropout mask and the
    # residual branch's, kept with probability (1 - p)^2 and scaled by 1 / (1 - p)^2.
    p, n = 0.2, 64
    layer = kl.nn.TransformerEncoderLayer(
        n, 1, key(10), dim_feedforward=n, dropout=p, norm_first=True, batch_first=True
    )
    attn = layer.self_attn
    attn.in_proj_weight = np.zeros((3 * n, n), np.float32)
    attn.out_proj.weight = np.zeros((n, n), np.float32)
    layer.self_attn = attn
    layer.linear1.weight = np.zeros((n, n), np.float32)
    layer.linear1.bias = np.ones(n, np.float32)
    layer.linear2.weight = np.eye(n, dtype=np.float32)
    layer.linear2.bias = np.zeros(n, np.float32)
    x = randn(8, 25, n).astype(np.float32)
    d = np.asarray(layer(x, ctx=kl.nn.Context.train(key(11)))) - x
    kept = np.abs(d) > 1e-3
    np.testing.assert_allclose(d[kept], 1 / (1 - p) ** 2, rtol=1e-5)
    assert abs(kept.mean() - (1 - p) ** 2) < 0.02  # 12,800 draws: about 5 standard deviations
    close(layer(x), x + 1, 1e-5)


def test_errors():
    with pytest.raises(kl.Error, match=r"\[nn.TransformerEncoderLayer\] d_model not divisible"):
        kl.nn.TransformerEncoderLayer(10, 3, key(0))
    with pytest.raises(kl.Error, match=r"\[nn.TransformerDecoderLayer\] unknown activation"):
        kl.nn.TransformerDecoderLayer(8, 2, key(0), activation="tanh")
    with pytest.raises(kl.Error, match=r"\[nn.TransformerEncoderLayer\] dropout out of range"):
        kl.nn.TransformerEncoderLayer(8, 2, key(0), dropout=1.5)
    layer = kl.nn.TransformerEncoderLayer(8, 2, key(0), dim_feedforward=F)
    with pytest.raises(kl.Error, match=r"\[nn.TransformerEncoderLayer\] src does not match"):
        layer(np.zeros((4, 2, 6), np.float32))
    with pytest.raises(kl.Error, match=r"\[nn.TransformerEncoder\] non-positive num_layers"):
        kl.nn.TransformerEncoder(layer, 0)
    with pytest.raises(kl.Error, match=r"attn_mask does not match"):
        layer(np.zeros((4, 2, 8), np.float32), src_mask=np.zeros((3, 3), bool))
    dec = kl.nn.TransformerDecoderLayer(8, 2, key(0), dim_feedforward=F)
    with pytest.raises(kl.Error, match=r"\[nn.TransformerDecoderLayer\] memory does not match"):
        dec(np.zeros((4, 2, 8), np.float32), np.zeros((4, 8), np.float32))


def test_numpy_bool_masks_inside_transformations():
    # A NumPy bool mask closed over by a function under grad or jit is a constant: converting
    # it must not run (traced) operations. Bytes other than 0 and 1 are NumPy's True.
    layer = kl.nn.TransformerEncoderLayer(E, H, key(12), dim_feedforward=F, dropout=0.0)
    x = randn(5, 2, E).astype(np.float32)
    raw = np.where(causal(5), 7, 0).astype(np.uint8).view(bool)
    want = np.asarray(layer(x, src_mask=causal(5)))
    close(kl.jit(lambda x: layer(x, src_mask=raw))(x), want, 1e-6)
    g = kl.grad(lambda x: layer(x, src_mask=raw).sum())(x)
    close(g, np.asarray(kl.grad(lambda x: layer(x, is_causal=True).sum())(x)), 1e-6)


def test_sequential_passes_its_context_to_the_encoder():
    layer = kl.nn.TransformerEncoderLayer(E, H, key(13), dim_feedforward=F, dropout=0.5)
    model = kl.nn.Sequential([kl.nn.Linear(E, E, key(14)), layer])
    x = randn(4, 2, E).astype(np.float32)
    y = np.asarray(model(x))
    close(y, np.asarray(layer(model[0](x))), 0)
    y1 = np.asarray(model(x, kl.nn.Context.train(key(15))))
    close(y1, np.asarray(layer(model[0](x), ctx=kl.nn.Context.train(key(15)))), 0)
    assert not np.allclose(y1, y)


def test_jit_and_vmap_match_eager():
    layer = kl.nn.TransformerDecoderLayer(
        E, H, key(16), dim_feedforward=F, batch_first=True, dropout=0.0
    )
    tgt, memory = randn(3, 4, E).astype(np.float32), randn(3, 6, E).astype(np.float32)
    want = np.asarray(layer(tgt, memory, tgt_is_causal=True))
    close(kl.jit(lambda m, t, s: m(t, s, tgt_is_causal=True))(layer, tgt, memory), want, 1e-5)
    # vmap of the unbatched layer over the examples is the batched layer.
    close(kl.vmap(lambda t, s: layer(t, s, tgt_is_causal=True))(tgt, memory), want, 1e-5)
