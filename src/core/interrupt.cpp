#include "core/interrupt.h"

#include <chrono>

#include "kiln/error.h"

namespace kiln::detail {

// Lock-free, so that a signal handler may set it.
static_assert(std::atomic<bool>::is_always_lock_free);

std::atomic<bool>& interrupt_pending() {
  static std::atomic<bool> pending{false};
  return pending;
}

std::atomic<void (*)()>& interrupt_check() {
  static std::atomic<void (*)()> check{nullptr};
  return check;
}

void check_interrupt(std::string_view op) {
  using Clock = std::chrono::steady_clock;
  thread_local Clock::time_point next_check{};
  if (void (*check)() = interrupt_check().load(std::memory_order_relaxed)) {
    const Clock::time_point now = Clock::now();
    if (now >= next_check) {
      next_check = now + std::chrono::milliseconds(10);
      check();
    }
  }
  // A load first: no read-modify-write of a shared cache line at every step of every loop.
  if (interrupt_pending().load(std::memory_order_relaxed) && interrupt_pending().exchange(false))
    fail(op, "interrupted: got an interrupt request (request_interrupt, or Ctrl-C in Python), ",
         "expected the loop to run to its end");
}

}  // namespace kiln::detail
