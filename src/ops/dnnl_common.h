// What the oneDNN-backed kernels share (src/ops/conv_dnnl.cpp, src/ops/gemm.cpp): the process's
// one CPU engine, and a cache of primitives, which are created once per key because creating
// one JIT-compiles code.
#pragma once

#include <dnnl.hpp>
#include <list>
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
// At most `capacity` plans are kept (a program with ever new shapes would otherwise keep every
// primitive it made); the least recently used one goes first, and a caller still running an
// evicted plan keeps it alive through its shared_ptr.
template <typename Key, typename Plan>
class PlanCache {
 public:
  explicit PlanCache(std::size_t capacity = 1024) : capacity_(capacity) {}

  template <typename Make>
  std::shared_ptr<const Plan> get(const Key& key, Make make) {
    std::lock_guard lock(mu_);
    if (auto it = plans_.find(key); it != plans_.end()) {
      order_.splice(order_.begin(), order_, it->second.position);
      return it->second.plan;
    }
    std::shared_ptr<const Plan> plan;
    try {
      plan = make();
    } catch (const dnnl::error&) {
      plan = nullptr;
    }
    if (plans_.size() >= capacity_) {
      plans_.erase(order_.back());
      order_.pop_back();
    }
    order_.push_front(key);
    plans_.emplace(key, Entry{plan, order_.begin()});
    return plan;
  }

  std::size_t size() {
    std::lock_guard lock(mu_);
    return plans_.size();
  }

 private:
  struct Entry {
    std::shared_ptr<const Plan> plan;
    typename std::list<Key>::iterator position;  // in order_
  };
  std::size_t capacity_;
  std::mutex mu_;
  std::list<Key> order_;  // most recently used first
  std::map<Key, Entry> plans_;
};

}  // namespace kiln::ops
