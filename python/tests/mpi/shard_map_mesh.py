"""Run under mpirun by ctest (python.shard_map_np4): shard_map over a 2 x 2 mesh from Python.

A tensor-parallel layer: x's rows split over "data", w's columns over "model"; the loss sums
over both axes with a psum over the tuple of axes. Each process's loss and its block of the
gradient (grad of the shard_map) are checked against NumPy on the whole arrays, and
local_block / assemble against slicing."""
import numpy as np

import kiln as kl

n = kl.process_count()
assert n == 4, "run with mpirun -np 4"
mesh = kl.Mesh({"data": 2, "model": 2})
assert mesh.axis_names == ("data", "model") and mesh.shape == {"data": 2, "model": 2}
rng = np.random.default_rng(0)
x = rng.standard_normal((4, 3))
w = rng.standard_normal((3, 6))
x_spec, w_spec = kl.spec("data", None), kl.spec(None, "model")
xb = kl.local_block(kl.asarray(x), mesh, x_spec)
wb = kl.local_block(kl.asarray(w), mesh, w_spec)
i, j = mesh.index("data"), mesh.index("model")
np.testing.assert_array_equal(np.asarray(xb), x[2 * i : 2 * i + 2])
np.testing.assert_array_equal(np.asarray(wb), w[:, 3 * j : 3 * j + 3])


def layer(x, w):
    return kl.psum(kl.sum(kl.tanh(x @ w) ** 2), ("data", "model"))


loss = kl.shard_map(layer, mesh, in_specs=(x_spec, w_spec), out_specs=kl.spec())
want = float(np.sum(np.tanh(x @ w) ** 2))
np.testing.assert_allclose(float(loss(xb, wb)), want, rtol=1e-12)
g = kl.grad(lambda wb: loss(xb, wb))(wb)
t = np.tanh(x @ w)
gw = x.T @ (2 * t * (1 - t * t))
np.testing.assert_allclose(np.asarray(g), gw[:, 3 * j : 3 * j + 3], rtol=1e-10, atol=1e-12)
whole = kl.shard_map(
    lambda wb: kl.assemble(wb, w_spec), mesh, in_specs=(w_spec,), out_specs=kl.spec()
)(wb)
np.testing.assert_array_equal(np.asarray(whole), w)
print(f"process {kl.process_index()} of {n}: ok")
