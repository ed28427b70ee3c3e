"""Pytrees for kiln.optim and kiln.io: kiln.tree's flattening (the one the transformations use)
plus the leaves' names, as kiln::tree_names gives them in C++ ("layers.0.weight")."""
from . import tree as _tree
from ._kiln import _nn


def flatten(tree):
    """(leaves, treedef), as kiln.tree.flatten."""
    return _tree.flatten(tree)


def unflatten(treedef, leaves):
    return _tree.unflatten(treedef, leaves)


def names(tree):
    """The names of tree's leaves, in flatten order: "layers.0.weight"; "" for a root leaf."""
    return _nn._leaf_names(tree)


def flatten_like(treedef, tree, what):
    """The leaves of `tree`, which must have the structure `treedef` (ValueError otherwise)."""
    leaves, got = _tree.flatten(tree)
    if got != treedef:
        raise ValueError(f"{what} must have the parameters' structure: got {got!r}, "
                         f"expected {treedef!r}")
    return leaves
