// fold_pad_sums: a sum of zero-padded pieces that tile a range of one axis becomes one
// concatenate. Reverse mode meets this at every split: the transpose of each slice pads its
// cotangent with zeros to the whole input, and the cotangents add up, so k pieces cost k
// full-size pads and k - 1 full-size adds (ZeRO's gather, cutting every leaf of a layer out of
// one gathered buffer, spent 10% of a GPT step on them). Concatenating writes each element once.
// One other term of the sum (a value also used whole, as a residual is) is added back after:
// with one such term the sum is the same whatever the order; with more it would round
// differently, so those sums stay. Exact but for signed zeros: a piece's -0 stays -0 where the
// sum of it and padding zeros gave +0, as PyTorch's split backward (a cat) keeps it.
#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_map>

#include "ir/passes.h"
#include "kiln/error.h"
#include "kiln/ir.h"
#include "kiln/primitive.h"

namespace kiln::ir {
namespace {

// A zero pad along one axis: its input and where that lies on the axis.
struct Piece {
  Value x;
  const Primitive* pad = nullptr;
  int axis = -1;
  int64_t start = 0, length = 0;
};

class PadSums {
 public:
  explicit PadSums(const Function& f) : f_(f), concatenate_(find_primitive("concatenate")) {
    // Pads and adds are known by their algebra; concatenate is the one primitive this writes.
    if (!concatenate_) fail("ir.fold_pad_sums", "no primitive 'concatenate' is registered");
    for (std::size_t i = 0; i < f.equations.size(); ++i) {
      for (const Value& v : f.equations[i].outputs) producer_[v.id] = i;
      for (const Value& v : f.equations[i].inputs) ++uses_[v.id], user_[v.id] = i;
    }
    for (const Value& v : f.results) ++uses_[v.id];
  }

  Function run() {
    Function out = without_equations(f_);
    int next_id = f_.next_id();
    for (const Equation& e : f_.equations) {
      std::vector<Piece> pieces;
      std::vector<Value> others;
      if (!is_root(e) || !collect(e, pieces, others) || pieces.size() < 2 || others.size() > 1) {
        out.equations.push_back(e);
        continue;
      }
      std::sort(pieces.begin(), pieces.end(),
                [](const Piece& a, const Piece& b) { return a.start < b.start; });
      const int axis = pieces.front().axis;
      bool tiles = true;
      for (std::size_t i = 1; i < pieces.size(); ++i)
        tiles = tiles && pieces[i].axis == axis &&
                pieces[i].start == pieces[i - 1].start + pieces[i - 1].length;
      if (!tiles) {
        out.equations.push_back(e);
        continue;
      }
      const Value& sum = e.outputs[0];
      // With another term, the pieces' sum is a fresh value that the term is added to.
      const Value result = others.empty() ? sum : Value{next_id++, sum.type};
      const int64_t begin = pieces.front().start, end = pieces.back().start + pieces.back().length,
                    whole = result.type.shape[axis];
      std::vector<Value> parts;
      for (const Piece& p : pieces) parts.push_back(p.x);
      std::vector<int64_t> dims = result.type.shape.dims();
      dims[static_cast<std::size_t>(axis)] = end - begin;
      const bool padded = begin != 0 || end != whole;
      const Value joined =
          padded ? Value{next_id++, TensorType{result.type.dtype, Shape(dims)}} : result;
      out.equations.push_back(
          Equation{concatenate_, Attrs{{"axis", int64_t{axis}}}, parts, {joined}, e.loc});
      if (padded) {
        std::vector<int64_t> low(dims.size(), 0), high(dims.size(), 0);
        low[static_cast<std::size_t>(axis)] = begin;
        high[static_cast<std::size_t>(axis)] = whole - end;
        out.equations.push_back(Equation{pieces.front().pad,
                                         Attrs{{"low", low}, {"high", high}, {"value", 0.0}},
                                         {joined},
                                         {result},
                                         e.loc});
      }
      if (!others.empty())
        out.equations.push_back(Equation{e.prim, {}, {result, others[0]}, {sum}, e.loc});
    }
    return out;
  }

 private:
  const Equation* producer(const Value& v) const {
    auto it = producer_.find(v.id);
    return it == producer_.end() ? nullptr : &f_.equations[it->second];
  }
  static bool is_add(const Equation* e) { return e && e->prim->algebra.adds; }
  // An add whose sum some other add of this kind does not take in whole: the tree's top.
  bool is_root(const Equation& e) const {
    if (!is_add(&e)) return false;
    const Value& out = e.outputs[0];
    if (uses(out) != 1 || !user_.count(out.id)) return true;  // unused, a result, or used twice
    const Equation& user = f_.equations[user_.at(out.id)];
    return !(is_add(&user) && user.outputs[0].type == out.type);
  }
  int uses(const Value& v) const {
    auto it = uses_.find(v.id);
    return it == uses_.end() ? 0 : it->second;
  }
  // The leaves of the add tree under e (adds used once, of e's type), walked with a stack (a
  // gradient summed from many slices is a long chain): zero pads along one axis as pieces,
  // anything else as other terms. False when a leaf has another type (a broadcasting add).
  bool collect(const Equation& e, std::vector<Piece>& pieces, std::vector<Value>& others) const {
    std::vector<const Equation*> adds{&e};
    while (!adds.empty()) {
      const Equation* add = adds.back();
      adds.pop_back();
      for (const Value& v : add->inputs) {
        if (v.type != e.outputs[0].type) return false;
        const Equation* p = producer(v);
        if (is_add(p) && uses(v) == 1) {
          adds.push_back(p);
        } else if (const std::optional<Piece> piece = as_piece(p)) {
          pieces.push_back(*piece);
        } else {
          others.push_back(v);
        }
      }
    }
    return true;
  }
  static std::optional<Piece> as_piece(const Equation* p) {
    if (!p || !p->prim->algebra.pads || p->attrs.get_double("value") != 0.0 ||
        std::signbit(p->attrs.get_double("value")))
      return std::nullopt;
    const std::vector<int64_t>&low = p->attrs.get_ints("low"), &high = p->attrs.get_ints("high");
    Piece out{p->inputs[0], p->prim};
    for (std::size_t i = 0; i < low.size(); ++i) {
      if (low[i] == 0 && high[i] == 0) continue;
      if (out.axis >= 0) return std::nullopt;  // padded along two axes
      out.axis = static_cast<int>(i);
      out.start = low[i];
      out.length = p->inputs[0].type.shape[static_cast<int>(i)];
    }
    if (out.axis < 0) return std::nullopt;
    return out;
  }

  const Function& f_;
  const Primitive* concatenate_;
  std::unordered_map<int, std::size_t> producer_;
  std::unordered_map<int, int> uses_;
  std::unordered_map<int, std::size_t> user_;  // the last equation reading each value
};

}  // namespace

Function fold_pad_sums(const Function& f) { return PadSums(f).run(); }

}  // namespace kiln::ir
