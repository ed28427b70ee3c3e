#include "compiler/thin_products.h"

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "ir/passes.h"
#include "kiln/primitive.h"

namespace kiln::compiler {
namespace {

using Dims = std::vector<int64_t>;

// The largest matrix b a product may read: a head's cache at 2^16 elements (1,024 positions of
// 64) reads 256 KiB, which one fused loop streams as fast as a library call.
constexpr int64_t kMaxMatrix = int64_t{1} << 16;
// A sum that keeps rows of fewer elements than this runs a reduction's kernel (fusion.cpp,
// short_rows): the row form's rows of n.
constexpr int64_t kMinRow = 8;

bool thin(const ir::Equation& e) {
  if (e.prim->name != "matmul") return false;
  const TensorType &a = e.inputs[0].type, &b = e.inputs[1].type;
  const int r = a.shape.rank();
  if ((a.dtype != float32 && a.dtype != float64) || r < 3 || a.shape[r - 2] != 1) return false;
  int64_t count = 1;
  for (int i = 0; i < r - 2; ++i) count *= a.shape[i];
  return count >= 2 && b.shape[r - 2] * b.shape[r - 1] <= kMaxMatrix;
}

ir::Function rewrite(const ir::Function& f) {
  if (std::none_of(f.equations.begin(), f.equations.end(), thin)) return f;
  const Primitive &mul = primitive("mul"), &reduce_sum = primitive("reduce_sum"),
                  &reshape = primitive("reshape"), &broadcast_to = primitive("broadcast_to"),
                  &transpose = primitive("transpose");
  ir::Function out = ir::without_equations(f);
  int next_id = f.next_id();
  std::unordered_map<int, const ir::Equation*> producer;
  for (const ir::Equation& e : f.equations) {
    for (const ir::Value& v : e.outputs) producer[v.id] = &e;
    if (!thin(e)) {
      out.equations.push_back(e);
      continue;
    }
    auto emit = [&](const Primitive& p, Attrs attrs, std::vector<ir::Value> in, const Dims& dims) {
      const ir::Value v{next_id++, TensorType{e.outputs[0].type.dtype, Shape(dims)}};
      out.equations.push_back(ir::Equation{&p, std::move(attrs), std::move(in), {v}, e.loc});
      return v;
    };
    const ir::Value &a = e.inputs[0], &b = e.inputs[1];
    const Dims bd = b.type.shape.dims();
    const auto r = static_cast<int64_t>(bd.size());
    const int64_t k = bd[bd.size() - 2], n = bd.back();
    Dims batch(bd.begin(), bd.end() - 2);
    auto with = [&](std::initializer_list<int64_t> last) {
      Dims d = batch;
      d.insert(d.end(), last);
      return d;
    };
    const auto it = producer.find(b.id);
    const ir::Equation* t = it == producer.end() ? nullptr : it->second;
    const bool along_rows =
        t != nullptr && t->prim == &transpose && ir::swaps_last_two(t->attrs.get_ints("perm"));
    if (!along_rows && n < kMinRow) {
      out.equations.push_back(e);
      continue;
    }
    ir::Value sum;
    if (along_rows) {
      // The row against each row of the matrix b transposes: the sum runs along its memory.
      const ir::Value rows = emit(broadcast_to, {{"shape", with({n, k})}}, {a}, with({n, k}));
      const ir::Value p = emit(mul, {}, {rows, t->inputs[0]}, with({n, k}));
      sum = emit(reduce_sum, {{"axes", Dims{r - 1}}}, {p}, with({n}));
    } else {
      const ir::Value column = emit(reshape, {{"shape", with({k, 1})}}, {a}, with({k, 1}));
      const ir::Value columns =
          emit(broadcast_to, {{"shape", with({k, n})}}, {column}, with({k, n}));
      const ir::Value p = emit(mul, {}, {columns, b}, with({k, n}));
      sum = emit(reduce_sum, {{"axes", Dims{r - 2}}}, {p}, with({n}));
    }
    out.equations.push_back(
        ir::Equation{&reshape, {{"shape", with({1, n})}}, {sum}, {e.outputs[0]}, e.loc});
  }
  return ir::dce(out);
}

}  // namespace

ir::Function reduce_thin_products(const ir::Function& f) {
  return ir::map_sub_functions(rewrite(f), reduce_thin_products);
}

}  // namespace kiln::compiler
