"""kiln.tree: flatten order and round trips for every kind of node, map over several trees."""
import collections
import dataclasses

import numpy as np
import pytest

import kiln as kl

Point = collections.namedtuple("Point", "x y")


@dataclasses.dataclass(frozen=True)
class Layer:
    w: object
    b: object
    act: str = dataclasses.field(default="tanh", metadata={"static": True})
    width: int = dataclasses.field(default=3, metadata={"static": True})


class Box:
    def __init__(self, items, label):
        self.items, self.label = items, label


kl.tree.register(Box, lambda b: (b.items, b.label), lambda label, items: Box(list(items), label))


def test_flatten_order_and_round_trip():
    tree = {
        "b": [1.0, (2.0, None)],
        "a": Point(3.0, 4.0),
        "c": Layer(5.0, 6.0, "relu", 7),
        "d": Box([7.0, 8.0], "box"),
        "e": "static text",
    }
    leaves, treedef = kl.tree.flatten(tree)
    # Keys sorted as JAX does; None is an empty node, strings and static fields are structure.
    assert leaves == [3.0, 4.0, 1.0, 2.0, 5.0, 6.0, 7.0, 8.0]
    assert treedef.num_leaves == 8
    back = kl.tree.unflatten(treedef, leaves)
    assert back["a"] == Point(3.0, 4.0) and back["b"] == [1.0, (2.0, None)]
    assert back["c"] == Layer(5.0, 6.0, "relu", 7)
    assert isinstance(back["d"], Box) and back["d"].items == [7.0, 8.0] and back["d"].label == "box"
    assert back["e"] == "static text"
    assert treedef.unflatten(list(range(8)))["a"] == Point(0, 1)


def test_structure_equality_includes_static_values():
    s = kl.tree.structure
    assert s({"a": 1, "b": [2]}) == s({"b": [0], "a": 5})
    assert s({"a": 1}) != s({"a": [1]})
    assert s(Layer(1, 2, "relu")) != s(Layer(1, 2, "tanh"))
    assert s(Box([1], "x")) != s(Box([1], "y"))
    assert hash(s((1, 2))) == hash(s((3, 4)))
    assert s((1, 2)) != s([1, 2])


def test_map_over_several_trees():
    a = {"x": np.arange(3.0), "y": (1.0, None)}
    b = {"x": np.ones(3), "y": (2.0, None)}
    out = kl.tree.map(lambda u, v: u + v, a, b)
    np.testing.assert_array_equal(out["x"], np.arange(3.0) + 1)
    assert out["y"] == (3.0, None)
    with pytest.raises(kl.Error, match="tree.map"):
        kl.tree.map(lambda u, v: u, a, {"x": 1.0, "y": (1.0, 2.0)})
    assert kl.tree.leaves([1, [2, [3]]]) == [1, 2, 3]


def test_non_string_dict_keys_and_arrays_as_leaves():
    tree = {2: "two", 1: np.zeros(2)}
    leaves, treedef = kl.tree.flatten(tree)
    assert len(leaves) == 1 and leaves[0] is tree[1]
    assert kl.tree.unflatten(treedef, leaves) == {1: tree[1], 2: "two"}


def test_in_a_transformation_leaves_become_tensors():
    def f(layer):
        assert isinstance(layer.w, kl.Tensor) and layer.act == "relu" and layer.width == 7
        return layer

    out = kl.jit(f)(Layer(np.ones(2, np.float32), 1.5, "relu", 7))
    assert isinstance(out, Layer) and out.act == "relu" and out.width == 7
    np.testing.assert_array_equal(np.asarray(out.w), np.ones(2))
    assert float(np.asarray(out.b)) == 1.5


def test_register_errors():
    with pytest.raises(kl.Error, match="not a type"):
        kl.tree.register(3, lambda x: x, lambda a, c: c)

    class Bad:
        pass

    kl.tree.register(Bad, lambda b: [1, 2, 3], lambda a, c: Bad())
    with pytest.raises(kl.Error, match="children, aux_data"):
        kl.tree.flatten(Bad())


# ---- cycles, depth and trees changed while flattened ---------------------------------------


def test_cycles_and_deep_nesting_raise():
    loop = [1.0]
    loop.append(loop)
    d = {"a": 1.0}
    d["self"] = [d]
    for tree in (loop, d, (loop,)):
        for f in (kl.tree.leaves, kl.tree.structure, lambda x: kl.tree.map(lambda v: v, x)):
            with pytest.raises(kl.Error, match=r"\[tree.flatten\] the tree contains itself"):
                f(tree)
        with pytest.raises(kl.Error, match="contains itself"):
            kl.jit(lambda x: 0.0)(tree)
    deep = 1.0
    for _ in range(300_000):
        deep = [deep]
    with pytest.raises(kl.Error, match=r"nested too deeply: got more than 1000 levels"):
        kl.tree.leaves(deep)
    with pytest.raises(kl.Error, match="nested too deeply"):
        kl.grad(lambda x: 0.0)(deep)
    # At the limit: 1000 nested containers flatten and round-trip.
    ok = 1.0
    for _ in range(1000):
        ok = [ok]
    leaves, treedef = kl.tree.flatten(ok)
    assert leaves == [1.0]
    rebuilt = kl.tree.unflatten(treedef, [2.0])
    for _ in range(1000):
        rebuilt = rebuilt[0]
    assert rebuilt == 2.0
    with pytest.raises(kl.Error, match="nested too deeply"):
        kl.tree.leaves([ok])


class Mutator:
    """A registered node whose flatten empties the containers that hold it."""

    def __init__(self, victims):
        self.victims = victims


def _flatten_mutator(m):
    for victim in m.victims:
        victim.clear()
    for _ in range(100):  # churn the allocator over the freed memory
        [object() for _ in range(50)]
    return [2.0], None


kl.tree.register(Mutator, _flatten_mutator, lambda aux, children: Mutator([]))


def test_containers_changed_by_a_flatten_do_not_crash():
    victim = [Mutator(None)] + [list(map(float, range(i, i + 3))) for i in range(20)]
    victim[0].victims = [victim]
    leaves = kl.tree.leaves(victim)  # the rest of the list is gone when the Mutator returns
    assert leaves == [2.0]
    table = {"a": Mutator(None), "b": [1.0, 2.0], "c": {"d": 3.0}}
    table["a"].victims = [table]
    assert kl.tree.leaves(table) == [2.0, 1.0, 2.0, 3.0]  # the entries as they were
    keys = {1: Mutator(None), 2: [5.0], 3: 6.0}
    keys[1].victims = [keys]
    assert kl.tree.leaves(keys) == [2.0, 5.0, 6.0]
    # map reads its other trees with flatten_up_to, which calls the registered flatten too.
    first = [Mutator([]), 0.0]
    second = [Mutator(None), 1.0]
    second[0].victims = [second]
    with pytest.raises(kl.Error, match="does not have the first tree's structure"):
        kl.tree.map(lambda a, b: a, first, second)
