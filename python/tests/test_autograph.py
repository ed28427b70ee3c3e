"""kiln.autograph: Python if/while/for on traced tensors under jit, Python values unchanged.

References are independent: plain Python loops on ints and floats, numpy, analytic derivatives,
and the unconverted function run eagerly on concrete tensors."""
import ast
import math
import re

import numpy as np
import pytest

import kiln as kl
from kiln import autograph

THIS_FILE = __file__


def line_of(fun, text):
    """The line number in this file of the first line of `fun` containing `text`."""
    import inspect

    lines, first = inspect.getsourcelines(fun)
    return first + next(i for i, l in enumerate(lines) if text in l)


def collatz_python(n):
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


def collatz_steps(n):
    steps = kl.zeros((), kl.int32) if isinstance(n, kl.Tensor) else 0
    while n != 1:
        if n % 2 == 0:
            n = n // 2
        else:
            n = 3 * n + 1
        steps += 1
    return steps


def piecewise(x):
    if x < -1.0:
        y = -x
    elif x < 1.0:
        if x < 0.0:
            y = x * x
        else:
            y = 2.0 * x
    else:
        y = x + 1.0
    return y


def piecewise_reference(x):
    if x < -1:
        return -x
    if x < 0:
        return x * x
    if x < 1:
        return 2 * x
    return x + 1


def halve_while_big(x, flag):
    # A while loop inside an if.
    if flag > 0:
        while x > 1.0:
            x = x * 0.5
    else:
        x = x - 1.0
    return x


def sum_of_multiples(x, n):
    total = x * 0.0
    for i in range(n):
        total = total + x * i
    return total


def early_return(x):
    if x > 0.0:
        return x * 3.0
    y = x * x
    if y > 4.0:
        return y
    return -y


@kl.jit
def collatz_jitted_at_module_level(n):
    steps = kl.zeros((), kl.int32)
    while n != 1:
        n = kl.where(n % 2 == 0, n // 2, 3 * n + 1)
        steps += 1
    return steps


# ---------------------------------------------------------------------------------------------
# The rewritten source.
# ---------------------------------------------------------------------------------------------


def test_to_source_parses_and_calls_the_helpers():
    src = autograph.to_source(collatz_steps)
    tree = ast.parse(src)
    assert isinstance(tree.body[0], ast.FunctionDef) and tree.body[0].name == "collatz_steps"
    assert "ag__.while_stmt(" in src and "ag__.if_stmt(" in src
    assert "ag__.for_range(" in autograph.to_source(sum_of_multiples)
    assert "while " not in src and "if n % 2" not in src


def test_decorators_are_not_reapplied():
    calls = []

    def counting(f):
        calls.append(f)
        return f

    @counting
    def double_if_positive(x):
        if x > 0:
            x = x * 2
        return x

    assert len(calls) == 1
    converted = autograph.convert(double_if_positive)
    assert "@" not in autograph.to_source(double_if_positive)
    assert converted(3) == 6 and converted(-3) == -3
    assert len(calls) == 1


def test_conversion_is_cached_per_function_and_per_code():
    assert autograph.convert(piecewise) is autograph.convert(piecewise)
    converted = autograph.convert(piecewise)
    assert autograph.convert(converted) is converted

    def make(k):
        def add_k(x):
            if x > 0:
                x = x + k
            return x

        return add_k

    a, b = autograph.convert(make(1)), autograph.convert(make(10))
    assert a.__code__ is b.__code__  # one conversion of the code, two closures
    assert (a(1), b(1), a(-1)) == (2, 11, -1)


def test_unconvertible_objects_are_returned_unchanged():
    namespace = {}
    exec("def typed_at_a_prompt(x):\n    if x:\n        return 1\n    return 2\n", namespace)
    fun = namespace["typed_at_a_prompt"]
    assert autograph.convert(fun) is fun
    square = lambda x: x * x  # noqa: E731
    assert autograph.convert(square) is square
    assert autograph.convert(abs) is abs
    with pytest.raises(kl.Error, match="cannot be converted: no source"):
        autograph.to_source(fun)
    with pytest.raises(kl.Error, match="lambda"):
        autograph.to_source(square)


# ---------------------------------------------------------------------------------------------
# Python values: the converted function computes what the original does.
# ---------------------------------------------------------------------------------------------


def test_python_values_collatz():
    converted = autograph.convert(collatz_steps)
    for n in (1, 2, 3, 7, 27, 97):
        assert converted(n) == collatz_python(n)
    assert converted(27) == 111


def test_python_values_match_the_original():
    cases = [
        (piecewise, [(-3.0,), (-0.5,), (0.5,), (2.0,)]),
        (halve_while_big, [(10.0, 1), (10.0, 0), (0.5, 1)]),
        (sum_of_multiples, [(1.5, 0), (1.5, 4)]),
        (early_return, [(2.0,), (-1.0,), (-3.0,)]),
    ]
    for fun, argsets in cases:
        converted = autograph.convert(fun)
        assert converted is not fun
        for args in argsets:
            assert converted(*args) == fun(*args), (fun.__name__, args)
    assert [early_return(v) for v in (2.0, -1.0, -3.0)] == [6.0, -1.0, 9.0]


def test_python_control_flow_statements_unchanged():
    trace = []

    def loops(xs, limit):
        total = 0
        for i, x in enumerate(xs):  # tuple target, Python iterable
            if x < 0:
                continue
            if total > limit:
                break
            trace.append(i)
            total += x
        else:
            total = -total
        k = 0
        while True:
            k += 1
            if k >= 3:
                break
        for j in range(10, 0, -3):
            total += j
        return total, k, j

    converted = autograph.convert(loops)
    for args in (([1, -2, 3], 100), ([5, 5, 5, 5], 7), ([], 0)):
        trace.clear()
        expected = loops(*args)
        expected_trace = list(trace)
        trace.clear()
        assert converted(*args) == expected
        assert trace == expected_trace


def dead_counter(x):
    k = 0
    while x > 1.0:
        x = x / 2.0
        k += 1  # read by the next iteration only: carried, not a result
    return x


def assorted(n, xs):
    out = []
    for i in range(n):
        if i % 3 == 0:
            first = i  # defined in the loop, read after it
            continue_with = [v * i for v in xs if v > i]
        j = 0
        while j < i:
            tmp = j * 2  # noqa: F841 (a temporary of the loop body)
            j += 1
        else:
            tmp2 = j
        try:
            if i == 2:
                raise ValueError(i)
        except ValueError as err:
            out.append(("err", err.args[0]))
        with open(__file__) as fh:
            if fh.readable():
                out.append(tmp2)
        fns = [lambda k=k: k + i for k in range(2)]
        out.append(sum(f() for f in fns))
    return out, first, continue_with


def test_python_values_loops_temporaries_and_nesting():
    converted = autograph.convert(dead_counter)
    assert converted(100.0) == dead_counter(100.0) == 100.0 / 128
    converted = autograph.convert(assorted)
    for args in ((4, [1, 5, 9]), (7, [0, 3])):
        assert converted(*args) == assorted(*args)


def test_closures_globals_and_nested_functions():
    counter = {"n": 0}
    scale = 3

    def outer(x):
        hits = 0

        def bump(v):
            nonlocal hits
            if v > 0:
                hits += 1
            return hits

        for v in (x, -x, x):
            bump(v)
        if hits > 1:
            counter["n"] += 1
            result = hits * scale
        else:
            result = 0
        return result

    converted = autograph.convert(outer)
    assert converted(2) == outer(2) == 6
    assert converted(-2) == outer(-2) == 0
    assert counter["n"] == 2
    assert "ag__.if_stmt(" in autograph.to_source(outer).split("def bump")[1]


_GLOBAL_COUNT = 0


def bump_global(x):
    global _GLOBAL_COUNT
    if x > 0:
        _GLOBAL_COUNT += x
    return _GLOBAL_COUNT


def test_global_assignments_reach_the_module():
    converted = autograph.convert(bump_global)
    assert converted(2) == 2 and converted(-5) == 2 and converted(3) == 5
    assert _GLOBAL_COUNT == 5


def test_variable_defined_in_one_branch_is_fine_on_python_values():
    def maybe(x):
        if x > 0:
            y = x
        if x > 0:
            return y
        return 0

    converted = autograph.convert(maybe)
    assert converted(4) == 4 and converted(-4) == 0

    def unbound(x):
        if x > 0:
            y = x
        return y + 1

    with pytest.raises(UnboundLocalError):
        unbound(-1)
    with pytest.raises(UnboundLocalError, match="'y'"):
        autograph.convert(unbound)(-1)


def test_bound_methods_are_converted():
    class Counter:
        def __init__(self):
            self.limit = 5

        def count(self, n):
            k = 0
            while k < n and k < self.limit:
                k += 1
            return k

    c = Counter()
    converted = autograph.convert(c.count)
    assert converted(3) == 3 and converted(9) == 5
    assert "ag__.and_(" in autograph.to_source(c.count)


# ---------------------------------------------------------------------------------------------
# Traced tensors: cond / while_loop / fori_loop, same results as eager.
# ---------------------------------------------------------------------------------------------


def test_issue_collatz_under_jit():
    @kl.jit
    def collatz(n):
        steps = kl.zeros((), kl.int32)
        while n != 1:  # tensor-dependent: becomes kl.while_loop
            n = kl.where(n % 2 == 0, n // 2, 3 * n + 1)
            steps += 1
        return steps

    assert int(np.asarray(collatz(kl.asarray(27)))) == collatz_python(27) == 111
    for n in (1, 6, 97):
        assert int(np.asarray(collatz(kl.asarray(n)))) == collatz_python(n)


def test_collatz_with_nested_if_under_jit_matches_eager():
    jitted = kl.jit(collatz_steps)
    for n in (1, 7, 27):
        eager = collatz_steps(kl.asarray(n))  # unconverted, concrete tensors
        assert int(np.asarray(jitted(kl.asarray(n)))) == int(np.asarray(eager)) == collatz_python(n)


def test_if_elif_else_and_nested_conditionals():
    jitted = kl.jit(piecewise)
    for v in (-3.0, -1.0, -0.5, 0.0, 0.25, 1.0, 2.5):
        x = kl.asarray(np.float32(v))
        got = float(np.asarray(jitted(x)))
        assert got == pytest.approx(piecewise_reference(v), rel=1e-6)
        assert got == pytest.approx(float(np.asarray(piecewise(x))), rel=1e-6)


def test_while_inside_if():
    jitted = kl.jit(halve_while_big)
    for v, flag in ((10.0, 1), (10.0, 0), (0.5, 1), (100.0, 2)):
        x, f = kl.asarray(np.float32(v)), kl.asarray(flag)
        expected = halve_while_big(v, flag)  # Python floats and ints
        assert float(np.asarray(jitted(x, f))) == pytest.approx(expected, rel=1e-6)


def test_for_range_with_a_tensor_bound():
    jitted = kl.jit(sum_of_multiples)
    x = kl.asarray(np.float32(1.5))
    for n in (0, 1, 5):
        expected = sum(1.5 * i for i in range(n))
        assert float(np.asarray(jitted(x, kl.asarray(n)))) == pytest.approx(expected)

    def strided(n):
        total = kl.zeros((), kl.int32)
        for i in range(1, n, 3):
            total = total + i
        return total

    for n in (0, 2, 11):
        assert int(np.asarray(kl.jit(strided)(kl.asarray(n)))) == sum(range(1, n, 3))


def test_early_return_becomes_one_cond():
    jitted = kl.jit(early_return)
    for v in (2.0, -1.0, -3.0):
        assert float(np.asarray(jitted(kl.asarray(np.float32(v))))) == pytest.approx(
            early_return(v)
        )


def test_and_or_not_in_tensor_conditions():
    def clipped_steps(x, limit):
        k = kl.zeros((), kl.int32)
        while x > 1.0 and not k >= limit:
            x = x * 0.5
            k += 1
        return k

    jitted = kl.jit(clipped_steps)
    for v, limit in ((100.0, 3), (100.0, 50), (0.5, 3)):
        expected = 0
        x = v
        while x > 1.0 and expected < limit:
            x, expected = x * 0.5, expected + 1
        got = jitted(kl.asarray(np.float32(v)), kl.asarray(limit))
        assert int(np.asarray(got)) == expected


def test_convert_under_grad():
    def f(x):
        if x > 0.0:
            y = x * x * x
        else:
            y = -2.0 * x
        return y

    df = kl.grad(autograph.convert(f))
    for v in (1.5, -0.5):
        expected = 3 * v * v if v > 0 else -2.0
        got = float(np.asarray(df(kl.asarray(np.float64(v)))))
        assert math.isclose(got, expected, rel_tol=1e-12)


# ---------------------------------------------------------------------------------------------
# Errors name the construct, the variable and the Python line.
# ---------------------------------------------------------------------------------------------


def test_return_in_a_tensor_loop_is_a_clear_error():
    def first_big(x):
        k = kl.zeros((), kl.int32)
        while k < 10:
            if x > 5.0:
                return k
            x = x * 2.0
            k += 1
        return k

    eager = autograph.convert(first_big)(kl.asarray(np.float32(1.0)))  # concrete: Python's loop
    assert int(np.asarray(eager)) == 3
    with pytest.raises(kl.Error) as info:
        kl.jit(first_big)(kl.asarray(np.float32(1.0)))
    message = str(info.value)
    assert "`return`" in message and "[autograph]" in message
    assert f"test_autograph.py:{line_of(first_big, 'while k < 10')}" in message


def test_variable_defined_in_one_branch_only_is_a_clear_error():
    def one_sided(x):
        if x > 0.0:
            y = x
        return y

    with pytest.raises(kl.Error) as info:
        kl.jit(one_sided)(kl.asarray(np.float32(1.0)))
    message = str(info.value)
    assert "'y'" in message and "true branch" in message
    assert f"test_autograph.py:{line_of(one_sided, 'if x > 0.0')}" in message


def test_carry_changing_type_names_the_python_line():
    def widening(n):
        x = kl.zeros((), kl.int32)
        while x < n:
            x = kl.zeros((), kl.float32) + 1.0
        return x

    with pytest.raises(kl.Error) as info:
        kl.jit(widening)(kl.asarray(3))
    message = str(info.value)
    assert "[while_loop]" in message and "[0] x" in message
    assert f"test_autograph.py:{line_of(widening, 'while x < n')}" in message


def test_carry_undefined_before_a_tensor_loop():
    def late(n):
        i = kl.zeros((), kl.int32)
        while i < n:
            last = i
            i = i + 1
        return last

    with pytest.raises(kl.Error, match="'last'.*not defined before it"):
        kl.jit(late)(kl.asarray(3))
    assert late(3) == 2  # Python values: unchanged
    assert autograph.convert(late)(3) == 2


def test_loop_variable_read_after_a_tensor_range():
    def last_index(n):
        total = kl.zeros((), kl.int32)
        for i in range(n):
            total = total + i
        return total + i

    def last_index_defined(n):
        i = -1
        total = 0
        for i in range(n):
            total = total + i
        return total * 100 + i

    with pytest.raises(kl.Error, match="loop variable 'i'.*no value before it"):
        kl.jit(last_index)(kl.asarray(3))
    for n in (0, 1, 4):  # as Python: the last index, or the value before an empty loop
        got = kl.jit(last_index_defined)(kl.asarray(n))
        assert int(np.asarray(got)) == last_index_defined(n)


def test_conditional_expressions_chained_comparisons_and_del():
    def mixed(x, lo, hi):
        inside = 1 if lo < x < hi else 0
        if lo < x <= hi:
            tmp = x  # noqa: F841 (deleted below)
            del tmp
            label = "in"
        else:
            label = "out"
        return inside, label

    converted = autograph.convert(mixed)
    src = autograph.to_source(mixed)
    assert "ag__.if_exp(" in src and "ag__.and_(" in src
    for args in ((1, 0, 2), (2, 0, 2), (5, 0, 2)):
        assert converted(*args) == mixed(*args)


def test_conditional_expression_on_a_traced_tensor():
    def relu_ish(x):
        return x * 2.0 if x > 0.0 else x * 0.5

    jitted = kl.jit(relu_ish)
    for v in (3.0, -3.0):
        assert float(np.asarray(jitted(kl.asarray(np.float32(v))))) == pytest.approx(relu_ish(v))


def test_to_source_of_a_jitted_function():
    jitted = kl.jit(collatz_steps)
    assert autograph.to_source(jitted) == autograph.to_source(collatz_steps)


def test_for_over_a_traced_tensor_scans():
    def decayed_sum(xs):
        total = kl.zeros((3,), kl.float32)
        for row in xs:
            total = total * 0.5 + row
        return total

    xs = np.arange(12, dtype=np.float32).reshape(4, 3)
    expected = np.zeros(3, np.float32)
    for row in xs:
        expected = expected * 0.5 + row
    assert "ag__.for_stmt(" in autograph.to_source(decayed_sum)
    np.testing.assert_allclose(np.asarray(kl.jit(decayed_sum)(kl.asarray(xs))), expected, rtol=1e-6)


def test_converted_function_on_concrete_tensors_runs_python_statements():
    converted = autograph.convert(collatz_steps)
    for n in (6, 27):
        assert int(np.asarray(converted(kl.asarray(n)))) == collatz_python(n)
    for v in (-3.0, 0.5):
        x = kl.asarray(np.float32(v))
        assert float(np.asarray(autograph.convert(piecewise)(x))) == pytest.approx(
            piecewise_reference(v)
        )


def test_vmap_with_per_example_trip_counts():
    ns = np.array([1, 6, 27, 97], np.int32)
    expected = [collatz_python(int(n)) for n in ns]
    converted = autograph.convert(collatz_steps)
    np.testing.assert_array_equal(np.asarray(kl.vmap(converted)(kl.asarray(ns))), expected)
    np.testing.assert_array_equal(np.asarray(kl.jit(kl.vmap(converted))(kl.asarray(ns))), expected)


def test_grad_through_a_converted_data_dependent_loop():
    def newton_sqrt(a):
        x = a
        k = 0
        while kl.abs(x * x - a) > 1e-12 and k < 100:
            x = 0.5 * (x + a / x)
            k += 1
        return x

    for a in (2.0, 9.0):
        x = kl.asarray(np.float64(a))
        assert float(np.asarray(kl.jit(newton_sqrt)(x))) == pytest.approx(math.sqrt(a), 1e-12)
        got = float(np.asarray(kl.grad(autograph.convert(newton_sqrt))(x)))
        assert got == pytest.approx(0.5 / math.sqrt(a), rel=1e-9)


def test_python_loop_becoming_traced_and_side_effect_only_if():
    seen = []

    def accumulate(t):
        x = 0
        while x < 5:  # Python on the first test, then one while_loop on the traced x
            x = x + t
        if t > 100.0:
            seen.append("traced both branches")
        return x

    for v in (2.0, 0.75):
        expected, x = None, 0
        while x < 5:
            x = x + v
        expected = x
        got = kl.jit(accumulate)(kl.asarray(np.float32(v)))
        assert float(np.asarray(got)) == pytest.approx(expected)
    assert seen  # the branch without results was traced, not selected


def test_module_level_decorated_function():
    assert int(np.asarray(collatz_jitted_at_module_level(kl.asarray(27)))) == 111
    src = autograph.to_source(collatz_jitted_at_module_level)
    assert "@" not in src and "ag__.while_stmt(" in src


def test_autograph_false_keeps_python_semantics():
    def sign(x):
        if x > 0.0:
            return x
        return -x

    with pytest.raises(kl.Error, match=r"kiln\.cond"):
        kl.jit(sign, autograph=False)(kl.asarray(np.float32(2.0)))
    assert float(np.asarray(kl.jit(sign)(kl.asarray(np.float32(-2.0))))) == 2.0


def break_and_continue(x, n, xs):
    k = 0
    while k < 10:  # break
        if x > 5.0:
            break
        x = x * 2.0
        k += 1
    else:
        k = -1
    odd = 0
    for i in range(n):  # continue, and a break with an else clause
        if i % 2 == 0:
            continue
        if i > 7:
            break
        odd = odd + i
    else:
        odd = odd + 1000
    total = 0.0
    for row in xs:  # break in a for over an iterable
        if row > 2.0:
            break
        total = total + row
    steps = 0
    while True:
        steps += 1
        if steps * x > 40.0:
            break
    return k, odd, total, steps


def test_break_and_continue_on_python_values():
    converted = autograph.convert(break_and_continue)
    src = autograph.to_source(break_and_continue)
    assert not [s for s in src.splitlines() if s.strip() in ("break", "continue")]
    for args in ((1.0, 5, [1.0, 0.5, 3.0, 1.0]), (7.0, 12, [0.1, 0.2]), (0.001, 0, [])):
        assert converted(*args) == break_and_continue(*args)

    def first_two(it):
        out = []
        for v in it:
            out.append(v)
            if len(out) == 2:
                break
        return out

    it = iter(range(5))
    assert autograph.convert(first_two)(it) == [0, 1] and next(it) == 2  # nothing extra read


def test_break_and_continue_on_traced_tensors():
    jitted = kl.jit(break_and_continue)
    for x, n, xs in ((1.0, 5, [1.0, 0.5, 3.0, 1.0]), (7.0, 12, [0.1, 0.2]), (0.01, 0, [0.5])):
        expected = break_and_continue(x, n, xs)
        got = jitted(kl.asarray(np.float32(x)), kl.asarray(n), kl.asarray(np.float32(xs)))
        got = [float(np.asarray(g)) for g in got]
        assert got == pytest.approx([float(e) for e in expected], rel=1e-6), (x, n, xs)


class _ProgramGenerator:
    """Random integer programs of assignments, if/elif/else, while and for-range loops (bounded
    trip counts), and/or/not, break, continue and early returns; values stay in 0..96."""

    def __init__(self, seed):
        import random

        self.r = random.Random(seed)
        self.loops = 0

    def atom(self, scope):
        return str(self.r.randint(0, 9)) if self.r.random() < 0.3 else self.r.choice(scope)

    def expr(self, scope):
        return f"({self.atom(scope)} {self.r.choice('+*+')} {self.atom(scope)}) % 97"

    def cond(self, scope, nested=False):
        k, r = self.r.random(), self.r
        if not nested and k < 0.2:
            return f"{self.cond(scope, True)} {r.choice(['and', 'or'])} {self.cond(scope, True)}"
        if not nested and k < 0.3:
            return f"not {self.cond(scope, True)}"
        return (
            f"{self.atom(scope)} % {r.randint(2, 5)} {r.choice(['<', '>', '==', '!='])} "
            f"{r.randint(0, 3)}"
        )

    def block(self, scope, depth, in_loop):
        r, out = self.r, []
        indent = lambda lines: ["    " + line for line in lines]  # noqa: E731
        for _ in range(r.randint(1, 3)):
            k = r.random()
            if depth >= 3 or k < 0.45:
                v = r.choice("abct")
                if r.random() < 0.3:
                    out += [f"{v} += {self.atom(scope)} % 7", f"{v} = {v} % 97"]
                else:
                    out.append(f"{v} = {self.expr(scope)}")
            elif k < 0.65:
                out.append(f"if {self.cond(scope)}:")
                out += indent(self.block(scope, depth + 1, in_loop))
                if r.random() < 0.5:
                    out.append(f"elif {self.cond(scope)}:")
                    out += indent(self.block(scope, depth + 1, in_loop))
                if r.random() < 0.5:
                    out.append("else:")
                    out += indent(self.block(scope, depth + 1, in_loop))
            elif k < 0.8:
                self.loops += 1
                i = f"i{self.loops}"
                out += [f"{i} = 0", f"while {i} < {self.atom(scope)} % 4 + 1:", f"    {i} += 1"]
                out += indent(self.block(scope + [i], depth + 1, True))
            elif k < 0.93:
                self.loops += 1
                j = f"j{self.loops}"
                out.append(f"for {j} in range({self.atom(scope)} % 4):")
                out += indent(self.block(scope + [j], depth + 1, True))
            elif in_loop:
                out += [f"if {self.cond(scope)}:", "    " + r.choice(["break", "continue"])]
            else:
                out += [f"if {self.cond(scope)}:", "    return a, b, c, (t + 1) % 97"]
        return out

    def program(self, name):
        body = ["t = 0"] + self.block(list("abct"), 0, False) + ["return a, b, c, t"]
        return f"def {name}(a, b, c):\n" + "".join(f"    {line}\n" for line in body)


def test_random_programs_agree_on_python_values_and_traced_tensors(tmp_path):
    import importlib.util

    count = 25
    path = tmp_path / "ag_random_programs.py"
    path.write_text("".join(_ProgramGenerator(seed).program(f"p{seed}") for seed in range(count)))
    spec = importlib.util.spec_from_file_location("ag_random_programs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for seed in range(count):
        original = getattr(module, f"p{seed}")
        converted, jitted = autograph.convert(original), kl.jit(original)
        for args in ((1, 2, 3), (5, 0, 7), (4, 9, 2)):
            expected = original(*args)
            assert converted(*args) == expected, (seed, args)
            got = jitted(*[kl.asarray(v) for v in args])
            assert tuple(int(np.asarray(g)) for g in got) == expected, (seed, args)


def test_python_values_with_try_with_match_generators_coroutines_and_super():
    import asyncio
    import contextlib

    log = []

    @contextlib.contextmanager
    def scope(tag):
        log.append(("enter", tag))
        yield
        log.append(("exit", tag))

    def jumps_through_with_and_finally(n):
        out = []
        for i in range(n):
            with scope(i):
                try:
                    if i == 2:
                        continue
                    if i == 4:
                        break
                    out.append(i)
                finally:
                    out.append(-i)
        return out

    def walrus(xs):
        it, s = iter(xs), 0
        while (v := next(it, None)) is not None:
            s += v
        return s

    def matcher(v):
        match v:
            case [a, b]:
                if a > b:
                    r = a
                else:
                    r = b
            case _:
                r = None
        return r

    def odd_numbers(n):
        i = 0
        while i < n:
            if i % 2:
                yield i
            i += 1

    async def odd_sum(n):
        t = 0
        for i in range(n):
            if i % 2:
                await asyncio.sleep(0)
                t += i
        return t

    class Base:
        def f(self, x):
            return x + 1

    class Derived(Base):
        def f(self, x):
            if x > 0:
                x = super().f(x)
            return x

    for fun, args in (
        (jumps_through_with_and_finally, (6,)),
        (walrus, ([1, 2, 3],)),
        (matcher, ([1, 5],)),
        (matcher, (3,)),
    ):
        log.clear()
        expected, expected_log = fun(*args), list(log)
        log.clear()
        assert autograph.convert(fun)(*args) == expected and log == expected_log
    assert list(autograph.convert(odd_numbers)(7)) == list(odd_numbers(7)) == [1, 3, 5]
    assert asyncio.run(autograph.convert(odd_sum)(6)) == asyncio.run(odd_sum(6)) == 9
    d = Derived()
    assert autograph.convert(d.f)(1) == d.f(1) == 2


def test_static_arguments_keep_python_control_flow():
    traces = []

    def power(x, n, mode):
        traces.append((n, mode))
        y = x * 0.0 + 1.0
        for _ in range(n):  # n static: unrolled at trace time
            y = y * x
        if mode == "neg":  # a Python string: Python's if
            y = -y
        return y

    jitted = kl.jit(power, static_argnums=(1, 2))
    x = kl.asarray(np.float32(1.5))
    assert float(np.asarray(jitted(x, 3, "neg"))) == pytest.approx(-(1.5**3))
    assert float(np.asarray(jitted(x, 3, "neg"))) == pytest.approx(-(1.5**3))
    assert float(np.asarray(jitted(x, 2, "pos"))) == pytest.approx(1.5**2)
    assert traces == [(3, "neg"), (2, "pos")]  # traced once per static value


def helper_with_tensor_if(x):
    if x > 0.0:
        x = x * 10.0
    return x


class Scaler:
    def __init__(self, k):
        self.k = k

    def apply(self, x):
        while x < self.k:
            x = x * 2.0
        return x

    def __call__(self, x):
        if x > self.k:
            x = x - self.k
        return x


def test_called_functions_are_converted_but_not_library_ones():
    import statistics

    def caller(x, s):
        y = helper_with_tensor_if(x) + s.apply(x)
        return statistics.mean([1.0, 3.0]) + y

    src = autograph.to_source(caller)
    assert "ag__.callee(helper_with_tensor_if)(x)" in src
    assert autograph.to_source(caller, recursive=False).count("ag__.callee") == 0
    assert autograph.callee(helper_with_tensor_if) is autograph.convert(helper_with_tensor_if)
    assert autograph.callee(statistics.mean) is statistics.mean  # the standard library
    assert autograph.callee(np.mean) is np.mean  # an installed package
    assert autograph.callee(autograph.to_source) is autograph.to_source  # Kiln itself
    assert autograph.callee(kl.tree.names) is kl.tree.names  # Kiln beside kiln.autograph too
    assert autograph.convert(caller)(1.0, Scaler(5.0)) == caller(1.0, Scaler(5.0)) == 20.0


def test_called_functions_with_tensor_control_flow_under_jit():
    def caller(x):
        scaler = Scaler(5.0)
        return helper_with_tensor_if(x - 2.0) + scaler.apply(x) + scaler(x)

    for v in (1.0, 0.75, 7.0):
        got = float(np.asarray(kl.jit(caller)(kl.asarray(np.float32(v)))))
        assert got == pytest.approx(caller(v))
    with pytest.raises(kl.Error):  # shallow conversion: the helper's `if` stays Python's
        kl.jit(autograph.convert(caller, recursive=False), autograph=False)(
            kl.asarray(np.float32(1.0))
        )


# ---------------------------------------------------------------------------------------------
# Variables read only through closures, recursion, functions entering transformations under
# jit, and ranges over traced bounds as fori_loop.
# ---------------------------------------------------------------------------------------------


def last_multiple_through_a_lambda(x, n):
    last = x * 0.0
    show = lambda: last * 1.0  # noqa: E731 (the lambda is the point)
    i = 0
    while i < n:
        last = x * i  # `last` is read after the loop only through `show`
        i = i + 1
    return show()


def pair_through_a_nested_def(x):
    vals = [0, 0]

    def get():
        return vals

    if x > 0:
        vals = [101, 102]  # read after the `if` only through `get`
    else:
        vals = [1, 2]
    return get()


def halve_with_closures_in_the_body(x, n):
    i = 0
    while i < n:
        d = x - 1.0  # a temporary of the body that its closures read: not carried
        x = kl.cond(d > 0, lambda: x - d * 0.5, lambda: x + 1.0)

        def twice():
            return d * 2

        x = x + twice() * 0.25
        i = i + 1
    return x


def test_variables_read_only_through_closures_after_converted_statements():
    assert last_multiple_through_a_lambda(10.0, 4) == 30.0  # plain Python: the reference
    got = kl.jit(last_multiple_through_a_lambda)(kl.asarray(10.0), kl.asarray(4))
    assert float(np.asarray(got)) == 30.0
    for v in (1.0, -1.0):
        expected = pair_through_a_nested_def(v)
        got = kl.jit(pair_through_a_nested_def)(kl.asarray(v))
        assert [int(np.asarray(t)) for t in got] == expected
    eager = halve_with_closures_in_the_body(kl.asarray(np.float64(10.0)), 3)  # concrete tensors
    got = kl.jit(halve_with_closures_in_the_body)(kl.asarray(np.float64(10.0)), kl.asarray(3))
    assert float(np.asarray(got)) == float(np.asarray(eager))


def factorial(n):
    if n <= 1:
        return 1
    return n * factorial(n - 1)


def scaled_factorial(x, n):
    return x * factorial(n)  # calls a recursive helper


def power(x, n):
    if n == 0:
        return x * 0.0 + 1.0
    return x * power(x, n - 1)


def test_recursion_that_ends_on_python_values():
    assert kl.jit(factorial, static_argnums=0)(6) == math.factorial(6)
    got = kl.jit(scaled_factorial, static_argnums=1)(kl.asarray(2.0), 5)
    assert float(np.asarray(got)) == 2.0 * math.factorial(5)
    got = kl.jit(power, static_argnums=1)(kl.asarray(np.float64(1.5)), 7)
    assert float(np.asarray(got)) == pytest.approx(1.5**7, rel=1e-14)

    def countdown(n):  # recursive through its closure cell rather than a global
        if n == 0:
            return 0
        return 1 + countdown(n - 1)

    assert kl.jit(countdown, static_argnums=0)(5) == 5


def test_recursion_on_a_traced_condition_is_an_error_naming_the_function():
    with pytest.raises(kl.Error) as info:
        kl.jit(factorial)(kl.asarray(5))
    message = str(info.value)
    assert message.startswith("[autograph] factorial calls itself inside this `if`")
    assert "traced" in message and "static argument" in message
    assert f"{THIS_FILE}:{line_of(factorial, 'if n <= 1')}" in message


def triangle_sum(p, n):
    acc = p * 0.0
    for i in range(n):
        acc = acc + p * p * (i + 1)
    return acc.sum()


def test_functions_entering_transformations_under_jit_are_converted():
    p = kl.asarray(np.array([1.0, 2.0]))
    n = 4
    weights = n * (n + 1) / 2  # reference: the sum of (i + 1), analytically
    value, grad = kl.jit(kl.value_and_grad(triangle_sum))(p, kl.asarray(n))
    np.testing.assert_allclose(np.asarray(value), weights * 5.0, rtol=1e-14)
    np.testing.assert_allclose(np.asarray(grad), weights * 2 * np.asarray(p), rtol=1e-14)
    batched = kl.jit(kl.vmap(triangle_sum, in_axes=(0, None)))(kl.ones((3, 2)), kl.asarray(n))
    np.testing.assert_allclose(np.asarray(batched), [weights * 2] * 3, rtol=1e-6)
    # Outside jit, grad does not convert: Python's own `for` on a traced bound fails as before.
    with pytest.raises(kl.Error, match="needs a concrete value"):
        kl.grad(triangle_sum)(p, kl.asarray(n))


def keep_larger(carry, x):
    if x > carry:  # a Python `if` on traced values in a body that kiln.scan calls
        carry = x
    return carry, carry * 2.0


def running_max_doubled(xs):
    return kl.scan(keep_larger, xs[0], xs)


def test_bodies_entering_control_flow_under_jit_are_converted():
    xs = np.array([0.5, -1.0, 2.0, 1.5, 3.0, -2.0])
    carry, ys = kl.jit(running_max_doubled)(kl.asarray(xs))
    assert float(np.asarray(carry)) == xs.max()
    np.testing.assert_array_equal(np.asarray(ys), 2.0 * np.maximum.accumulate(xs))


def test_an_unconvertible_function_under_jit_says_so():
    f = kl.jit(kl.grad(lambda p, n: triangle_sum(p, n)))
    with pytest.raises(kl.Error) as info:
        f(kl.asarray(np.array([1.0])), kl.asarray(3))
    message = str(info.value)
    assert "needs a concrete value" in message and "code it did not convert" in message
    line = line_of(test_an_unconvertible_function_under_jit_says_so, "lambda p, n")
    assert f"<lambda> ({THIS_FILE}:{line}: no source: a lambda" in message
    line = line_of(triangle_sum, "def triangle_sum")
    assert f"triangle_sum ({THIS_FILE}:{line}: called from code that was not converted)" in message
    assert "kiln.autograph.convert" in message

    def through_a_converted_if(p, n):
        total = lambda: triangle_sum(p, n)  # noqa: E731 (a lambda: its calls stay unconverted)
        if p.sum() > 0:
            y = total()
        else:
            y = p.sum()
        return y

    with pytest.raises(kl.Error) as info:
        kl.jit(through_a_converted_if)(kl.asarray(np.array([1.0])), kl.asarray(3))
    message = str(info.value)
    line = line_of(through_a_converted_if, "lambda: triangle_sum")
    assert "in the `if` at" in message
    assert (
        f"did not convert: through_a_converted_if.<locals>.<lambda> ({THIS_FILE}:{line}: "
        "no source: a lambda" in message
        and "triangle_sum (" in message
    )


def ranges(x, a, b, m=kl):
    """Loops over range(b), range(a, b), range(a, b, 3) and range(b, a, -2); with Python ints
    and m=np it is plain Python, the reference."""
    acc = x * 0.0
    for i in range(b):
        acc = m.sin(acc * x + i)
    for i in range(a, b):
        acc = acc + x * m.cos(acc + i)
    for i in range(a, b, 3):
        acc = acc * x + i
    for i in range(b, a, -2):
        acc = m.sin(acc) * x - i
    return acc


def test_ranges_over_traced_bounds_become_fori_loops_with_right_gradients():
    jitted = kl.jit(ranges)
    dx = kl.jit(kl.grad(ranges))
    for a, b in ((1, 9), (2, 3), (5, 5), (7, 2)):
        for v in (0.3, 0.8):
            x = kl.asarray(np.float64(v))
            bounds = (kl.asarray(a), kl.asarray(b))
            assert float(np.asarray(jitted(x, *bounds))) == pytest.approx(
                ranges(v, a, b, np), rel=1e-12
            )
            h = 1e-6
            fd = (ranges(v + h, a, b, np) - ranges(v - h, a, b, np)) / (2 * h)
            assert float(np.asarray(dx(x, *bounds))) == pytest.approx(fd, rel=1e-7, abs=1e-9)
    # Each loop is the fori_loop form (a counter from the start bound or 0, stepping by 1, tested
    # against the end bound or the trip count), not a while_loop stepping i by the range's step.
    ir = jitted.lower(kl.asarray(np.float64(0.3)), kl.asarray(1), kl.asarray(9))
    loops = ir.split("body_fn=func @body_fn(")[1:]
    assert len(loops) == 4
    for loop in loops:
        body, cond = loop.split("cond_fn=func @cond_fn(")
        one = re.search(r"(%c\d+) = const 1 : i32\[\]", body)
        assert one and f"= add %a0, {one.group(1)} : i32[]" in body
        assert (
            cond.split("{")[1].split("}")[0].split()
            == "%0 = lt %a0, %a2 : bool[] return %0".split()
        )


def test_range_with_a_zero_step_over_traced_bounds_is_pythons_error():
    def zero_step(a, b):
        total = a * 0
        for i in range(a, b, 0):
            total = total + i
        return total

    with pytest.raises(ValueError, match="must not be zero"):
        zero_step(1, 2)
    with pytest.raises(ValueError, match="must not be zero"):
        kl.jit(zero_step)(kl.asarray(1), kl.asarray(2))


def test_range_over_traced_bounds_lowers_as_the_handwritten_fori_loop():
    def converted(x, a, b):
        acc = x * 0.0
        for i in range(a, b):
            acc = acc * x + i
        return acc

    def handwritten(x, a, b):
        return kl.fori_loop(a, b, lambda i, acc: acc * x + i, x * 0.0)

    args = (kl.asarray(np.float64(0.5)), kl.asarray(2), kl.asarray(7))
    ir = kl.jit(converted).lower(*args)
    assert ir.replace("@converted", "@f") == kl.jit(handwritten).lower(*args).replace(
        "@handwritten", "@f"
    )
