// File access of the model-file layer: every input file (config.json, *.safetensors, the shard
// index) is opened through open_regular_file, which refuses FIFOs, devices, sockets and
// directories before anything reads them (a FIFO would block, /dev/zero would never end), names a
// symlink loop as such, and quotes strerror for every other failure. Every output is written
// through write_file_atomic: readers see the old file or the complete new one, and every write
// error (including close and rename) is an Error.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace lockstep::engine {

// An open file descriptor, closed on destruction.
class FileHandle {
 public:
  FileHandle() = default;
  explicit FileHandle(int fd) : fd_(fd) {}
  FileHandle(FileHandle&& o) noexcept : fd_(o.release()) {}
  FileHandle& operator=(FileHandle&& o) noexcept;
  FileHandle(const FileHandle&) = delete;
  FileHandle& operator=(const FileHandle&) = delete;
  ~FileHandle();

  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_ = -1;
};

// "a FIFO", "a character device", "a block device", "a directory", "a socket", "a symlink",
// "a regular file".
const char* file_kind(mode_t mode);

// stat(2) of `path` (symlinks followed). nullopt if it does not exist (ENOENT); any other failure
// throws Error("<what>: <path>: symlink loop ..." / strerror). `what` prefixes every message.
std::optional<struct stat> stat_path(const std::string& path, const std::string& what);

// Throws unless `path` is a directory (symlinks followed): "does not exist", "symlink loop",
// "is a FIFO, not a directory", or strerror.
void require_directory(const std::string& path, const std::string& what);

// Opens an existing regular file for reading (symlinks followed); `size` receives its size. Never
// blocks: the type is checked with stat before the open, and again with fstat on the descriptor
// (opened O_NONBLOCK, so a FIFO swapped in between cannot hang it). Errors name `what` and `path`:
// "cannot open <path>: No such file or directory", "<path> is a FIFO, not a regular file",
// "<path>: symlink loop (Too many levels of symbolic links)".
FileHandle open_regular_file(const std::string& path, const std::string& what, uint64_t* size);

// The whole content of a regular file of at most `cap` bytes (checked before reading).
std::string read_small_file(const std::string& path, uint64_t cap, const std::string& what);

// Writes a temporary file next to `path`, fsyncs it and renames it over `path`: readers see the
// old file or the new one, never a partial one. Any failure (create, short write, fsync, close,
// rename, the directory's fsync) is an Error naming `path` and strerror, and the temporary file is
// removed. An existing `path` that is not a regular file (or a symlink, which is replaced) is
// refused: renaming over /dev/null or a FIFO would replace the device node.
void write_file_atomic(const std::string& path, const void* data, size_t size);

// fsync of a directory, so that renames into it are durable. Filesystems that cannot sync a
// directory (EINVAL, ENOTSUP) and directories that cannot be opened for reading (EACCES, EPERM)
// are accepted; any other failure is an Error.
void fsync_directory(const std::string& dir, const std::string& what);

}  // namespace lockstep::engine
