// Files moetrain writes, written one way (issue 42, class 2): an output never clobbers what it
// must not. The rule, in this one place:
//   - an output is a new file or an existing regular file: never a symbolic link (it would be
//     written through, or replaced), a device (as root, /dev/full was once replaced by a regular
//     file), a FIFO, a socket or a folder;
//   - it is never one of the run's inputs: same device and inode as a file the run reads (a folder
//     among the inputs stands for every entry directly inside it: an export's weights, a
//     checkpoint's shards) is refused, so `eval --dump` onto its own --data fails instead of
//     destroying the data with exit 0;
//   - it is written beside the target under a temporary name created with O_CREAT | O_EXCL |
//     O_NOFOLLOW (a planted symlink or file at that name is never written through), flushed to
//     disk, then renamed over the target; on any failure the temporary file is removed and the
//     target is as it was.
// Errors are one line naming the flag (or what the file is) and the path.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace moe::io {

// Throws unless `path` may be written as an output named by `flag` ("--dump", "export OUT"):
// it does not exist, or is a regular file (lstat: a symlink is refused, not followed), and it is
// none of `inputs` (paths of files or folders the run reads; those that do not exist are skipped).
void check_output_path(const std::string& path, const std::string& flag,
                       const std::vector<std::string>& inputs = {});

// A file written atomically. The constructor checks the target (check_output_path without inputs)
// and creates the temporary file PATH.tmp.<pid> (another suffix if that name is taken) with
// O_CREAT | O_EXCL | O_NOFOLLOW, mode 0644 less the umask. commit() flushes it to disk, checks
// the target again and renames the temporary file over it, then syncs the folder. Destroyed
// without commit(), it removes the temporary file. Errors name `flag` and the target path.
class AtomicFile {
 public:
  AtomicFile(const std::string& path, const std::string& flag);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  // The first half of commit(): flush to disk and close (errors remove the temporary file). A
  // caller publishing several files together syncs them all before renaming any.
  void sync();
  void commit();
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }

 private:
  [[noreturn]] void fail(const std::string& what, int err);
  std::string path_, flag_, tmp_;
  int fd_ = -1;
  int slot_ = -1;  // in the signal cleanup's table (below)
  bool synced_ = false, committed_ = false;
};

// SIGTERM / SIGINT while a command writes its outputs (tokenize, export): the handler installed
// here removes every AtomicFile temporary file that exists at that moment (unlink is
// async-signal-safe; the paths sit in a fixed table) and then dies of the signal as it would have
// (exit status 128 + signal), so a stopped command leaves the targets as they were and no
// PATH.tmp.<pid> behind. Commands with their own stop handling (train) do not install it.
void install_temp_cleanup_on_signal();

// The whole file at once: AtomicFile, write, commit.
void write_file_atomic(const std::string& path, std::string_view data, const std::string& flag);

}  // namespace moe::io
