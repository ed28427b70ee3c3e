#include "kiln/error.h"

namespace kiln {
namespace {
std::string tagged(std::string_view op, const std::string& message) {
  std::string s;
  s.reserve(op.size() + message.size() + 3);
  s.push_back('[');
  s.append(op);
  s.append("] ");
  s.append(message);
  return s;
}
}  // namespace

Error::Error(std::string_view op, const std::string& message)
    : std::runtime_error(tagged(op, message)), op_(op) {}

}  // namespace kiln
