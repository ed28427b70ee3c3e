// Tensor products: einsum, tensordot, outer and kron as compositions of primitives.
//
// einsum works on labelled operands: each axis carries an integer label (letters 0..51, the
// ellipsis's axes 52 and up). Every operand first loses what concerns it alone (size-1 axes that
// broadcast, repeated labels as diagonals, labels seen nowhere else summed); then pairs are
// contracted, greedily as opt_einsum does, each pair as one batched matmul of
// [batch, m, k] x [batch, k, n] whose operands are arranged so that reshapes stay views where
// the axis order allows (matmul takes transposed views without copying).
#include "kiln/einsum.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <string>

#include "kiln/indexing.h"
#include "ops/rules.h"

namespace kiln {
namespace {

constexpr std::string_view kOp = "einsum";
constexpr int kLetters = 52;  // labels of the ellipsis's axes start here

using Labels = std::vector<int>;

struct Operand {
  Tensor x;
  Labels labels;  // one per axis of x
};

int letter_label(char c) {
  if (c >= 'a' && c <= 'z') return c - 'a';
  if (c >= 'A' && c <= 'Z') return 26 + (c - 'A');
  return -1;
}

// The character a letter label was written as (numpy orders implicit outputs by it).
char label_char(int l) { return l < 26 ? char('a' + l) : char('A' + (l - 26)); }

// One term of a subscript string: its letters in order, with the place of its ellipsis.
struct Term {
  Labels letters;
  std::optional<std::size_t> ellipsis;  // letters before it
};

[[noreturn]] void bad(std::string_view subscripts, const auto&... what) {
  fail(kOp, "invalid subscripts \"", subscripts, "\": ", what...);
}

Term parse_term(std::string_view subscripts, std::string_view term) {
  Term t;
  for (std::size_t i = 0; i < term.size(); ++i) {
    const char c = term[i];
    if (c == ' ') continue;
    if (c == '.') {
      if (term.substr(i, 3) != "...")
        bad(subscripts, "a '.' outside an ellipsis, expected \"...\"");
      if (t.ellipsis)
        bad(subscripts, "two ellipses in the term \"", term, "\", expected at most one");
      t.ellipsis = t.letters.size();
      i += 2;
      continue;
    }
    const int l = letter_label(c);
    if (l < 0)
      bad(subscripts, "the character '", c, "', expected letters a-z, A-Z, ',', \"->\" or \"...\"");
    t.letters.push_back(l);
  }
  return t;
}

struct Parsed {
  std::vector<Term> inputs;
  std::optional<Term> output;  // nullopt: implicit
};

Parsed parse(std::string_view s) {
  Parsed p;
  std::string_view lhs = s;
  if (const std::size_t arrow = s.find("->"); arrow != std::string_view::npos) {
    lhs = s.substr(0, arrow);
    const std::string_view rhs = s.substr(arrow + 2);
    if (rhs.find("->") != std::string_view::npos) bad(s, "two \"->\", expected at most one");
    if (rhs.find(',') != std::string_view::npos)
      bad(s, "a ',' in the output, expected one output term");
    p.output = parse_term(s, rhs);
  } else if (s.find('-') != std::string_view::npos || s.find('>') != std::string_view::npos) {
    bad(s, "a '-' or '>' outside \"->\"");
  }
  std::size_t begin = 0;
  while (true) {
    const std::size_t comma = lhs.find(',', begin);
    p.inputs.push_back(parse_term(s, lhs.substr(begin, comma - begin)));
    if (comma == std::string_view::npos) break;
    begin = comma + 1;
  }
  return p;
}

// The labels of a term applied to an operand of `rank` axes: the ellipsis's i-th axis from the
// right is kLetters + i.
Labels expand(std::string_view s, const Term& t, int rank, std::size_t which) {
  const int named = static_cast<int>(t.letters.size());
  if (t.ellipsis ? rank < named : rank != named)
    bad(s, "operand ", which, " has rank ", rank, " but its term names ", named, " axes",
        t.ellipsis ? " (plus an ellipsis)" : "", ", expected one letter per axis");
  Labels out(t.letters.begin(),
             t.letters.begin() + static_cast<std::ptrdiff_t>(t.ellipsis.value_or(0)));
  if (t.ellipsis) {
    for (int i = rank - named - 1; i >= 0; --i) out.push_back(kLetters + i);
    out.insert(out.end(), t.letters.begin() + static_cast<std::ptrdiff_t>(*t.ellipsis),
               t.letters.end());
  } else {
    out = t.letters;
  }
  return out;
}

// The positions of the first label that occurs twice.
std::optional<std::pair<std::size_t, std::size_t>> repeated(const Labels& ls) {
  for (std::size_t p = 0; p < ls.size(); ++p)
    for (std::size_t q = p + 1; q < ls.size(); ++q)
      if (ls[p] == ls[q]) return std::pair{p, q};
  return std::nullopt;
}

bool contains(const Labels& ls, int l) { return std::find(ls.begin(), ls.end(), l) != ls.end(); }

Tensor permuted(const Tensor& x, const Labels& from, const Labels& to, Loc loc) {
  Axes perm;
  for (int l : to) perm.push_back(std::find(from.begin(), from.end(), l) - from.begin());
  Axes identity(perm.size());
  std::iota(identity.begin(), identity.end(), 0);
  return perm == identity ? x : transpose(x, perm, loc);
}

class Contraction {
 public:
  Contraction(std::string_view s, Labels output, std::map<int, int64_t> sizes, Loc loc)
      : s_(s), output_(std::move(output)), sizes_(std::move(sizes)), loc_(loc) {}

  Tensor run(std::vector<Operand> ops) {
    for (std::size_t i = 0; i < ops.size(); ++i) ops[i] = simplify(std::move(ops[i]), ops, i);
    while (ops.size() > 1) {
      const auto [i, j] = pick(ops);
      Operand c = contract(ops[i], ops[j], ops, i, j);
      ops.erase(ops.begin() + static_cast<std::ptrdiff_t>(j));
      ops[i] = simplify(std::move(c), ops, i);
    }
    Operand& last = ops.front();
    Labels present;
    std::vector<int64_t> shape;
    for (int l : output_) {
      if (contains(last.labels, l)) present.push_back(l);
      shape.push_back(sizes_.at(l));
    }
    // Output labels every operand broadcast (size 1 throughout) come back as size-1 axes.
    return reshape(permuted(last.x, last.labels, present, loc_), Shape(shape), loc_);
  }

 private:
  // Labels needed after operand `skip` (and `skip2`) are consumed: the output's and the others'.
  bool kept(int l, const std::vector<Operand>& ops, std::size_t skip, std::size_t skip2) const {
    if (contains(output_, l)) return true;
    for (std::size_t k = 0; k < ops.size(); ++k)
      if (k != skip && k != skip2 && contains(ops[k].labels, l)) return true;
    return false;
  }

  // Drops broadcast size-1 axes, takes diagonals of repeated labels, sums private labels.
  Operand simplify(Operand o, const std::vector<Operand>& ops, std::size_t self) const {
    Labels kept_labels;
    std::vector<int64_t> shape;
    for (int a = 0; a < o.x.rank(); ++a) {
      const int l = o.labels[static_cast<std::size_t>(a)];
      if (o.x.shape()[a] == 1 && sizes_.at(l) != 1) continue;
      kept_labels.push_back(l);
      shape.push_back(o.x.shape()[a]);
    }
    if (kept_labels.size() != o.labels.size()) {
      o.x = reshape(o.x, Shape(shape), loc_);
      o.labels = kept_labels;
    }
    while (const std::optional<std::pair<std::size_t, std::size_t>> pq = repeated(o.labels)) {
      const auto [p, q] = *pq;
      const int l = o.labels[p];
      o.x = diagonal(o.x, 0, int64_t(p), int64_t(q), loc_);
      o.labels.erase(o.labels.begin() + static_cast<std::ptrdiff_t>(q));
      o.labels.erase(o.labels.begin() + static_cast<std::ptrdiff_t>(p));
      o.labels.push_back(l);
    }
    Axes summed;
    Labels rest;
    for (std::size_t a = 0; a < o.labels.size(); ++a) {
      if (kept(o.labels[a], ops, self, self))
        rest.push_back(o.labels[a]);
      else
        summed.push_back(int64_t(a));
    }
    if (!summed.empty()) {
      o.x = sum(o.x, summed, false, loc_);
      o.labels = rest;
    }
    return o;
  }

  double size_of(const Labels& ls) const {
    double n = 1;
    for (int l : ls) n *= double(sizes_.at(l));
    return n;
  }

  // The labels of contracting a with b: those kept, in a's order then b's.
  Labels result_labels(const std::vector<Operand>& ops, std::size_t i, std::size_t j) const {
    Labels out;
    for (const Labels* ls : {&ops[i].labels, &ops[j].labels})
      for (int l : *ls)
        if (!contains(out, l) && kept(l, ops, i, j)) out.push_back(l);
    return out;
  }

  // opt_einsum's greedy choice: among pairs sharing a label, the one whose result removes the
  // most elements (size(result) - size(a) - size(b) smallest), then the cheapest; pairs sharing
  // nothing (outer products) only when no other is left, smallest first.
  std::pair<std::size_t, std::size_t> pick(const std::vector<Operand>& ops) const {
    struct Score {
      bool outer;
      double removed, cost;
      auto operator<=>(const Score&) const = default;
    };
    std::optional<Score> best;
    std::pair<std::size_t, std::size_t> at{0, 1};
    for (std::size_t i = 0; i < ops.size(); ++i)
      for (std::size_t j = i + 1; j < ops.size(); ++j) {
        const Labels r = result_labels(ops, i, j);
        Labels all = ops[i].labels;
        for (int l : ops[j].labels)
          if (!contains(all, l)) all.push_back(l);
        bool shared = false;
        for (int l : ops[i].labels) shared = shared || contains(ops[j].labels, l);
        const Score sc{!shared, size_of(r) - size_of(ops[i].labels) - size_of(ops[j].labels),
                       size_of(all)};
        if (!best || sc < *best) best = sc, at = {i, j};
      }
    return at;
  }

  // [batch..., first..., second...] as [batch, m, k] (or [batch, k, m] transposed when that
  // keeps x's axis order, so that the reshape is a view).
  Tensor as_matrices(const Operand& o, const Labels& batch, const Labels& rows,
                     const Labels& cols) const {
    const auto concat = [](std::initializer_list<const Labels*> parts) {
      Labels out;
      for (const Labels* p : parts) out.insert(out.end(), p->begin(), p->end());
      return out;
    };
    const Labels direct = concat({&batch, &rows, &cols}), swapped = concat({&batch, &cols, &rows});
    const auto n = [&](const Labels& ls) { return static_cast<int64_t>(size_of(ls)); };
    if (swapped == o.labels && direct != o.labels)
      return swapaxes(reshape(o.x, Shape{n(batch), n(cols), n(rows)}, loc_), -1, -2, loc_);
    return reshape(permuted(o.x, o.labels, direct, loc_), Shape{n(batch), n(rows), n(cols)}, loc_);
  }

  Operand contract(const Operand& a, const Operand& b, const std::vector<Operand>& ops,
                   std::size_t i, std::size_t j) const {
    Labels batch, m, k, n;
    for (int l : a.labels) {
      if (contains(b.labels, l))
        (kept(l, ops, i, j) ? batch : k).push_back(l);
      else
        m.push_back(l);
    }
    for (int l : b.labels)
      if (!contains(a.labels, l)) n.push_back(l);
    const Tensor c = matmul(as_matrices(a, batch, m, k), as_matrices(b, batch, k, n), loc_);
    Labels out = batch;
    out.insert(out.end(), m.begin(), m.end());
    out.insert(out.end(), n.begin(), n.end());
    std::vector<int64_t> shape;
    for (int l : out) shape.push_back(sizes_.at(l));
    return {reshape(c, Shape(shape), loc_), out};
  }

  std::string_view s_;
  Labels output_;
  std::map<int, int64_t> sizes_;
  Loc loc_;
};

// The implicit output: the ellipsis's axes, then the letters seen once, by character code.
Labels implicit_output(const std::vector<Labels>& inputs) {
  std::map<int, int> count;
  int ellipsis = 0;
  for (const Labels& ls : inputs)
    for (int l : ls) {
      if (l >= kLetters)
        ellipsis = std::max(ellipsis, l - kLetters + 1);
      else
        ++count[l];
    }
  Labels out;
  for (int i = ellipsis - 1; i >= 0; --i) out.push_back(kLetters + i);
  std::vector<char> once;
  for (const auto& [l, c] : count)
    if (c == 1) once.push_back(label_char(l));
  std::sort(once.begin(), once.end());
  for (char c : once) out.push_back(letter_label(c));
  return out;
}

Labels explicit_output(std::string_view s, const Term& t, int ellipsis_rank,
                       const std::map<int, int64_t>& sizes) {
  Labels out = expand(s, t, int(t.letters.size()) + (t.ellipsis ? ellipsis_rank : 0), 0);
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (std::count(out.begin(), out.end(), out[i]) > 1)
      bad(s, "the output repeats '", label_char(out[i]), "', expected each label once");
    if (!sizes.contains(out[i]))
      bad(s, "the output's '", label_char(out[i]), "' is in no input, expected input labels only");
  }
  return out;
}

// The common dtype of the operands, which matmul needs; bool has no product here.
DType common_dtype(std::string_view s, const std::vector<Tensor>& xs) {
  DType dt = xs.front().dtype();
  for (const Tensor& x : xs) dt = promote_types(dt, x.dtype());
  if (dt == bool_)
    fail(kOp, "unsupported dtype for \"", s, "\": got bool operands, expected numeric ones");
  return dt;
}

Tensor einsum_labelled(std::string_view s, const std::vector<Tensor>& xs,
                       const std::vector<Labels>& labels, const std::optional<Term>& output,
                       Loc loc) {
  std::map<int, int64_t> sizes;
  int ellipsis_rank = 0;
  for (std::size_t i = 0; i < xs.size(); ++i)
    for (int a = 0; a < xs[i].rank(); ++a) {
      const int l = labels[i][static_cast<std::size_t>(a)];
      if (l >= kLetters) ellipsis_rank = std::max(ellipsis_rank, l - kLetters + 1);
      const int64_t d = xs[i].shape()[a];
      auto [it, fresh] = sizes.emplace(l, d);
      if (fresh || it->second == d || d == 1) continue;
      if (it->second != 1)
        fail(kOp, "sizes differ for \"", s, "\": ",
             l < kLetters ? std::string("label '") + label_char(l) + "'"
                          : std::string("an ellipsis axis"),
             " is ", it->second, " and ", d, " (operand ", i, " ", xs[i].type(),
             "), expected equal sizes or 1");
      it->second = d;
    }
  const Labels out =
      output ? explicit_output(s, *output, ellipsis_rank, sizes) : implicit_output(labels);
  const DType dt = common_dtype(s, xs);
  std::vector<Operand> ops;
  for (std::size_t i = 0; i < xs.size(); ++i)
    ops.push_back({ops::cast_if_needed(xs[i], dt, loc), labels[i]});
  return Contraction(s, out, sizes, loc).run(std::move(ops));
}

}  // namespace

Tensor einsum(std::string_view subscripts, const std::vector<Tensor>& operands, Loc loc) {
  const detail::CallSite site(loc);
  const Parsed p = parse(subscripts);
  if (p.inputs.size() != operands.size())
    bad(subscripts, p.inputs.size(), " input terms for ", operands.size(),
        " operands, expected one term per operand");
  std::vector<Labels> labels;
  for (std::size_t i = 0; i < operands.size(); ++i)
    labels.push_back(expand(subscripts, p.inputs[i], operands[i].rank(), i));
  return einsum_labelled(subscripts, operands, labels, p.output, loc);
}

Tensor tensordot(const Tensor& a, const Tensor& b, const std::pair<Axes, Axes>& axes, Loc loc) {
  const detail::CallSite site(loc);
  if (axes.first.size() != axes.second.size())
    fail("tensordot", "axis lists differ in length: got ", axes.first.size(), " axes of a and ",
         axes.second.size(), " of b, expected pairs");
  // Labels: a's axes 0.., b's free axes after them; paired axes share a's label.
  Labels la(static_cast<std::size_t>(a.rank())), lb(static_cast<std::size_t>(b.rank()), -1);
  std::iota(la.begin(), la.end(), 0);
  std::vector<bool> a_paired(la.size(), false);
  for (std::size_t i = 0; i < axes.first.size(); ++i) {
    const int ia = normalize_axis("tensordot", axes.first[i], a.rank());
    const int ib = normalize_axis("tensordot", axes.second[i], b.rank());
    if (a_paired[std::size_t(ia)] || lb[std::size_t(ib)] >= 0)
      fail("tensordot", "an axis is paired twice: got a axes ", Shape(axes.first), " and b axes ",
           Shape(axes.second), ", expected distinct axes");
    if (a.shape()[ia] != b.shape()[ib])
      fail("tensordot", "paired axes differ in size: got a ", a.type(), " axis ", ia, " and b ",
           b.type(), " axis ", ib, ", expected equal sizes");
    a_paired[std::size_t(ia)] = true;
    lb[std::size_t(ib)] = ia;
  }
  Labels out;
  for (std::size_t i = 0; i < la.size(); ++i)
    if (!a_paired[i]) out.push_back(la[i]);
  int next = a.rank();
  for (int& l : lb)
    if (l < 0) out.push_back(l = next++);
  Term t;
  t.letters = out;
  return einsum_labelled("tensordot", {a, b}, {la, lb}, t, loc);
}

Tensor tensordot(const Tensor& a, const Tensor& b, int64_t axes, Loc loc) {
  const detail::CallSite site(loc);
  if (axes < 0 || axes > a.rank() || axes > b.rank())
    fail("tensordot", "axes out of range: got ", axes, " for ", a.type(), " and ", b.type(),
         ", expected 0 to the smaller rank");
  Axes first, second;
  for (int64_t i = 0; i < axes; ++i) {
    first.push_back(a.rank() - axes + i);
    second.push_back(i);
  }
  return tensordot(a, b, {first, second}, loc);
}

Tensor outer(const Tensor& a, const Tensor& b, Loc loc) {
  const detail::CallSite site(loc);
  return mul(reshape(a, Shape{a.numel(), 1}, loc), reshape(b, Shape{1, b.numel()}, loc), loc);
}

Tensor dot(const Tensor& a, const Tensor& b, Loc loc) {
  const detail::CallSite site(loc);
  if (a.rank() == 0 || b.rank() == 0) return mul(a, b, loc);
  if (a.rank() <= 2 && b.rank() <= 2) return matmul(a, b, loc);
  return tensordot(a, b, {{a.rank() - 1}, {std::max(b.rank() - 2, 0)}}, loc);
}

Tensor cross(const Tensor& a, const Tensor& b, int64_t axis, Loc loc) {
  const detail::CallSite site(loc);
  // Each operand with its vector axis last, so that the other axes broadcast.
  const auto components = [&](const Tensor& v) {
    if (v.rank() == 0)
      fail("cross", "a 0-d operand has no vector axis: got ", v.type(), ", expected rank >= 1");
    const int k = normalize_axis("cross", axis, v.rank());
    if (v.shape()[k] != 3)
      fail("cross", "vectors are not of length 3: got ", v.type(), " along axis ", axis,
           ", expected size 3");
    return moveaxis(v, k, -1, loc);
  };
  const auto [u, v] = ops::promote_broadcast("cross", components(a), components(b), loc);
  // Component i of each vector: the vector axis moved to the front, then indexed.
  const auto c = [&](const Tensor& t, int64_t i) { return index(moveaxis(t, -1, 0, loc), i, loc); };
  const Tensor out = stack({sub(mul(c(u, 1), c(v, 2), loc), mul(c(u, 2), c(v, 1), loc), loc),
                            sub(mul(c(u, 2), c(v, 0), loc), mul(c(u, 0), c(v, 2), loc), loc),
                            sub(mul(c(u, 0), c(v, 1), loc), mul(c(u, 1), c(v, 0), loc), loc)},
                           0, loc);
  return moveaxis(out, 0, normalize_axis("cross", axis, out.rank()), loc);
}

Tensor kron(const Tensor& a, const Tensor& b, Loc loc) {
  const detail::CallSite site(loc);
  // out[i * nb + j] = a[i] * b[j] per axis: a as [a0, 1, a1, 1, ...] times b as [1, b0, 1, b1,
  // ...], the pairs of axes then merged.
  const int r = std::max(a.rank(), b.rank());
  std::vector<int64_t> sa, sb, so;
  for (int i = 0; i < r; ++i) {
    const int ia = i - (r - a.rank()), ib = i - (r - b.rank());
    const int64_t da = ia >= 0 ? a.shape()[ia] : 1, db = ib >= 0 ? b.shape()[ib] : 1;
    sa.insert(sa.end(), {da, 1});
    sb.insert(sb.end(), {1, db});
    so.push_back(da * db);
  }
  return reshape(mul(reshape(a, Shape(sa), loc), reshape(b, Shape(sb), loc), loc), Shape(so), loc);
}

}  // namespace kiln
