// Byte-level BPE tokenization (GPT-2's scheme): trained on a corpus in parallel and
// deterministically, encoded in parallel, saved as a short text. See docs/DATA.md,
// "Tokenizer".
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kiln::data {

// Two tokens merged into one.
struct Merge {
  int32_t left = 0, right = 0;
  bool operator==(const Merge&) const = default;
};

struct BpeTrainOptions {
  int64_t vocab_size = 512;  // 256 byte tokens + the merges (fewer when no pair occurs twice)
  int threads = 0;           // 0: num_threads()
};

// Tokens 0..255 are the bytes; token 256 + r is merges()[r], the concatenation of its two
// tokens. Every byte string encodes (no unknown token) and decodes back to itself.
class BpeTokenizer {
 public:
  // The byte tokens alone.
  BpeTokenizer();
  // Merges learned from `text`: the most frequent adjacent pair within the text's chunks (ties
  // to the smallest ids), merged, and again, until options.vocab_size tokens. Raises Error for
  // a vocab_size below 256 or above 2^24.
  static BpeTokenizer train(std::string_view text, BpeTrainOptions options = {});
  // From merges; raises Error when one names a token not made before it.
  explicit BpeTokenizer(std::vector<Merge> merges);

  int64_t vocab_size() const { return 256 + static_cast<int64_t>(merges_.size()); }
  const std::vector<Merge>& merges() const { return merges_; }
  // The bytes of a token; raises Error for an id outside [0, vocab_size()).
  const std::string& token_bytes(int32_t id) const;

  // The tokens of `text`, in parallel over `threads` ranges (0: num_threads()); the same ids
  // for any thread count.
  std::vector<int32_t> encode(std::string_view text, int threads = 0) const;
  // The bytes of `ids`; raises Error naming the first id outside [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids) const;
  std::string decode(std::span<const int64_t> ids) const;

  // "kiln-bpe 1\nmerges N\n" then one "left right" line per merge; parse() reads it back,
  // raising Error naming the line for anything else.
  std::string to_string() const;
  static BpeTokenizer parse(std::string_view text);

  bool operator==(const BpeTokenizer& other) const { return merges_ == other.merges_; }

 private:
  std::vector<Merge> merges_;
  std::vector<std::string> bytes_;              // of every token
  std::unordered_map<uint64_t, int32_t> rank_;  // (left << 32 | right) -> merge index
};

// GPT-2's pre-tokenization, read on bytes: where `text`'s chunks end (each chunk [previous end,
// end)). BPE merges happen within chunks only.
std::vector<std::size_t> chunk_ends(std::string_view text);

}  // namespace kiln::data
