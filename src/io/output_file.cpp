// Outputs that never clobber what they must not (see output_file.h).
#include "io/output_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "core/error.h"
#include "io/data_file.h"

namespace moe::io {
namespace {

// The temporary files that exist now, for the signal handler: fixed storage, a slot is filled
// before it is marked used and marked free before its name goes stale.
constexpr int kMaxTemps = 64;
constexpr size_t kMaxTempPath = 4096;
char g_temp_paths[kMaxTemps][kMaxTempPath];
volatile std::sig_atomic_t g_temp_used[kMaxTemps];
std::mutex g_temp_mutex;
// stderr as it was when the handler was installed: SentencePiece's trainer silences fd 2 while it
// runs (text/tokenizer.cpp), and the handler's line must still be seen.
int g_stderr_fd = -1;

int register_temp(const std::string& path) {
  if (path.size() >= kMaxTempPath) return -1;
  std::lock_guard<std::mutex> lock(g_temp_mutex);
  for (int i = 0; i < kMaxTemps; ++i) {
    if (g_temp_used[i]) continue;
    std::memcpy(g_temp_paths[i], path.c_str(), path.size() + 1);
    g_temp_used[i] = 1;
    return i;
  }
  return -1;  // more than 64 at once: still removed by their owner, not by the handler
}

void unregister_temp(int& slot) {
  if (slot < 0) return;
  std::lock_guard<std::mutex> lock(g_temp_mutex);
  g_temp_used[slot] = 0;
  slot = -1;
}

void remove_temps_and_die(int sig) {
  for (int i = 0; i < kMaxTemps; ++i)
    if (g_temp_used[i]) ::unlink(g_temp_paths[i]);
  static const char msg[] = "moetrain: stopped by a signal: temporary files removed, outputs left as they were\n";
  ssize_t n = ::write(g_stderr_fd >= 0 ? g_stderr_fd : STDERR_FILENO, msg, sizeof msg - 1);
  (void)n;
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// "--dump PATH" or "PATH" when no flag names it.
std::string named(const std::string& flag, const std::string& path) {
  return flag.empty() ? path : str_cat(flag, " ", path);
}

std::string parent_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// The target's type: absent or a regular file, else an error naming what it is.
void check_kind(const std::string& path, const std::string& flag) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    const int err = errno;
    MOE_CHECK(err == ENOENT, named(flag, path), ": cannot check the output path (", std::strerror(err), ")");
    return;
  }
  MOE_CHECK(!S_ISLNK(st.st_mode), named(flag, path),
            ": is a symbolic link; an output is written only as a new or regular file, never through a link");
  MOE_CHECK(S_ISREG(st.st_mode), named(flag, path), ": is ", file_kind(st.st_mode),
            "; an output must be a new or regular file");
}

}  // namespace

void check_output_path(const std::string& path, const std::string& flag, const std::vector<std::string>& inputs) {
  MOE_CHECK(!path.empty(), flag.empty() ? std::string("output path") : flag, " must not be empty");
  check_kind(path, flag);
  struct stat out {};
  if (::stat(path.c_str(), &out) != 0) return;  // a new file is none of the inputs
  for (const std::string& in : inputs) {
    struct stat st {};
    if (in.empty() || ::stat(in.c_str(), &st) != 0) continue;
    const bool same = st.st_dev == out.st_dev && st.st_ino == out.st_ino;
    MOE_CHECK(!same, named(flag, path), ": is the input ", in, "; an output never overwrites one of the run's inputs");
    if (!S_ISDIR(st.st_mode)) continue;
    // A folder read as a whole (an export, a checkpoint, a run): any entry directly inside it.
    DIR* d = ::opendir(in.c_str());
    if (!d) continue;
    std::string hit;
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      struct stat es {};
      if (::fstatat(::dirfd(d), e->d_name, &es, AT_SYMLINK_NOFOLLOW) == 0 && es.st_dev == out.st_dev &&
          es.st_ino == out.st_ino) {
        hit = in + "/" + name;
        break;
      }
    }
    ::closedir(d);
    MOE_CHECK(hit.empty(), named(flag, path), ": is the input ", hit,
              "; an output never overwrites one of the run's inputs");
  }
}

AtomicFile::AtomicFile(const std::string& path, const std::string& flag) : path_(path), flag_(flag) {
  check_kind(path_, flag_);
  // Beside the target (the rename stays on one file system), under a name no one else chose:
  // O_EXCL | O_NOFOLLOW never opens what is already there, a planted symlink included.
  const std::string base = str_cat(path_, ".tmp.", ::getpid());
  int err = 0;
  for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
    tmp_ = attempt == 0 ? base : str_cat(base, ".", attempt);
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    err = errno;
    if (fd_ < 0 && err != EEXIST) break;
  }
  if (fd_ < 0)
    throw Error(str_cat(named(flag_, path_), ": cannot write: cannot create ", tmp_, " (", std::strerror(err), ")"));
  slot_ = register_temp(tmp_);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
  unregister_temp(slot_);
}

void AtomicFile::fail(const std::string& what, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  unregister_temp(slot_);
  tmp_.clear();
  throw Error(str_cat(named(flag_, path_), ": cannot write: ", what, " (", std::strerror(err), ")"));
}

void AtomicFile::write(const void* data, size_t n) {
  MOE_CHECK(fd_ >= 0 && !committed_, named(flag_, path_), ": write after commit or failure");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const int err = errno;
      fail(str_cat("writing ", tmp_, " failed"), err);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void AtomicFile::sync() {
  MOE_CHECK(fd_ >= 0 && !committed_ && !synced_, named(flag_, path_), ": sync after sync, commit or failure");
  if (::fsync(fd_) != 0 && errno != EINVAL) {
    const int err = errno;
    fail(str_cat("syncing ", tmp_, " failed"), err);
  }
  const int rc = ::close(fd_);
  const int close_err = errno;
  fd_ = -1;
  if (rc != 0) fail(str_cat("closing ", tmp_, " failed"), close_err);
  synced_ = true;
}

void AtomicFile::commit() {
  MOE_CHECK((fd_ >= 0 || synced_) && !committed_, named(flag_, path_), ": commit after commit or failure");
  if (!synced_) sync();
  // The target again, as late as possible: something put there since the constructor (a link,
  // a FIFO) is refused, not replaced.
  try {
    check_kind(path_, flag_);
  } catch (...) {
    ::unlink(tmp_.c_str());
    unregister_temp(slot_);
    tmp_.clear();
    throw;
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    fail(str_cat("cannot rename ", tmp_, " into place"), err);
  }
  committed_ = true;
  unregister_temp(slot_);
  // The rename itself survives a crash once the folder is synced.
  const int dfd = ::open(parent_of(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void install_temp_cleanup_on_signal() {
  if (g_stderr_fd < 0) g_stderr_fd = ::fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
  struct sigaction sa {};
  sa.sa_handler = remove_temps_and_die;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

void write_file_atomic(const std::string& path, std::string_view data, const std::string& flag) {
  AtomicFile f(path, flag);
  f.write(data);
  f.commit();
}

}  // namespace moe::io
