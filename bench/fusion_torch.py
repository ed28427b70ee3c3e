#!/usr/bin/python3
"""PyTorch 1.13 eager peer of bench/bench_fusion.cpp: an elementwise chain, softmax, layer norm.

    /usr/bin/python3 bench/fusion_torch.py [--reps 7] [--threads 2] [--target 0.3]
                                           [--only chain|softmax|layernorm]

Problems (float32, normal inputs): chain = tanh(x) * sigmoid(y) + exp(z) on three vectors of
10^7; softmax over the rows of [4096, 1024]; layer norm over the last axis of [4096, 1024]
with weight and bias, eps 1e-5. Cases:
  torch_eager_chain             the expression, eager (fresh outputs every call), no_grad
  torch_out_chain               the same into preallocated outputs (out=)
  torch_copy_chain              b.copy_(a) of 8 bytes per element: the 16 bytes of traffic the
                                fused chain needs per element (PyTorch's own roofline)
  torch_eager_softmax_fwd       F.softmax(x, -1), no_grad
  torch_eager_softmax_fwdbwd    (F.softmax(x, -1) * r).sum().backward(), r fixed random
  torch_eager_layernorm_fwd     F.layer_norm(x, (1024,), w, b), no_grad
  torch_eager_layernorm_fwdbwd  (F.layer_norm(...) * r).sum().backward(): grads of x, w, b
Timed by bench/side_by_side.py, which prints RESULT and TIMES lines (what bench_fusion reads).
"""
import torch
import torch.nn.functional as F

import side_by_side

N = 10_000_000
ROWS, COLS = 4096, 1024


def chain_cases():
    g = torch.Generator().manual_seed(1)
    x, y, z = (torch.randn(N, generator=g) for _ in range(3))
    a, b = torch.empty(N), torch.empty(N)
    src, dst = torch.ones(2 * N), torch.zeros(2 * N)

    def eager():
        return torch.tanh(x) * torch.sigmoid(y) + torch.exp(z)

    def out():
        torch.tanh(x, out=a)
        torch.sigmoid(y, out=b)
        torch.mul(a, b, out=a)
        torch.exp(z, out=b)
        torch.add(a, b, out=a)
        return a

    assert torch.allclose(eager(), out())
    return {
        "torch_eager_chain": eager,
        "torch_out_chain": out,
        "torch_copy_chain": lambda: dst.copy_(src),
    }


def row_cases(name, f, params):
    """f(x, *params) over [ROWS, COLS]; forward without autograd, and forward + backward of
    sum(f(x) * r) with the gradients of x and every param."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(ROWS, COLS, generator=g)
    r = torch.randn(ROWS, COLS, generator=g)
    xg = x.clone().requires_grad_()
    pg = [p.clone().requires_grad_() for p in params]

    def fwd():
        with torch.no_grad():
            return f(x, *params)

    def fwdbwd():
        for t in [xg] + pg:
            t.grad = None
        loss = (f(xg, *pg) * r).sum()
        loss.backward()
        return loss

    return {f"torch_eager_{name}_fwd": fwd, f"torch_eager_{name}_fwdbwd": fwdbwd}


def main():
    ap = side_by_side.parser(__doc__, reps=7, threads=2, target=0.3)
    ap.add_argument("--only", choices=["chain", "softmax", "layernorm"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    fns = {}
    if args.only in (None, "chain"):
        with torch.no_grad():
            fns.update(chain_cases())
    if args.only in (None, "softmax"):
        fns.update(row_cases("softmax", lambda x: F.softmax(x, -1), []))
    if args.only in (None, "layernorm"):
        g = torch.Generator().manual_seed(3)
        w = 1 + 0.1 * torch.randn(COLS, generator=g)
        b = 0.1 * torch.randn(COLS, generator=g)
        fns.update(
            row_cases("layernorm", lambda x, w, b: F.layer_norm(x, (COLS,), w, b, 1e-5), [w, b])
        )
    side_by_side.report(side_by_side.time_cases(fns, args.reps, args.target))


if __name__ == "__main__":
    main()
