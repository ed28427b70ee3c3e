"""kiln.nn: layers, activations, losses and initialisers (docs/PYTHON.md, "nn, optim, data and io").

The layers are Kiln's C++ structs (kiln::nn) bound as Python classes; each is a pytree, so
`kl.grad(loss)(model, x, y)` returns a model of gradients, as in C++. Sequential is a
registered pytree of its layers; user models are dataclasses (or any pytree) of layers.
"""
from . import _kiln
from . import tree as _tree
from ._kiln import _nn as _native

# The native layers, functions, losses and initialisers.
globals().update({k: v for k, v in vars(_native).items() if not k.startswith("__")})
# The convolution and pooling functions are Kiln ops (kiln.conv2d, ...), here too, as for nn.h.
globals().update(
    {
        k: getattr(_kiln, k)
        for k in (
            "conv1d",
            "conv2d",
            "conv3d",
            "conv_transpose1d",
            "conv_transpose2d",
            "conv_transpose3d",
            "max_pool2d",
            "avg_pool2d",
            "adaptive_avg_pool2d",
        )
        if hasattr(_kiln, k)
    }
)


# The one-input layers that take a Context (their dropout in training).
_CONTEXT_LAYERS = (_native.Dropout, _native.TransformerEncoderLayer, _native.TransformerEncoder)


class Sequential:
    """Layers applied in order: Sequential([Linear(...), ReLU(), Linear(...)]).

    A pytree whose children are the layers, so its parameter names are C++'s: "0.weight",
    "2.bias", ... A layer that takes a Context (Dropout, the transformer encoder, Sequential) gets
    `ctx` when one is given.
    """

    def __init__(self, layers=(), *more):
        self.layers = list(layers) if isinstance(layers, (list, tuple)) else [layers]
        self.layers.extend(more)

    def __call__(self, x, ctx=None):
        for layer in self.layers:
            if ctx is not None and isinstance(layer, _CONTEXT_LAYERS + (Sequential,)):
                x = layer(x, ctx=ctx)
            else:
                x = layer(x)
        return x

    def __getitem__(self, i):
        return self.layers[i]

    def __len__(self):
        return len(self.layers)

    def __repr__(self):
        return "Sequential([" + ", ".join(map(repr, self.layers)) + "])"


_tree.register(Sequential, lambda s: (s.layers, None), lambda _, layers: Sequential(list(layers)))


def named_parameters(model):
    """[(name, tensor)] for every tensor leaf of `model`, in tree order (kiln::tree_names)."""
    leaves, _ = _tree.flatten(model)
    return list(zip(_tree.names(model), leaves))


def parameter_count(model):
    """The number of elements of every tensor leaf of `model`."""
    return sum(t.size for _, t in named_parameters(model))


def state_dict(model):
    """{name: torch.Tensor} of every tensor leaf of `model`, named by kiln.tree.names — the names
    PyTorch's state_dict gives a module of the same structure ("transformer.h.0.ln_1.weight").
    The inverse of load_state_dict; the tensors are copies. Needs PyTorch."""
    import torch

    return {name: torch.from_dlpack(_kiln.asarray(t).copy()) for name, t in named_parameters(model)}


def load_state_dict(model, state_dict, strict=True):
    """A copy of `model` with every tensor leaf taken from `state_dict` by name (kiln.tree.names),
    as torch's Module.load_state_dict fills a module: `state_dict` maps names to PyTorch tensors,
    NumPy arrays or Kiln tensors; each value must have its leaf's shape and is converted to the
    leaf's dtype. A leaf without a value raises kiln.Error, and so does a value no leaf takes
    unless strict=False (a tied weight's second name, nanoGPT's "lm_head.weight")."""
    leaves, structure = _tree.flatten(model)
    names = _tree.names(model)
    missing = [n for n in names if n not in state_dict]
    if missing:
        raise _kiln.Error(
            f"[nn.load_state_dict] missing keys: got no value for {', '.join(missing)}, expected "
            f"one for each of the model's {len(names)} parameters"
        )
    unexpected = sorted(set(state_dict) - set(names))
    if strict and unexpected:
        raise _kiln.Error(
            f"[nn.load_state_dict] unexpected keys: got {', '.join(unexpected)}, expected only "
            "the model's parameter names (pass strict=False to ignore the others)"
        )
    loaded = []
    for name, leaf in zip(names, leaves):
        value = state_dict[name]
        if hasattr(value, "detach"):  # a torch.Tensor: through DLPack, without a copy
            value = _kiln.from_dlpack(value.detach().contiguous())
        value = _kiln.asarray(value)
        if tuple(value.shape) != tuple(leaf.shape):
            raise _kiln.Error(
                f"[nn.load_state_dict] shape mismatch for {name}: got {list(value.shape)}, "
                f"expected {list(leaf.shape)}"
            )
        loaded.append(_kiln.astype(value, leaf.dtype).copy())
    return _tree.unflatten(structure, loaded)
