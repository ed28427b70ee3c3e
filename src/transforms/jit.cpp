// jit: the per-signature cache and the call path (docs/DESIGN.md, "jit").
#include <condition_variable>
#include <cstdlib>
#include <iostream>
#include <list>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>

#include "core/allocator.h"  // detail::parse_env_int
#include "distributed/bucket_all_reduces.h"
#include "distributed/overlap_collectives.h"
#include "kiln/transforms.h"
#include "ops/primitives.h"

namespace kiln::detail {

// One compiled specialisation of a jitted function.
struct JitEntry {
  std::shared_ptr<const ir::Function> function;  // optimised
  std::shared_ptr<const ir::Executable> executable;
  TreeDef out_def;
};

namespace {

// A call's signature, the cache's key: the argument structure (with static leaves) and each
// leaf's dtype and shape. A lookup hashes and compares the call's own TreeDef and leaves
// (a SignatureView), so a cache hit allocates nothing; a Signature is made on a miss only.
struct Signature {
  TreeDef def;
  std::vector<TensorType> types;
};
struct SignatureView {
  const TreeDef& def;
  std::span<const Tensor> leaves;
};

std::size_t mix(std::size_t h, std::size_t v) {
  return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
}
std::size_t hash_type(std::size_t h, const TensorType& t) {
  h = mix(h, static_cast<std::size_t>(t.dtype));
  h = mix(h, static_cast<std::size_t>(t.shape.rank()));
  for (int64_t d : t.shape.dims()) h = mix(h, static_cast<std::size_t>(d));
  return h;
}
struct SignatureHash {
  using is_transparent = void;
  std::size_t operator()(const Signature& s) const noexcept {
    std::size_t h = s.def.hash();
    for (const TensorType& t : s.types) h = hash_type(h, t);
    return h;
  }
  std::size_t operator()(const SignatureView& s) const noexcept {
    std::size_t h = s.def.hash();
    for (const Tensor& t : s.leaves) h = hash_type(h, t.type());
    return h;
  }
};
struct SignatureEqual {
  using is_transparent = void;
  bool operator()(const Signature& a, const Signature& b) const {
    return a.types == b.types && a.def == b.def;
  }
  bool operator()(const SignatureView& a, const Signature& b) const {
    if (a.leaves.size() != b.types.size()) return false;
    for (std::size_t i = 0; i < a.leaves.size(); ++i)
      if (a.leaves[i].type() != b.types[i]) return false;
    return a.def == b.def;
  }
  bool operator()(const Signature& a, const SignatureView& b) const { return (*this)(b, a); }
};
Signature signature(const SignatureView& v) {
  Signature s{v.def, {}};
  s.types.reserve(v.leaves.size());
  for (const Tensor& t : v.leaves) s.types.push_back(t.type());
  return s;
}

}  // namespace

namespace {
// How many specialisations a jitted function keeps: KILN_JIT_CACHE_SIZE, read when the function
// is created, else 1024.
std::size_t cache_capacity() {
  const char* v = std::getenv("KILN_JIT_CACHE_SIZE");
  return static_cast<std::size_t>(
      parse_env_int("KILN_JIT_CACHE_SIZE", v, 1, int64_t{1} << 40).value_or(1024));
}
}  // namespace

// The per-signature cache of a jitted function, shared by its copies; thread-safe. No lock is
// held while user code is traced, so a jitted function may call itself (on other signatures)
// or other jitted functions from any thread. It keeps the `capacity` most recently used
// specialisations: an entry evicted is freed (its IR, compiled code and arena) once no running
// call holds it.
class JitCache {
 public:
  JitCache(std::string name, std::optional<ir::Backend> backend)
      : name_(std::move(name)), backend_(backend), capacity_(cache_capacity()) {}
  std::shared_ptr<const JitEntry> find(const SignatureView& key);
  // Before tracing `key` on a miss: waits while another thread traces it and returns that
  // entry, or returns nullptr and this thread traces it, holding the returned claim meanwhile.
  // Recursion on the signature being traced raises an Error (it could never finish).
  class Claim;
  std::shared_ptr<const JitEntry> claim(const SignatureView& key, std::optional<Claim>& claim);
  // Stores an entry (the first one stored for a key wins); logs why it was needed when
  // KILN_LOG_RECOMPILES=1.
  std::shared_ptr<const JitEntry> insert(Signature key, JitEntry entry);
  std::size_t size() const;
  const std::string& name() const { return name_; }
  std::optional<ir::Backend> backend() const { return backend_; }

 private:
  void release(const Signature& key);
  // Drops the least recently used entries beyond the capacity; the lock is held.
  void evict();

  struct Cached {
    std::shared_ptr<const JitEntry> entry;
    std::list<const Signature*>::iterator use;  // its place in recent_
  };

  std::string name_;
  std::optional<ir::Backend> backend_;
  std::size_t capacity_;
  mutable std::mutex mutex_;
  std::condition_variable traced_;  // signalled when a claim ends
  std::unordered_map<Signature, Cached, SignatureHash, SignatureEqual> entries_;
  std::list<const Signature*> recent_;  // the keys of entries_, most recently used first
  // Claimed keys and their thread.
  std::unordered_map<Signature, std::thread::id, SignatureHash, SignatureEqual> tracing_;
  Signature last_;
};

// This thread is tracing one signature of a cache (see JitCache::claim).
class JitCache::Claim {
 public:
  Claim(JitCache& cache, Signature key);
  ~Claim();
  Claim(const Claim&) = delete;
  Claim& operator=(const Claim&) = delete;

 private:
  JitCache& cache_;
  Signature key_;
};

std::shared_ptr<const JitEntry> JitCache::find(const SignatureView& key) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  recent_.splice(recent_.begin(), recent_, it->second.use);
  return it->second.entry;
}

namespace {
// The signatures this thread is tracing, innermost last.
struct Tracing {
  const JitCache* cache;
  const Signature* key;  // the Claim's
};
thread_local std::vector<Tracing> g_tracing;
}  // namespace

std::shared_ptr<const JitEntry> JitCache::claim(const SignatureView& key,
                                                std::optional<Claim>& claim) {
  for (const Tracing& t : g_tracing)
    if (t.cache == this && SignatureEqual{}(key, *t.key)) {
      std::string types;
      for (const Tensor& leaf : key.leaves)
        types += (types.empty() ? "" : ", ") + leaf.type().to_string();
      fail(name_,
           "the function calls itself with the signature it is being traced for: got a "
           "recursive call on (",
           types, "), expected recursion to reach a base case on smaller (static) shapes");
    }
  std::unique_lock lock(mutex_);
  for (;;) {
    if (auto it = entries_.find(key); it != entries_.end()) return it->second.entry;
    auto owner = tracing_.find(key);
    // A thread inside a trace never waits: its wait could close a cycle of threads tracing
    // functions that call each other. It traces the signature itself; the first entry wins.
    if (owner == tracing_.end() || !g_tracing.empty()) break;
    traced_.wait(lock);
  }
  Signature owned = signature(key);
  tracing_.try_emplace(owned, std::this_thread::get_id());
  lock.unlock();
  claim.emplace(*this, std::move(owned));
  return nullptr;
}

JitCache::Claim::Claim(JitCache& cache, Signature key) : cache_(cache), key_(std::move(key)) {
  g_tracing.push_back({&cache_, &key_});
}

JitCache::Claim::~Claim() {
  g_tracing.pop_back();
  cache_.release(key_);
}

void JitCache::release(const Signature& key) {
  {
    std::lock_guard lock(mutex_);
    auto it = tracing_.find(key);
    if (it != tracing_.end() && it->second == std::this_thread::get_id()) tracing_.erase(it);
  }
  traced_.notify_all();
}

std::size_t JitCache::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

namespace {
// Read at every cache miss (rare by design), so it can be switched on in a running program.
bool log_recompiles() {
  const char* v = std::getenv("KILN_LOG_RECOMPILES");
  return v && std::string(v) != "0" && std::string(v) != "";
}
}  // namespace

std::shared_ptr<const JitEntry> JitCache::insert(Signature key, JitEntry entry) {
  auto e = std::make_shared<const JitEntry>(std::move(entry));
  std::lock_guard lock(mutex_);
  if (auto it = entries_.find(key); it != entries_.end()) return it->second.entry;
  const TreeDef& def = key.def;
  const std::vector<TensorType>& types = key.types;
  if (log_recompiles() && !entries_.empty()) {
    // Explain the miss against the previous signature, the way users debug recompiles.
    std::string why;
    if (auto d = first_difference(last_.def, def)) {
      why = "argument structure changed at " + *d;
    } else {
      const std::vector<std::string> paths = tree_paths(def);
      for (std::size_t i = 0; i < types.size() && i < last_.types.size(); ++i)
        if (types[i] != last_.types[i]) {
          why = "argument " + paths[i] + " changed from " + last_.types[i].to_string() + " to " +
                types[i].to_string();
          break;
        }
    }
    std::cerr << "[jit] " << name_ << ": recompiling (specialisation " << entries_.size() + 1
              << "): " << why << "\n";
  }
  last_ = key;
  const auto it = entries_.emplace(std::move(key), Cached{e, {}}).first;
  recent_.push_front(&it->first);
  it->second.use = recent_.begin();
  evict();
  return e;
}

void JitCache::evict() {
  while (entries_.size() > capacity_) {
    entries_.erase(entries_.find(*recent_.back()));
    recent_.pop_back();
  }
}

std::shared_ptr<JitCache> make_jit_cache(std::string name, std::optional<ir::Backend> backend) {
  return std::make_shared<JitCache>(std::move(name), backend);
}

std::size_t jit_cache_size(const JitCache& cache) { return cache.size(); }

namespace {

// An entry to run now, with the values of an enclosing trace its function closes over.
struct Specialisation {
  std::shared_ptr<const JitEntry> entry;
  std::vector<Tensor> captures;
};

Specialisation specialise(JitCache& cache, const TreeDef& def, const std::vector<Tensor>& leaves,
                          const FlatFn& fn) {
  const SignatureView key{def, leaves};
  if (auto hit = cache.find(key)) return {hit, {}};
  std::optional<JitCache::Claim> claim;
  if (auto hit = cache.claim(key, claim)) return {hit, {}};
  Staged s = stage(cache.name(), def, leaves, fn);
  JitEntry entry;
  entry.function = std::make_shared<const ir::Function>(
      distributed::bucket_all_reduces(ir::optimize(*s.function)));
  // What overlaps collectives with computation; jit_lower shows the program without it.
  entry.executable = ir::compile(
      std::make_shared<const ir::Function>(distributed::overlap_collectives(*entry.function)),
      {.backend = cache.backend()});
  if (log_recompiles())
    std::cerr << "[jit] " << cache.name() << ": compiled in " << entry.executable->info().compile_ms
              << " ms" << (entry.executable->info().from_cache ? " (from the cache)" : "") << "\n";
  entry.out_def = std::move(s.out_def);
  // A function that closes over values of an enclosing trace is valid for this trace only.
  if (!s.captures.empty()) return {std::make_shared<const JitEntry>(std::move(entry)), s.captures};
  return {cache.insert(signature(key), std::move(entry)), {}};
}

}  // namespace

FlatTree jit_call(JitCache& cache, const TreeDef& args_def, const std::vector<Tensor>& leaves,
                  const FlatFn& fn) {
  const Specialisation s = specialise(cache, args_def, leaves, fn);
  FlatTree out{.leaves = {}, .def = s.entry->out_def};
  if (ir::tracing()) {
    // Inside another trace: one `call` equation, so the outer IR keeps the structure.
    std::vector<Tensor> ins = leaves;
    ins.insert(ins.end(), s.captures.begin(), s.captures.end());
    out.leaves = bind(prim::call(), std::move(ins), {{"fn", FunctionRef(s.entry->function)}});
  } else {
    out.leaves = s.entry->executable->run(leaves);
  }
  return out;
}

ir::Function jit_lower(JitCache& cache, const TreeDef& args_def, const std::vector<Tensor>& leaves,
                       const FlatFn& fn) {
  return *specialise(cache, args_def, leaves, fn).entry->function;
}

ir::CompiledInfo jit_compiled(JitCache& cache, const TreeDef& args_def,
                              const std::vector<Tensor>& leaves, const FlatFn& fn) {
  return specialise(cache, args_def, leaves, fn).entry->executable->info();
}

}  // namespace kiln::detail
