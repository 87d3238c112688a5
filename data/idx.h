// Reader for the IDX format of MNIST-style datasets (yann.lecun.com/exdb/mnist): a 4-byte magic
// (0x00 0x00 type ndim), ndim big-endian u32 dimensions, then the elements row-major.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flowtrain::data {

struct IdxArray {
  std::vector<int64_t> dims;   // outermost first, e.g. {60000, 28, 28}
  std::vector<uint8_t> bytes;  // product(dims) elements, row-major
};

// Reads a gzip-compressed (.gz) or plain IDX file; zlib reads both transparently. Only the
// unsigned-byte element type (0x08) is supported, which is all (Fashion-)MNIST uses.
// Throws DataError naming the file on: a missing file, a bad magic, an unsupported type, ndim 0,
// a truncated payload (with the expected and actual byte counts), trailing bytes after the
// payload, or a corrupt gzip stream (with zlib's message).
IdxArray read_idx(const std::string& path);

}  // namespace flowtrain::data
