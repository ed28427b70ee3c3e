"""kiln.nn from Python: layers against PyTorch 1.13 with the same weights, functions and losses
against torch.nn.functional, and layers as pytrees."""
import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln as kl

torch.set_num_threads(1)
rng = np.random.default_rng(0)


def key(i):
    if hasattr(kl, "random") and hasattr(kl.random, "key"):
        return kl.random.key(i)
    return kl.asarray(np.array([0, i], np.uint32))


def a(t):
    return np.asarray(t)


def randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def tt(x):
    return torch.from_numpy(np.array(x))


def close(got, want, tol=1e-5):
    np.testing.assert_allclose(
        a(got), want.detach().numpy() if torch.is_tensor(want) else want, rtol=tol, atol=tol
    )


def test_linear_matches_torch():
    layer = kl.nn.Linear(5, 3, key=key(1))
    assert a(layer.weight).shape == (3, 5) and a(layer.bias).shape == (3,)
    bound = 1 / np.sqrt(5)
    assert np.all(np.abs(a(layer.weight)) <= bound)
    ref = torch.nn.Linear(5, 3)
    with torch.no_grad():
        ref.weight.copy_(tt(a(layer.weight)))
        ref.bias.copy_(tt(a(layer.bias)))
    x = randn(4, 5)
    close(layer(x), ref(tt(x)))
    nobias = kl.nn.Linear(5, 3, key(2), bias=False)
    assert nobias.bias is None
    close(nobias(x), tt(x) @ tt(a(nobias.weight)).T)


def test_parameters_are_settable():
    layer = kl.nn.Linear(2, 2, key=key(3))
    w = np.array([[1, 2], [3, 4]], np.float32)
    layer.weight = w
    layer.bias = None
    close(layer(np.ones((1, 2), np.float32)), np.array([[3, 7]], np.float32))
    assert "Linear(weight=f32[2,2]" in repr(layer)


@pytest.mark.parametrize(
    "stride,padding,dilation,groups", [(1, 0, 1, 1), (2, 1, 1, 2), ((1, 2), (2, 1), 2, 1)]
)
def test_conv2d_matches_torch(stride, padding, dilation, groups):
    layer = kl.nn.Conv2d(
        4, 6, (3, 2), key=key(4), stride=stride, padding=padding, dilation=dilation, groups=groups
    )
    ref = torch.nn.Conv2d(
        4, 6, (3, 2), stride=stride, padding=padding, dilation=dilation, groups=groups
    )
    with torch.no_grad():
        ref.weight.copy_(tt(a(layer.weight)))
        ref.bias.copy_(tt(a(layer.bias)))
    x = randn(2, 4, 9, 8)
    close(layer(x), ref(tt(x)), 1e-4)


def test_pools_and_flatten():
    x = randn(2, 3, 8, 8)
    close(kl.nn.MaxPool2d(2)(x), F.max_pool2d(tt(x), 2))
    close(kl.nn.AvgPool2d(3, stride=2, padding=1)(x), F.avg_pool2d(tt(x), 3, 2, 1))
    assert a(kl.nn.Flatten()(x)).shape == (2, 192)
    assert (
        repr(kl.nn.MaxPool2d(3)) == "MaxPool2d(kernel_size=(3, 3), stride=(3, 3), padding=(0, 0))"
    )


def test_layernorm_matches_torch():
    layer = kl.nn.LayerNorm((4, 5))
    w, b = randn(4, 5), randn(4, 5)
    layer.weight, layer.bias = w, b
    x = randn(3, 4, 5)
    close(layer(x), F.layer_norm(tt(x), (4, 5), tt(w), tt(b)), 1e-5)


def test_batchnorm_training_and_eval_match_torch():
    layer = kl.nn.BatchNorm(3, momentum=0.2)
    w, b = randn(3), randn(3)
    layer.weight, layer.bias = w, b
    ref = torch.nn.BatchNorm2d(3, momentum=0.2)
    with torch.no_grad():
        ref.weight.copy_(tt(w))
        ref.bias.copy_(tt(b))
    state = layer.initial_state()
    for _ in range(2):
        x = randn(4, 3, 5, 5)
        y, state = layer(x, state, training=True)
        close(y, ref(tt(x)), 1e-4)
    close(state.mean, ref.running_mean, 1e-5)
    close(state.var, ref.running_var, 1e-5)
    ref.eval()
    x = randn(4, 3, 5, 5)
    y, same = layer(x, state, training=False)
    close(y, ref(tt(x)), 1e-4)
    close(same.mean, a(state.mean))


def test_embedding_matches_torch():
    layer = kl.nn.Embedding(10, 4, key=key(5))
    idx = np.array([[1, 9], [0, 3]], np.int64)
    close(layer(idx), F.embedding(tt(idx), tt(a(layer.weight))))


def test_group_and_rms_norm():
    x = randn(2, 6, 3, 3)
    gn = kl.nn.GroupNorm(3, 6)
    w, b = randn(6), randn(6)
    gn.weight, gn.bias = w, b
    close(gn(x), F.group_norm(tt(x), 3, tt(w), tt(b)), 1e-5)
    rms = kl.nn.RMSNorm(3, eps=1e-6)
    ref = tt(x) / torch.sqrt((tt(x) ** 2).mean(-1, keepdim=True) + 1e-6)
    close(rms(x), ref, 1e-5)


def test_activations_match_torch():
    x = randn(50) * 4
    close(kl.nn.relu(x), F.relu(tt(x)))
    close(kl.nn.gelu(x), F.gelu(tt(x)), 1e-5)
    close(kl.nn.gelu(x, approximate=True), F.gelu(tt(x), approximate="tanh"), 1e-5)
    close(kl.nn.silu(x), F.silu(tt(x)), 1e-5)
    close(kl.nn.softplus(x), F.softplus(tt(x)), 1e-5)
    close(kl.nn.softplus(x, beta=2.0, threshold=5.0), F.softplus(tt(x), 2.0, 5.0), 1e-5)
    close(kl.nn.log_sigmoid(x), F.logsigmoid(tt(x)), 1e-5)
    close(kl.nn.elu(x, 0.5), F.elu(tt(x), 0.5), 1e-5)
    close(kl.nn.leaky_relu(x, 0.2), F.leaky_relu(tt(x), 0.2), 1e-5)
    m = randn(3, 7)
    close(kl.nn.softmax(m, axis=0), F.softmax(tt(m), 0), 1e-6)
    close(kl.nn.log_softmax(m), F.log_softmax(tt(m), -1), 1e-5)
    for layer, fn in [
        (kl.nn.ReLU(), F.relu),
        (kl.nn.Tanh(), torch.tanh),
        (kl.nn.GELU(approximate=True), lambda v: F.gelu(v, approximate="tanh")),
        (kl.nn.ELU(2.0), lambda v: F.elu(v, 2.0)),
        (kl.nn.LeakyReLU(0.3), lambda v: F.leaky_relu(v, 0.3)),
        (kl.nn.Softplus(beta=2.0), lambda v: F.softplus(v, 2.0)),
    ]:
        close(layer(x), fn(tt(x)), 1e-5)


def test_losses_match_torch():
    logits, labels = randn(6, 5), np.array([0, 4, 2, -100, 1, 3], np.int64)
    close(kl.nn.cross_entropy(logits, labels), F.cross_entropy(tt(logits), tt(labels)), 1e-5)
    close(
        kl.nn.cross_entropy(logits, labels, label_smoothing=0.1),
        F.cross_entropy(tt(logits), tt(labels), label_smoothing=0.1),
        1e-5,
    )
    logp = F.log_softmax(tt(logits), -1)
    close(kl.nn.nll_loss(logp.numpy(), labels), F.nll_loss(logp, tt(labels)), 1e-5)
    close(
        kl.nn.nll_loss(logp.numpy(), labels, reduction="sum"),
        F.nll_loss(logp, tt(labels), reduction="sum"),
        1e-5,
    )
    p, t = randn(4, 3), randn(4, 3)
    close(kl.nn.mse(p, t), F.mse_loss(tt(p), tt(t)), 1e-6)
    close(kl.nn.huber_loss(p, t, delta=0.5), F.huber_loss(tt(p), tt(t), delta=0.5), 1e-6)
    close(kl.nn.huber_loss(p, t, reduction="none"), F.huber_loss(tt(p), tt(t), reduction="none"))
    probs = rng.uniform(size=(4, 3)).astype(np.float32)
    close(
        kl.nn.binary_cross_entropy_with_logits(p * 10, probs),
        F.binary_cross_entropy_with_logits(tt(p * 10), tt(probs)),
        1e-5,
    )
    target = F.softmax(tt(t), -1)
    logq = F.log_softmax(tt(p), -1)
    close(
        kl.nn.kl_div(logq.numpy(), target.numpy(), reduction="batchmean"),
        F.kl_div(logq, target, reduction="batchmean"),
        1e-6,
    )
    close(
        kl.nn.accuracy(logits, labels),
        np.mean((logits.argmax(-1) == labels)[labels != -100]).astype(np.float32),
    )
    with pytest.raises(kl.Error, match="reduction"):
        kl.nn.huber_loss(p, t, reduction="avg")


def test_multihead_attention_matches_torch():
    layer = kl.nn.MultiheadAttention(8, 2, key=key(6), batch_first=True)
    ref = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(tt(a(layer.in_proj_weight)))
        ref.in_proj_bias.copy_(tt(a(layer.in_proj_bias)))
        ref.out_proj.weight.copy_(tt(a(layer.out_proj.weight)))
        ref.out_proj.bias.copy_(tt(a(layer.out_proj.bias)))
    q, kv = randn(2, 3, 8), randn(2, 4, 8)
    mask = np.array([[False, False, True, False], [False, False, False, True]])
    out, w = layer(q, kv, kv, key_padding_mask=mask)
    want_out, want_w = ref(tt(q), tt(kv), tt(kv), key_padding_mask=tt(mask))
    close(out, want_out, 1e-5)
    close(w, want_w, 1e-5)
    out, w = layer(q, kv, kv, need_weights=False)
    assert w is None
    qs, ks, vs = randn(2, 2, 3, 4), randn(2, 2, 5, 4), randn(2, 2, 5, 4)
    close(
        kl.nn.scaled_dot_product_attention(qs, ks, vs, is_causal=True),
        torch.softmax(
            (tt(qs) @ tt(ks).transpose(-1, -2)) / 2
            + torch.triu(torch.full((3, 5), float("-inf")), 1),
            -1,
        )
        @ tt(vs),
        1e-5,
    )


def test_lstm_and_gru_match_torch():
    lstm = kl.nn.LSTM(3, 4, key=key(7), num_layers=2, bidirectional=True)
    ref = torch.nn.LSTM(3, 4, num_layers=2, bidirectional=True)
    cells = lstm.cells
    with torch.no_grad():
        for layer in range(2):
            for d, suffix in enumerate(["", "_reverse"]):
                c = cells[2 * layer + d]
                for name in ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]:
                    getattr(ref, f"{name}_l{layer}{suffix}").copy_(tt(a(getattr(c, name))))
    x = randn(5, 2, 3)
    y, state = lstm(x)
    want_y, (want_h, want_c) = ref(tt(x))
    close(y, want_y, 1e-5)
    close(state.h, want_h, 1e-5)
    close(state.c, want_c, 1e-5)

    gru = kl.nn.GRU(3, 4, key=key(8), batch_first=True)
    ref = torch.nn.GRU(3, 4, batch_first=True)
    with torch.no_grad():
        for name in ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]:
            getattr(ref, f"{name}_l0").copy_(tt(a(getattr(gru.cells[0], name))))
    x, h0 = randn(2, 5, 3), randn(1, 2, 4)
    y, h = gru(x, h0)
    want_y, want_h = ref(tt(x), tt(h0))
    close(y, want_y, 1e-5)
    close(h, want_h, 1e-5)

    cell = kl.nn.LSTMCell(3, 4, key=key(9))
    ref = torch.nn.LSTMCell(3, 4)
    with torch.no_grad():
        for name in ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]:
            getattr(ref, name).copy_(tt(a(getattr(cell, name))))
    x = randn(2, 3)
    s = cell(x)
    h, c = ref(tt(x))
    close(s.h, h, 1e-5)
    close(cell(x, s).c, ref(tt(x), (h, c))[1], 1e-5)


def test_dropout_and_context():
    x = np.ones((1000,), np.float32)
    drop = kl.nn.Dropout(0.25)
    close(drop(x), x)
    close(drop(x, kl.nn.Context.eval()), x)
    ctx = kl.nn.Context.train(key(10))
    assert ctx.training and not kl.nn.Context.eval().training
    y1, y2 = a(drop(x, ctx)), a(drop(x, ctx))
    assert set(np.unique(y1)) <= {0.0, np.float32(1 / 0.75)}
    assert 0.15 < np.mean(y1 == 0) < 0.35
    assert not np.array_equal(y1, y2)  # the context's key is split for each layer call
    again = a(drop(x, kl.nn.Context.train(key(10))))
    np.testing.assert_array_equal(again, y1)


def test_sequential_and_names():
    model = kl.nn.Sequential(
        [
            kl.nn.Linear(4, 8, key(1)),
            kl.nn.ReLU(),
            kl.nn.Dropout(0.5),
            kl.nn.Linear(8, 2, key(2), bias=False),
        ]
    )
    x = randn(3, 4)
    l0, l3 = model[0], model[3]
    want = np.maximum(x @ a(l0.weight).T + a(l0.bias), 0) @ a(l3.weight).T
    close(model(x), want, 1e-5)
    names = [n for n, _ in kl.nn.named_parameters(model)]
    assert names == ["0.weight", "0.bias", "3.weight"]
    assert kl.nn.parameter_count(model) == 4 * 8 + 8 + 8 * 2
    y = a(model(x, kl.nn.Context.train(key(3))))
    assert y.shape == (3, 2)


def test_layers_are_native_pytrees():
    conv = kl.nn.Conv2d(2, 3, 3, key(1), stride=2, bias=False)
    leaves, structure = kl.tree.flatten(conv)
    assert len(leaves) == 1  # no bias: no leaf
    assert [n for n, _ in kl.nn.named_parameters({"c": conv})] == ["c.weight"]
    rebuilt = kl.tree.unflatten(structure, [np.zeros((3, 2, 3, 3), np.float32)])
    assert isinstance(rebuilt, kl.nn.Conv2d) and rebuilt.stride == (2, 2)
    assert np.all(a(rebuilt.weight) == 0) and rebuilt.bias is None
    c2 = copy.deepcopy(conv)
    c2.stride = (1, 1)
    assert conv.stride == (2, 2)


def test_init_functions():
    w = a(kl.nn.init.kaiming_uniform(key(1), (300, 200)))
    bound = np.sqrt(6 / 200)
    assert w.shape == (300, 200) and np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    w = a(kl.nn.init.xavier_normal(key(2), (300, 200)))
    assert abs(w.std() - np.sqrt(2 / 500)) < 0.05 * np.sqrt(2 / 500)


def test_grad_through_a_model_pytree():
    model = {"l1": kl.nn.Linear(3, 4, key(1)), "l2": kl.nn.Linear(4, 1, key(2))}
    x, y = randn(5, 3), randn(5, 1)

    def loss(m, x, y):
        return kl.nn.mse(m["l2"](kl.nn.relu(m["l1"](x))), y)

    g = kl.grad(loss)(model, kl.asarray(x), kl.asarray(y))
    assert isinstance(g["l1"], kl.nn.Linear)
    tm = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    with torch.no_grad():
        for i, k in [(0, "l1"), (2, "l2")]:
            tm[i].weight.copy_(tt(a(model[k].weight)))
            tm[i].bias.copy_(tt(a(model[k].bias)))
    F.mse_loss(tm(tt(x)), tt(y)).backward()
    close(g["l1"].weight, tm[0].weight.grad, 1e-5)
    close(g["l2"].bias, tm[2].bias.grad, 1e-5)


def test_layers_inside_transformations():
    x = np.ones(64, np.float32)

    @kl.jit
    def drop(x, k):
        return kl.nn.Dropout(0.5)(x, kl.nn.Context.train(k))

    np.testing.assert_array_equal(
        a(drop(x, key(7))), a(kl.nn.Dropout(0.5)(x, kl.nn.Context.train(key(7))))
    )
    bn = kl.nn.BatchNorm(3)
    xb = randn(4, 3, 2, 2)
    y, state = kl.jit(lambda b, s, x: b(x, s, True))(bn, bn.initial_state(), xb)
    assert isinstance(state, kl.nn.BatchNormState)
    close(state.mean, 0.1 * xb.mean(axis=(0, 2, 3)), 1e-6)
    layer = kl.nn.Linear(3, 2, key(8))
    xs = randn(5, 4, 3)
    ys = kl.vmap(lambda m, x: m(x), in_axes=(None, 0))(layer, xs)
    close(ys, xs @ a(layer.weight).T + a(layer.bias), 1e-5)


def test_more_activations_match_torch():
    x = randn(6, 8) * 5
    x[0, :5] = [-3, 3, 0, 6, -1]  # the kinks
    f64 = x.astype(np.float64)
    for ours, theirs in [
        (kl.nn.mish, F.mish),
        (kl.nn.relu6, F.relu6),
        (kl.nn.hardswish, F.hardswish),
        (kl.nn.hardsigmoid, F.hardsigmoid),
        (kl.nn.selu, F.selu),
        (lambda v: kl.nn.celu(v, 0.7), lambda v: F.celu(v, 0.7)),
        (lambda v: kl.nn.hardtanh(v, -2.0, 3.0), lambda v: F.hardtanh(v, -2.0, 3.0)),
        (lambda v: kl.nn.glu(v, 1), lambda v: F.glu(v, 1)),
        (lambda v: kl.nn.softmin(v, 0), lambda v: F.softmin(v, 0)),
        (kl.nn.normalize, F.normalize),
        (lambda v: kl.nn.normalize(v, 1.0, 0), lambda v: F.normalize(v, 1.0, 0)),
        (
            lambda v: kl.nn.normalize(v, float("inf"), -1),
            lambda v: F.normalize(v, float("inf"), -1),
        ),
    ]:
        close(ours(x), theirs(tt(x)), 1e-5)
        # float64, with the gradients of a random weighting PyTorch's autograd gives (to 1e-7:
        # PyTorch's hardsigmoid backward multiplies by a float32 1/6 in float64 too).
        c = rng.standard_normal(theirs(tt(f64)).shape)
        t = tt(f64).requires_grad_()
        (theirs(t) * tt(c)).sum().backward()
        close(kl.grad(lambda v: kl.sum(ours(v) * c))(f64), t.grad, 1e-7)
    w = rng.uniform(0.1, 0.5, 8).astype(np.float32)
    close(kl.nn.prelu(x, w[:1]), F.prelu(tt(x), tt(w[:1])), 1e-6)
    image = randn(2, 8, 3, 3)
    close(kl.nn.prelu(image, w), F.prelu(tt(image), tt(w)), 1e-6)
    layer = kl.nn.PReLU(8)
    assert kl.nn.named_parameters(layer)[0][0] == "weight"
    close(layer(image), torch.nn.PReLU(8)(tt(image)), 1e-6)
    for bad in (0, -1):  # the layer's own error, not full's
        with pytest.raises(kl.Error, match=r"\[nn.PReLU\] non-positive size"):
            kl.nn.PReLU(bad)
    for layer, ref in [
        (kl.nn.Mish(), torch.nn.Mish()),
        (kl.nn.ReLU6(), torch.nn.ReLU6()),
        (kl.nn.Hardswish(), torch.nn.Hardswish()),
        (kl.nn.Hardsigmoid(), torch.nn.Hardsigmoid()),
        (kl.nn.SELU(), torch.nn.SELU()),
        (kl.nn.Activation("celu"), torch.nn.CELU()),
        (kl.nn.Activation("hardtanh"), torch.nn.Hardtanh()),
        (kl.nn.Hardtanh(-2.0, 2.0), torch.nn.Hardtanh(-2.0, 2.0)),
        (kl.nn.CELU(2.0), torch.nn.CELU(2.0)),
        (kl.nn.GLU(0), torch.nn.GLU(0)),
    ]:
        close(layer(x), ref(tt(x)), 1e-5)


def test_relu_propagates_nan_as_torch():
    x = np.array([np.nan, -1.0, 0.0, 2.0])
    t = tt(x).requires_grad_()
    F.relu(t).sum().backward()
    for f in (kl.nn.relu, kl.nn.ReLU(), kl.nn.Activation("relu"), kl.jit(kl.nn.relu)):
        close(f(x), F.relu(tt(x)))
    close(kl.grad(lambda v: kl.sum(kl.nn.relu(v)))(x), t.grad)


def test_functional_dropout():
    x = np.ones((200, 50), np.float32)
    y = a(kl.nn.dropout(x, 0.25, key(5)))
    assert set(np.unique(y)) <= {0.0, np.float32(1 / 0.75)}
    assert abs((y == 0).mean() - 0.25) < 0.02
    np.testing.assert_array_equal(y, a(kl.nn.dropout(x, 0.25, key(5))))
    with pytest.raises(kl.Error, match="rate out of range"):
        kl.nn.dropout(x, 1.0, key(5))


def test_more_losses_match_torch():
    logits = randn(6, 5)
    labels = np.array([0, 4, 2, -100, 1, 3], np.int64)
    w = rng.uniform(0.2, 2.0, 5).astype(np.float32)
    probs = F.softmax(tt(randn(6, 5)), -1).numpy()
    for reduction in ("none", "sum", "mean"):
        for smoothing in (0.0, 0.2):
            close(
                kl.nn.cross_entropy(logits, labels, smoothing, reduction=reduction, weight=w),
                F.cross_entropy(
                    tt(logits), tt(labels), tt(w), reduction=reduction, label_smoothing=smoothing
                ),
                1e-5,
            )
            close(
                kl.nn.cross_entropy(logits, probs, smoothing, reduction=reduction, weight=w),
                F.cross_entropy(
                    tt(logits), tt(probs), tt(w), reduction=reduction, label_smoothing=smoothing
                ),
                1e-5,
            )
        logp = F.log_softmax(tt(logits), -1)
        close(
            kl.nn.nll_loss(logp.numpy(), labels, reduction=reduction, weight=w),
            F.nll_loss(logp, tt(labels), tt(w), reduction=reduction),
            1e-5,
        )
        p, t = randn(4, 3), randn(4, 3)
        close(kl.nn.mse(p, t, reduction), F.mse_loss(tt(p), tt(t), reduction=reduction), 1e-6)
        close(kl.nn.l1_loss(p, t, reduction), F.l1_loss(tt(p), tt(t), reduction=reduction), 1e-6)
        for beta in (0.0, 0.5, 1.0):
            close(
                kl.nn.smooth_l1_loss(p, t, beta, reduction),
                F.smooth_l1_loss(tt(p), tt(t), reduction=reduction, beta=beta),
                1e-6,
            )
        q = rng.uniform(size=(4, 3)).astype(np.float32)
        q[0, :2] = [0.0, 1.0]  # log clamped at -100
        target = rng.uniform(size=(4, 3)).astype(np.float32)
        elem = rng.uniform(0.5, 2, (4, 1)).astype(np.float32)
        close(
            kl.nn.binary_cross_entropy(q, target, reduction, weight=elem),
            F.binary_cross_entropy(tt(q), tt(target), tt(elem), reduction=reduction),
            1e-5,
        )
        # Outside [0, 1] the loss is NaN (PyTorch raises), never a finite, even negative, value.
        outside = kl.nn.binary_cross_entropy(
            np.array([1.5, -0.5, 0.5], np.float32), np.array([1.0, 0.0, 0.5], np.float32), "none"
        )
        assert np.isnan(np.asarray(outside)[:2]).all() and np.isfinite(np.asarray(outside)[2])
        pos = rng.uniform(0.5, 3, 3).astype(np.float32)
        close(
            kl.nn.binary_cross_entropy_with_logits(
                p * 10, target, reduction, pos_weight=pos, weight=elem
            ),
            F.binary_cross_entropy_with_logits(
                tt(p * 10), tt(target), tt(elem), reduction=reduction, pos_weight=tt(pos)
            ),
            1e-5,
        )


def test_normalisation_functions_match_torch():
    x = randn(4, 3, 5, 2)
    w, b = randn(3), randn(3)
    close(kl.nn.layer_norm(x, (5, 2)), F.layer_norm(tt(x), (5, 2)), 1e-5)
    w2, b2 = randn(2), randn(2)
    close(kl.nn.layer_norm(x, 2, w2, b2), F.layer_norm(tt(x), (2,), tt(w2), tt(b2)), 1e-5)
    with pytest.raises(kl.Error, match=r"\[nn.layer_norm\] empty normalized_shape"):
        kl.nn.layer_norm(x, ())  # PyTorch's error; not a normalisation over every axis
    close(kl.nn.instance_norm(x, w, b), F.instance_norm(tt(x), weight=tt(w), bias=tt(b)), 1e-5)
    close(kl.nn.instance_norm(x), F.instance_norm(tt(x)), 1e-5)
    mean, var = torch.zeros(3), torch.ones(3)
    state = kl.nn.BatchNormState(mean.numpy().copy(), var.numpy().copy())
    y, new = kl.nn.batch_norm(x, state, w, b, training=True, momentum=0.3)
    want = F.batch_norm(tt(x), mean, var, tt(w), tt(b), training=True, momentum=0.3)
    close(y, want, 1e-5)
    close(new.mean, mean, 1e-6)
    close(new.var, var, 1e-5)
    y, none = kl.nn.batch_norm(x, None, training=True)
    assert none is None
    close(y, F.batch_norm(tt(x), None, None, training=True), 1e-5)
    y, same = kl.nn.batch_norm(x, new, w, b)
    close(y, F.batch_norm(tt(x), mean, var, tt(w), tt(b)), 1e-5)
    # The layers without affine parameters.
    ln = kl.nn.LayerNorm((5, 2), elementwise_affine=False)
    assert ln.weight is None and kl.nn.named_parameters(ln) == []
    close(ln(x), torch.nn.LayerNorm((5, 2), elementwise_affine=False)(tt(x)), 1e-5)
    bn = kl.nn.BatchNorm(3, affine=False)
    assert bn.weight is None and kl.nn.named_parameters(bn) == []
    ref = torch.nn.BatchNorm2d(3, affine=False)
    y, s = bn(x, bn.initial_state(), training=True)
    close(y, ref(tt(x)), 1e-5)
    close(s.var, ref.running_var, 1e-5)
