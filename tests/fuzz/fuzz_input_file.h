// Shared by the fuzz targets: one temporary file per fuzzing process that each input is written
// into, so the parsers under test read it through their real open()/mmap()/read() path.
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace moe::fuzz {

class InputFile {
 public:
  InputFile() {
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir && *dir ? dir : "/tmp") + "/moetrain_fuzz_XXXXXX";
    fd_ = ::mkstemp(path_.data());
    if (fd_ < 0) {
      std::perror("fuzz: mkstemp");
      std::abort();
    }
  }
  ~InputFile() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  // Replaces the file's content with [data, data + size) and returns its path.
  const std::string& write(const uint8_t* data, size_t size) {
    if (::ftruncate(fd_, 0) != 0) std::abort();
    size_t done = 0;
    while (done < size) {
      ssize_t w = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (w <= 0) std::abort();
      done += static_cast<size_t>(w);
    }
    return path_;
  }

 private:
  std::string path_;
  int fd_ = -1;
};

// One per process; destroyed (and the file removed) at exit.
inline InputFile& input_file() {
  static InputFile f;
  return f;
}

}  // namespace moe::fuzz
