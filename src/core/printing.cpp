// Printing tensors: a port of numpy 1.24's array2string (separator ", ", float mode "maxprec")
// and its print options. Only the elements shown are read, so summarising a huge tensor is cheap.
#include "kiln/printing.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "detail/dtype_dispatch.h"
#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln {

// ---- options ------------------------------------------------------------------------------

namespace {

std::mutex options_mutex;
PrintOptions current_options;

}  // namespace

PrintOptions get_printoptions() {
  const std::lock_guard lock(options_mutex);
  return current_options;
}

void set_printoptions(const PrintOptions& o) {
  if (o.precision < 0 || o.precision > 100)
    fail("set_printoptions", "precision out of range: got ", o.precision, ", expected 0 to 100");
  if (o.threshold < 0)
    fail("set_printoptions", "negative threshold: got ", o.threshold, ", expected >= 0");
  if (o.edgeitems < 1)
    fail("set_printoptions", "edgeitems out of range: got ", o.edgeitems, ", expected >= 1");
  if (o.linewidth < 1)
    fail("set_printoptions", "linewidth out of range: got ", o.linewidth, ", expected >= 1");
  const std::lock_guard lock(options_mutex);
  current_options = o;
}

ScopedPrintOptions::ScopedPrintOptions(const PrintOptions& options) : saved_(get_printoptions()) {
  set_printoptions(options);
}
ScopedPrintOptions::~ScopedPrintOptions() {
  const std::lock_guard lock(options_mutex);
  current_options = saved_;
}

// ---- numbers --------------------------------------------------------------------------------

namespace {

// A finite float as decimal digits: value = ±d.ddd × 10^exponent, no trailing zeros in `digits`
// (except the single digit of 0).
struct Decimal {
  bool negative = false;
  std::string digits;
  int exponent = 0;
};

// Reads "-1.2345e-05" (printf's %e or to_chars' scientific form).
Decimal parse_scientific(std::string_view s) {
  Decimal d;
  std::size_t i = 0;
  if (s[i] == '-') {
    d.negative = true;
    ++i;
  }
  for (; i < s.size() && s[i] != 'e'; ++i)
    if (s[i] != '.') d.digits += s[i];
  if (i < s.size()) d.exponent = std::atoi(std::string(s.substr(i + 1)).c_str());
  while (d.digits.size() > 1 && d.digits.back() == '0') d.digits.pop_back();
  return d;
}

// x rounded to `significant` digits (correctly, ties to even, like numpy's Dragon4).
Decimal rounded(double x, int significant) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%.*e", significant - 1, x);
  return parse_scientific(buf);
}

// The decimal value of `mantissa` × 10^`scale` as a Decimal.
Decimal from_integer(bool negative, int64_t mantissa, int scale) {
  Decimal d{negative, std::to_string(mantissa), 0};
  d.exponent = scale + static_cast<int>(d.digits.size()) - 1;
  while (d.digits.size() > 1 && d.digits.back() == '0') d.digits.pop_back();
  return d;
}

// True when the decimal reads back as x in dtype (round to nearest).
bool reads_back(const Decimal& d, double x, DType dtype) {
  const std::string text =
      (d.negative ? "-0." : "0.") + d.digits + "e" + std::to_string(d.exponent + 1);
  const float f = std::strtof(text.c_str(), nullptr);
  const float back =
      dtype == float16 ? static_cast<float>(Half(f)) : static_cast<float>(BFloat16(f));
  return back == static_cast<float>(x);
}

// The shortest digits that read back as x in its dtype (numpy's unique mode): to_chars for
// float32 and float64. For the 16-bit ones, the first length at which the correctly rounded
// digits or a neighbour of them read back (below a power of two the interval is lopsided, so
// the neighbour can read back when the rounded digits do not: 0.01563 for 2^-6 in float16).
Decimal shortest(double x, DType dtype) {
  if (x == 0) return Decimal{std::signbit(x), "0", 0};
  char buf[64];
  if (dtype == float64 || dtype == float32) {
    const auto res = dtype == float64
                         ? std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific)
                         : std::to_chars(buf, buf + sizeof buf, static_cast<float>(x),
                                         std::chars_format::scientific);
    return parse_scientific(std::string_view(buf, res.ptr));
  }
  for (int n = 1;; ++n) {
    const Decimal d = rounded(x, n);
    if (n >= 9 || reads_back(d, x, dtype)) return d;
    // d's digits padded to n: mantissa × 10^scale.
    const int scale = d.exponent - (n - 1);
    const int64_t mantissa =
        std::stoll(d.digits + std::string(static_cast<std::size_t>(n) - d.digits.size(), '0'));
    // Of the two neighbours, the nearer one first.
    const double exact = std::abs(x) * std::pow(10.0, -scale);
    const int64_t first = exact > static_cast<double>(mantissa) ? mantissa + 1 : mantissa - 1;
    for (int64_t m : {first, 2 * mantissa - first}) {
      const Decimal candidate = from_integer(d.negative, m, scale);
      if (m > 0 && reads_back(candidate, x, dtype)) return candidate;
    }
  }
}

int fraction_digits(const Decimal& d) {
  return std::max(0, static_cast<int>(d.digits.size()) - 1 - d.exponent);
}

// "12.5", "0.001", "100.": integer part, '.', fraction (numpy's trim='.').
std::string positional(const Decimal& d) {
  const int n = static_cast<int>(d.digits.size());
  std::string s = d.negative ? "-" : "";
  if (d.exponent < 0) {
    s += "0." + std::string(static_cast<std::size_t>(-d.exponent - 1), '0') + d.digits;
  } else if (n > d.exponent + 1) {
    s += d.digits.substr(0, static_cast<std::size_t>(d.exponent + 1)) + "." +
         d.digits.substr(static_cast<std::size_t>(d.exponent + 1));
  } else {
    s += d.digits + std::string(static_cast<std::size_t>(d.exponent + 1 - n), '0') + ".";
  }
  return s;
}

// x in positional notation with at most `precision` fraction digits, trailing zeros trimmed.
// numpy (min_digits=0) prints every digit before the point: 74714968 as float32 is
// "74714968.", though "74714970" reads back as it too.
std::string positional(double x, DType dtype, int precision) {
  const Decimal d = shortest(x, dtype);
  const int fraction = fraction_digits(d);
  if (fraction > 0 && fraction <= precision) return positional(d);
  char buf[512];
  std::snprintf(buf, sizeof buf, "%.*f", std::min(fraction, precision), x);
  std::string s = buf;
  if (s.find('.') == std::string::npos) return s + ".";
  while (s.back() == '0') s.pop_back();
  return s;
}

// The shortest digits, or `precision` + 1 significant digits when more are needed.
Decimal scientific(double x, DType dtype, int precision) {
  Decimal d = shortest(x, dtype);
  if (static_cast<int>(d.digits.size()) - 1 > precision) d = rounded(x, precision + 1);
  return d;
}

// Formats the shown elements of one floating tensor with a common width (numpy's
// FloatingFormat: it fits itself to the values first, then formats each).
std::vector<std::string> format_floats(const std::vector<double>& values, DType dtype,
                                       const PrintOptions& options) {
  double max_val = 0, min_val = INFINITY;
  bool any_finite = false, any_special = false, neg_inf = false;
  for (double v : values) {
    if (!std::isfinite(v)) {
      any_special = true;
      neg_inf = neg_inf || v == -INFINITY;
      continue;
    }
    any_finite = true;
    if (v != 0) {
      max_val = std::max(max_val, std::abs(v));
      min_val = std::min(min_val, std::abs(v));
    }
  }
  const bool exp_format =
      max_val != 0 &&
      (max_val >= 1e8 || (!options.suppress && (min_val < 1e-4 || max_val / min_val > 1000.)));
  std::size_t pad_left = 0, pad_right = 0;
  std::vector<std::string> out(values.size());
  if (exp_format) {
    std::vector<Decimal> decimals(values.size());
    std::size_t frac = 0, exp_digits = 2;
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (!std::isfinite(values[i])) continue;
      decimals[i] = scientific(values[i], dtype, options.precision);
      frac = std::max(frac, decimals[i].digits.size() - 1);
      exp_digits = std::max(exp_digits, std::to_string(std::abs(decimals[i].exponent)).size());
      pad_left = std::max<std::size_t>(pad_left, decimals[i].negative ? 2 : 1);
    }
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (!std::isfinite(values[i])) continue;
      const Decimal& d = decimals[i];
      std::string exp = std::to_string(std::abs(d.exponent));
      out[i] = std::string(d.negative ? "-" : "") + d.digits[0] + "." + d.digits.substr(1) +
               std::string(frac + 1 - d.digits.size(), '0') + "e" + (d.exponent < 0 ? "-" : "+") +
               std::string(exp_digits - exp.size(), '0') + exp;
    }
    pad_right = exp_digits + 2 + frac;
  } else {
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (!std::isfinite(values[i])) continue;
      out[i] = positional(values[i], dtype, options.precision);
      const std::size_t dot = out[i].find('.');
      pad_left = std::max(pad_left, dot);
      pad_right = std::max(pad_right, out[i].size() - dot - 1);
    }
  }
  if (!any_finite) pad_left = pad_right = 0;
  if (any_special) {
    const std::size_t offset = pad_right + 1;  // the fraction and the point
    const std::size_t inf_len = neg_inf ? 4 : 3;
    if (3 > offset) pad_left = std::max(pad_left, 3 - offset);
    if (inf_len > offset) pad_left = std::max(pad_left, inf_len - offset);
  }
  const std::size_t width = pad_left + pad_right + 1;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double v = values[i];
    std::string& s = out[i];
    if (std::isnan(v)) {
      s = "nan";
    } else if (std::isinf(v)) {
      s = v < 0 ? "-inf" : "inf";
    } else {
      const std::size_t dot = s.find('.');
      s = std::string(pad_left - dot, ' ') + s;
      if (!exp_format) s += std::string(width - s.size(), ' ');
      continue;
    }
    s = std::string(width - s.size(), ' ') + s;
  }
  return out;
}

// Right-justifies every string to the longest one (numpy's IntegerFormat and BoolFormat).
void right_justify(std::vector<std::string>& strings) {
  std::size_t width = 0;
  for (const std::string& s : strings) width = std::max(width, s.size());
  for (std::string& s : strings) s.insert(0, width - s.size(), ' ');
}

// ---- layout ---------------------------------------------------------------------------------

struct ArrayPrinter {
  const Tensor& t;
  const PrintOptions& options;
  bool summarise;
  std::vector<std::string> elements;  // shown elements, formatted, in printing order
  std::size_t next = 0;

  bool gap(int64_t n) const { return summarise && 2 * options.edgeitems < n; }

  // Storage offsets of the shown elements, in printing order.
  void shown(int axis, int64_t offset, std::vector<int64_t>& out) const {
    if (axis == t.rank()) {
      out.push_back(offset);
      return;
    }
    const int64_t n = t.shape()[axis], stride = t.strides()[static_cast<std::size_t>(axis)];
    for (int64_t i = 0; i < n; ++i) {
      if (gap(n) && i == options.edgeitems) i = n - options.edgeitems;
      shown(axis + 1, offset + i * stride, out);
    }
  }

  void format_elements() {
    std::vector<int64_t> offsets;
    shown(0, t.offset(), offsets);
    detail::visit_any_dtype(t.dtype(), [&]<typename T>() {
      const T* data = static_cast<const T*>(t.storage()->data());
      if constexpr (detail::is_complex_v<T>) {
        format_complex(data, offsets);
      } else if constexpr (std::is_same_v<T, bool>) {
        for (int64_t o : offsets) elements.emplace_back(data[o] ? "true" : "false");
        right_justify(elements);
      } else if constexpr (std::is_integral_v<T>) {
        for (int64_t o : offsets) elements.push_back(std::to_string(data[o]));
        right_justify(elements);
      } else {
        std::vector<double> values;
        values.reserve(offsets.size());
        for (int64_t o : offsets) values.push_back(static_cast<double>(data[o]));
        elements = format_floats(values, t.dtype(), options);
      }
    });
  }

  // numpy's style: real parts formatted together, imaginary parts with their sign and a "j".
  template <typename C>
  void format_complex(const C* data, const std::vector<int64_t>& offsets) {
    std::vector<double> re, im;
    for (int64_t o : offsets) {
      re.push_back(static_cast<double>(data[o].real()));
      im.push_back(static_cast<double>(data[o].imag()));
    }
    const DType part = real_part_dtype(t.dtype());
    const std::vector<std::string> rs = format_floats(re, part, options);
    const std::vector<std::string> is = format_floats(im, part, options);
    // The imaginary parts' padding goes after the 'j', as numpy prints "1.5-2.j  , 0. +0.25j".
    std::size_t width = 0;
    for (std::size_t k = 0; k < rs.size(); ++k) {
      const std::size_t b = is[k].find_first_not_of(' '), e = is[k].find_last_not_of(' ');
      std::string i = b == std::string::npos ? "" : is[k].substr(b, e - b + 1);
      if (i.empty() || (i[0] != '-' && i[0] != '+')) i = "+" + i;
      elements.push_back(rs[k] + i + "j");
      width = std::max(width, elements.back().size());
    }
    for (std::string& el : elements) el.resize(width, ' ');
  }

  // numpy's _formatArray._recurser (legacy=False), with separator ", ".
  std::string format(int axis, const std::string& hanging_indent, int64_t width) {
    if (axis == t.rank()) return elements[next++];
    const int axes_left = t.rank() - axis;
    const std::string next_indent = hanging_indent + " ";
    const int64_t next_width = width - 1;  // the closing ']'
    const int64_t n = t.shape()[axis];
    const bool summary = gap(n);
    const int64_t items = summary ? 2 * options.edgeitems : n;
    std::string s;
    if (axes_left == 1) {
      const auto elem_width = static_cast<std::size_t>(std::max<int64_t>(width - 1, 0));
      std::string line = hanging_indent;
      auto extend = [&](const std::string& word) {
        // Wrap unless the line holds nothing yet (wrapping would not help).
        if (line.size() + word.size() > elem_width && line.size() > hanging_indent.size()) {
          s += line.substr(0, line.find_last_not_of(' ') + 1) + "\n";
          line = hanging_indent;
        }
        line += word;
      };
      for (int64_t i = 0; i < items; ++i) {
        if (summary && i == options.edgeitems) {
          extend("...");
          line += ", ";
        }
        extend(format(axis + 1, next_indent, next_width));
        if (i + 1 < items) line += ", ";
      }
      s += line;
    } else {
      const std::string line_sep = "," + std::string(static_cast<std::size_t>(axes_left - 1), '\n');
      for (int64_t i = 0; i < items; ++i) {
        if (summary && i == options.edgeitems) s += hanging_indent + "..." + line_sep;
        s += hanging_indent + format(axis + 1, next_indent, next_width);
        if (i + 1 < items) s += line_sep;
      }
    }
    return "[" + s.substr(hanging_indent.size()) + "]";
  }
};

}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "Tensor(undefined)";
  if (t.is_traced()) return os << "Tracer(" << t.type() << ")";
  if (t.numel() == 0) return os << "[]";
  const PrintOptions options = get_printoptions();
  ArrayPrinter p{t, options, t.numel() > options.threshold, {}, 0};
  p.format_elements();
  return os << p.format(0, " ", options.linewidth);
}

std::string to_string(const Tensor& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

}  // namespace kiln
