// libFuzzer target: kiln::data::decode_image on JPEG-like bytes (the seeds and the dictionary are
// JPEG's); the checks are in image_decoding.h.
#include "image_decoding.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  return image_decoding::check("fuzz_jpeg", data, size);
}
