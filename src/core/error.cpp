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

namespace detail {

std::string location_suffix(const std::source_location& loc) {
  if (loc.line() == 0 || loc.file_name()[0] == '\0') return "";
  return cat(" (at ", loc.file_name(), ":", loc.line(), ")");
}

namespace {
thread_local const std::source_location* g_call_site = nullptr;
}

CallSite::CallSite(const std::source_location& loc) noexcept : outermost_(g_call_site == nullptr) {
  if (outermost_) g_call_site = &loc;
}

CallSite::~CallSite() {
  if (outermost_) g_call_site = nullptr;
}

std::string at_call_site(std::string message) {
  if (g_call_site && message.find(" (at ") == std::string::npos)
    message += location_suffix(*g_call_site);
  return message;
}

void rethrow_at(const Error& e, const std::source_location& loc) {
  const std::string where = location_suffix(loc);
  const std::string_view what = e.what();
  if (where.empty() || what.find(" (at ") != std::string_view::npos) throw e;
  throw Error(e.op(), std::string(what.substr(e.op().size() + 3)) + where);
}

}  // namespace detail

}  // namespace kiln
