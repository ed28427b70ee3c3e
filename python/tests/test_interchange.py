"""Zero-copy interchange: NumPy through the buffer protocol, PyTorch (and NumPy) through DLPack;
memory shared both ways, owners kept alive by views, and no leaks over 10^5 round trips."""
import ctypes
import gc
import sys

import numpy as np
import pytest
import torch

import kiln as kl
from memory import check_rss_growth, rss_bytes

NUMPY_DTYPES = [
    (np.float32, kl.float32),
    (np.float64, kl.float64),
    (np.int32, kl.int32),
    (np.int64, kl.int64),
    (np.uint8, kl.uint8),
    (np.uint32, kl.uint32),
    (np.float16, kl.float16),
    (np.bool_, kl.bool_),
]


@pytest.mark.parametrize("np_dtype,kl_dtype", NUMPY_DTYPES)
def test_numpy_shares_memory_both_ways(np_dtype, kl_dtype):
    a = np.zeros((3, 4), np_dtype)
    t = kl.asarray(a)
    assert t.dtype == kl_dtype
    v = np.asarray(t)
    assert np.shares_memory(a, v) and v.dtype == np_dtype and v.flags.writeable
    a[1, 2] = 1
    assert np.asarray(t)[1, 2] == 1
    v[2, 3] = 1  # written through the tensor's view
    assert a[2, 3] == 1


def test_tensor_memory_viewed_by_numpy():
    t = kl.arange(12, dtype=kl.float32).reshape(3, 4)
    v = np.asarray(t)
    v[0, 1] = 42.0
    assert float(t[0, 1]) == 42.0
    assert np.asarray(t).ctypes.data == v.ctypes.data
    tt = t.T  # a strided view: numpy sees the same strides
    np.testing.assert_array_equal(np.asarray(tt), v.T)
    assert np.shares_memory(np.asarray(tt), v)
    m = memoryview(t)
    assert m.format == "f" and m.shape == (3, 4) and not m.readonly


def test_strided_and_reversed_numpy_views():
    a = np.arange(60, dtype=np.float64).reshape(6, 10)
    for view in (a[::2, 1::3], a[::-1, ::-2], a.T, a[:, 3]):
        t = kl.asarray(view)
        np.testing.assert_array_equal(np.asarray(t), view)
        np.testing.assert_array_equal(np.asarray(t * 1.0), view)
        assert np.shares_memory(np.asarray(t), a)


def test_views_keep_their_owners_alive():
    a = np.arange(6, dtype=np.float32)
    base = sys.getrefcount(a)
    t = kl.asarray(a)
    assert sys.getrefcount(a) == base + 1  # the tensor's storage holds the array's buffer
    s = t[2:]
    del t
    assert sys.getrefcount(a) == base + 1  # ... as long as any view of it lives
    del a
    gc.collect()
    np.testing.assert_array_equal(np.asarray(s), [2, 3, 4, 5])
    v = np.asarray(kl.arange(4, dtype=kl.float64) * 2.0)  # the tensor lives in v's base
    gc.collect()
    np.testing.assert_array_equal(v, [0, 2, 4, 6])


def test_refcounts_return_after_views_go():
    a = np.ones(8, np.float32)
    base = sys.getrefcount(a)
    views = [kl.asarray(a)[1:] for _ in range(100)]
    assert sys.getrefcount(a) == base + 100
    del views
    assert sys.getrefcount(a) == base


def test_no_leak_over_numpy_round_trips():
    a = np.ones(16, np.float32)
    base = sys.getrefcount(a)

    def round_trips(n):
        for _ in range(n):
            v = np.asarray(kl.asarray(a))
            v = np.asarray(kl.asarray(v)[::2])
        return v

    round_trips(2000)
    before = rss_bytes()
    round_trips(100_000)
    gc.collect()
    check_rss_growth(before, 4 << 20)
    assert sys.getrefcount(a) == base


TORCH_DTYPES = [
    (torch.float32, kl.float32),
    (torch.float64, kl.float64),
    (torch.int32, kl.int32),
    (torch.int64, kl.int64),
    (torch.uint8, kl.uint8),
    (torch.float16, kl.float16),
    (torch.bfloat16, kl.bfloat16),
]


@pytest.mark.parametrize("torch_dtype,kl_dtype", TORCH_DTYPES)
def test_torch_from_kiln_shares_memory(torch_dtype, kl_dtype):
    t = kl.zeros((2, 3), dtype=kl_dtype)
    p = torch.from_dlpack(t)
    assert p.dtype == torch_dtype and p.shape == (2, 3)
    p[1, 2] = 5
    assert float(t[1, 2]) == 5.0
    if kl_dtype != kl.bfloat16:
        np.asarray(t)[0, 1] = 3
        assert float(p[0, 1]) == 3.0


@pytest.mark.parametrize("torch_dtype,kl_dtype", TORCH_DTYPES)
def test_kiln_from_torch_shares_memory(torch_dtype, kl_dtype):
    p = torch.zeros((3, 2), dtype=torch_dtype)
    t = kl.from_dlpack(p)
    assert t.dtype == kl_dtype and t.shape == (3, 2)
    p[2, 1] = 7
    assert float(t[2, 1]) == 7.0
    if kl_dtype != kl.bfloat16:
        np.asarray(t)[0, 0] = 4
        assert float(p[0, 0]) == 4.0
    np.testing.assert_array_equal(np.asarray((t * 2).astype(kl.float32)), (p * 2).float().numpy())


def test_dlpack_strided_views_and_bool():
    t = kl.arange(12, dtype=kl.float32).reshape(3, 4)
    p = torch.from_dlpack(t.T)
    np.testing.assert_array_equal(p.numpy(), np.arange(12, dtype=np.float32).reshape(3, 4).T)
    assert p.stride() == (1, 4)
    q = torch.arange(24.0).reshape(4, 6)[1:, ::2]
    k = kl.from_dlpack(q)
    np.testing.assert_array_equal(np.asarray(k), q.numpy())
    b = torch.from_dlpack(kl.asarray(np.array([True, False])))
    assert b.dtype == torch.uint8 and b.tolist() == [1, 0]  # DLPack 0.6 has no bool
    assert kl.asarray(1.0).__dlpack_device__() == (1, 0)
    with pytest.raises(
        kl.Error,
        match=r"\[__dlpack__\] a view with negative strides cannot be "
        r"exported: got strides \[-1\], expected non-negative",
    ):
        torch.from_dlpack(kl.arange(3, dtype=kl.float32)[::-1])
    np.testing.assert_array_equal(
        torch.from_dlpack(kl.array(t[::-1])).numpy(),
        np.arange(12, dtype=np.float32).reshape(3, 4)[::-1],
    )


def test_dlpack_with_numpy():
    t = kl.arange(5, dtype=kl.int64)
    n = np.from_dlpack(t)  # read-only in numpy 1.24
    np.asarray(t)[0] = 9
    assert n[0] == 9
    a = np.arange(4.0)
    k = kl.from_dlpack(a)
    a[3] = -1
    assert float(k[3]) == -1.0


def test_dlpack_lifetimes():
    t = kl.arange(4, dtype=kl.float32) + 1.0
    p = torch.from_dlpack(t)
    del t
    gc.collect()
    assert p.tolist() == [1.0, 2.0, 3.0, 4.0]  # the capsule's deleter runs when p goes
    q = torch.arange(3.0)
    k = kl.from_dlpack(q)
    del q
    gc.collect()
    assert np.asarray(k).tolist() == [0.0, 1.0, 2.0]


def test_capsules_are_consumed_once():
    t = kl.ones(3)
    capsule = t.__dlpack__()
    k = kl.from_dlpack(capsule)
    assert np.asarray(k).tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(
        kl.Error,
        match=r"\[from_dlpack\] the capsule cannot be consumed: got "
        r"one named 'used_dltensor', expected",
    ):
        kl.from_dlpack(capsule)
    p = torch.utils.dlpack.from_dlpack(t.__dlpack__())
    assert p.tolist() == [1.0, 1.0, 1.0]
    t.__dlpack__()  # never consumed: the capsule's destructor frees it
    with pytest.raises(kl.Error, match=r"\[from_dlpack\] not a DLPack capsule"):
        kl.from_dlpack(3)
    with pytest.raises(kl.Error, match=r"\[__dlpack__\] a CPU tensor has no stream"):
        t.__dlpack__(stream=1)


def test_no_leak_over_dlpack_round_trips():
    p = torch.ones(16)
    base = sys.getrefcount(p)

    def round_trips(n):
        for _ in range(n):
            k = kl.from_dlpack(p)
            q = torch.from_dlpack(k)
            k.__dlpack__()  # dropped unconsumed
        return q

    round_trips(2000)
    before = rss_bytes()
    round_trips(100_000)
    gc.collect()
    check_rss_growth(before, 4 << 20)
    assert sys.getrefcount(p) == base
    assert p._version == 0


def test_no_leak_over_operator_calls():
    a = kl.asarray(np.ones(2, np.float32))
    b = np.ones(2, np.float32)
    base_a, base_b = sys.getrefcount(a), sys.getrefcount(b)

    def calls(n):
        for _ in range(n):
            c = a + b  # a NumPy operand on the right: viewed, then released
            c = 2.0 * c - a
            c = c / a @ a
        return c

    calls(2000)
    before = rss_bytes()
    c = calls(100_000)
    gc.collect()
    check_rss_growth(before, 4 << 20)
    assert sys.getrefcount(a) == base_a and sys.getrefcount(b) == base_b
    assert sys.getrefcount(c) == 2  # c and getrefcount's argument: no hidden owner
    assert float(c) == 6.0  # ((1 + 1) * 2 - 1) / 1 summed over two elements


def test_kiln_and_pytorch_share_one_thread_count():
    # One OpenMP runtime in the process: kl.set_num_threads sets PyTorch's count, and Kiln's ops
    # set the runtime's count back to Kiln's own on their thread.
    before = kl.num_threads()
    try:
        kl.set_num_threads(3)
        assert torch.get_num_threads() == 3
        torch.set_num_threads(2)
        assert kl.num_threads() == 3 and torch.get_num_threads() == 2
        np.asarray(kl.ones((64, 64)) @ kl.ones((64, 64)))
        assert torch.get_num_threads() == 3
    finally:
        kl.set_num_threads(before)


# ---- read-only memory ----------------------------------------------------------------------------


def get_writable_buffer(obj):
    """PyObject_GetBuffer(obj, PyBUF_WRITABLE), as a C extension that writes would ask."""
    view = (ctypes.c_char * 256)()  # room for a Py_buffer
    get = ctypes.pythonapi.PyObject_GetBuffer
    get.argtypes = [ctypes.py_object, ctypes.c_void_p, ctypes.c_int]
    get(obj, view, 1)  # PyBUF_WRITABLE
    ctypes.pythonapi.PyBuffer_Release(view)


def read_only_sources():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    a.setflags(write=False)
    return {
        "read-only array": (a, a),
        "broadcast view": (np.broadcast_to(np.arange(4, dtype=np.float32), (3, 4)), None),
        "bytes": (b"\x01\x02\x03\x04", None),
    }


@pytest.mark.parametrize("name", ["read-only array", "broadcast view", "bytes"])
def test_read_only_memory_stays_read_only(name):
    source, base = read_only_sources()[name]
    expected = np.array(np.frombuffer(source, np.uint8) if isinstance(source, bytes) else source)
    t = kl.asarray(source)
    v = np.asarray(t)
    np.testing.assert_array_equal(v, expected)
    assert not v.flags.writeable and not t.numpy().flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        v[0] = 7
    assert memoryview(t).readonly
    with pytest.raises(BufferError, match="read-only"):
        get_writable_buffer(t)
    for view in (t[1:], t.T):  # views of the same memory stay read-only
        assert not np.asarray(view).flags.writeable
    # DLPack 0.6 cannot mark memory read-only: PyTorch gets a copy it may write to.
    p = torch.from_dlpack(t)
    p.view(-1)[0] = 7
    np.testing.assert_array_equal(np.asarray(t), expected)
    if base is not None:
        assert np.shares_memory(v, base)  # still shared, without a copy
    # Values Kiln computes are new memory, writable as before.
    assert np.asarray(t + 0).flags.writeable and np.asarray(kl.array(t)).flags.writeable


def test_writable_memory_and_kiln_broadcasts():
    a = np.arange(4, dtype=np.float32)
    assert np.asarray(kl.asarray(a)).flags.writeable
    # A zero-stride view repeats elements: numpy's broadcast_to is read-only for that reason.
    b = np.asarray(kl.broadcast_to(kl.asarray(a), (3, 4)))
    assert not b.flags.writeable
    np.testing.assert_array_equal(b, np.broadcast_to(a, (3, 4)))


# ---- bool bytes --------------------------------------------------------------------------------


def test_non_canonical_bool_bytes_are_true_everywhere():
    raw = np.array([0, 1, 2, 128, 255, 0, 7, 1], np.uint8)
    b = raw.view(np.bool_)  # numpy's bool: any non-zero byte is True
    truth = raw != 0
    t = kl.asarray(b)
    other = kl.asarray(np.array([True, False] * 4))
    ops = {
        "logical_not": (lambda x: kl.logical_not(x), np.logical_not(truth)),
        "invert": (lambda x: ~x, ~truth),
        "eq_true": (lambda x: x == True, truth),  # noqa: E712
        "astype": (lambda x: x.astype(kl.int32), truth.astype(np.int32)),
        "sum": (lambda x: kl.sum(x), truth.sum()),
        "xor": (lambda x: x ^ other, truth ^ np.asarray(other)),
        "max": (lambda x: kl.max(x), truth.max()),
    }
    for name, (f, expected) in ops.items():
        np.testing.assert_array_equal(np.asarray(f(t)), expected, err_msg=name)
        np.testing.assert_array_equal(np.asarray(kl.jit(f)(t)), expected, err_msg=name + " (jit)")
    assert not np.shares_memory(np.asarray(t), raw)  # copied as 0/1
    canonical = np.array([True, False, True])
    assert np.shares_memory(np.asarray(kl.asarray(canonical)), canonical)  # shared as before


def test_numpy_bools_inside_traced_functions():
    # A NumPy bool array met while tracing (a constant mask) is read as it is converted, not
    # through traced ops: canonical, non-canonical and strided bytes alike.
    raw = np.array([0, 3, 1, 0, 255, 1], np.uint8)
    masks = [
        np.array([True, False, True, False, True, True]),
        raw.view(np.bool_),
        np.repeat(raw.view(np.bool_), 2)[::2],
    ]
    x = np.arange(6.0)
    for m in masks:
        truth = np.asarray(m) != 0
        expected = np.where(truth, x, 0.0)
        np.testing.assert_array_equal(
            np.asarray(kl.jit(lambda a: kl.where(m, a, 0.0))(x)), expected
        )
        np.testing.assert_array_equal(
            np.asarray(kl.grad(lambda a: kl.sum(kl.where(m, a, 0.0)))(x)), truth.astype(float)
        )


# ---- layouts Kiln cannot view ------------------------------------------------------------------


def test_unviewable_layouts_are_copied():
    records = np.zeros(4, dtype=[("a", np.uint8), ("b", np.float32)])  # itemsize 5, packed
    records["b"] = [1.5, -2.0, 3.25, 4.0]
    field = records["b"]  # float32 with a stride of 5 bytes
    t = kl.asarray(field)
    assert t.dtype == kl.float32
    np.testing.assert_array_equal(np.asarray(t), field)
    big = np.arange(6, dtype=">f4").reshape(2, 3)
    t = kl.asarray(big)
    assert t.dtype == kl.float32
    np.testing.assert_array_equal(np.asarray(t), big.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(kl.asarray(np.array([1, -2], ">i8"))), [1, -2])
    np.testing.assert_array_equal(np.asarray(kl.asarray(big.T)), big.T.astype(np.float32))
