#include "data/jpeg.h"

#include "data/data_error.h"

#ifdef FLOWTRAIN_HAVE_JPEG
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>
#endif

namespace flowtrain::data {
#ifdef FLOWTRAIN_HAVE_JPEG
namespace {

// libjpeg reports errors through error_exit, which must not return: it longjmps back to the
// caller's setjmp (no C++ objects with destructors live between the two).
struct ErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Corrupt data is only a warning to libjpeg (it fills grey and goes on); make it an error.
void on_message(j_common_ptr cinfo, int level) {
  if (level < 0) on_error(cinfo);
}

// Decodes into `out` (allocated by the caller once the header is known); returns false and
// fills err.message on any error.
bool decode(const std::string& bytes, ErrorManager& err, jpeg_decompress_struct& cinfo, at::Tensor& out) {
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = on_error;
  err.pub.emit_message = on_message;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  const bool gray = cinfo.jpeg_color_space == JCS_GRAYSCALE;
  cinfo.out_color_space = gray ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  const int64_t h = cinfo.output_height, w = cinfo.output_width, c = cinfo.output_components;
  out = c == 1 ? at::empty({h, w}, at::TensorOptions().dtype(at::kByte))
               : at::empty({h, w, c}, at::TensorOptions().dtype(at::kByte));
  auto* base = out.data_ptr<uint8_t>();
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = base + static_cast<int64_t>(cinfo.output_scanline) * w * c;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

}  // namespace

at::Tensor decode_jpeg(const std::string& bytes, const std::string& what) {
  ErrorManager err{};
  jpeg_decompress_struct cinfo{};
  at::Tensor out;
  if (!decode(bytes, err, cinfo, out)) throw DataError("cannot decode JPEG " + what + ": " + err.message);
  return out;
}

std::string encode_jpeg(const at::Tensor& image, int quality) {
  if (!image.defined() || image.scalar_type() != at::kByte || (image.dim() != 2 && !(image.dim() == 3 && image.size(2) == 3)))
    throw DataError("encode_jpeg: expected uint8 [H, W] or [H, W, 3]");
  const at::Tensor pixels = image.contiguous().cpu();
  jpeg_compress_struct cinfo{};
  jpeg_error_mgr err{};
  cinfo.err = jpeg_std_error(&err);  // encoding our own tensor: an error here is a bug, abort is fine
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = static_cast<JDIMENSION>(pixels.size(1));
  cinfo.image_height = static_cast<JDIMENSION>(pixels.size(0));
  cinfo.input_components = pixels.dim() == 2 ? 1 : 3;
  cinfo.in_color_space = pixels.dim() == 2 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  const int64_t stride = pixels.size(1) * cinfo.input_components;
  auto* base = const_cast<uint8_t*>(pixels.data_ptr<uint8_t>());
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = base + static_cast<int64_t>(cinfo.next_scanline) * stride;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::string out(reinterpret_cast<char*>(buffer), size);
  std::free(buffer);
  return out;
}

#else
at::Tensor decode_jpeg(const std::string&, const std::string& what) {
  throw DataError("cannot decode JPEG " + what + ": this flowtrain was built without libjpeg (install "
                  "libjpeg62-turbo-dev and rebuild)");
}
std::string encode_jpeg(const at::Tensor&, int) {
  throw DataError("encode_jpeg: this flowtrain was built without libjpeg");
}
#endif
}  // namespace flowtrain::data
