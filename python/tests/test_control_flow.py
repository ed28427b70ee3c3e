"""cond, switch, while_loop, fori_loop and scan from Python, eagerly and under transformations,
against NumPy and Python loops."""
import numpy as np
import pytest

import kiln as kl
from kops import add, astype, close, cos, greater, less, mul, sin, sum

rng = np.random.default_rng(1)


def randn(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def test_cond_eager_and_jit_with_pytree_operands():
    def f(x, t):
        return kl.cond(
            greater(sum(x), 0.0),
            lambda x, t: {"a": sin(x), "b": t["s"]},
            lambda x, t: {"a": cos(x), "b": mul(t["s"], 2.0)},
            x,
            t,
        )

    for x in (np.abs(randn(3)), -np.abs(randn(3))):
        expect = np.sin(x) if x.sum() > 0 else np.cos(x)
        scale = 1.0 if x.sum() > 0 else 2.0
        for g in (f, kl.jit(f)):
            out = g(x, {"s": np.float32(3.0)})
            close(out["a"], expect)
            close(out["b"], 3.0 * scale)
    # A Python bool predicate, and no operands.
    close(kl.cond(True, lambda: kl.asarray(1.0), lambda: kl.asarray(2.0)), 1.0)


def test_cond_under_grad_and_vmap():
    f = lambda x: kl.cond(greater(x, 0.0), lambda x: mul(x, x), lambda x: sin(x), x)  # noqa: E731
    xs = randn(6)
    close(kl.vmap(f)(xs), np.where(xs > 0, xs * xs, np.sin(xs)))
    close(kl.vmap(kl.grad(f))(xs), np.where(xs > 0, 2 * xs, np.cos(xs)), 1e-5, 1e-6)


def test_switch():
    branches = [lambda x: sin(x), lambda x: cos(x), lambda x: mul(x, 3.0)]
    x = randn(3)
    for i, expect in enumerate([np.sin(x), np.cos(x), 3 * x]):
        close(kl.switch(i, branches, x), expect)
        close(kl.jit(lambda i, x: kl.switch(i, branches, x))(np.int32(i), x), expect)
    close(kl.switch(7, branches, x), 3 * x)  # clamped


def collatz_steps_numpy(n):
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def test_while_loop_eager_and_jit():
    def count(x):
        # Halve x until it is below 1, counting the steps (a data-dependent trip count).
        def body(c):
            return {"x": mul(c["x"], 0.5), "n": add(c["n"], 1)}

        return kl.while_loop(lambda c: greater(c["x"], 1.0), body, {"x": x, "n": kl.asarray(0)})[
            "n"
        ]

    calls = []

    def traced(x):
        calls.append(1)
        return count(x)

    jitted = kl.jit(traced)
    for v in (0.5, 3.0, 100.0, 1e6):
        expect = int(np.ceil(np.log2(v))) if v > 1 else 0
        assert int(np.asarray(count(np.float32(v)))) == expect
        assert int(np.asarray(jitted(np.float32(v)))) == expect
    assert len(calls) == 1


def test_while_loop_with_a_tuple_carry_under_vmap():
    # Each example counts to its own bound: vmap of a while_loop with batched predicates.
    bounds = np.array([0, 3, 7, 1], np.int32)
    f = lambda b: kl.while_loop(
        lambda c: less(c[0], b),
        lambda c: (add(c[0], 1), add(c[1], 2.0)),  # noqa: E731
        (kl.asarray(0), kl.asarray(0.0)),
    )
    i, acc = kl.vmap(f)(bounds)
    close(i, bounds)
    close(acc, 2.0 * bounds)


def test_fori_loop_static_and_tensor_bounds():
    body = lambda i, c: add(mul(c, 2.0), astype(i, np.float32))  # noqa: E731
    expect = 1.0
    for i in range(2, 7):
        expect = expect * 2 + i
    close(kl.fori_loop(2, 7, body, np.float32(1.0)), expect)
    close(kl.jit(lambda c: kl.fori_loop(2, 7, body, c))(np.float32(1.0)), expect)
    close(kl.fori_loop(kl.asarray(2), kl.asarray(7), body, np.float32(1.0)), expect)
    close(
        kl.jit(lambda lo, hi, c: kl.fori_loop(lo, hi, body, c))(
            np.int32(2), np.int32(7), np.float32(1.0)
        ),
        expect,
    )
    close(kl.fori_loop(5, 2, body, np.float32(1.0)), 1.0)  # no steps


def test_fori_loop_with_int_bounds_is_differentiable():
    # x -> sin applied 3 times; d/dx by the chain rule.
    f = lambda x: kl.fori_loop(0, 3, lambda i, c: sin(c), x)  # noqa: E731
    x = np.float64(0.7)
    a = np.sin(x)
    b = np.sin(a)
    close(kl.grad(f)(x), np.cos(b) * np.cos(a) * np.cos(x), 1e-10, 1e-12)


def test_scan_cumsum_reverse_and_pytrees():
    xs = randn(6, 2)
    carry, ys = kl.scan(lambda c, x: (add(c, x), c), np.zeros(2, np.float32), xs)
    close(carry, xs.sum(0), 1e-5, 1e-6)
    close(ys, np.concatenate([np.zeros((1, 2)), np.cumsum(xs, 0)[:-1]]), 1e-5, 1e-6)
    carry, ys = kl.scan(
        lambda c, x: (add(c, x), add(c, x)), np.zeros(2, np.float32), xs, reverse=True
    )
    close(ys, np.cumsum(xs[::-1], 0)[::-1], 1e-5, 1e-6)
    # Pytree xs and y, unroll, and no xs with a length.
    carry, ys = kl.scan(
        lambda c, x: (c, {"s": add(x["a"], x["b"][0])}),
        np.float32(0),
        {"a": xs, "b": [xs]},
        unroll=4,
    )
    close(ys["s"], 2 * xs)
    carry, ys = kl.scan(lambda c, _: (mul(c, 2.0), c), np.float32(1.0), None, length=4)
    close(ys, [1, 2, 4, 8])
    close(carry, 16.0)


def test_scan_gradient_against_central_differences():
    w = randn(3, dtype=np.float64)
    xs = randn(5, 3, dtype=np.float64)

    def f(w):
        c, _ = kl.scan(lambda c, x: (add(mul(c, sin(w)), x), c), np.zeros(3), xs)
        return sum(c)

    def f_np(w):
        c = np.zeros(3)
        for x in xs:
            c = c * np.sin(w) + x
        return c.sum()

    eps = 1e-6
    fd = np.array([(f_np(w + eps * e) - f_np(w - eps * e)) / (2 * eps) for e in np.eye(3)])
    close(kl.grad(f)(w), fd, 1e-6, 1e-8)
    close(kl.jit(kl.grad(f))(w), fd, 1e-6, 1e-8)


class Stop(Exception):
    pass


def test_exceptions_in_bodies_keep_their_type():
    def body(c):
        raise Stop("in the body")

    for run in (
        lambda: kl.while_loop(lambda c: greater(c, 0.0), body, np.float32(1.0)),
        lambda: kl.jit(lambda x: kl.while_loop(lambda c: greater(c, 0.0), body, x))(
            np.float32(1.0)
        ),
        lambda: kl.cond(True, body, body, 1.0),
        lambda: kl.fori_loop(0, 3, lambda i, c: body(c), 1.0),
        lambda: kl.scan(lambda c, x: body(c), 1.0, None, length=2),
    ):
        with pytest.raises(Stop, match="in the body"):
            run()


def test_structure_errors_name_the_operation():
    with pytest.raises(kl.Error, match="while_loop"):
        kl.while_loop(lambda c: greater(c[0], 0.0), lambda c: (c[0],), (np.float32(1.0), 2.0))
    with pytest.raises(kl.Error, match="cond"):
        kl.cond(True, lambda: kl.asarray(1.0), lambda: (kl.asarray(1.0),))


def test_jit_of_a_loop_that_carries_nothing():
    # A scan with an empty carry and no outputs (what such a Python for loop becomes) is dead
    # code for jit's passes, on either backend.
    x = kl.asarray(np.arange(6.0).reshape(3, 2))

    def f(x):
        kl.scan(lambda c, r: ((), ()), (), x)
        return x * 2

    def g(x):
        for r in x:
            y = r * 2  # noqa: F841
        return x * 2

    for fn in (f, g):
        np.testing.assert_array_equal(np.asarray(kl.jit(fn)(x)), np.arange(6.0).reshape(3, 2) * 2)
