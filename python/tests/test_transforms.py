"""Transformations of Python callables against independent references: analytic derivatives,
float64 central differences, Python loops instead of vmap, eager runs instead of jit."""
import collections
import dataclasses
import faulthandler
import gc
import signal
import sys
import threading
import time
import weakref

import numpy as np
import pytest

import kiln as kl
from memory import check_rss_growth, rss_bytes
from kops import (
    add,
    central_diff,
    close,
    cos,
    div,
    exp,
    greater,
    less,
    log,
    matmul,
    maximum,
    mean,
    mul,
    neg,
    pow,
    sin,
    square,
    sub,
    sum,
    tanh,
)

rng = np.random.default_rng(0)


def randn(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# ---- jit ---------------------------------------------------------------------------------------


def test_jit_traces_once_per_signature_then_runs_without_python():
    calls = []

    def f(x, y):
        calls.append(1)
        return add(mul(sin(x), y), 1.0)

    jf = kl.jit(f)
    x, y = randn(3), randn(3)
    for _ in range(5):
        close(jf(x, y), np.sin(x) * y + 1)
    assert len(calls) == 1 and jf._cache_size() == 1
    jf(randn(4), randn(4))  # a new shape: traced again
    assert len(calls) == 2 and jf._cache_size() == 2
    jf(kl.asarray(x), kl.asarray(y))  # the first signature again: cached
    assert len(calls) == 2
    ir = jf.lower(x, y)  # the IR of a cached signature: no new trace
    assert "sin" in ir and len(calls) == 2


def test_jit_keeps_its_most_recent_specialisations_and_frees_the_rest(monkeypatch):
    monkeypatch.setenv("KILN_JIT_CACHE_SIZE", "4")  # read when the jitted function is made
    calls = []

    def f(x):
        calls.append(1)
        return add(mul(x, 2.0), 1.0)

    jf = kl.jit(f)
    for n in range(1, 21):
        x = randn(n)
        close(jf(x), x * 2 + 1)
        assert jf._cache_size() == min(n, 4)
    assert len(calls) == 20
    jf(randn(1))  # evicted: traced again
    assert len(calls) == 21


def test_a_dropped_jitted_function_is_freed():
    def f(x):
        return add(mul(x, 2.0), 1.0)

    jf = kl.jit(f)
    jf(randn(3))
    ref = weakref.ref(f)
    del f, jf
    gc.collect()
    assert ref() is None


def test_ctrl_c_stops_an_endless_jitted_while_loop():
    @kl.jit
    def loop(x, bound):
        return kl.while_loop(lambda c: less(c, bound), lambda c: add(c, 1.0), x)

    x = np.float32(0)
    assert float(loop(x, np.float32(5))) == 5  # compiled, and a bounded run is not interrupted
    # Were Ctrl-C ignored, the process would end here after 60 s instead of hanging.
    faulthandler.dump_traceback_later(60, exit=True)
    timer = threading.Timer(0.3, signal.raise_signal, (signal.SIGINT,))
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            loop(x, np.float32(np.inf))
    finally:
        timer.join()
        faulthandler.cancel_dump_traceback_later()
    assert time.monotonic() - start < 10
    assert float(loop(x, np.float32(3))) == 3


def test_jit_metadata_and_decorator_forms():
    def scaled(x, n):
        """Doc of scaled."""
        return mul(x, float(n))

    j = kl.jit(scaled, static_argnums=(1,))
    assert j.__name__ == "scaled" and j.__doc__ == "Doc of scaled." and j.__wrapped__ is scaled

    @kl.jit
    def double(x):
        return add(x, x)

    assert double.__name__ == "double"
    close(double(np.arange(3.0, dtype=np.float32)), [0, 2, 4])

    @kl.jit(static_argnums=1)
    def power(x, n):
        out = x
        for _ in range(n - 1):  # Python control flow on the static argument
            out = mul(out, x)
        return out

    x = randn(4)
    close(power(x, 3), x**3, rtol=1e-5)
    close(power(x, 2), x**2)


def test_jit_static_argnums_one_cache_per_value():
    calls = []

    def f(x, mode):
        calls.append(mode)
        return sin(x) if mode == "sin" else cos(x)

    jf = kl.jit(f, static_argnums=1)
    x = randn(3)
    close(jf(x, "sin"), np.sin(x))
    close(jf(x, "cos"), np.cos(x))
    close(jf(x, "sin"), np.sin(x))
    assert calls == ["sin", "cos"]


def test_jit_kwargs_are_traced():
    calls = []

    def f(x, scale=None):
        calls.append(1)
        return mul(x, scale)

    jf = kl.jit(f)
    x = randn(3)
    close(jf(x, scale=np.float32(2.0)), 2 * x)
    close(jf(x, scale=np.float32(3.0)), 3 * x)
    assert len(calls) == 1


Point = collections.namedtuple("Point", ["x", "y"])


@dataclasses.dataclass
class Params:
    w: object
    b: object
    name: str = "p"


class Pair:
    """A registered pytree node."""

    def __init__(self, a, b):
        self.a, self.b = a, b


kl.tree.register(Pair, lambda p: ((p.a, p.b), "pair"), lambda aux, ch: Pair(*ch))


def every_kind(x):
    """A pytree with one of every kind of node around x."""
    return {
        "list": [x, x],
        "tuple": (x,),
        "point": Point(x, x),
        "none": None,
        "params": Params(w=x, b=x),
        "pair": Pair(x, x),
        "label": "static",
    }


def check_every_kind(tree, expect):
    assert set(tree) == {"list", "tuple", "point", "none", "params", "pair", "label"}
    close(tree["list"][0], expect)
    close(tree["list"][1], expect)
    assert isinstance(tree["tuple"], tuple)
    close(tree["tuple"][0], expect)
    assert isinstance(tree["point"], Point)
    close(tree["point"].y, expect)
    assert tree["none"] is None
    assert isinstance(tree["params"], Params) and tree["params"].name == "p"
    close(tree["params"].b, expect)
    assert isinstance(tree["pair"], Pair)
    close(tree["pair"].b, expect)
    assert tree["label"] == "static"


def tree_sum(tree):
    total = 0.0
    for leaf in kl.tree.leaves(tree):
        total = add(sum(leaf), total)
    return total


def test_every_pytree_kind_through_every_transformation():
    x = randn(3)
    scale = lambda t: kl.tree.map(lambda v: mul(v, 2.0), t)  # noqa: E731
    check_every_kind(scale(every_kind(x)), 2 * x)
    check_every_kind(kl.jit(scale)(every_kind(x)), 2 * x)
    # grad: d/dleaf sum(2 * leaf) = 2 for every leaf; the gradient has the argument's structure.
    check_every_kind(kl.grad(lambda t: tree_sum(scale(t)))(every_kind(x)), np.full(3, 2.0))
    xs = randn(4, 3)
    batched = kl.vmap(scale)(every_kind(xs))
    check_every_kind(batched, 2 * xs)
    out, tangent = kl.jvp(scale, (every_kind(x),), (every_kind(np.ones(3, np.float32)),))
    check_every_kind(out, 2 * x)
    check_every_kind(tangent, np.full(3, 2.0))
    out, vjp_fn = kl.vjp(scale, every_kind(x))
    (ct,) = vjp_fn(every_kind(np.ones(3, np.float32)))
    check_every_kind(ct, np.full(3, 2.0))
    check_every_kind(kl.checkpoint(scale)(every_kind(x)), 2 * x)
    # jacrev: each result leaf holds the argument's structure of blocks d(out)/d(leaf).
    jac = kl.jacrev(lambda t: mul(t["tuple"][0], 2.0))(every_kind(x))
    close(jac["tuple"][0], 2 * np.eye(3))
    close(jac["list"][0], np.zeros((3, 3)))
    jac = kl.jacfwd(lambda t: mul(t["point"].y, 3.0))(every_kind(x))
    close(jac["point"].y, 3 * np.eye(3))
    close(jac["params"].w, np.zeros((3, 3)))
    check_every_kind(kl.switch(1, [lambda t: t, scale], every_kind(x)), 2 * x)
    check_every_kind(kl.pmap(scale)(every_kind(xs)), 2 * xs)
    scaled = kl.custom_jvp(scale)
    scaled.defjvp(lambda p, t: (scale(p[0]), scale(t[0])))
    check_every_kind(scaled(every_kind(x)), 2 * x)
    check_every_kind(kl.grad(lambda t: tree_sum(scaled(t)))(every_kind(x)), np.full(3, 2.0))
    rescaled = kl.custom_vjp(scale)
    rescaled.defvjp(lambda t: (scale(t), None), lambda res, ct: (scale(ct),))
    check_every_kind(kl.grad(lambda t: tree_sum(rescaled(t)))(every_kind(x)), np.full(3, 2.0))
    carry = kl.fori_loop(0, 2, lambda i, t: scale(t), every_kind(x))
    check_every_kind(carry, 4 * x)
    n, carry = kl.while_loop(
        lambda c: less(c[0], 3),
        lambda c: (add(c[0], 1), scale(c[1])),
        (kl.asarray(0), every_kind(x)),
    )
    check_every_kind(carry, 8 * x)
    check_every_kind(kl.cond(True, scale, lambda t: t, every_kind(x)), 2 * x)
    carry, ys = kl.scan(lambda c, x: (scale(c), x), every_kind(x), every_kind(xs))
    check_every_kind(ys, xs)
    check_every_kind(carry, 16 * x)
    check_every_kind(
        kl.jit(kl.vmap(kl.grad(lambda t: tree_sum(scale(t)))))(every_kind(xs)), np.full((4, 3), 2.0)
    )


# ---- reverse and forward mode ------------------------------------------------------------------


def test_grad_analytic_and_argnums():
    f = lambda x, y: sum(mul(sin(x), y))  # noqa: E731
    x, y = randn(5), randn(5)
    close(kl.grad(f)(x, y), np.cos(x) * y)
    gx, gy = kl.grad(f, argnums=(0, 1))(x, y)
    close(gx, np.cos(x) * y)
    close(gy, np.sin(x))
    close(kl.grad(f, argnums=-1)(x, y), np.sin(x))
    value, g = kl.value_and_grad(f)(x, y)
    close(value, np.sum(np.sin(x) * y))
    close(g, np.cos(x) * y)


def polynomial_loss(p, n):
    """sum(p**k for k = 1..n): `range(n)` needs n to be a Python int."""
    total, power = 0.0, 1.0
    for _ in range(n):
        power = mul(power, p)
        total = add(total, power)
    return sum(total)


def polynomial_loss_derivative(p, n):
    return np.sum([k * p ** (k - 1) for k in range(1, n + 1)], axis=0)


def test_grad_keeps_non_differentiated_python_scalars_concrete():
    p = randn(3, dtype=np.float64) * 0.5
    close(kl.grad(polynomial_loss)(p, 10), polynomial_loss_derivative(p, 10), 1e-12, 1e-12)
    value, g = kl.value_and_grad(polynomial_loss)(p, 6)
    close(value, np.sum([p**k for k in range(1, 7)]), 1e-12, 1e-12)
    close(g, polynomial_loss_derivative(p, 6), 1e-12, 1e-12)
    # jit's static argument stays static through value_and_grad: one trace per value of n.
    jitted = kl.jit(kl.value_and_grad(polynomial_loss), static_argnums=1)
    for n in (3, 100, 3):
        close(jitted(p, n)[1], polynomial_loss_derivative(p, n), 1e-10, 1e-12)
    assert jitted._cache_size() == 2
    # So do the Jacobians and hessian (forward over reverse) over the differentiated argument.
    close(kl.jacrev(polynomial_loss)(p, 4), polynomial_loss_derivative(p, 4), 1e-12, 1e-12)
    hess = np.diag(np.sum([k * (k - 1) * p ** (k - 2) for k in range(2, 5)], axis=0))
    close(kl.hessian(polynomial_loss)(p, 4), hess, 1e-12, 1e-12)
    # A Python scalar that is differentiated is traced, as before.
    close(kl.grad(lambda x, y: mul(x, y), argnums=1)(2.0, 3.0), 2.0)


def test_grad_has_aux_and_value_and_grad_has_aux():
    def f(x):
        return sum(square(x)), {"double": mul(x, 2.0)}

    x = randn(4)
    g, aux = kl.grad(f, has_aux=True)(x)
    close(g, 2 * x)
    close(aux["double"], 2 * x)
    (value, aux), g = kl.value_and_grad(f, has_aux=True)(x)
    close(value, np.sum(x * x))
    close(aux["double"], 2 * x)


def loss_np(w1, b1, w2, x, y):
    h = np.tanh(x @ w1 + b1)
    return np.mean((h @ w2 - y) ** 2)


def loss(params, x, y):
    h = tanh(add(matmul(x, params["w1"]), params["b1"]))
    return mean(square(sub(matmul(h, params["w2"]), y)))


def test_grad_of_mlp_loss_against_float64_central_differences():
    p = {
        "w1": randn(3, 4, dtype=np.float64),
        "b1": randn(4, dtype=np.float64),
        "w2": randn(4, 1, dtype=np.float64),
    }
    x, y = randn(6, 3, dtype=np.float64), randn(6, 1, dtype=np.float64)
    g = kl.grad(loss)(p, x, y)
    close(g["w1"], central_diff(lambda w: loss_np(w, p["b1"], p["w2"], x, y), p["w1"]), 1e-6, 1e-8)
    close(g["b1"], central_diff(lambda b: loss_np(p["w1"], b, p["w2"], x, y), p["b1"]), 1e-6, 1e-8)
    close(g["w2"], central_diff(lambda w: loss_np(p["w1"], p["b1"], w, x, y), p["w2"]), 1e-6, 1e-8)
    # The same under jit, and value_and_grad's value against NumPy.
    value, gj = kl.jit(kl.value_and_grad(loss))(p, x, y)
    close(value, loss_np(p["w1"], p["b1"], p["w2"], x, y), 1e-10, 1e-12)
    for k in p:
        close(gj[k], g[k], 1e-10, 1e-12)


def test_higher_order_grad():
    f = lambda x: sum(pow(x, 3.0))  # noqa: E731
    x = randn(4, dtype=np.float64)
    close(kl.grad(lambda x: sum(kl.grad(f)(x)))(x), 6 * x)
    h = kl.hessian(f)(x)
    close(h, np.diag(6 * x))
    a = randn(3, 3, dtype=np.float64)
    q = lambda v: sum(mul(v, matmul(a, v)))  # noqa: E731
    close(kl.hessian(q)(randn(3, dtype=np.float64)), a + a.T, 1e-10, 1e-12)


def test_vjp_and_jvp():
    f = lambda x, y: (mul(sin(x), y), exp(x))  # noqa: E731
    x, y = randn(3), randn(3)
    (a, b), vjp_fn = kl.vjp(f, x, y)
    close(a, np.sin(x) * y)
    close(b, np.exp(x))
    ca, cb = randn(3), randn(3)
    gx, gy = vjp_fn((ca, cb))
    close(gx, ca * np.cos(x) * y + cb * np.exp(x), 1e-5, 1e-5)
    close(gy, ca * np.sin(x))
    tx, ty = randn(3), randn(3)
    (a, b), (ta, tb) = kl.jvp(f, (x, y), (tx, ty))
    close(ta, np.cos(x) * tx * y + np.sin(x) * ty, 1e-5, 1e-5)
    close(tb, np.exp(x) * tx, 1e-5, 1e-5)
    out, vjp_fn, aux = kl.vjp(lambda x: (sin(x), {"c": cos(x)}), x, has_aux=True)
    close(aux["c"], np.cos(x))
    close(vjp_fn(np.ones(3, np.float32))[0], np.cos(x))


def test_jacobians():
    a = randn(2, 3, dtype=np.float64)
    f = lambda x: tanh(matmul(a, x))  # noqa: E731
    x = randn(3, dtype=np.float64)
    expect = (1 - np.tanh(a @ x) ** 2)[:, None] * a
    close(kl.jacfwd(f)(x), expect, 1e-10, 1e-12)
    close(kl.jacrev(f)(x), expect, 1e-10, 1e-12)
    g = lambda x, y: {"p": mul(x, y)}  # noqa: E731
    y = randn(3, dtype=np.float64)
    jx, jy = kl.jacrev(g, argnums=(0, 1))(x, y)["p"]
    close(jx, np.diag(y))
    close(jy, np.diag(x))


def test_checkpoint_stop_gradient_and_custom_rules():
    f = lambda x: sum(sin(mul(x, x)))  # noqa: E731
    x = randn(4, dtype=np.float64)
    close(kl.grad(kl.checkpoint(f))(x), 2 * x * np.cos(x * x), 1e-10, 1e-12)
    for policy in ([], ["sin"], ["mul", "sin"]):
        g = kl.jit(kl.grad(kl.checkpoint(f, recompute=policy)))
        close(g(x), 2 * x * np.cos(x * x), 1e-10, 1e-12)
    close(kl.grad(lambda x: sum(mul(x, kl.stop_gradient(x))))(x), x)

    @kl.custom_jvp
    def softplus(x):
        return log(add(exp(x), 1.0))

    @softplus.defjvp
    def softplus_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        # Deliberately twice the true derivative, to see the rule is what is used.
        sigmoid = div(1.0, add(exp(neg(x)), 1.0))
        return softplus(x), mul(t, mul(sigmoid, 2.0))

    assert softplus.__name__ == "softplus"
    sig = 1 / (1 + np.exp(-x))
    close(softplus(x), np.log1p(np.exp(x)))
    close(kl.grad(lambda x: sum(softplus(x)))(x), 2 * sig, 1e-10, 1e-12)
    close(kl.jvp(softplus, (x,), (np.ones(4),))[1], 2 * sig, 1e-10, 1e-12)

    @kl.custom_vjp
    def clip_gradient(x):
        return x

    def fwd(x):
        return x, None

    def bwd(res, g):
        return (neg(maximum(neg(maximum(g, -1.0)), -1.0)),)  # clip(g, -1, 1)

    clip_gradient.defvjp(fwd, bwd)
    g = kl.grad(lambda x: sum(mul(clip_gradient(x), 5.0)))(x)
    close(g, np.clip(np.full(4, 5.0), -1, 1))


# ---- vmap and collectives ----------------------------------------------------------------------


def test_vmap_against_a_python_loop():
    p = {"w1": randn(3, 4), "b1": randn(4), "w2": randn(4, 1)}
    x, y = randn(8, 1, 3), randn(8, 1, 1)
    per_example = kl.vmap(kl.grad(loss), in_axes=(None, 0, 0))(p, x, y)
    for i in range(8):
        gi = kl.grad(loss)(p, x[i], y[i])
        for k in p:
            close(np.asarray(per_example[k])[i], gi[k], 1e-4, 1e-5)
    # A pytree prefix per argument: w shared, b batched.
    f = lambda q, v: add(matmul(v, q["w"]), q["b"])  # noqa: E731
    q = {"w": randn(3, 2), "b": randn(5, 2)}
    v = randn(5, 3)
    out = kl.vmap(f, in_axes=({"w": None, "b": 0}, 0))(q, v)
    close(out, np.stack([v[i] @ q["w"] + q["b"][i] for i in range(5)]), 1e-5, 1e-5)
    # in_axes 1 and out_axes 1.
    xt = randn(3, 6)
    close(kl.vmap(sin, in_axes=1, out_axes=1)(xt), np.sin(xt))
    # out_axes as a prefix of the result.
    a, b = kl.vmap(lambda v: (sin(v), cos(v)), out_axes=(0, 1))(randn(4, 2))
    assert a.shape == (4, 2) and b.shape == (2, 4)


def test_collectives_under_vmap():
    x = randn(5, 3)
    name = "i"
    close(
        kl.vmap(lambda v: kl.psum(v, name), axis_name=name)(x),
        np.broadcast_to(x.sum(0), x.shape),
        1e-5,
        1e-5,
    )
    close(
        kl.vmap(lambda v: kl.pmean(v, name), axis_name=name)(x),
        np.broadcast_to(x.mean(0), x.shape),
        1e-5,
        1e-6,
    )
    close(
        kl.vmap(lambda v: kl.pmax(v, name), axis_name=name)(x), np.broadcast_to(x.max(0), x.shape)
    )
    close(
        kl.vmap(lambda v: kl.pmin(v, name), axis_name=name)(x), np.broadcast_to(x.min(0), x.shape)
    )
    close(
        kl.vmap(lambda v: kl.all_gather(v, name), axis_name=name)(x), np.broadcast_to(x, (5, 5, 3))
    )
    close(kl.vmap(lambda v: kl.axis_index(name), axis_name=name)(x), np.arange(5))
    perm = [(i, (i + 1) % 5) for i in range(5)]
    close(kl.vmap(lambda v: kl.ppermute(v, name, perm), axis_name=name)(x), np.roll(x, 1, axis=0))
    y = randn(5, 5)
    close(kl.vmap(lambda v: kl.all_to_all(v, name, 0, 0), axis_name=name)(y), y.T)
    close(kl.vmap(lambda v: kl.psum_scatter(v, name), axis_name=name)(y), y.sum(0), 1e-5, 1e-5)
    # A pytree through a collective.
    t = kl.vmap(lambda v: kl.psum({"a": v, "b": (v,)}, name), axis_name=name)(x)
    close(t["b"][0], np.broadcast_to(x.sum(0), x.shape), 1e-5, 1e-5)


def test_collectives_over_a_tuple_of_axes():
    x = randn(2, 3, 4)  # a 2 x 3 grid of examples

    def grid(f):
        return kl.vmap(kl.vmap(f, axis_name="b"), axis_name="a")

    ab = ("a", "b")
    whole = np.broadcast_to(x.reshape(6, 4), (2, 3, 6, 4))
    close(grid(lambda v: kl.psum(v, ab))(x), np.broadcast_to(x.sum((0, 1)), x.shape), 1e-5, 1e-5)
    close(grid(lambda v: kl.pmean(v, ["b", "a"]))(x), np.broadcast_to(x.mean((0, 1)), x.shape))
    close(grid(lambda v: kl.pmax(v, ab))(x), np.broadcast_to(x.max((0, 1)), x.shape))
    close(grid(lambda v: kl.pmin(v, ab))(x), np.broadcast_to(x.min((0, 1)), x.shape))
    close(grid(lambda v: kl.all_gather(v, ab))(x), whole)
    b_major = np.broadcast_to(x.transpose(1, 0, 2).reshape(6, 4), (2, 3, 6, 4))
    close(grid(lambda v: kl.all_gather(v, ("b", "a")))(x), b_major)
    close(grid(lambda v: kl.axis_index(ab))(x), np.arange(6).reshape(2, 3))
    y = randn(2, 3, 6)
    close(grid(lambda v: kl.psum_scatter(v, ab))(y), y.sum((0, 1)).reshape(2, 3), 1e-5, 1e-5)
    with pytest.raises(kl.Error, match="named twice"):
        grid(lambda v: kl.psum(v, ("a", "a")))(x)


def test_shard_map_on_a_mesh_of_one_process():
    mesh = kl.Mesh([("data", 1), ("model", 1)])
    assert mesh.axis_names == ("data", "model") and mesh.index("model") == 0
    assert repr(kl.spec("data", None, ("data", "model"))) == "spec('data', None, ('data', 'model'))"
    assert kl.spec("data") == kl.spec("data") and kl.spec() != kl.spec("data")
    assert kl.spec("data") != None and len({kl.spec("data"), kl.spec("data")}) == 1  # noqa: E711
    with pytest.raises(kl.Error, match="a name and a size"):
        kl.Mesh({"data": "two"})
    x, w = randn(4, 3), randn(3, 2)

    def layer(x, w):
        return kl.psum(kl.sum(kl.tanh(x @ w)), ("data", "model"))

    specs = (kl.spec("data", None), kl.spec(None, "model"))
    f = kl.shard_map(layer, mesh, in_specs=specs, out_specs=kl.spec())
    close(f(x, w), np.tanh(x @ w).sum(), 1e-5, 1e-5)
    t = np.tanh(x @ w)
    close(kl.grad(f, argnums=1)(x, w), x.T @ (1 - t * t), 1e-5, 1e-5)
    # Per-leaf specs, and a result that is a tree.
    g = kl.shard_map(
        lambda p: {"s": kl.psum(p["a"] + p["b"], "data")},
        mesh,
        in_specs=([kl.spec("data"), kl.spec("data")],),
        out_specs=kl.spec("data"),
    )
    close(g({"a": x, "b": x})["s"], 2 * x)
    close(kl.local_block(kl.asarray(x), mesh, specs[0]), x)
    with pytest.raises(kl.Error, match="spec"):
        kl.shard_map(layer, mesh, in_specs=("data", specs[1]), out_specs=kl.spec())
    with pytest.raises(kl.Error, match="shard_map"):
        kl.shard_map(layer, mesh, in_specs=specs, out_specs=kl.spec())(x, w=w)
    with pytest.raises(kl.Error, match="varies along the mesh axis 'data'"):
        kl.shard_map(lambda x: x, mesh, in_specs=(kl.spec("data"),), out_specs=kl.spec())(x)


def test_pmap_in_one_process_is_jit_of_vmap():
    x = randn(4, 3)
    out = kl.pmap(lambda v: sub(v, kl.pmean(v, "p")), axis_name="p")(x)
    close(out, x - x.mean(0), 1e-5, 1e-6)


# ---- nesting -----------------------------------------------------------------------------------


def test_nesting_in_any_order():
    f = lambda w, x: sum(sin(mul(w, x)))  # noqa: E731
    w, xs = randn(3), randn(6, 3)
    expect = np.stack([np.cos(w * x) * x for x in xs])
    close(kl.jit(kl.vmap(kl.grad(f), in_axes=(None, 0)))(w, xs), expect, 1e-5, 1e-5)
    close(kl.vmap(kl.jit(kl.grad(f)), in_axes=(None, 0))(w, xs), expect, 1e-5, 1e-5)
    close(kl.vmap(kl.grad(kl.jit(f)), in_axes=(None, 0))(w, xs), expect, 1e-5, 1e-5)
    close(kl.grad(lambda w: sum(kl.vmap(lambda x: f(w, x))(xs)))(w), expect.sum(0), 1e-4, 1e-5)
    close(kl.jit(kl.grad(kl.grad(sin)))(np.float32(0.3)), -np.sin(0.3), 1e-5, 1e-6)
    close(kl.jit(kl.jit(sin))(w), np.sin(w))


# ---- errors, lifetimes -------------------------------------------------------------------------


class Boom(Exception):
    pass


def raiser(x):
    raise Boom("from inside")


@pytest.mark.parametrize(
    "transform",
    [
        kl.jit,
        kl.grad,
        kl.vmap,
        kl.checkpoint,
        kl.jacfwd,
        kl.jacrev,
        lambda f: (lambda x: kl.vjp(f, x)),
        lambda f: (lambda x: kl.jvp(f, (x,), (x,))),
        lambda f: kl.jit(kl.vmap(kl.grad(f))),
    ],
)
def test_python_exceptions_keep_their_type(transform):
    with pytest.raises(Boom, match="from inside"):
        transform(raiser)(randn(3))


def test_kiln_error_inside_a_traced_function_names_the_users_line():
    def bad(x):
        return add(x, randn(7))  # the line the error must name

    line = bad.__code__.co_firstlineno + 1
    for t in (kl.jit, kl.grad, kl.vmap):
        with pytest.raises(kl.Error) as info:
            t(bad)(randn(3, 4))
        assert f"test_transforms.py:{line}" in str(info.value)


def test_concrete_value_errors_name_python_control_flow():
    # autograph=False: kiln.jit would otherwise convert the `if` into kiln.cond.
    def f(x):
        if greater(sum(x), 0.0):
            return x
        return neg(x)

    with pytest.raises(kl.Error, match=r"kiln\.cond"):
        kl.jit(f, autograph=False)(randn(3))
    with pytest.raises(kl.Error, match=r"kiln\.cond"):
        kl.grad(lambda x: sum(f(x)))(randn(3))


def test_transformation_argument_errors():
    with pytest.raises(kl.Error, match="argnums out of range"):
        kl.grad(sin, argnums=2)(randn(3))
    with pytest.raises(kl.Error, match="has_aux"):
        kl.grad(lambda x: sum(x), has_aux=True)(randn(3))
    with pytest.raises(kl.Error, match="in_axes"):
        kl.vmap(add, in_axes=(0,))(randn(3), randn(3))


def test_no_leak_over_many_jitted_calls_and_refcounts_unchanged():
    f = kl.jit(lambda p, x: {"y": add(mul(p["w"], x), p["b"])})
    p = {"w": kl.asarray(randn(4)), "b": kl.asarray(randn(4))}
    x = randn(4)
    for _ in range(1000):
        f(p, x)
    gc.collect()
    before_rss = rss_bytes()
    refs = [sys.getrefcount(v) for v in (p, p["w"], p["b"], x)]
    for _ in range(100_000):
        f(p, x)
    gc.collect()
    assert [sys.getrefcount(v) for v in (p, p["w"], p["b"], x)] == refs
    check_rss_growth(before_rss, 16 << 20)


def test_transformed_functions_bind_as_methods_and_take_attributes():
    @dataclasses.dataclass
    class Model:  # a pytree, so that `self` can be an argument of a transformation
        w: object

        @kl.jit
        def apply(self, x):
            return mul(self.w, x)

        @kl.grad
        def slope(self, x):
            return sum(mul(self.w, square(x)))

    m = Model(np.float32(3.0))
    x = randn(3)
    close(m.apply(x), 3 * x)
    grad_of_model = m.slope(x)  # with respect to self, the first argument
    assert isinstance(grad_of_model, Model)
    close(grad_of_model.w, np.sum(x * x), 1e-5, 1e-5)
    g = kl.grad(sin)
    g.note = "attributes stick"
    assert g.note == "attributes stick" and g.__wrapped__ is sin


def test_refcounts_unchanged_under_grad_and_vmap():
    f = lambda p, x: sum(mul(p["w"], x))  # noqa: E731
    p, x = {"w": randn(3)}, randn(4, 3)
    g, v = kl.grad(f), kl.vmap(f, in_axes=(None, 0))
    g(p, x[0])
    v(p, x)
    refs = [sys.getrefcount(o) for o in (p, p["w"], x)]
    for _ in range(2000):
        g(p, x[0])
        v(p, x)
    assert [sys.getrefcount(o) for o in (p, p["w"], x)] == refs


THREADS_PROGRAM = """
import threading, time
import numpy as np
import kiln as kl
from kops import sin

calls = []

def f(x):
    calls.append(1)
    time.sleep(0.2)  # releases the GIL while this thread traces
    return sin(x)

jf = kl.jit(f)
x = np.linspace(0, 1, 3, dtype=np.float32)
out = []
threads = [threading.Thread(target=lambda: out.append(np.asarray(jf(x)))) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert len(calls) == 1 and len(out) == 4, (calls, out)
for o in out:
    np.testing.assert_allclose(o, np.sin(x), rtol=1e-6)
"""


def test_threads_calling_one_jitted_function_share_its_trace():
    # In a subprocess with a timeout: a thread waiting for another's trace while holding the
    # GIL would hang the interpreter.
    import os
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-c", THREADS_PROGRAM], env=env, check=True, timeout=60)


def test_hessian_of_a_dict_and_custom_vjp_with_none_cotangents():
    # f(p) = sum(a^2 * b): d2f/da2 = diag(2b), d2f/dadb = diag(2a), d2f/db2 = 0.
    f = lambda p: sum(mul(square(p["a"]), p["b"]))  # noqa: E731
    a, b = randn(3, dtype=np.float64), randn(3, dtype=np.float64)
    h = kl.hessian(f)({"a": a, "b": b})
    close(h["a"]["a"], np.diag(2 * b))
    close(h["a"]["b"], np.diag(2 * a))
    close(h["b"]["a"], np.diag(2 * a))
    close(h["b"]["b"], np.zeros((3, 3)))

    @kl.custom_vjp
    def scaled(x, s):
        return mul(x, s)

    scaled.defvjp(lambda x, s: (mul(x, s), s), lambda s, g: (mul(g, s), None))
    gx, gs = kl.grad(lambda x, s: sum(scaled(x, s)), argnums=(0, 1))(a, b)
    close(gx, b)
    close(gs, np.zeros(3))  # bwd gave None: zeros
