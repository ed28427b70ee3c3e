"""kiln.data.BpeTokenizer against a reference written here with Python's re and collections:
GPT-2's pre-tokenization pattern on bytes (every byte >= 0x80 a letter, as Kiln documents),
chunks cut into 128-byte pieces, and brute-force BPE training (all pairs recounted after every
merge, the most frequent first, ties to the smallest pair)."""
import collections
import pathlib
import re

import numpy as np
import pytest

import kiln as kl

LETTER = rb"A-Za-z\x80-\xff"
PATTERN = re.compile(
    rb"'s|'t|'re|'ve|'m|'ll|'d"
    rb"| ?[" + LETTER + rb"]+| ?[0-9]+| ?[^\s" + LETTER + rb"0-9]+|\s+(?!\S)|\s+"
)
README = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_bytes()


def chunks(text):
    out = []
    for m in PATTERN.finditer(text):
        c = m.group()
        out += [c[i : i + 128] for i in range(0, len(c), 128)]
    return out


def merge_word(word, pair, new):
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(new)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def reference_train(text, vocab_size):
    words = collections.Counter(tuple(c) for c in chunks(text))
    merges = []
    while 256 + len(merges) < vocab_size:
        pairs = collections.Counter()
        for w, n in words.items():
            for p in zip(w, w[1:]):
                pairs[p] += n
        if not pairs:
            break
        most = max(pairs.values())
        if most < 2:
            break
        best = min(p for p, n in pairs.items() if n == most)
        new = 256 + len(merges)
        merges.append(best)
        merged = collections.Counter()
        for w, n in words.items():
            merged[merge_word(w, best, new)] += n
        words = merged
    return merges


def reference_encode(merges, text):
    ids = []
    for c in chunks(text):
        w = tuple(c)
        for r, pair in enumerate(merges):
            w = merge_word(w, pair, 256 + r)
        ids += w
    return ids


def test_pattern_reference_agrees_on_hand_worked_chunks():
    # The same splits as tests/test_tokenizer.cpp's, derived there by hand.
    assert chunks(b"Hello world's  end\n\nok 123!! x") == [
        b"Hello",
        b" world",
        b"'s",
        b" ",
        b" end",
        b"\n",
        b"\n",
        b"ok",
        b" 123",
        b"!!",
        b" x",
    ]


@pytest.mark.parametrize("vocab_size", [300, 700])
def test_training_and_encoding_match_the_reference(vocab_size):
    text = README[:20000]
    expected = reference_train(text, vocab_size)
    t = kl.data.BpeTokenizer.train(text, vocab_size)
    assert t.merges == expected
    assert t.vocab_size == 256 + len(expected)
    sample = README[20000:26000]  # text it was not trained on
    ids = t.encode(sample)
    assert ids.dtype == np.int32
    assert ids.tolist() == reference_encode(expected, sample)
    assert t.decode(ids) == sample


def test_any_bytes_round_trip_and_str_is_utf8():
    t = kl.data.BpeTokenizer.train(README[:8000], 400)
    rng = np.random.default_rng(0)
    for _ in range(20):
        b = rng.integers(0, 256, rng.integers(0, 300)).astype(np.uint8).tobytes()
        assert t.decode(t.encode(b)) == b
    s = "naïve café — ok"
    assert t.encode(s).tolist() == t.encode(s.encode()).tolist()
    assert t.decode(t.encode(s)).decode() == s


def test_saved_form_and_errors():
    t = kl.data.BpeTokenizer.train(README[:8000], 300)
    assert kl.data.BpeTokenizer.parse(t.to_string()) == t
    assert kl.data.BpeTokenizer(t.merges) == t
    assert t.token_bytes(256) == t.token_bytes(t.merges[0][0]) + t.token_bytes(t.merges[0][1])
    with pytest.raises(kl.Error, match=r"decode: id 1 is out of range: got 300"):
        t.decode([1, 300])
    with pytest.raises(kl.Error, match="bad vocabulary size: got 100"):
        kl.data.BpeTokenizer.train(b"abc", 100)
    with pytest.raises(kl.Error, match="line 3: bad token id"):
        kl.data.BpeTokenizer.parse("kiln-bpe 1\nmerges 1\n97 999\n")
    with pytest.raises(kl.Error, match="text must be bytes, bytearray or str: got int"):
        t.encode(5)
    assert t.encode(bytearray(b"the ok")).tolist() == t.encode(b"the ok").tolist()
    with pytest.raises(kl.Error, match="decode: ids must be integers: got float64"):
        t.decode(np.array([97.9]))
    assert t.decode([]) == b""
