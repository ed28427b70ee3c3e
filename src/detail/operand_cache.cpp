#include "detail/operand_cache.h"

#include <algorithm>

namespace kiln::detail {
namespace {

thread_local OperandCacheScope* innermost = nullptr;

bool same_source(const Tensor& a, const Tensor& b) {
  return a.storage() == b.storage() && a.offset() == b.offset() && a.dtype() == b.dtype() &&
         a.shape() == b.shape() && a.strides() == b.strides();
}

}  // namespace

OperandCacheScope::OperandCacheScope() : outer_(innermost) { innermost = this; }

OperandCacheScope::~OperandCacheScope() { innermost = outer_; }

void OperandCacheScope::drop_unheld() {
  if (entries_.empty()) return;
  std::erase_if(entries_, [](const Entry& e) {
    return e.source.impl_ptr().use_count() == 1 && e.source.storage().use_count() == 1;
  });
}

void OperandCacheScope::forget(const Tensor& t) {
  std::erase_if(entries_, [&](const Entry& e) { return e.source.storage() == t.storage(); });
}

OperandCacheOff::OperandCacheOff() : saved_(innermost) { innermost = nullptr; }

OperandCacheOff::~OperandCacheOff() { innermost = saved_; }

Tensor cached_copy(const Tensor& source, std::vector<int64_t> key,
                   const std::function<Tensor()>& make) {
  OperandCacheScope* scope = innermost;
  if (scope == nullptr) return make();
  for (const OperandCacheScope::Entry& e : scope->entries_)
    if (e.key == key && same_source(e.source, source)) return e.copy;
  Tensor copy = make();
  scope->entries_.push_back({source, std::move(key), copy});
  return copy;
}

}  // namespace kiln::detail
