// Opening files read as data (see data_file.h).
#include "io/data_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace moe::io {

DataFile::DataFile(DataFile&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), size_(o.size_), dev_(o.dev_), ino_(o.ino_) {}

DataFile& DataFile::operator=(DataFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    size_ = o.size_;
    dev_ = o.dev_;
    ino_ = o.ino_;
  }
  return *this;
}

DataFile::~DataFile() {
  if (fd_ >= 0) ::close(fd_);
}

int DataFile::release() { return std::exchange(fd_, -1); }

namespace {
const volatile std::sig_atomic_t* g_stop_flag = nullptr;
}  // namespace

void set_stop_flag(const volatile std::sig_atomic_t* flag) { g_stop_flag = flag; }

void check_stop(const std::string& what) {
  if (g_stop_flag && *g_stop_flag)
    throw Error(str_cat(what, ": stopped by a signal (SIGTERM/SIGINT) during setup; nothing was trained or written"));
}

const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISLNK(m)) return "a symbolic link";
  return "not a regular file";
}

namespace {

// The one open: O_NONBLOCK so that a FIFO is refused below instead of blocking the open (it has
// no effect on regular files), O_NOFOLLOW when the file was found inside a folder. Returns the
// errno of a failed open or fstat in *err (the caller words the error), or a descriptor of a
// regular file.
int open_regular(const std::string& path, bool no_follow, int* err, struct stat* st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | (no_follow ? O_NOFOLLOW : 0));
  if (fd < 0) {
    *err = errno;
    return -1;
  }
  if (::fstat(fd, st) != 0) {
    *err = errno;
    ::close(fd);
    return -2;
  }
  if (!S_ISREG(st->st_mode)) {
    *err = 0;
    ::close(fd);
    return -3;
  }
  // Back to blocking reads (a regular file never blocks, but readers may expect plain semantics).
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl >= 0) ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

}  // namespace

DataFile open_data_file(const std::string& path, const std::string& what, Origin origin) {
  const bool no_follow = origin == Origin::kInFolder;
  int err = 0;
  struct stat st {};
  const int fd = open_regular(path, no_follow, &err, &st);
  if (fd == -1 && no_follow && err == ELOOP)
    throw Error(str_cat(path, ": is a symbolic link (refused: a ", what,
                        " is read only as a plain file inside its folder, never followed out of it)"));
  if (fd == -1) throw Error(str_cat(path, ": cannot open ", what, " (", std::strerror(err), ")"));
  if (fd == -2) throw Error(str_cat(path, ": cannot stat ", what, " (", std::strerror(err), ")"));
  if (fd == -3) throw Error(str_cat(path, ": ", what, " is not a regular file (it is ", file_kind(st.st_mode), ")"));
  return DataFile(fd, static_cast<uint64_t>(st.st_size), st.st_dev, st.st_ino);
}

DataFile open_in_folder(const std::string& dir, const std::string& name, const std::string& what,
                        const std::string& owner) {
  MOE_CHECK(!name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
                name.find('\0') == std::string::npos,
            dir, ": ", what, " name is not a plain file name inside the folder");
  int err = 0;
  struct stat st {};
  const int fd = open_regular(dir + "/" + name, /*no_follow=*/true, &err, &st);
  if (fd == -1) {
    MOE_CHECK(err != ENOENT, dir, ": ", what, " ", name, " is missing");
    MOE_CHECK(err != ELOOP, dir, ": ", what, " ", name, " is a symbolic link (refused: ", owner,
              " reads only plain files inside its folder)");
    throw Error(str_cat(dir, ": ", what, " ", name, ": cannot open (", std::strerror(err), ")"));
  }
  if (fd == -2) throw Error(str_cat(dir, ": ", what, " ", name, ": cannot stat (", std::strerror(err), ")"));
  if (fd == -3) throw Error(str_cat(dir, ": ", what, " ", name, " is not a regular file"));
  return DataFile(fd, static_cast<uint64_t>(st.st_size), st.st_dev, st.st_ino);
}

bool entry_exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace moe::io
