// TensorBoard event files, read back by an independent reader written here: a bitwise CRC32C
// (no table, checked against the RFC 3720 vectors) and a generic protobuf wire-format decoder,
// so a shared misunderstanding of the format cannot make writer and test agree.
#include "data/png.h"
#include "test_util.h"
#include "trainer/telemetry/tensorboard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <vector>

namespace flowtrain::trainer {
namespace {

namespace fs = std::filesystem;

// ---- Independent CRC32C: bit at a time, straight from the definition ----------------------
uint32_t reference_crc32c(const std::string& bytes) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char byte : bytes) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1u) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

uint32_t reference_masked(const std::string& bytes) {
  const uint32_t crc = reference_crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

uint64_t read_le(const std::string& bytes, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t{static_cast<unsigned char>(bytes.at(at + i))} << (8 * i);
  return v;
}

// ---- Independent protobuf wire-format decoder ---------------------------------------------
struct Field {
  uint32_t number = 0;
  uint32_t wire = 0;
  uint64_t scalar = 0;  // varint, fixed64 or fixed32 bits
  std::string bytes;    // length-delimited payload
};

uint64_t read_varint(const std::string& s, size_t& pos) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (pos >= s.size()) throw std::runtime_error("truncated varint");
    const auto byte = static_cast<unsigned char>(s[pos++]);
    v |= uint64_t{byte & 0x7fu} << shift;
    if (!(byte & 0x80)) return v;
  }
  throw std::runtime_error("varint longer than 10 bytes");
}

std::vector<Field> decode(const std::string& message) {
  std::vector<Field> fields;
  size_t pos = 0;
  while (pos < message.size()) {
    const uint64_t key = read_varint(message, pos);
    Field f;
    f.number = static_cast<uint32_t>(key >> 3);
    f.wire = static_cast<uint32_t>(key & 7);
    switch (f.wire) {
      case 0: f.scalar = read_varint(message, pos); break;
      case 1: f.scalar = read_le(message, pos, 8); pos += 8; break;
      case 5: f.scalar = read_le(message, pos, 4); pos += 4; break;
      case 2: {
        const uint64_t n = read_varint(message, pos);
        if (pos + n > message.size()) throw std::runtime_error("length-delimited field past the end");
        f.bytes = message.substr(pos, n);
        pos += n;
        break;
      }
      default: throw std::runtime_error("unexpected wire type " + std::to_string(f.wire));
    }
    if (pos > message.size()) throw std::runtime_error("fixed field past the end");
    fields.push_back(std::move(f));
  }
  return fields;
}

double as_double(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}
float as_float(uint64_t bits) {
  const auto b32 = static_cast<uint32_t>(bits);
  float f;
  std::memcpy(&f, &b32, 4);
  return f;
}

// The decoded subset of tensorflow.Event this writer produces.
struct Image {
  int64_t height = 0, width = 0, colorspace = 0;
  std::string png;
};
struct Value {
  std::string tag;
  bool has_simple_value = false;
  float simple_value = 0;
  bool has_image = false;
  Image image;
};
struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<Value> values;
};

Event parse_event(const std::string& data) {
  Event e;
  for (const Field& f : decode(data)) {
    if (f.number == 1 && f.wire == 1) e.wall_time = as_double(f.scalar);
    else if (f.number == 2 && f.wire == 0) e.step = static_cast<int64_t>(f.scalar);
    else if (f.number == 3 && f.wire == 2) e.file_version = f.bytes;
    else if (f.number == 5 && f.wire == 2) {
      for (const Field& sf : decode(f.bytes)) {
        if (sf.number != 1 || sf.wire != 2) throw std::runtime_error("unexpected Summary field");
        Value v;
        for (const Field& vf : decode(sf.bytes)) {
          if (vf.number == 1 && vf.wire == 2) v.tag = vf.bytes;
          else if (vf.number == 2 && vf.wire == 5) v.has_simple_value = true, v.simple_value = as_float(vf.scalar);
          else if (vf.number == 4 && vf.wire == 2) {
            v.has_image = true;
            for (const Field& imf : decode(vf.bytes)) {
              if (imf.number == 1 && imf.wire == 0) v.image.height = static_cast<int64_t>(imf.scalar);
              else if (imf.number == 2 && imf.wire == 0) v.image.width = static_cast<int64_t>(imf.scalar);
              else if (imf.number == 3 && imf.wire == 0) v.image.colorspace = static_cast<int64_t>(imf.scalar);
              else if (imf.number == 4 && imf.wire == 2) v.image.png = imf.bytes;
              else throw std::runtime_error("unexpected Image field " + std::to_string(imf.number));
            }
          } else throw std::runtime_error("unexpected Value field " + std::to_string(vf.number));
        }
        e.values.push_back(std::move(v));
      }
    } else throw std::runtime_error("unexpected Event field " + std::to_string(f.number));
  }
  return e;
}

// Reads every record, checking both CRCs and that the file ends exactly after the last record.
std::vector<Event> read_events(const std::string& path) {
  const std::string file = test::read_file(path);
  std::vector<Event> events;
  size_t pos = 0;
  while (pos < file.size()) {
    if (pos + 12 > file.size()) throw std::runtime_error("truncated record header");
    const uint64_t length = read_le(file, pos, 8);
    if (read_le(file, pos + 8, 4) != reference_masked(file.substr(pos, 8)))
      throw std::runtime_error("bad length CRC at offset " + std::to_string(pos));
    if (pos + 12 + length + 4 > file.size()) throw std::runtime_error("truncated record");
    const std::string data = file.substr(pos + 12, length);
    if (read_le(file, pos + 12 + length, 4) != reference_masked(data))
      throw std::runtime_error("bad data CRC at offset " + std::to_string(pos));
    events.push_back(parse_event(data));
    pos += 12 + length + 4;
  }
  return events;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

at::Tensor random_u8(at::IntArrayRef shape) {
  return at::randint(0, 256, shape, at::TensorOptions().dtype(at::kByte));
}

at::Tensor decode_png_bytes(const std::string& png, const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name;
  test::write_file(path, png);
  return data::read_png(path);
}

TEST(TensorBoardTest, Crc32cMatchesKnownVectors) {
  // RFC 3720 (iSCSI) appendix B.4 and the usual check value.
  const std::string ascending = [] {
    std::string s;
    for (int i = 0; i < 32; ++i) s.push_back(static_cast<char>(i));
    return s;
  }();
  const std::vector<std::pair<std::string, uint32_t>> vectors = {
      {"123456789", 0xE3069283u},
      {std::string(32, '\0'), 0x8A9136AAu},
      {std::string(32, '\xff'), 0x62A8AB43u},
      {ascending, 0x46DD794Eu},
      {"", 0u},
  };
  for (const auto& [bytes, expected] : vectors) {
    EXPECT_EQ(reference_crc32c(bytes), expected) << "reference, " << bytes.size() << " bytes";
    EXPECT_EQ(crc32c(bytes.data(), bytes.size()), expected) << "writer, " << bytes.size() << " bytes";
  }
}

TEST(TensorBoardTest, WritesScalarsAndImagesTensorBoardCanRead) {
  at::manual_seed(7);
  const std::string dir = test::scratch_dir("tb") + "/tb";  // created by the writer
  const at::Tensor gray = random_u8({5, 7});
  const at::Tensor rgb = random_u8({3, 4, 3});
  const int64_t big_step = (int64_t{1} << 40) + 3;  // a 6-byte varint
  const double before = now_seconds();
  std::string path;
  {
    TensorBoardWriter writer(dir);
    path = writer.path();
    writer.add_scalar("train/loss", 0.5, 1);
    writer.add_scalars({{"train/lr", 1e-4}, {"train/grad_norm", 2.25}}, 2);
    writer.add_image("samples/gray", gray, 3);
    writer.add_image("samples/rgb", rgb, 4);
    writer.add_scalar("train/loss", -3.75, big_step);
  }
  const double after = now_seconds();

  // events.out.tfevents.<unix seconds>.<hostname>.<pid>.flowtrain
  const std::string name = fs::path(path).filename().string();
  EXPECT_EQ(fs::path(path).parent_path(), fs::path(dir));
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_NE(name.find("." + std::to_string(::getpid()) + ".flowtrain"), std::string::npos) << name;
  const int64_t stamp = std::stoll(name.substr(std::strlen("events.out.tfevents.")));
  EXPECT_GE(stamp, static_cast<int64_t>(before) - 1);
  EXPECT_LE(stamp, static_cast<int64_t>(after) + 1);

  const std::vector<Event> events = read_events(path);
  ASSERT_EQ(events.size(), 6u);
  for (const Event& e : events) {
    EXPECT_GE(e.wall_time, before - 1);
    EXPECT_LE(e.wall_time, after + 1);
  }

  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_TRUE(events[0].values.empty());

  ASSERT_EQ(events[1].values.size(), 1u);
  EXPECT_EQ(events[1].step, 1);
  EXPECT_EQ(events[1].values[0].tag, "train/loss");
  EXPECT_TRUE(events[1].values[0].has_simple_value);
  EXPECT_EQ(events[1].values[0].simple_value, 0.5f);

  // Both scalars of one step share an Event (std::map order).
  ASSERT_EQ(events[2].values.size(), 2u);
  EXPECT_EQ(events[2].step, 2);
  EXPECT_EQ(events[2].values[0].tag, "train/grad_norm");
  EXPECT_EQ(events[2].values[0].simple_value, 2.25f);
  EXPECT_EQ(events[2].values[1].tag, "train/lr");
  EXPECT_EQ(events[2].values[1].simple_value, static_cast<float>(1e-4));

  const std::string scratch = test::scratch_dir("tb-png");
  for (int k = 0; k < 2; ++k) {
    const Event& e = events[3 + k];
    const at::Tensor& original = k == 0 ? gray : rgb;
    SCOPED_TRACE(k == 0 ? "gray" : "rgb");
    EXPECT_EQ(e.step, 3 + k);
    ASSERT_EQ(e.values.size(), 1u);
    const Value& v = e.values[0];
    EXPECT_EQ(v.tag, k == 0 ? "samples/gray" : "samples/rgb");
    EXPECT_FALSE(v.has_simple_value);
    ASSERT_TRUE(v.has_image);
    EXPECT_EQ(v.image.height, original.size(0));
    EXPECT_EQ(v.image.width, original.size(1));
    EXPECT_EQ(v.image.colorspace, k == 0 ? 1 : 3);
    EXPECT_EQ(v.image.png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
    EXPECT_TRUE(at::equal(decode_png_bytes(v.image.png, scratch, k == 0 ? "g.png" : "c.png"), original));
  }

  EXPECT_EQ(events[5].step, big_step);
  EXPECT_EQ(events[5].values.at(0).simple_value, -3.75f);
}

TEST(TensorBoardTest, EveryAddIsOnDiskBeforeTheWriterCloses) {
  // A crash right after add_* must not lose it: read the file while the writer is still open.
  TensorBoardWriter writer(test::scratch_dir("tb"));
  EXPECT_EQ(read_events(writer.path()).size(), 1u);  // file_version
  writer.add_scalar("a", 1.0, 1);
  EXPECT_EQ(read_events(writer.path()).size(), 2u);
  writer.add_image("img", at::zeros({2, 2}, at::TensorOptions().dtype(at::kByte)), 1);
  EXPECT_EQ(read_events(writer.path()).size(), 3u);
  writer.add_scalars({}, 2);  // nothing to write
  EXPECT_EQ(read_events(writer.path()).size(), 3u);
}

TEST(TensorBoardTest, WritersInOneDirectoryNeverShareAFile) {
  // Same second, same process: a restarted writer must not truncate the first one's events.
  const std::string dir = test::scratch_dir("tb");
  TensorBoardWriter first(dir);
  first.add_scalar("x", 1.0, 1);
  TensorBoardWriter second(dir);
  second.add_scalar("x", 2.0, 2);
  EXPECT_NE(first.path(), second.path());
  EXPECT_NE(fs::path(second.path()).filename().string().find("tfevents"), std::string::npos);
  EXPECT_EQ(read_events(first.path()).size(), 2u);
  EXPECT_EQ(read_events(second.path()).size(), 2u);
}

TEST(TensorBoardTest, BadImagesAndDirectoriesNameTheFile) {
  const std::string dir = test::scratch_dir("tb");
  TensorBoardWriter writer(dir);
  try {
    writer.add_image("samples", at::zeros({4, 4}), 1);  // float, not uint8
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(writer.path()), std::string::npos) << message;
    EXPECT_NE(message.find("'samples'"), std::string::npos) << message;
    EXPECT_NE(message.find("expected a uint8 image"), std::string::npos) << message;
  }
  EXPECT_EQ(read_events(writer.path()).size(), 1u);  // nothing half-written

  test::write_file(dir + "/not_a_dir", "x");
  try {
    TensorBoardWriter bad(dir + "/not_a_dir/tb");
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/not_a_dir/tb"), std::string::npos) << e.what();
  }
}

TEST(PngEncodeTest, MatchesWritePngAndRoundTrips) {
  at::manual_seed(11);
  const std::string dir = test::scratch_dir("png");
  for (const auto& image : {random_u8({13, 9}), random_u8({6, 10, 3}), random_u8({3, 5, 4}).narrow(2, 0, 3)}) {
    SCOPED_TRACE(c10::str(image.sizes()));
    const std::string bytes = data::encode_png(image);
    data::write_png(dir + "/w.png", image);
    EXPECT_EQ(bytes, test::read_file(dir + "/w.png"));  // one encoder behind both
    EXPECT_TRUE(at::equal(decode_png_bytes(bytes, dir, "e.png"), image));
  }
}

}  // namespace
}  // namespace flowtrain::trainer
