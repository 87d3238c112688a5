#include "data/shards/byte_stream.h"

#include "data/data_error.h"
#include "data/shards/http_stream.h"
#include "data/shards/s3.h"

#include <fmt/format.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

extern char** environ;

namespace flowtrain::data {

uint64_t ByteStream::skip(uint64_t n) {
  std::vector<char> sink(static_cast<size_t>(std::min<uint64_t>(n, 1 << 20)));
  uint64_t done = 0;
  while (done < n) {
    const size_t got = read(sink.data(), static_cast<size_t>(std::min<uint64_t>(n - done, sink.size())));
    if (got == 0) break;
    done += got;
  }
  return done;
}

size_t ByteStream::read_fully(char* dst, size_t n) {
  size_t done = 0;
  while (done < n) {
    const size_t got = read(dst + done, n - done);
    if (got == 0) break;
    done += got;
  }
  return done;
}

namespace {

std::string errno_text() { return std::strerror(errno); }

class FileStream final : public ByteStream {
 public:
  FileStream(const std::string& entry, const std::string& path) : ByteStream(entry) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw DataError(fmt::format("shard {}: cannot open: {}", entry, errno_text()));
    struct stat st {};
    if (::fstat(fd_, &st) == 0 && S_ISDIR(st.st_mode)) {
      ::close(fd_);
      throw DataError(fmt::format("shard {}: is a directory, not a tar file", entry));
    }
  }
  ~FileStream() override { ::close(fd_); }

  size_t read(char* dst, size_t n) override {
    for (;;) {
      const ssize_t got = ::read(fd_, dst, n);
      if (got >= 0) return static_cast<size_t>(got);
      if (errno != EINTR) throw DataError(fmt::format("shard {}: read failed: {}", name(), errno_text()));
    }
  }

  uint64_t skip(uint64_t n) override {
    const off_t here = ::lseek(fd_, 0, SEEK_CUR), end = ::lseek(fd_, 0, SEEK_END);
    if (here < 0 || end < 0) return ByteStream::skip(n);  // not seekable (a FIFO): read through
    const uint64_t step = std::min<uint64_t>(n, static_cast<uint64_t>(end - here));
    ::lseek(fd_, here + static_cast<off_t>(step), SEEK_SET);
    return step;
  }

 private:
  int fd_ = -1;
};

// `sh -c COMMAND` with its stdout on a pipe. Its stderr stays the trainer's (the object-store
// tool's own messages reach the log). A non-zero exit is an error at finish(); a stream closed
// early terminates the command.
class PipeStream final : public ByteStream {
 public:
  PipeStream(const std::string& entry, const std::string& command, const FetchOptions& options)
      : ByteStream(entry), options_(options) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw DataError(fmt::format("shard {}: pipe failed: {}", entry, errno_text()));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    // A process group of its own: a Ctrl-C for the trainer (which then saves a stop checkpoint)
    // must not kill the download under it.
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
    const int rc = posix_spawn(&pid_, "/bin/sh", &actions, &attr, const_cast<char* const*>(argv), environ);
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    if (rc != 0) {
      ::close(fds[0]);
      throw DataError(fmt::format("shard {}: cannot start the command: {}", entry, std::strerror(rc)));
    }
    fd_ = fds[0];
  }

  ~PipeStream() override {
    ::close(fd_);
    if (pid_ > 0) {
      ::kill(-pid_, SIGTERM);  // its group: the shell and what it started
      int status = 0;
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }

  size_t read(char* dst, size_t n) override {
    for (;;) {
      // Wait in slices, so a loader shutting down is not held by a stalled command.
      pollfd p{fd_, POLLIN, 0};
      const int ready = ::poll(&p, 1, 200);
      if (options_.cancelled()) throw DataError(fmt::format("shard {}: cancelled", name()));
      if (ready == 0 || (ready < 0 && errno == EINTR)) continue;
      const ssize_t got = ::read(fd_, dst, n);
      if (got >= 0) return static_cast<size_t>(got);
      if (errno != EINTR) throw DataError(fmt::format("shard {}: read failed: {}", name(), errno_text()));
    }
  }

  void finish() override {
    if (pid_ <= 0) return;
    // Drain what the command still writes after the end-of-archive block (tar pads to its
    // blocking factor), else it could block on a full pipe while we wait for it to exit.
    char sink[1 << 16];
    while (read(sink, sizeof sink) > 0) {
    }
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0) {
      if (errno != EINTR) throw DataError(fmt::format("shard {}: waitpid failed: {}", name(), errno_text()));
    }
    pid_ = -1;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
    if (WIFEXITED(status))
      throw DataError(fmt::format("shard {}: the command exited with status {}", name(), WEXITSTATUS(status)));
    throw DataError(fmt::format("shard {}: the command was killed by signal {}", name(), WTERMSIG(status)));
  }

 private:
  FetchOptions options_;
  int fd_ = -1;
  pid_t pid_ = -1;
};

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

bool is_local_entry(const std::string& entry) {
  return !starts_with(entry, "pipe:") && !starts_with(entry, "http://") && !starts_with(entry, "https://") &&
         !is_object_store_url(entry);
}

std::string local_path_of(const std::string& entry) {
  return starts_with(entry, "file://") ? entry.substr(7) : entry;
}

std::unique_ptr<ByteStream> open_shard(const std::string& entry, const FetchOptions& options) {
  if (starts_with(entry, "pipe:")) {
    const std::string command = entry.substr(5);
    if (command.empty()) throw DataError(fmt::format("shard '{}': pipe: names no command", entry));
    return std::make_unique<PipeStream>(entry, command, options);
  }
  if (starts_with(entry, "http://") || starts_with(entry, "https://")) return open_http_stream(entry, options);
  if (is_object_store_url(entry)) return open_object(entry, options, process_environment());
  if (entry.empty()) throw DataError("an empty shard entry");
  return std::make_unique<FileStream>(entry, local_path_of(entry));
}

}  // namespace flowtrain::data
