// Worker-thread stages. Exceptions raised on a worker are stored with the element they belong to
// and rethrown to the consumer when it reaches that element; destroying a cursor stops and joins
// its threads (a worker finishes the element it is on first, not the rest of its chunk).
#include "data/parallel.h"

#include <atomic>
#include <condition_variable>
#include <exception>
#include <map>
#include <thread>

#include "detail/parallel.h"

namespace kiln::data::detail {
namespace {

struct Slot {
  std::optional<Sample> value;
  std::exception_ptr error;
};
using Chunk = std::vector<Slot>;

struct Work {
  int64_t seq = 0;
  int64_t begin = 0;  // index of the first element
  int64_t end = 0;
  Chunk slots;  // stream inputs (empty for random access)
};

// Where the chunks come from. claim() runs on one worker at a time, fill() concurrently. Both
// look at `stop` between elements and return early once it is set (the cursor is being
// destroyed, so what they return is dropped).
class ChunkSource {
 public:
  virtual ~ChunkSource() = default;
  // nullopt: no more input.
  virtual std::optional<Work> claim(int64_t seq, const std::atomic<bool>& stop) = 0;
  virtual Chunk fill(Work& work, const std::atomic<bool>& stop) = 0;
};

class IndexedSource : public ChunkSource {
 public:
  IndexedSource(std::shared_ptr<const Indexed> view, int64_t start, int chunk)
      : view_(std::move(view)), next_(start), chunk_(chunk), size_(view_->size()) {}
  std::optional<Work> claim(int64_t seq, const std::atomic<bool>&) override {
    if (next_ >= size_) return std::nullopt;
    Work w{seq, next_, next_ + std::min(chunk_, size_ - next_), {}};
    next_ = w.end;
    return w;
  }
  Chunk fill(Work& w, const std::atomic<bool>& stop) override {
    Chunk out(static_cast<std::size_t>(w.end - w.begin));
    for (int64_t i = w.begin; i < w.end && !stop.load(std::memory_order_relaxed); ++i) {
      Slot& s = out[static_cast<std::size_t>(i - w.begin)];
      try {
        s.value = view_->get(i);
      } catch (...) {
        s.error = std::current_exception();
      }
    }
    return out;
  }

 private:
  std::shared_ptr<const Indexed> view_;
  int64_t next_;
  int64_t chunk_;
  int64_t size_;
};

class StreamSource : public ChunkSource {
 public:
  StreamSource(std::unique_ptr<Cursor> input, int64_t first_index, IndexFn fn, int chunk)
      : input_(std::move(input)), next_index_(first_index), fn_(std::move(fn)), chunk_(chunk) {}
  std::optional<Work> claim(int64_t seq, const std::atomic<bool>& stop) override {
    if (done_) return std::nullopt;
    Work w{seq, next_index_, next_index_, {}};  // not reserved: chunk_ may be far beyond the data
    while (static_cast<int64_t>(w.slots.size()) < chunk_ && !stop.load(std::memory_order_relaxed)) {
      Slot s;
      try {
        s.value = input_->next();
        if (!s.value) {
          done_ = true;
          break;
        }
      } catch (...) {
        s.error = std::current_exception();
      }
      w.slots.push_back(std::move(s));
    }
    if (w.slots.empty()) return std::nullopt;
    next_index_ += static_cast<int64_t>(w.slots.size());
    w.end = next_index_;
    return w;
  }
  Chunk fill(Work& w, const std::atomic<bool>& stop) override {
    for (std::size_t j = 0; j < w.slots.size() && !stop.load(std::memory_order_relaxed); ++j) {
      Slot& s = w.slots[j];
      if (s.error) continue;
      try {
        s.value = fn_(std::move(*s.value), w.begin + static_cast<int64_t>(j));
      } catch (...) {
        s.value.reset();
        s.error = std::current_exception();
      }
    }
    return std::move(w.slots);
  }

 private:
  std::unique_ptr<Cursor> input_;
  int64_t next_index_;
  IndexFn fn_;
  int64_t chunk_;
  bool done_ = false;
};

// Workers claim numbered chunks and fill them; the consumer takes them in claim order (ordered)
// or as they complete. At most `max_in_flight` chunks are claimed and not yet consumed.
class ChunkedCursor : public Cursor {
 public:
  ChunkedCursor(std::unique_ptr<ChunkSource> source, int threads, bool ordered,
                StageCounters* stats)
      : source_(std::move(source)),
        ordered_(ordered),
        max_in_flight_(2 * threads + 2),
        stats_(stats) {
    try {
      for (int i = 0; i < threads; ++i)
        workers_.emplace_back([this] {
          kiln::detail::serial_thread = true;
          work();
        });
    } catch (...) {
      stop();
      throw;
    }
  }
  ~ChunkedCursor() override { stop(); }

  std::optional<Sample> next() override {
    for (;;) {
      if (pos_ < current_.size()) {
        Slot& s = current_[pos_++];
        if (s.error) std::rethrow_exception(std::exchange(s.error, nullptr));
        stats_->items.fetch_add(1, std::memory_order_relaxed);
        return std::move(s.value);
      }
      current_.clear();
      pos_ = 0;
      mark_started(*stats_);
      std::unique_lock lock(mutex_);
      auto ready = [&] {
        if (ordered_ ? done_.count(consume_seq_) > 0 : !done_.empty()) return true;
        return exhausted_ && consumed_ >= total_chunks_;
      };
      if (!ready()) {
        const int64_t t0 = now_ns();
        done_cv_.wait(lock, ready);
        stats_->wait_ns.fetch_add(now_ns() - t0, std::memory_order_relaxed);
      }
      auto it = ordered_ ? done_.find(consume_seq_) : done_.begin();
      if (it == done_.end()) return std::nullopt;
      current_ = std::move(it->second);
      done_.erase(it);
      ++consume_seq_;
      ++consumed_;
      --in_flight_;
      lock.unlock();
      work_cv_.notify_one();
    }
  }

 private:
  void work() {
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        work_cv_.wait(lock, [&] { return stopping_ || exhausted_ || in_flight_ < max_in_flight_; });
        if (stopping_ || exhausted_) return;
        ++in_flight_;
      }
      std::optional<Work> w;
      int64_t claimed = 0;
      {
        std::lock_guard claim_lock(claim_mutex_);
        if (!claims_done_) {
          try {
            w = source_->claim(next_seq_, stopping_);
          } catch (...) {
            // claim() stores element errors itself; anything else still reaches the consumer.
            w = Work{next_seq_, 0, 0, {}};
            w->slots.push_back(Slot{std::nullopt, std::current_exception()});
          }
          if (w) {
            ++next_seq_;
          } else {
            claims_done_ = true;
          }
        }
        claimed = next_seq_;
      }
      if (!w) {
        {
          std::lock_guard lock(mutex_);
          --in_flight_;
          exhausted_ = true;
          total_chunks_ = claimed;
        }
        done_cv_.notify_all();
        work_cv_.notify_all();
        return;
      }
      Chunk c;
      try {  // fill() stores element errors itself; this catches failures around them
        c = w->slots.empty() || w->end > w->begin ? source_->fill(*w, stopping_)
                                                  : std::move(w->slots);
      } catch (...) {
        c.clear();
        c.push_back(Slot{std::nullopt, std::current_exception()});
      }
      {
        std::lock_guard lock(mutex_);
        done_.emplace(w->seq, std::move(c));
      }
      done_cv_.notify_one();
    }
  }

  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_cv_.notify_all();
    done_cv_.notify_all();
    for (auto& t : workers_)
      if (t.joinable()) t.join();
    workers_.clear();
  }

  std::unique_ptr<ChunkSource> source_;
  const bool ordered_;
  const int64_t max_in_flight_;
  StageCounters* stats_;

  std::mutex claim_mutex_;
  int64_t next_seq_ = 0;  // guarded by claim_mutex_
  bool claims_done_ = false;

  std::mutex mutex_;
  std::condition_variable work_cv_, done_cv_;
  std::map<int64_t, Chunk> done_;
  int64_t in_flight_ = 0;
  int64_t consume_seq_ = 0;
  int64_t consumed_ = 0;
  int64_t total_chunks_ = 0;
  bool exhausted_ = false;
  std::atomic<bool> stopping_{false};  // set under mutex_ (for the waits), read anywhere

  Chunk current_;  // consumer thread only
  std::size_t pos_ = 0;
  std::vector<std::thread> workers_;  // last: started once everything above exists
};

class PrefetchCursor : public Cursor {
 public:
  PrefetchCursor(std::unique_ptr<Cursor> input, int64_t depth, StageCounters* stats)
      : input_(std::move(input)), depth_(depth), stats_(stats) {
    thread_ = std::thread([this] {
      kiln::detail::serial_thread = true;
      work();
    });
  }
  ~PrefetchCursor() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    space_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  std::optional<Sample> next() override {
    if (finished_) return std::nullopt;
    mark_started(*stats_);
    Item item;
    {
      std::unique_lock lock(mutex_);
      if (queue_.empty()) {
        const int64_t t0 = now_ns();
        item_cv_.wait(lock, [&] { return !queue_.empty(); });
        stats_->wait_ns.fetch_add(now_ns() - t0, std::memory_order_relaxed);
      }
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    space_cv_.notify_one();
    if (item.error) std::rethrow_exception(item.error);
    if (!item.value) {
      finished_ = true;
      return std::nullopt;
    }
    stats_->items.fetch_add(1, std::memory_order_relaxed);
    return std::move(item.value);
  }

 private:
  struct Item {
    std::optional<Sample> value;  // neither value nor error: the end
    std::exception_ptr error;
  };

  void work() {
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        space_cv_.wait(lock,
                       [&] { return stopping_ || static_cast<int64_t>(queue_.size()) < depth_; });
        if (stopping_) return;
      }
      Item item;
      try {
        item.value = input_->next();
      } catch (...) {
        item.error = std::current_exception();
      }
      const bool end = !item.value && !item.error;
      {
        std::lock_guard lock(mutex_);
        queue_.push_back(std::move(item));
      }
      item_cv_.notify_one();
      if (end) return;
    }
  }

  std::unique_ptr<Cursor> input_;  // used by the worker thread only
  const int64_t depth_;
  StageCounters* stats_;
  std::mutex mutex_;
  std::condition_variable space_cv_, item_cv_;
  std::deque<Item> queue_;
  bool stopping_ = false;
  bool finished_ = false;  // consumer thread only
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Cursor> make_parallel_indexed(std::shared_ptr<const Indexed> view, int64_t start,
                                              int threads, int chunk, bool ordered,
                                              StageCounters* stats) {
  return std::make_unique<ChunkedCursor>(
      std::make_unique<IndexedSource>(std::move(view), start, chunk), threads, ordered, stats);
}

std::unique_ptr<Cursor> make_parallel_stream(std::unique_ptr<Cursor> input, int64_t first_index,
                                             IndexFn fn, int threads, int chunk, bool ordered,
                                             StageCounters* stats) {
  return std::make_unique<ChunkedCursor>(
      std::make_unique<StreamSource>(std::move(input), first_index, std::move(fn), chunk), threads,
      ordered, stats);
}

std::unique_ptr<Cursor> make_prefetch(std::unique_ptr<Cursor> input, int64_t depth,
                                      StageCounters* stats) {
  return std::make_unique<PrefetchCursor>(std::move(input), depth, stats);
}

}  // namespace kiln::data::detail
