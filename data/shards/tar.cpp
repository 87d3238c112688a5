#include "data/shards/tar.h"

#include "data/data_error.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

namespace flowtrain::data {
namespace {

constexpr size_t kBlock = 512;
// A member larger than this is taken as a damaged header, not allocated: a flipped bit in a size
// field (pax records carry no checksum) must not become a multi-terabyte allocation.
constexpr uint64_t kMaxMemberBytes = uint64_t{16} << 30;

uint64_t padded(uint64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

// A numeric header field: octal text (space- or NUL-terminated), or GNU's base-256 when the first
// byte's high bit is set (sizes of 8 GiB and more). nullopt when it is neither.
std::optional<uint64_t> parse_number(const char* field, size_t len) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(field);
  if (bytes[0] == 0xff) return std::nullopt;  // base-256 negative: never a valid size
  if (bytes[0] & 0x80) {
    uint64_t v = bytes[0] & 0x7f;
    for (size_t i = 1; i < len; ++i) v = (v << 8) | bytes[i];
    return v;
  }
  size_t i = 0;
  while (i < len && field[i] == ' ') ++i;
  uint64_t v = 0;
  bool any = false;
  for (; i < len && field[i] >= '0' && field[i] <= '7'; ++i, any = true) v = v * 8 + static_cast<uint64_t>(field[i] - '0');
  for (; i < len; ++i)
    if (field[i] != ' ' && field[i] != '\0') return std::nullopt;
  if (!any) return 0;
  return v;
}

std::string field_text(const char* field, size_t len) { return std::string(field, strnlen(field, len)); }

bool checksum_ok(const char* block) {
  const auto stored = parse_number(block + 148, 8);
  if (!stored) return false;
  uint64_t unsigned_sum = 0;
  int64_t signed_sum = 0;
  for (size_t i = 0; i < kBlock; ++i) {
    const char c = (i >= 148 && i < 156) ? ' ' : block[i];
    unsigned_sum += static_cast<unsigned char>(c);
    signed_sum += static_cast<signed char>(c);
  }
  // Some old writers summed signed chars; both are accepted, as GNU tar does.
  return *stored == unsigned_sum || static_cast<int64_t>(*stored) == signed_sum;
}

bool all_zero(const char* block) {
  for (size_t i = 0; i < kBlock; ++i)
    if (block[i] != 0) return false;
  return true;
}

// The "path" and "size" records of a pax extended header ("LEN key=value\n" …).
void parse_pax(const std::string& records, std::optional<std::string>& path, std::optional<uint64_t>& size) {
  size_t pos = 0;
  while (pos < records.size()) {
    const size_t space = records.find(' ', pos);
    if (space == std::string::npos) return;
    const uint64_t len = std::strtoull(records.c_str() + pos, nullptr, 10);
    if (len == 0 || pos + len > records.size()) return;
    const std::string record = records.substr(space + 1, pos + len - space - 2);  // without "\n"
    const size_t eq = record.find('=');
    if (eq != std::string::npos) {
      const std::string key = record.substr(0, eq), value = record.substr(eq + 1);
      if (key == "path") path = value;
      if (key == "size") size = std::strtoull(value.c_str(), nullptr, 10);
    }
    pos += len;
  }
}

}  // namespace

bool TarReader::read_block(char* block, bool end_allowed) {
  const size_t got = in_.read_fully(block, kBlock);
  if (got == 0 && end_allowed) return false;
  if (got < kBlock)
    throw DataError(fmt::format("shard {}: truncated: the stream ends inside a tar header at byte {}", in_.name(),
                                offset_ + got));
  offset_ += kBlock;
  return true;
}

void TarReader::skip_bytes(uint64_t n, const std::string& member) {
  const uint64_t got = in_.skip(n);
  offset_ += got;
  if (got < n)
    throw DataError(fmt::format("shard {}: truncated: member '{}' ends at byte {}, {} bytes short", in_.name(), member,
                                offset_, n - got));
}

std::string TarReader::read_bytes(uint64_t n, const std::string& member) {
  std::string data(static_cast<size_t>(n), '\0');
  const size_t got = in_.read_fully(data.data(), data.size());
  offset_ += got;
  if (got < n)
    throw DataError(fmt::format("shard {}: truncated: member '{}' ends at byte {}, {} bytes short", in_.name(), member,
                                offset_, n - got));
  return data;
}

std::optional<TarMember> TarReader::next(bool want_data) {
  if (ended_) return std::nullopt;
  std::optional<std::string> long_name;
  uint64_t next_size_override = 0;  // a pax header's size, for the next member
  bool has_size_override = false;
  char block[kBlock];
  for (;;) {
    const uint64_t header_offset = offset_;
    if (!read_block(block, /*end_allowed=*/true))
      throw DataError(fmt::format("shard {}: truncated: no end-of-archive block after byte {}", in_.name(), offset_));
    if (all_zero(block)) {
      ended_ = true;  // the second zero block, and any padding after it, need not be read
      return std::nullopt;
    }
    if (!checksum_ok(block))
      throw DataError(fmt::format("shard {}: not a tar header at byte {} (checksum mismatch)", in_.name(),
                                  header_offset));
    const auto header_size = parse_number(block + 124, 12);
    if (!header_size)
      throw DataError(fmt::format("shard {}: bad size field in the tar header at byte {}", in_.name(), header_offset));
    const char type = block[156];
    const uint64_t size = has_size_override ? next_size_override : *header_size;
    if (size > kMaxMemberBytes || *header_size > kMaxMemberBytes)
      throw DataError(fmt::format("shard {}: tar header at byte {} claims a member of {} bytes (damaged?)", in_.name(),
                                  header_offset, std::max(size, *header_size)));
    std::string name = field_text(block, 100);
    if (std::memcmp(block + 257, "ustar\0", 6) == 0) {
      const std::string prefix = field_text(block + 345, 155);
      if (!prefix.empty()) name = prefix + "/" + name;
    }
    if (long_name) name = *long_name;

    if (type == 'L' || type == 'x') {  // metadata for the next header
      std::string payload = read_bytes(*header_size, "(long name)");
      skip_bytes(padded(*header_size) - *header_size, "(long name)");
      if (type == 'L') {
        long_name = std::string(payload.c_str());
      } else {
        std::optional<std::string> path;
        std::optional<uint64_t> pax_size;
        parse_pax(payload, path, pax_size);
        if (path) long_name = path;
        if (pax_size) {
          has_size_override = true;
          next_size_override = *pax_size;
        }
      }
      continue;
    }
    if (type != '0' && type != '\0' && type != '7') {  // directories, links, global pax headers, …
      skip_bytes(padded(*header_size), name);
      long_name.reset();
      has_size_override = false;
      continue;
    }
    TarMember member{name, size, header_offset, {}};
    damaged_member_ = name;  // until its bytes are all there
    if (want_data) {
      member.data = read_bytes(size, name);
      skip_bytes(padded(size) - size, name);
    } else {
      skip_bytes(padded(size), name);
    }
    damaged_member_.clear();
    return member;
  }
}

TarWriter::TarWriter(std::string path) : path_(std::move(path)), tmp_path_(path_ + ".tmp") {
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw DataError(fmt::format("{}: cannot create: {}", tmp_path_, std::strerror(errno)));
}

TarWriter::~TarWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

void TarWriter::write(const char* data, size_t n) {
  while (n > 0) {
    const ssize_t put = ::write(fd_, data, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) throw DataError(fmt::format("{}: write failed: {}", tmp_path_, std::strerror(errno)));
    data += put;
    n -= static_cast<size_t>(put);
    bytes_ += static_cast<uint64_t>(put);
  }
}

void TarWriter::write_header(const std::string& name, uint64_t size, char type) {
  char block[kBlock] = {};
  std::memcpy(block, name.data(), std::min<size_t>(name.size(), 100));
  std::snprintf(block + 100, 8, "%07o", 0644);
  std::snprintf(block + 108, 8, "%07o", 0);
  std::snprintf(block + 116, 8, "%07o", 0);
  std::snprintf(block + 124, 12, "%011llo", static_cast<unsigned long long>(size));
  std::snprintf(block + 136, 12, "%011o", 0);
  block[156] = type;
  std::memcpy(block + 257, "ustar", 6);
  std::memcpy(block + 263, "00", 2);
  std::memset(block + 148, ' ', 8);
  unsigned sum = 0;
  for (size_t i = 0; i < kBlock; ++i) sum += static_cast<unsigned char>(block[i]);
  std::snprintf(block + 148, 8, "%06o", sum);  // six digits, NUL, and the space already there
  write(block, kBlock);
}

void TarWriter::add(const std::string& name, const std::string& data) {
  if (size_t{data.size()} >= (uint64_t{1} << 33))
    throw DataError(fmt::format("{}: member '{}' is 8 GiB or more", path_, name));
  if (name.size() > 100) {  // GNU long name: a member carrying the name, then the real header
    write_header("././@LongLink", name.size() + 1, 'L');
    std::string payload = name + '\0';
    payload.resize(padded(payload.size()), '\0');
    write(payload.data(), payload.size());
  }
  write_header(name, data.size(), '0');
  write(data.data(), data.size());
  const std::string pad(padded(data.size()) - data.size(), '\0');
  write(pad.data(), pad.size());
}

void TarWriter::close() {
  const std::string end(2 * kBlock, '\0');
  write(end.data(), end.size());
  if (::fsync(fd_) != 0) throw DataError(fmt::format("{}: fsync failed: {}", tmp_path_, std::strerror(errno)));
  ::close(fd_);
  fd_ = -1;
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    ::unlink(tmp_path_.c_str());
    throw DataError(fmt::format("{}: rename failed: {}", path_, std::strerror(errno)));
  }
}

}  // namespace flowtrain::data
