// nonzero{size, fill}: the indices of x's non-zero elements in row-major order, as int64 rows
// [size, rank] (numpy.argwhere's layout), padded with `fill` to the static `size` that jit
// needs. More non-zero elements than `size` raise when the kernel runs (eagerly, or inside a
// compiled function), rather than being dropped silently. Its output is integer, so it has no
// derivative; vmap runs it once per example (each example has its own count).
#include <algorithm>

#include "detail/dtype_dispatch.h"
#include "kiln/indexing.h"
#include "ops/primitives.h"
#include "ops/rules.h"

namespace kiln {

const Primitive& prim::nonzero() {
  static const Primitive& p = detail::register_builtin(
      {.name = "nonzero",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             const int64_t size = a.get_int("size");
             if (size < 0) fail("nonzero", "negative size: got ", size, ", expected >= 0");
             return std::vector<TensorType>{{int64, Shape{size, in[0].shape.rank()}}};
           },
       .differentiable = false,
       .batch = ops::batch_by_loop},
      {{ops::cpu({DTypeSet::all()}), [](ops::Ins in, const Attrs& a) {
          const Tensor x = in[0].contiguous();
          const int64_t size = a.get_int("size"), fill = a.get_int("fill");
          const int rank = x.rank();
          Tensor out = empty(Shape{size, rank}, int64);
          int64_t* po = out.data<int64_t>();
          int64_t found = 0;
          detail::visit_any_dtype(x.dtype(), [&]<typename T>() {
            const T* px = x.data<const T>();
            std::vector<int64_t> at(static_cast<std::size_t>(rank), 0);  // x's index of i
            for (int64_t i = 0; i < x.numel(); ++i) {
              if (static_cast<detail::compute_t<T>>(px[i]) != detail::compute_t<T>{}) {
                if (found == size)
                  fail("nonzero", "more non-zero elements than size: got more than ", size, " in ",
                       x.type(), ", expected at most size = ", size,
                       " (count them with sum(x != 0))");
                std::copy(at.begin(), at.end(), po + found * rank);
                ++found;
              }
              for (int d = rank - 1; d >= 0; --d) {  // next index, row-major
                const auto u = static_cast<std::size_t>(d);
                if (++at[u] < x.shape()[d]) break;
                at[u] = 0;
              }
            }
          });
          std::fill(po + found * rank, po + size * rank, fill);
          return std::vector<Tensor>{out};
        }}});
  return p;
}

Tensor argwhere(const Tensor& x, int64_t size, int64_t fill, Loc loc) {
  const detail::CallSite site(loc);
  return bind1(prim::nonzero(), {x}, {{"size", size}, {"fill", fill}}, loc);
}

std::vector<Tensor> nonzero(const Tensor& x, int64_t size, int64_t fill, Loc loc) {
  const detail::CallSite site(loc);
  const Tensor rows = argwhere(x, size, fill, loc);
  std::vector<Tensor> out;
  for (int d = 0; d < x.rank(); ++d)
    out.push_back(reshape(slice(rows, {Slice{}, Slice{d, d + 1, 1}}, loc), Shape{size}, loc));
  return out;
}

}  // namespace kiln
