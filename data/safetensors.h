// Our own implementation of the safetensors format (huggingface/safetensors), which has no C++
// library: 8-byte little-endian header length N, N bytes of JSON, then the raw tensor bytes.
// Files we write load in the reference Python/Rust implementation and vice versa.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace flowtrain::data {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Writes atomically: to path + ".tmp", fsync, rename over path, fsync the directory, so a crash
// mid-write leaves the previous file intact. Tensors are written contiguous, little-endian, in the
// given order; dtypes F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL, F8_E4M3, F8_E5M2. CPU or
// CUDA tensors are accepted (copied to CPU). The header JSON is padded with spaces to a multiple
// of 8 bytes so the data buffer starts 8-aligned, as the reference writer does.
// Throws DataError (naming the file) on a duplicate or reserved name, an unsupported dtype or
// layout, or an I/O failure.
// Returns the file's size and CRC-32 (zlib polynomial), computed over the bytes as they are
// written: a checkpoint records them without reading the file back.
struct WrittenFile {
  uint64_t bytes = 0;
  uint32_t crc32 = 0;
};
WrittenFile write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The bytes of such a file, in memory (a WebDataset member: `flowtrain data encode`).
std::string safetensors_bytes(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata = {});

// Validates the whole header at open (lengths, JSON, dtypes, shapes against byte sizes, offsets
// tiling the buffer exactly, duplicate keys, metadata types) and throws DataError naming the file
// on the first problem. Tensor bytes are read through a read-only mmap held for the reader's
// lifetime; copies of a reader share the mapping.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  // The same checks over bytes in memory (a tar member); `name` stands for the path in errors.
  SafetensorsReader(std::string bytes, const std::string& name);

  const std::vector<std::string>& keys() const;  // in file offset order
  bool contains(const std::string& name) const;
  at::Tensor get(const std::string& name) const;  // a CPU tensor owning its memory (copied out)
  std::vector<int64_t> shape(const std::string& name) const;
  at::ScalarType dtype(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const;
  const std::string& path() const;

 private:
  struct Entry {
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // relative to the data buffer
    uint64_t end = 0;
  };
  struct Mapping;

  const Entry& entry(const std::string& name) const;
  void parse(const std::string& where);  // the header and entries of mapping_
  static Entry parse_entry(const std::string& where, const std::string& name, const nlohmann::json& value,
                           uint64_t buffer_size);

  std::string path_;
  std::shared_ptr<const Mapping> mapping_;
  uint64_t buffer_offset_ = 0;  // 8 + header length
  std::vector<std::string> keys_;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a file, in file offset order.
NamedTensors read_safetensors(const std::string& path);

}  // namespace flowtrain::data
