// libFuzzer target: kiln::data::BpeTokenizer::parse on arbitrary bytes (a saved tokenizer is
// read from a checkpoint's metadata, docs/DATA.md "Tokenizer"), and training on them.
//
// Parsing must either load or raise kiln::Error; a tokenizer that loads must save to text that
// loads as the same tokenizer, and encode any bytes (the input itself) to ids that decode back
// to them. Training on the input as a corpus must give a tokenizer with the same properties.
// The thread count must change nothing: the input repeated past 128 KiB (texts are cut into
// ranges of at least 64 KiB per thread) trains and encodes the same on one thread and two (for
// one input in eight).
// A crash, a sanitizer report or another exception is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
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
  if (t.decode(t.encode(text, 1)) != text) bug("decode(encode(text)) != text");
}

// The input repeated to more than two threads' minimum share of a text.
std::string repeated(std::string_view text) {
  std::string out;
  while (out.size() <= (std::size_t{1} << 17)) out += text;
  return out;
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
    check(kd::BpeTokenizer::train(text, {.vocab_size = 300, .threads = 1}), text);
    // A sample of the inputs (those whose length is a multiple of 8): the repeated text takes
    // tens of milliseconds under the sanitizers, and would slow the rest of the search.
    if (text.empty() || text.size() % 8 != 0) return 0;
    const std::string big = repeated(text);
    const kd::BpeTokenizer one = kd::BpeTokenizer::train(big, {.vocab_size = 300, .threads = 1});
    if (kd::BpeTokenizer::train(big, {.vocab_size = 300, .threads = 2}) != one)
      bug("two threads train differently");
    if (one.encode(big, 2) != one.encode(big, 1)) bug("two threads encode differently");
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    bug("training on text failed");
  }
  return 0;
}
