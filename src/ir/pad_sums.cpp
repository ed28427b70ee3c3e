// fold_pad_sums: a sum of zero-padded pieces that tile a range of one axis becomes one
// concatenate. Reverse mode meets this at every split: the transpose of each slice pads its
// cotangent with zeros to the whole input, and the cotangents add up, so k pieces cost k
// full-size pads and k - 1 full-size adds (ZeRO's gather, cutting every leaf of a layer out of
// one gathered buffer, spent 10% of a GPT step on them). Concatenating writes each element once.
#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_map>

#include "kiln/ir.h"
#include "ops/primitives.h"

namespace kiln::ir {
namespace {

// A zero pad along one axis: its input and where that lies on the axis.
struct Piece {
  Value x;
  int axis = -1;
  int64_t start = 0, length = 0;
};

class PadSums {
 public:
  explicit PadSums(const Function& f) : f_(f) {
    for (std::size_t i = 0; i < f.equations.size(); ++i) {
      for (const Value& v : f.equations[i].outputs) producer_[v.id] = i;
      for (const Value& v : f.equations[i].inputs) ++uses_[v.id], user_[v.id] = i;
    }
    for (const Value& v : f.results) ++uses_[v.id];
  }

  Function run() {
    Function out = f_;
    out.equations.clear();
    int next_id = f_.next_id();
    for (const Equation& e : f_.equations) {
      std::vector<Piece> pieces;
      if (!is_root(e) || !collect(e, pieces) || pieces.size() < 2) {
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
      const Value& result = e.outputs[0];
      const int64_t begin = pieces.front().start,
                    end = pieces.back().start + pieces.back().length,
                    whole = result.type.shape[axis];
      std::vector<Value> parts;
      for (const Piece& p : pieces) parts.push_back(p.x);
      std::vector<int64_t> dims = result.type.shape.dims();
      dims[static_cast<std::size_t>(axis)] = end - begin;
      const bool padded = begin != 0 || end != whole;
      const Value joined =
          padded ? Value{next_id++, TensorType{result.type.dtype, Shape(dims)}} : result;
      out.equations.push_back(
          Equation{&prim::concatenate(), Attrs{{"axis", int64_t{axis}}}, parts, {joined}, e.loc});
      if (padded) {
        std::vector<int64_t> low(dims.size(), 0), high(dims.size(), 0);
        low[static_cast<std::size_t>(axis)] = begin;
        high[static_cast<std::size_t>(axis)] = whole - end;
        out.equations.push_back(Equation{&prim::pad(),
                                         Attrs{{"low", low}, {"high", high}, {"value", 0.0}},
                                         {joined},
                                         {result},
                                         e.loc});
      }
    }
    return out;
  }

 private:
  const Equation* producer(const Value& v) const {
    auto it = producer_.find(v.id);
    return it == producer_.end() ? nullptr : &f_.equations[it->second];
  }
  bool is_add(const Equation* e) const { return e && e->prim == &prim::add(); }
  // An add whose sum some other add of this kind does not take in whole: the tree's top.
  bool is_root(const Equation& e) const {
    if (!is_add(&e)) return false;
    const Value& out = e.outputs[0];
    if (uses_.at(out.id) != 1 || !user_.count(out.id)) return true;  // a result, or used twice
    const Equation& user = f_.equations[user_.at(out.id)];
    return !(is_add(&user) && user.outputs[0].type == out.type);
  }
  // The pieces of the add tree under e (adds used once, of e's type), or false when a leaf
  // is anything but a zero pad along one axis.
  bool collect(const Equation& e, std::vector<Piece>& pieces) const {
    for (const Value& v : e.inputs) {
      const Equation* p = producer(v);
      if (is_add(p) && uses_.at(v.id) == 1 && v.type == e.outputs[0].type) {
        if (!collect(*p, pieces)) return false;
        continue;
      }
      const std::optional<Piece> piece = as_piece(p);
      if (!piece || v.type != e.outputs[0].type) return false;
      pieces.push_back(*piece);
    }
    return true;
  }
  static std::optional<Piece> as_piece(const Equation* p) {
    if (!p || p->prim != &prim::pad() || p->attrs.get_double("value") != 0.0 ||
        std::signbit(p->attrs.get_double("value")))
      return std::nullopt;
    const std::vector<int64_t>&low = p->attrs.get_ints("low"), &high = p->attrs.get_ints("high");
    Piece out{p->inputs[0]};
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
  std::unordered_map<int, std::size_t> producer_;
  std::unordered_map<int, int> uses_;
  std::unordered_map<int, std::size_t> user_;  // the last equation reading each value
};

}  // namespace

Function fold_pad_sums(const Function& f) { return PadSums(f).run(); }

}  // namespace kiln::ir
