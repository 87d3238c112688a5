// Video members: a lossless clip written with libx264rgb decodes to exactly the frames written,
// from any start frame (seek to the previous keyframe, decode forward) and with any step;
// damaged video is an error naming it.
#include "data/data_error.h"
#include "data/video.h"
#include "test_util.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <tuple>

using namespace flowtrain::data;
using flowtrain::test::data_error_message;

namespace {

void require_video() {
  if (!video_supported()) {
    if (flowtrain::test::in_ci()) FAIL() << "CI builds with FFmpeg (scripts/setup.sh)";
    GTEST_SKIP() << "built without FFmpeg";
  }
}

}  // namespace

TEST(Video, FrameKDecodedIsFrameKWrittenAfterASeek) {
  require_video();
  if (testing::Test::IsSkipped() || testing::Test::HasFailure()) return;
  // 21 frames of noise (every pixel differs from frame to frame: no frame can stand in for
  // another), keyframes every 8 frames, 8 fps.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const at::Tensor frames = at::randint(0, 256, {21, 24, 32, 3}, gen, at::kByte);
  const std::string mp4 = encode_video_lossless(frames, 8, 8);
  const VideoInfo info = probe_video(mp4, "test.mp4");
  EXPECT_EQ(info.frames, 21);
  EXPECT_DOUBLE_EQ(info.fps, 8.0);
  EXPECT_EQ(info.width, 32);
  EXPECT_EQ(info.height, 24);
  // Starts on a keyframe (0, 16), just after one (9), just before one (7), between (14), with steps.
  for (const auto& [start, count, step] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {0, 4, 1}, {7, 3, 1}, {9, 4, 2}, {14, 3, 3}, {16, 5, 1}, {20, 1, 1}}) {
    const at::Tensor clip = decode_video_clip(mp4, start, count, step, "test.mp4");
    ASSERT_EQ(clip.sizes(), (std::vector<int64_t>{count, 3, 24, 32}));
    for (int64_t j = 0; j < count; ++j)
      ASSERT_TRUE(at::equal(clip[j].permute({1, 2, 0}), frames[start + j * step]))
          << "clip from " << start << " step " << step << ", frame " << start + j * step;
  }
  EXPECT_NE(data_error_message([&] { decode_video_clip(mp4, 18, 4, 1, "short.mp4"); }).find("ends before frame 21"),
            std::string::npos);
  EXPECT_NE(data_error_message([&] { probe_video("not a video at all", "junk.mp4"); }).find("junk.mp4"),
            std::string::npos);
  // Cut in half: the frames past the cut cannot be decoded, and the error names the video.
  const std::string cut = mp4.substr(0, mp4.size() / 2);
  EXPECT_NE(data_error_message([&] { decode_video_clip(cut, 14, 6, 1, "cut.mp4"); }).find("cut.mp4"),
            std::string::npos);
}
