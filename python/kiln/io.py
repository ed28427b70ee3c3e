"""kiln.io: safetensors checkpoints of pytrees (docs/PYTHON.md, docs/CHECKPOINTS.md).

    kl.io.save("model.safetensors", {"model": model, "opt": state})
    restored = kl.io.load("model.safetensors", like={"model": model, "opt": state})

Each tensor leaf is stored under its kiln::tree_names name ("model.0.weight"), so files
written from Python and from C++ for the same tree match. Writes are atomic: a temporary file in
the same directory is written, fsync'ed and renamed over the path.
"""
from . import tree as _tree
from ._kiln import _io as _native
from .optim import _flatten_like


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


# ---- sharded checkpoints, C++'s kiln/sharded_checkpoint.h -------------------------------------

Piece = _native.Piece


def _names(tree, prefix):
    return [prefix + n for n in _tree.names(tree)]


def block_pieces(blocks, specs, mesh, prefix=""):
    """The pieces this process writes of a tree of blocks laid out over `mesh` (kiln.Mesh) by
    `specs`: one kiln.spec for every leaf, or a list with one per leaf in flatten order. Of the
    processes holding the same block, the one at position 0 along the axes its spec does not
    name writes it. Names are `prefix` + the leaves' names."""
    leaves, _ = _tree.flatten(blocks)
    specs = list(specs) if isinstance(specs, (list, tuple)) else [specs] * len(leaves)
    return _native.block_pieces(leaves, _names(blocks, prefix), specs, mesh)


def zero_pieces(pieces, layout, part, prefix=""):
    """The pieces of a tree of ZeRO pieces (kiln.optim.shard's, without pmap's process axis)
    held by part `part` of the kiln.optim.ShardLayout: flat runs, the padding left out."""
    leaves = _flatten_like(layout.structure, pieces, "the pieces")
    return _native.zero_pieces(leaves, _names(pieces, prefix), layout._native, part)


def save_sharded(directory, step, pieces, metadata=None):
    """Writes step `step` of a sharded checkpoint under `directory`: every process calls it
    with its pieces (a list of kiln.io.Piece, or a function returning them, so that an error
    while making them on one process fails the save on every process) and writes its own file
    atomically; once all have, process 0 writes the index that commits the step and removes
    every other step. A step whose writing was interrupted is never loaded. `metadata`, a
    {str: str}, is kept in the index. docs/CHECKPOINTS.md, "Sharded checkpoints"."""
    _native.save_sharded(str(directory), step, pieces, metadata or {})


def latest_sharded_step(directory):
    """The latest committed step under `directory`, or None."""
    return _native.latest_sharded_step(str(directory))


def sharded_metadata(directory):
    """The metadata of the latest committed step's index (plus "step" and "shards")."""
    return _native.sharded_metadata(str(directory))


def load_sharded(directory, like=None, allow_extra=False):
    """The latest committed step with every tensor put back together whole, whatever mesh or
    number of processes wrote it: a tree shaped like `like` (names, dtypes and shapes checked,
    as load does), or {name: tensor} without it."""
    if like is None:
        return _native.load_sharded(str(directory))[0]
    leaves, structure = _tree.flatten(like)
    loaded = _native.load_sharded_leaves(str(directory), _tree.names(like), leaves, allow_extra)
    return _tree.unflatten(structure, loaded)
