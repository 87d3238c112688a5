// The tar format as WebDataset shards use it: POSIX ustar headers (512-byte blocks, octal fields,
// a header checksum), with GNU long names ('L') and pax extended headers ('x': path, size) read
// as GNU tar and Python's tarfile write them. Only regular files are members; directories, links
// and global pax headers are skipped.
//
// Damage is an error, never a silent short read: a header whose checksum does not match, a
// member cut short by the end of the stream, or a stream that ends without the end-of-archive
// block (a shard truncated at a member boundary) throw DataError naming the shard and the byte
// offset. The members before the damage have been returned by then.
#pragma once

#include "data/shards/byte_stream.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace flowtrain::data {

struct TarMember {
  std::string name;
  uint64_t size = 0;
  uint64_t offset = 0;  // of the member's header in the shard
  std::string data;     // empty when read with want_data = false
};

class TarReader {
 public:
  explicit TarReader(ByteStream& in) : in_(in) {}
  // The next regular file, or nullopt at the end-of-archive block. With want_data = false the
  // member's bytes are skipped (seeked over in local files), not read.
  std::optional<TarMember> next(bool want_data = true);
  uint64_t offset() const { return offset_; }
  // After next() threw: the name of the member whose data was cut short, or "" when the damage
  // was in a header or the end of the archive (which member it struck is then unknown).
  const std::string& damaged_member() const { return damaged_member_; }

 private:
  bool read_block(char* block, bool end_allowed);  // false: a clean end-of-archive
  void skip_bytes(uint64_t n, const std::string& member);
  std::string read_bytes(uint64_t n, const std::string& member);

  ByteStream& in_;
  uint64_t offset_ = 0;
  bool ended_ = false;
  std::string damaged_member_;
};

// Writes a tar file the way `flowtrain data pack` needs it: to `path`.tmp, then renamed over
// `path` by close(), so a reader never sees half a shard. Headers are reproducible (mode 0644,
// mtime 0, no owner names), so packing the same data twice gives the same bytes.
class TarWriter {
 public:
  explicit TarWriter(std::string path);
  ~TarWriter();  // without close(): removes the .tmp file
  TarWriter(const TarWriter&) = delete;
  TarWriter& operator=(const TarWriter&) = delete;

  void add(const std::string& name, const std::string& data);
  void close();  // end-of-archive blocks, fsync, rename; throws DataError naming the file
  uint64_t bytes() const { return bytes_; }

 private:
  void write(const char* data, size_t n);
  void write_header(const std::string& name, uint64_t size, char type);

  std::string path_, tmp_path_;
  int fd_ = -1;
  uint64_t bytes_ = 0;
};

}  // namespace flowtrain::data
