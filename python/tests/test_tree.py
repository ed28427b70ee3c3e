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
    tree = {"b": [1.0, (2.0, None)], "a": Point(3.0, 4.0), "c": Layer(5.0, 6.0, "relu", 7),
            "d": Box([7.0, 8.0], "box"), "e": "static text"}
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
