// The collectives' thread: one per process, started by the first collective queued, running
// them one at a time in the order they were queued (docs/DESIGN.md, "Overlapping collectives").
#include "distributed/collective_thread.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

#include "detail/parallel.h"
#include "kiln/error.h"

namespace kiln::distributed {
namespace {

thread_local bool t_on_collective_thread = false;
std::atomic<int> g_awaiting{0};

// For its scope, a thread waits for the collectives' thread.
struct Awaiting {
  Awaiting() { ++g_awaiting; }
  ~Awaiting() { --g_awaiting; }
  Awaiting(const Awaiting&) = delete;
  Awaiting& operator=(const Awaiting&) = delete;
};

class CollectiveThread {
 public:
  std::shared_future<void> queue(std::function<void()> collective) {
    Task task{std::move(collective), {}};
    std::shared_future<void> done = task.finished.get_future().share();
    std::lock_guard lock(mutex_);
    if (stopping_)
      fail("distributed",
           "a collective was started while finalize ends the collectives' "
           "thread: got one, expected none after finalize");
    if (!thread_.joinable()) {
      try {
        thread_ = std::thread([this] { serve(); });
      } catch (const std::system_error& e) {
        fail("distributed", "could not start the collectives' thread: got '", e.what(),
             "', expected a new thread");
      }
    }
    tasks_.push_back(std::move(task));
    ++unfinished_;
    wake_.notify_one();
    return done;
  }

  bool finish(std::optional<double> seconds = std::nullopt) {
    std::unique_lock lock(mutex_);
    const auto idle = [this] { return unfinished_ == 0; };
    if (!seconds) {
      idle_.wait(lock, idle);
      return true;
    }
    return idle_.wait_for(lock, std::chrono::duration<double>(*seconds), idle);
  }

  // Later collectives are refused: finalize ends the process group.
  void stop() {
    std::unique_lock lock(mutex_);
    idle_.wait(lock, [this] { return unfinished_ == 0; });
    stopping_ = true;
    std::thread serving = std::move(thread_);
    wake_.notify_one();
    lock.unlock();
    if (serving.joinable()) serving.join();
  }

 private:
  void serve() {
    t_on_collective_thread = true;
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and nothing left
      Task task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      std::exception_ptr error;
      try {
        kiln::detail::apply_flush_denormal();  // the reductions add floats on this thread
        task.collective();
      } catch (...) {
        error = std::current_exception();
      }
      // What the collective holds (its operand and result) is released before anyone hears
      // that it finished: the futures outlive it.
      task.collective = nullptr;
      if (error)
        task.finished.set_exception(error);
      else
        task.finished.set_value();
      lock.lock();
      if (--unfinished_ == 0) idle_.notify_all();
    }
  }

  struct Task {
    std::function<void()> collective;
    std::promise<void> finished;
  };
  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<Task> tasks_;
  int unfinished_ = 0;  // queued or running
  bool stopping_ = false;
  std::thread thread_;
};

// Never destroyed: a process that exits without finalize leaves the thread waiting, which
// exit() does not join.
CollectiveThread& the_thread() {
  static auto* t = new CollectiveThread;
  return *t;
}

}  // namespace

std::shared_future<void> run_ahead(std::function<void()> collective) {
  return the_thread().queue(std::move(collective));
}

void await(const std::shared_future<void>& collective) {
  const Awaiting awaiting;
  collective.get();
}

bool awaited() { return g_awaiting.load(std::memory_order_relaxed) > 0; }

void finish_queued() {
  if (t_on_collective_thread) return;
  const Awaiting awaiting;
  the_thread().finish();
}

bool finish_queued_within(double seconds) {
  if (t_on_collective_thread) return true;
  const Awaiting awaiting;
  return the_thread().finish(seconds);
}

bool on_collective_thread() { return t_on_collective_thread; }

void stop_collective_thread() {
  const Awaiting awaiting;
  the_thread().stop();
}

}  // namespace kiln::distributed
