#!/usr/bin/python3
"""PyTorch 1.13 peer of bench/bench_attention.cpp: scaled dot-product attention, float32,
batch 8, heads 8, length 512, head dim 64.

    /usr/bin/python3 bench/bench_attention_torch.py [--reps 5] [--threads 1] [--target 0.3]

PyTorch 1.13 has no F.scaled_dot_product_attention: its math path is written out,
softmax(q k^T * scale + mask) v (the causal mask additive, -inf above the diagonal).
    torch_fwd         forward, under no_grad
    torch_fwd_bwd     torch.autograd.grad of sum(out * cot) with respect to q, k and v
    torch_causal_bwd  the same with the causal mask
Prints RESULT / TIMES lines (bench/side_by_side.py).
"""
import math

import torch

import side_by_side


def sdpa(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) * (1 / math.sqrt(q.shape[-1]))
    if mask is not None:
        s = s + mask
    return torch.softmax(s, -1) @ v


def main():
    a = side_by_side.parser(__doc__, reps=5, threads=1, target=0.3).parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    shape = (8, 8, 512, 64)
    q, k, v = (torch.randn(shape, generator=g).requires_grad_() for _ in range(3))
    cot = torch.randn(shape, generator=g)
    causal = torch.full((512, 512), -math.inf).triu(1)

    def fwd():
        with torch.no_grad():
            return sdpa(q, k, v)

    def fwd_bwd(mask=None):
        return torch.autograd.grad((sdpa(q, k, v, mask) * cot).sum(), (q, k, v))

    cases = {
        "torch_fwd": fwd,
        "torch_fwd_bwd": fwd_bwd,
        "torch_causal_bwd": lambda: fwd_bwd(causal),
    }
    side_by_side.report(side_by_side.time_cases(cases, a.reps, a.target))


if __name__ == "__main__":
    main()
