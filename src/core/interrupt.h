// Interrupting long-running compiled loops (kiln::request_interrupt, runtime.h): the pending
// flag, the installed check, and the test the loops run at every step.
#pragma once

#include <atomic>
#include <string_view>

namespace kiln::detail {

// Set by request_interrupt (async-signal-safe: a lock-free atomic), cleared by the check that
// raises.
std::atomic<bool>& interrupt_pending();
// The function set_interrupt_check installed, or null.
std::atomic<void (*)()>& interrupt_check();

// Called at every step of a compiled loop: raises Error "[op] interrupted: ..." when an
// interrupt is pending, and runs the installed check at most every 10 ms of this thread's time
// (it may raise, or request an interrupt). Costs an atomic load, and a clock read when a check
// is installed.
void check_interrupt(std::string_view op);

}  // namespace kiln::detail
