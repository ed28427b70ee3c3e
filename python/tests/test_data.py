"""kiln.data from Python: sources, order and determinism, Python map functions on worker
threads (GIL handling, exceptions with their type and message), image transforms."""
import collections
import faulthandler
import gzip
import struct
import threading

import numpy as np
import pytest

import kiln as kl


def rows(pipeline, field):
    return [np.asarray(s[field]).tolist() for s in pipeline]


def test_from_tensors_order_and_batches():
    x = np.arange(10, dtype=np.float32).reshape(10, 1) * np.ones((1, 3), np.float32)
    y = np.arange(10, dtype=np.int64)
    p = kl.data.from_tensors({"x": x, "y": y})
    assert p.size() == 10 and p.random_access
    assert rows(p, "y") == list(range(10))
    batches = list(p.batch(4))
    assert [np.asarray(b["y"]).tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert np.asarray(batches[0]["x"]).shape == (4, 3)
    assert isinstance(batches[0]["x"], kl.Tensor)
    assert len(list(p.batch(4, drop_remainder=True))) == 2
    np.testing.assert_array_equal(np.asarray(p.get(7)["x"]), x[7])


def test_shuffle_is_a_deterministic_permutation_per_epoch():
    p = kl.data.from_tensors({"i": np.arange(50, dtype=np.int64)}).shuffle(seed=3)
    e0, e1 = rows(p, "i"), rows(p, "i")
    assert sorted(e0) == list(range(50)) and sorted(e1) == list(range(50))
    assert e0 != list(range(50)) and e0 != e1
    q = kl.data.from_tensors({"i": np.arange(50, dtype=np.int64)}).shuffle(seed=3)
    assert rows(q, "i") == e0 and rows(q, "i") == e1
    assert p.epoch == 2


def to_numpy_plus_one(sample):
    return {"x": np.asarray(sample["x"]) + 1, "y": sample["y"]}


@pytest.mark.parametrize("threads", [0, 2])
def test_python_map_keeps_order(threads):
    n = 300
    p = kl.data.from_tensors(
        {"x": np.arange(n, dtype=np.float32), "y": np.arange(n, dtype=np.int64)}
    )
    out = list(p.map(to_numpy_plus_one, num_threads=threads, chunk_size=7).batch(32).prefetch(2))
    xs = np.concatenate([np.asarray(b["x"]) for b in out])
    ys = np.concatenate([np.asarray(b["y"]) for b in out])
    np.testing.assert_array_equal(ys, np.arange(n))
    np.testing.assert_array_equal(xs, np.arange(n, dtype=np.float32) + 1)


def test_python_map_with_rng_is_deterministic_across_thread_counts():
    def jitter(sample, rng):
        return {"v": np.float32(rng.uniform()), "k": np.int64(rng.uniform_int(0, 10))}

    base = kl.data.from_tensors({"i": np.arange(64, dtype=np.int64)})
    one = rows(base.map(jitter, num_threads=0, seed=5), "v")
    two = rows(base.map(jitter, num_threads=2, seed=5), "v")
    other = rows(base.map(jitter, num_threads=2, seed=6), "v")
    assert one == two and one != other
    assert all(0 <= v < 1 for v in one)


class Boom(ValueError):
    pass


@pytest.mark.parametrize("threads", [0, 2])
def test_exception_in_python_map_surfaces_with_type_and_message(threads):
    def bad(sample):
        if int(np.asarray(sample["i"])) == 37:
            raise Boom("sample 37 is cursed")
        return sample

    p = (
        kl.data.from_tensors({"i": np.arange(100, dtype=np.int64)})
        .map(bad, num_threads=threads)
        .batch(8)
        .prefetch(2)
    )
    with pytest.raises(Boom, match="sample 37 is cursed"):
        for _ in p:
            pass


def test_python_map_must_return_a_dict():
    p = kl.data.from_tensors({"i": np.arange(3, dtype=np.int64)}).map(lambda s: 3)
    with pytest.raises(kl.Error, match="dict of tensors"):
        list(p)


def test_two_python_workers_with_prefetch_do_not_deadlock():
    # A deadlock between the consumer and workers waiting for the GIL would hang: fail instead.
    faulthandler.dump_traceback_later(60, exit=True)
    try:
        run_two_python_workers()
    finally:
        faulthandler.cancel_dump_traceback_later()


def run_two_python_workers():
    calls = []
    lock = threading.Lock()

    def slow(sample):
        with lock:
            calls.append(threading.get_ident())
        return {"x": np.asarray(sample["x"]) * 2}

    p = (
        kl.data.from_tensors({"x": np.arange(400, dtype=np.float32)})
        .shuffle(seed=1)
        .map(slow, num_threads=2, chunk_size=4)
        .batch(16)
        .prefetch(3)
    )
    for _ in range(3):
        total = sum(float(np.asarray(b["x"]).sum()) for b in p)
        assert total == 2 * sum(range(400))
    assert threading.get_ident() not in set(calls)  # the map ran on the workers
    # Abandoning an iteration midway (workers still busy) and dropping the pipeline is safe.
    it = iter(p)
    next(it)
    del it, p


def test_filter_take_skip_repeat():
    p = kl.data.from_tensors({"i": np.arange(20, dtype=np.int64)})
    assert rows(p.filter(lambda s: int(np.asarray(s["i"])) % 3 == 0), "i") == [
        0,
        3,
        6,
        9,
        12,
        15,
        18,
    ]
    assert rows(p.skip(5).take(3), "i") == [5, 6, 7]
    assert rows(p.take(2).repeat(2), "i") == [0, 1, 0, 1]


def test_state_and_restore():
    p = kl.data.from_tensors({"i": np.arange(30, dtype=np.int64)}).shuffle(seed=2).batch(4)
    it = iter(p)
    next(it), next(it)
    state = p.state()
    rest = [np.asarray(b["i"]).tolist() for b in p]
    q = kl.data.from_tensors({"i": np.arange(30, dtype=np.int64)}).shuffle(seed=2).batch(4)
    q.restore(state)
    assert [np.asarray(b["i"]).tolist() for b in q] == rest


def test_idx_source(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, (5, 4, 3), dtype=np.uint8)
    labels = np.array([3, 1, 4, 1, 5], np.uint8)
    with gzip.open(tmp_path / "img.gz", "wb") as f:
        f.write(struct.pack(">HBBIII", 0, 8, 3, 5, 4, 3) + images.tobytes())
    with open(tmp_path / "lab", "wb") as f:
        f.write(struct.pack(">HBBI", 0, 8, 1, 5) + labels.tobytes())
    p = kl.data.from_idx(str(tmp_path / "img.gz"), str(tmp_path / "lab"))
    b = next(iter(p.batch(5)))
    np.testing.assert_array_equal(np.asarray(b["image"]), images)
    np.testing.assert_array_equal(np.asarray(b["label"]), labels.astype(np.int64))
    np.testing.assert_array_equal(np.asarray(kl.data.read_idx(str(tmp_path / "img.gz"))), images)


def test_csv_source(tmp_path):
    (tmp_path / "t.csv").write_text("a,b,c\n1,2.5,x\n3,4,y\n")
    p = kl.data.from_csv(str(tmp_path / "t.csv"), select=["b", "a"], types={"a": kl.float64})
    s = next(iter(p))
    assert list(s) == ["b", "a"]
    assert s["a"].dtype == kl.float64 and float(np.asarray(s["b"])) == 2.5


def test_images_and_transforms(tmp_path):
    img = np.random.default_rng(1).integers(0, 256, (6, 8, 3), dtype=np.uint8)
    paths = []
    for i in range(3):
        path = str(tmp_path / f"{i}.png")
        kl.data.write_file(path, kl.data.encode_png(img))
        paths.append(path)
    assert kl.data.glob(str(tmp_path / "*.png")) == paths
    norm = kl.data.image.normalize([0.5], [0.25]).then(kl.data.image.to_chw())
    p = kl.data.from_images(paths, labels=[7, 8, 9]).map(norm, num_threads=2).batch(3)
    b = next(iter(p))
    want = ((img.astype(np.float32) / 255 - 0.5) / 0.25).transpose(2, 0, 1)
    np.testing.assert_allclose(np.asarray(b["image"])[2], want, rtol=1e-5, atol=1e-5)
    assert np.asarray(b["label"]).tolist() == [7, 8, 9]
    flip = kl.data.image.random_horizontal_flip(p=1.0)
    np.testing.assert_array_equal(np.asarray(flip(img)), img[:, ::-1])
    crop = kl.data.image.center_crop(4, 4)
    np.testing.assert_array_equal(np.asarray(crop(img)), img[1:5, 2:6])
    assert "normalize" in repr(norm)


def test_two_python_threads_share_one_iteration():
    p = (
        kl.data.from_tensors({"i": np.arange(2000, dtype=np.int64)})
        .map(lambda s: s, num_threads=2)
        .prefetch(4)
    )
    seen = [[], []]

    def drain(k):
        for s in p:
            seen[k].append(int(np.asarray(s["i"])))

    threads = [threading.Thread(target=drain, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # Each element is handed out once per epoch; the first thread to reach the end of an epoch
    # starts the next one, which the other may still be reading from.
    counts = collections.Counter(seen[0] + seen[1])
    assert set(counts) == set(range(2000)) and set(counts.values()) <= {1, 2}
    for k in range(2):
        assert sum(b < a for a, b in zip(seen[k], seen[k][1:])) <= 1  # at most one new epoch


def test_exit_with_python_workers_busy_is_clean():
    script = """
import time, numpy as np, kiln as kl
def f(s):
    time.sleep(0.001)
    return s
p = kl.data.from_tensors({"x": np.arange(100000, dtype=np.float32)}).map(f, num_threads=2)
it = iter(p.prefetch(4))
next(it)
print("exiting")
"""
    import os
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "exiting"
