// safetensors: bitwise round trips for every dtype, byte-level compatibility with the reference
// layout, and rejection of each kind of malformed file with a message that names the problem.
#include "data/data_error.h"
#include "data/safetensors.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <limits>

namespace flowtrain::data {
namespace {

namespace fs = std::filesystem;


std::string le64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(v >> (8 * i));
  return out;
}

// A file with the given header text and `buffer_size` zero bytes of data.
std::string make_file(const std::string& header, size_t buffer_size) {
  return le64(header.size()) + header + std::string(buffer_size, '\0');
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor ca = a.contiguous(), cb = b.contiguous();
  if (ca.numel() == 0) return true;
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.numel() * ca.element_size()) == 0;
}

// Random bytes reinterpreted as `dtype`: covers every bit pattern class (NaNs, subnormals, …)
// for the float types and full-range integers, which value-based generators would not.
at::Tensor random_bits(at::IntArrayRef shape, at::ScalarType dtype) {
  int64_t numel = 1;
  for (const int64_t d : shape) numel *= d;
  const int64_t nbytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
  at::Tensor bytes = at::randint(0, 256, {nbytes}, at::TensorOptions().dtype(at::kByte));
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(dtype));
  if (nbytes > 0) std::memcpy(out.data_ptr(), bytes.data_ptr(), nbytes);
  return out;
}

TEST(SafetensorsTest, RoundTripsEveryDtypeBitwise) {
  at::manual_seed(1);
  const std::string path = test::scratch_dir("st") + "/all.safetensors";
  NamedTensors tensors = {
      {"f64", random_bits({3, 5}, at::kDouble)},
      {"f32", at::randn({4, 3, 2})},
      {"f16", random_bits({7}, at::kHalf)},
      {"bf16", random_bits({2, 9}, at::kBFloat16)},
      {"i64", at::tensor({std::numeric_limits<int64_t>::min(), int64_t{-1}, int64_t{0},
                          std::numeric_limits<int64_t>::max()})},
      {"i32", random_bits({6}, at::kInt)},
      {"i16", random_bits({3, 3}, at::kShort)},
      {"i8", random_bits({5}, at::kChar)},
      {"u8", random_bits({2, 2, 2}, at::kByte)},
      {"bool", at::arange(7) % 3 == 0},
      {"f8_e4m3", random_bits({4, 4}, at::kFloat8_e4m3fn)},
      {"f8_e5m2", random_bits({3, 5}, at::kFloat8_e5m2)},
      {"scalar", at::scalar_tensor(3.25, at::TensorOptions().dtype(at::kFloat))},
      {"empty", at::empty({0, 3}, at::TensorOptions().dtype(at::kFloat))},
      {"transposed", at::arange(12, at::TensorOptions().dtype(at::kFloat)).view({3, 4}).t()},
  };
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"step", "42"}, {"note", "ünïcode ✓"}};
  write_safetensors(path, tensors, metadata);
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  SafetensorsReader reader(path);
  EXPECT_EQ(reader.path(), path);
  EXPECT_EQ(reader.metadata(), metadata);
  ASSERT_EQ(reader.keys().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, expected] = tensors[i];
    SCOPED_TRACE(name);
    EXPECT_EQ(reader.keys()[i], name);  // written in the given order, keys() in offset order
    EXPECT_TRUE(reader.contains(name));
    EXPECT_EQ(reader.dtype(name), expected.scalar_type());
    EXPECT_EQ(reader.shape(name), expected.sizes().vec());
    const at::Tensor got = reader.get(name);
    EXPECT_TRUE(got.is_contiguous());
    EXPECT_TRUE(bitwise_equal(got, expected));
  }
  EXPECT_EQ(reader.get("scalar").dim(), 0);
  EXPECT_EQ(reader.get("scalar").item<float>(), 3.25f);
  EXPECT_FALSE(reader.contains("missing"));

  const NamedTensors all = read_safetensors(path);
  ASSERT_EQ(all.size(), tensors.size());
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i].first, tensors[i].first);
    EXPECT_TRUE(bitwise_equal(all[i].second, tensors[i].second)) << all[i].first;
  }
}

TEST(SafetensorsTest, GetCopiesOutOfTheMapping) {
  const std::string path = test::scratch_dir("st") + "/copy.safetensors";
  write_safetensors(path, {{"x", at::arange(4, at::TensorOptions().dtype(at::kFloat))}});
  at::Tensor x;
  {
    SafetensorsReader reader(path);
    x = reader.get("x");
  }
  fs::remove(path);  // the tensor must not depend on the reader or the file any more
  x.add_(1);
  EXPECT_TRUE(at::equal(x, at::arange(1, 5, at::TensorOptions().dtype(at::kFloat))));
}

TEST(SafetensorsTest, InMemoryBytesAreTheFilesBytes) {
  // A tar member written by `flowtrain data encode` must be the very file write_safetensors writes.
  const NamedTensors tensors = {{"txt", at::randn({3, 5}).to(at::kBFloat16)},
                                {"txt_mask", at::tensor({1, 0, 1}).to(at::kBool)},
                                {"vec", at::arange(7, at::TensorOptions().dtype(at::kFloat))}};
  const std::string path = test::scratch_dir("st") + "/bytes.safetensors";
  write_safetensors(path, tensors, {{"format", "pt"}});
  const std::string bytes = safetensors_bytes(tensors, {{"format", "pt"}});
  EXPECT_EQ(bytes, test::read_file(path));
  const SafetensorsReader back(bytes, "member");
  EXPECT_TRUE(at::equal(back.get("txt"), tensors[0].second));
  EXPECT_THROW(safetensors_bytes({{"a", at::zeros({1})}, {"a", at::zeros({1})}}), DataError);  // the same checks
}

TEST(SafetensorsTest, WrittenHeaderIsAlignedSpacePaddedJson) {
  const std::string path = test::scratch_dir("st") + "/layout.safetensors";
  write_safetensors(path, {{"w", at::ones({3}, at::TensorOptions().dtype(at::kHalf))}}, {{"format", "pt"}});
  const std::string bytes = test::read_file(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ((8 + n) % 8, 0u);
  ASSERT_EQ(bytes.size(), 8 + n + 6);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  const auto last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');
  const auto j = nlohmann::json::parse(header);
  EXPECT_EQ(j["__metadata__"]["format"], "pt");
  EXPECT_EQ(j["w"]["dtype"], "F16");
  EXPECT_EQ(j["w"]["shape"], nlohmann::json::array({3}));
  EXPECT_EQ(j["w"]["data_offsets"], nlohmann::json::array({0, 6}));
  // fp16 1.0 is 0x3c00, little-endian.
  EXPECT_EQ(bytes.substr(8 + n), std::string("\x00\x3c\x00\x3c\x00\x3c", 6));
}

// The bytes the reference implementation (huggingface safetensors) writes for
//   save_file({"weight": torch.tensor([[1., 2.], [3., 4.]]), "bias": torch.tensor([0.5]).bfloat16()},
//             metadata={"format": "pt"})
// : tensors sorted by dtype alignment then name, header padded with spaces to 8 bytes.
TEST(SafetensorsTest, ReadsHandWrittenReferenceLayout) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
      R"("bias":{"dtype":"BF16","shape":[1],"data_offsets":[16,18]}})";
  std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  const std::string data("\x00\x00\x80\x3f"   // 1.0f
                         "\x00\x00\x00\x40"   // 2.0f
                         "\x00\x00\x40\x40"   // 3.0f
                         "\x00\x00\x80\x40"   // 4.0f
                         "\x00\x3f",          // bf16 0.5
                         18);
  const std::string path = test::scratch_dir("st") + "/reference.safetensors";
  test::write_file(path, le64(padded.size()) + padded + data);

  SafetensorsReader reader(path);
  EXPECT_EQ(reader.keys(), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(reader.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_EQ(reader.dtype("weight"), at::kFloat);
  EXPECT_EQ(reader.shape("weight"), (std::vector<int64_t>{2, 2}));
  EXPECT_TRUE(at::equal(reader.get("weight"), at::tensor({1.f, 2.f, 3.f, 4.f}).view({2, 2})));
  const at::Tensor bias = reader.get("bias");
  EXPECT_EQ(bias.scalar_type(), at::kBFloat16);
  EXPECT_EQ(bias.sizes(), at::IntArrayRef({1}));
  EXPECT_EQ(bias.to(at::kFloat).item<float>(), 0.5f);
}

TEST(SafetensorsTest, RejectsBadHeaderLength) {
  const std::string dir = test::scratch_dir("st");
  const std::string too_big = dir + "/too_big.safetensors";
  test::write_file(too_big, le64(200'000'000) + "{}");
  EXPECT_DATA_ERROR(SafetensorsReader{too_big}, "exceeds the limit of 100000000 bytes");
  EXPECT_DATA_ERROR(SafetensorsReader{too_big}, too_big);

  const std::string beyond = dir + "/beyond.safetensors";
  test::write_file(beyond, le64(1000) + std::string("{}") + std::string(90, ' '));
  EXPECT_DATA_ERROR(SafetensorsReader{beyond}, "header length 1000 extends beyond the file size of 100 bytes");
}

TEST(SafetensorsTest, RejectsTruncatedFile) {
  const std::string dir = test::scratch_dir("st");
  const std::string path = dir + "/t.safetensors";
  write_safetensors(path, {{"a", at::ones({4})}, {"b", at::ones({4})}});
  const std::string bytes = test::read_file(path);

  const std::string cut_data = dir + "/cut_data.safetensors";
  test::write_file(cut_data, bytes.substr(0, bytes.size() - 3));
  EXPECT_DATA_ERROR(SafetensorsReader{cut_data}, "tensor 'b' data_offsets [16,32] are out of the data buffer of 29 bytes");
  EXPECT_DATA_ERROR(SafetensorsReader{cut_data}, cut_data);

  const std::string cut_header = dir + "/cut_header.safetensors";
  test::write_file(cut_header, bytes.substr(0, 20));
  EXPECT_DATA_ERROR(SafetensorsReader{cut_header}, "extends beyond the file size of 20 bytes");

  const std::string tiny = dir + "/tiny.safetensors";
  test::write_file(tiny, bytes.substr(0, 5));
  EXPECT_DATA_ERROR(SafetensorsReader{tiny}, "file is 5 bytes, shorter than the 8-byte header length field");

  EXPECT_DATA_ERROR(SafetensorsReader{dir + "/missing.safetensors"}, "cannot open safetensors file " + dir + "/missing.safetensors");
}

TEST(SafetensorsTest, RejectsOverlappingOffsets) {
  const std::string path = test::scratch_dir("st") + "/overlap.safetensors";
  test::write_file(path, make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                   12));
  EXPECT_DATA_ERROR(SafetensorsReader{path}, "tensor 'b' at data_offsets [4, 12] overlaps tensor 'a'");
}

TEST(SafetensorsTest, RejectsGaps) {
  const std::string dir = test::scratch_dir("st");
  const std::string inner = dir + "/gap.safetensors";
  test::write_file(inner, make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                                    20));
  EXPECT_DATA_ERROR(SafetensorsReader{inner}, "gap of 4 bytes in the data buffer at [8, 12) before tensor 'b'");

  const std::string leading = dir + "/leading.safetensors";
  test::write_file(leading, make_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", 4));
  EXPECT_DATA_ERROR(SafetensorsReader{leading}, "gap of 2 bytes in the data buffer at [0, 2)");

  const std::string trailing = dir + "/trailing.safetensors";
  test::write_file(trailing, make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12));
  EXPECT_DATA_ERROR(SafetensorsReader{trailing}, "gap of 4 bytes at the end of the data buffer");
}

TEST(SafetensorsTest, RejectsShapeSizeMismatch) {
  const std::string path = test::scratch_dir("st") + "/mismatch.safetensors";
  test::write_file(path, make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8));
  EXPECT_DATA_ERROR(SafetensorsReader{path}, "tensor 'a' shape [3] of dtype F32 needs 12 bytes, but data_offsets [0,8] span 8");
}

TEST(SafetensorsTest, RejectsDuplicateKeys) {
  const std::string dir = test::scratch_dir("st");
  const std::string top = dir + "/dup.safetensors";
  test::write_file(top, make_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                  R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                                  2));
  EXPECT_DATA_ERROR(SafetensorsReader{top}, "duplicate key 'a' in the header");

  const std::string nested = dir + "/dup_meta.safetensors";
  test::write_file(nested, make_file(R"({"__metadata__":{"k":"1","k":"2"}})", 0));
  EXPECT_DATA_ERROR(SafetensorsReader{nested}, "duplicate key 'k'");

  // The same key in different objects is fine.
  const std::string ok = dir + "/ok.safetensors";
  test::write_file(ok, make_file(R"({"__metadata__":{"dtype":"x"},"dtype":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1));
  EXPECT_EQ(SafetensorsReader(ok).keys(), std::vector<std::string>{"dtype"});
}

TEST(SafetensorsTest, RejectsNonJsonHeader) {
  const std::string dir = test::scratch_dir("st");
  const std::string garbage = dir + "/garbage.safetensors";
  test::write_file(garbage, make_file("{not json at all}", 0));
  EXPECT_DATA_ERROR(SafetensorsReader{garbage}, "header is not valid UTF-8 JSON");
  EXPECT_DATA_ERROR(SafetensorsReader{garbage}, garbage);

  const std::string array = dir + "/array.safetensors";
  test::write_file(array, make_file("[1, 2]", 0));
  EXPECT_DATA_ERROR(SafetensorsReader{array}, "header is not a JSON object");

  const std::string bad_utf8 = dir + "/utf8.safetensors";
  test::write_file(bad_utf8, make_file("{\"__metadata__\":{\"k\":\"\xff\xfe\"}}", 0));
  EXPECT_DATA_ERROR(SafetensorsReader{bad_utf8}, "header is not valid UTF-8 JSON");
}

TEST(SafetensorsTest, RejectsUnknownDtype) {
  const std::string path = test::scratch_dir("st") + "/dtype.safetensors";
  test::write_file(path, make_file(R"({"a":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})", 8));
  EXPECT_DATA_ERROR(SafetensorsReader{path}, "tensor 'a' has unknown dtype \"C64\"");
}

TEST(SafetensorsTest, RejectsMalformedEntries) {
  const std::string dir = test::scratch_dir("st");
  const auto check = [&](const std::string& name, const std::string& header, size_t buffer, const std::string& expected) {
    const std::string path = dir + "/" + name + ".safetensors";
    test::write_file(path, make_file(header, buffer));
    EXPECT_DATA_ERROR(SafetensorsReader{path}, expected);
  };
  check("meta_int", R"({"__metadata__":{"step":1}})", 0, "__metadata__ value of 'step' must be a string, got 1");
  check("meta_array", R"({"__metadata__":["a"]})", 0, "__metadata__ must be an object of strings");
  check("negative", R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1, "shape entry must be a non-negative integer");
  check("float_offset", R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1.0]}})", 1, "data_offsets end must be a non-negative integer");
  check("no_shape", R"({"a":{"dtype":"U8","data_offsets":[0,1]}})", 1, "tensor 'a' has no \"shape\" field");
  check("reversed", R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[1,0]}})", 1, "end before they begin");
  check("not_object", R"({"a":[1]})", 0, "tensor 'a' must be an object");
  check("leading_space", R"( {})", 0, "header is not a JSON object");
}

TEST(SafetensorsTest, GetOfUnknownNameAndBadBoolBytes) {
  const std::string dir = test::scratch_dir("st");
  const std::string path = dir + "/x.safetensors";
  write_safetensors(path, {{"x", at::ones({2})}});
  SafetensorsReader reader(path);
  EXPECT_DATA_ERROR(reader.get("y"), "no tensor named 'y'");
  EXPECT_DATA_ERROR(reader.shape("y"), path);

  const std::string bools = dir + "/bool.safetensors";
  const std::string header = R"({"b":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})";
  test::write_file(bools, le64(header.size()) + header + std::string("\x01\x07", 2));
  EXPECT_DATA_ERROR(SafetensorsReader(bools).get("b"), "holds byte 7 (expected 0 or 1)");
}

TEST(SafetensorsTest, WriterRejectsBadInput) {
  const std::string dir = test::scratch_dir("st");
  const std::string path = dir + "/w.safetensors";
  EXPECT_DATA_ERROR(write_safetensors(path, {{"a", at::ones({1})}, {"a", at::ones({1})}}), "duplicate tensor name 'a'");
  EXPECT_DATA_ERROR(write_safetensors(path, {{"__metadata__", at::ones({1})}}), "'__metadata__' is reserved");
  EXPECT_DATA_ERROR(write_safetensors(path, {{"c", at::ones({1}, at::TensorOptions().dtype(at::kComplexFloat))}}),
                    "which safetensors cannot store");
  EXPECT_DATA_ERROR(write_safetensors(dir + "/no/such/dir/x.safetensors", {{"a", at::ones({1})}}), "cannot create");
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(SafetensorsTest, OverwriteReplacesAtomically) {
  const std::string path = test::scratch_dir("st") + "/o.safetensors";
  write_safetensors(path, {{"a", at::zeros({100})}});
  write_safetensors(path, {{"b", at::ones({2})}});
  SafetensorsReader reader(path);
  EXPECT_EQ(reader.keys(), std::vector<std::string>{"b"});
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST(SafetensorsTest, WritesCudaTensors) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const std::string path = test::scratch_dir("st") + "/cuda.safetensors";
  const at::Tensor cpu = at::randn({3, 4}).to(at::kBFloat16);
  write_safetensors(path, {{"x", cpu.to(at::kCUDA)}});
  EXPECT_TRUE(bitwise_equal(SafetensorsReader(path).get("x"), cpu));
}

}  // namespace
}  // namespace flowtrain::data
