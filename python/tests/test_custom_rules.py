"""custom_vjp with saved residuals and nondiff_argnums for custom_jvp / custom_vjp, against
torch.autograd, analytic derivatives and float64 central differences (JAX's documented
examples where there is one)."""
import functools

import numpy as np
import pytest
import torch

import kiln as kl
from kops import central_diff, close, cos, exp, log, mul, sin, sum

rng = np.random.default_rng(0)


def randn(*shape):
    return rng.standard_normal(shape)  # float64


def sin_times(counts=None):
    """JAX's example: f(x, y) = sin(x) y, whose fwd saves (cos(x), sin(x), y)."""
    counts = counts if counts is not None else {}

    @kl.custom_vjp
    def f(x, y):
        counts["f"] = counts.get("f", 0) + 1
        return mul(sin(x), y)

    def f_fwd(x, y):
        counts["fwd"] = counts.get("fwd", 0) + 1
        return mul(sin(x), y), (cos(x), sin(x), y)

    def f_bwd(res, g):
        counts["bwd"] = counts.get("bwd", 0) + 1
        cos_x, sin_x, y = res
        return mul(mul(cos_x, g), y), mul(sin_x, g)

    f.defvjp(f_fwd, f_bwd)
    return f


def torch_grads(fn, *args):
    ts = [torch.tensor(a, requires_grad=True) for a in args]
    out = fn(*ts)
    return [t.numpy() for t in torch.autograd.grad(out, ts)]


def test_jax_example_sin_times_y_against_torch():
    f = sin_times()
    x, y = randn(5), randn(5)
    loss = lambda x, y: sum(mul(f(x, y), f(x, y)))  # noqa: E731
    gx, gy = kl.grad(loss, argnums=(0, 1))(x, y)
    tx, ty = torch_grads(lambda x, y: ((torch.sin(x) * y) ** 2).sum(), x, y)
    close(gx, tx, 1e-12, 1e-12)
    close(gy, ty, 1e-12, 1e-12)
    close(gx, central_diff(lambda v: np.sum((np.sin(v) * y) ** 2), x), 1e-6, 1e-8)
    close(f(x, y), np.sin(x) * y, 1e-14, 0)  # undifferentiated


def test_fwd_runs_once_per_forward_pass_and_bwd_once():
    counts = {}
    f = sin_times(counts)
    x, y = randn(4), randn(4)
    g = kl.grad(lambda x, y: sum(f(x, y)))(x, y)
    close(g, np.cos(x) * y, 1e-12, 1e-12)
    assert counts["fwd"] == 1 and counts["bwd"] == 1, counts
    # A jitted gradient traces once; later calls run without Python.
    counts.clear()
    step = kl.jit(kl.grad(lambda x, y: sum(f(x, y))))
    close(step(x, y), np.cos(x) * y, 1e-12, 1e-12)
    close(step(2 * x, y), np.cos(2 * x) * y, 1e-12, 1e-12)
    assert counts["fwd"] == 1 and counts["bwd"] == 1, counts


def test_residuals_may_be_any_pytree():
    seen = {}

    @kl.custom_vjp
    def f(x):
        return mul(x, x)

    def fwd(x):
        return mul(x, x), {"x": x, "none": None, "scale": 2.0, "tag": "twice", "pair": (x, [x])}

    def bwd(res, g):
        seen["none"], seen["tag"] = res["none"], res["tag"]
        seen["scale"] = type(res["scale"])
        return (mul(mul(res["scale"], res["pair"][1][0]), g),)

    f.defvjp(fwd, bwd)
    x = randn(3)
    close(kl.grad(lambda x: sum(f(x)))(x), 2 * x, 1e-12, 1e-12)
    assert seen == {"none": None, "tag": "twice", "scale": kl.Tensor}


def test_logsumexp_saving_its_softmax_against_torch():
    @kl.custom_vjp
    def lse(x):
        return log(sum(exp(x)))

    def fwd(x):
        out = log(sum(exp(x)))
        return out, exp(kl.sub(x, out))  # the softmax, for bwd

    lse.defvjp(fwd, lambda softmax, g: (mul(softmax, g),))
    x = randn(6)
    (want,) = torch_grads(lambda x: torch.logsumexp(x, 0) * 3.0, x)
    close(kl.grad(lambda x: mul(lse(x), 3.0))(x), want, 1e-12, 1e-12)
    close(kl.jit(kl.grad(lambda x: mul(lse(x), 3.0)))(x), want, 1e-12, 1e-12)


def test_vmap_of_grad_jit_checkpoint_and_two_uses():
    f = sin_times()
    xs, y = randn(4, 3), randn(3)
    per_example = kl.vmap(kl.grad(lambda x, y: sum(f(x, y))), in_axes=(0, None))(xs, y)
    close(per_example, np.stack([np.cos(x) * y for x in xs]), 1e-12, 1e-12)
    x = xs[0]
    # Two uses: d/dx sum(f(f(x, y), y)) = cos(sin(x) y) y cos(x) y.
    twice = lambda x, y: sum(f(f(x, y), y))  # noqa: E731
    want = np.cos(np.sin(x) * y) * y * np.cos(x) * y
    close(kl.grad(twice)(x, y), want, 1e-12, 1e-12)
    close(kl.jit(kl.grad(twice))(x, y), want, 1e-12, 1e-12)
    close(kl.grad(lambda x, y: sum(kl.checkpoint(f)(x, y)))(x, y), np.cos(x) * y, 1e-12, 1e-12)


def test_grad_of_grad_differentiates_the_rules():
    f = sin_times()
    x, y = randn(4), randn(4)
    first = lambda x, y: sum(kl.grad(lambda x, y: sum(f(x, y)))(x, y))  # noqa: E731
    close(kl.grad(first)(x, y), -np.sin(x) * y, 1e-12, 1e-12)
    close(kl.grad(first, argnums=1)(x, y), np.cos(x), 1e-12, 1e-12)


def test_forward_mode_through_custom_vjp_is_an_error():
    f = sin_times()
    with pytest.raises(kl.Error, match="forward-mode"):
        kl.jvp(lambda x: f(x, np.ones(3)), (randn(3),), (np.ones(3),))


# ---- nondiff_argnums ---------------------------------------------------------------------------


def test_clip_gradient_with_nondiff_argnums():
    # JAX's example: the bounds are static, passed first to bwd; bwd returns x's cotangent only.
    @functools.partial(kl.custom_vjp, nondiff_argnums=(0, 1))
    def clip_gradient(lo, hi, x):
        return x

    def fwd(lo, hi, x):
        return x, None

    def bwd(lo, hi, _, g):
        return (kl.clip(g, lo, hi),)

    clip_gradient.defvjp(fwd, bwd)
    x = randn(4)
    w = np.array([5.0, 0.5, -3.0, 0.1])
    g = kl.grad(lambda x: sum(mul(clip_gradient(-1.0, 1.0, x), w)))(x)
    close(g, np.clip(w, -1.0, 1.0), 0, 0)
    g = kl.grad(lambda x: sum(mul(clip_gradient(-0.2, 0.3, x), w)))(x)
    close(g, np.clip(w, -0.2, 0.3), 0, 0)
    close(clip_gradient(-1.0, 1.0, x), x, 0, 0)


def test_custom_vjp_with_a_nondiff_callable_in_the_middle():
    @functools.partial(kl.custom_vjp, nondiff_argnums=(1,))
    def apply(x, fn, y):
        return fn(x, y)

    def fwd(x, fn, y):
        return fn(x, y), (x, y)

    def bwd(fn, res, g):  # d/dx fn and d/dy fn for fn = x * y, written by hand
        x, y = res
        return mul(g, y), mul(g, x)

    apply.defvjp(fwd, bwd)
    x, y = randn(3), randn(3)
    gx, gy = kl.grad(lambda x, y: sum(apply(x, mul, y)), argnums=(0, 1))(x, y)
    tx, ty = torch_grads(lambda x, y: (x * y).sum(), x, y)
    close(gx, tx, 1e-12, 1e-12)
    close(gy, ty, 1e-12, 1e-12)


def test_custom_jvp_with_a_nondiff_callable():
    # JAX's example: the rule gets the callable first; it says 2 x_dot, whatever f is.
    @functools.partial(kl.custom_jvp, nondiff_argnums=(0,))
    def app(f, x):
        return f(x)

    @app.defjvp
    def app_jvp(f, primals, tangents):
        (x,), (x_dot,) = primals, tangents
        return f(x), mul(x_dot, 2.0)

    x = randn(3)
    cube = lambda v: mul(mul(v, v), v)  # noqa: E731
    close(app(cube, x), x**3, 1e-14, 0)
    close(kl.jvp(lambda x: app(cube, x), (x,), (np.ones(3),))[1], np.full(3, 2.0), 0, 0)
    close(kl.grad(lambda x: sum(app(cube, x)))(x), np.full(3, 2.0), 0, 0)


def test_custom_jvp_with_a_nondiff_int_and_the_true_derivative():
    # x^n with its derivative n x^(n-1), n static: against torch.
    @functools.partial(kl.custom_jvp, nondiff_argnums=(1,))
    def power(x, n):
        return kl.pow(x, float(n))

    @power.defjvp
    def power_jvp(n, primals, tangents):
        (x,), (t,) = primals, tangents
        return power(x, n), mul(mul(kl.pow(x, float(n - 1)), float(n)), t)

    x = np.abs(randn(4)) + 0.5
    for n in (2, 3):
        (want,) = torch_grads(lambda x: (x**n).sum(), x)
        close(kl.grad(lambda x: sum(power(x, n)))(x), want, 1e-12, 1e-12)
        close(kl.jit(kl.grad(lambda x: sum(power(x, n))))(x), want, 1e-12, 1e-12)


# ---- errors ------------------------------------------------------------------------------------


def test_bwd_with_the_wrong_number_of_cotangents():
    @kl.custom_vjp
    def f(x, y):
        return mul(x, y)

    f.defvjp(lambda x, y: (mul(x, y), (x, y)), lambda res, g: (mul(g, res[1]),))
    with pytest.raises(
        kl.Error,
        match=r"bwd must return one cotangent per argument: got .*" r"expected a tuple of 2",
    ):
        kl.grad(lambda x, y: sum(f(x, y)))(randn(3), randn(3))

    @functools.partial(kl.custom_vjp, nondiff_argnums=(0,))
    def g(k, x):
        return mul(x, k)

    g.defvjp(lambda k, x: (mul(x, k), None), lambda k, res, ct: (None, mul(ct, k)))
    with pytest.raises(kl.Error, match="one cotangent per argument not in nondiff_argnums"):
        kl.grad(lambda x: sum(g(2.0, x)))(randn(3))


def test_bwd_cotangent_of_the_wrong_structure_or_shape():
    @kl.custom_vjp
    def f(p):
        return mul(p["a"], p["b"])

    f.defvjp(lambda p: (mul(p["a"], p["b"]), p), lambda p, g: ({"a": mul(g, p["b"])},))
    p = {"a": randn(3), "b": randn(3)}
    with pytest.raises(kl.Error, match="does not have its argument's structure"):
        kl.grad(lambda p: sum(f(p)))(p)

    @kl.custom_vjp
    def h(x):
        return mul(x, 2.0)

    h.defvjp(lambda x: (mul(x, 2.0), None), lambda res, g: (sum(g),))
    with pytest.raises(kl.Error, match="one cotangent per argument: got"):
        kl.grad(lambda x: sum(h(x)))(randn(3))


def test_fwd_that_does_not_return_output_and_residuals():
    @kl.custom_vjp
    def f(x):
        return mul(x, 2.0)

    f.defvjp(lambda x: mul(x, 2.0), lambda res, g: (g,))
    with pytest.raises(kl.Error, match=r"fwd must return \(output, residuals\)"):
        kl.grad(lambda x: sum(f(x)))(randn(3))

    with pytest.raises(kl.Error, match="nondiff_argnums must be an int or a tuple"):
        kl.custom_vjp(lambda x: x, nondiff_argnums="0")


def test_a_traced_tensor_as_a_nondiff_argument_or_an_object_residual_is_an_error():
    @functools.partial(kl.custom_vjp, nondiff_argnums=(0,))
    def g(k, x):
        return mul(x, k)

    g.defvjp(lambda k, x: (mul(x, k), None), lambda k, res, ct: (mul(ct, k),))
    k, x = randn(3), randn(3)
    close(kl.grad(lambda x: sum(g(k, x)))(x), k, 0, 0)  # a concrete tensor is a constant
    with pytest.raises(kl.Error, match="closes over a traced value"):
        kl.grad(lambda k, x: sum(g(k, x)), argnums=1)(k, x)

    @kl.custom_vjp
    def h(x):
        return x

    h.defvjp(lambda x: (x, object()), lambda res, g: (g,))
    with pytest.raises(kl.Error, match="cannot convert"):
        kl.grad(lambda x: sum(h(x)))(x)


def test_an_integer_residual_under_vmap_and_jit():
    # max(x) saving the index of the maximum (an int tensor) for bwd, against torch.
    @kl.custom_vjp
    def vmax(x):
        return kl.max(x)

    def fwd(x):
        return kl.max(x), kl.argmax(x)

    def bwd(i, g):
        return (mul(kl.astype(kl.equal(kl.arange(4), i), kl.float64), g),)

    vmax.defvjp(fwd, bwd)
    xs = randn(3, 4)
    close(kl.vmap(vmax)(xs), xs.max(axis=1), 0, 0)
    per_example = kl.jit(kl.vmap(kl.grad(lambda x: mul(vmax(x), 2.0))))(xs)
    for x, g in zip(xs, np.asarray(per_example)):
        (want,) = torch_grads(lambda x: x.max() * 2.0, x)
        close(g, want, 0, 0)
