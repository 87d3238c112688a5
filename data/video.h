// Video members (`.mp4`) through FFmpeg's libavformat / libavcodec (Debian's): probing, clip
// decoding with frame-accurate seeking, and lossless writing for synthetic sets and tests.
//
// Seeking: to decode from frame k, seek to the last keyframe at or before k
// (av_seek_frame with AVSEEK_FLAG_BACKWARD on the stream's time base), flush the decoder, and
// decode forward, dropping frames before k — every clip starts exactly where it was asked to,
// whatever the GOP length. Frame indices come from presentation timestamps (constant frame rate
// assumed, as the writer below makes and training sets are normally transcoded to).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace flowtrain::data {

struct VideoInfo {
  int64_t frames = 0;  // from the container, else counted from the packets
  double fps = 0;
  int64_t width = 0, height = 0;
};

// Throws DataError naming `what` on bytes that are not a decodable video.
VideoInfo probe_video(const std::string& bytes, const std::string& what);

// Frames start, start + step, …, (frames of them) as uint8 [T, 3, H, W] RGB. Throws DataError
// naming `what` when the video is damaged or shorter than the clip.
at::Tensor decode_video_clip(const std::string& bytes, int64_t start, int64_t frames, int64_t step,
                             const std::string& what);

// uint8 [T, H, W, 3] RGB -> MP4 bytes: H.264 through libx264rgb at qp 0 (lossless RGB: decoded
// frames equal the written ones bit for bit), a keyframe every `keyframe_interval` frames.
std::string encode_video_lossless(const at::Tensor& frames, int64_t fps, int64_t keyframe_interval = 8);

// Whether this build can read / write video (FFmpeg found at build time).
bool video_supported();

}  // namespace flowtrain::data
