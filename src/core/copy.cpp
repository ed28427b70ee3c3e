#include "detail/copy.h"

#include <cstring>

#include "detail/dtype_dispatch.h"
#include "detail/strided.h"

namespace kiln::detail {

void copy_cast(const Tensor& src, const Tensor& dst) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous() &&
      src.shape() == dst.shape()) {
    std::memcpy(dst.raw_data(), src.raw_data(),
                static_cast<std::size_t>(n) * dtype_size(src.dtype()));
    return;
  }
  const std::vector<int64_t> sst = broadcast_strides(src, dst.shape());
  visit_any_dtype(src.dtype(), [&]<typename S>() {
    visit_any_dtype(dst.dtype(), [&]<typename D>() {
      const S* ps = static_cast<const S*>(src.raw_data());
      D* pd = static_cast<D*>(dst.raw_data());
      for_each_row<2>(
          dst.shape().dims(), {&dst.strides(), &sst},
          [&](const std::array<int64_t, 2>& off, int64_t len, const std::array<int64_t, 2>& st) {
            D* o = pd + off[0];
            const S* i = ps + off[1];
            for (int64_t k = 0; k < len; ++k) o[k * st[0]] = convert<D>(i[k * st[1]]);
          });
    });
  });
}

}  // namespace kiln::detail
