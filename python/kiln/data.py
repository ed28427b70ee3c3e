"""kiln.data: Kiln's native data pipeline (docs/DATA.md; docs/PYTHON.md, "nn, optim, data and io").

    train = (kl.data.from_idx(images, labels)
             .shuffle(seed=1)
             .map(kl.data.image.normalize([0.286], [0.353]), num_threads=2)
             .batch(128)
             .prefetch(4))
    for batch in train:               # one epoch; the next loop runs the next epoch
        step(batch["image"], batch["label"])

Native stages (sources, image transforms, shuffle, batch, prefetch) run on C++ threads without
the GIL. A Python function given to map or filter takes the GIL for each call: it is correct on
worker threads, but Python maps on several threads run one at a time.
"""
from ._kiln import _data as _native

globals().update({k: v for k, v in vars(_native).items() if not k.startswith("__")})
