// The one exception type Kiln throws. Messages read "[op] what went wrong: got …, expected …".
#pragma once

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
}  // namespace detail

// Throws Error(op, message built by streaming args).
template <typename... Args>
[[noreturn]] void fail(std::string_view op, const Args&... args) {
  throw Error(op, detail::cat(args...));
}

}  // namespace kiln
