#!/usr/bin/python3
"""PyTorch 1.13 eager peer of bench/bench_train.cpp: one training step of a CNN and an MLP.

    /usr/bin/python3 bench/train_torch.py [--reps 7] [--threads 2] [--target 0.2]
                                          [--init DIR --steps K] [--only cnn|mlp|demo]

Problems (float32): cnn, batch 64 of 1x28x28: conv 1->32 5x5 padding 2, relu, maxpool 2,
conv 32->64 5x5 padding 2, relu, maxpool 2, flatten, linear 3136->1024, relu, linear 1024->10;
mlp, batch 128 of 784: 784-512-512-10 with relu; demo, examples/demo.cpp's CNN, batch 64:
conv 1->32 3x3 padding 1, relu, maxpool 2, conv 32->64 3x3 padding 1, relu, maxpool 2,
flatten, linear 3136->128, relu, linear 128->10. One step: zero_grad(set_to_none=True),
F.cross_entropy of the model's logits with integer labels, loss.backward(),
torch.optim.SGD(lr=0.01) step. The models are nn.Sequential, so the parameter names
("0.weight", ...) are those bench_train writes: with --init DIR the parameters and the batch
come from DIR/<problem>/<name>.bin, x.bin (raw f32) and y.bin (raw i64), and the losses of the
first K steps from there are printed as
    LOSSES torch_eager_<problem> <l0> <l1> ...
(without --init: PyTorch's default initialisation and a random batch). Then each case is timed
by bench/side_by_side.py, which prints RESULT and TIMES lines (what bench_train reads).
"""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

import side_by_side

LR = 0.01


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 7 * 7, 1024),
        nn.ReLU(),
        nn.Linear(1024, 10),
    )


def demo():  # examples/demo.cpp's CNN
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 7 * 7, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )


def mlp():
    return nn.Sequential(
        nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
    )


PROBLEMS = {
    "cnn": (cnn, (64, 1, 28, 28)),
    "mlp": (mlp, (128, 784)),
    "demo": (demo, (64, 1, 28, 28)),
}


def setup(name, init):
    make, x_shape = PROBLEMS[name]
    model = make()
    if init:
        at = os.path.join(init, name)
        state = model.state_dict()
        files = {f[:-4] for f in os.listdir(at) if f.endswith(".bin")} - {"x", "y"}
        assert files == set(state), (sorted(files), sorted(state))
        model.load_state_dict(
            {
                k: side_by_side.read_raw(os.path.join(at, k + ".bin"), torch.float32, v.shape)
                for k, v in state.items()
            }
        )
        x = side_by_side.read_raw(os.path.join(at, "x.bin"), torch.float32, x_shape)
        y = side_by_side.read_raw(os.path.join(at, "y.bin"), torch.int64, x_shape[:1])
    else:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(x_shape, generator=g)
        y = torch.randint(0, 10, x_shape[:1], generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def main():
    args = side_by_side.training_args(__doc__, PROBLEMS)
    fns = {}
    for name in PROBLEMS:
        if args.only and name != args.only:
            continue
        step = setup(name, args.init)
        if args.init:
            side_by_side.print_losses(f"torch_eager_{name}", step, args.steps)
        fns[f"torch_eager_{name}"] = step
    side_by_side.report(side_by_side.time_cases(fns, args.reps, args.target))


if __name__ == "__main__":
    main()
