#include "data/idx.h"

#include "data/data_error.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

namespace flowtrain::data {
namespace {

constexpr uint8_t kUnsignedByte = 0x08;
// Reserve at most this much up front: a corrupt header can claim terabytes, and for a gzip
// stream we only learn the real size by reading it.
constexpr uint64_t kMaxReserve = uint64_t{256} << 20;

std::string hex_byte(uint8_t b) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "0x%02x", b);
  return buf;
}

std::string dims_string(const std::vector<int64_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) out += (i ? ", " : "") + std::to_string(dims[i]);
  return out + "]";
}

class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path) {
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    if (!file_)
      throw DataError("cannot open IDX file " + path + ": " +
                      (errno ? std::strerror(errno) : "zlib could not allocate its state"));
    gzbuffer(file_, 1 << 20);
  }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;
  ~GzFile() { gzclose(file_); }

  // Reads up to `size` bytes; fewer only at the end of the data. A corrupt or truncated gzip
  // stream is an error, not a short read, so callers can tell "file too short" from "bad gzip".
  uint64_t read(void* dst, uint64_t size) {
    char* p = static_cast<char*>(dst);
    uint64_t total = 0;
    while (total < size) {
      const unsigned chunk = static_cast<unsigned>(std::min<uint64_t>(size - total, INT_MAX / 2));
      const int n = gzread(file_, p + total, chunk);
      if (n < 0) throw_stream_error();
      if (n == 0) break;
      total += static_cast<uint64_t>(n);
    }
    if (total < size) {
      int errnum = Z_OK;
      gzerror(file_, &errnum);
      // Z_BUF_ERROR: the gzip stream ended mid-member (a truncated .gz file).
      if (errnum != Z_OK) throw_stream_error();
    }
    return total;
  }

 private:
  [[noreturn]] void throw_stream_error() {
    int errnum = Z_OK;
    const char* msg = gzerror(file_, &errnum);
    std::string text = msg ? msg : "unknown zlib error";
    if (errnum == Z_ERRNO) text += std::string(" (") + std::strerror(errno) + ")";
    throw DataError("IDX file " + path_ + ": corrupt or truncated gzip stream: " + text);
  }

  std::string path_;
  gzFile file_ = nullptr;
};

}  // namespace

IdxArray read_idx(const std::string& path) {
  const std::string where = "IDX file " + path + ": ";
  GzFile in(path);

  uint8_t magic[4];
  const uint64_t got_magic = in.read(magic, 4);
  if (got_magic < 4)
    throw DataError(where + "file is " + std::to_string(got_magic) + " bytes, too short for the 4-byte magic");
  if (magic[0] != 0 || magic[1] != 0)
    throw DataError(where + "bad magic " + hex_byte(magic[0]) + " " + hex_byte(magic[1]) + " " +
                    hex_byte(magic[2]) + " " + hex_byte(magic[3]) + " (expected 0x00 0x00 type ndim)");
  if (magic[2] != kUnsignedByte)
    throw DataError(where + "element type " + hex_byte(magic[2]) + " is not supported (expected unsigned byte " +
                    hex_byte(kUnsignedByte) + ")");
  const int ndim = magic[3];
  if (ndim == 0) throw DataError(where + "ndim is 0 (expected at least 1 dimension)");

  IdxArray out;
  uint64_t expected = 1;
  bool overflow = false;
  for (int i = 0; i < ndim; ++i) {
    uint8_t be[4];
    if (in.read(be, 4) < 4)
      throw DataError(where + "truncated header: expected " + std::to_string(ndim) + " dimensions of 4 bytes each");
    const uint32_t dim = (uint32_t{be[0]} << 24) | (uint32_t{be[1]} << 16) | (uint32_t{be[2]} << 8) | be[3];
    out.dims.push_back(dim);
    overflow |= __builtin_mul_overflow(expected, uint64_t{dim}, &expected);
  }
  if (overflow || expected > static_cast<uint64_t>(INT64_MAX))
    throw DataError(where + "dimensions " + dims_string(out.dims) + " are too large");

  // Read in chunks so a header lying about its size fails on the data, not on the allocation.
  out.bytes.reserve(static_cast<size_t>(std::min(expected, kMaxReserve)));
  constexpr uint64_t kChunk = uint64_t{16} << 20;
  uint64_t got = 0;
  while (got < expected) {
    const uint64_t want = std::min(kChunk, expected - got);
    out.bytes.resize(static_cast<size_t>(got + want));
    const uint64_t n = in.read(out.bytes.data() + got, want);
    got += n;
    if (n < want) break;
  }
  if (got < expected)
    throw DataError(where + "truncated payload: dims " + dims_string(out.dims) + " need " + std::to_string(expected) +
                    " bytes, got " + std::to_string(got));
  out.bytes.resize(static_cast<size_t>(expected));

  uint8_t extra;
  if (in.read(&extra, 1) != 0)
    throw DataError(where + "trailing data after the " + std::to_string(expected) + "-byte payload of dims " +
                    dims_string(out.dims) + " (expected the file to end there)");
  return out;
}

}  // namespace flowtrain::data
