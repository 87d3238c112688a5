#include "trainer/telemetry/tensorboard.h"

#include "data/data_error.h"
#include "data/png.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace flowtrain::trainer {
namespace {

// ---- CRC32C -------------------------------------------------------------------------------
// Reflected Castagnoli polynomial; one 256-entry table built at compile time.
constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
    table[i] = crc;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// TFRecord stores a rotated-and-offset CRC so that a CRC of data that itself contains CRCs
// does not degenerate (the scheme LevelDB introduced).
uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t crc = crc32c(bytes.data(), bytes.size());
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

// ---- Minimal protobuf encoder -------------------------------------------------------------
// Only what tensorflow.Event needs. Wire types: 0 varint, 1 fixed64, 2 length-delimited,
// 5 fixed32. Fixed-width values are little-endian, written byte by byte so the host's byte
// order does not matter.
enum Wire : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void put_key(std::string& out, uint32_t field, Wire wire) { put_varint(out, (uint64_t{field} << 3) | wire); }

void put_le(std::string& out, uint64_t bits, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

// int32/int64 fields: negative values are their 64-bit two's complement (10 bytes), per the spec.
void put_int(std::string& out, uint32_t field, int64_t value) {
  put_key(out, field, kVarint);
  put_varint(out, static_cast<uint64_t>(value));
}

void put_double(std::string& out, uint32_t field, double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  put_key(out, field, kFixed64);
  put_le(out, bits, 8);
}

void put_float(std::string& out, uint32_t field, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  put_key(out, field, kFixed32);
  put_le(out, bits, 4);
}

// string, bytes and embedded messages.
void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}

// Field numbers of tensorflow/core/util/event.proto and framework/summary.proto.
namespace event_field {
constexpr uint32_t kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5;
}
namespace summary_field {
constexpr uint32_t kValue = 1;
}
namespace value_field {
constexpr uint32_t kTag = 1, kSimpleValue = 2, kImage = 4;
}
namespace image_field {
constexpr uint32_t kHeight = 1, kWidth = 2, kColorspace = 3, kEncoded = 4;
}

std::string scalar_value(const std::string& tag, double v) {
  std::string out;
  put_bytes(out, value_field::kTag, tag);
  put_float(out, value_field::kSimpleValue, static_cast<float>(v));
  return out;
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < size; ++i) crc = kCrc32cTable[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::runtime_error("cannot create TensorBoard directory " + dir + ": " + ec.message());

  // TensorBoard's own naming; the pid keeps ranks and restarts apart. "x" (exclusive create)
  // makes a second writer in the same second and process pick a new name instead of
  // truncating the first one's events.
  const std::string base = (std::filesystem::path(dir) / "events.out.tfevents.").string() +
                           std::to_string(static_cast<int64_t>(unix_seconds())) + "." + hostname() + "." +
                           std::to_string(::getpid()) + ".flowtrain";
  for (int n = 0; !file_; ++n) {
    path_ = n == 0 ? base : base + "." + std::to_string(n);
    file_.reset(std::fopen(path_.c_str(), "wbx"));
    if (!file_ && (errno != EEXIST || n >= 1000))
      throw std::runtime_error("cannot create TensorBoard event file " + path_ + ": " + std::strerror(errno));
  }

  std::string first;
  put_double(first, event_field::kWallTime, unix_seconds());
  put_int(first, event_field::kStep, 0);
  put_bytes(first, event_field::kFileVersion, "brain.Event:2");
  write_record(first);
  flush();
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  std::string summary;
  put_bytes(summary, summary_field::kValue, scalar_value(tag, value));
  write_event(step, event_field::kSummary, summary);
}

void TensorBoardWriter::add_scalars(const std::map<std::string, double>& values, int64_t step) {
  if (values.empty()) return;
  std::string summary;
  for (const auto& [tag, v] : values) put_bytes(summary, summary_field::kValue, scalar_value(tag, v));
  write_event(step, event_field::kSummary, summary);
}

void TensorBoardWriter::add_image(const std::string& tag, const at::Tensor& image_uint8, int64_t step) {
  std::string png;
  try {
    png = data::encode_png(image_uint8);
  } catch (const data::DataError& e) {
    throw std::runtime_error("TensorBoard event file " + path_ + ", image '" + tag + "': " + e.what());
  }
  std::string img;
  put_int(img, image_field::kHeight, image_uint8.size(0));
  put_int(img, image_field::kWidth, image_uint8.size(1));
  put_int(img, image_field::kColorspace, image_uint8.dim() == 3 ? 3 : 1);  // 1 gray, 3 RGB
  put_bytes(img, image_field::kEncoded, png);
  std::string v;
  put_bytes(v, value_field::kTag, tag);
  put_bytes(v, value_field::kImage, img);
  std::string summary;
  put_bytes(summary, summary_field::kValue, v);
  write_event(step, event_field::kSummary, summary);
}

void TensorBoardWriter::flush() {
  if (std::fflush(file_.get()) != 0)
    throw std::runtime_error("cannot write TensorBoard event file " + path_ + ": " + std::strerror(errno));
}

void TensorBoardWriter::write_event(int64_t step, uint32_t field, std::string_view payload) {
  std::string event;
  put_double(event, event_field::kWallTime, unix_seconds());
  put_int(event, event_field::kStep, step);
  put_bytes(event, field, payload);
  write_record(event);
  flush();
}

void TensorBoardWriter::write_record(std::string_view data) {
  std::string record;
  record.reserve(data.size() + 16);
  put_le(record, data.size(), 8);
  put_le(record, masked_crc32c(std::string_view(record.data(), 8)), 4);
  record.append(data.data(), data.size());
  put_le(record, masked_crc32c(data), 4);
  if (std::fwrite(record.data(), 1, record.size(), file_.get()) != record.size())
    throw std::runtime_error("cannot write TensorBoard event file " + path_ + ": " + std::strerror(errno));
}

}  // namespace flowtrain::trainer
