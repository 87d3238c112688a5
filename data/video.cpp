#include "data/video.h"

#include "data/data_error.h"

#include <fmt/format.h>

#ifdef FLOWTRAIN_HAVE_FFMPEG
extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/opt.h>
#include <libswscale/swscale.h>
}

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <unistd.h>
#endif

namespace flowtrain::data {

#ifdef FLOWTRAIN_HAVE_FFMPEG
namespace {

// FFmpeg's own log lines (x264's banner, decoder warnings) stay off stderr: errors reach the
// caller as DataError text instead.
void quiet_ffmpeg_logs() {
  static const bool once = [] {
    av_log_set_level(AV_LOG_FATAL);
    return true;
  }();
  (void)once;
}

std::string av_error(int code) {
  char text[AV_ERROR_MAX_STRING_SIZE] = {};
  av_strerror(code, text, sizeof text);
  return text;
}

// libavformat reading from bytes in memory (a tar member), seekable.
struct MemoryInput {
  const uint8_t* data;
  int64_t size, pos = 0;

  static int read(void* opaque, uint8_t* buf, int n) {
    auto* in = static_cast<MemoryInput*>(opaque);
    const int64_t take = std::min<int64_t>(n, in->size - in->pos);
    if (take <= 0) return AVERROR_EOF;
    std::memcpy(buf, in->data + in->pos, static_cast<size_t>(take));
    in->pos += take;
    return static_cast<int>(take);
  }
  static int64_t seek(void* opaque, int64_t offset, int whence) {
    auto* in = static_cast<MemoryInput*>(opaque);
    if (whence & AVSEEK_SIZE) return in->size;
    const int64_t base = (whence & 3) == SEEK_CUR ? in->pos : (whence & 3) == SEEK_END ? in->size : 0;
    const int64_t target = base + offset;
    if (target < 0 || target > in->size) return AVERROR(EINVAL);
    in->pos = target;
    return target;
  }
};

// An opened demuxer + decoder over bytes; every FFmpeg object freed by the destructor.
class Demuxer {
 public:
  Demuxer(const std::string& bytes, const std::string& what) : what_(what) {
    quiet_ffmpeg_logs();
    input_.data = reinterpret_cast<const uint8_t*>(bytes.data());
    input_.size = static_cast<int64_t>(bytes.size());
    auto* buffer = static_cast<uint8_t*>(av_malloc(1 << 16));
    io_ = avio_alloc_context(buffer, 1 << 16, 0, &input_, &MemoryInput::read, nullptr, &MemoryInput::seek);
    format_ = avformat_alloc_context();
    if (!io_ || !format_) fail("out of memory");
    format_->pb = io_;
    if (const int rc = avformat_open_input(&format_, nullptr, nullptr, nullptr); rc < 0) {
      format_ = nullptr;  // freed by avformat_open_input on failure
      fail("not a video container: " + av_error(rc));
    }
    if (const int rc = avformat_find_stream_info(format_, nullptr); rc < 0) fail("no stream info: " + av_error(rc));
    const AVCodec* codec = nullptr;
    stream_index_ = av_find_best_stream(format_, AVMEDIA_TYPE_VIDEO, -1, -1, &codec, 0);
    if (stream_index_ < 0 || !codec) fail("no decodable video stream");
    stream_ = format_->streams[stream_index_];
    decoder_ = avcodec_alloc_context3(codec);
    if (!decoder_) fail("out of memory");
    avcodec_parameters_to_context(decoder_, stream_->codecpar);
    decoder_->thread_count = 1;  // the loader's workers are the parallelism
    if (const int rc = avcodec_open2(decoder_, codec, nullptr); rc < 0) fail("cannot open the decoder: " + av_error(rc));
    packet_ = av_packet_alloc();
    frame_ = av_frame_alloc();
  }
  ~Demuxer() {
    av_frame_free(&frame_);
    av_packet_free(&packet_);
    avcodec_free_context(&decoder_);
    avformat_close_input(&format_);
    if (io_) {
      av_freep(&io_->buffer);
      avio_context_free(&io_);
    }
    sws_freeContext(scaler_);
  }
  Demuxer(const Demuxer&) = delete;
  Demuxer& operator=(const Demuxer&) = delete;

  [[noreturn]] void fail(const std::string& why) const { throw DataError(fmt::format("video {}: {}", what_, why)); }

  double fps() const {
    // r_frame_rate: the stream's base rate (what the writer set); avg_frame_rate derives from the
    // duration and is off for short clips (21 frames at 8 fps read as 8.4).
    AVRational r = stream_->r_frame_rate.num ? stream_->r_frame_rate : stream_->avg_frame_rate;
    return r.num && r.den ? av_q2d(r) : 0.0;
  }
  int64_t width() const { return decoder_->width; }
  int64_t height() const { return decoder_->height; }

  int64_t frame_count() {
    if (stream_->nb_frames > 0) return stream_->nb_frames;
    int64_t n = 0;
    while (av_read_frame(format_, packet_) >= 0) {
      n += packet_->stream_index == stream_index_;
      av_packet_unref(packet_);
    }
    return n;
  }

  // The frame index of a presentation timestamp.
  int64_t index_of(int64_t pts) const {
    const int64_t start = stream_->start_time == AV_NOPTS_VALUE ? 0 : stream_->start_time;
    return std::llround(static_cast<double>(pts - start) * av_q2d(stream_->time_base) * fps());
  }

  at::Tensor clip(int64_t first, int64_t count, int64_t step) {
    if (fps() <= 0) fail("no frame rate");
    const int64_t start = stream_->start_time == AV_NOPTS_VALUE ? 0 : stream_->start_time;
    const int64_t target_ts = start + av_rescale_q(first, av_inv_q(av_d2q(fps(), 1 << 20)), stream_->time_base);
    if (const int rc = av_seek_frame(format_, stream_index_, target_ts, AVSEEK_FLAG_BACKWARD); rc < 0)
      fail(fmt::format("cannot seek to frame {}: {}", first, av_error(rc)));
    avcodec_flush_buffers(decoder_);
    at::Tensor out = at::empty({count, 3, height(), width()}, at::kByte);
    int64_t taken = 0;
    bool ended = false;
    // Feed one packet, then take every frame the decoder has ready (so a send never finds it
    // full); at the end of the input, flush and take the rest.
    while (taken < count && !ended) {
      const int got = av_read_frame(format_, packet_);
      if (got < 0) {
        avcodec_send_packet(decoder_, nullptr);
      } else if (packet_->stream_index != stream_index_) {
        av_packet_unref(packet_);
        continue;
      } else {
        const int sent = avcodec_send_packet(decoder_, packet_);
        av_packet_unref(packet_);
        if (sent < 0) fail("corrupt packet: " + av_error(sent));
      }
      for (;;) {
        const int rc = avcodec_receive_frame(decoder_, frame_);
        if (rc == AVERROR(EAGAIN)) break;
        if (rc == AVERROR_EOF) {
          ended = true;
          break;
        }
        if (rc < 0) fail("decoding failed: " + av_error(rc));
        if (frame_->decode_error_flags || (frame_->flags & AV_FRAME_FLAG_CORRUPT)) fail("a corrupt frame");
        const int64_t index = index_of(frame_->best_effort_timestamp);
        const int64_t wanted = first + taken * step;
        if (taken < count && index == wanted) {
          to_rgb(out[taken]);
          ++taken;
        } else if (taken < count && index > wanted) {
          fail(fmt::format("frame {} is missing (decoding reached frame {})", wanted, index));
        }
        av_frame_unref(frame_);
      }
      if (got < 0 && !ended) ended = true;  // flushed and drained
    }
    if (taken < count)
      fail(fmt::format("ends before frame {} (a clip of {} frames from {} every {})", first + taken * step, count, first,
                       step));
    return out;
  }

 private:
  // The current frame into `dst` uint8 [3, H, W] (planar RGB).
  void to_rgb(at::Tensor dst) {
    const int w = frame_->width, h = frame_->height;
    if (w != width() || h != height()) fail("the frame size changes mid-stream");
    scaler_ = sws_getCachedContext(scaler_, w, h, static_cast<AVPixelFormat>(frame_->format), w, h, AV_PIX_FMT_GBRP,
                                   SWS_POINT, nullptr, nullptr, nullptr);
    if (!scaler_) fail("cannot convert its pixel format");
    auto* base = dst.data_ptr<uint8_t>();
    // GBRP plane order is G, B, R: point each at the right channel of [R, G, B].
    uint8_t* planes[4] = {base + 1 * w * h, base + 2 * w * h, base + 0 * w * h, nullptr};
    int strides[4] = {w, w, w, 0};
    sws_scale(scaler_, frame_->data, frame_->linesize, 0, h, planes, strides);
  }

  std::string what_;
  MemoryInput input_{};
  AVIOContext* io_ = nullptr;
  AVFormatContext* format_ = nullptr;
  AVStream* stream_ = nullptr;
  int stream_index_ = -1;
  AVCodecContext* decoder_ = nullptr;
  AVPacket* packet_ = nullptr;
  AVFrame* frame_ = nullptr;
  SwsContext* scaler_ = nullptr;
};

}  // namespace

bool video_supported() { return true; }

VideoInfo probe_video(const std::string& bytes, const std::string& what) {
  Demuxer d(bytes, what);
  VideoInfo info;
  info.fps = d.fps();
  info.width = d.width();
  info.height = d.height();
  info.frames = d.frame_count();
  return info;
}

at::Tensor decode_video_clip(const std::string& bytes, int64_t start, int64_t frames, int64_t step,
                             const std::string& what) {
  if (start < 0 || frames < 1 || step < 1)
    throw DataError(fmt::format("video {}: bad clip (start {}, {} frames, step {})", what, start, frames, step));
  Demuxer d(bytes, what);
  return d.clip(start, frames, step);
}

std::string encode_video_lossless(const at::Tensor& frames, int64_t fps, int64_t keyframe_interval) {
  if (!frames.defined() || frames.scalar_type() != at::kByte || frames.dim() != 4 || frames.size(3) != 3)
    throw DataError("encode_video_lossless: expected uint8 [T, H, W, 3]");
  const at::Tensor rgb = frames.contiguous();
  const int64_t T = rgb.size(0), H = rgb.size(1), W = rgb.size(2);
  quiet_ffmpeg_logs();
  char path[] = "/tmp/flowtrain-video-XXXXXX.mp4";
  const int fd = mkstemps(path, 4);
  if (fd < 0) throw DataError("encode_video_lossless: cannot create a temporary file");
  ::close(fd);
  struct Cleanup {
    const char* path;
    AVFormatContext* out = nullptr;
    AVCodecContext* enc = nullptr;
    AVFrame* frame = nullptr;
    AVPacket* packet = nullptr;
    ~Cleanup() {
      av_packet_free(&packet);
      av_frame_free(&frame);
      avcodec_free_context(&enc);
      if (out) {
        if (out->pb) avio_closep(&out->pb);
        avformat_free_context(out);
      }
      std::remove(path);
    }
  } c{path};
  const auto check = [](int rc, const char* what) {
    if (rc < 0) throw DataError(fmt::format("encode_video_lossless: {}: {}", what, av_error(rc)));
  };
  check(avformat_alloc_output_context2(&c.out, nullptr, "mp4", path), "mp4 muxer");
  const AVCodec* codec = avcodec_find_encoder_by_name("libx264rgb");
  if (!codec) throw DataError("encode_video_lossless: FFmpeg has no libx264rgb encoder");
  AVStream* stream = avformat_new_stream(c.out, nullptr);
  c.enc = avcodec_alloc_context3(codec);
  c.enc->width = static_cast<int>(W);
  c.enc->height = static_cast<int>(H);
  c.enc->time_base = AVRational{1, static_cast<int>(fps)};
  c.enc->framerate = AVRational{static_cast<int>(fps), 1};
  c.enc->pix_fmt = AV_PIX_FMT_RGB24;
  c.enc->gop_size = static_cast<int>(keyframe_interval);
  c.enc->max_b_frames = 0;
  c.enc->thread_count = 1;
  av_opt_set(c.enc->priv_data, "qp", "0", 0);
  av_opt_set(c.enc->priv_data, "preset", "ultrafast", 0);
  av_opt_set(c.enc->priv_data, "x264-params", fmt::format("keyint={}:min-keyint={}:scenecut=0", keyframe_interval,
                                                          keyframe_interval).c_str(), 0);
  if (c.out->oformat->flags & AVFMT_GLOBALHEADER) c.enc->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  check(avcodec_open2(c.enc, codec, nullptr), "open libx264rgb");
  check(avcodec_parameters_from_context(stream->codecpar, c.enc), "stream parameters");
  stream->time_base = c.enc->time_base;
  check(avio_open(&c.out->pb, path, AVIO_FLAG_WRITE), "open the output");
  check(avformat_write_header(c.out, nullptr), "write the header");
  c.frame = av_frame_alloc();
  c.packet = av_packet_alloc();
  c.frame->format = AV_PIX_FMT_RGB24;
  c.frame->width = static_cast<int>(W);
  c.frame->height = static_cast<int>(H);
  check(av_frame_get_buffer(c.frame, 0), "frame buffer");
  const auto drain = [&] {
    for (;;) {
      const int rc = avcodec_receive_packet(c.enc, c.packet);
      if (rc == AVERROR(EAGAIN) || rc == AVERROR_EOF) return;
      check(rc, "encode");
      // Each frame lasts one tick: without a duration the MP4 muxer gives the last sample none,
      // and demuxers then drop it.
      c.packet->duration = 1;
      av_packet_rescale_ts(c.packet, c.enc->time_base, stream->time_base);
      c.packet->stream_index = stream->index;
      check(av_interleaved_write_frame(c.out, c.packet), "write a packet");
    }
  };
  for (int64_t t = 0; t < T; ++t) {
    check(av_frame_make_writable(c.frame), "frame writable");
    const uint8_t* src = rgb[t].data_ptr<uint8_t>();
    for (int64_t y = 0; y < H; ++y) std::memcpy(c.frame->data[0] + y * c.frame->linesize[0], src + y * W * 3, W * 3);
    c.frame->pts = t;
    check(avcodec_send_frame(c.enc, c.frame), "send a frame");
    drain();
  }
  check(avcodec_send_frame(c.enc, nullptr), "flush");
  drain();
  check(av_write_trailer(c.out), "write the trailer");
  avio_closep(&c.out->pb);
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

#else

bool video_supported() { return false; }
VideoInfo probe_video(const std::string&, const std::string& what) {
  throw DataError("video " + what + ": this flowtrain was built without FFmpeg (install libavformat-dev "
                  "libavcodec-dev libswscale-dev and rebuild)");
}
at::Tensor decode_video_clip(const std::string& bytes, int64_t, int64_t, int64_t, const std::string& what) {
  probe_video(bytes, what);  // throws: no FFmpeg
  return {};
}
std::string encode_video_lossless(const at::Tensor&, int64_t, int64_t) {
  throw DataError("encode_video_lossless: this flowtrain was built without FFmpeg");
}

#endif

}  // namespace flowtrain::data
