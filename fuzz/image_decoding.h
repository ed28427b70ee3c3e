// The check shared by fuzz_png and fuzz_jpeg: kiln::data::decode_image on arbitrary bytes, with
// each channel option (docs/DATA.md).
//
// Every input must either decode or raise kiln::Error; a crash, a sanitizer report, a leak or any
// other exception is a bug. A decoded image must be u8[H, W, C] with the channels asked for and
// at most max_pixels pixels; it must survive encode_png + decode unchanged (PNG is lossless), and
// encode_jpeg + decode with its shape.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "kiln/data.h"

namespace image_decoding {

[[noreturn]] inline void bug(const char* target, const char* what) {
  std::fprintf(stderr, "%s: %s\n", target, what);
  std::abort();
}

// Small enough that an image under it decodes quickly.
constexpr int64_t kMaxPixels = int64_t{1} << 20;

inline int check(const char* target, const uint8_t* data, std::size_t size) {
  namespace kd = kiln::data;
  for (const std::optional<int> channels : {std::optional<int>(), std::optional<int>(1),
                                            std::optional<int>(3), std::optional<int>(4)}) {
    kiln::Tensor image;
    try {
      image = kd::decode_image({data, size}, "<fuzz>",
                               {.channels = channels, .max_pixels = kMaxPixels});
    } catch (const kiln::Error&) {
      continue;  // rejected cleanly
    }
    if (image.dtype() != kiln::uint8 || image.rank() != 3) bug(target, "not a u8[H, W, C] image");
    const int64_t h = image.shape()[0], w = image.shape()[1], c = image.shape()[2];
    if (h < 1 || w < 1 || h * w > kMaxPixels) bug(target, "a size the limit should have refused");
    if (channels ? c != *channels : c < 1 || c > 4) bug(target, "unexpected channel count");
    try {
      const kiln::Tensor again = kd::decode_image(kd::encode_png(image), "<png round trip>");
      const std::size_t n = static_cast<std::size_t>(image.numel());
      if (again.type() != image.type() || std::memcmp(again.raw_data(), image.raw_data(), n) != 0)
        bug(target, "an image changed in a PNG round trip");
      if (c == 1 || c == 3) {
        const kiln::Tensor jpeg = kd::decode_image(kd::encode_jpeg(image), "<jpeg round trip>");
        if (jpeg.type() != image.type()) bug(target, "an image changed shape in a JPEG round trip");
      }
    } catch (const kiln::Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      bug(target, "a decoded image did not survive encoding and decoding again");
    }
  }
  return 0;
}

}  // namespace image_decoding
