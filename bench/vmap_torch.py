#!/usr/bin/python3
"""PyTorch 1.13 peers of bench/bench_vmap.cpp: per-example gradients.

    /usr/bin/python3 bench/vmap_torch.py [--reps 7] [--threads 2] [--target 0.2]

Per-example gradients of the cross-entropy loss -sum(one_hot(y, 10) * log_softmax(logits)) of
an MLP 784-128-10 (relu), batch 64, float32, with respect to every parameter:
  functorch   functorch.vmap(functorch.grad(loss), in_dims=(None, 0, 0))(params, x, y)
  loop        for each example: torch.autograd.grad of its loss, then torch.stack per parameter
Same parameters, shapes and loss as the Kiln side (bench_vmap.cpp). Timed by
bench/side_by_side.py, which prints two lines per case:
    RESULT <name> <median ms> <min ms>
    TIMES <name> <ms of each repetition ...>      (what bench_vmap reads)
"""
import torch
import torch.nn.functional as F
import functorch

import side_by_side

B, D, H, C = 64, 784, 128, 10


def make():
    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(D, H, generator=g) / D**0.5
    b1 = torch.zeros(H)
    w2 = torch.randn(H, C, generator=g) / H**0.5
    b2 = torch.zeros(C)
    x = torch.randn(B, D, generator=g)
    y = torch.randint(0, C, (B,), generator=g)
    return (w1, b1, w2, b2), x, y


def loss(p, x, y):  # one example: x [784], y [] (int64)
    w1, b1, w2, b2 = p
    h = torch.relu(x @ w1 + b1)
    logits = h @ w2 + b2
    # one_hot as arange == y: F.one_hot calls .item() (a range check), which vmap refuses.
    one_hot = (torch.arange(C) == y).float()
    return -(one_hot * F.log_softmax(logits, -1)).sum()


def cases():
    p, x, y = make()
    per_example = functorch.vmap(functorch.grad(loss), in_dims=(None, 0, 0))

    def fn_functorch():
        return per_example(p, x, y)

    pr = tuple(t.clone().requires_grad_() for t in p)

    def fn_loop():
        grads = [torch.autograd.grad(loss(pr, x[i], y[i]), pr) for i in range(B)]
        return tuple(torch.stack([g[k] for g in grads]) for k in range(4))

    # The two agree (and give what Kiln checks against: shapes [64, ...] per parameter).
    a, b = fn_functorch(), fn_loop()
    for u, v in zip(a, b):
        assert u.shape == v.shape and torch.allclose(u, v, atol=1e-5), (u.shape, v.shape)
    return {"torch_functorch_vmap_grad": fn_functorch, "torch_loop_grad": fn_loop}


def main():
    args = side_by_side.parser(__doc__, reps=7, threads=2, target=0.2).parse_args()
    torch.set_num_threads(args.threads)
    side_by_side.report(side_by_side.time_cases(cases(), args.reps, args.target))


if __name__ == "__main__":
    main()
