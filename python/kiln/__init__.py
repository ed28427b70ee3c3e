"""Kiln: differentiable programming with eager tensors and composable transformations.

`import kiln as kl`; see docs/PYTHON.md. The native core is kiln._kiln (C++, pybind11); this
package re-exports it and adds the parts written in Python.
"""
from ._kiln import *  # noqa: F401,F403
from ._kiln import Error, Tensor, __version__, asarray, dtype  # noqa: F401

# py-tensor: kiln.fft, kiln.linalg and kiln.random are native submodules; `import kiln.random`
# works too.
import sys as _sys  # noqa: E402

from ._kiln import fft, from_dlpack, linalg, random  # noqa: E402,F401

_sys.modules[__name__ + ".fft"] = fft
_sys.modules[__name__ + ".linalg"] = linalg
_sys.modules[__name__ + ".random"] = random

# py-transforms: pytrees, transformations of Python callables and control flow.
from . import tree  # noqa: F401,E402
from ._kiln import (  # noqa: F401,E402
    Mesh,
    Spec,
    all_gather,
    all_to_all,
    assemble,
    axis_index,
    checkpoint,
    cond,
    custom_jvp,
    custom_vjp,
    fori_loop,
    grad,
    hessian,
    jacfwd,
    jacrev,
    jit,
    jvp,
    local_block,
    pmap,
    pmax,
    pmean,
    pmin,
    ppermute,
    psum,
    psum_scatter,
    scan,
    shard_map,
    spec,
    stop_gradient,
    switch,
    value_and_grad,
    vjp,
    vmap,
    while_loop,
)

# py-nn: nn, optim, data and io (Python modules over the native _nn, _optim, _data and _io)
from . import data, io, nn, optim  # noqa: E402,F401

# autograph: kiln.jit converts Python if/while/for on traced tensors; it replaces
# the native jit exported above (which it calls). See kiln.autograph.
from .autograph import jit  # noqa: E402,F401,F811
from . import autograph  # noqa: E402,F401
