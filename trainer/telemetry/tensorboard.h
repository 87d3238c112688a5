// TensorBoard event-file writer: scalars and images in the standard tfevents format, written
// without TensorFlow or a protobuf library so that stock TensorBoard (and anything reading
// tfevents: tbparse, W&B sync, …) shows a flowtrain run.
//
// File format: a sequence of records, each
//   uint64 length (little-endian) | uint32 masked CRC32C(length bytes) | data | uint32 masked CRC32C(data)
// where data is a serialized tensorflow.Event protobuf; the first record carries
// file_version "brain.Event:2". Every add_* call writes one Event and flushes, so a crash loses
// nothing already added. Not thread-safe: one writer per process, used by one thread (rank 0).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <string_view>

namespace flowtrain::trainer {

class TensorBoardWriter {
 public:
  // Creates `dir` (and parents) and a new file
  // dir/events.out.tfevents.<unix seconds>.<hostname>.<pid>.flowtrain, never overwriting an
  // existing one (a ".N" suffix is added on a name clash). Throws std::runtime_error naming the
  // file when it cannot be created.
  explicit TensorBoardWriter(const std::string& dir);

  // One scalar (stored as float32, as TensorBoard's simple_value is).
  void add_scalar(const std::string& tag, double value, int64_t step);
  // Several scalars of the same step in one Event.
  void add_scalars(const std::map<std::string, double>& values, int64_t step);
  // image_uint8: uint8 [H, W] (gray) or [H, W, 3] (RGB), any device; stored PNG-encoded.
  void add_image(const std::string& tag, const at::Tensor& image_uint8, int64_t step);
  void flush();

  const std::string& path() const { return path_; }

 private:
  void write_event(int64_t step, uint32_t field, std::string_view payload);
  void write_record(std::string_view data);

  struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::string path_;
  std::unique_ptr<std::FILE, FileCloser> file_;
};

// CRC32C (Castagnoli), as used by the TFRecord framing; exposed for tests.
uint32_t crc32c(const void* data, size_t size);

}  // namespace flowtrain::trainer
