// Samples, randomness, pipeline iteration, state and statistics.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "data/node.h"
#include "data/parallel.h"

namespace kiln::data {

// ---- Sample ---------------------------------------------------------------------------------

Sample::Sample(std::initializer_list<Field> fields) {
  for (const auto& [name, value] : fields) set(name, value);
}

bool Sample::contains(std::string_view name) const {
  for (const auto& f : fields_)
    if (f.first == name) return true;
  return false;
}

namespace {
[[noreturn]] void missing_field(std::string_view name, const std::vector<Sample::Field>& fields) {
  std::string have;
  for (const auto& f : fields) have += (have.empty() ? "" : ", ") + f.first;
  fail("data.sample", "no field '", name, "': got fields {", have, "}, expected one named '", name,
       "'");
}
}  // namespace

const Tensor& Sample::at(std::string_view name) const {
  for (const auto& f : fields_)
    if (f.first == name) return f.second;
  missing_field(name, fields_);
}
Tensor& Sample::at(std::string_view name) {
  for (auto& f : fields_)
    if (f.first == name) return f.second;
  missing_field(name, fields_);
}

void Sample::set(std::string_view name, Tensor value) {
  for (auto& f : fields_) {
    if (f.first == name) {
      f.second = std::move(value);
      return;
    }
  }
  fields_.emplace_back(std::string(name), std::move(value));
}

bool Sample::erase(std::string_view name) {
  for (auto it = fields_.begin(); it != fields_.end(); ++it) {
    if (it->first == name) {
      fields_.erase(it);
      return true;
    }
  }
  return false;
}

std::vector<std::string> Sample::names() const {
  std::vector<std::string> out;
  out.reserve(fields_.size());
  for (const auto& f : fields_) out.push_back(f.first);
  return out;
}

// ---- randomness -----------------------------------------------------------------------------

namespace {
// splitmix64's finaliser: a bijective mix with full avalanche.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
}  // namespace

uint64_t sample_key(uint64_t seed, int64_t epoch, int64_t index) {
  // Each input passes through a full mix before the next is folded in, so nearby (epoch, index)
  // pairs give unrelated keys.
  uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ULL);
  h = mix64(h ^ (static_cast<uint64_t>(epoch) + 0x632be59bd9b4e019ULL));
  return mix64(h ^ (static_cast<uint64_t>(index) + 0x85157af5ULL));
}

uint64_t Rng::next_u64() { return mix64(key_ + 0x9e3779b97f4a7c15ULL * ++counter_); }

double Rng::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

int64_t Rng::uniform_int(int64_t lo, int64_t hi) {
  if (hi <= lo) fail("data.rng", "empty range: got [", lo, ", ", hi, "), expected hi > lo");
  const auto span = static_cast<uint64_t>(hi - lo);
  // Lemire's multiply-shift: the bias is below span / 2^64, far under anything measurable.
  const auto r = static_cast<unsigned __int128>(next_u64()) * span;
  return lo + static_cast<int64_t>(r >> 64);
}

// ---- state and stats text -------------------------------------------------------------------

std::string PipelineState::to_string() const {
  char buf[96];
  std::snprintf(buf, sizeof buf, "kiln.data.state/1 %016" PRIx64 " %" PRId64 " %" PRId64,
                fingerprint, epoch, position);
  return buf;
}

PipelineState PipelineState::parse(std::string_view text) {
  std::istringstream in{std::string(text)};
  std::string tag, fp;
  PipelineState s;
  if (!(in >> tag >> fp >> s.epoch >> s.position) || tag != "kiln.data.state/1" ||
      fp.size() != 16 || s.epoch < 0 || s.position < 0)
    fail("data.state", "unreadable pipeline state: got '", text,
         "', expected 'kiln.data.state/1 <16 hex digits> <epoch> <position>'");
  s.fingerprint = std::stoull(fp, nullptr, 16);
  return s;
}

std::string PipelineStats::to_string() const {
  char buf[160];
  const double wait_pct = seconds > 0 ? 100.0 * wait_seconds / seconds : 0.0;
  std::snprintf(buf, sizeof buf, "%" PRId64 " items, %.1f items/s, waited %.3fs (%.1f%%)", items,
                items_per_second, wait_seconds, wait_pct);
  std::string s = buf;
  if (skipped) s += ", skipped " + std::to_string(skipped) + " bad records";
  return s;
}

namespace detail {

// ---- stats table ------------------------------------------------------------------------------

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

void mark_started(StageCounters& c) {
  int64_t expected = -1;
  if (c.first_ns.load(std::memory_order_relaxed) == -1)
    c.first_ns.compare_exchange_strong(expected, now_ns());
}

StageCounters& StatsTable::stage(const void* node, const std::string& name) {
  std::lock_guard lock(mutex_);
  for (auto& [key, c] : stages_)
    if (key == node) return *c;
  stages_.emplace_back(node, std::make_unique<StageCounters>());
  stages_.back().second->name = name;
  return *stages_.back().second;
}

std::vector<StageCounters*> StatsTable::stages() {
  std::lock_guard lock(mutex_);
  std::vector<StageCounters*> out;
  for (auto& [key, c] : stages_) out.push_back(c.get());
  return out;
}

void StatsTable::reset() {
  std::lock_guard lock(mutex_);
  for (auto& [key, c] : stages_) {
    c->items = 0;
    c->wait_ns = 0;
    c->skipped = 0;
    c->first_ns = -1;
  }
}

// ---- node defaults ----------------------------------------------------------------------------

std::shared_ptr<const Indexed> Node::open_indexed(const OpenCtx&) const {
  fail("data.pipeline", "random access to a stream stage: got '", name(),
       "', expected a stage whose upstream has random access");
}

namespace {
// The most threads and the weakest ordering asked for by maps in the chain ending at `node`.
void chain_parallelism(const Node& node, int& threads, bool& ordered, bool& has_batch) {
  threads = std::max(threads, node.threads());
  ordered = ordered && node.ordered();
  has_batch = has_batch || node.is_batch();
  for (const auto& in : node.inputs())
    if (in->indexed()) chain_parallelism(*in, threads, ordered, has_batch);
}
}  // namespace

std::string chain_name(const Node& node) {
  std::string s;
  const auto ins = node.inputs();
  if (ins.size() == 1 && ins[0]->indexed()) {
    s = chain_name(*ins[0]) + " -> ";
  } else if (ins.size() > 1) {
    std::string parts;
    for (const auto& in : ins) parts += (parts.empty() ? "" : ", ") + chain_name(*in);
    return node.name() + "(" + parts + ")";
  }
  return s + node.name();
}

void add_load_skips(const Node& node, StageCounters& c) {
  if (node.load_skipped() > 0) {
    c.skipped += node.load_skipped();
    std::lock_guard lock(c.error_mutex);
    c.last_error = node.load_error();
  }
  for (const auto& in : node.inputs())
    if (in->indexed()) add_load_skips(*in, c);
}

std::unique_ptr<Cursor> Node::open(const OpenCtx& ctx, int64_t start) const {
  auto view = open_indexed(ctx);
  bool fresh = false;
  StageCounters* counters;
  {
    const std::string name = chain_name(*this);
    counters = &ctx.stats->stage(this, name);
    fresh = counters->first_ns.load() == -1 && counters->items.load() == 0 &&
            counters->skipped.load() == 0;
  }
  if (fresh) add_load_skips(*this, *counters);
  int threads = 0;
  bool ordered = true, has_batch = false;
  chain_parallelism(*this, threads, ordered, has_batch);
  if (threads > 0) {
    // A chain of maps on random-access data runs as one parallel stage: every worker fetches
    // and transforms whole elements, so sources, shuffling and batching run in parallel too.
    const int chunk = has_batch ? 1 : std::max(1, chunk_size());
    return make_parallel_indexed(std::move(view), start, threads, chunk, ordered, counters);
  }
  return std::make_unique<IndexedCursor>(std::move(view), start, counters);
}

std::optional<Sample> IndexedCursor::next() {
  mark_started(*stats_);
  if (pos_ >= view_->size()) return std::nullopt;
  const int64_t i = pos_++;
  Sample s = view_->get(i);
  stats_->items.fetch_add(1, std::memory_order_relaxed);
  return s;
}

// ---- helpers ----------------------------------------------------------------------------------

Tensor slice_view(const Tensor& t, int64_t index) {
  const TensorImpl& src = *t.impl();
  auto impl = std::make_shared<TensorImpl>();
  impl->type.dtype = src.type.dtype;
  impl->type.shape = Shape(std::vector<int64_t>(src.type.shape.begin() + 1, src.type.shape.end()));
  impl->strides.assign(src.strides.begin() + 1, src.strides.end());
  impl->offset = src.offset + index * src.strides[0];
  impl->storage = src.storage;
  return Tensor(std::move(impl));
}

Tensor bytes_tensor(const uint8_t* data, std::size_t n) {
  Tensor t = empty(Shape{static_cast<int64_t>(n)}, uint8);
  if (n) std::memcpy(t.data<uint8_t>(), data, n);
  return t;
}

// ---- iteration state --------------------------------------------------------------------------

struct Run {
  int64_t epoch = 0;
  int64_t position = 0;  // elements handed out in this epoch
  // Declared before the cursor, which holds pointers into it.
  StatsTable stats;
  std::atomic<int64_t> items{0};
  std::atomic<int64_t> wait_ns{0};
  std::atomic<int64_t> first_ns{-1};
  std::unique_ptr<Cursor> cursor;
  int64_t cursor_epoch = -1;
  int64_t cursor_position = -1;
  std::optional<Sample> current;

  void close() {
    cursor.reset();
    cursor_epoch = cursor_position = -1;
  }
  ~Run() { close(); }
};

namespace {
std::string describe_node(const Node& node) {
  const auto ins = node.inputs();
  if (ins.empty()) return node.name();
  if (ins.size() == 1) return describe_node(*ins[0]) + " -> " + node.name();
  std::string parts;
  for (const auto& in : ins) parts += (parts.empty() ? "" : ", ") + describe_node(*in);
  return node.name() + "(" + parts + ")";
}

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}
}  // namespace

}  // namespace detail

// ---- Pipeline -----------------------------------------------------------------------------------

Pipeline::Pipeline(std::shared_ptr<const detail::Node> node)
    : node_(std::move(node)), run_(std::make_unique<detail::Run>()) {}

Pipeline::Pipeline(const Pipeline& other)
    : node_(other.node_), run_(std::make_unique<detail::Run>()) {
  run_->epoch = other.run_->epoch;
  run_->position = other.run_->position;
}

Pipeline& Pipeline::operator=(const Pipeline& other) {
  if (this != &other) {
    auto run = std::make_unique<detail::Run>();
    run->epoch = other.run_->epoch;
    run->position = other.run_->position;
    run_.reset();  // its cursors use the old nodes: stop them first
    node_ = other.node_;
    run_ = std::move(run);
  }
  return *this;
}

Pipeline::Pipeline(Pipeline&&) noexcept = default;
Pipeline& Pipeline::operator=(Pipeline&& other) noexcept {
  if (this != &other) {
    run_.reset();
    node_ = std::move(other.node_);
    run_ = std::move(other.run_);
  }
  return *this;
}
Pipeline::~Pipeline() = default;

Pipeline Pipeline::then(std::shared_ptr<const detail::Node> node) const {
  return Pipeline(std::move(node));
}

std::optional<int64_t> Pipeline::size() const { return node_->size(); }
bool Pipeline::random_access() const { return node_->indexed(); }
std::string Pipeline::describe() const { return detail::describe_node(*node_); }

Sample Pipeline::get(int64_t index) const {
  if (!node_->indexed())
    fail("data.get", "no random access: got pipeline '", describe(),
         "', expected one without stream stages (filter, buffered shuffle, prefetch, repeat, "
         "on_error)");
  detail::StatsTable scratch;
  auto view = node_->open_indexed({run_->epoch, &scratch});
  if (index < 0 || index >= view->size())
    fail("data.get", "index out of range: got ", index, ", expected 0 <= index < ", view->size());
  return view->get(index);
}

std::optional<Sample> Pipeline::next() {
  detail::Run& r = *run_;
  if (r.first_ns.load() == -1) r.first_ns = detail::now_ns();
  if (!r.cursor || r.cursor_epoch != r.epoch || r.cursor_position != r.position) {
    r.close();
    r.cursor = node_->open({r.epoch, &r.stats}, r.position);
    r.cursor_epoch = r.epoch;
    r.cursor_position = r.position;
  }
  const int64_t t0 = detail::now_ns();
  std::optional<Sample> s;
  try {
    s = r.cursor->next();
  } catch (...) {
    // The element that failed is retried if iteration starts again from this state.
    r.close();
    r.wait_ns += detail::now_ns() - t0;
    throw;
  }
  r.wait_ns += detail::now_ns() - t0;
  if (!s) {
    r.close();
    ++r.epoch;
    r.position = 0;
    return std::nullopt;
  }
  ++r.position;
  ++r.cursor_position;
  ++r.items;
  return s;
}

Pipeline::Iterator Pipeline::begin() {
  run_->current = next();
  return Iterator(this, run_->current ? &*run_->current : nullptr);
}

Pipeline::Iterator& Pipeline::Iterator::operator++() {
  auto& cur = pipeline_->run_->current;
  cur.reset();  // release the previous batch before the next is made
  current_ = nullptr;
  cur = pipeline_->next();
  if (cur) current_ = &*cur;
  return *this;
}

int64_t Pipeline::epoch() const { return run_->epoch; }

void Pipeline::set_epoch(int64_t epoch) {
  if (epoch < 0) fail("data.set_epoch", "negative epoch: got ", epoch, ", expected >= 0");
  run_->close();
  run_->epoch = epoch;
  run_->position = 0;
}

PipelineState Pipeline::state() const {
  return {detail::fnv1a(describe()), run_->epoch, run_->position};
}

void Pipeline::restore(const PipelineState& state) {
  const uint64_t fp = detail::fnv1a(describe());
  if (state.fingerprint != fp)
    fail("data.restore", "state of another pipeline: got fingerprint ", std::hex, state.fingerprint,
         ", expected ", fp, " (of '", describe(), "')");
  if (state.epoch < 0 || state.position < 0)
    fail("data.restore", "negative position: got epoch ", state.epoch, " position ", state.position,
         ", expected both >= 0");
  if (const auto n = size(); n && state.position > *n)
    fail("data.restore", "position past the end of the epoch: got ", state.position,
         ", expected at most ", *n);
  // Keep a live cursor when it already stands there (restoring the state just taken).
  if (run_->cursor_epoch != state.epoch || run_->cursor_position != state.position) run_->close();
  run_->epoch = state.epoch;
  run_->position = state.position;
}

PipelineStats Pipeline::stats() const {
  PipelineStats out;
  const int64_t now = detail::now_ns();
  for (detail::StageCounters* c : run_->stats.stages()) {
    StageStats s;
    s.name = c->name;
    s.items = c->items.load();
    const int64_t first = c->first_ns.load();
    const double secs = first >= 0 ? static_cast<double>(now - first) * 1e-9 : 0.0;
    s.items_per_second = secs > 0 ? static_cast<double>(s.items) / secs : 0.0;
    s.wait_seconds = static_cast<double>(c->wait_ns.load()) * 1e-9;
    s.skipped = c->skipped.load();
    {
      std::lock_guard lock(c->error_mutex);
      s.last_error = c->last_error;
    }
    out.skipped += s.skipped;
    out.stages.push_back(std::move(s));
  }
  out.items = run_->items.load();
  const int64_t first = run_->first_ns.load();
  out.seconds = first >= 0 ? static_cast<double>(now - first) * 1e-9 : 0.0;
  out.items_per_second = out.seconds > 0 ? static_cast<double>(out.items) / out.seconds : 0.0;
  out.wait_seconds = static_cast<double>(run_->wait_ns.load()) * 1e-9;
  return out;
}

void Pipeline::reset_stats() {
  run_->stats.reset();
  run_->items = 0;
  run_->wait_ns = 0;
  run_->first_ns = -1;
}

}  // namespace kiln::data
