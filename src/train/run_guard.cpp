// Input kind, writable outputs, folder locks. See run_guard.h.
#include "train/run_guard.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <utility>

#include "core/error.h"
#include "io/data_file.h"

namespace moe::train {
namespace fs = std::filesystem;

namespace {

using io::file_kind;

// The whole file as text (best effort, for naming a lock's holder).
std::string read_small(int fd) {
  char buf[512];
  const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return "";
  std::string s(buf, static_cast<size_t>(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

}  // namespace

void check_regular_input(const std::string& path, const std::string& flag) {
  // Checked on a descriptor opened as every data file is (io/data_file.h: read-only, O_NONBLOCK so
  // a FIFO never blocks the open), not by a stat of the name.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) throw Error(str_cat(path, ": cannot open (", flag, "): ", std::strerror(errno)));
  struct stat st {};
  const int rc = ::fstat(fd, &st);
  ::close(fd);
  if (rc != 0) throw Error(str_cat(path, ": cannot open (", flag, "): ", std::strerror(errno)));
  if (S_ISDIR(st.st_mode)) throw Error(str_cat(path, ": is a directory (", flag, " needs a text file)"));
  MOE_CHECK(S_ISREG(st.st_mode), path, ": ", flag, " must be a regular file, this is ", file_kind(st.st_mode),
            " (a stream has no end to split into train and validation data; save it to a file first)");
}

void check_output_dir(const std::string& dir, const std::string& flag) {
  MOE_CHECK(!dir.empty(), flag, " must not be empty");
  std::error_code ec;
  fs::create_directories(dir, ec);
  MOE_CHECK(!ec, dir, ": cannot create output folder (", ec.message(), ")");
  MOE_CHECK(fs::is_directory(dir, ec), dir, ": cannot create output folder (exists and is not a folder)");
  // A probe file proves writability as this user (access(W_OK) is wrong on read-only mounts and
  // for root).
  // mkstemp creates it with O_EXCL: a file or symlink planted at a guessable name is never
  // opened, let alone truncated.
  std::string probe = str_cat(dir, "/.moetrain-write-test.XXXXXX");
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) throw Error(str_cat(dir, ": ", flag, " is not writable: ", std::strerror(errno)));
  ::close(fd);
  ::unlink(probe.c_str());
}

DirLock DirLock::acquire(const std::string& dir, const std::string& flag, const std::string& what) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  MOE_CHECK(!ec, dir, ": cannot create output folder (", ec.message(), ")");
  return acquire_file(dir + "/" + kLockFileName, dir, flag, what);
}

DirLock DirLock::acquire_file(const std::string& path, const std::string& dir, const std::string& flag,
                              const std::string& what) {
  DirLock lock;
  // The lock file is written (the holder's line, after a truncate): an output like any other
  // (io/output_file.h), so never a symlink followed out of the folder, a FIFO or a device.
  lock.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (lock.fd_ < 0 && errno == ELOOP)
    throw Error(str_cat(flag, " ", path, ": is a symbolic link; the lock file is written only as a new or regular file, "
                                         "never through a link"));
  if (lock.fd_ < 0) throw Error(str_cat(path, ": cannot create the lock file of ", flag, ": ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(lock.fd_, &st) != 0 || !S_ISREG(st.st_mode))
    throw Error(str_cat(flag, " ", path, ": is ", file_kind(st.st_mode), "; the lock file must be a new or regular file"));
  if (::flock(lock.fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder = read_small(lock.fd_);
    if (err == EWOULDBLOCK)
      throw Error(str_cat(dir, ": ", flag, " is in use by another moetrain run (",
                          holder.empty() ? std::string("holder unknown") : holder, "; lock file ", path,
                          "): wait for it to finish or choose another folder"));
    throw Error(str_cat(path, ": cannot lock (", flag, "): ", std::strerror(err)));
  }
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  char when[64] = "";
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
  const std::string text = str_cat("pid ", getpid(), " on ", host, " since ", when, ": ", what, "\n");
  if (::ftruncate(lock.fd_, 0) == 0) {
    const ssize_t n = ::pwrite(lock.fd_, text.data(), text.size(), 0);
    (void)n;  // the lock is what matters; its text only names the holder
  }
  return lock;
}

DirLock::DirLock(DirLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}

DirLock& DirLock::operator=(DirLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

std::vector<std::string> sweep_stale_temp_files(const std::string& dir) {
  std::vector<std::string> said;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t at = name.rfind(".tmp.");
    if (at == std::string::npos || at == 0 || at + 5 >= name.size() || name.size() - at - 5 > 9 ||
        name.find_first_not_of("0123456789", at + 5) != std::string::npos)
      continue;
    const long pid = std::strtol(name.c_str() + at + 5, nullptr, 10);
    if (pid <= 0 || pid == ::getpid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // its writer may live
    const std::string path = it->path().string();
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) continue;
    if (!S_ISREG(st.st_mode)) {
      said.push_back(str_cat(path, ": a stale temp name (pid ", pid, " is gone) that is ", file_kind(st.st_mode),
                             ": left as it is"));
      continue;
    }
    if (::unlink(path.c_str()) == 0)
      said.push_back(str_cat(path, ": removed a stale temp file (its writer, pid ", pid, ", is gone)"));
    else
      said.push_back(str_cat(path, ": a stale temp file (pid ", pid, " is gone) could not be removed (",
                             std::strerror(errno), ")"));
  }
  return said;
}

int launcher_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE"}) {
    const char* v = std::getenv(var);
    if (v && *v) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  return 1;
}

int launcher_world_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK"}) {
    const char* v = std::getenv(var);
    if (v && *v) return std::max(0, std::atoi(v));
  }
  return 0;
}

}  // namespace moe::train
