"""numpy 1.24's array2string(separator=", ") for the printing tests (tests/test_printing.cpp).

Each case stores its input ("<case>/x"), its print options ("<case>/options": precision,
threshold, edgeitems, linewidth, suppress) and numpy's text as UTF-8 bytes ("<case>/text").
"""
import sys

import numpy as np

import reference_file

rng = np.random.default_rng(15)
out = {}


def case(name, x, precision=8, threshold=1000, edgeitems=3, linewidth=75, suppress=False):
    x = np.asarray(x)
    text = np.array2string(
        x,
        separator=", ",
        precision=precision,
        threshold=threshold,
        edgeitems=edgeitems,
        max_line_width=linewidth,
        suppress_small=suppress,
    )
    out[name + "/x"] = x
    out[name + "/options"] = np.array(
        [precision, threshold, edgeitems, linewidth, suppress], dtype=np.float64
    )
    out[name + "/text"] = np.frombuffer(text.encode(), dtype=np.uint8)


normal = rng.standard_normal(24)
case("f64_vector", normal)
case("f32_vector", normal.astype(np.float32))
case("f16_vector", normal.astype(np.float16))
case("f64_matrix", normal.reshape(4, 6) * 10)
case("f32_cube", normal.reshape(2, 3, 4).astype(np.float32))
case("whole_floats", np.array([1.0, -2.0, 30.0]))
case("mixed_lengths", np.array([1.5, 2.25, -100.125]))
case("round_to_precision", np.array([0.1 + 0.2, 1 / 3, 2 / 3]))
case("ties_to_even", np.array([0.125, 0.375, 2.5]), precision=2)
case("precision_0", np.array([0.5, 1.5, 2.7, -3.2]), precision=0)
case("precision_3", normal[:6] * 1000, precision=3)
case("small_values", np.array([1e-5, 1.0, 3.5]))
case("large_values", np.array([1e8, 1.0, -2.5e-3]))
case("wide_ratio", np.array([1.0, 1234.5]))
case("f32_scientific", np.array([0.1, 1e8, 3e-7], dtype=np.float32))
case("big_exponent", np.array([1e200, -1e-200, 0.0]))
case("suppress", np.array([1e-10, 1.0, 123.25]), suppress=True)
case("specials", np.array([np.nan, 1.5, -np.inf, np.inf]))
case("only_specials", np.array([np.nan, np.inf]))
case("specials_scientific", np.array([np.nan, 1e-9, -np.inf]))
case("signed_zeros", np.array([-0.0, 0.0, 1.0]))
case("zeros", np.zeros(3))
case("scalar", np.array(2.5))
case("scalar_f32_whole", np.array(1.0, dtype=np.float32))
case("scalar_tiny", np.array(1e-7))
case("f16_largest", np.array([65504, 1, 0.1], dtype=np.float16))
case("ints", np.array([1, -100, 7], dtype=np.int64))
case("int32_matrix", np.arange(-6, 6, dtype=np.int32).reshape(3, 4))
case("uint8", np.array([255, 0, 17], dtype=np.uint8))
case("int_wrap", np.arange(100, dtype=np.int64) * 37)
case("float_wrap", rng.standard_normal(30), linewidth=40)
case("narrow_lines", np.arange(12, dtype=np.int64).reshape(3, 4), linewidth=10)
case("width_1", np.arange(5, dtype=np.int64), linewidth=1)
case("summary_vector", np.arange(2000, dtype=np.int64))
case("summary_edgeitems", np.linspace(0, 1, 50), threshold=10, edgeitems=2)
case("summary_edgeitems_1", np.arange(20, dtype=np.int32), threshold=5, edgeitems=1)
case("summary_matrix", rng.standard_normal((40, 30)))
case(
    "summary_cube",
    np.arange(12 * 12 * 12, dtype=np.int64).reshape(12, 12, 12),
    threshold=100,
    edgeitems=2,
)
case("summary_only_long_axis", np.arange(2 * 600, dtype=np.int64).reshape(2, 600))
case("threshold_0", np.arange(7, dtype=np.int64), threshold=0)
case("rank_4", np.arange(16, dtype=np.int64).reshape(2, 2, 2, 2))
case("f16_scientific", np.array([1e-4, 1000, 0.5], dtype=np.float16))

# Every finite float16 on its own, and a sample of float32 and float64 scalars across magnitudes:
# the shortest-digits and rounding rules element by element. Texts are joined by "\n".
f16 = np.arange(0, 1 << 16, dtype=np.uint16).view(np.float16)
f16 = f16[np.isfinite(f16)]
f32 = (rng.standard_normal(3000) * 10.0 ** rng.integers(-12, 12, 3000)).astype(np.float32)
f64 = rng.standard_normal(3000) * 10.0 ** rng.integers(-12, 12, 3000)
for name, values in [("scalars_f16", f16), ("scalars_f32", f32), ("scalars_f64", f64)]:
    out[name + "/x"] = values
    text = "\n".join(np.array2string(np.asarray(v), separator=", ") for v in values)
    out[name + "/text"] = np.frombuffer(text.encode(), dtype=np.uint8)

reference_file.write(sys.argv[1], out)
