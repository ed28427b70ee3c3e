"""jit's static_argnames, is_leaf in kiln.tree, the short path of x[int] and DLPack's bool, as a
JAX or PyTorch user expects them: results against NumPy / PyTorch, trace counts by hand."""
import collections
import os
import queue
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

import kiln as kl
from kops import close, cos, mul, sin

rng = np.random.default_rng(0)


def randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# ---- jit: static_argnames, and static_argnums <-> static_argnames through the signature --------


def power_counting(traces):
    def power(x, n, mode="sin"):
        traces.append((n, mode))
        out = sin(x) if mode == "sin" else cos(x)
        for _ in range(n - 1):  # Python control flow on the static n
            out = mul(out, x)
        return out

    return power


def ref_power(x, n, mode="sin"):
    return (np.sin(x) if mode == "sin" else np.cos(x)) * x ** (n - 1)


def test_static_argnames_one_trace_per_value():
    traces = []
    jf = kl.jit(power_counting(traces), static_argnames=("n", "mode"))
    x = randn(4)
    close(jf(x, n=3), ref_power(x, 3), rtol=1e-5)
    close(jf(x, n=3), ref_power(x, 3), rtol=1e-5)  # a cache hit: no trace
    close(jf(x, n=2, mode="cos"), ref_power(x, 2, "cos"), rtol=1e-5)
    close(jf(x, mode="cos", n=2), ref_power(x, 2, "cos"), rtol=1e-5)  # keyword order is no key
    assert traces == [(3, "sin"), (2, "cos")]
    assert jf._cache_size() == 2
    assert "cos" in jf.lower(x, n=2, mode="cos") and len(traces) == 2  # cached: no trace
    y = randn(5)
    close(jf(y, n=3), ref_power(y, 3), rtol=1e-5)  # a new shape: traced again
    assert traces == [(3, "sin"), (2, "cos"), (3, "sin")]


def test_static_argnames_reach_positional_arguments_and_back():
    # static_argnames=("n",) holds n static when it is passed by position too, and
    # static_argnums=(1,) holds it static when passed by keyword: the signature maps them.
    for options in ({"static_argnames": "n"}, {"static_argnums": 1}):
        traces = []
        jf = kl.jit(power_counting(traces), **options)
        x = randn(3)
        close(jf(x, 3), ref_power(x, 3), rtol=1e-5)
        close(jf(x, 3), ref_power(x, 3), rtol=1e-5)
        close(jf(x, n=3), ref_power(x, 3), rtol=1e-5)
        close(jf(x, n=3), ref_power(x, 3), rtol=1e-5)
        close(jf(x, n=4), ref_power(x, 4), rtol=1e-5)
        # By position and by keyword are two signatures (as in JAX), each traced once.
        assert traces == [(3, "sin"), (3, "sin"), (4, "sin")], options
        assert isinstance(traces[0][0], int)  # passed by value, not traced


def test_non_static_keyword_arguments_are_traced():
    traces = []

    def f(x, scale, n):
        traces.append(type(scale))
        return mul(x, scale) if n == 1 else mul(mul(x, scale), scale)

    jf = kl.jit(f, static_argnames="n")
    x = randn(3)
    close(jf(x, scale=np.float32(2.0), n=1), 2 * x)
    close(jf(x, scale=np.float32(3.0), n=1), 3 * x)  # scale traced: no new trace
    close(jf(x, np.float32(3.0), n=2), 9 * x)
    assert traces == [kl.Tensor, kl.Tensor]


def test_static_values_are_keyed_with_their_type():
    traces = []

    def f(x, n):
        traces.append(n)
        return mul(x, float(n))

    jf = kl.jit(f, static_argnames="n")
    x = randn(2)
    jf(x, n=1)
    jf(x, n=True)  # 1 == True in Python, but a different static value
    jf(x, n=1.0)
    assert [type(t) for t in traces] == [int, bool, float]


def test_static_argnames_with_autograph_and_decorator():
    @kl.jit(static_argnames=("steps",))
    def repeat(x, steps):
        for _ in range(steps):  # a Python int: stays a Python loop
            x = x * 2.0
        return x

    x = randn(3)
    close(repeat(x, steps=3), 8 * x)
    close(repeat(x, 2), 4 * x)
    traces = []
    native = kl._kiln.jit(power_counting(traces), static_argnames="n")
    close(native(x, n=2), ref_power(x, 2), rtol=1e-5)
    close(native(x, 2), ref_power(x, 2), rtol=1e-5)
    assert [t[0] for t in traces] == [2, 2]


def test_static_argument_errors():
    def f(x, n):
        return mul(x, float(len(n)))

    jf = kl.jit(f, static_argnames="n")
    with pytest.raises(
        kl.Error,
        match=r"\[jit\] static argument 'n' of f is not hashable: got " r"\[1, 2\] of type list",
    ):
        jf(randn(2), n=[1, 2])
    with pytest.raises(kl.Error, match=r"static argument 1 \('n'\) of f is not hashable"):
        jf(randn(2), [1, 2])
    close(jf(randn(2) * 0 + 1, n=(1, 2)), [2.0, 2.0])  # a tuple is hashable
    with pytest.raises(
        kl.Error, match=r"static_argnames has 'm', which .*f does not take as a " r"keyword"
    ):
        kl.jit(f, static_argnames="m")
    with pytest.raises(kl.Error, match=r"static_argnums has 2, but .*f takes 2 positional"):
        kl.jit(f, static_argnums=2)

    def only_positional(x, n, /):
        return x

    with pytest.raises(kl.Error, match="does not take as a keyword"):
        kl.jit(only_positional, static_argnames="n")

    def anything(*args, **kwargs):
        return args[0]

    # *args and **kwargs accept any position and any name.
    close(kl.jit(anything, static_argnums=3, static_argnames="k")(np.ones(2), k=1), [1, 1])


# ---- kiln.tree: is_leaf, and map over trees that extend the first (JAX's tree_util semantics) --

Point = collections.namedtuple("Point", "x y")


def test_is_leaf_none_becomes_a_leaf():
    tree = [None, 1, (2, None)]
    assert kl.tree.leaves(tree) == [1, 2]  # None is an empty node by default
    is_none = lambda x: x is None  # noqa: E731
    assert kl.tree.leaves(tree, is_leaf=is_none) == [None, 1, 2, None]
    leaves, treedef = kl.tree.flatten(tree, is_leaf=is_none)
    assert treedef.num_leaves == 4 and kl.tree.unflatten(treedef, leaves) == tree
    assert kl.tree.map(lambda x: x, {"a": None, "b": 1.0}) == {"a": None, "b": 1.0}
    assert kl.tree.map(
        lambda x: "none" if x is None else x + 1, {"a": None, "b": 1.0}, is_leaf=is_none
    ) == {"a": "none", "b": 2.0}


def test_is_leaf_on_tuples_stops_flattening():
    pairs = [(1, 2), Point(3, 4), ((5, 6), 7)]
    is_tuple = lambda x: isinstance(x, tuple)  # noqa: E731
    assert kl.tree.leaves(pairs, is_leaf=is_tuple) == [(1, 2), Point(3, 4), ((5, 6), 7)]
    # The predicate is asked about the root too.
    assert kl.tree.leaves(((1, 2), (3, 4)), is_leaf=is_tuple) == [((1, 2), (3, 4))]
    # Only pairs of numbers: the outer pair of pairs is flattened, its elements are not.
    is_pair = lambda x: isinstance(x, tuple) and all(isinstance(e, int) for e in x)  # noqa: E731
    assert kl.tree.leaves(pairs, is_leaf=is_pair) == [(1, 2), Point(3, 4), (5, 6), 7]
    swapped = kl.tree.map(lambda p: p[::-1] if isinstance(p, tuple) else p, pairs, is_leaf=is_pair)
    assert swapped == [(2, 1), (4, 3), ((6, 5), 7)]
    assert kl.tree.structure(pairs, is_leaf=is_pair).num_leaves == 4
    # Tensors are leaves either way; the predicate sees each of them.
    seen = []
    t = kl.asarray(np.ones(2, np.float32))
    assert kl.tree.leaves({"t": t}, is_leaf=lambda x: seen.append(type(x)) or False)[0] is t
    assert seen == [dict, kl.Tensor]


def test_map_over_several_trees_with_prefix_structure():
    # Where the first tree has a leaf, f gets the other trees' whole subtrees (None included).
    out = kl.tree.map(lambda a, b: (a, b), {"x": 1, "y": 2}, {"x": [3, 4], "y": None})
    assert out == {"x": (1, [3, 4]), "y": (2, None)}
    # The optimiser pattern: params and grads where some grads are None, is_leaf on the first.
    params = {"w": np.ones(2), "b": None, "c": np.zeros(1)}
    grads = {"w": np.full(2, 0.5), "b": np.ones(3), "c": None}
    step = kl.tree.map(
        lambda p, g: p if g is None or p is None else p - g,
        params,
        grads,
        is_leaf=lambda x: x is None,
    )
    np.testing.assert_array_equal(step["w"], [0.5, 0.5])
    assert step["b"] is None and step["c"] is params["c"]
    # is_leaf applies to the first tree only: the second's tuples reach f whole.
    is_tuple = lambda x: isinstance(x, tuple) and not isinstance(x[0], tuple)  # noqa: E731
    got = kl.tree.map(
        lambda a, b, c: len(a) + len(b) + c,
        [(1, 2), (3,)],
        [(1,), (1, 2, 3)],
        [10, 20],
        is_leaf=is_tuple,
    )
    assert got == [13, 24]
    with pytest.raises(
        kl.Error,
        match=r"\[tree.map\] tree 2 does not have the first tree's " r"structure: got \(1, 2\)",
    ):
        kl.tree.map(lambda a, b: a, [1, 2], (1, 2))
    with pytest.raises(kl.Error, match=r"tree 3 does not have"):
        kl.tree.map(lambda a, b, c: a, {"a": 1}, {"a": 2}, {"b": 3})
    with pytest.raises(kl.Error, match=r"tree 2 does not have"):
        kl.tree.map(lambda a, b: a, {"a": None}, {"a": 1.0})  # None is a node without children


# ---- x[int], x[int, int], x[slice]: the eager short path makes the same views -----------------


def layouts():
    """A [4, 5, 3] float32 array under several layouts, as (numpy view, kiln view) pairs."""
    base = np.arange(60, dtype=np.float32).reshape(4, 5, 3)
    k = kl.asarray(base)  # shares base's memory
    yield base, k
    yield base.transpose(2, 0, 1), k.transpose((2, 0, 1))
    yield base[1:, ::2], k[1:, ::2]
    yield base[::-1, :, ::-2], k[::-1, :, ::-2]
    yield base[:, 2:3], k[:, 2:3]  # a size-1 axis


@pytest.mark.parametrize(
    "key",
    [
        0,
        -1,
        2,
        (0, 1),
        (-1, 0, 2),
        (1, slice(None), 0),
        slice(1, 3),
        slice(None, None, -1),
        (slice(0, 2), 1),
        (Ellipsis, 0),
        (None, 0),
        (0, None, slice(1, None)),
    ],
)
def test_basic_indexing_matches_numpy_and_shares_memory(key):
    for a, x in layouts():
        try:
            expected = a[key]
        except IndexError:  # out of bounds for this layout: an error on both sides
            with pytest.raises(kl.Error, match=r"\[getitem\] index out of bounds"):
                x[key]
            continue
        got = x[key]
        np.testing.assert_array_equal(np.asarray(got), expected)
        assert got.shape == expected.shape and got.dtype == kl.float32
    base = np.zeros((3, 4), np.float32)
    view = kl.asarray(base)[1]
    base[1, 2] = 7.0  # the result views the same memory, as NumPy's and PyTorch's do
    assert np.asarray(view)[2] == 7.0


def test_indexing_under_transformations_takes_the_traced_path():
    x = randn(3, 4)
    g = kl.grad(lambda t: kl.sum(t[1] * t[1]) + kl.sum(t[0, 2:]))(x)
    expected = np.zeros_like(x)
    expected[1] = 2 * x[1]
    expected[0, 2:] += 1
    np.testing.assert_allclose(np.asarray(g), expected, rtol=1e-6)
    rows = kl.vmap(lambda r: r[2])(x)
    np.testing.assert_array_equal(np.asarray(rows), x[:, 2])
    np.testing.assert_array_equal(np.asarray(kl.jit(lambda t: t[-1])(x)), x[-1])
    with pytest.raises(kl.Error, match=r"index out of bounds for axis 0"):
        kl.asarray(x)[3]
    with pytest.raises(kl.Error, match=r"too many indices"):
        kl.asarray(x)[0, 1, 2]


# ---- DLPack and bool ---------------------------------------------------------------------------


def test_dlpack_bool_travels_as_uint8_both_ways_zero_copy():
    # Debian's DLPack is 0.6 (no kDLBool); PyTorch 1.13 neither exports bool nor reads kDLBool.
    with pytest.raises(RuntimeError, match="Bool type is not supported by dlpack"):
        torch.utils.dlpack.to_dlpack(torch.tensor([True]))
    flags = np.array([True, False, True])
    k = kl.asarray(flags)
    t = torch.from_dlpack(k)
    assert t.dtype == torch.uint8 and t.tolist() == [1, 0, 1]
    flags[1] = True  # t views kiln's memory, which views flags
    assert t.tolist() == [1, 1, 1]
    # Back: a uint8 PyTorch tensor is read in place, then compared to make bools.
    u = torch.tensor([0, 1, 1], dtype=torch.uint8)
    back = kl.from_dlpack(u)
    assert back.dtype == kl.uint8
    u[0] = 1
    assert np.asarray(back).tolist() == [1, 1, 1]
    assert np.asarray(back != 0).dtype == np.bool_
    with pytest.raises(kl.Error, match=r"negative strides .*PyTorch has no negative strides"):
        torch.from_dlpack(kl.asarray(flags)[::-1])


def test_runtime_info_reports_and_set_gemm_backend_chooses_the_float32_backend():
    info = kl.runtime_info()
    assert info.cpu_isa in ("avx512", "avx2", "baseline")
    assert info.num_threads == kl.num_threads()
    assert info.blas_kernels
    a = np.random.default_rng(0).standard_normal((37, 65)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((65, 19)).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    try:
        for name in ("onednn", "openblas"):
            kl.set_gemm_backend(name)
            assert kl.runtime_info().gemm_backend == name
            np.testing.assert_allclose(
                np.asarray(kl.matmul(kl.asarray(a), kl.asarray(b))), want, rtol=1e-5, atol=1e-5
            )
        with pytest.raises(kl.Error, match=r'\[set_gemm_backend\] unknown backend: got "mkl"'):
            kl.set_gemm_backend("mkl")
    finally:
        kl.set_gemm_backend(None)
    assert kl.runtime_info().gemm_backend == info.gemm_backend


def test_set_flush_denormal_flushes_results_and_operands_and_turns_off_again():
    tiny = np.float32(1.5e-38)  # normal; a quarter of it is not
    denormal = np.float32(float(tiny) * 0.25)  # IEEE's value, made before flushing is on
    assert 0 < denormal < np.finfo(np.float32).tiny
    x = kl.full((1 << 20,), float(tiny))  # large enough to run on every thread of the pool
    d = kl.full((8,), float(denormal))

    def bits(t):
        return set(np.asarray(t).view(np.uint32).tolist())

    zero, denormal_bits = {0}, {int(np.array(denormal).view(np.uint32))}

    def check(want):
        assert bits(x * 0.25) == want
        assert bits(kl.jit(lambda t: t * 0.25)(x)) == want
        assert bits(d + 0.0) == want  # flushing, a denormal operand reads as zero

    # A Python thread started before the switch computes under it too, and after it again.
    jobs, results = queue.Queue(), queue.Queue()

    def serve():
        for job in iter(jobs.get, None):
            try:
                job()
                results.put(None)
            except BaseException as e:  # reported on the main thread
                results.put(e)

    worker = threading.Thread(target=serve)
    worker.start()

    def on_worker(job):
        jobs.put(job)
        error = results.get()
        if error is not None:
            raise error

    try:
        on_worker(lambda: check(denormal_bits))
        kl.set_flush_denormal(True)
        assert kl.flush_denormal()
        check(zero)
        on_worker(lambda: check(zero))
    finally:
        kl.set_flush_denormal(False)
    assert not kl.flush_denormal()
    check(denormal_bits)
    on_worker(lambda: check(denormal_bits))
    jobs.put(None)
    worker.join()


def test_kiln_keeps_a_denormal_mode_chosen_before_it_in_the_process():
    # Until kl.set_flush_denormal is called, a thread computes in the mode it has: here
    # PyTorch's flushing, set first, holds for Kiln's eager and compiled code on that thread.
    code = (
        "import torch\n"
        "torch.set_flush_denormal(True)\n"
        "import kiln as kl\n"
        "x = kl.full((64,), 1.5e-38)\n"
        "print(float(kl.max(x * 0.25)), float(kl.max(kl.jit(lambda t: t * 0.25)(x))))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["0.0", "0.0"]


def test_an_invalid_kiln_gemm_is_an_error_naming_the_variable():
    code = "import kiln as kl\nkl.matmul(kl.ones((2, 2)), kl.ones((2, 2)))"
    env = dict(os.environ, KILN_GEMM="mkl")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode != 0
    assert 'invalid KILN_GEMM: got "mkl", expected "onednn" or "openblas"' in run.stderr
    env["KILN_GEMM"] = "openblas"
    code = "import kiln as kl\nprint(kl.runtime_info().gemm_backend)"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.stdout.strip() == "openblas", run.stderr


def test_profile_records_a_jitted_steps_fused_groups_and_library_calls():
    a, b = randn(32, 24), randn(24, 16)

    @kl.jit
    def step(a, b):
        return kl.exp(kl.matmul(a, b)) * 2.0

    step(a, b)
    with kl.profile() as prof:
        for _ in range(2):
            step(a, b)
    rows = prof.rows
    mm = [r for r in rows if r.what.startswith("matmul")]
    assert len(mm) == 1 and mm[0].calls == 2 and not mm[0].fused
    assert mm[0].flops == 2 * 32 * 24 * 16
    assert mm[0].bytes == 4 * (32 * 24 + 24 * 16 + 32 * 16)
    assert any(r.fused and "exp" in r.what for r in rows)
    assert all(r.seconds > 0 for r in rows)
    assert all(0 < r.first_seconds <= r.seconds for r in rows)
    assert all(r.later_calls == 1 and r.later_seconds == r.seconds - r.first_seconds for r in rows)
    assert prof.peak.fma_gflops > 0 and prof.peak.copy_gbps > 0
    assert "GFLOP/s" in str(prof) and "matmul" in prof.table()
    with pytest.raises(kl.Error, match=r"\[profile\] no result yet"):
        kl.profile().rows


def test_kiln_profile_prints_the_table_at_exit():
    code = (
        "import kiln as kl\n"
        "f = kl.jit(lambda x: kl.sin(x) + 1.0)\n"
        "for _ in range(2): f(kl.ones((8,)))\n"
        "with kl.profile() as inner: f(kl.ones((8,)))\n"  # nested: the outer one sees it too
    )
    env = dict(os.environ, KILN_PROFILE="1")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "kiln profile:" in run.stderr and ": 3 calls" in run.stderr, run.stderr
    assert "fused sin,add [8]" in run.stderr, run.stderr
