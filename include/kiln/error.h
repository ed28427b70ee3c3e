// The one exception type Kiln throws. Messages read "[op] what went wrong: got …, expected …".
#pragma once

#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kiln {

class Error : public std::runtime_error {
 public:
  Error(std::string_view op, const std::string& message);
  // The primitive or API function that raised the error ("matmul", "reshape", ...).
  const std::string& op() const { return op_; }

 private:
  std::string op_;
};

namespace detail {
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// " (at file:line)" for a known location, "" otherwise.
std::string location_suffix(const std::source_location& loc);
// Throws e again with the caller's location appended, unless its message has one already.
[[noreturn]] void rethrow_at(const Error& e, const std::source_location& loc);

// Marks the user's call of a public op on this thread for as long as the op runs, so that an
// Error raised by its own checks (broadcasting, axes, ...) names the user's line. The
// outermost one counts: ops that call other ops keep the user's line.
class CallSite {
 public:
  explicit CallSite(const std::source_location& loc) noexcept;
  ~CallSite();
  CallSite(const CallSite&) = delete;
  CallSite& operator=(const CallSite&) = delete;

 private:
  bool outermost_;
};
// The message with the active call site appended (unless it names a location already).
std::string at_call_site(std::string message);
}  // namespace detail

// Throws Error(op, message built by streaming args), naming the user's call site if known.
template <typename... Args>
[[noreturn]] void fail(std::string_view op, const Args&... args) {
  throw Error(op, detail::at_call_site(detail::cat(args...)));
}

}  // namespace kiln
