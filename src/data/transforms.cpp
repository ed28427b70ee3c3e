// Transform nodes: map, filter, shuffle, batch, prefetch, repeat, take, skip, zip, shard and
// on_error, and the Pipeline methods that chain them.
#include <algorithm>
#include <cstring>

#include "data/node.h"
#include "data/parallel.h"
#include "data/sizes.h"

namespace kiln::data {
namespace detail {
namespace {

StageCounters& stage_of(const OpenCtx& ctx, const Node& node) {
  return ctx.stats->stage(&node, node.name());
}

// Pulls `n` elements from a cursor and drops them (replaying deterministic stream stages).
void discard(Cursor& c, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!c.next()) return;
}

// Where a stream stage that reads `step` input elements per output resumes its input: element
// first + start * step. A position (from a restored state) whose element does not fit in int64
// is one no input could have reached.
int64_t resume_offset(const char* op, int64_t first, int64_t start, int64_t step) {
  const auto skipped = checked_product({start, step});
  const auto offset = skipped ? checked_sum({first, *skipped}) : std::nullopt;
  if (!offset)
    fail(op, "cannot resume: got position ", start, " (input element ", first, " + ", start, " x ",
         step, "), expected a position whose input element fits in int64");
  return *offset;
}

// ---- map ----------------------------------------------------------------------------------------

class MapIndexed : public Indexed {
 public:
  MapIndexed(std::shared_ptr<const Indexed> up, const IndexedFn* fn, const ImageTransform* image,
             int64_t epoch)
      : up_(std::move(up)), fn_(fn), image_(image), epoch_(epoch) {}
  int64_t size() const override { return up_->size(); }
  Sample get(int64_t i) const override { return (*fn_)(up_->get(i), epoch_, i); }
  Sample get_into(int64_t i, const std::vector<FieldSlot>& slots) const override {
    if (image_) {
      for (const auto& slot : slots) {
        if (slot.name != image_->field()) continue;
        const Tensor dest = slice_view(*slot.batch, slot.row);
        return apply_image(*image_, up_->get(i), epoch_, i, &dest);
      }
    }
    return get(i);
  }
  void prefetch(int64_t i) const override { up_->prefetch(i); }

 private:
  std::shared_ptr<const Indexed> up_;
  const IndexedFn* fn_;  // owned by the node, which outlives every view of it
  const ImageTransform* image_;
  int64_t epoch_;
};

class MapCursor : public Cursor {
 public:
  MapCursor(std::unique_ptr<Cursor> in, const IndexedFn* fn, int64_t epoch, int64_t index,
            StageCounters* stats)
      : in_(std::move(in)), fn_(fn), epoch_(epoch), index_(index), stats_(stats) {}
  std::optional<Sample> next() override {
    mark_started(*stats_);
    std::optional<Sample> s;
    const int64_t i = index_++;  // a failed input still uses up its index
    s = in_->next();
    if (!s) {
      --index_;
      return s;
    }
    Sample out = (*fn_)(std::move(*s), epoch_, i);
    stats_->items.fetch_add(1, std::memory_order_relaxed);
    return out;
  }

 private:
  std::unique_ptr<Cursor> in_;
  const IndexedFn* fn_;
  int64_t epoch_;
  int64_t index_;
  StageCounters* stats_;
};

class MapNode : public Node {
 public:
  MapNode(NodePtr in, IndexedFn fn, std::string name, MapOptions opt,
          std::optional<ImageTransform> image)
      : in_(std::move(in)),
        fn_(std::move(fn)),
        name_(std::move(name)),
        opt_(opt),
        image_(std::move(image)) {
    // The keep-alive shared_ptr is not needed: views hold the node through the pipeline.
  }
  std::string name() const override { return name_; }
  std::vector<NodePtr> inputs() const override { return {in_}; }
  bool indexed() const override { return in_->indexed(); }
  std::optional<int64_t> size() const override { return in_->size(); }
  int threads() const override { return opt_.num_threads; }
  bool ordered() const override { return opt_.ordered; }
  int chunk_size() const override { return opt_.chunk_size; }
  std::shared_ptr<const Indexed> open_indexed(const OpenCtx& ctx) const override {
    return std::make_shared<MapIndexed>(in_->open_indexed(ctx), &fn_, image_ ? &*image_ : nullptr,
                                        ctx.epoch);
  }
  std::unique_ptr<Cursor> open(const OpenCtx& ctx, int64_t start) const override {
    if (indexed()) return Node::open(ctx, start);
    auto up = in_->open(ctx, start);
    StageCounters& st = stage_of(ctx, *this);
    if (opt_.num_threads > 0) {
      const IndexedFn* fn = &fn_;
      const int64_t epoch = ctx.epoch;
      return make_parallel_stream(
          std::move(up), start,
          [fn, epoch](Sample s, int64_t i) { return (*fn)(std::move(s), epoch, i); },
          opt_.num_threads, std::max(1, opt_.chunk_size), opt_.ordered, &st);
    }
    return std::make_unique<MapCursor>(std::move(up), &fn_, ctx.epoch, start, &st);
  }
  const std::optional<ImageTransform>& image() const { return image_; }
  const MapOptions& options() const { return opt_; }
  const NodePtr& input() const { return in_; }

 private:
  NodePtr in_;
  IndexedFn fn_;
  std::string name_;
  MapOptions opt_;
  std::optional<ImageTransform> image_;
};

NodePtr make_image_map_node(NodePtr in, const ImageTransform& t, MapOptions opt) {
  IndexedFn fn = [t](Sample s, int64_t epoch, int64_t index) {
    return apply_image(t, std::move(s), epoch, index);
  };
  return std::make_shared<MapNode>(std::move(in), std::move(fn), "map[" + t.describe() + "]", opt,
                                   t);
}

// ---- filter
// ---------------------------------------------------------------------------------------

class FilterNode : public Node {
 public:
  FilterNode(NodePtr in, FilterFn pred) : in_(std::move(in)), pred_(std::move(pred)) {}
  std::string name() const override { return "filter"; }
  std::vector<NodePtr> inputs() const override { return {in_}; }
  std::unique_ptr<Cursor> open(const OpenCtx& ctx, int64_t start) const override {
    auto c = std::make_unique<FilterCursor>(in_->open(ctx, 0), &pred_, &stage_of(ctx, *this));
    discard(*c, start);  // which elements pass is only known by evaluating them
    return c;
  }

 private:
  class FilterCursor : public Cursor {
   public:
    FilterCursor(std::unique_ptr<Cursor> in, const FilterFn* pred, StageCounters* stats)
        : in_(std::move(in)), pred_(pred), stats_(stats) {}
    std::optional<Sample> next() override {
      mark_started(*stats_);
      for (;;) {
        auto s = in_->next();
        if (!s) return s;
        if ((*pred_)(*s)) {
          stats_->items.fetch_add(1, std::memory_order_relaxed);
          return s;
        }
      }
    }

   private:
    std::unique_ptr<Cursor> in_;
    const FilterFn* pred_;
    StageCounters* stats_;
  };
  NodePtr in_;
  FilterFn pred_;
};

// ---- shuffle
// --------------------------------------------------------------------------------------

class PermutedIndexed : public Indexed {
 public:
  PermutedIndexed(std::shared_ptr<const Indexed> up, std::shared_ptr<const std::vector<int64_t>> p)
      : up_(std::move(up)), perm_(std::move(p)) {}
  int64_t size() const override { return static_cast<int64_t>(perm_->size()); }
  Sample get(int64_t i) const override { return up_->get((*perm_)[static_cast<std::size_t>(i)]); }
  Sample get_into(int64_t i, const std::vector<FieldSlot>& slots) const override {
    return up_->get_into((*perm_)[static_cast<std::size_t>(i)], slots);
  }
  void prefetch(int64_t i) const override {
    if (i < size()) up_->prefetch((*perm_)[static_cast<std::size_t>(i)]);
  }

 private:
  std::shared_ptr<const Indexed> up_;
  std::shared_ptr<const std::vector<int64_t>> perm_;
};

class ShuffleNode : public Node {
 public:
  ShuffleNode(NodePtr in, uint64_t seed, ShuffleOptions opt)
      : in_(std::move(in)), seed_(seed), opt_(opt) {}
  std::string name() const override {
    return in_->indexed()
               ? kiln::detail::cat("shuffle(seed=", seed_, ")")
               : kiln::detail::cat("shuffle(seed=", seed_, ", buffer=", opt_.buffer_size, ")");
  }
  std::vector<NodePtr> inputs() const override { return {in_}; }
  bool indexed() const override { return in_->indexed(); }
  std::optional<int64_t> size() const override { return in_->size(); }

  std::shared_ptr<const Indexed> open_indexed(const OpenCtx& ctx) const override {
    auto up = in_->open_indexed(ctx);
    return std::make_shared<PermutedIndexed>(up, permutation(ctx.epoch, up->size()));
  }

  std::unique_ptr<Cursor> open(const OpenCtx& ctx, int64_t start) const override {
    if (indexed()) return Node::open(ctx, start);
    auto c = std::make_unique<BufferCursor>(in_->open(ctx, 0), seed_, ctx.epoch, opt_.buffer_size,
                                            &stage_of(ctx, *this));
    discard(*c, start);  // the buffer's content depends on everything read before
    return c;
  }

 private:
  // Fisher-Yates driven by the (seed, epoch) stream; cached for the last epoch asked.
  std::shared_ptr<const std::vector<int64_t>> permutation(int64_t epoch, int64_t n) const {
    std::lock_guard lock(cache_mutex_);
    if (cache_ && cache_epoch_ == epoch && static_cast<int64_t>(cache_->size()) == n) return cache_;
    auto p = std::make_shared<std::vector<int64_t>>(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) (*p)[static_cast<std::size_t>(i)] = i;
    Rng rng(sample_key(seed_, epoch, -1));
    for (int64_t i = n - 1; i > 0; --i)
      std::swap((*p)[static_cast<std::size_t>(i)],
                (*p)[static_cast<std::size_t>(rng.uniform_int(0, i + 1))]);
    cache_ = p;
    cache_epoch_ = epoch;
    return p;
  }

  // A reservoir: each output is a uniformly random element of the next buffer_size ones.
  class BufferCursor : public Cursor {
   public:
    BufferCursor(std::unique_ptr<Cursor> in, uint64_t seed, int64_t epoch, int64_t size,
                 StageCounters* stats)
        : in_(std::move(in)), seed_(seed), epoch_(epoch), size_(size), stats_(stats) {}
    std::optional<Sample> next() override {
      mark_started(*stats_);
      while (!in_done_ && static_cast<int64_t>(buf_.size()) < size_) {
        auto s = in_->next();
        if (!s) {
          in_done_ = true;
        } else {
          buf_.push_back(std::move(*s));
        }
      }
      if (buf_.empty()) return std::nullopt;
      Rng rng(sample_key(seed_, epoch_, out_++));
      const auto j =
          static_cast<std::size_t>(rng.uniform_int(0, static_cast<int64_t>(buf_.size())));
      std::swap(buf_[j], buf_.back());
      Sample out = std::move(buf_.back());
      buf_.pop_back();
      stats_->items.fetch_add(1, std::memory_order_relaxed);
      return out;
    }

   private:
    std::unique_ptr<Cursor> in_;
    uint64_t seed_;
    int64_t epoch_;
    int64_t size_;
    StageCounters* stats_;
    std::vector<Sample> buf_;
    bool in_done_ = false;
    int64_t out_ = 0;
  };

  NodePtr in_;
  uint64_t seed_;
  ShuffleOptions opt_;
  mutable std::mutex cache_mutex_;
  mutable std::shared_ptr<const std::vector<int64_t>> cache_;
  mutable int64_t cache_epoch_ = -1;
};

// ---- batch
// ------------------------------------------------------------------------------------------

std::string field_list(const Sample& s) {
  std::string out;
  for (const auto& [name, t] : s) out += (out.empty() ? "" : ", ") + name;
  return "{" + out + "}";
}

// Copies a contiguous sample into a padded slot of `dst` (whose first axis is the batch axis).
void copy_padded(const Tensor& src, const Tensor& dst, int64_t b) {
  const std::size_t es = dtype_size(src.dtype());
  const int r = src.rank();
  const auto* s = static_cast<const uint8_t*>(src.raw_data());
  auto* d = static_cast<uint8_t*>(dst.raw_data());
  const auto& dstr = dst.strides();
  if (r == 0) {
    std::memcpy(d + static_cast<std::size_t>(b * dstr[0]) * es, s, es);
    return;
  }
  const int64_t row = src.shape()[r - 1];
  int64_t rows = 1;
  for (int i = 0; i < r - 1; ++i) rows *= src.shape()[i];
  std::vector<int64_t> idx(static_cast<std::size_t>(r), 0);
  for (int64_t k = 0; k < rows; ++k) {
    int64_t off = b * dstr[0];
    for (int i = 0; i < r - 1; ++i)
      off += idx[static_cast<std::size_t>(i)] * dstr[static_cast<std::size_t>(i) + 1];
    if (row)
      std::memcpy(d + static_cast<std::size_t>(off) * es,
                  s + static_cast<std::size_t>(k * row) * es, static_cast<std::size_t>(row) * es);
    for (int i = r - 2; i >= 0; --i) {
      if (++idx[static_cast<std::size_t>(i)] < src.shape()[i]) break;
      idx[static_cast<std::size_t>(i)] = 0;
    }
  }
}

}  // namespace

// `prealloc` holds batch buffers made from the first sample's types; samples whose field already
// sits in its row (written there through get_into) are not copied again.
Batch collate(std::vector<Sample>& samples, const BatchOptions& opt,
              const std::vector<FieldSlot>* prealloc = nullptr) {
  if (samples.empty()) fail("data.batch", "empty batch: got 0 samples, expected at least 1");
  const Sample& first = samples.front();
  const auto n = static_cast<int64_t>(samples.size());
  // Field `name` of `s`, looked for first at position j: samples of one pipeline hold their
  // fields in the same order, so batching f fields costs O(f), not O(f^2).
  const auto field = [](const Sample& s, std::size_t j, const std::string& name) -> const Tensor* {
    if (j < s.size() && (s.begin() + static_cast<std::ptrdiff_t>(j))->first == name)
      return &(s.begin() + static_cast<std::ptrdiff_t>(j))->second;
    return s.contains(name) ? &s.at(name) : nullptr;
  };
  for (std::size_t k = 1; k < samples.size(); ++k) {
    const Sample& s = samples[k];
    bool same = s.size() == first.size();
    std::size_t j = 0;
    for (auto it = first.begin(); same && it != first.end(); ++it, ++j)
      same = field(s, j, it->first) != nullptr;
    if (!same)
      fail("data.batch", "samples with different fields: got ", field_list(s), " in sample ", k,
           ", expected ", field_list(first), " as in sample 0");
  }
  Batch out;
  SampleAccess::reserve(out, first.size() + opt.pad.size());
  std::size_t j = 0, next_slot = 0;
  for (auto field_it = first.begin(); field_it != first.end(); ++field_it, ++j) {
    const auto& [name, t0] = *field_it;
    const double* pad = nullptr;
    for (const auto& [pname, value] : opt.pad)
      if (pname == name) pad = &value;
    if (pad && first.contains(name + "_length"))
      fail("data.batch", "field '", name, "_length' exists already: got it in the samples, ",
           "expected no such field next to '", name, "', whose lengths padding adds under it");
    std::vector<Tensor> parts;
    parts.reserve(samples.size());
    Shape max_shape = t0.shape();
    for (std::size_t k = 0; k < samples.size(); ++k) {
      const Tensor& t = *field(samples[k], j, name);
      if (t.dtype() != t0.dtype())
        fail("data.batch", "field '", name, "' changes dtype: got ", dtype_name(t.dtype()),
             " in sample ", k, ", expected ", dtype_name(t0.dtype()), " as in sample 0");
      if (t.shape() != t0.shape()) {
        if (!pad || t.rank() != t0.rank())
          fail("data.batch", "field '", name, "' changes shape: got ", t.shape(), " in sample ", k,
               ", expected ", t0.shape(), " as in sample 0",
               pad ? " (padding needs equal ranks)" : " (list it in BatchOptions::pad to pad it)");
        for (int i = 0; i < t.rank(); ++i) max_shape[i] = std::max(max_shape[i], t.shape()[i]);
      }
      parts.push_back(t.is_contiguous() ? t : t.contiguous());
    }
    std::vector<int64_t> dims{n};
    dims.insert(dims.end(), max_shape.begin(), max_shape.end());
    if (pad) {
      Tensor buf = full(Shape(dims), *pad, t0.dtype());
      std::vector<int64_t> lengths;
      for (int64_t k = 0; k < n; ++k) {
        copy_padded(parts[static_cast<std::size_t>(k)], buf, k);
        const Tensor& p = parts[static_cast<std::size_t>(k)];
        lengths.push_back(p.rank() ? p.shape()[0] : 1);
      }
      SampleAccess::append(out, name, std::move(buf));
      SampleAccess::append(out, name + "_length", tensor(lengths, Shape{n}));
    } else {
      // The slots follow the first sample's unpadded fields in order.
      Tensor buf;
      if (prealloc && next_slot < prealloc->size() && (*prealloc)[next_slot].name == name) {
        const FieldSlot& slot = (*prealloc)[next_slot++];
        if (slot.batch->shape() == Shape(dims) && slot.batch->dtype() == t0.dtype())
          buf = *slot.batch;
      }
      if (!buf.defined()) buf = empty(Shape(dims), t0.dtype());
      const std::size_t bytes = static_cast<std::size_t>(t0.numel()) * dtype_size(t0.dtype());
      auto* d = static_cast<uint8_t*>(buf.raw_data());
      for (int64_t k = 0; k < n; ++k) {
        const Tensor& part = parts[static_cast<std::size_t>(k)];
        uint8_t* row = d + static_cast<std::size_t>(k) * bytes;
        if (part.raw_data() != row) std::memcpy(row, part.raw_data(), bytes);
      }
      SampleAccess::append(out, name, std::move(buf));
    }
  }
  return out;
}

namespace {

class BatchNode : public Node {
 public:
  BatchNode(NodePtr in, int64_t size, BatchOptions opt)
      : in_(std::move(in)), size_(size), opt_(std::move(opt)) {}
  std::string name() const override {
    std::string s =
        kiln::detail::cat("batch(", size_, opt_.drop_remainder ? ", drop_remainder" : "");
    for (const auto& [f, v] : opt_.pad) s += kiln::detail::cat(", pad ", f, "=", v);
    return s + ")";
  }
  std::vector<NodePtr> inputs() const override { return {in_}; }
  bool indexed() const override { return in_->indexed(); }
  bool is_batch() const override { return true; }
  std::optional<int64_t> size() const override {
    const auto n = in_->size();
    if (!n) return n;
    return opt_.drop_remainder ? *n / size_ : ceil_div(*n, size_);
  }
  std::shared_ptr<const Indexed> open_indexed(const OpenCtx& ctx) const override {
    return std::make_shared<View>(in_->open_indexed(ctx), this);
  }
  std::unique_ptr<Cursor> open(const OpenCtx& ctx, int64_t start) const override {
    if (indexed()) return Node::open(ctx, start);
    return std::make_unique<BatchCursor>(
        in_->open(ctx, resume_offset("data.batch", 0, start, size_)), this, &stage_of(ctx, *this));
  }

 private:
  class View : public Indexed {
   public:
    View(std::shared_ptr<const Indexed> up, const BatchNode* node)
        : up_(std::move(up)), node_(node) {}
    int64_t size() const override {
      const int64_t n = up_->size(), b = node_->size_;
      return node_->opt_.drop_remainder ? n / b : ceil_div(n, b);
    }
    Sample get(int64_t i) const override {
      const int64_t begin = i * node_->size_;  // i < size(): within the upstream
      const int64_t end = begin + std::min(up_->size() - begin, node_->size_);
      std::vector<Sample> samples;
      samples.reserve(static_cast<std::size_t>(end - begin));
      samples.push_back(up_->get(begin));
      // Buffers typed after the first sample, so later samples can be computed in place.
      std::vector<Tensor> buffers;
      std::vector<FieldSlot> slots;
      buffers.reserve(samples[0].size());
      for (const auto& [name, t] : samples[0]) {
        bool padded = false;
        for (const auto& [pname, value] : node_->opt_.pad) padded = padded || pname == name;
        if (padded) continue;
        std::vector<int64_t> dims{end - begin};
        dims.insert(dims.end(), t.shape().begin(), t.shape().end());
        buffers.push_back(empty(Shape(dims), t.dtype()));
      }
      std::size_t b = 0;
      for (const auto& [name, t] : samples[0]) {
        bool padded = false;
        for (const auto& [pname, value] : node_->opt_.pad) padded = padded || pname == name;
        if (!padded) slots.push_back({name, &buffers[b++], 0});
      }
      // Random access into a large source misses the cache: ask for samples a few ahead.
      constexpr int64_t kAhead = 4;
      for (int64_t j = begin + 1; j < std::min(end, begin + 1 + kAhead); ++j) up_->prefetch(j);
      for (int64_t j = begin + 1; j < end; ++j) {
        if (j + kAhead < end) up_->prefetch(j + kAhead);
        for (auto& slot : slots) slot.row = j - begin;
        samples.push_back(up_->get_into(j, slots));
      }
      return collate(samples, node_->opt_, &slots);
    }

   private:
    std::shared_ptr<const Indexed> up_;
    const BatchNode* node_;
  };

  class BatchCursor : public Cursor {
   public:
    BatchCursor(std::unique_ptr<Cursor> in, const BatchNode* node, StageCounters* stats)
        : in_(std::move(in)), node_(node), stats_(stats) {}
    std::optional<Sample> next() override {
      mark_started(*stats_);
      std::vector<Sample> samples;  // not reserved: the size asked for may be far beyond the data
      while (static_cast<int64_t>(samples.size()) < node_->size_) {
        auto s = in_->next();  // an error drops the partial batch with it
        if (!s) break;
        samples.push_back(std::move(*s));
      }
      if (samples.empty()) return std::nullopt;
      if (static_cast<int64_t>(samples.size()) < node_->size_ && node_->opt_.drop_remainder)
        return std::nullopt;
      Sample b = collate(samples, node_->opt_);
      stats_->items.fetch_add(1, std::memory_order_relaxed);
      return b;
    }

   private:
    std::unique_ptr<Cursor> in_;
    const BatchNode* node_;
    StageCounters* stats_;
  };

  NodePtr in_;
  int64_t size_;
  BatchOptions opt_;
};

// ---- prefetch
// ----------------------------------------------------------------------------------------

class PrefetchNode : public Node {
 public:
  PrefetchNode(NodePtr in, int64_t depth) : in_(std::move(in)), depth_(depth) {}
  std::string name() const override { return kiln::detail::cat("prefetch(", depth_, ")"); }
  std::vector<NodePtr> inputs() const override { return {in_}; }
  std::optional<int64_t> size() const override { return in_->size(); }
  std::unique_ptr<Cursor> open(const OpenCtx& ctx, int64_t start) const override {
    auto up = in_->open(ctx, start);
    return make_prefetch(std::move(up), depth_, &stage_of(ctx, *this));
  }

 private:
  NodePtr in_;
  int64_t depth_;
};

// ---- repeat
// ------------------------------------------------------------------------------------------

class RepeatNode : public Node {
 public:
  RepeatNode(NodePtr in, std::optional<int64_t> count) : in_(std::move(in)), count_(count) {}
  std::string name() const override {
    return count_ ? kiln::detail::cat("repeat(", *count_, ")") : std::string("repeat()");
  }
  std::vector<NodePtr> inputs() const override { return {in_}; }
  // Unknown also when the count of elements does not fit in int64 (practically endless).
  std::optional<int64_t> size() const override {
    const auto n = in_->size();
    if (n && *n == 0) return 0;
    if (!n || !count_) return std::nullopt;
    return checked_product({*n, *count_});
  }
  // Each repetition is a distinct inner epoch, so shuffles and augmentations differ between them.
  // It only keys random streams: far repetitions wrap around modulo 2^64 instead of overflowing.
  int64_t inner_epoch(int64_t epoch, int64_t r) const {
    const auto e = static_cast<uint64_t>(epoch), rep = static_cast<uint64_t>(r);
    return static_cast<int64_t>(count_ ? e * static_cast<uint64_t>(*count_) + rep
                                       : (e << 32) + rep);
  }
  std::unique_ptr<Cursor> open(const OpenCtx& ctx, int64_t start) const override {
    const auto n = in_->size();
    auto c = std::make_unique<RepeatCursor>(this, ctx, &stage_of(ctx, *this));
    if (n && *n > 0) {
      c->seek(start / *n, start % *n);
    } else {
      c->seek(0, 0);
      discard(*c, start);
    }
    return c;
  }

 private:
  class RepeatCursor : public Cursor {
   public:
    RepeatCursor(const RepeatNode* node, OpenCtx ctx, StageCounters* stats)
        : node_(node), ctx_(ctx), stats_(stats) {}
    void seek(int64_t rep, int64_t offset) {
      rep_ = rep;
      cur_.reset();
      if (node_->count_ && rep_ >= *node_->count_) return;
      cur_ = node_->in_->open({node_->inner_epoch(ctx_.epoch, rep_), ctx_.stats}, offset);
      got_any_ = offset > 0;
    }
    std::optional<Sample> next() override {
      mark_started(*stats_);
      while (cur_) {
        auto s = cur_->next();
        if (s) {
          got_any_ = true;
          stats_->items.fetch_add(1, std::memory_order_relaxed);
          return s;
        }
        if (!got_any_) {  // an empty repetition: all further ones are empty too
          cur_.reset();
          break;
        }
        seek(rep_ + 1, 0);
      }
      return std::nullopt;
    }

   private:
    const RepeatNode* node_;
    OpenCtx ctx_;
    StageCounters* stats_;
    std::unique_ptr<Cursor> cur_;
    int64_t rep_ = 0;
    bool got_any_ = false;
  };
  NodePtr in_;
  std::optional<int64_t> count_;
};

// ---- take / skip / shard
// -------------------------------------------------------------------------------

// Element i of the view is element first + i * step of the upstream, for i < count.
class StridedIndexed : public Indexed {
 public:
  StridedIndexed(std::shared_ptr<const Indexed> up, int64_t first, int64_t step, int64_t count)
      : up_(std::move(up)), first_(first), step_(step), count_(count) {}
  int64_t size() const override { return count_; }
  Sample get(int64_t i) const override { return up_->get(first_ + i * step_); }
  Sample get_into(int64_t i, const std::vector<FieldSlot>& slots) const override {
    return up_->get_into(first_ + i * step_, slots);
  }
  void prefetch(int64_t i) const override {
    if (i < count_) up_->prefetch(first_ + i * step_);
  }

 private:
  std::shared_ptr<const Indexed> up_;
  int64_t first_, step_, count_;
};

// take(n), skip(n) and shard(count, index) are all strided slices of their input.
class SliceNode : public Node {
 public:
  SliceNode(NodePtr in, const char* op, std::string name, int64_t first, int64_t step,
            std::optional<int64_t> limit)
      : in_(std::move(in)),
        op_(op),
        name_(std::move(name)),
        first_(first),
        step_(step),
        limit_(limit) {}
  std::string name() const override { return name_; }
  std::vector<NodePtr> inputs() const override { return {in_}; }
  bool indexed() const override { return in_->indexed(); }
  std::optional<int64_t> size() const override {
    const auto n = in_->size();
    if (!n) return limit_ && *limit_ == 0 ? std::optional<int64_t>(0) : std::nullopt;
    return count(*n);
  }
  std::shared_ptr<const Indexed> open_indexed(const OpenCtx& ctx) const override {
    auto up = in_->open_indexed(ctx);
    const int64_t n = up->size();
    return std::make_shared<StridedIndexed>(std::move(up), first_, step_, count(n));
  }
  std::unique_ptr<Cursor> open(const OpenCtx& ctx, int64_t start) const override {
    if (indexed()) return Node::open(ctx, start);
    return std::make_unique<SliceCursor>(in_->open(ctx, resume_offset(op_, first_, start, step_)),
                                         this, start, &stage_of(ctx, *this));
  }

 private:
  int64_t count(int64_t n) const {
    const int64_t c = n > first_ ? ceil_div(n - first_, step_) : 0;
    return limit_ ? std::min(c, *limit_) : c;
  }
  class SliceCursor : public Cursor {
   public:
    SliceCursor(std::unique_ptr<Cursor> in, const SliceNode* node, int64_t pos,
                StageCounters* stats)
        : in_(std::move(in)), node_(node), pos_(pos), stats_(stats) {}
    std::optional<Sample> next() override {
      mark_started(*stats_);
      if (done_ || (node_->limit_ && pos_ >= *node_->limit_)) return std::nullopt;
      if (!first_) discard(*in_, node_->step_ - 1);  // the other shards' elements
      first_ = false;
      ++pos_;
      auto s = in_->next();
      if (!s) {
        done_ = true;
        return s;
      }
      stats_->items.fetch_add(1, std::memory_order_relaxed);
      return s;
    }

   private:
    std::unique_ptr<Cursor> in_;
    const SliceNode* node_;
    int64_t pos_;
    bool first_ = true;
    StageCounters* stats_;
    bool done_ = false;
  };
  NodePtr in_;
  const char* op_;
  std::string name_;
  int64_t first_, step_;
  std::optional<int64_t> limit_;
};

// ---- zip
// ---------------------------------------------------------------------------------------------

Sample merge(std::vector<Sample> parts) {
  Sample out = std::move(parts[0]);
  for (std::size_t k = 1; k < parts.size(); ++k) {
    for (auto& [name, t] : parts[k]) {
      if (out.contains(name))
        fail("data.zip", "field '", name, "' in two zipped pipelines: got it in inputs 0 and ", k,
             ", expected distinct field names (rename one with map)");
      out.set(name, std::move(t));
    }
  }
  return out;
}

class ZipNode : public Node {
 public:
  explicit ZipNode(std::vector<NodePtr> ins) : ins_(std::move(ins)) {}
  std::string name() const override { return "zip"; }
  std::vector<NodePtr> inputs() const override { return ins_; }
  bool indexed() const override {
    return std::all_of(ins_.begin(), ins_.end(), [](const NodePtr& n) { return n->indexed(); });
  }
  std::optional<int64_t> size() const override {
    std::optional<int64_t> out;
    for (const auto& in : ins_) {
      const auto n = in->size();
      if (!n) return std::nullopt;
      out = out ? std::min(*out, *n) : *n;
    }
    return out;
  }
  std::shared_ptr<const Indexed> open_indexed(const OpenCtx& ctx) const override {
    std::vector<std::shared_ptr<const Indexed>> views;
    for (const auto& in : ins_) views.push_back(in->open_indexed(ctx));
    return std::make_shared<View>(std::move(views));
  }
  std::unique_ptr<Cursor> open(const OpenCtx& ctx, int64_t start) const override {
    if (indexed()) return Node::open(ctx, start);
    std::vector<std::unique_ptr<Cursor>> cs;
    for (const auto& in : ins_) cs.push_back(in->open(ctx, start));
    return std::make_unique<ZipCursor>(std::move(cs), &stage_of(ctx, *this));
  }

 private:
  class View : public Indexed {
   public:
    explicit View(std::vector<std::shared_ptr<const Indexed>> v) : v_(std::move(v)) {}
    int64_t size() const override {
      int64_t n = v_[0]->size();
      for (const auto& x : v_) n = std::min(n, x->size());
      return n;
    }
    Sample get(int64_t i) const override {
      std::vector<Sample> parts;
      for (const auto& x : v_) parts.push_back(x->get(i));
      return merge(std::move(parts));
    }

   private:
    std::vector<std::shared_ptr<const Indexed>> v_;
  };
  class ZipCursor : public Cursor {
   public:
    ZipCursor(std::vector<std::unique_ptr<Cursor>> cs, StageCounters* stats)
        : cs_(std::move(cs)), stats_(stats) {}
    std::optional<Sample> next() override {
      mark_started(*stats_);
      std::vector<Sample> parts;
      std::exception_ptr error;
      // Advance every input even when one fails, so they stay aligned.
      for (auto& c : cs_) {
        try {
          auto s = c->next();
          if (!s) return std::nullopt;
          parts.push_back(std::move(*s));
        } catch (...) {
          if (!error) error = std::current_exception();
        }
      }
      if (error) std::rethrow_exception(error);
      stats_->items.fetch_add(1, std::memory_order_relaxed);
      return merge(std::move(parts));
    }

   private:
    std::vector<std::unique_ptr<Cursor>> cs_;
    StageCounters* stats_;
  };
  std::vector<NodePtr> ins_;
};

// ---- on_error(skip)
// ---------------------------------------------------------------------------------

class SkipErrorsNode : public Node {
 public:
  explicit SkipErrorsNode(NodePtr in) : in_(std::move(in)) {}
  std::string name() const override { return "on_error(skip)"; }
  std::vector<NodePtr> inputs() const override { return {in_}; }
  std::unique_ptr<Cursor> open(const OpenCtx& ctx, int64_t start) const override {
    StageCounters& st = stage_of(ctx, *this);
    auto c = std::make_unique<SkipCursor>(in_->open(ctx, 0), &st);
    // Which elements fail is only known by producing them; replay quietly.
    c->counting = false;
    discard(*c, start);
    c->counting = true;
    return c;
  }

 private:
  class SkipCursor : public Cursor {
   public:
    SkipCursor(std::unique_ptr<Cursor> in, StageCounters* stats)
        : in_(std::move(in)), stats_(stats) {}
    bool counting = true;
    std::optional<Sample> next() override {
      mark_started(*stats_);
      for (;;) {
        try {
          auto s = in_->next();
          if (s && counting) stats_->items.fetch_add(1, std::memory_order_relaxed);
          return s;
        } catch (const std::exception& e) {
          note(e.what());
        } catch (...) {
          note("an exception that is not a std::exception");
        }
      }
    }

   private:
    void note(const char* what) {
      if (!counting) return;
      stats_->skipped.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard lock(stats_->error_mutex);
      stats_->last_error = what;
    }
    std::unique_ptr<Cursor> in_;
    StageCounters* stats_;
  };
  NodePtr in_;
};

}  // namespace

NodePtr make_map(NodePtr input, IndexedFn fn, std::string name, MapOptions options) {
  return std::make_shared<MapNode>(std::move(input), std::move(fn), std::move(name), options,
                                   std::nullopt);
}

}  // namespace detail

// ---- Pipeline methods
// ----------------------------------------------------------------------------

namespace {
void check_options(const char* op, const MapOptions& o) {
  if (o.num_threads < 0 || o.num_threads > 1024)
    fail(op, "bad thread count: got ", o.num_threads, ", expected 0 (inline) to 1024");
  if (o.chunk_size < 1) fail(op, "bad chunk size: got ", o.chunk_size, ", expected >= 1");
}
}  // namespace

Pipeline Pipeline::map_fn(MapFn f, MapOptions options) const {
  check_options("data.map", options);
  if (!f) fail("data.map", "empty callable: got an empty std::function, expected a callable");
  const uint64_t seed = options.seed;
  detail::IndexedFn fn = [f = std::move(f), seed](Sample s, int64_t epoch, int64_t index) {
    Rng rng(sample_key(seed, epoch, index));
    return f(std::move(s), rng);
  };
  return then(
      detail::make_map(node_, std::move(fn), kiln::detail::cat("map(seed=", seed, ")"), options));
}

Pipeline Pipeline::map(const ImageTransform& transform, MapOptions options) const {
  check_options("data.map", options);
  // Consecutive image maps on the same field fuse into one pass over raw buffers.
  if (const auto* m = dynamic_cast<const detail::MapNode*>(node_.get());
      m && m->image() && m->image()->field() == transform.field()) {
    MapOptions merged = m->options();
    merged.num_threads = std::max(merged.num_threads, options.num_threads);
    merged.ordered = merged.ordered && options.ordered;
    return then(detail::make_image_map_node(m->input(), m->image()->then(transform), merged));
  }
  return then(detail::make_image_map_node(node_, transform, options));
}

Pipeline Pipeline::filter(FilterFn predicate) const {
  if (!predicate)
    fail("data.filter", "empty predicate: got an empty std::function, expected a callable");
  return then(std::make_shared<detail::FilterNode>(node_, std::move(predicate)));
}

Pipeline Pipeline::shuffle(uint64_t seed, ShuffleOptions options) const {
  if (options.buffer_size < 1)
    fail("data.shuffle", "bad buffer size: got ", options.buffer_size, ", expected >= 1");
  return then(std::make_shared<detail::ShuffleNode>(node_, seed, options));
}

Pipeline Pipeline::batch(int64_t size, bool drop_remainder) const {
  BatchOptions o;
  o.drop_remainder = drop_remainder;
  return batch(size, std::move(o));
}

Pipeline Pipeline::batch(int64_t size, BatchOptions options) const {
  if (size < 1) fail("data.batch", "bad batch size: got ", size, ", expected >= 1");
  return then(std::make_shared<detail::BatchNode>(node_, size, std::move(options)));
}

Pipeline Pipeline::prefetch(int64_t n) const {
  if (n < 1) fail("data.prefetch", "bad depth: got ", n, ", expected >= 1");
  return then(std::make_shared<detail::PrefetchNode>(node_, n));
}

Pipeline Pipeline::repeat(std::optional<int64_t> count) const {
  if (count && *count < 0) fail("data.repeat", "negative count: got ", *count, ", expected >= 0");
  return then(std::make_shared<detail::RepeatNode>(node_, count));
}

Pipeline Pipeline::take(int64_t n) const {
  if (n < 0) fail("data.take", "negative count: got ", n, ", expected >= 0");
  return then(std::make_shared<detail::SliceNode>(node_, "data.take",
                                                  kiln::detail::cat("take(", n, ")"), 0, 1, n));
}

Pipeline Pipeline::skip(int64_t n) const {
  if (n < 0) fail("data.skip", "negative count: got ", n, ", expected >= 0");
  return then(std::make_shared<detail::SliceNode>(
      node_, "data.skip", kiln::detail::cat("skip(", n, ")"), n, 1, std::nullopt));
}

Pipeline Pipeline::shard(int64_t count, int64_t index) const {
  if (count < 1 || index < 0 || index >= count)
    fail("data.shard", "bad shard: got count ", count, " index ", index,
         ", expected count >= 1 and 0 <= index < count");
  return then(std::make_shared<detail::SliceNode>(
      node_, "data.shard", kiln::detail::cat("shard(", count, ", ", index, ")"), index, count,
      std::nullopt));
}

Pipeline Pipeline::zip(const Pipeline& other) const { return data::zip({*this, other}); }

Pipeline Pipeline::on_error(OnError policy) const {
  if (policy == OnError::raise) return *this;
  return then(std::make_shared<detail::SkipErrorsNode>(node_));
}

Pipeline zip(const std::vector<Pipeline>& pipelines) {
  if (pipelines.size() < 2)
    fail("data.zip", "too few pipelines: got ", pipelines.size(), ", expected at least 2");
  std::vector<detail::NodePtr> nodes;
  for (const auto& p : pipelines) nodes.push_back(p.node_);
  return Pipeline(std::make_shared<detail::ZipNode>(std::move(nodes)));
}

}  // namespace kiln::data
