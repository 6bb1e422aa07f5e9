// Checks on the files and folders of a run, made before any work: the input is a regular file,
// output folders can be written, and one run at a time owns a folder (an exclusive lock).
#pragma once
#include <string>
#include <vector>

namespace moe::train {

// `flag` (e.g. "--data") names a file that must be a regular file: a FIFO, a character or block
// device, a socket or a directory is refused before it is opened (opening a FIFO blocks until a
// writer appears; /dev/zero never ends). Errors name the path, the flag and the kind.
void check_regular_input(const std::string& path, const std::string& flag);

// Creates `dir` (and its parents) and proves it writable by creating and removing a probe file,
// so an unwritable --out or --checkpoint.dir fails before step 1, not after the last one.
void check_output_dir(const std::string& dir, const std::string& flag);

// An exclusive lock on a folder: flock(2) on DIR/.moetrain.lock, held while the object lives and
// released by the kernel when the process ends however it ends (no stale locks after kill -9).
// The holder writes "pid P on HOST since TIME: WHAT" into the file, and a second run is refused
// with that line. Movable.
class DirLock {
 public:
  DirLock() = default;
  // Creates the folder if needed. Throws moe::Error naming the folder, the flag and the holder.
  static DirLock acquire(const std::string& dir, const std::string& flag, const std::string& what);
  // The same lock on a named file (tokenize locks PREFIX.lock for a dataset PREFIX): `target` is
  // what it protects, named in the error ("PREFIX: --output is in use by another moetrain run (pid
  // P on HOST since TIME: WHAT; lock file PATH)"). The lock file is kept (removing it would let a
  // third run lock a new file while the second holds the old one).
  static DirLock acquire_file(const std::string& lock_path, const std::string& target, const std::string& flag,
                              const std::string& what);
  DirLock(DirLock&& o) noexcept;
  DirLock& operator=(DirLock&& o) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  ~DirLock();
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

inline constexpr const char* kLockFileName = ".moetrain.lock";

// DIR's stale temp files: PATH.tmp.<pid> (an AtomicFile's, io/output_file.h) whose writer is gone
// (no process has that pid), left by a run killed with -9 or a machine that went down. Regular
// files are removed; anything else of that name (a link, a folder) is left. Returns one line per
// file, saying which was removed and which was left and why (the caller prints them).
std::vector<std::string> sweep_stale_temp_files(const std::string& dir);

// The rank count a launcher (mpirun, srun with PMI) started this process among, from its
// environment; 1 when started alone. For commands that must not run once per rank.
int launcher_world_size();
// This process's rank among them (0 when started alone).
int launcher_world_rank();

}  // namespace moe::train
