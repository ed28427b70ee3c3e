"""Convolutions with bias and unbatched inputs, and the layers Conv1d/2d/3d and
ConvTranspose1d/2d/3d, against PyTorch 1.13 with the same weights: outputs and gradients with
respect to the input, the weight and the bias."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln as kl
from torch_testing import close

torch.set_num_threads(1)
rng = np.random.default_rng(7)

FUNCS = {1: (kl.conv1d, F.conv1d), 2: (kl.conv2d, F.conv2d), 3: (kl.conv3d, F.conv3d)}
TFUNCS = {
    1: (kl.conv_transpose1d, F.conv_transpose1d),
    2: (kl.conv_transpose2d, F.conv_transpose2d),
    3: (kl.conv_transpose3d, F.conv_transpose3d),
}
SPATIAL = {1: (9,), 2: (7, 6), 3: (5, 4, 6)}


def randn(*shape):
    return rng.standard_normal(shape)


def check_against_torch(ours, theirs, x, w, b, tol=1e-9):
    """ours(x, w, b) against theirs on float64: the output, then the gradients of
    sum(output * c) with respect to x, w and b."""
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    tb = None if b is None else torch.from_numpy(b).requires_grad_()
    want = theirs(tx, tw, tb)
    close(ours(x, w, b), want, tol)
    c = randn(*want.shape)
    (want * torch.from_numpy(c)).sum().backward()
    if b is None:
        gx, gw = kl.grad(lambda x, w: kl.sum(ours(x, w, None) * c), argnums=(0, 1))(x, w)
    else:
        gx, gw, gb = kl.grad(lambda x, w, b: kl.sum(ours(x, w, b) * c), argnums=(0, 1, 2))(x, w, b)
        close(gb, tb.grad, tol)
    close(gx, tx.grad, tol)
    close(gw, tw.grad, tol)


CONV_CONFIGS = [
    dict(),
    dict(stride=2, padding=1),
    dict(padding=2, dilation=2, groups=2),
    dict(padding="same", dilation=2),
    dict(padding="valid", groups=2),
]


TRANSPOSE_CONFIGS = [
    dict(),
    dict(stride=2, padding=1, output_padding=1),
    dict(stride=2, dilation=2, groups=2, output_padding=1),
    dict(padding=1, dilation=3, output_padding=2),
]
# (functions by rank, config, weight [w0, w1 / groups, *kernel] as (w0, w1, kernel))
FUNCTIONAL_CASES = [(FUNCS, config, (6, 4, (3, 2, 3))) for config in CONV_CONFIGS] + [
    (TFUNCS, config, (4, 6, (3, 2, 2))) for config in TRANSPOSE_CONFIGS
]


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("funcs,config,weight", FUNCTIONAL_CASES)
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("with_bias", [True, False])
def test_functional_convolutions_match_torch(rank, funcs, config, weight, batched, with_bias):
    ours, theirs = funcs[rank]
    w0, w1, kernel = weight
    x = randn(*((2,) if batched else ()), 4, *SPATIAL[rank])
    w = randn(w0, w1 // config.get("groups", 1), *kernel[:rank])
    b = randn(6) if with_bias else None
    check_against_torch(
        lambda x, w, b: ours(x, w, b, **config), lambda x, w, b: theirs(x, w, b, **config), x, w, b
    )


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_functional_bias_is_a_keyword_too(rank):
    ours, theirs = FUNCS[rank]
    x, w, b = randn(2, 3, *SPATIAL[rank]), randn(5, 3, *(2,) * rank), randn(5)
    close(
        ours(x, w, bias=b, padding=1),
        theirs(torch.from_numpy(x), torch.from_numpy(w), bias=torch.from_numpy(b), padding=1),
    )


def test_functional_conv_transpose_takes_torch_positional_order():
    # F.conv_transpose2d(input, weight, bias, stride, padding, output_padding, groups, dilation)
    x, w, b = randn(1, 4, 5, 5), randn(4, 3, 3, 3), randn(6)
    args = (b, 2, 1, 1, 2, 1)
    close(
        kl.conv_transpose2d(x, w, *args),
        F.conv_transpose2d(
            torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), *args[1:]
        ),
    )


@pytest.mark.parametrize("fn", [kl.conv2d, kl.conv_transpose2d])
def test_bias_of_the_wrong_shape_is_an_error(fn):
    x, w = randn(1, 4, 5, 5), randn(4, 4, 3, 3)
    with pytest.raises(
        kl.Error,
        match=r"bias does not match the output channels: got bias " r"f64\[3\].*expected \[4\]",
    ):
        fn(x, w, randn(3))
    with pytest.raises(kl.Error, match=r"bias does not match.*f64\[4,1\]"):
        fn(x, w, randn(4, 1))


@pytest.mark.parametrize(
    "fn,rank",
    [
        (kl.conv1d, 1),
        (kl.conv2d, 2),
        (kl.conv3d, 3),
        (kl.conv_transpose1d, 1),
        (kl.conv_transpose3d, 3),
    ],
)
def test_input_of_the_wrong_rank_is_an_error(fn, rank):
    w = randn(2, 2, *(1,) * rank)
    with pytest.raises(
        kl.Error, match=rf"input must have rank {rank + 2} \(or {rank + 1}, " r"unbatched\)"
    ):
        fn(randn(*(2,) * rank), w)


def test_same_padding_needs_stride_one_unbatched_too():
    with pytest.raises(kl.Error, match=r"\[conv2d\] padding='same' needs stride 1"):
        kl.conv2d(randn(3, 5, 5), randn(2, 3, 3, 3), stride=2, padding="same")


# ---- layers ------------------------------------------------------------------------------

LAYERS = {
    1: (kl.nn.Conv1d, torch.nn.Conv1d),
    2: (kl.nn.Conv2d, torch.nn.Conv2d),
    3: (kl.nn.Conv3d, torch.nn.Conv3d),
}
TLAYERS = {
    1: (kl.nn.ConvTranspose1d, torch.nn.ConvTranspose1d),
    2: (kl.nn.ConvTranspose2d, torch.nn.ConvTranspose2d),
    3: (kl.nn.ConvTranspose3d, torch.nn.ConvTranspose3d),
}


def check_layer(ours, theirs, x, tol=1e-9, torch_batched_only=False):
    """The layer against the torch module given its weights: output and gradients of
    sum(output * c) with respect to the input, the weight and the bias. torch_batched_only:
    torch gets an unbatched x as a batch of one (its circular padding needs the batch axis)."""
    with torch.no_grad():
        theirs.weight.copy_(torch.from_numpy(np.asarray(ours.weight)))
        if ours.bias is not None:
            theirs.bias.copy_(torch.from_numpy(np.asarray(ours.bias)))
    tx = torch.from_numpy(x).requires_grad_()
    want = theirs(tx[None])[0] if torch_batched_only else theirs(tx)
    close(ours(x), want, tol)
    c = randn(*want.shape)
    (want * torch.from_numpy(c)).sum().backward()
    g_layer, gx = kl.grad(lambda layer, x: kl.sum(layer(x) * c), argnums=(0, 1))(ours, x)
    close(gx, tx.grad, tol)
    close(g_layer.weight, theirs.weight.grad, tol)
    if ours.bias is None:
        assert theirs.bias is None and g_layer.bias is None
    else:
        close(g_layer.bias, theirs.bias.grad, tol)


LAYER_CONFIGS = [
    dict(),
    dict(stride=2, padding=1, bias=False),
    dict(padding=2, dilation=2, groups=2),
    dict(padding="same", dilation=2),
    dict(padding="valid"),
    dict(padding=2, padding_mode="reflect"),
    dict(padding=1, stride=2, padding_mode="replicate"),
    dict(padding=2, padding_mode="circular", groups=2),
    dict(padding="same", padding_mode="reflect"),
]


TLAYER_CONFIGS = [
    dict(),
    dict(stride=2, padding=1, output_padding=1, bias=False),
    dict(stride=2, dilation=2, groups=2, output_padding=1),
    dict(padding=1, dilation=3, output_padding=2),
]
LAYER_CASES = [(LAYERS, config, (3, 2, 3)) for config in LAYER_CONFIGS] + [
    (TLAYERS, config, (3, 2, 2)) for config in TLAYER_CONFIGS
]


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("classes,config,kernel", LAYER_CASES)
@pytest.mark.parametrize("batched", [True, False])
def test_conv_layers_match_torch(rank, classes, config, kernel, batched):
    ours_cls, torch_cls = classes[rank]
    k = kernel[:rank]
    ours = ours_cls(4, 6, k, kl.random.key(rank), dtype=kl.float64, **config)
    theirs = torch_cls(4, 6, k, dtype=torch.float64, **config)
    check_layer(
        ours,
        theirs,
        randn(*((2,) if batched else ()), 4, *SPATIAL[rank]),
        torch_batched_only=not batched and config.get("padding_mode") == "circular",
    )


@pytest.mark.parametrize(
    "cls,shape,fan_in",
    [
        (kl.nn.Conv1d, (6, 2, 3), 2 * 3),
        (kl.nn.Conv3d, (6, 2, 3, 3, 3), 2 * 27),
        (kl.nn.ConvTranspose2d, (4, 3, 3, 3), 3 * 9),
    ],
)
def test_layers_initialise_as_torch(cls, shape, fan_in):
    # PyTorch: kaiming_uniform(a=sqrt(5)) for the weight, i.e. U(±1/sqrt(fan_in)), and the bias
    # U(±1/sqrt(fan_in)), fan_in from the weight's shape.
    layer = cls(4, 6, 3, kl.random.key(0), groups=2)
    w, b = np.asarray(layer.weight), np.asarray(layer.bias)
    assert w.shape == shape and b.shape == (6,)
    bound = 1 / np.sqrt(fan_in)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.8 * bound
    assert np.abs(b).max() <= bound
    assert abs(w.std() - bound / np.sqrt(3)) < 0.25 * bound


def test_layers_are_pytrees_with_torch_parameter_names():
    model = kl.nn.Sequential(
        kl.nn.Conv1d(2, 3, 3, kl.random.key(0)),
        kl.nn.ConvTranspose3d(3, 2, 2, kl.random.key(1), bias=False),
    )
    assert [n for n, _ in kl.nn.named_parameters(model)] == ["0.weight", "0.bias", "1.weight"]
    leaves, treedef = kl.tree.flatten(model)
    rebuilt = kl.tree.unflatten(treedef, [leaf * 2 for leaf in leaves])
    close(rebuilt[0].weight, 2 * np.asarray(model[0].weight))
    assert rebuilt[1].stride == (1, 1, 1) and rebuilt[1].bias is None


def test_layer_attributes_and_repr():
    conv = kl.nn.Conv2d(2, 4, 3, kl.random.key(0), padding="same", padding_mode="circular")
    assert conv.padding == "same" and conv.padding_mode == "circular" and conv.stride == (1, 1)
    assert repr(conv) == (
        "Conv2d(weight=f32[4,2,3,3], bias=f32[4], stride=(1, 1), "
        "padding='same', dilation=(1, 1), groups=1, padding_mode='circular')"
    )
    conv1 = kl.nn.Conv1d(2, 4, 3, kl.random.key(0), stride=2)
    assert conv1.stride == (2,) and conv1.padding == (0,)
    t = kl.nn.ConvTranspose1d(2, 4, 3, kl.random.key(0), stride=2, output_padding=1)
    assert repr(t) == (
        "ConvTranspose1d(weight=f32[2,4,3], bias=f32[4], stride=(2,), "
        "padding=(0,), output_padding=(1,), dilation=(1,), groups=1)"
    )


def test_layer_errors():
    with pytest.raises(kl.Error, match=r"\[nn.Conv2d\] unknown padding_mode: got 'mirror'"):
        kl.nn.Conv2d(2, 4, 3, kl.random.key(0), padding_mode="mirror")
    with pytest.raises(kl.Error, match=r"\[nn.ConvTranspose2d\] only padding_mode 'zeros'"):
        kl.nn.ConvTranspose2d(2, 4, 3, kl.random.key(0), padding_mode="reflect")
    with pytest.raises(kl.Error, match=r"\[nn.Conv1d\] padding='same' needs stride 1"):
        kl.nn.Conv1d(2, 4, 3, kl.random.key(0), stride=2, padding="same")
    with pytest.raises(kl.Error, match=r"\[nn.Conv3d\] channels not divisible by groups"):
        kl.nn.Conv3d(3, 4, 3, kl.random.key(0), groups=2)
    with pytest.raises(
        kl.Error,
        match=r"\[nn.ConvTranspose3d\] input must have rank 5 \(or 4, "
        r"unbatched\): got f32\[2,2\]",
    ):
        kl.nn.ConvTranspose3d(2, 4, 3, kl.random.key(0))(np.ones((2, 2), np.float32))
    conv = kl.nn.Conv2d(2, 4, 3, kl.random.key(0))
    conv.bias = np.zeros(3, np.float32)
    with pytest.raises(kl.Error, match=r"\[conv2d\] bias does not match the output channels"):
        conv(np.ones((1, 2, 5, 5), np.float32))


def test_layers_under_jit_and_vmap():
    # vmap of a layer over the examples of a batch (each unbatched) is the layer on the batch.
    x = randn(3, 2, 5, 5)
    for layer in (
        kl.nn.Conv2d(
            2, 3, 3, kl.random.key(0), padding="same", padding_mode="reflect", dtype=kl.float64
        ),
        kl.nn.ConvTranspose2d(2, 3, 3, kl.random.key(1), stride=2, dtype=kl.float64),
    ):
        want = np.asarray(layer(x))
        close(kl.vmap(layer)(x), want)
        close(kl.jit(lambda m, x: m(x))(layer, x), want)
