// Checked file access for the model-file layer (see file_io.h).
#include "engine/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "lockstep/error.h"

namespace lockstep::engine {
namespace {

// "symlink loop (Too many levels of symbolic links)" for ELOOP, else strerror.
std::string errno_text(int err) {
  if (err == ELOOP) return std::string("symlink loop (") + std::strerror(err) + ")";
  return std::strerror(err);
}

}  // namespace

FileHandle& FileHandle::operator=(FileHandle&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

FileHandle::~FileHandle() {
  if (fd_ >= 0) ::close(fd_);
}

const char* file_kind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symlink";
  return "not a regular file";
}

std::optional<struct stat> stat_path(const std::string& path, const std::string& what) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) return st;
  const int err = errno;
  if (err == ENOENT) return std::nullopt;
  throw Error(what + ": " + path + ": " + errno_text(err));
}

void require_directory(const std::string& path, const std::string& what) {
  std::optional<struct stat> st = stat_path(path, what);
  if (!st) throw Error(what + ": " + path + " does not exist (not a directory)");
  if (!S_ISDIR(st->st_mode))
    throw Error(what + ": " + path + " is " + file_kind(st->st_mode) + ", not a directory");
}

FileHandle open_regular_file(const std::string& path, const std::string& what, uint64_t* size) {
  std::optional<struct stat> st = stat_path(path, what);
  if (!st) throw Error(what + ": cannot open " + path + ": " + std::strerror(ENOENT));
  if (!S_ISREG(st->st_mode))
    throw Error(what + ": " + path + " is " + file_kind(st->st_mode) + ", not a regular file");
  // NOTE: O_NONBLOCK: if the path became a FIFO after the stat, open() must not wait for a writer.
  FileHandle fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (fd.get() < 0) {
    const int err = errno;
    throw Error(what + ": cannot open " + path + ": " + errno_text(err));
  }
  struct stat fst;
  if (::fstat(fd.get(), &fst) != 0) {
    const int err = errno;
    throw Error(what + ": cannot stat " + path + ": " + errno_text(err));
  }
  if (!S_ISREG(fst.st_mode))
    throw Error(what + ": " + path + " is " + file_kind(fst.st_mode) + ", not a regular file");
  // Back to blocking reads (O_NONBLOCK has no effect on regular files, but leave no surprise).
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags >= 0) ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  if (size) *size = uint64_t(fst.st_size);
  return fd;
}

std::string read_small_file(const std::string& path, uint64_t cap, const std::string& what) {
  uint64_t size = 0;
  FileHandle fd = open_regular_file(path, what, &size);
  if (size > cap)
    throw Error(detail::concat(what, ": ", path, " is ", size, " bytes (cap ", cap, ")"));
  std::string s(size_t(size), '\0');
  size_t got = 0;
  while (got < s.size()) {
    ssize_t r = ::read(fd.get(), s.data() + got, s.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      throw Error(what + ": error reading " + path + ": " + std::strerror(err));
    }
    if (r == 0)
      throw Error(detail::concat(what, ": ", path, " ended after ", got, " of ", size,
                                 " bytes (changed while being read?)"));
    got += size_t(r);
  }
  return s;
}

void fsync_directory(const std::string& dir, const std::string& what) {
  FileHandle dfd(::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() < 0) {
    const int err = errno;
    // A directory one may write but not read (mode -wx): the rename is done, only its
    // durability cannot be forced from here.
    if (err == EACCES || err == EPERM) return;
    throw Error(what + ": cannot open directory " + dir + " to sync it: " + errno_text(err));
  }
  if (::fsync(dfd.get()) != 0 && errno != EINVAL && errno != ENOTSUP) {
    const int err = errno;
    throw Error(what + ": fsync of directory " + dir + " failed: " + std::strerror(err));
  }
}

void write_file_atomic(const std::string& path, const void* data, size_t size) {
  static std::atomic<uint64_t> counter{0};
  const std::string what = "write " + path;
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode))
    throw Error(what + ": it exists and is " + std::string(file_kind(st.st_mode)) +
                ", not a regular file (refusing to replace it)");
  const std::string tmp = detail::concat(path, ".tmp.", ::getpid(), ".", counter++);
  auto sys_fail = [&](const std::string& step, int err) {
    ::unlink(tmp.c_str());
    throw Error(what + ": " + step + ": " + errno_text(err));
  };
  {
    FileHandle fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (fd.get() < 0) {
      const int err = errno;
      throw Error(what + ": cannot create " + tmp + ": " + errno_text(err));
    }
    const uint8_t* p = static_cast<const uint8_t*>(data);
    size_t left = size;
    while (left > 0) {
      ssize_t w = ::write(fd.get(), p, left);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) sys_fail("write failed", errno);
      if (w == 0) sys_fail("write failed", EIO);
      p += w;
      left -= size_t(w);
    }
    if (::fsync(fd.get()) != 0) sys_fail("fsync failed", errno);
    if (::close(fd.release()) != 0) sys_fail("close failed", errno);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) sys_fail("rename failed", errno);
  // Make the rename itself durable.
  fsync_directory(std::filesystem::path(path).parent_path().string(), what);
}

}  // namespace lockstep::engine
