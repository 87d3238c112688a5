// One canonical stream of one epoch (stream_plan.h): its shards read one after another, their
// samples passed through the stream's ShuffleOrder. Started at a count k (a resumed run), it
// replays k draws of the order (arithmetic only) and re-reads just the samples the buffer held
// at that point: from the shard holding the oldest of them up to the stream's read position.
//
// A shard that cannot be opened, breaks mid-way (a truncated tar, an HTTP error after the last
// retry), or holds fewer samples than its count yields damaged samples for the positions it
// could not supply: the stream's length stays what the plan says, so every rank's arithmetic
// over the streams holds whatever the damage.
#pragma once

#include "data/shards/byte_stream.h"
#include "data/shards/stream_plan.h"
#include "data/shards/webdataset.h"

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace flowtrain::data {

class StreamReader {
 public:
  // `entries` / `counts`: the stream's shards in reading order and their sample counts.
  StreamReader(std::vector<std::string> entries, std::vector<int64_t> counts, int64_t shuffle_buffer, uint64_t seed,
               int64_t start_count, FetchOptions fetch);
  bool exhausted() const { return order_.exhausted(); }
  // The next sample of the stream (with `error` set when damaged). Not after exhausted().
  RawSample next();
  // Warnings worth one log line each (a shard longer than its index says), taken once.
  std::vector<std::string> take_warnings();

 private:
  RawSample read_input();           // the sample at input position next_read_
  void seek_input(int64_t position);  // positions the reader so read_input() returns `position`
  void close_shard();

  std::vector<std::string> entries_;
  std::vector<int64_t> counts_;
  FetchOptions fetch_;
  ShuffleOrder order_;
  std::map<int64_t, RawSample> held_;  // the buffer's samples by input position
  int64_t next_read_ = 0;              // input position read_input() returns next
  size_t shard_ = 0;                   // shard of next_read_
  int64_t in_shard_ = 0;               // index of next_read_ in that shard
  std::unique_ptr<SampleReader> reader_;
  std::string broken_;                 // why the current shard can supply no more samples
  std::vector<std::string> warnings_;
};

}  // namespace flowtrain::data
