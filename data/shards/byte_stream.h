// Where shard bytes come from. A shard entry (one line of data.shards after brace expansion) is
//   /local/path.tar  or  file:///local/path.tar      read with read(2), skipped with lseek(2)
//   http://… / https://…                            libcurl, streamed; retried (below)
//   s3://bucket/key, gs://bucket/key                the same, signed with AWS SigV4 (data/shards/s3.h)
//   pipe:COMMAND                                    COMMAND's stdout (WebDataset's convention:
//                                                   `pipe:aws s3 cp s3://bucket/key -`)
// Every error is a DataError naming the entry, so a loader can say which shard failed.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

namespace flowtrain::data {

struct FetchOptions {
  // http(s), s3: a connection error, a timeout, a 408/429 or 5xx answer is retried `retries` times
  // with jittered exponential backoff (attempt k waits between ½ and 1 × backoff_s·2^k); a
  // transfer that breaks mid-way resumes with a Range request at the byte it reached. Other 4xx
  // answers are final.
  int retries = 5;
  double backoff_s = 1.0;
  double connect_timeout_s = 30.0;
  double stall_timeout_s = 60.0;  // a transfer below 1 byte/s for this long counts as failed
  // Set by the owner (a loader shutting down): pipe and HTTP reads, retries and backoffs give up
  // within ~0.2 s with a DataError instead of blocking on a stalled command or server.
  std::shared_ptr<const std::atomic<bool>> cancel;
  bool cancelled() const { return cancel && cancel->load(); }
};

class ByteStream {
 public:
  explicit ByteStream(std::string name) : name_(std::move(name)) {}
  virtual ~ByteStream() = default;
  ByteStream(const ByteStream&) = delete;
  ByteStream& operator=(const ByteStream&) = delete;

  // Up to n bytes into dst; 0 only at the end of the stream.
  virtual size_t read(char* dst, size_t n) = 0;
  // Discards n bytes (a seek where the source allows it); returns the bytes actually skipped,
  // fewer only at the end of the stream.
  virtual uint64_t skip(uint64_t n);
  // After the last read: failures that only show at the end (a pipe command's exit status).
  virtual void finish() {}

  // Reads until n bytes or the end; returns the count.
  size_t read_fully(char* dst, size_t n);
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

// Opens one shard entry. Throws DataError naming it when it cannot be opened (a missing file, an
// HTTP error after the last retry, a command that cannot be started).
std::unique_ptr<ByteStream> open_shard(const std::string& entry, const FetchOptions& options = {});

// True for entries that name a local file (a path or file://), whose directory may hold an index.
bool is_local_entry(const std::string& entry);
std::string local_path_of(const std::string& entry);

}  // namespace flowtrain::data
