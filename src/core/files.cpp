#include "detail/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>

#include "kiln/error.h"

namespace kiln::detail {
namespace {

std::string errno_text(int e) { return std::strerror(e); }

// The temporary file of an atomic write, unlinked unless committed.
struct TempFile {
  std::string path;
  Fd fd;
  bool committed = false;
  ~TempFile() {
    fd.close_now();
    if (!committed && !path.empty()) ::unlink(path.c_str());
  }
};

std::string temp_suffix() {
  static std::atomic<uint64_t> counter{0};
  uint64_t x = static_cast<uint64_t>(::getpid()) * 0x9E3779B97F4A7C15ull ^
               static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
               (counter.fetch_add(1) * 0xBF58476D1CE4E5B9ull);
  x ^= x >> 31;
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(x));
  return buf;
}

}  // namespace

int write_all(int fd, const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const std::size_t chunk = std::min<std::size_t>(n, std::size_t{1} << 30);
    const ssize_t w = ::write(fd, p, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return EIO;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return 0;
}

void write_file_atomically(std::string_view op, const std::string& path,
                           std::string_view display_path,
                           const std::function<int(int fd)>& write_contents) {
  const std::string ctx = "cannot write " + std::string(display_path) + ": ";
  if (path.empty() || path.back() == '/')
    fail(op, ctx, "bad path: got ", display_path, ", expected a file name");
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.size() > 200) base.resize(200);  // keep the temporary name under NAME_MAX

  TempFile tmp;
  for (int attempt = 0;; ++attempt) {
    std::string candidate = (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) +
                            "." + base + ".tmp-" + temp_suffix();
    const int fd = ::open(candidate.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      tmp.path = std::move(candidate);
      tmp.fd.fd = fd;
      break;
    }
    if (errno != EEXIST || attempt == 100)
      fail(op, ctx, "creating a temporary file in '", dir, "' failed: ", errno_text(errno));
  }
  const auto failed = [&](std::string_view step, int e) {
    fail(op, ctx, step, " the temporary file '", tmp.path, "' failed: ", errno_text(e));
  };
  if (int e = write_contents(tmp.fd.fd)) failed("writing", e);
  if (::fsync(tmp.fd.fd) != 0) failed("syncing", errno);
  if (int e = tmp.fd.close_now()) failed("closing", e);
  if (::rename(tmp.path.c_str(), path.c_str()) != 0) failed("renaming over the target", errno);
  tmp.committed = true;

  // Make the rename itself durable.
  Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.fd < 0 || ::fsync(d.fd) != 0)
    fail(op, ctx, "the file was written, but syncing its directory '", dir,
         "' failed: ", errno_text(errno));
}

}  // namespace kiln::detail
