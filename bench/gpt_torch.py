#!/usr/bin/python3
"""PyTorch 1.13 eager peer of bench/bench_gpt.cpp: one training step of GPT-2's architecture.

    /usr/bin/python3 bench/gpt_torch.py [--reps 7] [--threads 2] [--target 0.2]
                                        [--init DIR --steps K] [--only small|medium]

The model is examples/support/gpt_model.h's, written the way nanoGPT writes it: token and
learned position embeddings, pre-LayerNorm blocks of causal self-attention (one c_attn Linear
for q, k and v, F.scaled_dot_product_attention's math written out, as PyTorch 1.13 has no
fused one) and a 4x MLP with GELU's tanh form, a final LayerNorm and the LM head tied to the token
embedding; parameter names as nanoGPT's state_dict ("transformer.h.0.attn.c_attn.weight").
Problems (layers, heads, d_model, block, batch; vocabulary 256, byte-level):
small (4, 4, 256, 128, 8), medium (6, 6, 384, 256, 8). One step: zero_grad(set_to_none=True),
F.cross_entropy of the logits against the next tokens, backward, clip_grad_norm_(1.0),
torch.optim.AdamW(lr=1e-3, weight_decay=0.1) step. With --init DIR the parameters and the batch
come from DIR/<problem>/<name>.bin, x.bin and y.bin (raw f32 / i64), and the losses of the first
K steps from there are printed as
    LOSSES torch_eager_<problem> <l0> <l1> ...
and those of the same model and optimiser in float64 (the reference both float32 runs are
measured against) as LOSSES torch_f64_<problem> ...
Generation (torch_generate_<problem>): 200 greedy tokens (block - 1 where the block is shorter)
after a one-token prompt with a key/value cache, a token at a time, as Kiln's gpt::generate.
Then each case is timed by bench/side_by_side.py (RESULT and TIMES lines).
"""
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

import side_by_side

LR, WEIGHT_DECAY, CLIP, VOCAB = 1e-3, 0.1, 1.0, 256
GENERATED = 200  # greedy tokens after a one-token prompt (fewer where the block is shorter)
PROBLEMS = {"small": (4, 4, 256, 128, 8), "medium": (6, 6, 384, 256, 8)}


class Attention(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.c_attn, self.c_proj, self.heads = nn.Linear(c, 3 * c), nn.Linear(c, c), heads

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(c // self.heads)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc, self.c_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(c), Attention(c, heads)
        self.ln_2, self.mlp = nn.LayerNorm(c), Mlp(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, layers, heads, c, block):
        super().__init__()
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(VOCAB, c),
                wpe=nn.Embedding(block, c),
                h=nn.ModuleList(Block(c, heads) for _ in range(layers)),
                ln_f=nn.LayerNorm(c),
            )
        )
        self.lm_head = nn.Linear(c, VOCAB, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied

    def forward(self, idx):
        t = self.transformer
        x = t.wte(idx) + t.wpe(torch.arange(idx.shape[1]))
        for block in t.h:
            x = block(x)
        return self.lm_head(t.ln_f(x))


def setup(name, init, dtype=torch.float32):
    layers, heads, c, block, batch = PROBLEMS[name]
    model = Gpt(layers, heads, c, block)
    if init:
        at = os.path.join(init, name)
        state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
        files = {f[:-4] for f in os.listdir(at) if f.endswith(".bin")} - {"x", "y"}
        assert files == set(state), (sorted(files), sorted(state))
        loaded = {
            k: side_by_side.read_raw(os.path.join(at, k + ".bin"), torch.float32, v.shape)
            for k, v in state.items()
        }
        model.load_state_dict(loaded, strict=False)  # lm_head.weight is wte's
        x = side_by_side.read_raw(os.path.join(at, "x.bin"), torch.int64, (batch, block))
        y = side_by_side.read_raw(os.path.join(at, "y.bin"), torch.int64, (batch, block))
    else:
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, VOCAB, (batch, block), generator=g)
        y = torch.randint(0, VOCAB, (batch, block), generator=g)
    model.to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        return loss

    return step, model


@torch.no_grad()
def generate_cached(model, idx, n):
    """idx [B, P] and n greedy tokens after it, with a key/value cache, a token at a time (the
    prompt too), as Kiln's gpt::generate: nanoGPT's generate without recomputing the context."""
    t = model.transformer
    b, p = idx.shape
    c = t.wte.weight.shape[1]
    keys, values = [None] * len(t.h), [None] * len(t.h)
    out = idx
    for pos in range(p + n - 1):
        x = t.wte(out[:, pos : pos + 1]) + t.wpe(torch.tensor([pos]))
        for i, block in enumerate(t.h):
            heads = block.attn.heads
            q, k, v = block.attn.c_attn(block.ln_1(x)).split(c, dim=2)
            q, k, v = (z.view(b, 1, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            keys[i] = k if keys[i] is None else torch.cat([keys[i], k], 2)
            values[i] = v if values[i] is None else torch.cat([values[i], v], 2)
            att = F.softmax(q @ keys[i].transpose(-2, -1) / math.sqrt(c // heads), dim=-1)
            y = (att @ values[i]).transpose(1, 2).reshape(b, 1, c)
            x = x + block.attn.c_proj(y)
            x = x + block.mlp(block.ln_2(x))
        if pos + 1 >= p:
            token = model.lm_head(t.ln_f(x))[:, -1].argmax(-1, keepdim=True)
            out = torch.cat([out, token], 1)
    return out


def main():
    args = side_by_side.training_args(__doc__, PROBLEMS)
    fns = {}
    for name in PROBLEMS:
        if args.only and name != args.only:
            continue
        step, model = setup(name, args.init)
        if args.init:
            side_by_side.print_losses(f"torch_eager_{name}", step, args.steps)
            f64_step, _ = setup(name, args.init, torch.float64)
            side_by_side.print_losses(f"torch_f64_{name}", f64_step, args.steps)
        fns[f"torch_eager_{name}"] = step
        n = min(GENERATED, PROBLEMS[name][3] - 1)
        fns[f"torch_generate_{name}"] = lambda model=model, n=n: generate_cached(
            model, torch.zeros((1, 1), dtype=torch.int64), n
        )
    side_by_side.report(side_by_side.time_cases(fns, args.reps, args.target))


if __name__ == "__main__":
    main()
