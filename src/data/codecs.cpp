// File reading, gzip inflation and PNG/JPEG coding with zlib, libpng and libjpeg(-turbo).
//
// libpng and libjpeg report errors by longjmp. Each setjmp below lives in a function whose frame
// holds only plain C data, so the jump never skips a C++ destructor; tensors and vectors live in
// the callers and are reached through callbacks that return normally.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>

// clang-format off
#include <jpeglib.h>  // needs <cstdio> first
// clang-format on
#include <png.h>
#include <zlib.h>

#include "data/node.h"
#include "detail/files.h"

namespace kiln::data {

std::vector<uint8_t> read_file(const std::string& path) {
  const detail::InputFile file(path);
  std::vector<uint8_t> bytes(static_cast<std::size_t>(file.size));
  const std::size_t got = file.read_at(bytes.data(), bytes.size(), 0);
  if (got != bytes.size())
    fail("data.read_file", "read failed: got ", got, " of ", file.size, " bytes from '", path,
         "', expected the whole file");
  return bytes;
}

void write_file(const std::string& path, std::span<const uint8_t> bytes) {
  kiln::detail::write_file_atomically("data.write_file", path, "'" + path + "'", [&](int fd) {
    return kiln::detail::write_all(fd, bytes.data(), bytes.size());
  });
}

namespace detail {

InputFile::InputFile(const std::string& p)
    : path(p), fd(::open(p.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)) {
  if (fd.fd < 0) {
    const int err = errno;
    fail("data.read_file", "cannot open file: got '", path, "' (", std::strerror(err),
         "), expected a readable file");
  }
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0 || !S_ISREG(st.st_mode))
    fail("data.read_file", "not a regular file: got '", path, "' (",
         kiln::detail::file_kind(st.st_mode), "), expected a regular file");
  size = static_cast<uint64_t>(st.st_size);
}

std::size_t InputFile::read_at(uint8_t* dst, std::size_t n, uint64_t offset) const {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r =
        ::pread(fd.fd, dst + got, std::min<std::size_t>(n - got, std::size_t{1} << 30),
                static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      fail("data.read_file", "read failed: got '", std::strerror(err), "' at byte ", offset + got,
           " of '", path, "', expected a readable file");
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  return got;
}

DecodedFile::DecodedFile(const std::string& path) : file_(path) {
  uint8_t magic[2] = {0, 0};
  if (file_.read_at(magic, 2, 0) < 2 || magic[0] != 0x1f || magic[1] != 0x8b) return;
  compressed_.resize(static_cast<std::size_t>(file_.size));
  compressed_.resize(file_.read_at(compressed_.data(), compressed_.size(), 0));
  zs_ = std::make_unique<z_stream>();
  if (inflateInit2(zs_.get(), 15 + 16) != Z_OK) {
    zs_.reset();
    fail("data.gzip", "zlib failed to start: got an inflateInit2 error, expected Z_OK");
  }
}

DecodedFile::~DecodedFile() {
  if (zs_) inflateEnd(zs_.get());
}

void DecodedFile::read(std::vector<uint8_t>& out, std::size_t n) {
  if (!compressed()) {
    const uint64_t left = file_.size - std::min(offset_, file_.size);
    const std::size_t start = out.size();
    out.resize(start + static_cast<std::size_t>(std::min<uint64_t>(n, left)));
    const std::size_t got = file_.read_at(out.data() + start, out.size() - start, offset_);
    out.resize(start + got);
    offset_ += got;
    return;
  }
  // Grow geometrically with what arrives: a stream that stops early costs only what it holds.
  const std::size_t target = out.size() + n;
  while (out.size() < target && !done_) {
    const std::size_t start = out.size();
    out.resize(std::min(target, start + std::max<std::size_t>(start, std::size_t{1} << 16)));
    const bool more = inflate_into(out, start);
    if (!more) done_ = true;
  }
}

// Inflates into out[start, out.size()) and shrinks `out` to what was produced. Returns false at
// the end of the data or on damage (problem_ says which).
bool DecodedFile::inflate_into(std::vector<uint8_t>& out, std::size_t start) {
  z_stream& zs = *zs_;
  std::size_t produced = start;
  bool more = true;
  while (produced < out.size()) {
    if (zs.avail_in == 0 && compressed_pos_ < compressed_.size()) {
      // zlib counts in 32 bits: hand it the input in pieces.
      zs.next_in = compressed_.data() + compressed_pos_;
      zs.avail_in = static_cast<uInt>(
          std::min<std::size_t>(compressed_.size() - compressed_pos_, std::size_t{1} << 30));
      compressed_pos_ += zs.avail_in;
    }
    zs.next_out = out.data() + produced;
    zs.avail_out = static_cast<uInt>(std::min<std::size_t>(out.size() - produced, 1u << 30));
    const uInt before = zs.avail_out;
    const int rc = inflate(&zs, Z_NO_FLUSH);
    produced += before - zs.avail_out;
    const bool input_left = zs.avail_in > 0 || compressed_pos_ < compressed_.size();
    if (rc == Z_STREAM_END) {
      if (!input_left) {
        more = false;
        break;
      }
      inflateReset(&zs);  // a multi-member file (concatenated gzip streams)
      continue;
    }
    if (rc == Z_OK) continue;
    // zlib's totals restart with each member: count from the whole file instead.
    const uint64_t at = compressed_pos_ - zs.avail_in, decoded = decoded_ + (produced - start);
    if (rc == Z_BUF_ERROR && !input_left) {
      problem_ =
          kiln::detail::cat("truncated gzip file '", file_.path, "': got end of input at byte ", at,
                            " (", decoded, " bytes decompressed), expected the rest of the stream");
    } else if (rc != Z_BUF_ERROR) {
      problem_ =
          kiln::detail::cat("corrupt gzip file '", file_.path, "': got zlib error '",
                            zs.msg ? zs.msg : "unknown", "' near compressed byte ", at, " (",
                            decoded, " bytes decompressed), expected a valid deflate stream");
    } else {
      continue;
    }
    more = false;
    break;
  }
  decoded_ += produced - start;
  out.resize(produced);
  return more;
}

namespace {

// ---- PNG --------------------------------------------------------------------------------------

// What the decoders (C frames) share with their C++ callers.
struct DecodeIo {
  const uint8_t* data;
  std::size_t size;
  std::size_t pos;
  char message[200];
  // Returns the buffer for h rows of w * c bytes, owned by the caller.
  uint8_t* (*alloc)(void* ctx, uint32_t h, uint32_t w, int c);
  void* ctx;
  int want_channels;  // 0: keep
  uint64_t max_pixels;
  uint32_t width = 0, height = 0;  // as declared, set when the image is over max_pixels
};

// True when the image may be decoded; else records its size for the caller's Error.
bool pixels_allowed(DecodeIo* io, uint32_t w, uint32_t h) {
  if (static_cast<uint64_t>(w) * h <= io->max_pixels) return true;
  io->width = w;
  io->height = h;
  return false;
}

void png_read_mem(png_structp p, png_bytep out, png_size_t n) {
  auto* io = static_cast<DecodeIo*>(png_get_io_ptr(p));
  if (n > io->size - io->pos) {
    io->pos = io->size;
    png_error(p, "unexpected end of file");
  }
  std::memcpy(out, io->data + io->pos, n);
  io->pos += n;
}

void png_on_error(png_structp p, png_const_charp msg) {
  auto* io = static_cast<DecodeIo*>(png_get_error_ptr(p));
  std::snprintf(io->message, sizeof io->message, "%s", msg);
  png_longjmp(p, 1);
}
void png_on_warning(png_structp, png_const_charp) {}

// 0 on success; on failure io->message says why and io->pos where.
int png_decode_raw(DecodeIo* io) {
  png_structp p = png_create_read_struct(PNG_LIBPNG_VER_STRING, io, png_on_error, png_on_warning);
  if (!p) return -1;
  png_infop info = png_create_info_struct(p);
  png_bytep* volatile rows = nullptr;
  if (!info || setjmp(png_jmpbuf(p))) {
    std::free(rows);
    png_destroy_read_struct(&p, info ? &info : nullptr, nullptr);
    return -1;
  }
  png_set_read_fn(p, io, png_read_mem);
  // Skip the ancillary chunks of variable length, which decoding pixels does not need: libpng
  // allocates their declared length (up to 2^31) before reading them, so a 70-byte file could
  // make it allocate 1.7 GB. Skipped chunks are read through in small pieces.
  static const png_byte kSkipped[] = "iCCP\0iTXt\0pCAL\0sCAL\0sPLT\0tEXt\0zTXt\0eXIf";
  png_set_keep_unknown_chunks(p, PNG_HANDLE_CHUNK_NEVER, kSkipped, sizeof kSkipped / 5);
  png_read_info(p, info);
  if (!pixels_allowed(io, png_get_image_width(p, info), png_get_image_height(p, info)))
    png_error(p, "too many pixels");
  const png_byte color = png_get_color_type(p, info);
  png_set_expand(p);  // palette to RGB, gray below 8 bits to 8 bits, tRNS to alpha
  png_set_strip_16(p);
  png_set_interlace_handling(p);
  const bool has_alpha = (color & PNG_COLOR_MASK_ALPHA) || png_get_valid(p, info, PNG_INFO_tRNS);
  const bool is_color = color & PNG_COLOR_MASK_COLOR;
  const int want = io->want_channels;
  if (want == 1 || want == 3) {
    if (has_alpha) png_set_strip_alpha(p);
  }
  if (want == 1 && is_color) png_set_rgb_to_gray_fixed(p, 1, -1, -1);
  if ((want == 3 || want == 4) && !is_color) png_set_gray_to_rgb(p);
  if (want == 4 && !has_alpha) png_set_add_alpha(p, 0xff, PNG_FILLER_AFTER);
  png_read_update_info(p, info);
  const uint32_t w = png_get_image_width(p, info), h = png_get_image_height(p, info);
  const int c = png_get_channels(p, info);
  if (png_get_rowbytes(p, info) != static_cast<std::size_t>(w) * static_cast<std::size_t>(c))
    png_error(p, "unexpected row layout after conversion");
  uint8_t* buf = io->alloc(io->ctx, h, w, c);
  if (!buf) png_error(p, "image too large");
  rows = static_cast<png_bytep*>(std::malloc(sizeof(png_bytep) * std::max<uint32_t>(h, 1)));
  if (!rows) png_error(p, "out of memory");
  for (uint32_t y = 0; y < h; ++y) rows[y] = buf + static_cast<std::size_t>(y) * w * c;
  png_read_image(p, rows);
  png_read_end(p, nullptr);
  std::free(rows);
  png_destroy_read_struct(&p, &info, nullptr);
  return 0;
}

struct AllocCtx {
  Tensor image;
};
uint8_t* alloc_image(void* ctx, uint32_t h, uint32_t w, int c) {
  auto* a = static_cast<AllocCtx*>(ctx);
  try {  // no exception may cross the decoder's C frames
    a->image = empty(Shape{static_cast<int64_t>(h), static_cast<int64_t>(w), c}, uint8);
  } catch (...) {
    return nullptr;
  }
  return a->image.data<uint8_t>();
}

// Decodes with `decode_raw` (PNG or JPEG); its failures become Errors of `op` naming `format`.
Tensor decode_with(int (*decode_raw)(DecodeIo*), const char* op, const char* format,
                   std::span<const uint8_t> bytes, std::string_view name,
                   const ImageReadOptions& options) {
  AllocCtx ctx;
  DecodeIo io{.data = bytes.data(),
              .size = bytes.size(),
              .pos = 0,
              .message = {},
              .alloc = alloc_image,
              .ctx = &ctx,
              .want_channels = options.channels.value_or(0),
              .max_pixels = static_cast<uint64_t>(options.max_pixels)};
  if (decode_raw(&io) == 0) return ctx.image;
  if (io.width)
    fail(op, format, " image too large in '", name, "': got ", io.width, "x", io.height, " = ",
         static_cast<uint64_t>(io.width) * io.height, " pixels, expected at most ",
         options.max_pixels, " (ImageReadOptions::max_pixels)");
  fail(op, "corrupt ", format, " '", name, "' at byte ", io.pos, ": got '", io.message,
       "', expected a valid ", format, " stream");
}

struct PngOut {
  std::vector<uint8_t>* bytes;
  char message[200];
};
void png_write_mem(png_structp p, png_bytep data, png_size_t n) {
  auto* o = static_cast<PngOut*>(png_get_io_ptr(p));
  o->bytes->insert(o->bytes->end(), data, data + n);
}
void png_flush_mem(png_structp) {}
void png_on_write_error(png_structp p, png_const_charp msg) {
  auto* o = static_cast<PngOut*>(png_get_error_ptr(p));
  std::snprintf(o->message, sizeof o->message, "%s", msg);
  png_longjmp(p, 1);
}

int png_encode_raw(PngOut* o, const uint8_t* px, uint32_t h, uint32_t w, int c) {
  png_structp p =
      png_create_write_struct(PNG_LIBPNG_VER_STRING, o, png_on_write_error, png_on_warning);
  if (!p) return -1;
  png_infop info = png_create_info_struct(p);
  if (!info || setjmp(png_jmpbuf(p))) {
    png_destroy_write_struct(&p, info ? &info : nullptr);
    return -1;
  }
  static const int types[] = {0, PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_GRAY_ALPHA, PNG_COLOR_TYPE_RGB,
                              PNG_COLOR_TYPE_RGB_ALPHA};
  png_set_write_fn(p, o, png_write_mem, png_flush_mem);
  png_set_IHDR(p, info, w, h, 8, types[c], PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  png_write_info(p, info);
  for (uint32_t y = 0; y < h; ++y)
    png_write_row(p, const_cast<png_bytep>(px + static_cast<std::size_t>(y) * w * c));
  png_write_end(p, nullptr);
  png_destroy_write_struct(&p, &info);
  return 0;
}

// ---- JPEG -------------------------------------------------------------------------------------

struct JpegErr {
  jpeg_error_mgr mgr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};
void jpeg_on_error(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegErr*>(c->err);
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}
void jpeg_on_output(j_common_ptr c) {
  // The first warning (a truncated or damaged stream) is kept: it makes the decode fail.
  auto* e = reinterpret_cast<JpegErr*>(c->err);
  (*c->err->format_message)(c, e->message);
}

int jpeg_decode_raw(DecodeIo* io) {
  jpeg_decompress_struct cinfo;
  JpegErr err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_on_error;
  err.mgr.output_message = jpeg_on_output;
  err.message[0] = 0;
  if (setjmp(err.jump)) {
    io->pos = cinfo.src ? io->size - cinfo.src->bytes_in_buffer : 0;
    std::snprintf(io->message, sizeof io->message, "%s", err.message);
    jpeg_destroy_decompress(&cinfo);
    return -1;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, io->data, static_cast<unsigned long>(io->size));
  jpeg_read_header(&cinfo, TRUE);
  if (!pixels_allowed(io, cinfo.image_width, cinfo.image_height)) {
    std::snprintf(err.message, sizeof err.message, "too many pixels");
    std::longjmp(err.jump, 1);
  }
  const int want = io->want_channels;
  // Colour spaces libjpeg converts to gray and RGB; CMYK, YCCK and unknown ones (any number of
  // components) are not images Kiln can represent as gray, RGB or RGBA.
  if (cinfo.jpeg_color_space != JCS_GRAYSCALE && cinfo.jpeg_color_space != JCS_YCbCr &&
      cinfo.jpeg_color_space != JCS_RGB) {
    const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
    std::snprintf(err.message, sizeof err.message,
                  "unsupported %s colour space with %d components, expected gray, YCbCr or RGB",
                  cmyk ? "CMYK" : "unknown", cinfo.num_components);
    std::longjmp(err.jump, 1);
  }
  if (want == 1) {
    cinfo.out_color_space = JCS_GRAYSCALE;
  } else if (want == 3) {
    cinfo.out_color_space = JCS_RGB;
  } else if (want == 4) {
    cinfo.out_color_space = JCS_EXT_RGBA;
  }
  jpeg_start_decompress(&cinfo);
  const uint32_t w = cinfo.output_width, h = cinfo.output_height;
  const int c = cinfo.output_components;
  uint8_t* buf = io->alloc(io->ctx, h, w, c);
  if (!buf) {
    std::snprintf(err.message, sizeof err.message, "image too large");
    std::longjmp(err.jump, 1);
  }
  while (cinfo.output_scanline < h) {
    JSAMPROW row = buf + static_cast<std::size_t>(cinfo.output_scanline) * w * c;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  if (err.mgr.num_warnings > 0) {
    io->pos = io->size - cinfo.src->bytes_in_buffer;
    std::snprintf(io->message, sizeof io->message, "%s", err.message);
    jpeg_destroy_decompress(&cinfo);
    return -1;
  }
  jpeg_destroy_decompress(&cinfo);
  return 0;
}

struct JpegOut {
  unsigned char* buf;
  unsigned long size;
  char message[JMSG_LENGTH_MAX];
};

int jpeg_encode_raw(JpegOut* o, const uint8_t* px, uint32_t h, uint32_t w, int c, int quality) {
  jpeg_compress_struct cinfo;
  JpegErr err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_on_error;
  err.mgr.output_message = jpeg_on_output;
  if (setjmp(err.jump)) {
    std::snprintf(o->message, sizeof o->message, "%s", err.message);
    jpeg_destroy_compress(&cinfo);
    return -1;
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, &o->buf, &o->size);
  cinfo.image_width = w;
  cinfo.image_height = h;
  cinfo.input_components = c;
  cinfo.in_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < h) {
    JSAMPROW row = const_cast<JSAMPROW>(px + static_cast<std::size_t>(cinfo.next_scanline) * w * c);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  return 0;
}

struct ImageArg {
  Tensor t;
  uint32_t h, w;
  int c;
};
ImageArg image_arg(const Tensor& image, const char* op, int max_c) {
  if (image.dtype() != uint8 || (image.rank() != 2 && image.rank() != 3))
    fail(op, "not an 8-bit image: got ", image.type(), ", expected u8[H, W] or u8[H, W, C]");
  const int c = image.rank() == 3 ? static_cast<int>(image.shape()[2]) : 1;
  if (c < 1 || c > max_c || (max_c == 3 && c == 2))
    fail(op, "unsupported channel count: got ", c, ", expected ", max_c == 3 ? "1 or 3" : "1 to 4");
  if (image.shape()[0] < 1 || image.shape()[1] < 1 || image.shape()[0] > 65535 ||
      image.shape()[1] > 65535)
    fail(op, "unsupported size: got ", image.shape()[0], "x", image.shape()[1],
         ", expected 1 to 65535 pixels a side");
  return {image.contiguous(), static_cast<uint32_t>(image.shape()[0]),
          static_cast<uint32_t>(image.shape()[1]), c};
}

}  // namespace

void check_image_options(const char* op, const ImageReadOptions& options) {
  if (options.channels &&
      (*options.channels < 1 || *options.channels == 2 || *options.channels > 4))
    fail(op, "unsupported channel count: got ", *options.channels, ", expected 1, 3 or 4");
  if (options.max_pixels < 1)
    fail(op, "bad ImageReadOptions::max_pixels: got ", options.max_pixels, ", expected >= 1");
}

}  // namespace detail

Tensor decode_image(std::span<const uint8_t> bytes, std::string_view name,
                    ImageReadOptions options) {
  detail::check_image_options("data.decode_image", options);
  static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), png_sig, 8) == 0)
    return detail::decode_with(detail::png_decode_raw, "data.png", "PNG", bytes, name, options);
  if (bytes.size() >= 3 && bytes[0] == 0xff && bytes[1] == 0xd8 && bytes[2] == 0xff)
    return detail::decode_with(detail::jpeg_decode_raw, "data.jpeg", "JPEG", bytes, name, options);
  char head[40] = {0};
  for (std::size_t i = 0; i < std::min<std::size_t>(bytes.size(), 4); ++i)
    std::snprintf(head + 3 * i, 4, "%02x ", bytes[i]);
  fail("data.decode_image", "unknown image format in '", name, "' at byte 0: got ",
       bytes.empty() ? std::string("an empty file") : "first bytes " + std::string(head),
       ", expected PNG (89 50 4e 47) or JPEG (ff d8 ff)");
}

Tensor read_image(const std::string& path, ImageReadOptions options) {
  const auto bytes = read_file(path);
  return decode_image(bytes, path, options);
}

std::vector<uint8_t> encode_png(const Tensor& image) {
  auto a = detail::image_arg(image, "data.encode_png", 4);
  std::vector<uint8_t> bytes;
  detail::PngOut out{&bytes, {}};
  if (detail::png_encode_raw(&out, a.t.data<uint8_t>(), a.h, a.w, a.c) != 0)
    fail("data.encode_png", "libpng failed: got '", out.message, "', expected success");
  return bytes;
}

std::vector<uint8_t> encode_jpeg(const Tensor& image, int quality) {
  if (quality < 1 || quality > 100)
    fail("data.encode_jpeg", "bad quality: got ", quality, ", expected 1 to 100");
  auto a = detail::image_arg(image, "data.encode_jpeg", 3);
  detail::JpegOut out{nullptr, 0, {}};
  const int rc = detail::jpeg_encode_raw(&out, a.t.data<uint8_t>(), a.h, a.w, a.c, quality);
  std::vector<uint8_t> bytes;
  if (rc == 0) bytes.assign(out.buf, out.buf + out.size);
  std::free(out.buf);
  if (rc != 0)
    fail("data.encode_jpeg", "libjpeg failed: got '", out.message, "', expected success");
  return bytes;
}

}  // namespace kiln::data
