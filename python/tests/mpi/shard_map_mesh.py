"""Run under mpirun by ctest (python.shard_map_np4): shard_map over a 2 x 2 mesh from Python.

A tensor-parallel layer: x's rows split over "data", w's columns over "model"; the loss sums
over both axes with a psum over the tuple of axes. Each process's loss and its block of the
gradient (grad of the shard_map) are checked against NumPy on the whole arrays, and
local_block / assemble against slicing; kl.nn's row-parallel Linear (and its weight gradient),
vocabulary-parallel embedding and cross-entropy over "model" against NumPy."""
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

# Megatron's layers over "model" (kl.nn), each against NumPy on the whole arrays.
j, m = mesh.index("model"), mesh.size("model")
w, bias = rng.standard_normal((3, 4)), rng.standard_normal(3)  # Linear 4 -> 3
xs = rng.standard_normal((5, 4))
full = kl.nn.Linear(4, 3, kl.random.key(0))
full.weight, full.bias = kl.asarray(w), kl.asarray(bias)
block = kl.nn.Linear(2, 3, kl.random.key(0))  # this process's columns, the whole bias
block.weight, block.bias = kl.asarray(w[:, 2 * j : 2 * j + 2]), kl.asarray(bias)
x_block = kl.asarray(xs[:, 2 * j : 2 * j + 2])
cols = kl.spec(None, "model")
row_parallel = kl.shard_map(
    lambda lin, x: kl.nn.row_parallel_linear(lin, x, "model"),
    mesh,
    in_specs=([cols, kl.spec()], cols),
    out_specs=kl.spec(),
)
np.testing.assert_allclose(np.asarray(row_parallel(block, x_block)), xs @ w.T + bias, rtol=1e-12)
# Its weight gradient is this process's block of the whole one.
gw = kl.grad(lambda lin: kl.sum(row_parallel(lin, x_block) ** 2))(block).weight
y = xs @ w.T + bias
np.testing.assert_allclose(np.asarray(gw), (2 * y.T @ xs)[:, 2 * j : 2 * j + 2], rtol=1e-12)

table = rng.standard_normal((6, 3))  # 6 tokens, rows split over "model"
emb = kl.nn.Embedding(3, 3, kl.random.key(0))
emb.weight = kl.asarray(table[3 * j : 3 * j + 3])
ids = np.array([[0, 5, 3], [2, 2, 4]])
looked_up = kl.shard_map(
    lambda e, i: kl.nn.parallel_embedding(e, i, "model"),
    mesh,
    in_specs=([kl.spec("model", None)], kl.spec()),
    out_specs=kl.spec(),
)(emb, kl.asarray(ids))
np.testing.assert_allclose(np.asarray(looked_up), table[ids], rtol=1e-12)

logits, labels = rng.standard_normal((4, 6)), np.array([0, 5, 2, 3])
ce = kl.shard_map(
    lambda z, t: kl.nn.parallel_cross_entropy(z, t, "model"),
    mesh,
    in_specs=(cols, kl.spec()),
    out_specs=kl.spec(),
)(kl.asarray(logits[:, 3 * j : 3 * j + 3]), kl.asarray(labels))
shifted = logits - logits.max(1, keepdims=True)
log_softmax = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
np.testing.assert_allclose(float(ce), -log_softmax[np.arange(4), labels].mean(), rtol=1e-12)
assert m == 2
print(f"process {kl.process_index()} of {n}: ok")
