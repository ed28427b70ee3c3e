// Writing files so that a crash never leaves a half-written one: the contents go to a
// temporary file in the target's directory, which is fsynced and renamed over the target,
// then the directory is fsynced. Used by io::save_tensors and data::write_file.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

namespace kiln::detail {

// A file descriptor closed on scope exit.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  // Closes now, returning close()'s errno (0 on success).
  int close_now() {
    const int f = std::exchange(fd, -1);
    return f >= 0 && ::close(f) != 0 ? errno : 0;
  }
};

// "a directory", "a FIFO", ...: what a path is, for error messages (from stat's st_mode).
const char* file_kind(mode_t mode);

// Writes all of [data, data + n) to fd; returns 0 or the errno of the failure.
int write_all(int fd, const void* data, std::size_t n);

// `write_contents(fd)` writes the file's bytes and returns 0 or an errno. On any failure the
// temporary file is removed, an existing file at `path` is left as it was, and an Error
// "[op] cannot write '<path>': <step> failed: <reason>" is raised. `display_path` is the
// path as error messages should show it. A `path` that exists and is not a regular file (a
// directory, FIFO, device...) is refused. Temporary files of earlier writes to `path` whose
// writer was killed are removed first (docs/CHECKPOINTS.md, "Atomic writes").
void write_file_atomically(std::string_view op, const std::string& path,
                           std::string_view display_path,
                           const std::function<int(int fd)>& write_contents);

}  // namespace kiln::detail
