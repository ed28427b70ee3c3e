#include "detail/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
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

// 16 hex digits, distinct between the writers of one process and unlikely to repeat across them.
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

// The pid in a temporary file's name after `prefix` ("<pid>-<16 hex digits>"), or nullopt when
// the name is not one the writer makes.
std::optional<pid_t> temp_owner(std::string_view name, std::string_view prefix) {
  if (name.substr(0, prefix.size()) != prefix) return std::nullopt;
  name.remove_prefix(prefix.size());
  const std::size_t dash = name.find('-');
  if (dash == 0 || dash == std::string_view::npos || name.size() - dash - 1 != 16)
    return std::nullopt;
  pid_t pid = 0;
  for (const char c : name.substr(0, dash)) {
    if (c < '0' || c > '9' || pid > (std::numeric_limits<pid_t>::max() - 9) / 10)
      return std::nullopt;
    pid = pid * 10 + (c - '0');
  }
  for (const char c : name.substr(dash + 1))
    if (!std::isxdigit(static_cast<unsigned char>(c))) return std::nullopt;
  return pid > 0 ? std::optional(pid) : std::nullopt;
}

// Removes the temporary files of earlier writes to the same target whose writer is gone: its pid
// is not a live process here and nobody holds the file's lock (the lock covers writers this
// process cannot see, on another machine or in another PID namespace). Best effort: what cannot
// be removed stays for a later save.
void remove_stale_temporaries(const std::string& dir, std::string_view prefix) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  while (const dirent* e = ::readdir(d)) {
    const auto pid = temp_owner(e->d_name, prefix);
    if (!pid || ::kill(*pid, 0) == 0 || errno != ESRCH) continue;
    Fd f(::openat(::dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (f.fd >= 0 && ::flock(f.fd, LOCK_EX | LOCK_NB) == 0) ::unlinkat(::dirfd(d), e->d_name, 0);
  }
  ::closedir(d);
}

}  // namespace

const char* file_kind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "a special file";
}

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
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.size() > 200) base.resize(200);  // keep the temporary name under NAME_MAX
  // rename() would replace a FIFO or a device node with a regular file and report success.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    fail(op, ctx, "not a regular file: got ", file_kind(st.st_mode),
         ", expected a regular file or a new name");

  const std::string prefix = "." + base + ".tmp-";
  remove_stale_temporaries(dir, prefix);
  TempFile tmp;
  for (int attempt = 0;; ++attempt) {
    std::string candidate =
        (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) + prefix +
        std::to_string(::getpid()) + "-" + temp_suffix();
    const int fd = ::open(candidate.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      tmp.path = std::move(candidate);
      tmp.fd.fd = fd;
      break;
    }
    if (errno != EEXIST || attempt == 100)
      fail(op, ctx, "creating a temporary file in '", dir, "' failed: ", errno_text(errno));
  }
  // Held until the file is closed: tells other processes' cleanup that its writer is alive.
  // A file system without locks leaves the pid in the name as the only sign.
  ::flock(tmp.fd.fd, LOCK_EX | LOCK_NB);
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
