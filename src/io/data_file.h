// Files moetrain reads as data, opened one way (issue 42, class 1). The rules that protect a
// checkpoint's shards protect every such file: it is opened read-only without blocking (a FIFO in
// a file's place is refused, not waited on), checked on the descriptor to be a regular file, and
// sized on that descriptor. A file moetrain finds by name inside a folder (an exported model's
// config.json, model.safetensors and index shards, a checkpoint's shards, a run folder's metrics)
// or beside a dataset prefix (PREFIX.idx, .bin, .tokenizer.json) is opened with O_NOFOLLOW: a
// symbolic link there is refused, never followed out of the folder. A path the user typed as the
// file itself (--data text.txt, inspect x.safetensors, --config c.json) is followed: the user
// chose where it points.
#pragma once
#include <sys/types.h>

#include <csignal>
#include <cstdint>
#include <string>

namespace moe::io {

// How a path came to be read.
enum class Origin {
  kNamed,     // typed by the user as the file itself: a symbolic link is followed
  kInFolder,  // found inside a folder or beside a dataset prefix: a symbolic link is refused
};

// An open read-only descriptor of a regular file, with the size and identity fstat gave for it.
// Closed when the object goes (release() hands the descriptor over). Move-only.
class DataFile {
 public:
  DataFile() = default;
  DataFile(int fd, uint64_t size, dev_t dev, ino_t ino) : fd_(fd), size_(size), dev_(dev), ino_(ino) {}
  DataFile(DataFile&& o) noexcept;
  DataFile& operator=(DataFile&& o) noexcept;
  DataFile(const DataFile&) = delete;
  DataFile& operator=(const DataFile&) = delete;
  ~DataFile();
  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  dev_t dev() const { return dev_; }
  ino_t ino() const { return ino_; }
  int release();

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

// Opens path as `what` ("safetensors file", "dataset index"). Errors (one line each):
//   "<path>: cannot open <what> (<strerror>)", "<path>: is a symbolic link (refused: a <what> is
//   read only as a plain file inside its folder, ...)" (kInFolder only), "<path>: <what> is not a
//   regular file (it is <kind>)".
DataFile open_data_file(const std::string& path, const std::string& what, Origin origin);

// DIR/NAME, found inside DIR by its owner ("a checkpoint", "a model folder"): always O_NOFOLLOW.
// NAME must be a single path component (no '/', not "." or ".."). Errors worded as a
// checkpoint's shards have always been: "DIR: WHAT NAME is missing", "DIR: WHAT NAME is a
// symbolic link (refused: OWNER reads only plain files inside its folder)", "DIR: WHAT NAME is
// not a regular file", "DIR: WHAT NAME: cannot open (<strerror>)".
DataFile open_in_folder(const std::string& dir, const std::string& name, const std::string& what,
                        const std::string& owner);

// Whether anything exists at path, a symbolic link included (lstat): for deciding what a folder
// holds, so that a symlinked config.json or manifest.json reaches its reader and is refused there
// instead of being taken for absent (or followed by a check that follows links).
bool entry_exists(const std::string& path);

// Loops that read data and can run for more than a second (a dataset's sequences and tokens, a
// large text file, a checkpoint's shard checksums) poll this flag (the trainer's SIGTERM/SIGINT
// flag, set by train::install_stop_handlers; issue 42, class 6): once it is set, check_stop throws
// moe::Error "<what>: stopped by a signal (SIGTERM/SIGINT) during setup; ...". Null: never stops.
void set_stop_flag(const volatile std::sig_atomic_t* flag);
void check_stop(const std::string& what);

// "a FIFO (named pipe)", "a character device", ... for a st_mode that is not a regular file.
const char* file_kind(mode_t mode);

}  // namespace moe::io
