#include "data/shards/webdataset.h"

#include "data/data_error.h"

#include <algorithm>
#include <cctype>
#include <utility>

namespace flowtrain::data {

std::pair<std::string, std::string> split_member_name(const std::string& name) {
  const size_t slash = name.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = name.find('.', base);
  if (dot == std::string::npos) return {name, ""};
  std::string ext = name.substr(dot + 1);
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return {name.substr(0, dot), ext};
}

SampleReader::SampleReader(std::unique_ptr<ByteStream> stream, bool want_data)
    : stream_(std::move(stream)), tar_(*stream_), want_data_(want_data) {}

void SampleReader::advance() {
  try {
    lookahead_ = tar_.next(want_data_);
    if (!lookahead_) {
      at_end_ = true;
      stream_->finish();
    }
  } catch (const std::exception& e) {
    // The samples returned so far are whole; the one being assembled may have lost a member
    // (next() decides), and the error itself comes on the call after.
    lookahead_.reset();
    at_end_ = true;
    pending_error_ = std::current_exception();
    pending_message_ = e.what();
    pending_key_ = tar_.damaged_member().empty() ? std::string() : split_member_name(tar_.damaged_member()).first;
  }
}

std::optional<RawSample> SampleReader::next() {
  if (!lookahead_ && !at_end_) advance();
  if (!lookahead_) {
    if (pending_error_) std::rethrow_exception(std::exchange(pending_error_, nullptr));
    return std::nullopt;
  }
  RawSample sample;
  sample.shard = stream_->name();
  sample.index = index_++;
  sample.key = split_member_name(lookahead_->name).first;
  while (lookahead_) {
    auto [key, ext] = split_member_name(lookahead_->name);
    if (key != sample.key) break;
    if (sample.members.count(ext) && sample.error.empty())
      sample.error = "member '" + lookahead_->name + "' repeats extension '" + ext + "'";
    sample.members[ext] = std::move(lookahead_->data);
    advance();
  }
  // Damage inside another sample's member leaves this one whole; damage in a header or at the
  // end of the archive may have cost it a member.
  if (pending_error_ && sample.error.empty() && (pending_key_.empty() || pending_key_ == sample.key))
    sample.error = pending_message_;
  return sample;
}

int64_t count_samples(const std::string& entry, const FetchOptions& options, std::string* damage) {
  SampleReader reader(open_shard(entry, options), /*want_data=*/false);
  int64_t n = 0;
  try {
    while (reader.next()) ++n;
  } catch (const DataError& e) {
    if (!damage) throw;
    *damage = e.what();
  }
  return n;
}

}  // namespace flowtrain::data
