#include "data/shards/sample_decoder.h"

#include "data/data_error.h"
#include "data/jpeg.h"
#include "data/png.h"
#include "data/safetensors.h"
#include "data/video.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <cmath>

namespace flowtrain::data {
namespace {

const std::string& member(const RawSample& s, const std::string& ext) {
  const auto it = s.members.find(ext);
  if (it == s.members.end()) throw DataError(fmt::format("no '.{}' member", ext));
  return it->second;
}

at::Tensor decode_image(const RawSample& s, const SampleSpec& spec) {
  at::Tensor hwc;
  if (s.members.count("png")) hwc = decode_png(member(s, "png"), "member " + s.key + ".png");
  else if (s.members.count("jpg")) hwc = decode_jpeg(member(s, "jpg"), "member " + s.key + ".jpg");
  else if (s.members.count("jpeg")) hwc = decode_jpeg(member(s, "jpeg"), "member " + s.key + ".jpeg");
  else throw DataError("no image member (.png or .jpg)");
  at::Tensor chw = hwc.dim() == 2 ? hwc.unsqueeze(0) : hwc.permute({2, 0, 1});
  if (spec.channels == 3 && chw.size(0) == 1) chw = chw.expand({3, chw.size(1), chw.size(2)});
  if (spec.channels != 0 && chw.size(0) != spec.channels)
    throw DataError(fmt::format("a {}-channel image; the model takes {} channels", chw.size(0), spec.channels));
  if (spec.buckets.empty() && spec.max_side > 0 && (chw.size(1) > spec.max_side || chw.size(2) > spec.max_side))
    throw DataError(fmt::format("a {}×{} image; the model takes at most {}×{}", chw.size(1), chw.size(2),
                                spec.max_side, spec.max_side));
  return chw.contiguous();
}

at::Tensor tensor_member(const RawSample& s, const std::string& ext, const std::string& name, bool required = true) {
  SafetensorsReader reader(member(s, ext), "member " + s.key + "." + ext);
  if (!reader.contains(name)) {
    if (!required) return {};
    throw DataError(fmt::format("member {}.{} has no tensor '{}'", s.key, ext, name));
  }
  return reader.get(name);
}

int64_t parse_label(const RawSample& s, int64_t num_classes) {
  std::string text = member(s, "cls");
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) text.pop_back();
  int64_t label = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), label);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    throw DataError(fmt::format("'.cls' member is not an integer: '{}'", text.substr(0, 32)));
  if (label < 0 || (num_classes > 0 && label >= num_classes))
    throw DataError(fmt::format("class {} is outside [0, {})", label, num_classes));
  return label;
}

}  // namespace

std::string required_members(const SampleSpec& spec) {
  std::vector<std::string> parts;
  if (spec.video_frames > 0) parts.push_back("mp4");
  else if (spec.image == ImageKind::Image) parts.push_back("png|jpg");
  if (spec.video_frames == 0 && spec.image == ImageKind::Latent) parts.push_back("latent.safetensors");
  if (spec.label) parts.push_back("cls");
  if (spec.caption) parts.push_back("txt");
  if (spec.text_embeddings) {
    parts.push_back("txt_emb.safetensors");
    parts.push_back("vec.safetensors");
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

namespace {

at::Tensor decode_clip(const RawSample& s, const SampleSpec& spec, uint64_t draw) {
  const std::string& bytes = member(s, "mp4");
  const std::string what = "member " + s.key + ".mp4";
  const VideoInfo info = probe_video(bytes, what);
  const int64_t step = spec.video_fps > 0 ? std::max<int64_t>(1, std::llround(info.fps / spec.video_fps)) : 1;
  const int64_t span = (spec.video_frames - 1) * step + 1;
  if (info.frames < span)
    throw DataError(fmt::format("a video of {} frames is shorter than a clip of {} frames every {}", info.frames,
                                spec.video_frames, step));
  const auto start = static_cast<int64_t>(draw % static_cast<uint64_t>(info.frames - span + 1));
  at::Tensor clip = decode_video_clip(bytes, start, spec.video_frames, step, what);
  if (spec.max_side > 0 && (clip.size(2) > spec.max_side || clip.size(3) > spec.max_side))
    throw DataError(fmt::format("{}×{} video frames; the model takes at most {}×{}", clip.size(2), clip.size(3),
                                spec.max_side, spec.max_side));
  return clip;
}

}  // namespace

DecodedSample decode_sample(const RawSample& s, const SampleSpec& spec, uint64_t draw) {
  if (!s.error.empty()) throw DataError(s.error);
  DecodedSample out;
  if (spec.video_frames > 0) out.image = decode_clip(s, spec, draw);
  else if (spec.image == ImageKind::Image) out.image = decode_image(s, spec);
  else if (spec.image == ImageKind::Latent) out.image = tensor_member(s, "latent.safetensors", "latent").to(at::kFloat);
  if (spec.image == ImageKind::Latent) {  // checked here, per sample: a bad one is damage, not a failed batch
    if (out.image.dim() != 3 || (spec.channels > 0 && out.image.size(0) != spec.channels))
      throw DataError(fmt::format("latent of shape {}, expected [{}, h, w]", c10::str(out.image.sizes()),
                                  spec.channels));
    if (spec.buckets.empty() && spec.max_side > 0 && (out.image.size(1) > spec.max_side || out.image.size(2) > spec.max_side))
      throw DataError(fmt::format("a {}×{} latent; the model takes at most {}×{}", out.image.size(1),
                                  out.image.size(2), spec.max_side, spec.max_side));
  }
  if (!spec.buckets.empty() && out.image.defined()) {
    const int64_t h = out.image.size(1), w = out.image.size(2);
    if (spec.image == ImageKind::Latent) {  // latents are not resampled: the shape must be a bucket's
      for (size_t b = 0; b < spec.buckets.size(); ++b)
        if (spec.buckets[b] == Bucket{h, w}) out.bucket = static_cast<int64_t>(b);
      if (out.bucket < 0) throw DataError(fmt::format("a {}×{} latent matches no shape of data.buckets", h, w));
    } else {
      out.bucket = nearest_bucket(spec.buckets, h, w);
      out.image = fit_to_bucket(out.image, spec.buckets[static_cast<size_t>(out.bucket)]);
    }
  }
  if (spec.label) out.label = parse_label(s, spec.num_classes);
  if (spec.caption) {
    out.fields = spec.caption_fields(member(s, "txt"));
  }
  if (spec.text_embeddings) {
    out.fields["txt"] = tensor_member(s, "txt_emb.safetensors", "txt");
    if (out.fields["txt"].dim() != 2) throw DataError("'txt' of txt_emb.safetensors must be [L, D]");
    at::Tensor mask = tensor_member(s, "txt_emb.safetensors", "txt_mask", /*required=*/false);
    out.fields["txt_mask"] = mask.defined() ? mask.to(at::kBool) : at::ones({out.fields["txt"].size(0)}, at::kBool);
    out.fields["vec"] = tensor_member(s, "vec.safetensors", "vec");
  }
  return out;
}

}  // namespace flowtrain::data
