"""kiln.io from Python: safetensors round trips of pytrees, names as kiln::tree_names gives them,
files checked with json + numpy independently of Kiln, atomic replacement."""
import json
import os
import struct

import numpy as np
import pytest

import kiln as kl


def key(i):
    if hasattr(kl, "random") and hasattr(kl.random, "key"):
        return kl.random.key(i)
    return kl.asarray(np.array([0, i], np.uint32))


def read_safetensors(path):
    """{name: array} and metadata, parsed by hand: u64 header size, JSON header, raw bytes."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    body = raw[8 + n :]
    dtypes = {
        "F32": "<f4",
        "F64": "<f8",
        "I64": "<i8",
        "I32": "<i4",
        "U8": "u1",
        "F16": "<f2",
        "BOOL": "?",
        "U32": "<u4",
    }
    metadata = header.pop("__metadata__", {})
    out = {}
    end = 0
    for name, info in header.items():
        begin, stop = info["data_offsets"]
        end = max(end, stop)
        out[name] = np.frombuffer(body[begin:stop], dtypes[info["dtype"]]).reshape(info["shape"])
    assert end == len(body)
    return out, metadata


def make_tree():
    rng = np.random.default_rng(0)
    return {
        "model": kl.nn.Sequential(
            [kl.nn.Linear(3, 4, key(1)), kl.nn.Linear(4, 2, key(2), bias=False)]
        ),
        "extra": [
            kl.asarray(rng.standard_normal((2, 2))),  # float64
            kl.asarray(np.arange(5, dtype=np.int64)),
        ],
        "flags": kl.asarray(np.array([True, False])),
        "none": None,
    }


def test_tree_round_trip_and_file_is_valid_safetensors(tmp_path):
    tree = make_tree()
    path = tmp_path / "ckpt.safetensors"
    kl.io.save(path, tree, metadata={"epoch": "3"})
    tensors, metadata = read_safetensors(path)
    assert metadata == {"epoch": "3"}
    assert sorted(tensors) == sorted(
        ["model.0.weight", "model.0.bias", "model.1.weight", "extra.0", "extra.1", "flags"]
    )
    np.testing.assert_array_equal(tensors["model.0.weight"], np.asarray(tree["model"][0].weight))
    np.testing.assert_array_equal(tensors["extra.0"], np.asarray(tree["extra"][0]))
    np.testing.assert_array_equal(tensors["flags"], [True, False])

    like = make_tree()
    like["model"][0].weight = np.zeros((4, 3), np.float32)
    loaded = kl.io.load(path, like)
    assert isinstance(loaded["model"], kl.nn.Sequential)
    assert loaded["model"][1].bias is None and loaded["none"] is None
    np.testing.assert_array_equal(
        np.asarray(loaded["model"][0].weight), np.asarray(tree["model"][0].weight)
    )
    assert loaded["extra"][1].dtype == kl.int64
    assert kl.io.load_metadata(path) == {"epoch": "3"}


def test_optimizer_state_checkpoints(tmp_path):
    params = {"w": kl.asarray(np.ones((2, 2), np.float32))}
    opt = kl.optim.adam(0.1)
    state = opt.init(params)
    params, state = opt.update(params, {"w": np.ones((2, 2), np.float32)}, state)
    kl.io.save(tmp_path / "s.safetensors", state)
    tensors, _ = read_safetensors(tmp_path / "s.safetensors")
    assert sorted(tensors) == ["slots.mu.w", "slots.nu.w", "step"]
    back = kl.io.load(tmp_path / "s.safetensors", opt.init(params))
    assert int(np.asarray(back.step)) == 1
    np.testing.assert_array_equal(
        np.asarray(back.slots["mu"]["w"]), np.asarray(state.slots["mu"]["w"])
    )


def test_tensors_by_name_and_numpy_written_files(tmp_path):
    path = str(tmp_path / "t.safetensors")
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    header = json.dumps(
        {
            "b": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
            "a": {"dtype": "I64", "shape": [], "data_offsets": [24, 32]},
        }
    ).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + a.tobytes() + np.int64(7).tobytes())
    got = kl.io.load_tensors(path)
    assert list(got) == ["b", "a"]  # file order
    np.testing.assert_array_equal(np.asarray(got["b"]), a)
    assert int(np.asarray(got["a"])) == 7
    kl.io.save_tensors(path, {"z": a.T, "y": np.float32(2)})  # a strided view is written contiguous
    tensors, _ = read_safetensors(path)
    np.testing.assert_array_equal(tensors["z"], a.T)


def test_load_checks_and_atomic_replacement(tmp_path):
    path = tmp_path / "m.safetensors"
    tree = {"w": kl.asarray(np.ones(3, np.float32))}
    kl.io.save(path, tree)
    before = open(path, "rb").read()
    with pytest.raises(kl.Error, match="__metadata__"):
        kl.io.save_tensors(path, {"__metadata__": np.ones(2, np.float32)})
    assert open(path, "rb").read() == before
    assert os.listdir(tmp_path) == ["m.safetensors"]  # no temporary file left behind
    with pytest.raises(kl.Error, match="missing"):
        kl.io.load(path, {"w": np.ones(3, np.float32), "v": np.ones(1, np.float32)})
    with pytest.raises(kl.Error):
        kl.io.load(path, {"w": np.ones(4, np.float32)})
    with pytest.raises(kl.Error):
        kl.io.load(path, {})
    assert kl.io.load(path, {}, allow_extra=True) == {}
    with pytest.raises(kl.Error, match="io"):
        kl.io.save(tmp_path / "no" / "dir.safetensors", tree)


def test_sharded_checkpoints_put_pieces_back_together(tmp_path):
    # One process writes every piece: a replicated block (block_pieces over a mesh of one
    # process) and both parts of a two-part ZeRO layout (zero_pieces); loading puts every
    # tensor back together, checked against NumPy's arrays.
    rng = np.random.default_rng(3)
    tree = {"w": rng.standard_normal((3, 5)), "b": rng.standard_normal(7).astype(np.float32)}
    step = kl.asarray(np.array(4, np.int32))
    layout = kl.optim.ShardLayout(tree, 2)
    replicas = kl.Mesh({"processes": 1})

    def pieces():
        out = kl.io.block_pieces(step, kl.spec(), replicas, "optimizer.step")
        for part in range(2):
            out += kl.io.zero_pieces(kl.optim.shard(tree, layout, part), layout, part, "model.")
        return out

    made = pieces()
    assert [p.name for p in made] == ["optimizer.step"] + ["model.b", "model.w"] * 2
    assert made[1].flat and made[1].whole_shape == (7,) and made[3].start == [4]
    assert "model.b" in repr(made[1])
    np.testing.assert_array_equal(np.asarray(made[3].data), tree["b"][4:])
    assert kl.io.latest_sharded_step(tmp_path / "ck") is None
    kl.io.save_sharded(tmp_path / "ck", 4, pieces, {"note": "test"})
    assert kl.io.latest_sharded_step(tmp_path / "ck") == 4
    meta = kl.io.sharded_metadata(tmp_path / "ck")
    assert meta["note"] == "test" and meta["step"] == "4" and meta["shards"] == "1"
    like = {"model": {k: np.zeros_like(v) for k, v in tree.items()}, "optimizer": {"step": step}}
    loaded = kl.io.load_sharded(tmp_path / "ck", like)
    for k, v in tree.items():
        np.testing.assert_array_equal(np.asarray(loaded["model"][k]), v)
    assert int(loaded["optimizer"]["step"]) == 4
    by_name = kl.io.load_sharded(tmp_path / "ck")
    assert sorted(by_name) == ["model.b", "model.w", "optimizer.step"]
    with pytest.raises(kl.Error, match=r"model.w.* wrong shape: got f64\[3,5\]"):
        kl.io.load_sharded(tmp_path / "ck", {"model": {"w": np.zeros((5, 3))}})

    # A hand-made block of the left two columns only: the tensor does not add up, and the
    # error names the step's directory.
    w = kl.asarray(tree["w"])
    half = [kl.io.Piece("w", w[:, :2], [0, 0], [3, 5])]
    kl.io.save_sharded(tmp_path / "half", 1, half)
    with pytest.raises(kl.Error, match="does not add up in .*step-0000000001"):
        kl.io.load_sharded(tmp_path / "half")


def test_a_failed_sharded_save_commits_nothing(tmp_path):
    def broken():
        raise ValueError("no pieces today")

    with pytest.raises(kl.Error, match="was not committed.*no pieces today"):
        kl.io.save_sharded(tmp_path / "ck", 2, broken)
    assert kl.io.latest_sharded_step(tmp_path / "ck") is None
    with pytest.raises(kl.Error, match="no committed checkpoint"):
        kl.io.load_sharded(tmp_path / "ck")
    bad = [kl.io.Piece("w", kl.asarray(np.ones(4, np.float32)), [3], [5], flat=True)]
    with pytest.raises(kl.Error, match="does not fit"):
        kl.io.save_sharded(tmp_path / "ck", 2, bad)
