// libFuzzer target: a sharded checkpoint's shard file (docs/CHECKPOINTS.md, "Sharded
// checkpoints") on arbitrary bytes: parsed as safetensors, then its pieces put back together
// by kiln::distributed::assemble_pieces, as load_sharded does.
//
// Every input must either assemble or raise kiln::Error; a crash, a sanitizer report, a leak
// or any other exception is a bug. What assembles must hold each piece where its placement
// says: every tensor has the type its placements declare.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kiln/sharded_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  kiln::io::TensorFile shard;
  try {
    shard = kiln::io::parse_safetensors({data, size}, "<fuzz>");
  } catch (const kiln::Error&) {
    return 0;  // rejected cleanly
  }
  try {
    const kiln::io::TensorFile whole = kiln::distributed::assemble_pieces({shard}, "<fuzz>");
    for (const kiln::io::NamedTensor& t : whole.tensors) {
      bool found = false;  // a piece "<name>#<k>" of its dtype
      for (const kiln::io::NamedTensor& piece : shard.tensors)
        found = found || (piece.name.rfind(t.name + "#", 0) == 0 &&
                          piece.tensor.dtype() == t.tensor.dtype());
      if (!found) {
        std::fprintf(stderr, "fuzz_sharded: '%s' assembled from nothing or in another dtype\n",
                     t.name.c_str());
        std::abort();
      }
    }
  } catch (const kiln::Error&) {
  }
  return 0;
}
