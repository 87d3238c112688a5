// The shard formats: brace patterns, tar reading and writing (ustar, GNU long names, pax, as GNU
// tar writes them), WebDataset grouping, damage detection, the index, the stream arithmetic.
#include "data/data_error.h"
#include "data/jpeg.h"
#include "data/png.h"
#include "data/shards/brace_expand.h"
#include "data/shards/byte_stream.h"
#include "data/shards/shard_index.h"
#include "data/shards/shard_list.h"
#include "data/shards/stream_plan.h"
#include "data/shards/tar.h"
#include "data/shards/webdataset.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <set>

using namespace flowtrain::data;
using flowtrain::test::data_error_message;
using flowtrain::test::read_file;
using flowtrain::test::scratch_dir;
using flowtrain::test::write_file;
namespace fs = std::filesystem;

TEST(BraceExpand, RangesListsAndPadding) {
  EXPECT_EQ(expand_braces("a.tar"), (std::vector<std::string>{"a.tar"}));
  EXPECT_EQ(expand_braces("s-{000..002}.tar"), (std::vector<std::string>{"s-000.tar", "s-001.tar", "s-002.tar"}));
  EXPECT_EQ(expand_braces("s-{8..10}"), (std::vector<std::string>{"s-8", "s-9", "s-10"}));  // no padding
  EXPECT_EQ(expand_braces("{a,b}/{0..1}"), (std::vector<std::string>{"a/0", "a/1", "b/0", "b/1"}));
  EXPECT_EQ(expand_braces("/d/train-{000000..004095}.tar").size(), 4096u);
  EXPECT_EQ(expand_braces("/d/train-{000000..004095}.tar").back(), "/d/train-004095.tar");
  EXPECT_NE(data_error_message([] { expand_braces("s-{1..3"); }).find("not closed"), std::string::npos);
  EXPECT_NE(data_error_message([] { expand_braces("s-}"); }).find("closes no group"), std::string::npos);
  EXPECT_NE(data_error_message([] { expand_braces("s-{3..1}"); }).find("descending"), std::string::npos);
  EXPECT_NE(data_error_message([] { expand_braces("s-{}"); }).find("empty"), std::string::npos);
  EXPECT_NE(data_error_message([] { expand_braces("s-{a..c}"); }).find("integers"), std::string::npos);
}

TEST(ShardList, ResolvesPatternsAndListFilesAndRejectsBadEntries) {
  const std::string dir = scratch_dir("shard_list");
  for (const char* n : {"a-0.tar", "a-1.tar", "b.tar"}) write_file(dir + "/" + n, "x");
  write_file(dir + "/list.txt", "# comment\n\n" + dir + "/b.tar\n  http://host/c.tar  \n");
  const auto entries = resolve_shard_list({dir + "/a-{0..1}.tar"}, dir + "/list.txt");
  EXPECT_EQ(entries, (std::vector<std::string>{dir + "/a-0.tar", dir + "/a-1.tar", dir + "/b.tar", "http://host/c.tar"}));
  EXPECT_NE(data_error_message([&] { resolve_shard_list({}, ""); }).find("no shards"), std::string::npos);
  EXPECT_NE(data_error_message([&] { resolve_shard_list({""}, ""); }).find("empty pattern"), std::string::npos);
  EXPECT_NE(data_error_message([&] { resolve_shard_list({dir + "/a-{0..2}.tar"}, ""); }).find("a-2.tar does not exist"),
            std::string::npos);
  EXPECT_NE(data_error_message([&] { resolve_shard_list({dir + "/b.tar", dir + "/b.tar"}, ""); }).find("twice"),
            std::string::npos);
  EXPECT_NE(data_error_message([&] { resolve_shard_list({}, dir + "/missing.txt"); }).find("data.shard_list"),
            std::string::npos);
  EXPECT_EQ(shard_basename("http://h/x/train-7.tar?sig=1"), "train-7.tar");
  EXPECT_EQ(shard_basename("pipe:aws s3 cp s3://bucket/dir/train-7.tar -"), "train-7.tar");
  EXPECT_EQ(shard_basename("/a/b/train-7.tar"), "train-7.tar");
}

TEST(Tar, WriterOutputReadsBackWithLongNamesAndDetectsDamage) {
  const std::string dir = scratch_dir("tar_roundtrip");
  const std::string long_name = std::string(120, 'k') + ".txt";
  {
    TarWriter w(dir + "/t.tar");
    w.add("a.txt", "hello");
    w.add(long_name, std::string(1000, 'z'));
    w.add("empty.bin", "");
    w.close();
  }
  EXPECT_FALSE(fs::exists(dir + "/t.tar.tmp"));
  auto stream = open_shard(dir + "/t.tar");
  TarReader r(*stream);
  auto a = r.next();
  ASSERT_TRUE(a);
  EXPECT_EQ(a->name, "a.txt");
  EXPECT_EQ(a->data, "hello");
  auto b = r.next();
  ASSERT_TRUE(b);
  EXPECT_EQ(b->name, long_name);
  EXPECT_EQ(b->data, std::string(1000, 'z'));
  auto c = r.next();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->data, "");
  EXPECT_FALSE(r.next());

  // GNU tar reads what TarWriter wrote: the same names (interoperability, not just a round trip).
  const std::string listing = dir + "/listing.txt";
  ASSERT_EQ(std::system(("tar -tf " + dir + "/t.tar > " + listing).c_str()), 0);
  EXPECT_EQ(read_file(listing), "a.txt\n" + long_name + "\nempty.bin\n");

  const std::string bytes = read_file(dir + "/t.tar");
  // Cut inside the second member's data: the first member comes back, then the damage is named.
  write_file(dir + "/cut.tar", bytes.substr(0, 512 * 4 + 100));
  auto cut = open_shard(dir + "/cut.tar");
  TarReader rc(*cut);
  EXPECT_EQ(rc.next()->name, "a.txt");
  EXPECT_NE(data_error_message([&] { rc.next(); }).find("truncated"), std::string::npos);
  // Cut exactly at a member boundary: no end-of-archive block.
  write_file(dir + "/boundary.tar", bytes.substr(0, 1024));
  auto boundary = open_shard(dir + "/boundary.tar");
  TarReader rb(*boundary);
  EXPECT_EQ(rb.next()->name, "a.txt");
  EXPECT_NE(data_error_message([&] { rb.next(); }).find("no end-of-archive"), std::string::npos);
  // A flipped byte in a header: the checksum names it.
  std::string flipped = bytes;
  flipped[3] ^= 0x20;
  write_file(dir + "/flipped.tar", flipped);
  auto f = open_shard(dir + "/flipped.tar");
  TarReader rf(*f);
  EXPECT_NE(data_error_message([&] { rf.next(); }).find("checksum"), std::string::npos);
}

TEST(Tar, ReadsGnuTarPaxAndGnuFormats) {
  const std::string dir = scratch_dir("tar_gnu");
  fs::create_directories(dir + "/src/sub");
  const std::string long_base = std::string(130, 'p');
  write_file(dir + "/src/sub/" + long_base + ".jpg", "JPEGDATA");
  write_file(dir + "/src/sub/" + long_base + ".txt", "a caption");
  for (const char* format : {"pax", "gnu", "ustar"}) {
    const std::string tar = dir + "/" + format + ".tar";
    const std::string cmd = std::string("tar --format=") + format + " -C " + dir + "/src -cf " + tar + " sub 2>/dev/null";
    if (std::string(format) == "ustar") {
      // ustar cannot hold a 134-character base name: GNU tar refuses, which is the point.
      EXPECT_NE(std::system(cmd.c_str()), 0);
      continue;
    }
    ASSERT_EQ(std::system(cmd.c_str()), 0) << format;
    SampleReader reader(open_shard(tar));
    auto s = reader.next();
    ASSERT_TRUE(s) << format;
    EXPECT_EQ(s->key, "sub/" + long_base) << format;
    ASSERT_EQ(s->members.size(), 2u) << format;  // the directory entry is not a member
    EXPECT_EQ(s->members.at("jpg"), "JPEGDATA");
    EXPECT_EQ(s->members.at("txt"), "a caption");
    EXPECT_FALSE(reader.next());
  }
}

TEST(WebDataset, GroupsAdjacentMembersByKeyAndFlagsRepeats) {
  EXPECT_EQ(split_member_name("d/000123.latent.safetensors"),
            (std::pair<std::string, std::string>{"d/000123", "latent.safetensors"}));
  EXPECT_EQ(split_member_name("d.x/000123.PNG"), (std::pair<std::string, std::string>{"d.x/000123", "png"}));
  EXPECT_EQ(split_member_name("noext"), (std::pair<std::string, std::string>{"noext", ""}));
  const std::string dir = scratch_dir("wds_group");
  {
    TarWriter w(dir + "/s.tar");
    w.add("x/1.png", "P1");
    w.add("x/1.CLS", "3");
    w.add("x/2.png", "P2");
    w.add("x/2.png", "P2-again");
    w.add("x/3.txt", "t");
    w.close();
  }
  SampleReader reader(open_shard(dir + "/s.tar"));
  auto a = reader.next(), b = reader.next(), c = reader.next();
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->key, "x/1");
  EXPECT_EQ(a->members.at("cls"), "3");
  EXPECT_TRUE(a->error.empty());
  EXPECT_EQ(b->index, 1);
  EXPECT_NE(b->error.find("repeats extension"), std::string::npos);
  EXPECT_EQ(c->members.at("txt"), "t");
  EXPECT_FALSE(reader.next());
  EXPECT_EQ(count_samples(dir + "/s.tar"), 3);
}

TEST(WebDataset, DamageKeepsTheSamplesBeforeIt) {
  const std::string dir = scratch_dir("wds_damage");
  {
    TarWriter w(dir + "/s.tar");
    for (int i = 0; i < 4; ++i) {
      w.add("k" + std::to_string(i) + ".png", std::string(600, 'a' + i));
      w.add("k" + std::to_string(i) + ".cls", std::to_string(i));
    }
    w.close();
  }
  const std::string bytes = read_file(dir + "/s.tar");
  // Each sample: png header + 2 blocks of data, cls header + 1 block = 5 blocks. Cut in the
  // middle of k2's png data.
  write_file(dir + "/cut.tar", bytes.substr(0, 512 * 10 + 512 + 300));
  SampleReader reader(open_shard(dir + "/cut.tar"));
  auto s0 = reader.next(), s1 = reader.next();
  ASSERT_TRUE(s0 && s1);
  EXPECT_TRUE(s0->error.empty());
  EXPECT_TRUE(s1->error.empty());  // whole, though the damage follows it directly
  EXPECT_NE(data_error_message([&] { reader.next(); }).find("truncated"), std::string::npos);
  std::string damage;
  EXPECT_EQ(count_samples(dir + "/cut.tar", {}, &damage), 2);
  EXPECT_NE(damage.find("truncated"), std::string::npos);
}

TEST(ByteStream, PipeCommandsStreamAndReportFailure) {
  const std::string dir = scratch_dir("pipe");
  write_file(dir + "/f.bin", "0123456789");
  auto s = open_shard("pipe:cat " + dir + "/f.bin");
  char buf[32];
  EXPECT_EQ(s->read_fully(buf, sizeof buf), 10u);
  EXPECT_EQ(std::string(buf, 10), "0123456789");
  EXPECT_NO_THROW(s->finish());
  auto bad = open_shard("pipe:cat " + dir + "/missing.bin 2>/dev/null");
  EXPECT_EQ(bad->read_fully(buf, sizeof buf), 0u);
  EXPECT_NE(data_error_message([&] { bad->finish(); }).find("exited with status 1"), std::string::npos);
  // A stream closed before the command finished terminates it (no hang in the destructor).
  { auto endless = open_shard("pipe:yes"); EXPECT_EQ(endless->read_fully(buf, 4), 4u); }
  EXPECT_NE(data_error_message([&] { open_shard(dir + "/missing.tar"); }).find("cannot open"), std::string::npos);
}

TEST(ShardIndex, CountsFromTheIndexOrByReading) {
  const std::string dir = scratch_dir("shard_index");
  for (int s = 0; s < 3; ++s) {
    TarWriter w(dir + "/t-" + std::to_string(s) + ".tar");
    for (int i = 0; i < s + 2; ++i) w.add(std::to_string(i) + ".txt", "x");
    w.close();
  }
  const std::vector<std::string> shards{dir + "/t-0.tar", dir + "/t-1.tar", dir + "/t-2.tar"};
  int64_t counted = -1;
  EXPECT_EQ(shard_sample_counts(shards, "", 2, {}, &counted), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(counted, 3);
  write_shard_index(dir, {{"t-0.tar", 20, 1}, {"t-1.tar", 30, 1}});  // deliberately not the truth
  EXPECT_EQ(shard_sample_counts(shards, "", 1, {}, &counted), (std::vector<int64_t>{20, 30, 4}));
  EXPECT_EQ(counted, 1);
  // Two packed sets with the same shard names: each shard's count comes from its own directory.
  fs::create_directories(dir + "/other");
  {
    TarWriter w(dir + "/other/t-0.tar");
    for (int i = 0; i < 7; ++i) w.add(std::to_string(i) + ".txt", "x");
    w.close();
  }
  write_shard_index(dir + "/other", {{"t-0.tar", 7, 1}});
  EXPECT_EQ(shard_sample_counts({dir + "/t-0.tar", dir + "/other/t-0.tar"}, "", 1), (std::vector<int64_t>{20, 7}));
  write_file(dir + "/bad.json", "{\"format\": \"other\"}");
  EXPECT_NE(data_error_message([&] { shard_sample_counts(shards, dir + "/bad.json", 1); }).find("format"),
            std::string::npos);
}

TEST(StreamPlan, DealsShardsEvenlyAndDeterministically) {
  std::vector<int64_t> counts{10, 10, 10, 10, 7, 3, 10, 10};
  const EpochPlan a = plan_epoch(counts, 3, 5, 0), b = plan_epoch(counts, 3, 5, 0), c = plan_epoch(counts, 3, 5, 1);
  EXPECT_EQ(a.stream_shards, b.stream_shards);
  EXPECT_NE(a.stream_shards, c.stream_shards);
  std::set<int64_t> seen;
  for (const auto& s : a.stream_shards) seen.insert(s.begin(), s.end());
  EXPECT_EQ(seen.size(), counts.size());  // every shard in exactly one stream
  const auto [lo, hi] = std::minmax_element(a.stream_length.begin(), a.stream_length.end());
  EXPECT_LE(*hi - *lo, 10);  // at most one shard's samples apart
  EXPECT_EQ(std::accumulate(a.stream_length.begin(), a.stream_length.end(), int64_t{0}), 70);
  EXPECT_NE(data_error_message([&] { plan_epoch(counts, 9, 0, 0); }).find("8 shards cannot feed 9 streams"),
            std::string::npos);
}

TEST(StreamPlan, ShuffleOrderIsAPermutationThatReplays) {
  ShuffleOrder order(50, 8, 11);
  std::vector<int64_t> out;
  while (!order.exhausted()) {
    out.push_back(order.emit());
    EXPECT_LE(order.held().size(), 8u);
  }
  std::vector<int64_t> sorted = out;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> expect(50);
  std::iota(expect.begin(), expect.end(), 0);
  EXPECT_EQ(sorted, expect);
  EXPECT_NE(out, expect);  // shuffled
  // Every emitted position was read in already (the buffer never emits ahead of reading).
  ShuffleOrder again(50, 8, 11);
  for (int64_t expected : out) {
    const int64_t p = again.emit();
    EXPECT_EQ(p, expected);
    EXPECT_LT(p, again.next_input() + 1);
  }
}

TEST(StreamPlan, PickAndEpochEndArithmetic) {
  const std::vector<int64_t> lengths{5, 5, 4, 4};
  std::vector<int64_t> counts{0, 0, 0, 0};
  // World 2: rank 0 owns streams 0 and 2, rank 1 owns 1 and 3.
  EXPECT_EQ(pick_stream(counts, lengths, 0, 2), 0);
  counts[0] = 1;
  EXPECT_EQ(pick_stream(counts, lengths, 0, 2), 2);
  counts = {5, 0, 4, 0};
  EXPECT_EQ(pick_stream(counts, lengths, 0, 2), -1);
  counts = {0, 0, 0, 0};
  EXPECT_EQ(batches_left_in_epoch(counts, lengths, 2, 3), 3);  // rank 0: 9 samples, rank 1: 9
  EXPECT_EQ(batches_left_in_epoch(counts, lengths, 1, 4), 4);  // 18 samples
  counts = {3, 0, 0, 0};
  EXPECT_EQ(batches_left_in_epoch(counts, lengths, 2, 3), 2);
}

TEST(Jpeg, DecodesWhatLibjpegEncodesAndRejectsACutStream) {
#ifndef FLOWTRAIN_HAVE_JPEG
  if (flowtrain::test::in_ci()) FAIL() << "CI builds with libjpeg (scripts/setup.sh)";
  GTEST_SKIP() << "built without libjpeg";
#endif
  // A smooth RGB gradient: JPEG at quality 95 keeps every pixel within a few levels of it.
  const at::Tensor x = at::arange(32, at::kFloat).view({1, 32, 1}).expand({32, 32, 3}) * 6 +
                       at::arange(32, at::kFloat).view({32, 1, 1}).expand({32, 32, 3}) * 2;
  const at::Tensor image = x.clamp(0, 255).to(at::kByte).contiguous();
  const std::string bytes = encode_jpeg(image, 95);
  const at::Tensor back = decode_jpeg(bytes, "test");
  ASSERT_EQ(back.sizes(), image.sizes());
  // Tolerance: quality-95 quantisation of a smooth ramp; 8 levels is well above what it does
  // (measured max 3-4) and far below a wrong channel order or a shifted row (tens of levels).
  EXPECT_LE((back.to(at::kInt) - image.to(at::kInt)).abs().max().item<int>(), 8);
  const at::Tensor gray = decode_jpeg(encode_jpeg(image.select(2, 0).contiguous(), 95), "gray");
  EXPECT_EQ(gray.dim(), 2);
  EXPECT_NE(data_error_message([&] { decode_jpeg(bytes.substr(0, bytes.size() / 2), "cut.jpg"); }).find("cut.jpg"),
            std::string::npos);
  EXPECT_NE(data_error_message([&] { decode_jpeg("not a jpeg", "junk.jpg"); }).find("junk.jpg"), std::string::npos);
}
