// TreeDef: text form, equality, hashing, differences and leaf paths (the non-template half of
// include/kiln/tree.h).
#include "kiln/tree.h"

#include <bit>
#include <charconv>
#include <cstdio>
#include <initializer_list>
#include <ostream>

#include "kiln/printing.h"

namespace kiln {

namespace {

using Kind = TreeDef::Kind;

// Concatenation by appending: `"lit" + std::string` trips GCC 12's -Wrestrict false positive.
std::string str(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view p : parts) out.append(p);
  return out;
}

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// Shortest text that reads back as the same double; always looks like a float ("3.0", not "3"),
// so that an int 3 and a double 3 print differently.
std::string format_double(double d) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // 'n': inf and nan
  return s;
}

std::string format_static(const StaticValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using X = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<X, int64_t>)
          return std::to_string(x);
        else if constexpr (std::is_same_v<X, double>)
          return format_double(x);
        else if constexpr (std::is_same_v<X, bool>)
          return x ? "true" : "false";
        else
          return quote(x);
      },
      v);
}

bool same_static(const StaticValue& a, const StaticValue& b) {
  if (a.index() != b.index()) return false;
  if (const double* x = std::get_if<double>(&a)) {
    return std::bit_cast<uint64_t>(*x) == std::bit_cast<uint64_t>(std::get<double>(b));
  }
  return a == b;
}

void hash_combine(std::size_t& seed, std::size_t h) {
  seed ^= h + 0x9e3779b97f4a7c15ULL + (seed << 6) + (seed >> 2);
}

const char* kind_word(Kind k) {
  switch (k) {
    case Kind::vector:
      return "vector";
    case Kind::array:
      return "array";
    case Kind::tuple:
      return "tuple";
    default:
      return "node";
  }
}

std::string join(const std::vector<std::string>& parts, bool quoted) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i) out += ", ";
    out += quoted ? quote(parts[i]) : parts[i];
  }
  return out;
}

// What one node is, in the words error messages use.
std::string describe(const TreeDef& d) {
  switch (d.kind) {
    case Kind::leaf:
      return "tensor";
    case Kind::static_leaf:
      return str({"static value ", format_static(d.value)});
    case Kind::vector:
    case Kind::array:
    case Kind::tuple:
      return str({kind_word(d.kind), " of ", std::to_string(d.children.size()), " children"});
    case Kind::map:
      return str({"map with keys [", join(d.names, true), "]"});
    case Kind::optional:
      return d.children.empty() ? "empty optional" : "optional with a value";
    case Kind::structure:
      return str({"struct ", d.type_name, " with fields (", join(d.names, false), ")"});
  }
  return "?";
}

struct Diff {
  std::string path, summary, a, b;
};

std::optional<Diff> diff(const TreeDef& a, const TreeDef& b, const std::string& path) {
  auto differ = [&](std::string summary) {
    return Diff{path, std::move(summary), describe(a), describe(b)};
  };
  if (a.kind != b.kind) return differ(str({describe(a), " vs ", describe(b)}));
  auto children = [&](auto step) -> std::optional<Diff> {
    for (std::size_t i = 0; i < a.children.size(); ++i) {
      if (auto d = diff(a.children[i], b.children[i], path + step(i))) return d;
    }
    return std::nullopt;
  };
  switch (a.kind) {
    case Kind::leaf:
      return std::nullopt;
    case Kind::static_leaf:
      if (same_static(a.value, b.value)) return std::nullopt;
      return differ(str({"static value ", format_static(a.value), " vs ", format_static(b.value)}));
    case Kind::vector:
    case Kind::array:
    case Kind::tuple:
      if (a.children.size() != b.children.size()) {
        return differ(str({kind_word(a.kind), " of ", std::to_string(a.children.size()), " vs ",
                           std::to_string(b.children.size()), " children"}));
      }
      return children([](std::size_t i) { return str({"[", std::to_string(i), "]"}); });
    case Kind::map:
      if (a.names != b.names || a.children.size() != b.children.size()) {
        return differ(str({"map keys [", join(a.names, true), "] vs [", join(b.names, true), "]"}));
      }
      return children([&](std::size_t i) { return str({"[", quote(a.names[i]), "]"}); });
    case Kind::optional:
      if (a.children.size() != b.children.size()) {
        return differ(str({describe(a), " vs ", describe(b)}));
      }
      return children([](std::size_t) { return std::string(); });
    case Kind::structure:
      if (a.type_name != b.type_name) {
        return differ(str({"struct ", a.type_name, " vs struct ", b.type_name}));
      }
      if (a.names != b.names || a.children.size() != b.children.size()) {
        return differ(str({"struct ", a.type_name, " fields (", join(a.names, false), ") vs (",
                           join(b.names, false), ")"}));
      }
      return children([&](std::size_t i) { return str({".", a.names[i]}); });
  }
  return std::nullopt;
}

std::string path_or_root(const std::string& path) { return path.empty() ? "(root)" : path; }

// Walks to every Tensor leaf, building its path with `step(prefix, kind, i)`.
template <class Step>
void collect_paths(const TreeDef& d, const std::string& prefix, const Step& step,
                   std::vector<std::string>& out) {
  switch (d.kind) {
    case Kind::leaf:
      out.push_back(prefix);
      return;
    case Kind::static_leaf:
      return;
    case Kind::optional:
      for (const TreeDef& c : d.children) collect_paths(c, prefix, step, out);
      return;
    default:
      for (std::size_t i = 0; i < d.children.size(); ++i) {
        collect_paths(d.children[i], step(prefix, d, i), step, out);
      }
  }
}

}  // namespace

std::size_t TreeDef::num_leaves() const {
  if (kind == Kind::leaf) return 1;
  std::size_t n = 0;
  for (const TreeDef& c : children) n += c.num_leaves();
  return n;
}

std::string TreeDef::to_string() const {
  auto list = [&](const char* open, const char* close, bool named, bool quoted) {
    std::string s = open;
    for (std::size_t i = 0; i < children.size(); ++i) {
      if (i) s += ", ";
      if (named && i < names.size()) s += (quoted ? quote(names[i]) : names[i]) + ": ";
      s += children[i].to_string();
    }
    return s + close;
  };
  switch (kind) {
    case Kind::leaf:
      return "*";
    case Kind::static_leaf:
      return format_static(value);
    case Kind::vector:
      return list("[", "]", false, false);
    case Kind::array:
      return list("array[", "]", false, false);
    case Kind::map:
      return list("{", "}", true, true);
    case Kind::tuple:
      return list("(", ")", false, false);
    case Kind::optional:
      return list("optional(", ")", false, false);
    case Kind::structure:
      return type_name + list("{", "}", true, false);
  }
  return "?";
}

std::size_t TreeDef::hash() const noexcept {
  std::size_t h = static_cast<std::size_t>(kind);
  if (kind == Kind::static_leaf) {
    std::size_t v = 0;
    if (const double* d = std::get_if<double>(&value)) {
      v = std::hash<uint64_t>{}(std::bit_cast<uint64_t>(*d));
    } else {
      v = std::visit([](const auto& x) { return std::hash<std::decay_t<decltype(x)>>{}(x); },
                     value);
    }
    hash_combine(h, value.index());
    hash_combine(h, v);
  }
  hash_combine(h, std::hash<std::string>{}(type_name));
  for (const std::string& n : names) hash_combine(h, std::hash<std::string>{}(n));
  hash_combine(h, children.size());
  for (const TreeDef& c : children) hash_combine(h, c.hash());
  return h;
}

bool TreeDef::operator==(const TreeDef& other) const {
  if (kind != other.kind || type_name != other.type_name || names != other.names ||
      children.size() != other.children.size()) {
    return false;
  }
  if (kind == Kind::static_leaf && !same_static(value, other.value)) return false;
  for (std::size_t i = 0; i < children.size(); ++i) {
    if (!(children[i] == other.children[i])) return false;
  }
  return true;
}

std::ostream& operator<<(std::ostream& os, const TreeDef& def) { return os << def.to_string(); }

// ---- printing trees of tensors -----------------------------------------------------------------

namespace {

struct TreePrinter {
  std::span<const Tensor> leaves;
  std::size_t linewidth;
  std::size_t next = 0;

  // The text of `d`, whose first line starts at column `col`; a multi-line container indents
  // its children by two from `indent`, the indentation of the line it starts on.
  std::string render(const TreeDef& d, std::size_t indent, std::size_t col) {
    switch (d.kind) {
      case Kind::leaf:
        return hang(kiln::to_string(leaves[next++]), col);
      case Kind::static_leaf:
        return format_static(d.value);
      case Kind::vector:
        return list(d, "[", "]", indent, col);
      case Kind::array:
        return list(d, "array[", "]", indent, col);
      case Kind::map:
      case Kind::tuple:
        return list(d, d.kind == Kind::map ? "{" : "(", d.kind == Kind::map ? "}" : ")", indent,
                    col);
      case Kind::optional:
        return list(d, "optional(", ")", indent, col);
      case Kind::structure:
        return list(d, d.type_name + "{", "}", indent, col);
    }
    return "?";
  }

  // Continuation lines of a tensor's text aligned under its first character.
  static std::string hang(const std::string& text, std::size_t col) {
    std::string out;
    for (std::size_t i = 0; i < text.size(); ++i) {
      out += text[i];
      if (text[i] == '\n' && i + 1 < text.size() && text[i + 1] != '\n') out.append(col, ' ');
    }
    return out;
  }

  std::string list(const TreeDef& d, const std::string& open, const char* close, std::size_t indent,
                   std::size_t col) {
    const std::size_t child_indent = indent + 2;
    std::vector<std::string> items;
    bool one_line = true;
    std::size_t length = col + open.size() + 1;
    for (std::size_t i = 0; i < d.children.size(); ++i) {
      std::string key;
      if (d.kind == Kind::map) key = quote(d.names[i]) + ": ";
      if (d.kind == Kind::structure) key = d.names[i] + ": ";
      items.push_back(key + render(d.children[i], child_indent, child_indent + key.size()));
      one_line = one_line && items.back().find('\n') == std::string::npos;
      length += items.back().size() + 2;
    }
    std::string out = open;
    if (one_line && length <= linewidth + 2) {
      for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
      return out + close;
    }
    for (std::size_t i = 0; i < items.size(); ++i)
      out += "\n" + std::string(child_indent, ' ') + items[i] + (i + 1 < items.size() ? "," : "");
    return out + "\n" + std::string(indent, ' ') + close;
  }
};

}  // namespace

namespace detail {

std::string tree_text(const TreeDef& def, std::span<const Tensor> leaves) {
  if (leaves.size() != def.num_leaves()) {
    fail("tree_text", "wrong number of leaves for ", def.to_string(), ": got ", leaves.size(),
         ", expected ", def.num_leaves());
  }
  TreePrinter p{leaves, static_cast<std::size_t>(get_printoptions().linewidth)};
  return p.render(def, 0, 0);
}

std::ostream& print_tree(std::ostream& os, const TreeDef& def, std::span<const Tensor> leaves) {
  return os << tree_text(def, leaves);
}

}  // namespace detail

std::optional<std::string> first_difference(const TreeDef& a, const TreeDef& b) {
  auto d = diff(a, b, "");
  if (!d) return std::nullopt;
  return str({path_or_root(d->path), ": ", d->summary});
}

std::vector<std::string> tree_paths(const TreeDef& def) {
  std::vector<std::string> out;
  collect_paths(
      def, "",
      [](const std::string& prefix, const TreeDef& d, std::size_t i) {
        switch (d.kind) {
          case Kind::map:
            return str({prefix, "[", quote(d.names[i]), "]"});
          case Kind::structure:
            return str({prefix, ".", d.names[i]});
          default:
            return str({prefix, "[", std::to_string(i), "]"});
        }
      },
      out);
  return out;
}

std::vector<std::string> tree_names(const TreeDef& def) {
  std::vector<std::string> out;
  collect_paths(
      def, "",
      [](const std::string& prefix, const TreeDef& d, std::size_t i) {
        const bool named = d.kind == Kind::map || d.kind == Kind::structure;
        std::string step = named ? d.names[i] : std::to_string(i);
        return prefix.empty() ? step : str({prefix, ".", step});
      },
      out);
  return out;
}

namespace detail {

std::string render_path(const TreePathLink* at) {
  std::vector<const TreePathLink*> steps;
  for (; at != nullptr; at = at->parent) steps.push_back(at);
  std::string out;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const TreePathLink& s = **it;
    switch (s.step) {
      case TreePathLink::Step::field:
        out.append(".").append(s.name);
        break;
      case TreePathLink::Step::key:
        out.append("[").append(quote(s.name)).append("]");
        break;
      case TreePathLink::Step::index:
        out.append("[").append(std::to_string(s.index)).append("]");
        break;
    }
  }
  return out;
}

void tree_mismatch(const TreeDef& got, std::string_view expected, const TreePathLink* at) {
  fail("tree_unflatten", "structure does not match the type at ", path_or_root(render_path(at)),
       ": got ", describe(got), ", expected ", expected);
}

void tree_out_of_leaves(const TreePathLink* at) {
  fail("tree_unflatten", "ran out of leaves at ", path_or_root(render_path(at)),
       ": got fewer leaves, expected one more tensor");
}

void check_same_structure(std::string_view op, const TreeDef& expected, const TreeDef& got,
                          std::size_t got_index) {
  if (auto d = diff(got, expected, "")) {
    fail(op, "structures differ at ", path_or_root(d->path), ": got ", d->a, " in tree ", got_index,
         ", expected ", d->b, " as in tree 1");
  }
}

std::string describe_fields(const char* type_name, std::span<const std::string_view> fields) {
  std::string out = std::string("struct ") + type_name + " with fields (";
  for (std::size_t i = 0; i < fields.size(); ++i) {
    if (i) out += ", ";
    out += fields[i];
  }
  return out + ")";
}

}  // namespace detail
}  // namespace kiln
