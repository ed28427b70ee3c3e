// libFuzzer target: kiln::data::BpeTokenizer::parse on arbitrary bytes (a saved tokenizer is
// read from a checkpoint's metadata, docs/DATA.md "Tokenizer"), and training on them.
//
// Parsing must either load or raise kiln::Error; a tokenizer that loads must save to text that
// loads as the same tokenizer, and encode any bytes (the input itself) to ids that decode back
// to them. Training on the input as a corpus must give a tokenizer with the same properties,
// the same for one thread and two. A crash, a sanitizer report or another exception is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "kiln/error.h"
#include "kiln/tokenizer.h"

namespace {

namespace kd = kiln::data;

[[noreturn]] void bug(const char* what) {
  std::fprintf(stderr, "fuzz_bpe: %s\n", what);
  std::abort();
}

void check(const kd::BpeTokenizer& t, std::string_view text) {
  if (kd::BpeTokenizer::parse(t.to_string()) != t) bug("saved text loads differently");
  const std::vector<int32_t> ids = t.encode(text, 1);
  if (t.decode(ids) != text) bug("decode(encode(text)) != text");
  if (t.encode(text, 2) != ids) bug("two threads encode differently");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    check(kd::BpeTokenizer::parse(text), text);
  } catch (const kiln::Error&) {
    // rejected cleanly
  }
  try {
    const kd::BpeTokenizer trained =
        kd::BpeTokenizer::train(text, {.vocab_size = 300, .threads = 1});
    if (kd::BpeTokenizer::train(text, {.vocab_size = 300, .threads = 2}) != trained)
      bug("two threads train differently");
    check(trained, text);
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    bug("training on text failed");
  }
  return 0;
}
