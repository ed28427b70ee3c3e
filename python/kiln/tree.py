"""Pytrees: nested containers whose leaves are tensors, arrays or scalars (docs/PYTHON.md).

dict (keys sorted), list, tuple, namedtuple, None (an empty node), dataclasses (automatically;
a field with metadata={"static": True} is static) and types registered with `register` are
nodes; strings are static leaves (part of the structure); everything else is a leaf. The
functions are Kiln's C++ (kiln._kiln._tree), the same code the transformations flatten with.
"""
from ._kiln._tree import TreeDef, flatten, leaves, map, register, structure, unflatten  # noqa: F401


def names(tree):
    """The names of tree's leaves in flatten order, as Kiln's C++ names them (checkpoint keys):
    "layers.0.weight" (fields and dict keys by name, sequence elements by index); "" for a root
    leaf."""
    from ._kiln import _nn

    return _nn._leaf_names(tree)
