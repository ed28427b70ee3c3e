# The Python usage example: a jitted value_and_grad over a dict of
# parameters, per-example gradients with vmap, and a while loop on a traced tensor under jit.
import numpy as np
import kiln as kl


def loss(params, x, y):
    h = kl.tanh(x @ params["w1"] + params["b1"])
    return kl.mean((h @ params["w2"] - y) ** 2)


key = kl.random.key(0)
k1, k2 = kl.random.split(key)
params = {
    "w1": kl.random.normal(k1, (3, 16)),
    "b1": kl.zeros(16),
    "w2": kl.random.normal(k2, (16, 1)),
    "b2": None,
}
x, y = np.ones((8, 3), np.float32), np.zeros((8, 1), np.float32)
step = kl.jit(kl.value_and_grad(loss))
value, grads = step(params, kl.asarray(x), kl.asarray(y))
print(float(value), grads["w1"].shape)
per_example = kl.vmap(kl.grad(loss), in_axes=(None, 0, 0))(params, x[:, None], y[:, None])


@kl.jit
def collatz_steps(n):
    steps = kl.zeros((), kl.int32)
    while n != 1:  # tensor-dependent: becomes kl.while_loop
        n = kl.where(n % 2 == 0, n // 2, 3 * n + 1)
        steps += 1
    return steps


print(collatz_steps(kl.asarray(27)))  # 111
