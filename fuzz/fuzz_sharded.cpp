// libFuzzer target: a sharded checkpoint's shard file (docs/CHECKPOINTS.md, "Sharded
// checkpoints") on arbitrary bytes: parsed as safetensors, then its pieces put back together
// by kiln::distributed::assemble_pieces, as load_sharded does.
//
// Every input must either assemble or raise kiln::Error; a crash, a sanitizer report, a leak
// or any other exception is a bug. What assembles must hold every piece, element for element,
// where its placement puts it.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kiln/ops.h"
#include "kiln/sharded_checkpoint.h"

namespace {

[[noreturn]] void bug(const char* what, const std::string& name) {
  std::fprintf(stderr, "fuzz_sharded: %s: '%s'\n", what, name.c_str());
  std::abort();
}

bool same_bytes(const kiln::Tensor& a, const kiln::Tensor& b) {
  if (a.type() != b.type()) return false;
  const std::size_t n = static_cast<std::size_t>(a.numel()) * kiln::dtype_size(a.dtype());
  return n == 0 || std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), n) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  kiln::io::TensorFile shard;
  kiln::io::TensorFile whole;
  try {
    shard = kiln::io::parse_safetensors({data, size}, "<fuzz>");
    whole = kiln::distributed::assemble_pieces({shard}, "<fuzz>");
  } catch (const kiln::Error&) {
    return 0;  // rejected cleanly
  }
  // Assembled: every "<name>#<k>" is a valid piece with a valid placement "<name>#<k>#at".
  for (const kiln::io::NamedTensor& t : shard.tensors) {
    if (t.name.size() > 3 && t.name.compare(t.name.size() - 3, 3, "#at") == 0) continue;
    const std::string name = t.name.substr(0, t.name.rfind('#'));
    const kiln::Tensor* all = whole.find(name);
    const kiln::Tensor* at = shard.find(t.name + "#at");
    if (!all || !at) bug("a piece's tensor or placement is missing after assembling", t.name);
    const std::vector<int64_t> v = at->to_vector<int64_t>();
    const int64_t rank = v[1];
    const std::vector<int64_t> start(v.begin() + 2 + rank, v.end());
    kiln::Tensor region;
    if (v[0] == 1) {
      region = kiln::slice(kiln::reshape(*all, kiln::Shape{all->numel()}),
                           {kiln::Slice{start[0], start[0] + t.tensor.numel()}});
    } else {
      std::vector<kiln::Slice> slices;
      for (int64_t d = 0; d < rank; ++d)
        slices.push_back(kiln::Slice{
            start[static_cast<std::size_t>(d)],
            start[static_cast<std::size_t>(d)] + t.tensor.shape()[static_cast<int>(d)]});
      region = rank == 0 ? *all : kiln::slice(*all, slices);
    }
    if (!same_bytes(region, t.tensor)) bug("a piece is not where its placement puts it", t.name);
  }
  return 0;
}
