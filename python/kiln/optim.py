"""kiln.optim: optimisers as pure init/update functions over pytrees (docs/PYTHON.md).

    opt = kl.optim.adam(1e-3)
    state = opt.init(params)
    params, state = opt.update(params, grads, state)

This is C++'s Optimizer (include/kiln/optim.h) with the same argument order. `update` is built
from Kiln ops, so it runs eagerly and inside `kl.jit` together with the loss and its gradient.
The state is an OptState dataclass (a pytree: `step` and `slots`, e.g. slots["mu"] shaped like
the parameters), so it goes through jit and checkpoints with kiln.io under the same names as in
C++ ("step", "slots.mu.layers.0.weight").
"""
import dataclasses as _dataclasses

from . import tree as _tree
from ._kiln import _optim as _native

Schedule = _native.Schedule
constant, step_decay, cosine_decay = _native.constant, _native.step_decay, _native.cosine_decay
linear_warmup, join = _native.linear_warmup, _native.join
warmup_cosine_decay = _native.warmup_cosine_decay


@_dataclasses.dataclass
class OptState:
    """An optimiser's state: `step` (i32 scalar, updates done) and `slots` ({name: params-shaped
    tree}: "momentum" for SGD with momentum, "mu" and "nu" for Adam and AdamW)."""

    step: object
    slots: dict


class Optimizer:
    """A pure optimiser: init(params) -> state; update(params, grads, state) -> (params, state).

    Parameters are any pytree (kiln.tree) of floating tensors: dicts, lists, dataclasses, nn
    layers, registered types. The gradients must have the parameters' structure.
    """

    def __init__(self, native):
        self._native = native

    @property
    def name(self):
        """ "sgd", "adam" or "adamw"."""
        return self._native.name

    @property
    def slot_names(self):
        return self._native.slot_names

    def learning_rate(self, step):
        """The rate the update after `step` updates uses (an int gives a float; an i32 scalar
        Tensor gives a float64 scalar Tensor, also traced)."""
        return self._native.learning_rate(step)

    def init(self, params):
        """The state before the first update: step 0 and zero slots shaped like `params`."""
        leaves, structure = _tree.flatten(params)
        step, slots = self._native.init_leaves(leaves, _tree.names(params))
        return OptState(step, {k: _tree.unflatten(structure, v) for k, v in slots.items()})

    def update(self, params, grads, state):
        """One step: (new params, new state). `grads` has the structure of `params`."""
        return _update(self._native, params, grads, state)

    def __repr__(self):
        return f"Optimizer({self.name})"


def _update(native, params, grads, state):
    """native.update_leaves on the flattened trees, its result as trees."""
    leaves, structure = _tree.flatten(params)
    names = _tree.names(params)
    grad_leaves = _flatten_like(structure, grads, "the gradients")
    slots = {k: _flatten_like(structure, v, f'state slot "{k}"') for k, v in state.slots.items()}
    new, step, new_slots = native.update_leaves(leaves, grad_leaves, state.step, slots, names)
    return (
        _tree.unflatten(structure, new),
        OptState(step, {k: _tree.unflatten(structure, v) for k, v in new_slots.items()}),
    )


# ---- sharded data parallelism (ZeRO), C++'s kiln/zero.h ----------------------------------------


class ShardLayout:
    """How every leaf of a tree is cut into `parts` pieces, the same way on every process:
    flattened, padded with zeros to parts * k (k = ceil(n / parts)); piece p holds elements
    [p k, (p + 1) k), shaped [1, ..., 1, k] with the leaf's rank (docs/DISTRIBUTED.md)."""

    def __init__(self, full, parts):
        leaves, self.structure = _tree.flatten(full)
        self._native = _native._ShardLayout(leaves, parts)

    @property
    def parts(self):
        return self._native.parts


def shard(full, layout, part):
    """Piece `part` (an int, or axis_index(axis) inside pmap) of every leaf of a full tree."""
    leaves = _flatten_like(layout.structure, full, "the tree to shard")
    return _tree.unflatten(layout.structure, _native._shard_leaves(layout._native, leaves, part))


def gather(pieces, layout, axis):
    """Inside pmap over `axis`: every process's pieces put back into the full leaves (one
    all_gather per dtype; its transpose is scatter_sum, so grad through it reduce-scatters)."""
    leaves = _flatten_like(layout.structure, pieces, "the pieces")
    return _tree.unflatten(layout.structure, _native._gather_leaves(layout._native, leaves, axis))


def scatter_sum(full, layout, axis):
    """Inside pmap over `axis`: this process's piece of the sum over the processes of a full
    tree (one psum_scatter per dtype)."""
    leaves = _flatten_like(layout.structure, full, "the tree to scatter")
    return _tree.unflatten(
        layout.structure, _native._scatter_sum_leaves(layout._native, leaves, axis)
    )


class Zero:
    """An optimiser whose state (stages 1 and 2) and parameters too (stage 3) are this
    process's pieces, over the named axis of a pmap with one example per process: DeepSpeed's
    ZeRO, PyTorch's FSDP (C++'s distributed::Zero; docs/DISTRIBUTED.md "Sharded training").

    Stages 1 and 2: update(full params, this process's gradients, state) -> full params;
    stage 3: update(pieces, gradients with respect to the pieces, state) -> pieces, the loss
    reading gather(pieces, layout, axis). The wrapped optimiser must be elementwise (SGD, Adam,
    AdamW)."""

    def __init__(self, optimizer, stage, axis, layout):
        self.optimizer, self.stage, self.axis, self.layout = optimizer, stage, axis, layout
        self._native = _native._Zero(optimizer._native, stage, axis, layout._native)

    def init(self, params, part):
        """This process's part of the state before the first update (eager)."""
        return self.shard_state(self.optimizer.init(params), part)

    def shard_state(self, state, part):
        """This process's part of a full state."""
        return OptState(
            state.step, {k: shard(v, self.layout, part) for k, v in state.slots.items()}
        )

    def gather_state(self, state):
        """Inside pmap over the axis: the full state from every process's part."""
        slots = {k: gather(v, self.layout, self.axis) for k, v in state.slots.items()}
        return OptState(state.step, slots)

    def update(self, params, grads, state):
        """One step inside pmap over the axis: (new params or pieces, new state)."""
        return _update(self._native, params, grads, state)

    def __repr__(self):
        return f"Zero({self.optimizer.name}, stage {self.stage}, over {self.axis!r})"


def sgd(lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0, clip_norm=None):
    """torch.optim.SGD: g += weight_decay * p; with momentum b = momentum * b + (1 - dampening) g
    (b = g on the first update); direction b, or g + momentum * b with nesterov; p -= lr * it.
    lr: a number, a Schedule or a callable step -> rate. clip_norm: clip the gradients to this
    global norm first."""
    return Optimizer(_native._sgd(lr, momentum, dampening, nesterov, weight_decay, clip_norm))


def adam(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, decay_on="all", clip_norm=None):
    """torch.optim.Adam (weight_decay is L2, added to the gradient). decay_on="matrices"
    decays only parameters of rank 2 and more (weights and embeddings, not biases or norms)."""
    return Optimizer(_native._adam(lr, b1, b2, eps, weight_decay, decay_on, clip_norm))


def adamw(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01, decay_on="all", clip_norm=None):
    """torch.optim.AdamW: p *= 1 - lr * weight_decay (decoupled), then Adam's step.
    decay_on="matrices" decays only parameters of rank 2 and more (GPT-2's rule)."""
    return Optimizer(_native._adamw(lr, b1, b2, eps, weight_decay, decay_on, clip_norm))


def global_norm(tree):
    """sqrt of the sum of squares of every leaf (a scalar tensor; works traced)."""
    leaves, _ = _tree.flatten(tree)
    return _native._global_norm(leaves)


def clip_by_global_norm(tree, max_norm):
    """Every leaf times min(1, max_norm / (global_norm + 1e-6)), as clip_grad_norm_."""
    leaves, structure = _tree.flatten(tree)
    return _tree.unflatten(structure, _native._clip_leaves(leaves, max_norm))


def _flatten_like(treedef, tree, what):
    """The leaves of `tree`, which must have the structure `treedef` (ValueError otherwise)."""
    leaves, got = _tree.flatten(tree)
    if got != treedef:
        raise ValueError(
            f"{what} must have the parameters' structure: got {got!r}, " f"expected {treedef!r}"
        )
    return leaves
