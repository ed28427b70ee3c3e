// The IR's text form: printer and parser. Values are renumbered in order of definition, so
// the printed form does not depend on internal ids and print(parse(s)) == s.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <sstream>
#include <unordered_map>

#include "kiln/ir.h"
#include "kiln/ops.h"

namespace kiln::ir {
namespace {

// ---- printer -----------------------------------------------------------------------

// "a3", "c0": built with append, which GCC 12's -Wrestrict does not misread.
std::string numbered(char prefix, std::size_t i) { return std::string(1, prefix).append(std::to_string(i)); }

std::string format_element(double v, DType dt) {
  if (dt == bool_) return v != 0 ? "true" : "false";
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::ostringstream os;
  if (is_floating(dt)) {
    os << std::setprecision(dt == float64 ? 17 : 9) << v;
  } else {
    os << static_cast<int64_t>(v);
  }
  return os.str();
}

class Printer {
 public:
  explicit Printer(std::ostringstream& os) : os_(os) {}

  void function(const Function& f, int indent) {
    names_.clear();
    counter_ = 0;
    const std::string pad(static_cast<std::size_t>(indent), ' ');
    os_ << "func @" << f.name << "(";
    for (std::size_t i = 0; i < f.params.size(); ++i) {
      const std::string& n = i < f.param_names.size() ? f.param_names[i] : std::string();
      std::string name = valid_name(n) ? n : numbered('a', i);
      for (const auto& [id, existing] : names_)
        if (existing == name) name = numbered('a', i);
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
             std::all_of(n.begin() + 1, n.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)); }));
  }

  std::string name_of(const Value& v) {
    auto it = names_.find(v.id);
    return it == names_.end() ? numbered('?', static_cast<std::size_t>(v.id)) : it->second;
  }

  void types(const std::vector<TensorType>& ts) {
    if (ts.size() == 1) {
      os_ << ts[0];
      return;
    }
    os_ << "(";
    for (std::size_t i = 0; i < ts.size(); ++i) os_ << (i ? ", " : "") << ts[i];
    os_ << ")";
  }

  void constant(const Tensor& t) {
    const std::vector<double> v = t.to_vector<double>();
    if (t.rank() == 0) {
      os_ << format_element(v[0], t.dtype());
      return;
    }
    os_ << "[";
    for (std::size_t i = 0; i < v.size(); ++i) os_ << (i ? ", " : "") << format_element(v[i], t.dtype());
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

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  std::shared_ptr<Function> function() {
    auto f = std::make_shared<Function>();
    std::unordered_map<std::string, Value> names;
    int next = 0;
    expect_word("func");
    expect('@');
    f->name = identifier();
    expect('(');
    while (!peek(')')) {
      if (!f->params.empty()) expect(',');
      expect('%');
      const std::string n = identifier();
      expect(':');
      Value v{next++, type()};
      names[n] = v;
      f->params.push_back(v);
      f->param_names.push_back(n);
    }
    expect(')');
    expect('-');
    expect('>');
    types();
    expect('{');
    while (true) {
      skip_space();
      if (try_word("return")) break;
      std::vector<std::string> outs;
      do {
        expect('%');
        outs.push_back(identifier());
      } while (try_char(','));
      expect('=');
      const std::string op = identifier();
      if (op == "const") {
        const std::vector<double> values = literal_values();
        expect(':');
        const TensorType t = type();
        Value v{next++, t};
        names[outs.at(0)] = v;
        f->constants.push_back({v, from_values(values, t)});
        continue;
      }
      Equation e;
      e.prim = find_primitive(op);
      if (!e.prim) error("unknown primitive '" + op + "'");
      e.inputs = uses(names);
      if (peek('{')) e.attrs = attrs();
      expect(':');
      const std::vector<TensorType> ts = types();
      if (ts.size() != outs.size()) error("result count differs from the number of types");
      for (std::size_t i = 0; i < outs.size(); ++i) {
        Value v{next++, ts[i]};
        names[outs[i]] = v;
        e.outputs.push_back(v);
      }
      f->equations.push_back(std::move(e));
    }
    f->results = uses(names);
    expect('}');
    return f;
  }

  // "%a, %b, ..." (possibly empty): values defined above.
  std::vector<Value> uses(const std::unordered_map<std::string, Value>& names) {
    std::vector<Value> out;
    if (!peek('%')) return out;
    do {
      expect('%');
      const std::string n = identifier();
      auto it = names.find(n);
      if (it == names.end()) error("undefined value %" + n);
      out.push_back(it->second);
    } while (try_char(','));
    return out;
  }

  void expect_end() {
    skip_space();
    if (pos_ != s_.size()) error("trailing text");
  }

 private:
  [[noreturn]] void error(const std::string& what) {
    std::size_t line = 1 + static_cast<std::size_t>(std::count(s_.begin(), s_.begin() + static_cast<std::ptrdiff_t>(pos_), '\n'));
    fail("parse", what, ": got '", s_.substr(pos_, 20), "' at line ", line,
         ", expected the IR text form (see docs/DESIGN.md)");
  }
  void skip_space() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool peek(char c) {
    skip_space();
    return pos_ < s_.size() && s_[pos_] == c;
  }
  bool try_char(char c) {
    if (!peek(c)) return false;
    ++pos_;
    return true;
  }
  void expect(char c) {
    if (!try_char(c)) error(std::string("expected '") + c + "'");
  }
  std::string identifier() {
    skip_space();
    const std::size_t b = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_' || s_[pos_] == '.'))
      ++pos_;
    if (b == pos_) error("expected a name");
    return std::string(s_.substr(b, pos_ - b));
  }
  bool try_word(std::string_view w) {
    skip_space();
    if (s_.substr(pos_, w.size()) != w) return false;
    const std::size_t e = pos_ + w.size();
    if (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) return false;
    pos_ = e;
    return true;
  }
  void expect_word(std::string_view w) {
    if (!try_word(w)) error("expected '" + std::string(w) + "'");
  }
  double number() {
    skip_space();
    if (try_word("true")) return 1;
    if (try_word("false")) return 0;
    if (try_word("nan")) return NAN;
    if (try_word("inf")) return INFINITY;
    if (s_.substr(pos_, 4) == "-inf") {
      pos_ += 4;
      return -INFINITY;
    }
    const std::string rest(s_.substr(pos_, 40));
    char* end = nullptr;
    const double v = std::strtod(rest.c_str(), &end);
    if (end == rest.c_str()) error("expected a number");
    pos_ += static_cast<std::size_t>(end - rest.c_str());
    return v;
  }
  TensorType type() {
    const std::string d = identifier();
    const std::optional<DType> dt = dtype_from_name(d);
    if (!dt) error("unknown dtype '" + d + "'");
    expect('[');
    Shape s;
    while (!peek(']')) {
      if (s.rank()) expect(',');
      s.dims().push_back(static_cast<int64_t>(number()));
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
  std::vector<double> literal_values() {
    std::vector<double> v;
    if (!try_char('[')) return {number()};
    while (!peek(']')) {
      if (!v.empty()) expect(',');
      v.push_back(number());
    }
    expect(']');
    return v;
  }
  static Tensor from_values(const std::vector<double>& v, const TensorType& t) {
    return astype(tensor(v, t.shape), t.dtype);
  }
  Attrs attrs() {
    Attrs a;
    expect('{');
    while (!peek('}')) {
      if (!a.empty()) expect(',');
      const std::string name = identifier();
      expect('=');
      a.set(name, attr_value());
    }
    expect('}');
    return a;
  }
  AttrValue attr_value() {
    skip_space();
    if (s_.substr(pos_, 4) == "func") return FunctionRef(function());
    if (peek('"')) {
      ++pos_;
      const std::size_t b = pos_;
      while (pos_ < s_.size() && s_[pos_] != '"') ++pos_;
      std::string str(s_.substr(b, pos_ - b));
      expect('"');
      return str;
    }
    if (try_char('[')) {
      std::vector<int64_t> v;
      while (!peek(']')) {
        if (!v.empty()) expect(',');
        v.push_back(static_cast<int64_t>(number()));
      }
      expect(']');
      return v;
    }
    if (try_word("true")) return true;
    if (try_word("false")) return false;
    if (std::isalpha(static_cast<unsigned char>(s_[pos_])) && s_.substr(pos_, 3) != "nan" &&
        s_.substr(pos_, 3) != "inf") {
      const std::string d = identifier();
      if (auto dt = dtype_from_name(d)) return *dt;
      error("unknown attribute value '" + d + "'");
    }
    // Integers print without a point; doubles always with one (or as nan/inf/exponent).
    const std::size_t b = pos_;
    const double v = number();
    const std::string_view tok = s_.substr(b, pos_ - b);
    if (tok.find_first_of(".eEni") == std::string_view::npos) return static_cast<int64_t>(v);
    return v;
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
  auto f = p.function();
  p.expect_end();
  verify(*f);
  return f;
}

}  // namespace kiln::ir
