// libFuzzer target: kiln::io::parse_safetensors on arbitrary bytes (docs/CHECKPOINTS.md).
//
// Every input must either parse or raise kiln::Error; a crash, a sanitizer report, a leak or any
// other exception is a bug. Inputs that parse are written back and parsed again, and the result
// must be the same tensors and metadata.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kiln/io.h"

namespace {

[[noreturn]] void bug(const char* what) {
  std::fprintf(stderr, "fuzz_safetensors: %s\n", what);
  std::abort();
}

bool same_bytes(const kiln::Tensor& a, const kiln::Tensor& b) {
  const std::size_t n = static_cast<std::size_t>(a.numel()) * kiln::dtype_size(a.dtype());
  return n == 0 || std::memcmp(a.raw_data(), b.raw_data(), n) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  kiln::io::TensorFile file;
  try {
    file = kiln::io::parse_safetensors({data, size}, "<fuzz>");
  } catch (const kiln::Error&) {
    return 0;  // rejected cleanly
  }
  for (const kiln::io::NamedTensor& t : file.tensors)
    if (t.name.empty()) return 0;  // readable, but the writer refuses empty names
  std::vector<uint8_t> bytes;
  kiln::io::TensorFile again;
  try {
    bytes = kiln::io::serialize_safetensors(file.tensors, file.metadata);
    again = kiln::io::parse_safetensors(bytes, "<round trip>");
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    bug("a file that parsed did not survive serialize + parse");
  }
  if (again.metadata != file.metadata) bug("metadata changed in a round trip");
  if (again.tensors.size() != file.tensors.size()) bug("tensor count changed in a round trip");
  for (std::size_t i = 0; i < file.tensors.size(); ++i) {
    const kiln::io::NamedTensor& a = file.tensors[i];
    const kiln::io::NamedTensor& b = again.tensors[i];
    if (a.name != b.name || a.tensor.type() != b.tensor.type() || !same_bytes(a.tensor, b.tensor))
      bug("a tensor changed in a round trip");
  }
  return 0;
}
