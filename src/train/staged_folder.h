// A folder published whole or not at all (`moetrain export`): its files are written into a new
// sibling folder (.NAME.staging.PID, created with mkdir, so never a planted one), which replaces
// the target in one rename once everything is written. An error, or SIGTERM/SIGINT/SIGHUP while
// writing, removes the sibling and leaves the target as it was.
#pragma once
#include <regex>
#include <string>

namespace moe::train {

class StagedFolder {
 public:
  // `target` must exist and be a folder (the caller checked and locked it); `flag` names it in errors.
  StagedFolder(const std::string& target, const std::string& flag);
  ~StagedFolder();  // removes the staging folder unless published
  StagedFolder(const StagedFolder&) = delete;
  StagedFolder& operator=(const StagedFolder&) = delete;

  const std::string& path() const { return staging_; }  // write the files here
  // The staging folder becomes the target. The target's earlier files whose names match `replaced`
  // (an earlier export's weights and config) go; every other entry (the lock file, files the user
  // put there) moves into the new folder unless it has a file of that name. Signals are held off
  // while the folders swap, so a stop never loses an old file.
  void publish(const std::regex& replaced);

 private:
  std::string target_, staging_, flag_;
  bool published_ = false;
};

}  // namespace moe::train
