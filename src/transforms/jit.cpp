#include <cctype>
#include <cstdlib>
#include <iostream>

#include "kiln/transforms.h"

namespace kiln::detail {

std::vector<std::string> param_names(const TreeDef& args_def) {
  std::vector<std::string> out;
  const std::vector<std::string> paths = tree_paths(args_def);
  for (const std::string& path : paths) {
    // "[1].w" -> "w"; "[0]" -> "arg0"; "[2][\"k\"].b" -> "k_b".
    const std::size_t close = path.find(']');
    std::string rest = close == std::string::npos ? path : path.substr(close + 1);
    std::string name;
    for (char c : rest) {
      if (std::isalnum(static_cast<unsigned char>(c))) {
        name += c;
      } else if (!name.empty() && name.back() != '_') {
        name += '_';
      }
    }
    while (!name.empty() && name.back() == '_') name.pop_back();
    if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0])))
      name = "arg" + path.substr(1, close == std::string::npos ? 0 : close - 1) + (name.empty() ? "" : "_" + name);
    out.push_back(name);
  }
  return out;
}

std::shared_ptr<const ir::Function> optimized(const ir::Function& f) {
  return std::make_shared<const ir::Function>(ir::optimize(f));
}

std::string JitCache::key(const TreeDef& def, const std::vector<Tensor>& leaves) {
  std::string k = def.to_string();
  k += '|';
  for (const Tensor& t : leaves) {
    k += t.type().to_string();
    k += ';';
  }
  return k;
}

std::shared_ptr<const JitEntry> JitCache::find(const std::string& key) const {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : it->second;
}

namespace {
// The signatures this thread is tracing, innermost last.
struct Tracing {
  const JitCache* cache;
  std::string key;
};
thread_local std::vector<Tracing> g_tracing;
}  // namespace

std::shared_ptr<const JitEntry> JitCache::claim(const std::string& key, std::optional<Claim>& claim) {
  for (const Tracing& t : g_tracing)
    if (t.cache == this && t.key == key)
      fail(name_, "the function calls itself with the signature it is being traced for: got a "
                  "recursive call on ", key.substr(key.find('|') + 1),
           ", expected recursion to reach a base case on smaller (static) shapes");
  std::unique_lock lock(mutex_);
  for (;;) {
    if (auto it = entries_.find(key); it != entries_.end()) return it->second;
    auto owner = tracing_.find(key);
    // A thread inside a trace never waits: its wait could close a cycle of threads tracing
    // functions that call each other. It traces the signature itself; the first entry wins.
    if (owner == tracing_.end() || !g_tracing.empty()) break;
    traced_.wait(lock);
  }
  tracing_.try_emplace(key, std::this_thread::get_id());
  lock.unlock();
  claim.emplace(*this, key);
  return nullptr;
}

JitCache::Claim::Claim(JitCache& cache, std::string key) : cache_(cache), key_(std::move(key)) {
  g_tracing.push_back({&cache_, key_});
}

JitCache::Claim::~Claim() {
  g_tracing.pop_back();
  cache_.release(key_);
}

void JitCache::release(const std::string& key) {
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

std::shared_ptr<const JitEntry> JitCache::insert(const std::string& key, const TreeDef& def,
                                                 const std::vector<Tensor>& leaves, JitEntry entry) {
  auto e = std::make_shared<const JitEntry>(std::move(entry));
  std::lock_guard lock(mutex_);
  if (auto it = entries_.find(key); it != entries_.end()) return it->second;
  std::vector<TensorType> types;
  for (const Tensor& t : leaves) types.push_back(t.type());
  if (log_recompiles() && !entries_.empty()) {
    // Explain the miss against the previous signature, the way users debug recompiles.
    std::string why;
    if (auto d = first_difference(last_def_, def)) {
      why = "argument structure changed at " + *d;
    } else {
      const std::vector<std::string> paths = tree_paths(def);
      for (std::size_t i = 0; i < types.size() && i < last_types_.size(); ++i)
        if (types[i] != last_types_[i]) {
          why = "argument " + paths[i] + " changed from " + last_types_[i].to_string() + " to " +
                types[i].to_string();
          break;
        }
    }
    std::cerr << "[jit] " << name_ << ": recompiling (specialisation " << entries_.size() + 1
              << "): " << why << "\n";
  }
  last_def_ = def;
  last_types_ = std::move(types);
  entries_.emplace(key, e);
  return e;
}

}  // namespace kiln::detail
