"""kiln.nn: layers, activations, losses and initialisers (docs/PYTHON.md, "nn, optim, data and io").

The layers are Kiln's C++ structs (kiln::nn) bound as Python classes; each is a pytree, so
`kl.grad(loss)(model, x, y)` returns a model of gradients, as in C++. Sequential is a dataclass
holding a list of layers; user models are dataclasses (or any pytree) of layers.
"""
import dataclasses as _dataclasses

from . import _flat
from ._kiln import _nn as _native

from . import _kiln

# The native layers, functions, losses and initialisers.
globals().update({k: v for k, v in vars(_native).items() if not k.startswith("__")})
# The convolution and pooling functions are Kiln ops (kiln.conv2d, ...), here too as in nn.h's users.
globals().update({k: getattr(_kiln, k) for k in (
    "conv1d", "conv2d", "conv3d", "conv_transpose2d", "max_pool2d", "avg_pool2d",
    "adaptive_avg_pool2d") if hasattr(_kiln, k)})


@_dataclasses.dataclass
class Sequential:
    """Layers applied in order: Sequential([Linear(...), ReLU(), Linear(...)]).

    A pytree (a dataclass with one field), so its parameter names are "layers.0.weight", ...
    A layer that takes a Context (Dropout) gets `ctx` when one is given.
    """

    layers: list

    def __init__(self, layers=None, *more):
        self.layers = list(layers) if isinstance(layers, (list, tuple)) else (
            [] if layers is None else [layers])
        self.layers.extend(more)

    def __call__(self, x, ctx=None):
        for layer in self.layers:
            if ctx is not None and isinstance(layer, (_native.Dropout, Sequential)):
                x = layer(x, ctx)
            else:
                x = layer(x)
        return x

    def __getitem__(self, i):
        return self.layers[i]

    def __len__(self):
        return len(self.layers)


def named_parameters(model):
    """[(name, tensor)] for every tensor leaf of `model`, in tree order (kiln::tree_names)."""
    leaves, _ = _flat.flatten(model)
    return list(zip(_flat.names(model), leaves))


def parameter_count(model):
    """The number of elements of every tensor leaf of `model`."""
    return sum(t.size for _, t in named_parameters(model))
