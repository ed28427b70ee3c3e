// The IR's text form: printer and parser. Values are renumbered in order of definition, so
// the printed form does not depend on internal ids and print(parse(s)) == s.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <limits>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "kiln/ir.h"

namespace kiln::ir {
namespace {

// ---- printer -----------------------------------------------------------------------

// "a3", "c0": built with append, which GCC 12's -Wrestrict does not misread.
std::string numbered(char prefix, std::size_t i) {
  return std::string(1, prefix).append(std::to_string(i));
}

std::string format_element(double v, DType dt) {
  if (dt == bool_) return v != 0 ? "true" : "false";
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::ostringstream os;
  os << std::setprecision(dt == float64 ? 17 : 9) << v;
  return os.str();
}

// "f32[3]" for one type, "(f32[3], i32[])" for any other number.
std::string types_text(const std::vector<TensorType>& ts) {
  if (ts.size() == 1) return ts[0].to_string();
  std::string s = "(";
  for (std::size_t i = 0; i < ts.size(); ++i) s += (i ? ", " : "") + ts[i].to_string();
  return s + ")";
}

// Characters a name may have in the text form; others print as '_' so that the text parses.
bool name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
}
std::string function_name(const std::string& name) {
  if (name.empty()) return "f";
  std::string s = name;
  std::replace_if(
      s.begin(), s.end(), [](char c) { return !name_char(c); }, '_');
  return s;
}

// A string attribute between double quotes, with '"' and '\' escaped by '\' so that any
// string reads back as it was (attr_to_string is for messages and does not escape).
std::string string_literal(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + '"';
}

class Printer {
 public:
  explicit Printer(std::ostringstream& os) : os_(os) {}

  void function(const Function& f, int indent) {
    names_.clear();
    counter_ = 0;
    const std::string pad(static_cast<std::size_t>(indent), ' ');
    os_ << "func @" << function_name(f.name) << "(";
    std::unordered_set<std::string> taken;
    for (std::size_t i = 0; i < f.params.size(); ++i) {
      const std::string& n = i < f.param_names.size() ? f.param_names[i] : std::string();
      std::string name = valid_name(n) && !taken.contains(n) ? n : numbered('a', i);
      taken.insert(name);
      names_[f.params[i].id] = name;
      os_ << (i ? ", " : "") << "%" << name << ": " << f.params[i].type;
    }
    os_ << ") -> ";
    types(f.result_types());
    os_ << " {\n";
    std::size_t c = 0;
    for (const Constant& k : f.constants) {
      const std::string name = numbered('c', c++);
      names_[k.value.id] = name;
      os_ << pad << "  %" << name << " = const ";
      constant(k.tensor);
      os_ << " : " << k.value.type << "\n";
    }
    for (const Equation& e : f.equations) {
      os_ << pad << "  ";
      for (std::size_t i = 0; i < e.outputs.size(); ++i) {
        const std::string name = std::to_string(counter_++);
        names_[e.outputs[i].id] = name;
        os_ << (i ? ", " : "") << "%" << name;
      }
      os_ << (e.outputs.empty() ? "" : " = ") << e.prim->name;
      for (std::size_t i = 0; i < e.inputs.size(); ++i)
        os_ << (i ? ", " : " ") << "%" << name_of(e.inputs[i]);
      attrs(e.attrs, indent + 2);
      os_ << " : ";
      std::vector<TensorType> out;
      for (const Value& v : e.outputs) out.push_back(v.type);
      types(out);
      os_ << "\n";
    }
    os_ << pad << "  return";
    for (std::size_t i = 0; i < f.results.size(); ++i)
      os_ << (i ? ", " : " ") << "%" << name_of(f.results[i]);
    os_ << "\n" << pad << "}";
  }

 private:
  static bool valid_name(const std::string& n) {
    if (n.empty() || !(std::isalpha(static_cast<unsigned char>(n[0])) || n[0] == '_')) return false;
    for (char ch : n)
      if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_') return false;
    // Plain numbers and c<N>/a<N> are the printer's own names.
    return !((n[0] == 'c' || n[0] == 'a') && n.size() > 1 &&
             std::all_of(n.begin() + 1, n.end(),
                         [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); }));
  }

  std::string name_of(const Value& v) {
    auto it = names_.find(v.id);
    return it == names_.end() ? numbered('?', static_cast<std::size_t>(v.id)) : it->second;
  }

  void types(const std::vector<TensorType>& ts) { os_ << types_text(ts); }

  // Integers print exactly (an i64 beyond 2^53 has no double), floats with round-trip digits.
  void constant(const Tensor& t) {
    std::vector<std::string> v;
    if (is_integral(t.dtype())) {
      for (int64_t x : t.to_vector<int64_t>()) v.push_back(std::to_string(x));
    } else if (is_complex(t.dtype())) {  // "1.5-2j": one token, the parts as floats print
      const DType part = real_part_dtype(t.dtype());
      for (std::complex<double> x : t.to_vector<std::complex<double>>()) {
        const std::string im = format_element(x.imag(), part);
        v.push_back(format_element(x.real(), part) + (im[0] == '-' ? "" : "+") + im + "j");
      }
    } else {
      for (double x : t.to_vector<double>()) v.push_back(format_element(x, t.dtype()));
    }
    if (t.rank() == 0) {
      os_ << v[0];
      return;
    }
    os_ << "[";
    for (std::size_t i = 0; i < v.size(); ++i) os_ << (i ? ", " : "") << v[i];
    os_ << "]";
  }

  void attrs(const Attrs& a, int indent) {
    if (a.empty()) return;
    os_ << " {";
    bool first = true;
    for (const auto& [name, value] : a.items()) {
      os_ << (first ? "" : ", ") << name << "=";
      first = false;
      if (const auto* fn = std::get_if<FunctionRef>(&value)) {
        Printer inner(os_);
        inner.function(**fn, indent);
      } else if (const auto* str = std::get_if<std::string>(&value)) {
        os_ << string_literal(*str);
      } else {
        os_ << attr_to_string(value);
      }
    }
    os_ << "}";
  }

  std::ostringstream& os_;
  std::unordered_map<int, std::string> names_;
  int counter_ = 0;
};

// ---- parser ------------------------------------------------------------------------

// Largest element count of a declared type. Zero-size dimensions count as one here, so that
// strides fit as well; at 8 bytes an element the byte size of any such tensor fits in int64.
constexpr int64_t kMaxElements = std::numeric_limits<int64_t>::max() / 8;

// What the parser reads: names, numbers and words are runs of these characters.
bool word_char(char c) { return name_char(c) || c == '+' || c == '-'; }

// A literal as written, kept until the type after ':' says how to read it.
struct Token {
  std::string_view text;
  std::size_t pos = 0;
};

// Where a name was defined, for the error that names a second definition.
struct Definition {
  Value value;
  std::size_t pos = 0;
};

// The names of one function's values; a sub-function has its own (it sees nothing outside).
struct Scope {
  std::unordered_map<std::string, Definition> names;
  int next = 0;
};

// Recursive descent over the text form (docs/DESIGN.md, "Text form"). Reads only inside the
// view, checks every number strictly and every equation against its type rule as it goes, so
// that each error carries the line:column of its cause.
class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  // `depth`: how many functions enclose this one (0 at the top level).
  std::shared_ptr<Function> function(int depth) {
    auto f = std::make_shared<Function>();
    Scope scope;
    expect_word("func");
    expect('@');
    f->name = identifier();
    expect('(');
    while (!peek(')')) {
      if (!f->params.empty()) expect(',');
      const std::size_t at = here();
      expect('%');
      const std::string n = identifier();
      expect(':');
      f->params.push_back(define(scope, n, at, type()));
      f->param_names.push_back(n);
    }
    expect(')');
    expect('-');
    expect('>');
    const std::size_t declared_at = here();
    const std::vector<TensorType> declared = types();
    expect('{');
    while (!try_word("return")) statement(*f, scope, depth);
    const std::size_t return_at = here();
    f->results = uses(scope);
    if (f->result_types() != declared)
      error(return_at, "@" + f->name + " returns other types than it declares",
            types_text(f->result_types()),
            types_text(declared) + " as declared at " + where(declared_at));
    expect('}');
    return f;
  }

  void expect_end() {
    if (here() != s_.size())
      error(pos_, "trailing text after the function", snippet(pos_), "the end of the input");
  }

 private:
  void statement(Function& f, Scope& scope, int depth) {
    std::vector<std::pair<std::string, std::size_t>> outs;  // an equation may define nothing
    if (peek('%')) {
      do {
        const std::size_t at = here();
        expect('%');
        std::string n = identifier();
        // Checked here, so that the error points at the name; defined once the types are known.
        for (const auto& [other, other_at] : outs)
          if (other == n) redefined(n, at, other_at);
        if (auto it = scope.names.find(n); it != scope.names.end())
          redefined(n, at, it->second.pos);
        outs.emplace_back(std::move(n), at);
      } while (try_char(','));
      expect('=');
    }
    const std::size_t op_at = here();
    const std::string op = identifier();
    if (op == "const") {
      constant(f, scope, outs, op_at);
      return;
    }
    Equation e;
    e.prim = find_primitive(op);
    if (!e.prim) error(op_at, "unknown primitive", "'" + op + "'", "a registered primitive's name");
    e.inputs = uses(scope);
    if (peek('{')) e.attrs = attrs(depth);
    const std::size_t types_at = here();
    expect(':');
    const std::vector<TensorType> declared = types();
    if (declared.size() != outs.size())
      error(op_at, op + " names another number of values than it declares types",
            std::to_string(outs.size()) + " names",
            std::to_string(declared.size()) + " for the types declared at " + where(types_at));
    std::vector<TensorType> in;
    for (const Value& v : e.inputs) in.push_back(v.type);
    std::vector<TensorType> inferred;
    try {
      inferred = e.prim->infer(in, e.attrs);
    } catch (const Error& err) {
      fail_at(op_at, err.what());
    }
    if (inferred != declared)
      error(types_at, "the declared types of " + op + "'s results differ from its type rule",
            types_text(declared), types_text(inferred));
    for (std::size_t i = 0; i < outs.size(); ++i)
      e.outputs.push_back(define(scope, outs[i].first, outs[i].second, declared[i]));
    f.equations.push_back(std::move(e));
  }

  // "%c = const 1.5 : f32[]" or "%c = const [1, 2] : i32[2]" (a flat list in row-major order).
  void constant(Function& f, Scope& scope,
                const std::vector<std::pair<std::string, std::size_t>>& outs, std::size_t at) {
    if (outs.size() != 1)
      error(at, "a constant defines one value", std::to_string(outs.size()) + " names", "one");
    const std::size_t literal_at = here();
    const bool bracketed = try_char('[');
    std::vector<Token> literals;
    if (bracketed) {
      while (!peek(']')) {
        if (!literals.empty()) expect(',');
        literals.push_back(token("a literal"));
      }
      expect(']');
    } else {
      literals.push_back(token("a literal"));
    }
    expect(':');
    const TensorType t = type();
    if (bracketed != (t.shape.rank() > 0))
      error(literal_at,
            "a constant of type " + t.to_string() + " is written " +
                (bracketed ? "as a list" : "as a scalar"),
            snippet(literal_at),
            bracketed ? "a scalar without brackets" : "a flat list in brackets");
    if (static_cast<int64_t>(literals.size()) != t.shape.numel())
      error(literal_at, "the constant's value count differs from its type",
            std::to_string(literals.size()) + " values",
            std::to_string(t.shape.numel()) + " for " + t.to_string());
    f.constants.push_back(
        {define(scope, outs[0].first, outs[0].second, t), literal_tensor(literals, t)});
  }

  Tensor literal_tensor(const std::vector<Token>& literals, const TensorType& t) {
    auto make = [&]<typename T>(T (Parser::*read)(const Token&)) {
      std::vector<T> v;
      v.reserve(literals.size());
      for (const Token& tok : literals) v.push_back((this->*read)(tok));
      return detail::from_buffer(v.data(), v.size(), t.dtype, t.shape, Loc::current());
    };
    switch (t.dtype) {
      case DType::bool_:
        return make(&Parser::read_bool);
      case DType::uint8:
        return make(&Parser::read_int<uint8_t>);
      case DType::uint32:
        return make(&Parser::read_int<uint32_t>);
      case DType::int32:
        return make(&Parser::read_int<int32_t>);
      case DType::int64:
        return make(&Parser::read_int<int64_t>);
      case DType::float16:
        return make(&Parser::read_float<Half>);
      case DType::bfloat16:
        return make(&Parser::read_float<BFloat16>);
      case DType::float32:
        return make(&Parser::read_float<float>);
      case DType::float64:
        return make(&Parser::real);
      case DType::complex64:
        return make(&Parser::read_complex<float>);
      case DType::complex128:
        return make(&Parser::read_complex<double>);
    }
    fail_at(literals.empty() ? pos_ : literals[0].pos, "internal error: unhandled dtype");
  }

  uint8_t read_bool(const Token& tok) {
    if (tok.text == "true") return 1;
    if (tok.text == "false") return 0;
    error(tok.pos, "invalid bool literal", quoted(tok.text), "true or false");
  }
  template <typename T>
  T read_int(const Token& tok) {
    return static_cast<T>(integer(tok, std::numeric_limits<T>::min(), std::numeric_limits<T>::max(),
                                  dtype_name(dtype_v<T>)));
  }
  // A float literal in a narrower format must not overflow it: 1e39 is no f32.
  template <typename T>
  T read_float(const Token& tok) {
    const double v = real(tok);
    // Beyond the largest float plus half an ulp, rounding to float gives inf.
    const bool fits_float = !std::isfinite(v) || std::abs(v) < 0x1.ffffffp127;
    const T out = fits_float ? T(static_cast<float>(v)) : T();
    if (!fits_float || (std::isfinite(v) && !std::isfinite(static_cast<float>(out))))
      error(tok.pos, std::string("literal out of range for ") + std::string(dtype_name(dtype_v<T>)),
            quoted(tok.text), "a finite value within its range, or inf");
    return out;
  }

  // "re+imj" or "re-imj": the sign that starts the imaginary part is the last '+' or '-' that
  // neither opens the token nor follows an exponent's 'e'.
  template <typename T>
  std::complex<T> read_complex(const Token& tok) {
    const std::string_view s = tok.text;
    std::size_t split = std::string_view::npos;
    for (std::size_t i = s.size(); i-- > 1;)
      if ((s[i] == '+' || s[i] == '-') && s[i - 1] != 'e' && s[i - 1] != 'E') {
        split = i;
        break;
      }
    if (s.empty() || s.back() != 'j' || split == std::string_view::npos)
      error(tok.pos, "invalid complex literal", quoted(tok.text), "re+imj, such as 1.5-2j");
    auto part = [&](std::size_t b, std::size_t e) {
      const Token p{s.substr(b, e - b), tok.pos + b};
      if constexpr (std::is_same_v<T, float>)
        return read_float<float>(p);
      else
        return real(p);
    };
    if (split + 2 > s.size() - 1)  // a sign and no digits before the 'j'
      error(tok.pos, "invalid complex literal", quoted(tok.text), "re+imj, such as 1.5-2j");
    return {part(0, split), part(split + (s[split] == '+'), s.size() - 1)};
  }

  // An integer in [lo, hi], written in decimal without a '+'.
  int64_t integer(const Token& tok, int64_t lo, int64_t hi, std::string_view what) {
    int64_t v = 0;
    const char* b = tok.text.data();
    const char* e = b + tok.text.size();
    const auto [ptr, ec] = std::from_chars(b, e, v);
    if (ec == std::errc() && ptr == e && v >= lo && v <= hi) return v;
    const bool range =
        (ec == std::errc::result_out_of_range && ptr == e) || (ec == std::errc() && ptr == e);
    error(tok.pos,
          range ? std::string("integer out of range for ") + std::string(what) : "invalid integer",
          quoted(tok.text),
          range ? "a value in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]"
                : "decimal digits");
  }
  // A double: decimal or exponent form, nan, inf or -inf; never out of f64's range.
  double real(const Token& tok) {
    double v = 0;
    const char* b = tok.text.data();
    const char* e = b + tok.text.size();
    const auto [ptr, ec] = std::from_chars(b, e, v, std::chars_format::general);
    if (ec == std::errc() && ptr == e) return v;
    if (ec == std::errc::result_out_of_range && ptr == e)
      error(tok.pos, "number out of range for f64", quoted(tok.text),
            "a value representable as a double");
    error(tok.pos, "invalid number", quoted(tok.text), "a decimal number, nan, inf or -inf");
  }

  Value define(Scope& scope, const std::string& name, std::size_t at, const TensorType& type) {
    const Value v{scope.next++, type};
    const auto [it, fresh] = scope.names.try_emplace(name, Definition{v, at});
    if (!fresh) redefined(name, at, it->second.pos);
    return v;
  }
  [[noreturn]] void redefined(const std::string& name, std::size_t at, std::size_t first) const {
    error(at, "value %" + name + " defined twice", "a second definition",
          "one definition (the first is at " + where(first) + ")");
  }

  // "%a, %b, ..." (possibly empty): values defined above.
  std::vector<Value> uses(const Scope& scope) {
    std::vector<Value> out;
    if (!peek('%')) return out;
    do {
      const std::size_t at = here();
      expect('%');
      const std::string n = identifier();
      auto it = scope.names.find(n);
      if (it == scope.names.end())
        error(at, "undefined value %" + n, "a use before any definition",
              "values defined above their uses");
      out.push_back(it->second.value);
    } while (try_char(','));
    return out;
  }

  TensorType type() {
    const std::size_t at = here();
    const std::string d = identifier();
    const std::optional<DType> dt = dtype_from_name(d);
    if (!dt)
      error(at, "unknown dtype", "'" + d + "'",
            "one of bool, u8, u32, i32, i64, f16, bf16, f32, f64");
    expect('[');
    Shape s;
    int64_t count = 1;  // of the non-zero dimensions
    while (!peek(']')) {
      if (s.rank()) expect(',');
      const Token tok = token("a dimension");
      const int64_t n = integer(tok, 0, kMaxElements, "a dimension");
      if (n > 0 && count > kMaxElements / n)
        error(
            tok.pos, "type too large",
            "dimension " + std::string(tok.text) + " after " + std::to_string(count) + " elements",
            "at most " + std::to_string(kMaxElements) +
                " elements (zero-size dimensions counting as one)");
      if (n > 0) count *= n;
      s.dims().push_back(n);
    }
    expect(']');
    return {*dt, s};
  }
  std::vector<TensorType> types() {
    if (!try_char('(')) return {type()};
    std::vector<TensorType> ts;
    while (!peek(')')) {
      if (!ts.empty()) expect(',');
      ts.push_back(type());
    }
    expect(')');
    return ts;
  }

  Attrs attrs(int depth) {
    Attrs a;
    expect('{');
    bool first = true;
    while (!peek('}')) {
      if (!first) expect(',');
      first = false;
      const std::size_t at = here();
      const std::string name = identifier();
      if (a.has(name)) error(at, "attribute '" + name + "' given twice", "a second value", "one");
      expect('=');
      a.set(name, attr_value(depth));
    }
    expect('}');
    return a;
  }
  AttrValue attr_value(int depth) {
    const std::size_t at = here();
    if (at == s_.size()) error(at, "missing attribute value", "the end of the input", "a value");
    if (s_[at] == '"') return string_value(at);
    if (try_char('[')) {
      std::vector<int64_t> v;
      while (!peek(']')) {
        if (!v.empty()) expect(',');
        v.push_back(integer(token("an integer"), std::numeric_limits<int64_t>::min(),
                            std::numeric_limits<int64_t>::max(), "i64"));
      }
      expect(']');
      return v;
    }
    if (try_word("func")) {
      if (depth >= kMaxNesting)
        error(at, "sub-functions nested too deeply",
              "one more than " + std::to_string(kMaxNesting) + " levels",
              "at most ir::kMaxNesting = " + std::to_string(kMaxNesting));
      pos_ = at;
      return FunctionRef(function(depth + 1));
    }
    const Token tok = token("an attribute value");
    if (tok.text == "true") return true;
    if (tok.text == "false") return false;
    if (auto dt = dtype_from_name(tok.text)) return *dt;
    // Integers print without a point; doubles always with one (or as nan/inf/exponent).
    if (tok.text.find_first_of(".eEnNiI") == std::string_view::npos)
      return integer(tok, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                     "i64");
    return real(tok);
  }

  // A string literal starting at the '"' at `at`, as string_literal writes it.
  std::string string_value(std::size_t at) {
    std::string out;
    for (std::size_t i = at + 1; i < s_.size(); ++i) {
      if (s_[i] == '"') {
        pos_ = i + 1;
        return out;
      }
      if (s_[i] == '\\') {
        if (i + 1 == s_.size()) break;
        if (s_[i + 1] != '"' && s_[i + 1] != '\\')
          error(i, "invalid escape in a string", quoted(s_.substr(i, 2)), "\\\" or \\\\");
        ++i;
      }
      out += s_[i];
    }
    error(at, "unterminated string", snippet(at), "a closing '\"'");
  }

  // ---- lexing ----

  std::size_t here() {
    skip_space();
    return pos_;
  }
  void skip_space() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool peek(char c) { return here() < s_.size() && s_[pos_] == c; }
  bool try_char(char c) {
    if (!peek(c)) return false;
    ++pos_;
    return true;
  }
  void expect(char c) {
    if (!try_char(c)) error(pos_, "", snippet(pos_), std::string("'") + c + "'");
  }
  std::string identifier() {
    const std::size_t b = here();
    while (pos_ < s_.size() && name_char(s_[pos_])) ++pos_;
    if (b == pos_) error(pos_, "", snippet(pos_), "a name");
    return std::string(s_.substr(b, pos_ - b));
  }
  Token token(std::string_view what) {
    const std::size_t b = here();
    while (pos_ < s_.size() && word_char(s_[pos_])) ++pos_;
    if (b == pos_) error(pos_, "", snippet(pos_), std::string(what));
    return {s_.substr(b, pos_ - b), b};
  }
  bool try_word(std::string_view w) {
    const std::size_t b = here();
    if (s_.substr(b, w.size()) != w) return false;
    const std::size_t e = b + w.size();
    if (e < s_.size() && word_char(s_[e])) return false;
    pos_ = e;
    return true;
  }
  void expect_word(std::string_view w) {
    if (!try_word(w)) error(pos_, "", snippet(pos_), "'" + std::string(w) + "'");
  }

  // ---- errors ----

  std::string where(std::size_t pos) const {
    const std::string_view before = s_.substr(0, pos);
    const std::size_t line =
        1 + static_cast<std::size_t>(std::count(before.begin(), before.end(), '\n'));
    const std::size_t nl = before.rfind('\n');
    const std::size_t column = nl == std::string_view::npos ? pos + 1 : pos - nl;
    return std::to_string(line) + ":" + std::to_string(column);
  }
  // The text at pos, up to the end of its line (at most 20 characters).
  std::string snippet(std::size_t pos) const {
    if (pos >= s_.size()) return "the end of the input";
    const std::string_view rest = s_.substr(pos, 20);
    return quoted(rest.substr(0, rest.find('\n')));
  }
  // Built with append, which GCC 12's -Wrestrict does not misread.
  static std::string quoted(std::string_view s) {
    return std::string(1, '\'').append(s).append(1, '\'');
  }
  [[noreturn]] void fail_at(std::size_t pos, std::string_view message) const {
    fail("parse", "line ", where(pos), ": ", message);
  }
  [[noreturn]] void error(std::size_t pos, const std::string& what, const std::string& got,
                          const std::string& expected) const {
    fail_at(pos, (what.empty() ? "" : what + ": ") + "got " + got + ", expected " + expected);
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

}  // namespace

std::string print(const Function& f) {
  std::ostringstream os;
  Printer(os).function(f, 0);
  return os.str();
}

std::shared_ptr<Function> parse(std::string_view text) {
  Parser p(text);
  auto f = p.function(0);
  p.expect_end();
  verify(*f);
  return f;
}

}  // namespace kiln::ir
