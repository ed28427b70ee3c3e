"""Run under mpirun by ctest (python.zero_np2, np3): ZeRO stages 1-3 from Python against plain
data parallelism (pmean of the gradients, then AdamW on everything) for five steps of an MLP in
float64. Stage 1 gives bitwise data parallelism's parameters; stages 2 and 3 sum the gradients
in another order, so they agree to round-off. Each process's pieces are compared with its piece
of data parallelism's parameters, and the state gathered back with data parallelism's. Stage 3's
pieces and state go through a sharded checkpoint (kiln.io.save_sharded, each process writing its
own) and load back whole, equal to the gathered ones."""
import os
import shutil

import numpy as np

import kiln as kl
from kiln import optim

p, n = kl.process_index(), kl.process_count()
rng = np.random.default_rng(7)
params = {
    "w1": kl.asarray(rng.standard_normal((4, 8))),
    "b1": kl.asarray(rng.standard_normal(8)),
    "w2": kl.asarray(rng.standard_normal((8, 3))),
}
xs = rng.standard_normal((n, 5, 4))  # process q's batch: xs[q]
ys = rng.standard_normal((n, 5, 3))
x, y = kl.asarray(xs[p : p + 1]), kl.asarray(ys[p : p + 1])
# No clipping: stage 1 is bitwise data parallelism only without it (the clipping norm sums the
# pieces' squares across processes, in another order).
opt = optim.adamw(1e-2, weight_decay=0.1, decay_on="matrices")
layout = optim.ShardLayout(params, n)
first = lambda tree: kl.tree.map(lambda t: t[0], tree)  # noqa: E731
local = lambda tree: kl.tree.map(lambda t: kl.expand_dims(kl.asarray(t), 0), tree)  # noqa: E731


def loss(q, x, y):
    h = kl.tanh(x @ q["w1"] + q["b1"])
    return kl.mean((h @ q["w2"] - y) ** 2)


def data_parallel(q, state, x, y):
    g = kl.pmean(kl.grad(loss)(q, x, y), "dp")
    return opt.update(q, g, state)


dp_step = kl.pmap(data_parallel, axis_name="dp", in_axes=(None, None, 0, 0))
want, state = params, opt.init(params)
for _ in range(5):
    want, state = first(dp_step(want, state, x, y))
mine = {k: np.asarray(v) for k, v in optim.shard(want, layout, p).items()}

for stage in (1, 2, 3):
    zero = optim.Zero(opt, stage, "dp", layout)
    zstate = local(zero.init(params, p))
    if stage < 3:

        def step(q, s, x, y):
            return zero.update(q, kl.grad(loss)(q, x, y), s)

        run = kl.pmap(step, axis_name="dp", in_axes=(None, 0, 0, 0))
        got = params
        for _ in range(5):
            got, zstate = run(got, zstate, x, y)
            got = first(got)
        got = optim.shard(got, layout, p)
    else:

        def step3(pieces, s, x, y):
            g = kl.grad(lambda q: loss(optim.gather(q, layout, "dp"), x, y))(pieces)
            return zero.update(pieces, g, s)

        run = kl.pmap(step3, axis_name="dp", in_axes=(0, 0, 0, 0))
        got = local(optim.shard(params, layout, p))
        for _ in range(5):
            got, zstate = run(got, zstate, x, y)
        got = first(got)
    # The whole state back from the pieces: data parallelism's.
    full = first(kl.pmap(zero.gather_state, axis_name="dp")(zstate))
    for slot, tree in state.slots.items():
        for k, v in tree.items():
            np.testing.assert_allclose(
                np.asarray(full.slots[slot][k]), np.asarray(v), rtol=1e-12, atol=1e-14
            )
    for k, v in got.items():
        if stage == 1:
            np.testing.assert_array_equal(np.asarray(v), mine[k], err_msg=f"stage 1, {k}")
        else:
            np.testing.assert_allclose(
                np.asarray(v), mine[k], rtol=1e-12, atol=1e-14, err_msg=f"stage {stage}, {k}"
            )
    if stage == 3:
        # The same directory for every process of the run (their parent is mpirun).
        directory = f"/tmp/kiln-zero-mlp-{os.getppid()}"
        replicas = kl.Mesh({"processes": n})
        slots = first(zstate).slots

        def pieces():
            out = kl.io.block_pieces(first(zstate).step, kl.spec(), replicas, "optimizer.step")
            out += kl.io.zero_pieces(got, layout, p, "model.")
            for name, slot in slots.items():
                out += kl.io.zero_pieces(slot, layout, p, f"optimizer.slots.{name}.")
            return out

        kl.io.save_sharded(directory, 5, pieces, {"stage": "3"})
        assert kl.io.sharded_metadata(directory)["shards"] == str(n)
        loaded = kl.io.load_sharded(directory, like={"model": params, "optimizer": state})
        whole = first(kl.pmap(lambda q: optim.gather(q, layout, "dp"), axis_name="dp")(local(got)))
        for k, v in whole.items():
            np.testing.assert_array_equal(np.asarray(loaded["model"][k]), np.asarray(v))
        for slot, tree in full.slots.items():
            for k, v in tree.items():
                np.testing.assert_array_equal(
                    np.asarray(loaded["optimizer"].slots[slot][k]), np.asarray(v)
                )
        assert int(loaded["optimizer"].step) == int(full.step)
        kl.pmap(lambda v: kl.psum(v, "dp"), axis_name="dp")(kl.zeros((1,)))  # all have loaded
        if p == 0:
            shutil.rmtree(directory)
print(f"process {p} of {n}: ok")
