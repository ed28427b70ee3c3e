// For fuzz targets whose reader takes a path: each input is written to one in-memory file (a
// memfd, reused across inputs) that the reader opens as /proc/self/fd/<n>. It is a regular file,
// as the readers require, and nothing touches the disk.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

class MemoryFile {
 public:
  MemoryFile() : fd_(::memfd_create("kiln-fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  // Replaces the file's contents with [data, data + size) and returns its path.
  const std::string& hold(const uint8_t* data, std::size_t size) {
    if (::ftruncate(fd_, 0) != 0 ||
        (size > 0 && ::pwrite(fd_, data, size, 0) != static_cast<ssize_t>(size))) {
      std::perror("memfd write");
      std::abort();
    }
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};
