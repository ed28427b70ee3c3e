#!/usr/bin/python3
"""A GPT trained on text (its bytes, or a BPE tokenizer's tokens): examples/gpt.cpp's job in
Python, with the same model (GPT-2's architecture), the same flags and defaults, the same
training windows for a seed, and the same checkpoint format (a run saved by one resumes in the
other).

    PYTHONPATH=python python3 python/examples/gpt.py [--steps 3000] [--text FILE ...] ...

It writes checkpoint.safetensors and metrics.csv as gpt.cpp does (not the SVG chart); under
mpirun, `--data-parallel` trains on every process, `--zero 1|2|3` shards the optimiser state
(and at stage 3 the weights) and `--tensor-parallel --mesh data=D,model=M` lays the model out
as Megatron-LM does, the last two writing checkpoint/, each process's pieces, as gpt.cpp does.
`python3 python/examples/gpt.py --help` lists the flags. The model is a pytree of dataclasses
of kiln.nn layers whose parameter names are nanoGPT's ("transformer.h.0.attn.c_attn.weight"),
so kiln.nn.load_state_dict moves weights from a PyTorch GPT of that form and
kiln.nn.state_dict moves them back (python/tests/test_gpt_example.py does both).
"""
import argparse
import dataclasses
import math
import os
import re
import shutil
import sys
import time

import numpy as np

import kiln as kl

DEFAULT_CORPUS = "/usr/share/games/fortunes"
DEFAULT_BPE_VOCAB = 1024


# ---- the model -------------------------------------------------------------------------------


@dataclasses.dataclass
class Attention:
    c_attn: object  # Linear [3C, C]: q, k and v stacked
    c_proj: object  # Linear [C, C]
    heads: int = dataclasses.field(default=1, metadata={"static": True})


@dataclasses.dataclass
class Mlp:
    c_fc: object
    c_proj: object


@dataclasses.dataclass
class Block:
    ln_1: object
    attn: Attention
    ln_2: object
    mlp: Mlp


@dataclasses.dataclass
class Transformer:
    wte: object
    wpe: object
    h: list
    ln_f: object


@dataclasses.dataclass
class Model:
    transformer: Transformer


def linear(n_in, n_out, key, std):
    """A Linear of GPT-2's initialisation: weight N(0, std), bias 0."""
    layer = kl.nn.Linear(n_in, n_out, key)
    layer.weight = kl.random.normal(key, (n_out, n_in)) * std
    layer.bias = kl.zeros((n_out,))
    return layer


def init(layers, heads, d_model, block_size, key, vocab=256):
    """GPT-2's initialisation, drawn as examples/support/gpt_model.h draws it (the same weights
    for the same key)."""
    std, residual = 0.02, 0.02 / math.sqrt(2.0 * layers)
    keys = kl.random.split(key, 2 + 4 * layers)
    wte = kl.nn.Embedding(vocab, d_model, keys[0])
    wte.weight = kl.random.normal(keys[0], (vocab, d_model)) * std
    wpe = kl.nn.Embedding(block_size, d_model, keys[1])
    wpe.weight = kl.random.normal(keys[1], (block_size, d_model)) * std
    blocks = []
    for i in range(layers):
        k = [keys[2 + 4 * i + j] for j in range(4)]
        blocks.append(
            Block(
                kl.nn.LayerNorm([d_model]),
                Attention(
                    linear(d_model, 3 * d_model, k[0], std),
                    linear(d_model, d_model, k[1], residual),
                    heads,
                ),
                kl.nn.LayerNorm([d_model]),
                Mlp(
                    linear(d_model, 4 * d_model, k[2], std),
                    linear(4 * d_model, d_model, k[3], residual),
                ),
            )
        )
    return Model(Transformer(wte, wpe, blocks, kl.nn.LayerNorm([d_model])))


def attention(a, x, dropout=0.0, key=None):
    b, t, c = x.shape
    q, k, v = kl.split(a.c_attn(x), 3, 2)

    def heads(z):
        return kl.swapaxes(kl.reshape(z, (b, t, a.heads, c // a.heads)), 1, 2)

    keys = kl.random.split(key, 2) if dropout > 0 else [None, None]
    y = kl.nn.scaled_dot_product_attention(
        heads(q), heads(k), heads(v), is_causal=True, dropout=dropout, dropout_key=keys[0]
    )
    out = a.c_proj(kl.reshape(kl.swapaxes(y, 1, 2), (b, t, c)))
    return kl.nn.dropout(out, dropout, keys[1]) if dropout > 0 else out


def logits(m, tokens, dropout=0.0, key=None, block_weights=None):
    """The logits [B, T, 256] of tokens [B, T] (int64), with dropout at GPT-2's three places.
    block_weights(i, held) makes block i's weights from what the model holds for it (ZeRO-3:
    this process's pieces, gathered); each block then runs under a checkpoint that gathers them
    again for the backward pass instead of keeping them, and keeps the activations (FSDP's
    choice, gpt_model.h's logits)."""
    t = m.transformer
    n = len(t.h)
    keys = kl.random.split(key, 1 + 2 * n) if dropout > 0 else [None] * (1 + 2 * n)
    x = t.wte(tokens) + t.wpe(kl.arange(tokens.shape[1]))
    if dropout > 0:
        x = kl.nn.dropout(x, dropout, keys[0])
    for i, held in enumerate(t.h):

        def block(b, x, i=i):
            x = x + attention(b.attn, b.ln_1(x), dropout, keys[1 + 2 * i])
            h = b.mlp.c_proj(kl.nn.gelu(b.mlp.c_fc(b.ln_2(x)), approximate=True))
            return x + (kl.nn.dropout(h, dropout, keys[2 + 2 * i]) if dropout > 0 else h)

        if block_weights is None:
            x = block(held, x)
        else:
            gathered = kl.checkpoint(
                lambda h, x, i=i, block=block: block(block_weights(i, h), x),
                recompute=["all_gather"],
            )
            x = gathered(held, x)
    return kl.matmul(t.ln_f(x), kl.transpose(t.wte.weight))


def loss(m, tokens, targets, dropout=0.0, key=None, block_weights=None):
    """Mean next-token cross-entropy, taken in float32 at least, whatever the model computes in."""
    z = logits(m, tokens, dropout, key, block_weights)
    if z.dtype in (kl.bfloat16, kl.float16):
        z = kl.astype(z, kl.float32)
    return kl.nn.cross_entropy(kl.reshape(z, (-1, z.shape[2])), kl.reshape(targets, (-1,)))


def train_flops(layers, d_model, tokens, block, vocab=256):
    """Model FLOPs of a training step (as gpt_model.h's train_flops counts them)."""
    return (
        6.0 * tokens * (12 * layers * d_model**2 + vocab * d_model)
        + 12.0 * layers * tokens * block * d_model
    )


# ---- tensor parallelism (Megatron-LM's layout), inside shard_map: gpt_model.h's ----------------
#
# Each of the M processes along the axis holds 1/M of the vocabulary (its rows of the token
# embedding, so also its block of the tied LM head's logits), 1/M of every block's heads (its
# rows of c_attn: the q, k and v of those heads) and of the MLP's hidden units (rows of c_fc,
# columns of the output projections); LayerNorms, the position embedding and the row-parallel
# layers' biases are replicated.


def parallel_specs(m, axis):
    """Where each parameter (of the model, or of a tree shaped like it) is split, leaf by leaf
    in flatten order."""
    out = []
    for name in kl.tree.names(m):
        if name.endswith(("wte.weight", "c_attn.weight", "c_fc.weight")):
            out.append(kl.spec(axis, None))  # rows: vocabulary, heads, hidden units
        elif name.endswith(("c_attn.bias", "c_fc.bias")):
            out.append(kl.spec(axis))
        elif name.endswith(("attn.c_proj.weight", "mlp.c_proj.weight")):
            out.append(kl.spec(None, axis))  # columns: the row-parallel layers' inputs
        else:
            out.append(kl.spec())
    return out


def qkv_rows(c, parts):
    """c_attn's 3C rows reordered so that block p holds the q, k and v rows of process p's
    heads, in that order (the checkpoint's order is all q, all k, all v)."""
    n = c // parts
    rows = [part * c + p * n + i for p in range(parts) for part in range(3) for i in range(n)]
    return np.array(rows, np.int64)


def parallel_blocks(full, mesh, axis):
    """This process's blocks of a whole model (or of an optimiser slot shaped like it)."""
    leaves, structure = kl.tree.flatten(full)
    c, parts = full.transformer.wpe.weight.shape[1], mesh.size(axis)
    out = []
    for name, leaf, spec in zip(kl.tree.names(full), leaves, parallel_specs(full, axis)):
        if "c_attn" in name:
            leaf = kl.take(leaf, kl.asarray(qkv_rows(c, parts)), 0)
        out.append(kl.local_block(kl.asarray(leaf), mesh, spec))
    return kl.tree.unflatten(structure, out)


def parallel_whole(blocks, axis, parts):
    """Inside shard_map, the inverse: the whole model from every process's blocks."""
    leaves, structure = kl.tree.flatten(blocks)
    back = kl.asarray(np.argsort(qkv_rows(blocks.transformer.wpe.weight.shape[1], parts)))
    out = []
    for name, leaf, spec in zip(kl.tree.names(blocks), leaves, parallel_specs(blocks, axis)):
        leaf = kl.assemble(leaf, spec)
        out.append(kl.take(leaf, back, 0) if "c_attn" in name else leaf)
    return kl.tree.unflatten(structure, out)


def parallel_pieces(blocks, mesh, axis, prefix):
    """This process's pieces of a tree of blocks for a sharded checkpoint, in the model's own
    order: c_attn's block goes as three pieces, its q, k and v rows."""
    c, parts, p = blocks.transformer.wpe.weight.shape[1], mesh.size(axis), mesh.index(axis)
    n = c // parts
    out = []
    for piece in kl.io.block_pieces(blocks, parallel_specs(blocks, axis), mesh, prefix):
        if "c_attn" not in piece.name:
            out.append(piece)
            continue
        for part in range(3):
            start = [part * c + p * n] + list(piece.start[1:])
            data = piece.data[part * n : (part + 1) * n]
            out.append(kl.io.Piece(piece.name, data, start, list(piece.whole_shape)))
    return out


@dataclasses.dataclass
class DropoutMasks:
    """The keep-masks the one-process run draws (logits' keys, in its order): [B, T, C] for
    the embeddings and each block's two outputs, [B, heads, T, T] for its attention weights."""

    embedding: object
    attention: list
    attention_out: list
    mlp: list


def dropout_masks(key, rate, b, t, layers, heads, c):
    keys = kl.random.split(key, 1 + 2 * layers)
    keep = 1.0 - rate
    masks = DropoutMasks(kl.random.bernoulli(keys[0], keep, (b, t, c)), [], [], [])
    for i in range(layers):
        attention_keys = kl.random.split(keys[1 + 2 * i], 2)
        masks.attention.append(kl.random.bernoulli(attention_keys[0], keep, (b, heads, t, t)))
        masks.attention_out.append(kl.random.bernoulli(attention_keys[1], keep, (b, t, c)))
        masks.mlp.append(kl.random.bernoulli(keys[2 + 2 * i], keep, (b, t, c)))
    return masks


def dropout_specs(layers):
    """Where each mask is split: rows over "data", the attention weights' heads over "model"."""
    return [kl.spec("data")] + [kl.spec("data", "model")] * layers + [kl.spec("data")] * 2 * layers


def apply_dropout(x, keep, rate):
    """x with nn.dropout's arithmetic and a given keep-mask."""
    return kl.where(keep, x * (1.0 / (1.0 - rate)), kl.zeros_like(x))


def parallel_attention(a, x, axis, rate=0.0, masks=None, layer=0):
    """Causal self-attention on this process's heads (a.heads counts every process's)."""
    b, t, c = x.shape
    d, local = c // a.heads, a.c_attn.weight.shape[0] // 3
    q, k, v = kl.split(a.c_attn(x), 3, 2)

    def heads(z):
        return kl.swapaxes(kl.reshape(z, (b, t, local // d, d)), 1, 2)

    if masks is None:
        y = kl.nn.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
    else:  # the weights' dropout as scaled_dot_product_attention applies it
        w = kl.nn.attention_weights(heads(q), heads(k), is_causal=True)
        y = kl.matmul(apply_dropout(w, masks.attention[layer], rate), heads(v))
    out = kl.nn.row_parallel_linear(a.c_proj, kl.reshape(kl.swapaxes(y, 1, 2), (b, t, local)), axis)
    return out if masks is None else apply_dropout(out, masks.attention_out[layer], rate)


def parallel_loss(m, tokens, targets, axis, rate=0.0, masks=None):
    """The mean next-token cross-entropy from this process's blocks, the same on every process
    of the axis and the same value as loss() on the whole model (with dropout, as loss() with
    the key the masks were drawn from)."""
    t = m.transformer
    x = kl.nn.parallel_embedding(t.wte, tokens, axis) + t.wpe(kl.arange(tokens.shape[1]))
    if masks is not None:
        x = apply_dropout(x, masks.embedding, rate)
    for i, b in enumerate(t.h):
        x = x + parallel_attention(b.attn, b.ln_1(x), axis, rate, masks, i)
        h = b.mlp.c_fc(b.ln_2(x))
        h = kl.nn.row_parallel_linear(b.mlp.c_proj, kl.nn.gelu(h, approximate=True), axis)
        x = x + (h if masks is None else apply_dropout(h, masks.mlp[i], rate))
    z = kl.matmul(t.ln_f(x), kl.transpose(t.wte.weight))  # [B, T, vocab / M]
    if z.dtype in (kl.bfloat16, kl.float16):
        z = kl.astype(z, kl.float32)
    return kl.nn.parallel_cross_entropy(
        kl.reshape(z, (-1, z.shape[2])), kl.reshape(targets, (-1,)), axis
    )


# ---- data ------------------------------------------------------------------------------------


def default_corpus():
    if not os.path.isdir(DEFAULT_CORPUS):
        sys.exit(
            f"gpt: {DEFAULT_CORPUS} is missing: install Debian's fortunes package, or pass --text"
        )
    paths = (os.path.join(DEFAULT_CORPUS, f) for f in os.listdir(DEFAULT_CORPUS) if "." not in f)
    return sorted(p for p in paths if os.path.isfile(p) and not os.path.islink(p))


def read_corpus(files):
    data = bytearray()
    for path in files:
        try:
            with open(path, "rb") as f:
                b = f.read()
        except OSError:
            raise ValueError(f"cannot read {path}")
        if not b:
            raise ValueError(f"{path} is empty: expected UTF-8 text")
        try:
            if b"\0" in b:
                raise UnicodeDecodeError("utf-8", b, b.index(b"\0"), b.index(b"\0") + 1, "NUL")
            b.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{path} is not UTF-8 text: byte {e.start} is 0x{b[e.start]:02x}")
        data += b
    return bytes(data)


_M = (1 << 64) - 1


def mix(x):
    """SplitMix64 on numpy uint64 arrays (wrapping, on purpose), as gpt.cpp's mix."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(_M)
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & np.uint64(_M)
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & np.uint64(_M)
        return x ^ (x >> np.uint64(31))


def windows(data, count, batch, block, seed, stream, step):
    """Inputs and targets [count, batch, block] (int64) of the windows gpt.cpp draws."""
    with np.errstate(over="ignore"):
        base = mix(np.uint64(seed) ^ np.uint64(stream << 62))
        h = mix(mix(base + np.uint64(step)) + np.arange(count * batch, dtype=np.uint64))
    starts = (h % np.uint64(len(data) - block)).astype(np.int64)
    idx = starts[:, None] + np.arange(block + 1)
    w = data[idx].astype(np.int64).reshape(count, batch, block + 1)
    return kl.asarray(w[..., :-1].copy()), kl.asarray(w[..., 1:].copy())


# ---- training --------------------------------------------------------------------------------


@dataclasses.dataclass
class TrainState:
    model: Model
    optimizer: object


SAVED = ["layers", "heads", "d_model", "block_size", "batch_size", "accum", "steps", "warmup", "lr"]
SAVED += ["weight_decay", "clip", "dropout", "seed", "eval_every", "eval_batches", "dtype"]
SAVED += ["tokenizer", "vocab"]


def parse_args(argv):
    # No abbreviations: a flag given must be known by its full name, so that --resume keeps it.
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--text", nargs="+", default=[], help="UTF-8 files (default: Debian's fortunes)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    p.add_argument("--tokenizer", choices=["bytes", "bpe"], default="bytes")
    p.add_argument("--vocab", type=int, default=0, help="--tokenizer bpe: tokens (default 1024)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--out", default=None, help="default gpt-out, or the --resume directory")
    p.add_argument("--resume", default=None)
    p.add_argument("--stop-after", type=int, default=0)
    p.add_argument("--sample", type=int, default=300)
    p.add_argument("--prompt", default="\n")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--data-parallel", action="store_true", help="one of mpirun's processes")
    p.add_argument(
        "--zero",
        type=int,
        default=0,
        help="with --data-parallel: each process keeps 1/N of the optimiser state (1), of the "
        "gradients too (2), and of the weights too (3); the checkpoint is checkpoint/, each "
        "process's pieces, and resumes under any layout",
    )
    p.add_argument(
        "--tensor-parallel",
        action="store_true",
        help="Megatron's layout over mpirun's processes: each process of the mesh's model axis "
        "holds 1/M of the vocabulary, of every block's heads and of the MLP's hidden units; the "
        "data axis splits each batch. Same run up to round-off, dropout included",
    )
    p.add_argument(
        "--mesh", default=None, help="data=D,model=M: the processes for --tensor-parallel"
    )
    args = p.parse_args(argv)
    given = {a.split("=")[0][2:].replace("-", "_") for a in argv if a.startswith("--")}
    if args.resume:
        path, sharded = saved_checkpoint(args.resume)
        meta = metadata_of((path, sharded))
        for name in ["tokenizer", "vocab"]:  # the vocabulary is the checkpoint's tokenizer's
            if name in given and name in meta and str(getattr(args, name)) != meta[name]:
                p.error(
                    f"--{name} {getattr(args, name)} differs from {path}'s {meta[name]}: a "
                    "resumed run keeps its tokenizer"
                )
        for name in SAVED:
            key = name.replace("_", "-")
            if name not in given and key in meta:
                setattr(args, name, type(getattr(args, name))(meta[key]))
        if "text" not in given and meta.get("text"):
            args.text = meta["text"].split("\n")
    if args.out is None:
        args.out = args.resume or "gpt-out"
    for name in ["layers", "heads", "d_model", "batch_size", "accum", "steps", "eval_every"]:
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.eval_batches < 1:
        p.error(f"--eval-batches must be positive, got {args.eval_batches}")
    if args.block_size < 2:
        p.error(f"--block-size must be at least 2 (a token and the next), got {args.block_size}")
    if args.d_model % args.heads:
        p.error(f"--d-model must be a multiple of --heads, got {args.d_model} and {args.heads}")
    if not args.lr > 0 or not args.clip > 0 or args.weight_decay < 0 or args.warmup < 0:
        p.error("--lr and --clip must be positive, --weight-decay and --warmup not negative")
    if not 0 <= args.dropout < 1:
        p.error(f"--dropout must be in [0, 1), got {args.dropout}")
    if args.temperature < 0 or args.top_k < 0 or args.sample < 0 or args.seed < 0:
        p.error("--temperature, --top-k, --sample and --seed must not be negative")
    if args.tokenizer == "bytes" and args.vocab not in (0, 256):
        p.error(f"--vocab {args.vocab} needs --tokenizer bpe (bytes are 256 tokens)")
    if args.tokenizer == "bytes":
        args.vocab = 256
    elif args.vocab == 0:
        args.vocab = DEFAULT_BPE_VOCAB
    if args.tokenizer == "bpe" and not 257 <= args.vocab <= 1 << 20:
        p.error(
            "--vocab must be from 257 (the 256 bytes and a merge) to 1048576 for --tokenizer "
            f"bpe, got {args.vocab}"
        )
    args.mesh = parse_mesh(p, args.mesh) if args.mesh is not None else []
    processes = kl.process_count()
    if args.tensor_parallel:
        if not args.mesh:
            args.mesh = [("data", 1), ("model", processes)]
        if [name for name, _ in args.mesh] != ["data", "model"]:
            p.error("--mesh must name the axes data and model, in that order: data=D,model=M")
        (_, d), (_, m) = args.mesh
        if d * m != processes:
            p.error(f"--mesh data={d},model={m} holds {d * m} processes: got {processes}")
        if args.batch_size % d:
            p.error(f"--batch-size must be divisible by the mesh's data={d}, got {args.batch_size}")
        if args.heads % m:
            p.error(
                f"--heads must be divisible by the mesh's model={m} (each process holds heads), "
                f"got {args.heads}"
            )
        if args.data_parallel or args.zero:
            p.error("--tensor-parallel takes its data parallelism from --mesh, and no --zero yet")
    elif args.mesh:
        p.error("--mesh lays out --tensor-parallel: add it")
    if processes > 1 and not (args.data_parallel or args.tensor_parallel):
        p.error(f"started as {processes} processes: add --data-parallel to train on all of them")
    if args.batch_size % processes and not args.tensor_parallel:
        p.error(
            "--batch-size (sequences per step over all processes) must be divisible by the "
            f"{processes} processes, got {args.batch_size}"
        )
    if args.zero not in (0, 1, 2, 3):
        p.error(f"--zero must be 1, 2 or 3 (the ZeRO stage), got {args.zero}")
    if args.zero and not args.data_parallel:
        p.error("--zero shards over processes: add --data-parallel")
    return args


def parse_mesh(p, text):
    """data=D,model=M as [("data", D), ("model", M)] (empty: the default, as gpt.cpp)."""
    mesh = []
    for part in filter(None, text.split(",")):
        name, _, size = part.partition("=")
        if not re.fullmatch("[0-9]+", size) or int(size) < 1:
            p.error(f"bad --mesh {text}: expected data=D,model=M")
        mesh.append((name, int(size)))
    return mesh


def saved_checkpoint(directory):
    """The run's checkpoint in `directory` as (path, sharded): checkpoint.safetensors, the whole
    state (one process, data parallelism), or checkpoint/, each process's pieces (--zero),
    whichever holds the later step (gpt.cpp's saved_checkpoint)."""
    whole = os.path.join(directory, "checkpoint.safetensors")
    pieces = os.path.join(directory, "checkpoint")
    step = kl.io.latest_sharded_step(pieces)
    if step is None:
        return whole, False
    if not os.path.exists(whole):
        return pieces, True
    done = kl.io.load_metadata(whole).get("steps_done")
    if done is None:
        sys.exit(f"gpt: {whole} is not a checkpoint of this job: it has no steps_done")
    return (pieces, True) if step > int(done) else (whole, False)


def metadata_of(saved):
    path, sharded = saved
    return kl.io.sharded_metadata(path) if sharded else kl.io.load_metadata(path)


def load_state(saved, like):
    """The state of a checkpoint, names, dtypes and shapes checked against `like`; a sharded one
    is put back together whole, whatever layout wrote it."""
    path, sharded = saved
    return kl.io.load_sharded(path, like) if sharded else kl.io.load(path, like)


CSV_HEADER = "step,train_loss,val_loss,lr,tokens_per_second,mfu"


def write_metrics(path, rows):
    """metrics.csv as gpt.cpp writes it, replaced atomically (a temporary file renamed)."""
    lines = [CSV_HEADER] + ["%d,%.6f,%.6f,%.6g,%.1f,%.4f" % r for r in rows]
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def read_metrics(path, upto):
    """The rows of a run's metrics.csv up to step `upto` (to continue them on --resume)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = f.read().splitlines()
    if not lines or lines[0] != CSV_HEADER:
        raise ValueError(f"unexpected header in {path}")
    rows = [tuple(float(v) for v in line.split(",")) for line in lines[1:] if line]
    return [(int(r[0]),) + r[1:] for r in rows if r[0] <= upto]


def settings(args):
    def text(v):
        return "%.17g" % v if isinstance(v, float) else str(v)  # as gpt.cpp writes them

    meta = {name.replace("_", "-"): text(getattr(args, name)) for name in SAVED}
    meta["text"] = "\n".join(args.text)
    return meta


def cast(m, dtype):
    """The model's float32 master weights cast for a mixed-precision pass."""
    return kl.tree.map(lambda p: kl.astype(p, dtype), m)


def gradients(params, x, y, key, loss_of, accum, dropout):
    """The loss and gradients of one step's `accum` micro-batches x[i], y[i], averaged, with
    respect to `params`, whose loss on a micro-batch loss_of(params, x, y, dropout_key)
    computes (gpt.cpp's gradients)."""
    keys = kl.random.split(key, accum)
    total, grads = None, None
    for i in range(accum):
        k = keys[i] if dropout > 0 else None
        part, g = kl.value_and_grad(lambda m: loss_of(m, x[i], y[i], k))(params)
        total = part if total is None else total + part
        grads = g if grads is None else kl.tree.map(lambda a, b: a + b, grads, g)
    if accum > 1:  # times the inverse, as gpt.cpp does (the same bits)
        inv = 1.0 / accum
        grads = kl.tree.map(lambda g: g * inv, grads)
        total = total * inv
    return total, grads


def make_train_step(opt, accum=1, dropout=0.0, dtype=kl.float32, parallel=False):
    """The compiled step: loss and gradients in `dtype` of each of `accum` micro-batches x[i],
    y[i] (the gradients averaged), then `opt`'s update; (state, x, y, key) -> (state, loss).
    With `parallel`, pmapped over the processes: each brings its share of every micro-batch
    along a leading axis of 1 and the gradients and the loss are pmeaned (gpt.cpp's step)."""

    def reduce(t):
        return kl.pmean(t, axis_name="dp") if parallel else t

    def model_loss(m, x, y, k):
        return loss(cast(m, dtype), x, y, dropout, k)

    def train_step(s, x, y, key):
        total, grads = gradients(s.model, x, y, key, model_loss, accum, dropout)
        grads = kl.tree.map(reduce, grads)
        new_model, new_opt = opt.update(s.model, grads, s.optimizer)
        return TrainState(new_model, new_opt), reduce(total)

    if parallel:
        return kl.pmap(train_step, in_axes=(None, 0, 0, 0), out_axes=None, axis_name="dp")
    return kl.jit(train_step)


def make_zero_step(zero, whole, accum=1, dropout=0.0, dtype=kl.float32):
    """gpt.cpp's ZeRO step, pmapped over the processes ("dp"): (params, optimiser state, x, y,
    key) -> (params, state, loss), each with a leading axis of 1 for this process. The state is
    this process's pieces (kiln.optim.Zero); the params are the whole model at stages 1 and 2
    and this process's pieces of it at stage 3, where the loss gathers the embeddings and the
    final LayerNorm for the whole step (the LM head reads the token embedding last) and each
    block's weights only while the block runs. `whole` is a model of the right shapes."""
    parts = zero.layout.parts
    t = whole.transformer
    outer_layout = kl.optim.ShardLayout((t.wte, t.wpe, t.ln_f), parts)
    block_layouts = [kl.optim.ShardLayout(b, parts) for b in t.h]

    def model_loss(m, x, y, k):
        return loss(cast(m, dtype), x, y, dropout, k)

    def sharded_loss(pieces, x, y, k):
        p = pieces.transformer
        outer = kl.optim.gather((p.wte, p.wpe, p.ln_f), outer_layout, "dp")
        wte, wpe, ln_f = cast(outer, dtype)
        m = Model(Transformer(wte, wpe, p.h, ln_f))

        def weights(i, held):
            return cast(kl.optim.gather(held, block_layouts[i], "dp"), dtype)

        return loss(m, x, y, dropout, k, weights)

    def step(params, state, x, y, key):
        loss_of = sharded_loss if zero.stage == 3 else model_loss
        total, grads = gradients(params, x, y, key, loss_of, accum, dropout)
        params, state = zero.update(params, grads, state)
        return params, state, kl.pmean(total, axis_name="dp")

    return kl.pmap(step, axis_name="dp")


def per_process(tree):
    """Every leaf with a leading axis of 1: this process's value, as pmap takes it."""
    return kl.tree.map(lambda t: kl.expand_dims(kl.asarray(t), 0), tree)


def first_of(tree):
    """Every leaf without pmap's leading axis of 1."""
    return kl.tree.map(lambda t: t[0], tree)


def share(x, part, parts):
    """Rows [part * n, (part + 1) * n) of axis 1 of x [count, B, T] with a leading axis of 1:
    this process's share of each batch, as pmap takes it."""
    n = x.shape[1] // parts
    return kl.asarray(np.ascontiguousarray(np.asarray(x)[None, :, part * n : (part + 1) * n]))


# ---- how the training state lies over the processes: gpt_layouts.h's layouts ----------------
#
# Each takes the step's whole windows x, y [accum, B, T] (every process passes all of them and
# takes its share) and the step's key seed, and gives the loss, the mean over the processes;
# whole() is the whole state on every process (a collective where the state is spread).


def step_pieces(step):
    """A sharded checkpoint's first piece: the step count, written by process 0."""
    replicas = kl.Mesh({"processes": kl.process_count()})
    return kl.io.block_pieces(step, kl.spec(), replicas, "optimizer.step")


def process_key(key_seed, rank):
    """Dropout's key for process `rank` (process 0's is the one-process run's)."""
    with np.errstate(over="ignore"):
        return kl.random.key(int(np.uint64(key_seed) + np.uint64(rank)))


class Replicated:
    """The whole state in this process; with `parallel`, in every process, each taking its
    share of every batch, the gradients and the loss pmeaned over the processes ("dp")."""

    sharded = False

    def __init__(self, state, opt, args, dtype):
        self.state, self.parallel = state, args.data_parallel
        self.train_step = make_train_step(opt, args.accum, args.dropout, dtype, self.parallel)

    def step(self, x, y, key_seed):
        rank, n = kl.process_index(), kl.process_count()
        key = process_key(key_seed, rank)
        if self.parallel:
            x, y, key = share(x, rank, n), share(y, rank, n), kl.reshape(key, (1, 2))
        self.state, loss = self.train_step(self.state, x, y, key)
        return float(loss)

    def whole(self):
        return self.state


class Zero:
    """ZeRO stage 1-3 over the processes ("dp"): this process holds its pieces of the optimiser
    state and the whole weights, or at stage 3 its pieces of them, each leaf with a leading
    axis of 1 as pmap takes per-process values."""

    sharded = True

    def __init__(self, state, opt, args, dtype):
        rank, n = kl.process_index(), kl.process_count()
        self.zero = kl.optim.Zero(opt, args.zero, "dp", kl.optim.ShardLayout(state.model, n))
        self.train_step = make_zero_step(self.zero, state.model, args.accum, args.dropout, dtype)
        self.sharded_weights = args.zero == 3

        def whole(params, s):
            if self.sharded_weights:
                params = kl.optim.gather(params, self.zero.layout, "dp")
            return TrainState(params, self.zero.gather_state(s))

        self.gather = kl.pmap(whole, axis_name="dp")
        params = state.model
        if self.sharded_weights:
            params = kl.optim.shard(state.model, self.zero.layout, rank)
        self.model = per_process(params)
        self.opt = per_process(self.zero.shard_state(state.optimizer, rank))

    def step(self, x, y, key_seed):
        rank, n = kl.process_index(), kl.process_count()
        key = kl.reshape(process_key(key_seed, rank), (1, 2))
        x, y = share(x, rank, n), share(y, rank, n)
        self.model, self.opt, loss = self.train_step(self.model, self.opt, x, y, key)
        return float(loss[0])

    def whole(self):
        return first_of(self.gather(self.model, self.opt))

    def pieces(self):
        """The step (process 0), the model (its pieces, or process 0 the whole), the slots'
        pieces, as gpt.cpp writes them."""
        rank, replicas = kl.process_index(), kl.Mesh({"processes": kl.process_count()})
        o, m = first_of(self.opt), first_of(self.model)
        out = step_pieces(o.step)
        if self.sharded_weights:
            out += kl.io.zero_pieces(m, self.zero.layout, rank, "model.")
        else:
            out += kl.io.block_pieces(m, kl.spec(), replicas, "model.")
        for name, slot in o.slots.items():
            out += kl.io.zero_pieces(slot, self.zero.layout, rank, f"optimizer.slots.{name}.")
        return out


class TensorParallel:
    """Megatron's layout over the mesh's "model" axis, data parallelism over its "data" axis:
    this process holds its blocks of the model and of AdamW's moments. The step differentiates
    the whole shard_map and clips by the norm over every process's blocks, then updates the
    blocks. Dropout takes the one-process run's masks, each process its blocks of them."""

    sharded = True

    def __init__(self, state, schedule, args, dtype):
        self.mesh = mesh = kl.Mesh(args.mesh)
        parts, data = mesh.size("model"), mesh.size("data")
        specs = parallel_specs(state.model, "model")
        opt_specs = [kl.spec()] + specs * len(state.optimizer.slots)
        split = [any("model" in d for d in s.dims) for s in specs]
        accum, rate, layers = args.accum, args.dropout, args.layers
        mask_specs = dropout_specs(layers) * accum if rate > 0 else []

        def loss_of_blocks(p, x, y, masks):
            pc = cast(p, dtype)
            total = None
            for i in range(accum):
                m = masks[i] if rate > 0 else None
                part = parallel_loss(pc, x[i], y[i], "model", rate, m)
                total = part if total is None else total + part
            if accum > 1:
                total = total * (1.0 / accum)
            return kl.pmean(total, "data")

        rows = kl.spec(None, "data")
        loss_of_blocks = kl.shard_map(
            loss_of_blocks, mesh, in_specs=(specs, rows, rows, mask_specs), out_specs=kl.spec()
        )

        def squares(g):
            """The sum of squares of the whole gradient: a split leaf's blocks add up over the
            model axis, a replicated one counts once."""
            parted, whole = kl.zeros(()), kl.zeros(())
            for leaf, is_split in zip(kl.tree.flatten(g)[0], split):
                term = kl.sum(kl.square(kl.astype(leaf, kl.float32)))
                if is_split:
                    parted = parted + term
                else:
                    whole = whole + term
            return kl.psum(parted, "model") + whole

        squares = kl.shard_map(squares, mesh, in_specs=(specs,), out_specs=kl.spec())
        # AdamW without its clipping, which needs every process's blocks.
        adamw = kl.optim.adamw(schedule, weight_decay=args.weight_decay, decay_on="matrices")
        clip = args.clip

        def step(p, o, x, y, key):
            masks = []
            if rate > 0:  # the one-process run's masks for the whole batch, this process's blocks
                keys = kl.random.split(key, accum)
                b, t = x.shape[1] * data, x.shape[2]
                each = dropout_specs(layers)
                for i in range(accum):
                    drawn = dropout_masks(keys[i], rate, b, t, layers, args.heads, args.d_model)
                    leaves, structure = kl.tree.flatten(drawn)
                    blocks = [kl.local_block(m, mesh, s) for m, s in zip(leaves, each)]
                    masks.append(kl.tree.unflatten(structure, blocks))
            total, g = kl.value_and_grad(lambda q: loss_of_blocks(q, x, y, masks))(p)
            # torch.nn.utils.clip_grad_norm_'s factor, as optim's clipping.
            coef = kl.minimum(clip / (kl.sqrt(squares(g)) + 1e-6), 1.0)
            g = kl.tree.map(lambda t: t * kl.astype(coef, t.dtype), g)
            model, nxt = adamw.update(p, g, o)
            return model, nxt, total

        self.train_step = kl.jit(step)

        def whole(p, o):
            slots = {k: parallel_whole(v, "model", parts) for k, v in o.slots.items()}
            return TrainState(parallel_whole(p, "model", parts), kl.optim.OptState(o.step, slots))

        self.gather = kl.shard_map(whole, mesh, in_specs=(specs, opt_specs), out_specs=kl.spec())
        self.blocks = parallel_blocks(state.model, mesh, "model")
        slots = {k: parallel_blocks(v, mesh, "model") for k, v in state.optimizer.slots.items()}
        self.opt = kl.optim.OptState(state.optimizer.step, slots)

    def step(self, x, y, key_seed):
        rows = kl.spec(None, "data")
        x, y = kl.local_block(x, self.mesh, rows), kl.local_block(y, self.mesh, rows)
        self.blocks, self.opt, loss = self.train_step(
            self.blocks, self.opt, x, y, process_key(key_seed, 0)
        )
        return float(loss)

    def whole(self):
        return self.gather(self.blocks, self.opt)

    def pieces(self):
        """The step (process 0), then the model's and each slot's blocks."""
        out = step_pieces(self.opt.step)
        out += parallel_pieces(self.blocks, self.mesh, "model", "model.")
        for name, slot in self.opt.slots.items():
            out += parallel_pieces(slot, self.mesh, "model", f"optimizer.slots.{name}.")
        return out


@dataclasses.dataclass
class KvCache:
    """Each layer's keys and values, [B, heads, block_size, C / heads], in fixed-size buffers."""

    k: list
    v: list


def empty_cache(m, b):
    s, c = m.transformer.wpe.weight.shape
    ks = [kl.zeros((b, blk.attn.heads, s, c // blk.attn.heads)) for blk in m.transformer.h]
    return KvCache(ks, [kl.zeros(k.shape) for k in ks])


def decode_step(m, cache, token, pos, span=None):
    """The logits [B, 256] after one more token per sequence (token [B] at position pos), and
    the cache with its keys and values written at pos (gpt_model.h's decode_step). It reads the
    cache's first `span` positions (pos < span), the whole block by default."""
    t = m.transformer
    b = token.shape[0]
    s, c = t.wpe.weight.shape
    span = s if span is None else span
    if not 1 <= span <= s:
        raise ValueError(
            f"decode_step: span out of range: got {span}, expected 1 to the block size {s}"
        )
    x = t.wte(kl.reshape(token, (b, 1))) + t.wpe(kl.reshape(pos, (1,)))
    seen = kl.reshape(kl.less_equal(kl.arange(span), pos), (1, 1, 1, span))
    ks, vs = list(cache.k), list(cache.v)
    for i, blk in enumerate(t.h):
        h = blk.attn.heads
        q, k, v = kl.split(blk.attn.c_attn(blk.ln_1(x)), 3, 2)

        def heads(z):
            return kl.swapaxes(kl.reshape(z, (b, 1, h, c // h)), 1, 2)

        ks[i] = kl.dynamic_update_slice(ks[i], heads(k), (0, 0, pos, 0))
        vs[i] = kl.dynamic_update_slice(vs[i], heads(v), (0, 0, pos, 0))
        y = kl.nn.scaled_dot_product_attention(
            heads(q), ks[i][:, :, :span], vs[i][:, :, :span], attn_mask=seen
        )
        x = x + blk.attn.c_proj(kl.reshape(kl.swapaxes(y, 1, 2), (b, 1, c)))
        x = x + blk.mlp.c_proj(kl.nn.gelu(blk.mlp.c_fc(blk.ln_2(x)), approximate=True))
    return kl.reshape(kl.matmul(t.ln_f(x), kl.transpose(t.wte.weight)), (b, -1)), KvCache(ks, vs)


def pick(logits, temperature, top_k, key):
    """One token per row of logits: the most likely at temperature 0, else drawn from
    softmax(logits / temperature) over the top_k most likely (all when top_k is 0)."""
    if temperature == 0:
        return kl.argmax(logits, -1)
    z = logits / temperature
    if 0 < top_k < z.shape[1]:
        kth = kl.top_k(z, top_k)[0][:, top_k - 1 : top_k]
        z = kl.where(kl.less(z, kth), kl.full_like(z, -math.inf), z)
    return kl.random.categorical(key, z, -1)


FIRST_GENERATION_SPAN = 64  # the first compiled loop's positions (gpt_model.h's)


def generate_tokens(m, prompt, n, temperature, top_k, key):
    """The prompt [B, P] (int64) and n generated tokens, [B, P + n] (P + n at most the block
    size): the prompt fills the cache a token at a time, then each new token is picked from the
    logits of the one before, in a fori_loop per span of positions that reads the cache up to
    the span's end, the spans ending at FIRST_GENERATION_SPAN, twice that, four times, ...
    (gpt_model.h's generate)."""
    b, p = prompt.shape
    total = p + n
    keys = kl.random.split(key, max(total, 1))
    tokens = kl.concatenate([prompt, kl.zeros((b, n), kl.int64)], 1)

    def step(i, carry, span):
        toks, cache = carry
        token = kl.reshape(kl.dynamic_slice(toks, (0, i), (b, 1)), (b,))
        logits, cache = decode_step(m, cache, token, i, span)
        k = kl.reshape(kl.dynamic_slice(keys, (i, 0), (1, 2)), (2,))
        picked = kl.reshape(pick(logits, temperature, top_k, k), (b, 1))
        given = kl.dynamic_slice(toks, (0, i + 1), (b, 1))  # within the prompt: its own
        chosen = kl.where(kl.less(i + 1, p), given, picked)
        return kl.dynamic_update_slice(toks, chosen, (0, i + 1)), cache

    carry = (tokens, empty_cache(m, b))
    start, end = 0, FIRST_GENERATION_SPAN
    while start < total - 1:
        stop = min(end, total - 1)
        carry = kl.fori_loop(start, stop, lambda i, c, stop=stop: step(i, c, stop), carry)
        start, end = stop, end * 2
    return carry[0]


def generate(model, tokenizer, prompt, n, temperature=0.8, top_k=0, seed=0):
    """`prompt` (bytes) and n more tokens from the model, decoded, as gpt.cpp's sample_text:
    chunks of one compiled loop each; when the block is full, its last half is the next
    chunk's prompt."""
    block = model.transformer.wpe.weight.shape[0]
    text = tokenizer.encode(prompt or b"\n", 1).tolist()
    compiled = {}
    done, chunk = 0, 0
    while done < n:
        p = min(len(text), block - 1 if done == 0 else max(block // 2, 1))
        count = min(n - done, block - p)
        if count not in compiled:
            compiled[count] = kl.jit(
                lambda m, x, k, count=count: generate_tokens(m, x, count, temperature, top_k, k)
            )
        with np.errstate(over="ignore"):
            key = kl.random.key(int(mix(np.uint64(seed) + np.uint64(chunk))))
        out = np.asarray(compiled[count](model, kl.asarray(np.array([text[-p:]], np.int64)), key))
        text += [int(v) for v in out[0, -count:]]
        done, chunk = done + count, chunk + 1
    return tokenizer.decode(text)


def make_tokenizer(args, training_text, leader):
    """The run's tokenizer: the bytes, the checkpoint's BPE when resuming, else a BPE trained
    on the training text (gpt.cpp's make_tokenizer)."""
    if args.tokenizer == "bytes":
        return kl.data.BpeTokenizer()
    if args.resume:
        saved = saved_checkpoint(args.resume)
        path, meta = saved[0], metadata_of(saved)
        if "merges" not in meta:
            sys.exit(
                f"gpt: {path} holds no BPE merges: expected a checkpoint of a --tokenizer bpe run"
            )
        return kl.data.BpeTokenizer.parse(meta["merges"])
    start = time.perf_counter()
    t = kl.data.BpeTokenizer.train(training_text, args.vocab)
    if leader:
        print(
            f"BPE tokenizer: {t.vocab_size} tokens"
            + (" (no pair repeats beyond them)" if t.vocab_size < args.vocab else "")
            + f", trained on {len(training_text)} bytes in {time.perf_counter() - start:.2f} s"
        )
    return t


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    rank, processes = kl.process_index(), kl.process_count()
    leader = rank == 0  # process 0 prints and writes for all of them
    files = args.text or default_corpus()
    try:
        data = read_corpus(files)
    except ValueError as e:
        sys.exit(f"gpt: {e}")
    n_val = len(data) // 10
    tokenizer = make_tokenizer(args, data[: len(data) - n_val], leader)
    train_text, val_text = data[: len(data) - n_val], data[len(data) - n_val :]
    train, val = tokenizer.encode(train_text), tokenizer.encode(val_text)
    for name, split in (("training", train), ("validation", val)):
        if len(split) <= args.block_size + 1:
            sys.exit(
                f"gpt: --block-size {args.block_size} is larger than the {name} text "
                f"({len(split)} tokens of {len(files)} file(s), first {files[0]})"
            )
    bytes_per_token = len(val_text) / len(val)  # turns losses per token into bits per byte

    schedule = kl.optim.warmup_cosine_decay(
        0.0, args.lr, args.warmup, max(args.steps, args.warmup + 1), args.lr / 10
    )
    opt = kl.optim.adamw(
        schedule, weight_decay=args.weight_decay, decay_on="matrices", clip_norm=args.clip
    )
    key, vocab = kl.random.key(args.seed), tokenizer.vocab_size
    model = init(args.layers, args.heads, args.d_model, args.block_size, key, vocab)
    state = TrainState(model, opt.init(model))
    first = 0
    if args.resume:
        saved = saved_checkpoint(args.resume)
        state = load_state(saved, state)
        first = int(metadata_of(saved)["steps_done"])
        if leader:
            print(f"resumed from {saved[0]} after step {first}")

    accum, dp = args.accum, args.data_parallel
    dtype = kl.bfloat16 if args.dtype == "bf16" else kl.float32
    eval_loss = kl.jit(lambda m, x, y: loss(cast(m, dtype), x, y))
    add_up = kl.pmap(lambda v: kl.psum(v, axis_name="dp"), out_axes=None, axis_name="dp")
    b, t = args.batch_size, args.block_size
    flops = train_flops(args.layers, args.d_model, b * accum * t, t, vocab)
    peak = kl.machine_peak(kl.num_threads()).fma_gflops
    if dp or args.tensor_parallel:  # every process's peak added up
        peak = float(add_up(kl.asarray(np.array([peak], np.float64))))
    if leader:
        print(
            f"GPT on {len(data)} bytes of text ({len(files)} file(s)), "
            + (
                "byte tokens"
                if args.tokenizer == "bytes"
                else f"BPE of {vocab} tokens, {bytes_per_token:.2f} bytes per token"
            )
            + f": {args.layers} layers, {args.heads} heads, d_model {args.d_model}, block {t}, "
            f"{kl.nn.parameter_count(state.model)} parameters, {args.dtype}; {args.steps} steps "
            f"of {b * accum} x {t} tokens"
            + (f", data-parallel on {processes} processes" if dp else "")
            + (f", ZeRO stage {args.zero}" if args.zero else "")
            + (
                f", tensor-parallel on the mesh {{data: {args.mesh[0][1]}, model: "
                f"{args.mesh[1][1]}}}"
                if args.tensor_parallel
                else ""
            )
            + f"; {flops * 1e-9:.2f} GFLOP a step; FMA peak {peak:.0f} GFLOP/s"
        )
        os.makedirs(args.out, exist_ok=True)
    # The state's layout over the processes, from the whole state.
    if args.tensor_parallel:
        if vocab % args.mesh[1][1]:
            sys.exit(
                f"gpt: --tensor-parallel splits the vocabulary of {vocab} tokens over "
                f"model={args.mesh[1][1]}: expected a multiple of it"
            )
        layout = TensorParallel(state, schedule, args, dtype)
    elif args.zero:
        layout = Zero(state, opt, args, dtype)
    else:
        layout = Replicated(state, opt, args, dtype)
    state = None  # the layout holds it; the whole state is gathered when needed
    last = max(first, min(args.stop_after, args.steps) if args.stop_after > 0 else args.steps)
    loss_sum, losses, since, steps_since = 0.0, 0, time.perf_counter(), 0
    rows = read_metrics(os.path.join(args.resume, "metrics.csv"), first) if args.resume else []
    for step in range(first, last):
        x, y = windows(train, accum, b, t, args.seed, 0, step)
        step_loss = layout.step(x, y, mix(np.uint64(args.seed) ^ np.uint64(step)))
        loss_sum, losses, steps_since = loss_sum + step_loss, losses + 1, steps_since + 1
        if (step + 1) % args.eval_every and step + 1 != last:
            continue
        seconds = time.perf_counter() - since
        state = layout.whole()
        vx, vy = windows(val, args.eval_batches, b, t, args.seed, 1, 0)
        if dp:
            vx, vy = share(vx, rank, processes)[0], share(vy, rank, processes)[0]
        val_loss = sum(
            float(eval_loss(state.model, vx[i], vy[i])) for i in range(args.eval_batches)
        )
        val_loss /= args.eval_batches
        if dp:
            val_loss = float(add_up(kl.asarray(np.array([val_loss]))) / processes)
        mfu = flops * steps_since / seconds * 1e-9 / peak
        lr = float(np.asarray(schedule(step)))
        rows.append(
            (step + 1, loss_sum / losses, val_loss, lr, steps_since * b * accum * t / seconds, mfu)
        )
        meta = settings(args)
        meta["steps_done"] = str(step + 1)
        if args.tokenizer == "bpe":
            meta["merges"] = tokenizer.to_string()
        # One format per directory: a checkpoint of the other kind, from another run, would
        # otherwise be resumed if it held a later step.
        whole, pieces = os.path.join(args.out, "checkpoint.safetensors"), os.path.join(
            args.out, "checkpoint"
        )
        if layout.sharded:
            kl.io.save_sharded(pieces, step + 1, layout.pieces, meta)
        if leader:
            if layout.sharded:
                if os.path.exists(whole):
                    os.remove(whole)
            else:
                kl.io.save(whole, state, metadata=meta)
                shutil.rmtree(pieces, ignore_errors=True)
            write_metrics(os.path.join(args.out, "metrics.csv"), rows)
            print(
                f"step {step + 1}: train loss {loss_sum / losses:.4f} | validation loss "
                f"{val_loss:.4f} | {rows[-1][4]:.0f} tok/s | MFU {100 * mfu:.1f}%",
                flush=True,
            )
        state = None
        loss_sum, losses, steps_since, since = 0.0, 0, 0, time.perf_counter()

    state = layout.whole()
    if not leader:
        return rows
    if args.sample > 0:
        start = time.perf_counter()
        text = generate(
            state.model,
            tokenizer,
            args.prompt.encode(),
            args.sample,
            args.temperature,
            args.top_k,
            args.seed,
        )
        rate = args.sample / (time.perf_counter() - start)
        print(
            f"---- sample ({args.sample} tokens in {args.sample / rate:.2f} s with compiling, "
            f"{rate:.0f} tokens/s; temperature {args.temperature:g}"
            + (f", top-k {args.top_k}" if args.top_k > 0 else "")
            + ") ----"
        )
        sys.stdout.flush()
        sys.stdout.buffer.write(text)  # the bytes as sampled, as gpt.cpp writes them
        sys.stdout.buffer.flush()
        print("\n----")
    if rows:
        print(
            f"done after {rows[-1][0]} of {args.steps} steps: validation loss {rows[-1][2]:.4f} "
            f"({rows[-1][2] / bytes_per_token / math.log(2):.3f} bits per byte)"
        )
    return rows


if __name__ == "__main__":
    main()
