"""Run under mpirun by ctest (python.pmap_np2, np3): pmap from Python across processes.

Each process holds a different number of local examples (process p has p + 1 rows of value
p + 1); psum over the named axis, its gradient and all_gather are checked against sums computed
here from the process count alone."""
import numpy as np

import kiln as kl

p, n = kl.process_index(), kl.process_count()
local = np.full((p + 1, 3), p + 1, np.float32)
total_rows = n * (n + 1) // 2
total = float(sum((q + 1) * (q + 1) for q in range(n)))  # sum over all rows of their values


def f(x):
    return kl.psum(kl.sum(x), axis_name="i")


out = kl.pmap(f, axis_name="i")(local)
assert out.shape == (p + 1,), out.shape
np.testing.assert_allclose(np.asarray(out), np.full(p + 1, 3 * total), rtol=1e-6)

# d/dx of sum over every example of psum(sum(x)) is the number of examples, everywhere.
g = kl.pmap(kl.grad(lambda x: kl.psum(kl.sum(x * x), axis_name="i")), axis_name="i")(local)
np.testing.assert_allclose(np.asarray(g), 2 * local * total_rows, rtol=1e-6)

gathered = kl.pmap(lambda x: kl.all_gather(kl.sum(x), axis_name="i"), axis_name="i")(local)
expected = np.concatenate([np.full(q + 1, 3.0 * (q + 1)) for q in range(n)])
np.testing.assert_allclose(np.asarray(gathered)[0], expected, rtol=1e-6)
print(f"process {p} of {n}: ok")
