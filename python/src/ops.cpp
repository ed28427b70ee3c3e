// The operations of Kiln's C++ API on kiln's top level, with numpy's and JAX's names and
// keyword arguments (docs/PYTHON.md, "Tensors, operations and interchange"), and kiln.linalg.
// Arguments are anything asarray takes; Python scalars next to a tensor are weakly typed.
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"

namespace kiln::python {
namespace {

using Unary = Tensor (*)(const Tensor&, Loc);
using Binary = Tensor (*)(const Tensor&, const Tensor&, Loc);
using Reduction = Tensor (*)(const Tensor&, const Axes&, bool, Loc);
using Scan = Tensor (*)(const Tensor&, std::optional<int64_t>, Loc);
using ArgReduction = Tensor (*)(const Tensor&, std::optional<int64_t>, bool, Loc);

Tensor arg(py::object v) { return to_tensor(v); }

std::optional<int64_t> optional_int(py::object v) {
  if (v.is_none()) return std::nullopt;
  return to_int(v);
}

std::vector<Tensor> tensors(py::object seq) {
  std::vector<Tensor> out;
  for (py::handle v : py::reinterpret_borrow<py::iterable>(seq)) out.push_back(to_tensor(v));
  return out;
}

py::tuple tuple_of(const std::vector<Tensor>& ts) {
  py::tuple out(ts.size());
  for (std::size_t i = 0; i < ts.size(); ++i) out[i] = py::cast(ts[i]);
  return out;
}

// An int or a sequence of `n` ints (PyTorch's int-or-tuple arguments).
template <std::size_t N>
std::array<int64_t, N> ints(py::object v, const char* op, const char* what) {
  std::array<int64_t, N> out{};
  if (is_int(v)) {
    out.fill(to_int(v));
    return out;
  }
  const Shape s = to_shape(v);
  if (static_cast<std::size_t>(s.rank()) != N)
    fail(op, what, " needs one int or ", N, " of them: got ", s.rank(), ", expected ", N);
  for (std::size_t i = 0; i < N; ++i) out[i] = s[static_cast<int>(i)];
  return out;
}
std::pair<int64_t, int64_t> pair(py::object v, const char* op, const char* what) {
  const auto a = ints<2>(v, op, what);
  return {a[0], a[1]};
}

// numpy's axis argument of a reduction: None reduces all axes, () none of them.
Tensor reduce(Reduction fn, const Tensor& x, py::object axis, bool keepdims) {
  const std::optional<Axes> axes = to_axes(axis);
  if (!axes) return fn(x, {}, keepdims, Loc{});
  // Kiln's empty axes mean all of them; numpy's () reduces over none (keeping the reduction's
  // dtype): a reduction over a new size-1 axis.
  if (axes->empty()) return fn(expand_dims(x, 0, Loc{}), {0}, false, Loc{});
  return fn(x, *axes, keepdims, Loc{});
}

PadMode pad_mode(const std::string& mode) {
  if (mode == "constant") return PadMode::constant;
  if (mode == "reflect") return PadMode::reflect;
  if (mode == "edge") return PadMode::edge;
  if (mode == "wrap") return PadMode::wrap;
  fail("pad", "unknown mode: got '", mode, "', expected constant, reflect, edge or wrap");
}

// numpy's pad_width: n, (before, after), or one (before, after) per axis.
std::vector<std::pair<int64_t, int64_t>> pad_widths(py::object v, int rank) {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (is_int(v)) {
    const int64_t n = to_int(v);
    return std::vector<std::pair<int64_t, int64_t>>(static_cast<std::size_t>(rank), {n, n});
  }
  py::sequence seq = py::reinterpret_borrow<py::sequence>(v);
  if (seq.size() == 2 && is_int(seq[0])) {
    const std::pair<int64_t, int64_t> w{to_int(seq[0]), to_int(seq[1])};
    return std::vector<std::pair<int64_t, int64_t>>(static_cast<std::size_t>(rank), w);
  }
  for (py::handle w : seq) {
    const Shape s = to_shape(w);
    if (s.rank() == 1) {
      out.push_back({s[0], s[0]});
    } else if (s.rank() == 2) {
      out.push_back({s[0], s[1]});
    } else {
      fail("pad", "a pad width is (before, after): got ", s.rank(), " values, expected 2");
    }
  }
  return out;
}

ScatterMode scatter_mode(const std::string& mode) {
  if (mode == "set") return ScatterMode::set;
  if (mode == "add") return ScatterMode::add;
  if (mode == "mul") return ScatterMode::mul;
  if (mode == "max") return ScatterMode::max;
  if (mode == "min") return ScatterMode::min;
  fail("scatter", "unknown mode: got '", mode, "', expected set, add, mul, max or min");
}

// The dtype of arange / full from its Python arguments when none is given (JAX's defaults).
DType default_dtype(std::initializer_list<py::handle> values) {
  DType d = int32;
  for (py::handle v : values) {
    if (v.is_none()) continue;
    if (const Tensor* t = tensor_ptr(v)) {
      d = promote_types(d, t->dtype());
    } else if (PyBool_Check(v.ptr())) {
      d = values.size() == 1 ? bool_ : d;
    } else if (PyFloat_Check(v.ptr())) {
      d = promote_types(d, float32);
    } else if (!is_int(v)) {
      d = promote_types(d, to_tensor(v).dtype());
    }
  }
  return d;
}

double to_double(py::object v) {
  if (const Tensor* t = tensor_ptr(v)) return t->item<double>(Loc{});
  return v.cast<double>();
}

void bind_elementwise(py::module_& m) {
  struct UnaryOp {
    const char* name;
    Unary fn;
    const char* doc;
  };
  const UnaryOp unary[] = {
      {"negative", &neg, "-x, elementwise."},
      {"abs", &kiln::abs, "|x|, elementwise."},
      {"sign", &sign, "-1, 0 or 1 by the sign of x (NaN stays NaN)."},
      {"exp", &kiln::exp, "e**x."},
      {"log", &kiln::log, "The natural logarithm."},
      {"log1p", &kiln::log1p, "log(1 + x), accurate near 0."},
      {"expm1", &kiln::expm1, "exp(x) - 1, accurate near 0."},
      {"sqrt", &kiln::sqrt, "The square root."},
      {"rsqrt", &rsqrt, "1 / sqrt(x)."},
      {"sin", &kiln::sin, "The sine."},
      {"cos", &kiln::cos, "The cosine."},
      {"tan", &kiln::tan, "The tangent."},
      {"tanh", &kiln::tanh, "The hyperbolic tangent."},
      {"sigmoid", &sigmoid, "1 / (1 + exp(-x))."},
      {"erf", &kiln::erf, "The error function."},
      {"floor", &kiln::floor, "Rounds down."},
      {"ceil", &kiln::ceil, "Rounds up."},
      {"square", &square, "x * x."},
      {"logical_not", &logical_not, "not x, elementwise (a bool result)."},
      {"isnan", &isnan, "True where x is NaN."},
      {"isinf", &isinf, "True where x is +inf or -inf."},
      {"isfinite", &isfinite, "True where x is neither NaN nor infinite."},
      {"trunc", &kiln::trunc, "Rounds towards 0."},
      {"log2", &kiln::log2, "The base-2 logarithm."},
      {"log10", &kiln::log10, "The base-10 logarithm."},
      {"exp2", &kiln::exp2, "2**x."},
      {"sinh", &kiln::sinh, "The hyperbolic sine."},
      {"cosh", &kiln::cosh, "The hyperbolic cosine."},
      {"arcsin", &kiln::asin, "The inverse sine (also kiln.asin)."},
      {"arccos", &kiln::acos, "The inverse cosine (also kiln.acos)."},
      {"arctan", &kiln::atan, "The inverse tangent (also kiln.atan)."},
      {"arcsinh", &kiln::asinh, "The inverse hyperbolic sine (also kiln.asinh)."},
      {"arccosh", &kiln::acosh, "The inverse hyperbolic cosine (also kiln.acosh)."},
      {"arctanh", &kiln::atanh, "The inverse hyperbolic tangent (also kiln.atanh)."},
      {"erfinv", &erfinv, "The inverse error function (NaN outside [-1, 1])."},
      {"erfc", &kiln::erfc, "1 - erf(x), accurate where erf(x) is near 1."},
      {"lgamma", &kiln::lgamma, "log|Gamma(x)| (also kiln.gammaln)."},
      {"digamma", &digamma, "The derivative of lgamma."},
      {"softplus", &softplus, "log(1 + exp(x)), stable for every x."},
      {"log_sigmoid", &log_sigmoid, "log(sigmoid(x)) = -softplus(-x)."},
      {"bitwise_not", &bitwise_not, "~x for integers and bools (also kiln.invert)."},
      {"ravel", &flatten, "x as a 1-d tensor (a view when x is contiguous)."},
      {"real", &real, "The real part (x itself for real x)."},
      {"imag", &imag, "The imaginary part (zeros for real x)."},
      {"conj", &conj, "The complex conjugate (x itself for real x; also kiln.conjugate)."},
      {"angle", &angle, "The argument atan2(imag, real), in (-pi, pi]."},
  };
  for (const UnaryOp& op : unary)
    m.def(
        op.name, [fn = op.fn](py::object x) { return fn(arg(x), Loc{}); }, py::arg("x"), op.doc);
  m.attr("neg") = m.attr("negative");
  m.attr("absolute") = m.attr("abs");
  m.attr("conjugate") = m.attr("conj");
  m.attr("asin") = m.attr("arcsin");
  m.attr("acos") = m.attr("arccos");
  m.attr("atan") = m.attr("arctan");
  m.attr("asinh") = m.attr("arcsinh");
  m.attr("acosh") = m.attr("arccosh");
  m.attr("atanh") = m.attr("arctanh");
  m.attr("gammaln") = m.attr("lgamma");
  m.attr("invert") = m.attr("bitwise_not");
  m.attr("flatten") = m.attr("ravel");

  struct BinaryOp {
    const char* name;
    Binary fn;
    const char* doc;
  };
  const BinaryOp binary[] = {
      {"add", &add, "x + y (broadcasting, promoting)."},
      {"subtract", &sub, "x - y."},
      {"multiply", &mul, "x * y."},
      {"divide", &true_divide,
       "x / y, Python's true division: integers divide as floats (also kiln.true_divide)."},
      {"floor_divide", &floor_divide, "x // y: the quotient rounded down."},
      {"remainder", &remainder, "x % y, with the sign of y, as Python's % (also kiln.mod)."},
      {"fmod", &fmod, "The remainder with the sign of x, as C's fmod."},
      {"power", &kiln::pow, "x ** y (also kiln.pow)."},
      {"maximum", &kiln::maximum, "The elementwise maximum (NaN propagates)."},
      {"minimum", &kiln::minimum, "The elementwise minimum (NaN propagates)."},
      {"equal", &equal, "x == y."},
      {"not_equal", &not_equal, "x != y."},
      {"less", &less, "x < y."},
      {"less_equal", &less_equal, "x <= y."},
      {"greater", &greater, "x > y."},
      {"greater_equal", &greater_equal, "x >= y."},
      {"logical_and", &logical_and, "x and y, elementwise."},
      {"logical_or", &logical_or, "x or y, elementwise."},
      {"logical_xor", &logical_xor, "x xor y, elementwise."},
      {"arctan2", &kiln::atan2, "The angle of the point (y=x, x=y) (also kiln.atan2)."},
      {"hypot", &kiln::hypot, "sqrt(x**2 + y**2) without overflow."},
      {"complex", &kiln::complex, "x + 1j * y (torch.complex): complex64, or complex128 for f64."},
      {"copysign", &kiln::copysign, "|x| with the sign of y."},
      {"logaddexp", &logaddexp, "log(exp(x) + exp(y)), stable."},
      {"xlogy", &xlogy, "x * log(y), 0 where x == 0 (scipy.special.xlogy)."},
      {"bitwise_and", &bitwise_and, "x & y (integers and bools)."},
      {"bitwise_or", &bitwise_or, "x | y (integers and bools)."},
      {"bitwise_xor", &bitwise_xor, "x ^ y (integers and bools)."},
      {"left_shift", &left_shift, "x << y (integers)."},
      {"right_shift", &right_shift, "x >> y (integers; arithmetic for signed ones)."},
      {"outer", &outer, "out[i, j] = x.ravel()[i] * y.ravel()[j]."},
      {"kron", &kron, "The Kronecker product."},
      {"dot", &dot, "numpy.dot: inner, matrix, or last-axis by second-to-last-axis product."},
  };
  for (const BinaryOp& op : binary)
    m.def(
        op.name,
        [fn = op.fn](py::object x, py::object y) {
          auto xy = operands(x, y);
          return fn(xy.first, xy.second, Loc{});
        },
        py::arg("x"), py::arg("y"), op.doc);
  m.def(
      "matmul",
      [](py::object x, py::object y) {
        auto xy = operands(x, y);
        return without_gil([&] { return matmul(xy.first, xy.second, Loc{}); });
      },
      py::arg("x"), py::arg("y"),
      "x @ y with numpy's rules: 1-d operands are promoted and the added axis removed; batch "
      "axes broadcast. Runs without the GIL.");
  m.attr("sub") = m.attr("subtract");
  m.attr("mul") = m.attr("multiply");
  m.attr("true_divide") = m.attr("divide");
  m.attr("mod") = m.attr("remainder");
  m.attr("pow") = m.attr("power");
  m.attr("atan2") = m.attr("arctan2");

  m.def(
      "round",
      [](py::object x, int decimals) {
        Tensor t = arg(x);
        if (decimals == 0) return kiln::round(t, Loc{});
        const double scale = std::pow(10.0, decimals);
        return div(kiln::round(mul(t, scalar_like(t, scale), Loc{}), Loc{}), scalar_like(t, scale),
                   Loc{});
      },
      py::arg("x"), py::arg("decimals") = 0,
      "Rounds half to even (numpy's rule) to `decimals` digits after the point.");
  m.def(
      "where",
      [](py::object condition, py::object x, py::object y) {
        auto xy = operands(x, y);
        return where(arg(condition), xy.first, xy.second, Loc{});
      },
      py::arg("condition"), py::arg("x"), py::arg("y"),
      "x where condition (bool) holds, else y; all three broadcast, x and y promote.");
  m.def(
      "clip",
      [](py::object x, py::object min, py::object max) {
        Tensor t = arg(x);
        if (!min.is_none() && !max.is_none())
          return clip(t, operand(min, t), operand(max, t), Loc{});
        if (!min.is_none()) return kiln::maximum(t, operand(min, t), Loc{});
        if (!max.is_none()) return kiln::minimum(t, operand(max, t), Loc{});
        return t;
      },
      py::arg("x"), py::arg("min") = py::none(), py::arg("max") = py::none(),
      "x limited to [min, max] (either may be None).");
  m.def(
      "astype",
      [](py::object x, py::object dtype) { return astype(arg(x), to_dtype(dtype), Loc{}); },
      py::arg("x"), py::arg("dtype"), "x converted to dtype.");
  const std::pair<const char*, Tensor (*)(const Tensor&, const Tensor&, const Closeness&, Loc)>
      closeness[] = {{"isclose", &isclose}, {"allclose", &allclose}};
  for (const auto& [name, fn] : closeness)
    m.def(
        name,
        [fn = fn](py::object a, py::object b, double rtol, double atol, bool equal_nan) {
          auto ab = operands(a, b);
          return fn(ab.first, ab.second, Closeness{rtol, atol, equal_nan}, Loc{});
        },
        py::arg("a"), py::arg("b"), py::arg("rtol") = 1e-5, py::arg("atol") = 1e-8,
        py::arg("equal_nan") = false,
        std::string(name) == "isclose"
            ? "|a - b| <= atol + rtol * |b| elementwise (numpy's rule; bool)."
            : "isclose(...) everywhere, as a 0-d bool tensor (JAX's allclose).");
  m.def(
      "polygamma", [](int64_t n, py::object x) { return polygamma(n, arg(x), Loc{}); },
      py::arg("n"), py::arg("x"), "The n-th derivative of digamma.");
  m.def(
      "nan_to_num",
      [](py::object x, double nan, std::optional<double> posinf, std::optional<double> neginf) {
        return nan_to_num(arg(x), NanToNum{nan, posinf, neginf}, Loc{});
      },
      py::arg("x"), py::arg("nan") = 0.0, py::arg("posinf") = py::none(),
      py::arg("neginf") = py::none(),
      "NaN, +inf and -inf replaced (by default: 0 and the dtype's largest and lowest values).");
}

void bind_reductions(py::module_& m) {
  struct ReductionOp {
    const char* name;
    Reduction fn;
    const char* doc;
  };
  const ReductionOp reductions[] = {
      {"sum", &sum, "The sum over `axis` (an int, a tuple, or None for all)."},
      {"mean", &mean, "The mean over `axis` (None: all); integers average in float32."},
      {"prod", &prod, "The product over `axis` (None: all)."},
      {"max", &kiln::max, "The maximum over `axis` (None: all); NaN propagates (also amax)."},
      {"min", &kiln::min, "The minimum over `axis` (None: all); NaN propagates (also amin)."},
      {"logsumexp", &logsumexp, "log(sum(exp(x))) over `axis`, stable."},
      {"nansum", &nansum, "The sum over `axis` ignoring NaNs (None: all)."},
      {"nanprod", &nanprod, "The product over `axis` ignoring NaNs (None: all)."},
      {"nanmean", &nanmean, "The mean over `axis` ignoring NaNs (None: all)."},
      {"nanmax", &nanmax, "The maximum over `axis` ignoring NaNs (NaN where all are NaN)."},
      {"nanmin", &nanmin, "The minimum over `axis` ignoring NaNs (NaN where all are NaN)."},
      {"any", &any, "True where any element over `axis` is non-zero."},
      {"all", &all, "True where every element over `axis` is non-zero."},
  };
  for (const ReductionOp& op : reductions)
    m.def(
        op.name,
        [fn = op.fn](py::object x, py::object axis, bool keepdims) {
          return reduce(fn, arg(x), axis, keepdims);
        },
        py::arg("x"), py::arg("axis") = py::none(), py::arg("keepdims") = false, op.doc);
  m.attr("amax") = m.attr("max");
  m.attr("amin") = m.attr("min");
  const std::pair<const char*, Tensor (*)(const Tensor&, const Axes&, bool, int64_t, Loc)>
      moments[] = {{"var", &var}, {"std", &kiln::std}, {"nanvar", &nanvar}, {"nanstd", &nanstd}};
  for (const auto& [name, fn] : moments)
    m.def(
        name,
        [fn = fn](py::object x, py::object axis, bool keepdims, int64_t ddof) {
          const Tensor t = arg(x);
          const std::optional<Axes> axes = to_axes(axis);
          if (axes && axes->empty()) return fn(expand_dims(t, 0, Loc{}), {0}, false, ddof, Loc{});
          return fn(t, axes.value_or(Axes{}), keepdims, ddof, Loc{});
        },
        py::arg("x"), py::arg("axis") = py::none(), py::arg("keepdims") = false,
        py::arg("ddof") = 0,
        std::string(name).ends_with("var")
            ? "The variance over `axis`, dividing by n - ddof (numpy's default ddof=0); "
              "nanvar leaves NaNs out."
            : "The standard deviation: sqrt of var (nanstd: of nanvar).");

  const std::pair<const char*, ArgReduction> args[] = {{"argmax", &argmax}, {"argmin", &argmin}};
  for (const auto& [name, fn] : args)
    m.def(
        name,
        [fn = fn](py::object x, py::object axis, bool keepdims) {
          return fn(arg(x), optional_int(axis), keepdims, Loc{});
        },
        py::arg("x"), py::arg("axis") = py::none(), py::arg("keepdims") = false,
        "The (int64) index of the first extreme value along `axis` (None: of the flattened x).");
  struct ScanOp {
    const char* name;
    Scan fn;
    const char* doc;
  };
  const ScanOp scans[] = {
      {"cumsum", &cumsum, "Running sums along `axis` (None: of the flattened x)."},
      {"cumprod", &cumprod, "Running products along `axis` (None: of the flattened x)."},
      {"cummax", &cummax, "Running maxima along `axis` (None: of the flattened x)."},
      {"cummin", &cummin, "Running minima along `axis` (None: of the flattened x)."},
      {"cumlogsumexp", &cumlogsumexp, "Running logsumexp along `axis` (None: flattened)."},
  };
  for (const ScanOp& op : scans)
    m.def(
        op.name,
        [fn = op.fn](py::object x, py::object axis) {
          return fn(arg(x), optional_int(axis), Loc{});
        },
        py::arg("x"), py::arg("axis") = py::none(), op.doc);
  m.attr("logcumsumexp") = m.attr("cumlogsumexp");
  m.def(
      "unique",
      [](py::object x, bool return_inverse, bool return_counts, std::optional<int64_t> size,
         std::optional<double> fill_value) -> py::object {
        const Tensor t = arg(x);
        if (!return_inverse && !return_counts) return py::cast(unique(t, size, fill_value, Loc{}));
        const UniqueResult r = unique_all(t, size, fill_value, Loc{});
        py::list out;
        out.append(r.values);
        if (return_inverse) out.append(r.inverse);
        if (return_counts) out.append(r.counts);
        return py::tuple(out);
      },
      py::arg("x"), py::arg("return_inverse") = false, py::arg("return_counts") = false,
      py::kw_only(), py::arg("size") = py::none(), py::arg("fill_value") = py::none(),
      "The sorted distinct values of the flattened x (numpy.unique); inside jit give `size` "
      "(padded with fill_value, default the minimum, as jnp.unique(size=)).");
  m.def(
      "softmax", [](py::object x, int64_t axis) { return softmax(arg(x), axis, Loc{}); },
      py::arg("x"), py::arg("axis") = -1, "exp(x) normalised to sum to 1 along `axis`.");
  m.def(
      "log_softmax", [](py::object x, int64_t axis) { return log_softmax(arg(x), axis, Loc{}); },
      py::arg("x"), py::arg("axis") = -1, "log(softmax(x, axis)), stable.");
  m.def(
      "quantile",
      [](py::object x, double q, py::object axis, bool keepdims) {
        return quantile(arg(x), q, optional_int(axis), keepdims, Loc{});
      },
      py::arg("x"), py::arg("q"), py::arg("axis") = py::none(), py::arg("keepdims") = false,
      "numpy's (linear) quantile q in [0, 1] along `axis` (None: of all of x).");
  m.def(
      "median",
      [](py::object x, py::object axis, bool keepdims) {
        return median(arg(x), optional_int(axis), keepdims, Loc{});
      },
      py::arg("x"), py::arg("axis") = py::none(), py::arg("keepdims") = false,
      "The median along `axis` (None: of all of x).");
  m.def(
      "sort",
      [](py::object x, int64_t axis, bool descending) {
        return sort(arg(x), axis, descending, Loc{});
      },
      py::arg("x"), py::arg("axis") = -1, py::arg("descending") = false,
      "A stable sort along `axis`, NaN last (first when descending).");
  m.def(
      "argsort",
      [](py::object x, int64_t axis, bool descending) {
        return argsort(arg(x), axis, descending, Loc{});
      },
      py::arg("x"), py::arg("axis") = -1, py::arg("descending") = false,
      "The (int64) indices that sort x along `axis` (stable).");
  m.def(
      "top_k",
      [](py::object x, int64_t k) {
        SortResult r = top_k(arg(x), k, Loc{});
        return py::make_tuple(r.values, r.indices);
      },
      py::arg("x"), py::arg("k"),
      "(values, indices) of the k largest along the last axis, largest first.");
  m.def(
      "searchsorted",
      [](py::object sorted, py::object values, const std::string& side) {
        if (side != "left" && side != "right")
          fail("searchsorted", "unknown side: got '", side, "', expected 'left' or 'right'");
        return searchsorted(arg(sorted), arg(values), side == "left" ? Side::left : Side::right,
                            Loc{});
      },
      py::arg("a"), py::arg("v"), py::arg("side") = "left",
      "Where each of v would be inserted into the ascending 1-d a (numpy.searchsorted).");
}

void bind_creation(py::module_& m) {
  m.def(
      "zeros",
      [](py::object shape, py::object dtype) {
        return zeros(to_shape(shape), to_optional_dtype(dtype).value_or(float32));
      },
      py::arg("shape"), py::arg("dtype") = py::none(), "Zeros of `shape` (an int or a tuple).");
  m.def(
      "ones",
      [](py::object shape, py::object dtype) {
        return ones(to_shape(shape), to_optional_dtype(dtype).value_or(float32));
      },
      py::arg("shape"), py::arg("dtype") = py::none(), "Ones of `shape` (an int or a tuple).");
  m.def(
      "empty",
      [](py::object shape, py::object dtype) {
        return empty(to_shape(shape), to_optional_dtype(dtype).value_or(float32));
      },
      py::arg("shape"), py::arg("dtype") = py::none(), "An uninitialised tensor of `shape`.");
  m.def(
      "full",
      [](py::object shape, py::object fill_value, py::object dtype) {
        const DType d = to_optional_dtype(dtype).value_or(default_dtype({fill_value}));
        if (!PyFloat_Check(fill_value.ptr()) && !PyLong_Check(fill_value.ptr()))
          return broadcast_to(to_tensor(fill_value, d), to_shape(shape), Loc{}).contiguous();
        return full(to_shape(shape), to_double(fill_value), d);
      },
      py::arg("shape"), py::arg("fill_value"), py::arg("dtype") = py::none(),
      "`fill_value` (broadcast) in a tensor of `shape`; dtype defaults to the value's (a "
      "Python float: float32, an int: int32).");
  m.def(
      "zeros_like",
      [](py::object x, py::object dtype) {
        const Tensor t = arg(x);
        return zeros(t.shape(), to_optional_dtype(dtype).value_or(t.dtype()));
      },
      py::arg("x"), py::arg("dtype") = py::none(), "Zeros of x's shape and dtype.");
  m.def(
      "ones_like",
      [](py::object x, py::object dtype) {
        const Tensor t = arg(x);
        return ones(t.shape(), to_optional_dtype(dtype).value_or(t.dtype()));
      },
      py::arg("x"), py::arg("dtype") = py::none(), "Ones of x's shape and dtype.");
  m.def(
      "full_like",
      [](py::object x, double fill_value, py::object dtype) {
        const Tensor t = arg(x);
        return full(t.shape(), fill_value, to_optional_dtype(dtype).value_or(t.dtype()));
      },
      py::arg("x"), py::arg("fill_value"), py::arg("dtype") = py::none(),
      "fill_value in x's shape and dtype.");
  m.def(
      "arange",
      [](py::object start, py::object stop, py::object step, py::object dtype) {
        const DType d = to_optional_dtype(dtype).value_or(default_dtype({start, stop, step}));
        if (stop.is_none()) return arange(0.0, to_double(start), 1.0, d, Loc{});
        return arange(to_double(start), to_double(stop), step.is_none() ? 1.0 : to_double(step), d,
                      Loc{});
      },
      py::arg("start"), py::arg("stop") = py::none(), py::arg("step") = py::none(),
      py::arg("dtype") = py::none(),
      "start, start + step, ... below stop; arange(n) is 0..n-1. Integers give int32, floats "
      "float32 (JAX's defaults).");
  m.def(
      "linspace",
      [](double start, double stop, int64_t num, py::object dtype) {
        return linspace(start, stop, num, to_optional_dtype(dtype).value_or(float32), Loc{});
      },
      py::arg("start"), py::arg("stop"), py::arg("num") = 50, py::arg("dtype") = py::none(),
      "num evenly spaced values from start to stop, both included.");
  m.def(
      "eye",
      [](int64_t n, std::optional<int64_t> m_, py::object dtype) {
        return eye(n, m_.value_or(n), to_optional_dtype(dtype).value_or(float32));
      },
      py::arg("N"), py::arg("M") = py::none(), py::arg("dtype") = py::none(),
      "The N x M identity matrix (M defaults to N).");
}

void bind_shapes(py::module_& m) {
  m.def(
      "reshape",
      [](py::object x, py::object shape) { return reshape(arg(x), to_shape(shape), Loc{}); },
      py::arg("x"), py::arg("shape"),
      "x with a new shape (one size may be -1); a view when x is contiguous.");
  m.def(
      "transpose",
      [](py::object x, py::object axes) {
        if (axes.is_none()) return transpose(arg(x), Loc{});
        return transpose(arg(x), to_shape(axes).dims(), Loc{});
      },
      py::arg("x"), py::arg("axes") = py::none(),
      "The axes permuted by `axes`, or reversed (None). A view.");
  m.def(
      "swapaxes", [](py::object x, int64_t a, int64_t b) { return swapaxes(arg(x), a, b, Loc{}); },
      py::arg("x"), py::arg("axis1"), py::arg("axis2"), "Two axes exchanged. A view.");
  m.def(
      "moveaxis",
      [](py::object x, int64_t source, int64_t destination) {
        return moveaxis(arg(x), source, destination, Loc{});
      },
      py::arg("x"), py::arg("source"), py::arg("destination"),
      "One axis moved to a new position. A view.");
  m.def(
      "broadcast_to",
      [](py::object x, py::object shape) { return broadcast_to(arg(x), to_shape(shape), Loc{}); },
      py::arg("x"), py::arg("shape"), "x broadcast to `shape` (numpy's rules). A view.");
  m.def(
      "expand_dims",
      [](py::object x, py::object axis) {
        Tensor t = arg(x);
        Axes axes = to_shape(axis).dims();
        const int64_t rank = t.rank() + static_cast<int64_t>(axes.size());
        for (int64_t& a : axes) a = a < 0 ? a + rank : a;
        std::sort(axes.begin(), axes.end());
        for (int64_t a : axes) t = expand_dims(t, a, Loc{});
        return t;
      },
      py::arg("x"), py::arg("axis"), "New size-1 axes at `axis` (an int or a tuple).");
  m.def(
      "squeeze",
      [](py::object x, py::object axis) {
        return squeeze(arg(x), to_axes(axis).value_or(Axes{}), Loc{});
      },
      py::arg("x"), py::arg("axis") = py::none(), "Size-1 axes removed (`axis`, or all).");
  m.def(
      "concatenate",
      [](py::object arrays, int64_t axis) { return concatenate(tensors(arrays), axis, Loc{}); },
      py::arg("arrays"), py::arg("axis") = 0, "The tensors joined along an existing axis.");
  m.def(
      "stack", [](py::object arrays, int64_t axis) { return stack(tensors(arrays), axis, Loc{}); },
      py::arg("arrays"), py::arg("axis") = 0, "The tensors joined along a new axis.");
  m.def(
      "split",
      [](py::object x, py::object indices_or_sections, int64_t axis) {
        const Tensor t = arg(x);
        if (is_int(indices_or_sections))
          return py::list(py::cast(split(t, to_int(indices_or_sections), axis, Loc{})));
        return py::list(py::cast(split(t, to_shape(indices_or_sections).dims(), axis, Loc{})));
      },
      py::arg("x"), py::arg("indices_or_sections"), py::arg("axis") = 0,
      "A list of parts: `n` equal ones, or split at the given indices.");
  m.def(
      "flip",
      [](py::object x, py::object axis) {
        return flip(arg(x), to_axes(axis).value_or(Axes{}), Loc{});
      },
      py::arg("x"), py::arg("axis") = py::none(), "The order reversed along `axis` (None: all).");
  m.def(
      "pad",
      [](py::object x, py::object pad_width, const std::string& mode, double constant_values) {
        const Tensor t = arg(x);
        return pad(t, pad_widths(pad_width, t.rank()), pad_mode(mode), constant_values, Loc{});
      },
      py::arg("x"), py::arg("pad_width"), py::arg("mode") = "constant",
      py::arg("constant_values") = 0.0,
      "numpy.pad: widths n, (before, after), or one pair per axis; mode constant, reflect, "
      "edge or wrap.");
  m.def(
      "take",
      [](py::object x, py::object indices, py::object axis) {
        const Tensor t = arg(x);
        if (axis.is_none()) return take(flatten(t, Loc{}), arg(indices), 0, Loc{});
        return take(t, arg(indices), to_int(axis), Loc{});
      },
      py::arg("x"), py::arg("indices"), py::arg("axis") = py::none(),
      "Elements at integer `indices` along `axis` (None: of the flattened x); out of range "
      "raises.");
  m.def(
      "take_along_axis",
      [](py::object x, py::object indices, int64_t axis) {
        return take_along_axis(arg(x), arg(indices), axis, Loc{});
      },
      py::arg("x"), py::arg("indices"), py::arg("axis"), "numpy.take_along_axis.");
  m.def(
      "scatter_add",
      [](py::object x, py::object indices, py::object updates, int64_t axis) {
        const Tensor t = arg(x);
        return scatter_add(t, arg(indices), operand(updates, t), axis, Loc{});
      },
      py::arg("x"), py::arg("indices"), py::arg("updates"), py::arg("axis") = 0,
      "A copy of x with `updates` added at `indices` along `axis` (the transpose of take).");
  m.def(
      "scatter",
      [](py::object x, py::object indices, py::object updates, int64_t axis,
         const std::string& mode) {
        const Tensor t = arg(x);
        return scatter(t, arg(indices), operand(updates, t), axis, scatter_mode(mode), Loc{});
      },
      py::arg("x"), py::arg("indices"), py::arg("updates"), py::arg("axis") = 0,
      py::arg("mode") = "set",
      "x with `updates` combined in at `indices` along `axis` (take's layout): mode set (the "
      "last repeated index wins), add, mul, max or min.");
  m.def(
      "one_hot",
      [](py::object x, int64_t num_classes, py::object dtype) {
        return one_hot(arg(x), num_classes, to_optional_dtype(dtype).value_or(float32), Loc{});
      },
      py::arg("x"), py::arg("num_classes"), py::arg("dtype") = py::none(),
      "Integer labels as one-hot vectors along a new last axis.");
  m.def(
      "diagonal",
      [](py::object x, int64_t offset, int64_t axis1, int64_t axis2) {
        return diagonal(arg(x), offset, axis1, axis2, Loc{});
      },
      py::arg("x"), py::arg("offset") = 0, py::arg("axis1") = 0, py::arg("axis2") = 1,
      "numpy.diagonal: x[i, i + offset] over axis1 and axis2, as a new last axis.");
  m.def(
      "diag", [](py::object x, int64_t k) { return diag(arg(x), k, Loc{}); }, py::arg("x"),
      py::arg("k") = 0, "Of a 1-d x: a matrix with x on diagonal k; of a 2-d x: its diagonal k.");
  m.def(
      "trace",
      [](py::object x, int64_t offset, int64_t axis1, int64_t axis2) {
        return trace(arg(x), offset, axis1, axis2, Loc{});
      },
      py::arg("x"), py::arg("offset") = 0, py::arg("axis1") = 0, py::arg("axis2") = 1,
      "The sum of a diagonal.");
  m.def(
      "tril", [](py::object x, int64_t k) { return tril(arg(x), k, Loc{}); }, py::arg("x"),
      py::arg("k") = 0, "Zeros above diagonal k (of the last two axes).");
  m.def(
      "triu", [](py::object x, int64_t k) { return triu(arg(x), k, Loc{}); }, py::arg("x"),
      py::arg("k") = 0, "Zeros below diagonal k (of the last two axes).");
  m.def(
      "dynamic_slice",
      [](py::object x, py::object start_indices, py::object slice_sizes) {
        return dynamic_slice(arg(x), tensors(start_indices), to_shape(slice_sizes), Loc{});
      },
      py::arg("x"), py::arg("start_indices"), py::arg("slice_sizes"),
      "jax.lax.dynamic_slice: the block of `slice_sizes` at `start_indices` (ints or traced "
      "scalars), clamped to lie inside x.");
  m.def(
      "dynamic_update_slice",
      [](py::object x, py::object update, py::object start_indices) {
        const Tensor t = arg(x);
        return dynamic_update_slice(t, arg(update), tensors(start_indices), Loc{});
      },
      py::arg("x"), py::arg("update"), py::arg("start_indices"),
      "jax.lax.dynamic_update_slice: x with `update` written at `start_indices` (clamped).");
  m.def(
      "tile",
      [](py::object x, py::object reps) { return tile(arg(x), to_shape(reps).dims(), Loc{}); },
      py::arg("x"), py::arg("reps"), "numpy.tile: x repeated reps[i] times along axis i.");
  m.def(
      "repeat",
      [](py::object x, int64_t repeats, py::object axis) {
        return repeat(arg(x), repeats, optional_int(axis), Loc{});
      },
      py::arg("x"), py::arg("repeats"), py::arg("axis") = py::none(),
      "Each element `repeats` times in a row along `axis` (None: of the flattened x).");
  m.def(
      "roll",
      [](py::object x, int64_t shift, py::object axis) {
        return roll(arg(x), shift, optional_int(axis), Loc{});
      },
      py::arg("x"), py::arg("shift"), py::arg("axis") = py::none(),
      "Elements shifted by `shift` along `axis`, wrapping around (None: flattened).");
  m.def(
      "diff",
      [](py::object x, int64_t n, int64_t axis, py::object prepend, py::object append) {
        const Tensor t = arg(x);
        const auto edge = [&](py::object e) {
          return e.is_none() ? std::nullopt : std::optional<Tensor>(operand(e, t));
        };
        return diff(t, DiffOptions{n, axis, edge(prepend), edge(append)}, Loc{});
      },
      py::arg("x"), py::arg("n") = 1, py::arg("axis") = -1, py::arg("prepend") = py::none(),
      py::arg("append") = py::none(),
      "numpy.diff: the n-th forward difference along `axis`, after prepend/append.");
  m.def(
      "meshgrid",
      [](const py::args& xs, const std::string& indexing) {
        return py::list(py::cast(meshgrid(tensors(xs), indexing, Loc{})));
      },
      py::kw_only(), py::arg("indexing") = "xy",
      "numpy.meshgrid of 1-d tensors: 'xy' (Cartesian) or 'ij' (matrix) indexing.");
  // The count of non-zeros, for argwhere/nonzero without `size` (eager only).
  auto count_nonzero = [](const Tensor& t, py::object size, const char* op) {
    if (!size.is_none()) return to_int(size);
    if (t.is_traced())
      fail(op,
           "the result's size depends on values: got a traced tensor and size=None, "
           "expected size= (a static bound) inside jit");
    return sum(not_equal(t, scalar_like(t, 0.0, false), Loc{}), {}, false, Loc{})
        .item<int64_t>(Loc{});
  };
  m.def(
      "argwhere",
      [count_nonzero](py::object x, py::object size, int64_t fill_value) {
        const Tensor t = arg(x);
        return argwhere(t, count_nonzero(t, size, "argwhere"), fill_value, Loc{});
      },
      py::arg("x"), py::kw_only(), py::arg("size") = py::none(), py::arg("fill_value") = 0,
      "The indices of the non-zero elements, one int64 row each ([size, ndim]); `size` pads "
      "with fill_value (required inside jit, JAX's rule).");
  m.def(
      "nonzero",
      [count_nonzero](py::object x, py::object size, int64_t fill_value) {
        const Tensor t = arg(x);
        return tuple_of(nonzero(t, count_nonzero(t, size, "nonzero"), fill_value, Loc{}));
      },
      py::arg("x"), py::kw_only(), py::arg("size") = py::none(), py::arg("fill_value") = 0,
      "A tuple of int64 index tensors, one per axis, of the non-zero elements (as argwhere).");
  m.def(
      "bincount",
      [](py::object x, py::object weights, int64_t minlength, py::object length) {
        const Tensor t = arg(x);
        int64_t n = 0;
        if (!length.is_none()) {
          n = to_int(length);
        } else if (t.is_traced()) {
          fail("bincount",
               "the result's size depends on values: got a traced tensor and "
               "length=None, expected length= inside jit");
        } else {
          n = std::max(minlength, t.numel()
                                      ? kiln::max(t, {}, false, Loc{}).item<int64_t>(Loc{}) + 1
                                      : int64_t{0});
        }
        return bincount(
            t, n, weights.is_none() ? std::nullopt : std::optional<Tensor>(arg(weights)), Loc{});
      },
      py::arg("x"), py::arg("weights") = py::none(), py::arg("minlength") = 0, py::kw_only(),
      py::arg("length") = py::none(),
      "Counts (int64; with weights: their sums) of each value 0..length-1 in the 1-d integer x.");
}

void bind_products(py::module_& m) {
  m.def(
      "einsum",
      [](const std::string& subscripts, const py::args& operands) {
        const std::vector<Tensor> ts = tensors(operands);
        return without_gil([&] { return einsum(subscripts, ts, Loc{}); });
      },
      py::arg("subscripts"),
      "numpy.einsum: 'ij,jk->ik', implicit outputs, repeated labels (diagonals) and '...'.");
  m.def(
      "tensordot",
      [](py::object a, py::object b, py::object axes) {
        auto ab = operands(a, b);
        if (is_int(axes)) {
          const int64_t n = to_int(axes);
          return without_gil([&] { return tensordot(ab.first, ab.second, n, Loc{}); });
        }
        py::sequence pair = py::reinterpret_borrow<py::sequence>(axes);
        if (pair.size() != 2)
          fail("tensordot", "axes is an int or a pair of axis lists: got ", pair.size(),
               " entries, expected 2");
        const std::pair<Axes, Axes> paired{to_shape(pair[0]).dims(), to_shape(pair[1]).dims()};
        return without_gil([&] { return tensordot(ab.first, ab.second, paired, Loc{}); });
      },
      py::arg("a"), py::arg("b"), py::arg("axes") = 2,
      "numpy.tensordot: the product summed over the last `axes` axes of a and the first of b, "
      "or over paired axis lists.");
  m.def(
      "cross",
      [](py::object a, py::object b, int64_t axis) {
        auto ab = operands(a, b);
        return cross(ab.first, ab.second, axis, Loc{});
      },
      py::arg("a"), py::arg("b"), py::arg("axis") = -1,
      "numpy.cross of 3-vectors along `axis` (other axes broadcast).");
}

// The enum value a Python name (PyTorch's spelling) stands for; others are an error.
template <typename E>
E named(const char* op, const char* what, const std::string& name,
        std::initializer_list<std::pair<const char*, E>> names) {
  std::string known;
  for (const auto& [n, e] : names) {
    if (name == n) return e;
    known += std::string(known.empty() ? "" : ", ") + n;
  }
  fail(op, "unknown ", what, ": got '", name, "', expected one of ", known);
}

// PyTorch's F.convNd(input, weight, bias, stride, padding, dilation, groups) for one N.
template <int N, class Options>
void def_conv(py::module_& m, const char* name,
              Tensor (*fn)(const Tensor&, const Tensor&, const Options&, Loc), const char* doc) {
  m.def(
      name,
      [name, fn](py::object x, py::object w, py::object bias, py::object stride, py::object padding,
                 py::object dilation, int64_t groups) {
        const Options o{to_conv_sizes<N>(stride, name, "stride"), to_conv_padding<N>(padding, name),
                        to_conv_sizes<N>(dilation, name, "dilation"), groups,
                        optional_tensor(bias)};
        const Tensor tx = arg(x), tw = arg(w);
        return without_gil([&] { return fn(tx, tw, o, Loc{}); });
      },
      py::arg("x"), py::arg("w"), py::arg("bias") = py::none(), py::arg("stride") = 1,
      py::arg("padding") = 0, py::arg("dilation") = 1, py::arg("groups") = 1, doc);
}
// PyTorch's F.conv_transposeNd(input, weight, bias, stride, padding, output_padding, groups,
// dilation) for one N.
template <int N, class Options>
void def_conv_transpose(py::module_& m, const char* name,
                        Tensor (*fn)(const Tensor&, const Tensor&, const Options&, Loc),
                        const char* doc) {
  m.def(
      name,
      [name, fn](py::object x, py::object w, py::object bias, py::object stride, py::object padding,
                 py::object output_padding, int64_t groups, py::object dilation) {
        const Options o{to_conv_sizes<N>(stride, name, "stride"),
                        to_conv_sizes<N>(padding, name, "padding"),
                        to_conv_sizes<N>(output_padding, name, "output_padding"),
                        to_conv_sizes<N>(dilation, name, "dilation"),
                        groups,
                        optional_tensor(bias)};
        return fn(arg(x), arg(w), o, Loc{});
      },
      py::arg("x"), py::arg("w"), py::arg("bias") = py::none(), py::arg("stride") = 1,
      py::arg("padding") = 0, py::arg("output_padding") = 0, py::arg("groups") = 1,
      py::arg("dilation") = 1, doc);
}

void bind_conv(py::module_& m) {
  def_conv<1>(m, "conv1d", &conv1d,
              "Convolution (cross-correlation) of x [N, C, W] or [C, W] with w [O, C/groups, KW], "
              "plus bias [O]; padding is an int, 'valid' or 'same' (stride 1).");
  def_conv<2>(m, "conv2d", &conv2d,
              "Convolution of x [N, C, H, W] or [C, H, W] with w [O, C/groups, KH, KW], plus bias "
              "[O]; stride, padding and dilation are ints or pairs (PyTorch's F.conv2d), padding "
              "also 'valid' or 'same' (stride 1).");
  def_conv<3>(m, "conv3d", &conv3d,
              "Convolution of x [N, C, D, H, W] or [C, D, H, W] with w [O, C/groups, KD, KH, KW], "
              "plus bias [O]; padding also 'valid' or 'same' (stride 1).");
  def_conv_transpose<1>(m, "conv_transpose1d", &conv_transpose1d,
                        "Transposed convolution of x [N, C, W] or [C, W] with w [C, O/groups, KW], "
                        "plus bias [O] (the gradient of conv1d with respect to its input).");
  def_conv_transpose<2>(m, "conv_transpose2d", &conv_transpose2d,
                        "Transposed convolution of x [N, C, H, W] or [C, H, W] with w "
                        "[C, O/groups, KH, KW], plus bias [O].");
  def_conv_transpose<3>(m, "conv_transpose3d", &conv_transpose3d,
                        "Transposed convolution of x [N, C, D, H, W] or [C, D, H, W] with w "
                        "[C, O/groups, KD, KH, KW], plus bias [O].");
  // PyTorch's F.max_poolNd / F.avg_poolNd / F.adaptive_*_poolNd, keyword for keyword.
  auto max_result = [](MaxPoolResult r, bool return_indices) -> py::object {
    if (return_indices) return py::make_tuple(r.values, r.indices);
    return py::cast(r.values);
  };
  m.def(
      "max_pool1d",
      [max_result](py::object x, int64_t kernel_size, std::optional<int64_t> stride,
                   int64_t padding, int64_t dilation, bool ceil_mode, bool return_indices) {
        const Pool1dOptions o{kernel_size, stride, padding, dilation, ceil_mode, true};
        if (return_indices) return max_result(max_pool1d_with_indices(arg(x), o, Loc{}), true);
        return py::cast(max_pool1d(arg(x), o, Loc{}));
      },
      py::arg("x"), py::arg("kernel_size"), py::arg("stride") = py::none(), py::arg("padding") = 0,
      py::arg("dilation") = 1, py::arg("ceil_mode") = false, py::arg("return_indices") = false,
      "Max pooling over x [N, C, W] (PyTorch's F.max_pool1d); stride defaults to the kernel.");
  m.def(
      "max_pool2d",
      [max_result](py::object x, py::object kernel_size, py::object stride, py::object padding,
                   py::object dilation, bool ceil_mode, bool return_indices) {
        constexpr const char* op = "max_pool2d";
        Pool2dOptions o;
        o.kernel = pair(kernel_size, op, "kernel_size");
        if (!stride.is_none()) o.stride = pair(stride, op, "stride");
        o.padding = pair(padding, op, "padding");
        o.dilation = pair(dilation, op, "dilation");
        o.ceil_mode = ceil_mode;
        if (return_indices) return max_result(max_pool2d_with_indices(arg(x), o, Loc{}), true);
        return py::cast(max_pool2d(arg(x), o, Loc{}));
      },
      py::arg("x"), py::arg("kernel_size") = 2, py::arg("stride") = py::none(),
      py::arg("padding") = 0, py::arg("dilation") = 1, py::arg("ceil_mode") = false,
      py::arg("return_indices") = false,
      "Max pooling over x [N, C, H, W] (PyTorch's F.max_pool2d); stride defaults to the "
      "kernel; return_indices adds each maximum's flat index in its plane.");
  m.def(
      "max_pool3d",
      [max_result](py::object x, py::object kernel_size, py::object stride, py::object padding,
                   py::object dilation, bool ceil_mode, bool return_indices) {
        constexpr const char* op = "max_pool3d";
        Pool3dOptions o;
        o.kernel = ints<3>(kernel_size, op, "kernel_size");
        if (!stride.is_none()) o.stride = ints<3>(stride, op, "stride");
        o.padding = ints<3>(padding, op, "padding");
        o.dilation = ints<3>(dilation, op, "dilation");
        o.ceil_mode = ceil_mode;
        if (return_indices) return max_result(max_pool3d_with_indices(arg(x), o, Loc{}), true);
        return py::cast(max_pool3d(arg(x), o, Loc{}));
      },
      py::arg("x"), py::arg("kernel_size"), py::arg("stride") = py::none(), py::arg("padding") = 0,
      py::arg("dilation") = 1, py::arg("ceil_mode") = false, py::arg("return_indices") = false,
      "Max pooling over x [N, C, D, H, W] (PyTorch's F.max_pool3d).");
  m.def(
      "avg_pool1d",
      [](py::object x, int64_t kernel_size, std::optional<int64_t> stride, int64_t padding,
         bool ceil_mode, bool count_include_pad) {
        return avg_pool1d(arg(x), {kernel_size, stride, padding, 1, ceil_mode, count_include_pad},
                          Loc{});
      },
      py::arg("x"), py::arg("kernel_size"), py::arg("stride") = py::none(), py::arg("padding") = 0,
      py::arg("ceil_mode") = false, py::arg("count_include_pad") = true,
      "Average pooling over x [N, C, W] (PyTorch's F.avg_pool1d).");
  m.def(
      "avg_pool2d",
      [](py::object x, py::object kernel_size, py::object stride, py::object padding,
         bool ceil_mode, bool count_include_pad, std::optional<int64_t> divisor_override) {
        constexpr const char* op = "avg_pool2d";
        Pool2dOptions o;
        o.kernel = pair(kernel_size, op, "kernel_size");
        if (!stride.is_none()) o.stride = pair(stride, op, "stride");
        o.padding = pair(padding, op, "padding");
        o.ceil_mode = ceil_mode;
        o.count_include_pad = count_include_pad;
        o.divisor_override = divisor_override;
        return avg_pool2d(arg(x), o, Loc{});
      },
      py::arg("x"), py::arg("kernel_size") = 2, py::arg("stride") = py::none(),
      py::arg("padding") = 0, py::arg("ceil_mode") = false, py::arg("count_include_pad") = true,
      py::arg("divisor_override") = py::none(),
      "Average pooling over x [N, C, H, W] (PyTorch's F.avg_pool2d); padding counts toward "
      "the divisor unless count_include_pad=False.");
  m.def(
      "avg_pool3d",
      [](py::object x, py::object kernel_size, py::object stride, py::object padding,
         bool ceil_mode, bool count_include_pad, std::optional<int64_t> divisor_override) {
        constexpr const char* op = "avg_pool3d";
        Pool3dOptions o;
        o.kernel = ints<3>(kernel_size, op, "kernel_size");
        if (!stride.is_none()) o.stride = ints<3>(stride, op, "stride");
        o.padding = ints<3>(padding, op, "padding");
        o.ceil_mode = ceil_mode;
        o.count_include_pad = count_include_pad;
        o.divisor_override = divisor_override;
        return avg_pool3d(arg(x), o, Loc{});
      },
      py::arg("x"), py::arg("kernel_size"), py::arg("stride") = py::none(), py::arg("padding") = 0,
      py::arg("ceil_mode") = false, py::arg("count_include_pad") = true,
      py::arg("divisor_override") = py::none(),
      "Average pooling over x [N, C, D, H, W] (PyTorch's F.avg_pool3d).");
  m.def(
      "adaptive_avg_pool1d",
      [](py::object x, int64_t output_size) {
        return adaptive_avg_pool1d(arg(x), output_size, Loc{});
      },
      py::arg("x"), py::arg("output_size"),
      "Averages over windows of x [N, C, W] giving `output_size` (PyTorch's).");
  m.def(
      "adaptive_avg_pool2d",
      [](py::object x, py::object output_size) {
        return adaptive_avg_pool2d(arg(x), pair(output_size, "adaptive_avg_pool2d", "output_size"),
                                   Loc{});
      },
      py::arg("x"), py::arg("output_size"),
      "Averages over windows giving an output of `output_size` (PyTorch's).");
  m.def(
      "adaptive_avg_pool3d",
      [](py::object x, py::object output_size) {
        return adaptive_avg_pool3d(
            arg(x), ints<3>(output_size, "adaptive_avg_pool3d", "output_size"), Loc{});
      },
      py::arg("x"), py::arg("output_size"),
      "Averages over windows of x [N, C, D, H, W] giving `output_size` (PyTorch's).");
  m.def(
      "adaptive_max_pool1d",
      [max_result](py::object x, int64_t output_size, bool return_indices) {
        return max_result(adaptive_max_pool1d_with_indices(arg(x), output_size, Loc{}),
                          return_indices);
      },
      py::arg("x"), py::arg("output_size"), py::arg("return_indices") = false,
      "Maxima over windows of x [N, C, W] giving `output_size` (PyTorch's).");
  m.def(
      "adaptive_max_pool2d",
      [max_result](py::object x, py::object output_size, bool return_indices) {
        const auto size = pair(output_size, "adaptive_max_pool2d", "output_size");
        return max_result(adaptive_max_pool2d_with_indices(arg(x), size, Loc{}), return_indices);
      },
      py::arg("x"), py::arg("output_size"), py::arg("return_indices") = false,
      "Maxima over windows of x [N, C, H, W] giving `output_size` (PyTorch's).");
  m.def(
      "adaptive_max_pool3d",
      [max_result](py::object x, py::object output_size, bool return_indices) {
        const auto size = ints<3>(output_size, "adaptive_max_pool3d", "output_size");
        return max_result(adaptive_max_pool3d_with_indices(arg(x), size, Loc{}), return_indices);
      },
      py::arg("x"), py::arg("output_size"), py::arg("return_indices") = false,
      "Maxima over windows of x [N, C, D, H, W] giving `output_size` (PyTorch's).");
  auto unfold_options = [](py::object kernel_size, py::object dilation, py::object padding,
                           py::object stride, const char* op) {
    return UnfoldOptions{pair(kernel_size, op, "kernel_size"), pair(dilation, op, "dilation"),
                         pair(padding, op, "padding"), pair(stride, op, "stride")};
  };
  m.def(
      "unfold",
      [unfold_options](py::object x, py::object kernel_size, py::object dilation,
                       py::object padding, py::object stride) {
        return unfold(arg(x), unfold_options(kernel_size, dilation, padding, stride, "unfold"),
                      Loc{});
      },
      py::arg("x"), py::arg("kernel_size"), py::arg("dilation") = 1, py::arg("padding") = 0,
      py::arg("stride") = 1,
      "Sliding windows of x [N, C, H, W] as columns [N, C * KH * KW, L] (PyTorch's F.unfold).");
  m.def(
      "fold",
      [unfold_options](py::object x, py::object output_size, py::object kernel_size,
                       py::object dilation, py::object padding, py::object stride) {
        return fold(arg(x), pair(output_size, "fold", "output_size"),
                    unfold_options(kernel_size, dilation, padding, stride, "fold"), Loc{});
      },
      py::arg("x"), py::arg("output_size"), py::arg("kernel_size"), py::arg("dilation") = 1,
      py::arg("padding") = 0, py::arg("stride") = 1,
      "Columns [N, C * KH * KW, L] summed back into [N, C, *output_size] (PyTorch's F.fold).");
  m.def(
      "pixel_shuffle",
      [](py::object x, int64_t upscale_factor) {
        return pixel_shuffle(arg(x), upscale_factor, Loc{});
      },
      py::arg("x"), py::arg("upscale_factor"),
      "[N, C * r * r, H, W] -> [N, C, H * r, W * r] (PyTorch's F.pixel_shuffle).");
  m.def(
      "pixel_unshuffle",
      [](py::object x, int64_t downscale_factor) {
        return pixel_unshuffle(arg(x), downscale_factor, Loc{});
      },
      py::arg("x"), py::arg("downscale_factor"),
      "[N, C, H * r, W * r] -> [N, C * r * r, H, W] (PyTorch's F.pixel_unshuffle).");
  m.def(
      "interpolate",
      [](py::object x, py::object size, py::object scale_factor, const std::string& mode,
         bool align_corners) {
        InterpolateOptions o;
        if (!size.is_none()) o.size = SpatialValues<int64_t>(to_shape(size).dims());
        if (!scale_factor.is_none()) {
          o.scale_factor =
              PyNumber_Check(scale_factor.ptr()) && !PySequence_Check(scale_factor.ptr())
                  ? SpatialValues<double>(scale_factor.cast<double>())
                  : SpatialValues<double>(scale_factor.cast<std::vector<double>>());
        }
        o.mode = named<InterpolateMode>("interpolate", "mode", mode,
                                        {{"nearest", InterpolateMode::nearest},
                                         {"nearest-exact", InterpolateMode::nearest_exact},
                                         {"linear", InterpolateMode::linear},
                                         {"bilinear", InterpolateMode::bilinear},
                                         {"bicubic", InterpolateMode::bicubic},
                                         {"trilinear", InterpolateMode::trilinear},
                                         {"area", InterpolateMode::area}});
        o.align_corners = align_corners;
        return interpolate(arg(x), o, Loc{});
      },
      py::arg("x"), py::arg("size") = py::none(), py::arg("scale_factor") = py::none(),
      py::arg("mode") = "nearest", py::arg("align_corners") = false,
      "Resamples x [N, C, W], [N, C, H, W] or [N, C, D, H, W] to `size` or by `scale_factor` "
      "(PyTorch 1.13's F.interpolate).");
  m.def(
      "grid_sample",
      [](py::object x, py::object grid, const std::string& mode, const std::string& padding_mode,
         bool align_corners) {
        const GridSampleOptions o{
            named<GridSampleMode>("grid_sample", "mode", mode,
                                  {{"bilinear", GridSampleMode::bilinear},
                                   {"nearest", GridSampleMode::nearest},
                                   {"bicubic", GridSampleMode::bicubic}}),
            named<GridSamplePadding>("grid_sample", "padding_mode", padding_mode,
                                     {{"zeros", GridSamplePadding::zeros},
                                      {"border", GridSamplePadding::border},
                                      {"reflection", GridSamplePadding::reflection}}),
            align_corners};
        return grid_sample(arg(x), arg(grid), o, Loc{});
      },
      py::arg("input"), py::arg("grid"), py::arg("mode") = "bilinear",
      py::arg("padding_mode") = "zeros", py::arg("align_corners") = false,
      "Samples input [N, C, H, W] at grid [N, Ho, Wo, 2] (or [N, C, D, H, W] at "
      "[N, Do, Ho, Wo, 3]) (PyTorch 1.13's F.grid_sample).");
  m.def(
      "affine_grid",
      [](py::object theta, py::object size, bool align_corners) {
        return affine_grid(arg(theta), to_shape(size), align_corners, Loc{});
      },
      py::arg("theta"), py::arg("size"), py::arg("align_corners") = false,
      "The sampling grid of affine maps theta [N, 2, 3] (or [N, 3, 4]) for an output of `size` "
      "(PyTorch 1.13's F.affine_grid).");
}

// numpy's ord: None, a number or a name ("fro", "nuc").
std::optional<linalg::NormOrd> norm_ord(py::object ord) {
  if (ord.is_none()) return std::nullopt;
  if (PyUnicode_Check(ord.ptr())) return linalg::NormOrd(ord.cast<std::string>().c_str());
  return linalg::NormOrd(ord.cast<double>());
}

void bind_linalg(py::module_& m) {
  py::module_ la = m.def_submodule("linalg",
                                   "Linear algebra (numpy.linalg style), batched over "
                                   "leading axes, float32 and float64.");
  la.def(
      "cholesky",
      [](py::object a) {
        const Tensor t = arg(a);
        return without_gil([&] { return linalg::cholesky(t, Loc{}); });
      },
      py::arg("a"),
      "Lower-triangular L with L L^T = a (a symmetrised first); NaNs if not positive definite.");
  la.def(
      "triangular_solve",
      [](py::object a, py::object b, bool lower, bool transpose, bool unit_diagonal) {
        const Tensor ta = arg(a), tb = arg(b);
        const linalg::TriangularSolveOptions o{
            .lower = lower, .transpose = transpose, .unit_diagonal = unit_diagonal};
        return without_gil([&] { return linalg::triangular_solve(ta, tb, o, Loc{}); });
      },
      py::arg("a"), py::arg("b"), py::arg("lower") = false, py::arg("transpose") = false,
      py::arg("unit_diagonal") = false,
      "x with op(a) x = b for a triangular a (also kiln.linalg.solve_triangular).");
  la.attr("solve_triangular") = la.attr("triangular_solve");
  la.def(
      "solve",
      [](py::object a, py::object b) {
        const Tensor ta = arg(a), tb = arg(b);
        return without_gil([&] { return linalg::solve(ta, tb, Loc{}); });
      },
      py::arg("a"), py::arg("b"), "x with a x = b (LU with partial pivoting).");
  la.def(
      "inv",
      [](py::object a) {
        const Tensor t = arg(a);
        return without_gil([&] { return linalg::inv(t, Loc{}); });
      },
      py::arg("a"), "The inverse matrix; NaNs when singular.");
  la.def(
      "slogdet",
      [](py::object a) {
        const Tensor t = arg(a);
        const auto r = without_gil([&] { return linalg::slogdet(t, Loc{}); });
        return py::make_tuple(r.first, r.second);
      },
      py::arg("a"), "(sign, log|det a|).");
  la.def(
      "det",
      [](py::object a) {
        const Tensor t = arg(a);
        return without_gil([&] { return linalg::det(t, Loc{}); });
      },
      py::arg("a"), "The determinant.");
  la.def(
      "eig",
      [](py::object a) {
        const Tensor t = arg(a);
        const linalg::Eig r = without_gil([&] { return linalg::eig(t, Loc{}); });
        return py::make_tuple(r.eigenvalues, r.eigenvectors);
      },
      py::arg("a"),
      "(eigenvalues, eigenvectors as unit columns) of a general square a, complex as numpy's.");
  la.def(
      "eigvals",
      [](py::object a) {
        const Tensor t = arg(a);
        return without_gil([&] { return linalg::eigvals(t, Loc{}); });
      },
      py::arg("a"), "The eigenvalues of a general square a (complex).");
  la.def(
      "eigh",
      [](py::object a) {
        const Tensor t = arg(a);
        const auto r = without_gil([&] { return linalg::eigh(t, Loc{}); });
        return py::make_tuple(r.first, r.second);
      },
      py::arg("a"),
      "(eigenvalues ascending, eigenvectors as columns) of the symmetric (a + a^T) / 2.");
  la.def(
      "lu_factor",
      [](py::object a) {
        const Tensor t = arg(a);
        const linalg::LUFactor f = without_gil([&] { return linalg::lu_factor(t, Loc{}); });
        return py::make_tuple(f.lu, f.pivots);
      },
      py::arg("a"),
      "scipy.linalg.lu_factor: (lu, piv), L's strict lower triangle and U in lu, 0-based int32 "
      "pivots.");
  la.def(
      "lu_solve",
      [](py::object lu_and_piv, py::object b, int trans) {
        const py::tuple pair = py::cast<py::tuple>(lu_and_piv);
        if (pair.size() != 2)
          fail("lu_solve", "lu_and_piv needs two items: got ", pair.size(), ", expected (lu, piv)");
        const linalg::LUFactor f{arg(pair[0]), arg(pair[1])};
        const Tensor tb = arg(b);
        return without_gil([&] { return linalg::lu_solve(f, tb, trans, Loc{}); });
      },
      py::arg("lu_and_piv"), py::arg("b"), py::arg("trans") = 0,
      "scipy.linalg.lu_solve: x with a x = b (trans=0) or a^T x = b (trans=1 or 2) from "
      "lu_factor(a).");
  la.def(
      "lu",
      [](py::object a) {
        const Tensor t = arg(a);
        const linalg::LU f = without_gil([&] { return linalg::lu(t, Loc{}); });
        return py::make_tuple(f.p, f.l, f.u);
      },
      py::arg("a"), "scipy.linalg.lu: (p, l, u) with a = p l u.");
  la.def(
      "qr",
      [](py::object a, const std::string& mode) {
        if (mode != "reduced" && mode != "complete")
          fail("qr", "unknown mode: got '", mode, "', expected 'reduced' or 'complete'");
        const Tensor t = arg(a);
        const linalg::QrMode m =
            mode == "reduced" ? linalg::QrMode::reduced : linalg::QrMode::complete;
        const linalg::QR r = without_gil([&] { return linalg::qr(t, m, Loc{}); });
        return py::make_tuple(r.q, r.r);
      },
      py::arg("a"), py::arg("mode") = "reduced", "(q, r) with a = q r.");
  la.def(
      "svd",
      [](py::object a, bool full_matrices, bool compute_uv) -> py::object {
        const Tensor t = arg(a);
        if (!compute_uv) return py::cast(without_gil([&] { return linalg::svdvals(t, Loc{}); }));
        const linalg::SVD r = without_gil([&] { return linalg::svd(t, full_matrices, Loc{}); });
        return py::make_tuple(r.u, r.s, r.vh);
      },
      py::arg("a"), py::arg("full_matrices") = true, py::arg("compute_uv") = true,
      "(u, s, vh) with a = u diag(s) vh, s descending; compute_uv=False: s alone.");
  la.def(
      "svdvals",
      [](py::object a) {
        const Tensor t = arg(a);
        return without_gil([&] { return linalg::svdvals(t, Loc{}); });
      },
      py::arg("a"), "The singular values, descending.");
  la.def(
      "pinv",
      [](py::object a, std::optional<double> rcond) {
        const Tensor t = arg(a);
        return without_gil([&] { return linalg::pinv(t, rcond, Loc{}); });
      },
      py::arg("a"), py::arg("rcond") = py::none(), "The pseudo-inverse.");
  la.def(
      "lstsq",
      [](py::object a, py::object b, std::optional<double> rcond) {
        const Tensor ta = arg(a), tb = arg(b);
        return without_gil([&] { return linalg::lstsq(ta, tb, rcond, Loc{}); });
      },
      py::arg("a"), py::arg("b"), py::arg("rcond") = py::none(),
      "The least-squares solution x of a x = b (only x: not numpy's residuals, rank and s).");
  la.def(
      "norm",
      [](py::object x, py::object ord, py::object axis, bool keepdims) {
        std::optional<std::vector<int64_t>> axes;
        if (!axis.is_none()) axes = to_shape(axis).dims();
        return linalg::norm(arg(x), norm_ord(ord), axes, keepdims, Loc{});
      },
      py::arg("x"), py::arg("ord") = py::none(), py::arg("axis") = py::none(),
      py::arg("keepdims") = false,
      "numpy.linalg.norm: vector norms (ord a number, inf, -inf, 0) over one axis, matrix "
      "norms ('fro', 'nuc', 1, -1, 2, -2, inf, -inf) over two.");
  la.def(
      "vector_norm",
      [](py::object x, py::object ord, py::object axis, bool keepdims) {
        std::optional<std::vector<int64_t>> axes;
        if (!axis.is_none()) axes = to_shape(axis).dims();
        return linalg::vector_norm(arg(x), norm_ord(ord).value_or(2), axes, keepdims, Loc{});
      },
      py::arg("x"), py::arg("ord") = 2, py::arg("axis") = py::none(), py::arg("keepdims") = false,
      "torch.linalg.vector_norm: the ord-norm over axis (any number of axes; None: all).");
  la.def(
      "matrix_norm",
      [](py::object x, py::object ord, py::object axis, bool keepdims) {
        return linalg::matrix_norm(arg(x), norm_ord(ord).value_or("fro"),
                                   pair(axis, "matrix_norm", "axis"), keepdims, Loc{});
      },
      py::arg("x"), py::arg("ord") = "fro", py::arg("axis") = py::make_tuple(-2, -1),
      py::arg("keepdims") = false,
      "torch.linalg.matrix_norm: the ord-norm of the matrices over two axes (default the last).");
  la.def(
      "multi_dot",
      [](py::object arrays) {
        const std::vector<Tensor> ts = tensors(arrays);
        return without_gil([&] { return linalg::multi_dot(ts, Loc{}); });
      },
      py::arg("arrays"),
      "numpy.linalg.multi_dot: the chained product, in the cheapest parenthesisation.");
  la.def(
      "cond",
      [](py::object x, py::object p) {
        const Tensor t = arg(x);
        const std::optional<linalg::NormOrd> o = norm_ord(p);
        return without_gil([&] { return linalg::cond(t, o, Loc{}); });
      },
      py::arg("x"), py::arg("p") = py::none(),
      "numpy.linalg.cond: the condition number (p None or 2: by singular values).");
  la.def(
      "matrix_rank",
      [](py::object a, std::optional<double> tol, std::optional<double> rtol) {
        const Tensor t = arg(a);
        return without_gil(
            [&] { return linalg::matrix_rank(t, {.tol = tol, .rtol = rtol}, Loc{}); });
      },
      py::arg("a"), py::arg("tol") = py::none(), py::kw_only(), py::arg("rtol") = py::none(),
      "numpy.linalg.matrix_rank: singular values above tol (absolute) or rtol * max(s); "
      "default max(m, n) * eps * max(s).");
  la.def(
      "cho_solve",
      [](py::object c_and_lower, py::object b) {
        // scipy's (c, lower) pair, or a factor alone: the lower one cholesky returns.
        py::object c = c_and_lower;
        bool lower = true;
        if (py::isinstance<py::tuple>(c_and_lower)) {
          const py::tuple pair = c_and_lower;
          if (pair.size() != 2)
            fail("cho_solve", "c_and_lower needs two items: got ", pair.size(),
                 ", expected (c, lower)");
          c = pair[0];
          lower = py::bool_(pair[1]);  // Python truth, as scipy
        }
        const Tensor tc = arg(c), tb = arg(b);
        return without_gil([&] { return linalg::cho_solve(tc, tb, lower, Loc{}); });
      },
      py::arg("c_and_lower"), py::arg("b"),
      "scipy.linalg.cho_solve: x with a x = b from a's Cholesky factor, given as (c, lower) or "
      "as the lower factor alone.");
  la.def(
      "expm",
      [](py::object a) {
        const Tensor t = arg(a);
        return without_gil([&] { return linalg::expm(t, Loc{}); });
      },
      py::arg("a"), "scipy.linalg.expm: the matrix exponential (scaling and squaring, Pade 13).");
  la.def(
      "eigvalsh",
      [](py::object a) {
        const Tensor t = arg(a);
        return without_gil([&] { return linalg::eigvalsh(t, Loc{}); });
      },
      py::arg("a"), "The eigenvalues of the symmetric (a + a^T) / 2, ascending.");
  la.def(
      "matrix_power",
      [](py::object a, int64_t n) { return linalg::matrix_power(arg(a), n, Loc{}); }, py::arg("a"),
      py::arg("n"), "a**n by repeated squaring (n < 0: of the inverse).");
}

// Top-level functions that are also Tensor methods, as in numpy (x.sum(axis=0)).
void bind_methods(py::module_& m) {
  py::object tensor = m.attr("Tensor");
  const char* methods[] = {"sum",      "mean",    "prod",      "max",      "min",      "var",
                           "std",      "any",     "all",       "argmax",   "argmin",   "cumsum",
                           "cumprod",  "sort",    "argsort",   "ravel",    "flatten",  "squeeze",
                           "swapaxes", "clip",    "round",     "take",     "diagonal", "trace",
                           "repeat",   "nonzero", "logsumexp", "abs",      "exp",      "log",
                           "sqrt",     "tanh",    "conj",      "conjugate"};
  for (const char* name : methods) {
    PyObject* method = PyInstanceMethod_New(m.attr(name).ptr());
    if (!method) throw py::error_already_set();
    tensor.attr(name) = py::reinterpret_steal<py::object>(method);
  }
  // x.real and x.imag are properties, as in numpy.
  py::object property = py::module_::import("builtins").attr("property");
  tensor.attr("real") = property(m.attr("real"), py::none(), py::none(), "The real part.");
  tensor.attr("imag") = property(m.attr("imag"), py::none(), py::none(), "The imaginary part.");
}

}  // namespace

template <int N>
ConvSizes<N> to_conv_sizes(py::handle value, const char* op, const char* what) {
  const auto a = ints<N>(py::reinterpret_borrow<py::object>(value), op, what);
  if constexpr (N == 1)
    return a[0];
  else if constexpr (N == 2)
    return {a[0], a[1]};
  else
    return a;
}
template <int N>
ConvPadding<N> to_conv_padding(py::handle value, const char* op) {
  if (!py::isinstance<py::str>(value)) return to_conv_sizes<N>(value, op, "padding");
  const auto mode = value.cast<std::string>();
  if (mode == "valid") return PaddingRule::valid;
  if (mode == "same") return PaddingRule::same;
  fail(op, "padding is an int, ", N, " ints, 'same' or 'valid': got '", mode,
       "', expected one of those");
}
template ConvSizes<1> to_conv_sizes<1>(py::handle, const char*, const char*);
template ConvSizes<2> to_conv_sizes<2>(py::handle, const char*, const char*);
template ConvSizes<3> to_conv_sizes<3>(py::handle, const char*, const char*);
template ConvPadding<1> to_conv_padding<1>(py::handle, const char*);
template ConvPadding<2> to_conv_padding<2>(py::handle, const char*);
template ConvPadding<3> to_conv_padding<3>(py::handle, const char*);

void bind_ops(py::module_& m) {
  bind_elementwise(m);
  bind_reductions(m);
  bind_creation(m);
  bind_shapes(m);
  bind_products(m);
  bind_conv(m);
  bind_linalg(m);
  bind_methods(m);
}

}  // namespace kiln::python
