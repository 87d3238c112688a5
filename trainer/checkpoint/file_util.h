// Small durable-file helpers: whole-file atomic writes, directory fsync, checksums.
#pragma once

#include <cstdint>
#include <string>

namespace flowtrain::trainer {

// Writes `bytes` to path + ".tmp", fsyncs, renames over `path`, fsyncs the directory.
void write_file_atomic(const std::string& path, const std::string& bytes);
std::string read_text_file(const std::string& path);  // throws std::runtime_error naming the path
// fsync a directory so that renames/creations inside it survive a crash.
void fsync_directory(const std::string& dir);
// CRC-32 (zlib polynomial) of a whole file, and its size.
struct FileDigest { uint64_t bytes = 0; uint32_t crc32 = 0; };
FileDigest digest_file(const std::string& path);

}  // namespace flowtrain::trainer
