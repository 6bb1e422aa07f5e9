// A folder published whole or not at all. See staged_folder.h.
#include "train/staged_folder.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.h"

namespace moe::train {
namespace fs = std::filesystem;
namespace {

// What the signal handler removes: one staging folder at a time, written before it is armed.
char g_staging[4096];
volatile sig_atomic_t g_armed = 0;
const int kSignals[] = {SIGTERM, SIGINT, SIGHUP};
struct sigaction g_old[3];
bool g_installed[3] = {false, false, false};

struct Dirent64 {  // the kernel's linux_dirent64
  uint64_t d_ino;
  int64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[];
};

// Empties and removes g_staging with async-signal-safe calls only (open, getdents64, unlinkat,
// rmdir). The staging folder holds plain files only. Passes repeat until one removes nothing:
// unlinking while listing may skip entries.
void remove_staging_now() {
  const int fd = ::open(g_staging, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    alignas(8) static char buf[16384];
    for (int pass = 0; pass < 64; ++pass) {
      int removed = 0;
      ::lseek(fd, 0, SEEK_SET);
      for (;;) {
        const long n = ::syscall(SYS_getdents64, fd, buf, sizeof buf);
        if (n <= 0) break;
        for (long off = 0; off < n;) {
          const auto* d = reinterpret_cast<const Dirent64*>(buf + off);
          off += d->d_reclen;
          if (std::strcmp(d->d_name, ".") == 0 || std::strcmp(d->d_name, "..") == 0) continue;
          if (::unlinkat(fd, d->d_name, 0) == 0) ++removed;
        }
      }
      if (removed == 0) break;
    }
    ::close(fd);
  }
  ::rmdir(g_staging);
}

void on_signal(int sig) {
  if (g_armed) {
    g_armed = 0;
    remove_staging_now();
  }
  // Then the signal's default action (exit 128 + sig), as without this handler.
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void install() {
  for (int i = 0; i < 3; ++i) {
    struct sigaction cur {};
    ::sigaction(kSignals[i], nullptr, &cur);
    if (cur.sa_handler == SIG_IGN) continue;  // ignored (nohup): stays ignored
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    g_installed[i] = ::sigaction(kSignals[i], &sa, &g_old[i]) == 0;
  }
}

void uninstall() {
  for (int i = 0; i < 3; ++i)
    if (g_installed[i]) ::sigaction(kSignals[i], &g_old[i], nullptr);
  for (bool& b : g_installed) b = false;
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

}  // namespace

StagedFolder::StagedFolder(const std::string& target, const std::string& flag) : flag_(flag) {
  fs::path t = fs::absolute(fs::path(target)).lexically_normal();
  if (t.filename().empty()) t = t.parent_path();  // "out/" -> "out"
  target_ = t.string();
  staging_ = (t.parent_path() / str_cat(".", t.filename().string(), ".staging.", ::getpid())).string();
  MOE_CHECK(staging_.size() < sizeof g_staging, flag, " ", target, ": path too long");
  MOE_CHECK(!g_armed, "StagedFolder: only one may be alive at a time");
  // mkdir creates or fails: a folder or link planted at the name is never written into.
  if (::mkdir(staging_.c_str(), 0755) != 0)
    throw Error(str_cat(flag, " ", target, ": cannot create the staging folder ", staging_, ": ",
                        std::strerror(errno)));
  std::memcpy(g_staging, staging_.c_str(), staging_.size() + 1);
  g_armed = 1;
  install();
}

StagedFolder::~StagedFolder() {
  if (!published_) {
    g_armed = 0;
    std::error_code ec;
    fs::remove_all(staging_, ec);
  }
  uninstall();
}

void StagedFolder::publish(const std::regex& replaced) {
  sigset_t block, old;
  sigemptyset(&block);
  for (int s : kSignals) sigaddset(&block, s);
  ::sigprocmask(SIG_BLOCK, &block, &old);
  struct Unblock {
    sigset_t* old;
    ~Unblock() { ::sigprocmask(SIG_SETMASK, old, nullptr); }
  } unblock{&old};
  fsync_dir(staging_);
  // One rename swaps the two folders (renameat2 RENAME_EXCHANGE); where the file system cannot,
  // the target steps aside first and the staging folder takes its name.
  std::string old_dir = staging_;
  if (::renameat2(AT_FDCWD, staging_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) != 0) {
    const int err = errno;
    MOE_CHECK(err == EINVAL || err == ENOSYS || err == ENOTSUP, flag_, " ", target_,
              ": cannot publish the new folder (", std::strerror(err), "); the earlier one is unchanged");
    old_dir = (fs::path(target_).parent_path() /
               str_cat(".", fs::path(target_).filename().string(), ".replaced.", ::getpid()))
                  .string();
    if (::rename(target_.c_str(), old_dir.c_str()) != 0)
      throw Error(str_cat(flag_, " ", target_, ": cannot move the earlier folder aside (",
                          std::strerror(errno), "); it is unchanged"));
    if (::rename(staging_.c_str(), target_.c_str()) != 0) {
      const int e = errno;
      (void)::rename(old_dir.c_str(), target_.c_str());
      throw Error(str_cat(flag_, " ", target_, ": cannot publish the new folder (", std::strerror(e),
                          "); the earlier one is unchanged"));
    }
  }
  g_armed = 0;  // the staging name now holds the earlier folder: never removed by a signal
  published_ = true;
  // The earlier folder's entries that are not replaced (the lock, the user's files) move in.
  std::vector<std::string> kept_behind;
  std::error_code ec;
  for (fs::directory_iterator it(old_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (std::regex_match(name, replaced)) continue;
    const std::string to = target_ + "/" + name;
    struct stat st;
    if (::lstat(to.c_str(), &st) == 0) continue;  // the new folder has its own
    if (::rename(it->path().c_str(), to.c_str()) != 0) kept_behind.push_back(name);
  }
  fsync_dir(fs::path(target_).parent_path().string());
  MOE_CHECK(!ec && kept_behind.empty(), flag_, " ", target_, ": published, but ",
            ec ? ec.message() : str_cat(kept_behind.size(), " earlier file(s) (", kept_behind[0], ")"),
            " stayed in ", old_dir);
  fs::remove_all(old_dir, ec);
}

}  // namespace moe::train
