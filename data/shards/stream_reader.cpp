#include "data/shards/stream_reader.h"

#include "data/data_error.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace flowtrain::data {
namespace {

int64_t total(const std::vector<int64_t>& counts) {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  return n;
}

}  // namespace

StreamReader::StreamReader(std::vector<std::string> entries, std::vector<int64_t> counts, int64_t shuffle_buffer,
                           uint64_t seed, int64_t start_count, FetchOptions fetch)
    : entries_(std::move(entries)), counts_(std::move(counts)), fetch_(fetch),
      order_(total(counts_), shuffle_buffer, seed) {
  for (int64_t k = 0; k < start_count; ++k) {
    if (order_.exhausted())
      throw DataError(fmt::format("loader state: a stream of {} samples cannot have handed out {}", total(counts_),
                                  start_count));
    order_.emit();
  }
  if (order_.held().empty()) return;
  // Fill the buffer (k = 0), or re-read what it held after k draws: from its oldest position to
  // where reading had got.
  const int64_t oldest = *std::min_element(order_.held().begin(), order_.held().end());
  seek_input(oldest);
  std::vector<int64_t> wanted = order_.held();
  std::sort(wanted.begin(), wanted.end());
  size_t w = 0;
  while (next_read_ < order_.next_input()) {
    const int64_t position = next_read_;
    RawSample sample = read_input();
    if (w < wanted.size() && wanted[w] == position) {
      held_.emplace(position, std::move(sample));
      ++w;
    }
  }
}

void StreamReader::seek_input(int64_t position) {
  close_shard();
  shard_ = 0;
  int64_t first = 0;
  while (shard_ < counts_.size() && first + counts_[shard_] <= position) first += counts_[shard_++];
  in_shard_ = 0;
  next_read_ = first;
  while (next_read_ < position) read_input();  // within the shard: read and drop
}

void StreamReader::close_shard() {
  reader_.reset();
  broken_.clear();
}

RawSample StreamReader::read_input() {
  while (shard_ < counts_.size() && in_shard_ >= counts_[shard_]) {  // shards of 0 samples, or the end of one
    if (reader_ && broken_.empty()) {
      // The index promised counts_[shard_] samples; more in the tar are not used.
      try {
        if (reader_->next())
          warnings_.push_back(fmt::format("shard {} holds more samples than its index says ({}); the rest are not used",
                                          entries_[shard_], counts_[shard_]));
      } catch (const DataError&) {
        // Damage after the samples we use: nothing lost.
      }
    }
    close_shard();
    ++shard_;
    in_shard_ = 0;
  }
  if (shard_ >= counts_.size()) throw DataError("StreamReader: read past the end of the stream");
  const std::string& entry = entries_[shard_];
  RawSample sample;
  if (!reader_ && broken_.empty()) {
    try {
      reader_ = std::make_unique<SampleReader>(open_shard(entry, fetch_));
    } catch (const DataError& e) {
      broken_ = e.what();
    }
  }
  if (broken_.empty()) {
    try {
      auto got = reader_->next();
      if (got) sample = std::move(*got);
      else broken_ = fmt::format("shard {} ended after {} samples; its index says {}", entry, in_shard_, counts_[shard_]);
    } catch (const DataError& e) {
      broken_ = e.what();
    }
  }
  if (!broken_.empty() && sample.key.empty()) {
    sample.key = fmt::format("{}#{}", entry, in_shard_);  // no key: the sample never arrived
    sample.shard = entry;
    sample.index = in_shard_;
    sample.error = broken_;
  }
  ++in_shard_;
  ++next_read_;
  return sample;
}

RawSample StreamReader::next() {
  const int64_t position = order_.emit();
  auto node = held_.extract(position);
  if (node.empty()) throw DataError(fmt::format("StreamReader: position {} is not in the buffer", position));
  while (next_read_ < order_.next_input()) {
    const int64_t p = next_read_;
    held_.emplace(p, read_input());
  }
  return std::move(node.mapped());
}

std::vector<std::string> StreamReader::take_warnings() { return std::exchange(warnings_, {}); }

}  // namespace flowtrain::data
