"""kiln.io: safetensors checkpoints of pytrees (docs/PYTHON.md, docs/CHECKPOINTS.md).

    kl.io.save("model.safetensors", {"model": model, "opt": state})
    restored = kl.io.load("model.safetensors", like={"model": model, "opt": state})

Each tensor leaf is stored under its kiln::tree_names name ("model.0.weight"), so files
written from Python and from C++ for the same tree match. Writes are atomic: a temporary file in
the same directory is written, fsync'ed and renamed over the path.
"""
from . import tree as _tree
from ._kiln import _io as _native


def save(path, tree, metadata=None):
    """Saves every leaf of `tree` (a pytree, kiln.tree) under its name.
    metadata: an optional {str: str} stored in the header's "__metadata__"."""
    leaves, _ = _tree.flatten(tree)
    pairs = list(zip(_tree.names(tree), leaves))
    _native.save_tensors(str(path), pairs, metadata or {})


def load(path, like, allow_extra=False):
    """A tree shaped like `like` from the file: each leaf name must be there with the leaf's
    dtype and shape; static values and structure come from `like`. Tensors in the
    file that the tree does not have raise kiln.Error unless allow_extra."""
    leaves, structure = _tree.flatten(like)
    loaded = _native.load_leaves(str(path), _tree.names(like), leaves, allow_extra)
    return _tree.unflatten(structure, loaded)


def save_tensors(path, tensors, metadata=None):
    """Writes {name: tensor} (in its order) to a safetensors file, atomically."""
    _native.save_tensors(str(path), list(tensors.items()), metadata or {})


def load_tensors(path):
    """{name: tensor} of a safetensors file, in file order."""
    return _native.load_tensors(str(path))[0]


def load_metadata(path):
    """The file's "__metadata__" string map."""
    return _native.load_tensors(str(path))[1]
