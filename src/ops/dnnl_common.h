// What the oneDNN-backed kernels share (src/ops/conv_dnnl.cpp, src/ops/gemm.cpp): the process's
// one CPU engine, and a cache of primitives, which are created once per key because creating
// one JIT-compiles code.
#pragma once

#include <dnnl.hpp>
#include <map>
#include <memory>
#include <mutex>

namespace kiln::ops {

inline const dnnl::engine& dnnl_engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// Plans (a primitive and what running it needs) by key, made by `make` on first use. A key
// oneDNN rejects (make throws dnnl::error) is remembered as nullptr: the caller's fallback
// kernel runs it. A primitive keeps the thread count it was created with, so keys include it.
template <typename Key, typename Plan>
class PlanCache {
 public:
  template <typename Make>
  const Plan* get(const Key& key, Make make) {
    std::lock_guard lock(mu_);
    auto it = plans_.find(key);
    if (it == plans_.end()) {
      std::unique_ptr<Plan> plan;
      try {
        plan = make();
      } catch (const dnnl::error&) {
        plan = nullptr;
      }
      it = plans_.emplace(key, std::move(plan)).first;
    }
    return it->second.get();
  }

 private:
  std::mutex mu_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace kiln::ops
