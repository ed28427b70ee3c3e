// Elementwise loops over strided views, with fast paths for contiguous and scalar operands.
#pragma once

#include "detail/copy.h"
#include "detail/dtype_dispatch.h"
#include "detail/strided.h"

namespace kiln::detail {

// out[i] = f(in[i]); in and out have the same shape. f maps compute_t<In> -> compute_t<Out>
// (or a type convertible to Out).
template <typename In, typename Out, typename F>
void map_unary(const Tensor& in, const Tensor& out, F f) {
  const In* pi = static_cast<const In*>(in.raw_data());
  Out* po = static_cast<Out*>(out.raw_data());
  auto apply = [&](In v) { return static_cast<Out>(f(static_cast<compute_t<In>>(v))); };
  if (in.is_contiguous() && out.is_contiguous()) {
    parallel_for(out.numel(), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) po[i] = apply(pi[i]);
    });
    return;
  }
  for_each_row<2>(
      out.shape().dims(), {&out.strides(), &in.strides()},
      [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& st) {
        Out* o = po + off[0];
        const In* x = pi + off[1];
        for (int64_t k = 0; k < n; ++k) o[k * st[0]] = apply(x[k * st[1]]);
      });
}

// out[i] = f(a[i], b[i]); a, b and out have the same shape (broadcast views allowed).
template <typename In, typename Out, typename F>
void map_binary(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  using C = compute_t<In>;
  const In* pa = static_cast<const In*>(a.raw_data());
  const In* pb = static_cast<const In*>(b.raw_data());
  Out* po = static_cast<Out*>(out.raw_data());
  auto apply = [&](In x, In y) {
    return static_cast<Out>(f(static_cast<C>(x), static_cast<C>(y)));
  };
  for_each_row<3>(
      out.shape().dims(), {&out.strides(), &a.strides(), &b.strides()},
      [&](const std::array<int64_t, 3>& off, int64_t n, const std::array<int64_t, 3>& st) {
        Out* o = po + off[0];
        const In* x = pa + off[1];
        const In* y = pb + off[2];
        if (st[0] == 1 && st[1] == 1 && st[2] == 1) {
          for (int64_t k = 0; k < n; ++k) o[k] = apply(x[k], y[k]);
        } else if (st[0] == 1 && st[1] == 1 && st[2] == 0) {
          const In yv = *y;
          for (int64_t k = 0; k < n; ++k) o[k] = apply(x[k], yv);
        } else if (st[0] == 1 && st[1] == 0 && st[2] == 1) {
          const In xv = *x;
          for (int64_t k = 0; k < n; ++k) o[k] = apply(xv, y[k]);
        } else {
          for (int64_t k = 0; k < n; ++k) o[k * st[0]] = apply(x[k * st[1]], y[k * st[2]]);
        }
      });
}

}  // namespace kiln::detail
