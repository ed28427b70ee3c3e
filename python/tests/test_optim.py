"""kiln.optim from Python: SGD, Adam and AdamW against torch.optim over several steps, schedules
against their formulas and torch's StepLR, clipping against clip_grad_norm_, pytrees of
parameters (dicts, lists, nn layers) and the state as a pytree."""
import math

import numpy as np
import pytest
import torch

import kiln as kl


torch.set_num_threads(1)
rng = np.random.default_rng(1)


def key(i):
    if hasattr(kl, "random") and hasattr(kl.random, "key"):
        return kl.random.key(i)
    return kl.asarray(np.array([0, i], np.uint32))


def grad_of(name, p, step):
    """A made-up gradient, a function of the parameter and the step (the same on both sides)."""
    return np.asarray(np.sin(p * (1.0 + 0.1 * step)) + 0.3 * p + (0.05 * len(name)), np.float32)


def run_both(make_kiln, make_torch, steps=6):
    init = {
        "w": rng.standard_normal((3, 4)).astype(np.float32),
        "b": [
            rng.standard_normal(4).astype(np.float32),
            rng.standard_normal(()).astype(np.float32),
        ],
    }
    torch_params = {
        "w": torch.tensor(init["w"], requires_grad=True),
        "b0": torch.tensor(init["b"][0], requires_grad=True),
        "b1": torch.tensor(init["b"][1], requires_grad=True),
    }
    topt = make_torch(list(torch_params.values()))
    opt = make_kiln()
    params = {
        "w": kl.asarray(init["w"].copy()),
        "b": [kl.asarray(init["b"][0].copy()), kl.asarray(init["b"][1].copy())],
    }
    state = opt.init(params)
    for step in range(steps):
        for name, p in torch_params.items():
            p.grad = torch.from_numpy(grad_of(name, p.detach().numpy(), step).astype(np.float32))
        topt.step()
        grads = {
            "w": grad_of("w", np.asarray(params["w"]), step),
            "b": [
                grad_of("b0", np.asarray(params["b"][0]), step),
                grad_of("b1", np.asarray(params["b"][1]), step),
            ],
        }
        params, state = opt.update(params, grads, state)
    for got, name in [(params["w"], "w"), (params["b"][0], "b0"), (params["b"][1], "b1")]:
        np.testing.assert_allclose(
            np.asarray(got), torch_params[name].detach().numpy(), rtol=2e-5, atol=2e-6
        )
    assert int(np.asarray(state.step)) == steps
    return state


def test_sgd_momentum_matches_torch():
    run_both(
        lambda: kl.optim.sgd(0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
    )


def test_sgd_nesterov_matches_torch():
    run_both(
        lambda: kl.optim.sgd(0.05, momentum=0.8, nesterov=True),
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True),
    )


def test_adam_matches_torch():
    state = run_both(
        lambda: kl.optim.adam(0.01, b1=0.8, weight_decay=0.1),
        lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.8, 0.999), weight_decay=0.1),
    )
    assert sorted(state.slots) == ["mu", "nu"]
    assert isinstance(state.slots["mu"]["b"], list)


def test_adamw_matches_torch():
    run_both(
        lambda: kl.optim.adamw(0.01, weight_decay=0.05),
        lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.05),
    )


def test_adamw_decays_only_matrices_as_torch_param_groups_do():
    # torch's form: one group with weight decay for the matrices, one without for the rest.
    run_both(
        lambda: kl.optim.adamw(0.01, weight_decay=0.3, decay_on="matrices"),
        lambda ps: torch.optim.AdamW(
            [{"params": ps[:1], "weight_decay": 0.3}, {"params": ps[1:], "weight_decay": 0.0}],
            lr=0.01,
        ),
    )
    with pytest.raises(kl.Error, match="decay_on"):
        kl.optim.adamw(decay_on="biases")


def test_state_is_a_pytree_named_as_in_cpp():
    model = {"layers": [kl.nn.Linear(2, 3, key(1)), kl.nn.Linear(3, 1, key(2), bias=False)]}
    state = kl.optim.adam(1e-3).init(model)
    names = kl.tree.names(state)
    assert names[0] == "step" and "slots.mu.layers.0.weight" in names
    assert "slots.nu.layers.1.bias" not in names  # an unset optional has no leaf, as in C++
    assert isinstance(state.slots["mu"]["layers"][0], kl.nn.Linear)
    assert np.all(np.asarray(state.slots["nu"]["layers"][0].weight) == 0)


def test_layers_and_static_fields_as_parameters():
    import dataclasses

    @dataclasses.dataclass
    class Model:
        layer: object
        other: object
        tag: str = dataclasses.field(default="x", metadata={"static": True})

    params = Model(kl.nn.Linear(2, 2, key(3)), kl.asarray(np.ones(3, np.float32)))
    w0, b0 = np.asarray(params.layer.weight).copy(), np.asarray(params.layer.bias).copy()
    opt = kl.optim.sgd(0.5)
    grads = Model(kl.nn.Linear(2, 2, key(4)), np.full(3, 4.0, np.float32))
    grads.layer.weight = np.ones((2, 2), np.float32)
    grads.layer.bias = np.full(2, 2.0, np.float32)
    new, state = opt.update(params, grads, opt.init(params))
    assert isinstance(new, Model) and isinstance(new.layer, kl.nn.Linear) and new.tag == "x"
    np.testing.assert_allclose(np.asarray(new.layer.weight), w0 - 0.5)
    np.testing.assert_allclose(np.asarray(new.layer.bias), b0 - 1.0)
    np.testing.assert_array_equal(np.asarray(new.other), np.full(3, -1.0))
    assert (
        kl.tree.names(state)
        == [
            "step",
            "slots.momentum.layer.weight",
            "slots.momentum.layer.bias",
            "slots.momentum.other",
        ]
        or "momentum" not in state.slots
    )
    no_bias = kl.nn.Linear(2, 2, key(5))
    no_bias.bias = None  # an absent optional is a different structure, as in C++
    with pytest.raises(ValueError, match="structure"):
        opt.update(params, Model(no_bias, grads.other), state)


def test_mismatched_gradients_raise():
    opt = kl.optim.sgd(0.1)
    params = {"a": kl.asarray(np.zeros(2, np.float32))}
    state = opt.init(params)
    with pytest.raises(ValueError, match="structure"):
        opt.update(params, {"b": np.zeros(2, np.float32)}, state)
    with pytest.raises(kl.Error, match="'a'"):
        opt.update(params, {"a": np.zeros(3, np.float32)}, state)


def test_schedules():
    s = kl.optim.step_decay(0.1, step_size=3, gamma=0.5)
    p = torch.nn.Parameter(torch.zeros(1))
    topt = torch.optim.SGD([p], lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(topt, step_size=3, gamma=0.5)
    for step in range(10):
        assert s(step) == pytest.approx(topt.param_groups[0]["lr"])
        topt.step()
        sched.step()
    c = kl.optim.cosine_decay(1.0, 10, final_lr=0.1)
    for step in [0, 3, 10, 15]:
        want = 0.1 + 0.9 * (1 + math.cos(math.pi * min(step, 10) / 10)) / 2
        assert c(step) == pytest.approx(want)
    w = kl.optim.linear_warmup(4, 1.0)
    assert [w(i) for i in range(6)] == pytest.approx([0, 0.25, 0.5, 0.75, 1, 1])
    j = kl.optim.join([0.5, kl.optim.constant(0.1)], [2])
    assert [j(i) for i in range(4)] == pytest.approx([0.5, 0.5, 0.1, 0.1])
    custom = kl.optim.Schedule(lambda step: kl.asarray(0.5))
    assert custom(3) == pytest.approx(0.5)
    opt = kl.optim.sgd(kl.optim.step_decay(1.0, 1, 0.5))
    assert opt.learning_rate(2) == pytest.approx(0.25)
    params = {"x": kl.asarray(np.ones(1, np.float32))}
    state = opt.init(params)
    for _ in range(3):  # rates 1, 0.5, 0.25
        params, state = opt.update(params, {"x": np.ones(1, np.float32)}, state)
    np.testing.assert_allclose(np.asarray(params["x"]), [1 - 1.75])


def test_clip_by_global_norm_matches_torch():
    g = {
        "a": rng.standard_normal((3, 3)).astype(np.float32),
        "b": rng.standard_normal(4).astype(np.float32),
    }
    norm = np.sqrt(sum((v.astype(np.float64) ** 2).sum() for v in g.values()))
    assert float(np.asarray(kl.optim.global_norm(g))) == pytest.approx(norm, rel=1e-6)
    clipped = kl.optim.clip_by_global_norm(g, 1.0)
    ts = [torch.tensor(g["a"], requires_grad=True), torch.tensor(g["b"], requires_grad=True)]
    for t, v in zip(ts, g.values()):
        t.grad = torch.tensor(v)
    torch.nn.utils.clip_grad_norm_(ts, 1.0)
    np.testing.assert_allclose(np.asarray(clipped["a"]), ts[0].grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(clipped["b"]), ts[1].grad.numpy(), rtol=1e-6)


def test_update_inside_jit_matches_eager():
    opt = kl.optim.adam(0.1)
    params = {"w": kl.asarray(np.arange(4, dtype=np.float32))}
    grads = {"w": kl.asarray(np.ones(4, np.float32))}
    state = opt.init(params)
    eager = opt.update(params, grads, state)
    jitted = kl.jit(opt.update)(params, grads, state)
    np.testing.assert_allclose(np.asarray(jitted[0]["w"]), np.asarray(eager[0]["w"]), rtol=1e-6)
    assert int(np.asarray(jitted[1].step)) == 1


def test_jitted_training_of_a_sequential_matches_torch():
    model = kl.nn.Sequential([kl.nn.Linear(4, 8, key(1)), kl.nn.Tanh(), kl.nn.Linear(8, 3, key(2))])
    opt = kl.optim.adamw(0.05, weight_decay=0.1)
    state = opt.init(model)

    def loss(m, x, y):
        return kl.nn.cross_entropy(m(x), y)

    @kl.jit
    def step(m, s, x, y):
        value, grads = kl.value_and_grad(loss)(m, x, y)
        m, s = opt.update(m, grads, s)
        return m, s, value

    tm = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    with torch.no_grad():
        for i in (0, 2):
            tm[i].weight.copy_(torch.from_numpy(np.array(model[i].weight)))
            tm[i].bias.copy_(torch.from_numpy(np.array(model[i].bias)))
    topt = torch.optim.AdamW(tm.parameters(), lr=0.05, weight_decay=0.1)
    for i in range(5):
        x = rng.standard_normal((16, 4)).astype(np.float32)
        y = rng.integers(0, 3, 16).astype(np.int64)
        model, state, value = step(model, state, kl.asarray(x), kl.asarray(y))
        topt.zero_grad()
        want = torch.nn.functional.cross_entropy(tm(torch.from_numpy(x)), torch.from_numpy(y))
        want.backward()
        topt.step()
        assert float(np.asarray(value)) == pytest.approx(float(want), rel=1e-5)
    assert isinstance(model, kl.nn.Sequential) and int(np.asarray(state.step)) == 5
    for i in (0, 2):
        np.testing.assert_allclose(
            np.asarray(model[i].weight), tm[i].weight.detach().numpy(), rtol=1e-4, atol=1e-5
        )
    assert [n for n, _ in kl.nn.named_parameters(state.slots["mu"])] == [
        "0.weight",
        "0.bias",
        "2.weight",
        "2.bias",
    ]


def test_shard_layout_cuts_every_leaf_into_padded_pieces():
    params = {"w": kl.asarray(np.arange(10.0).reshape(2, 5)), "b": kl.asarray(np.arange(3.0))}
    layout = kl.optim.ShardLayout(params, 4)
    assert layout.parts == 4
    pieces = [kl.optim.shard(params, layout, p) for p in range(4)]
    # w: 10 elements padded to 12, 3 a piece, shaped [1, 3] (the leaf's rank); b: 3 -> 4, [1].
    assert pieces[0]["w"].shape == (1, 3) and pieces[0]["b"].shape == (1,)
    flat_w = np.concatenate([np.asarray(q["w"]).ravel() for q in pieces])
    np.testing.assert_array_equal(flat_w, np.r_[np.arange(10.0), 0, 0])
    flat_b = np.concatenate([np.asarray(q["b"]).ravel() for q in pieces])
    np.testing.assert_array_equal(flat_b, [0, 1, 2, 0])
    for part in (4, np.int64(4), -1):
        with pytest.raises(kl.Error, match="bad part"):
            kl.optim.shard(params, layout, part)
    with pytest.raises(ValueError, match="structure"):
        kl.optim.shard({"w": params["w"]}, layout, 0)
    zero = kl.optim.Zero(kl.optim.adam(1e-3), 2, "dp", layout)
    state = zero.init(params, 1)
    assert state.slots["mu"]["w"].shape == (1, 3)
    assert repr(zero) == "Zero(adam, stage 2, over 'dp')"
