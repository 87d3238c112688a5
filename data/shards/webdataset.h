// WebDataset's sample convention over a tar stream: a member's key is its path up to the first
// dot of its base name, the rest (lower-cased) is its extension —
//   shard/000123.jpg                 key "shard/000123", extension "jpg"
//   shard/000123.latent.safetensors  key "shard/000123", extension "latent.safetensors"
// and adjacent members sharing a key form one sample. A sample repeating an extension is damaged
// (two images for one key); the reader reports it, as it reports a damaged tar.
#pragma once

#include "data/shards/tar.h"

#include <cstdint>
#include <exception>
#include <map>
#include <optional>
#include <string>

namespace flowtrain::data {

struct RawSample {
  std::string key;
  std::string shard;                          // the entry it came from
  int64_t index = 0;                          // its position in the shard (0-based)
  std::map<std::string, std::string> members; // extension -> bytes (empty when read without data)
  std::string error;                          // non-empty: the sample is damaged, and why
};

// Splits a member name into (key, extension); extension "" when the base name has no dot.
std::pair<std::string, std::string> split_member_name(const std::string& name);

class SampleReader {
 public:
  // Takes the stream; `want_data` false lists samples and members without reading their bytes.
  SampleReader(std::unique_ptr<ByteStream> stream, bool want_data = true);
  // The next sample, or nullopt at the end of the shard. Damage in the tar (a bad header, a
  // truncation) is thrown as DataError, after the samples before it were returned; the sample
  // being assembled when it struck comes back with `error` set when it may have lost a member
  // (the damage cut one of its own members, or a header), as does a sample that repeats an
  // extension.
  std::optional<RawSample> next();
  const std::string& shard() const { return stream_->name(); }

 private:
  std::unique_ptr<ByteStream> stream_;
  TarReader tar_;
  bool want_data_;
  void advance();  // reads the next member into lookahead_, or records the end or the damage

  std::optional<TarMember> lookahead_;
  std::exception_ptr pending_error_;
  std::string pending_message_;
  std::string pending_key_;  // the key of the member the damage cut short ("" unknown)
  bool at_end_ = false;
  int64_t index_ = 0;
};

// The sample count of one shard (headers only; local files are seeked through). A damaged shard
// throws, unless `damage` is given: then it receives the error and the count is of the samples
// before the damage (the one the damage struck included) — what a reader of the shard will get.
int64_t count_samples(const std::string& entry, const FetchOptions& options = {}, std::string* damage = nullptr);

}  // namespace flowtrain::data
