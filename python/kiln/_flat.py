"""Flattening of pytrees for kiln.optim and kiln.io: leaves, a structure, and C++'s names.

Containers: dict (keys sorted), list, tuple, namedtuple, None (no leaves), dataclasses (fields in
order), and bound C++ trees (nn layers, their states), whose leaves and names come from Kiln's
own flattening. Anything else is a leaf. Names follow kiln::tree_names: dict keys, list
indices, field names joined by dots ("layers.0.weight").
"""
import dataclasses

from . import _kiln

_native = _kiln._nn


class _Node:
    """One container of a structure: its kind, what rebuilds it, its children's structures."""

    __slots__ = ("kind", "data", "children", "count")

    def __init__(self, kind, data, children, count):
        self.kind, self.data, self.children, self.count = kind, data, children, count

    def __eq__(self, other):
        return (isinstance(other, _Node) and self.kind == other.kind
                and self.data == other.data and self.children == other.children)

    def __repr__(self):
        if self.kind == "leaf":
            return "*"
        if self.kind == "none":
            return "None"
        if self.kind == "native":
            return repr(self.data)
        return f"{self.kind}{self.data!r}{self.children!r}"


_LEAF = _Node("leaf", None, (), 1)
_NONE = _Node("none", None, (), 0)


def _is_namedtuple(x):
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _flatten(x, leaves):
    if x is None:
        return _NONE
    if isinstance(x, dict):
        keys = sorted(x)
        children = tuple(_flatten(x[k], leaves) for k in keys)
        return _Node("dict", tuple(keys), children, sum(c.count for c in children))
    if _is_namedtuple(x):
        children = tuple(_flatten(v, leaves) for v in x)
        return _Node("namedtuple", type(x), children, sum(c.count for c in children))
    if isinstance(x, (list, tuple)):
        children = tuple(_flatten(v, leaves) for v in x)
        return _Node(type(x).__name__, None, children, sum(c.count for c in children))
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        names = tuple(f.name for f in dataclasses.fields(x))
        children = tuple(_flatten(getattr(x, n), leaves) for n in names)
        return _Node("dataclass", (type(x), names), children, sum(c.count for c in children))
    native = _native._flatten_native(x)
    if native is not None:
        native_leaves, structure = native
        leaves.extend(native_leaves)
        return _Node("native", structure, (), len(native_leaves))
    leaves.append(x)
    return _LEAF


def flatten(tree):
    """(leaves, structure): the leaves in order (None where a C++ tree's tensor is unset)."""
    leaves = []
    return leaves, _flatten(tree, leaves)


def flatten_like(structure, tree, what):
    """The leaves of `tree` at the leaf positions of `structure` (None there: no leaf value).

    Raises ValueError naming the first place where `tree` does not have the structure.
    """
    leaves = []

    def walk(node, x, path):
        if node.kind == "leaf":
            leaves.append(x)
            return
        got_leaves, got = flatten(x)
        if node.kind == "native":
            if got != node:
                raise ValueError(f"{what} does not have the parameters' structure at "
                                 f"{path or '(root)'}: got {got!r}, expected {node!r}")
            leaves.extend(got_leaves)
            return
        if got.kind != node.kind or got.data != node.data or len(got.children) != len(node.children):
            raise ValueError(f"{what} does not have the parameters' structure at "
                             f"{path or '(root)'}: got {got!r}, expected {node!r}")
        for i, (child, value) in enumerate(zip(node.children, _children(node, x))):
            walk(child, value, _join(path, _step(node, i)))

    walk(structure, tree, "")
    return leaves


def _children(node, x):
    if node.kind == "dict":
        return [x[k] for k in node.data]
    if node.kind == "dataclass":
        return [getattr(x, n) for n in node.data[1]]
    return list(x)


def _step(node, i):
    if node.kind == "dict":
        return str(node.data[i])
    if node.kind == "dataclass":
        return node.data[1][i]
    if node.kind == "namedtuple":
        return node.data._fields[i]
    return str(i)


def _join(path, step):
    return f"{path}.{step}" if path and step else (path or step)


def unflatten(structure, leaves):
    """The tree of `structure` with `leaves` in place of its leaves."""
    it = iter(leaves)

    def build(node):
        if node.kind == "leaf":
            return next(it)
        if node.kind == "none":
            return None
        if node.kind == "native":
            return _native._unflatten_native(node.data, [next(it) for _ in range(node.count)])
        values = [build(c) for c in node.children]
        if node.kind == "dict":
            return dict(zip(node.data, values))
        if node.kind == "list":
            return values
        if node.kind == "tuple":
            return tuple(values)
        if node.kind == "namedtuple":
            return node.data(*values)
        cls, names = node.data
        obj = object.__new__(cls)
        for n, v in zip(names, values):
            object.__setattr__(obj, n, v)  # frozen dataclasses too
        return obj

    return build(structure)


def names(structure):
    """kiln::tree_names of the leaves: "layers.0.weight"; "" for a root leaf."""
    out = []

    def walk(node, path):
        if node.kind == "leaf":
            out.append(path)
        elif node.kind == "native":
            out.extend(_join(path, n) for n in node.data.names)
        else:
            for i, child in enumerate(node.children):
                walk(child, _join(path, _step(node, i)))

    walk(structure, "")
    return out
