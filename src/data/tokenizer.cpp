#include "kiln/tokenizer.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <queue>
#include <thread>

#include "kiln/error.h"
#include "kiln/runtime.h"

namespace kiln::data {
namespace {

constexpr const char* kOp = "data.BpeTokenizer";
// Chunks are cut into pieces of at most this many bytes (so encoding stays linear in the
// text), which bounds every token's length too.
constexpr std::size_t kMaxChunk = 128;
constexpr int64_t kMaxVocab = int64_t{1} << 24;
// Texts shorter than this per thread are encoded or counted on fewer threads.
constexpr std::size_t kMinBytesPerThread = std::size_t{1} << 16;

bool is_space(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// 0: whitespace, 1: letter (ASCII or any byte of a non-ASCII UTF-8 sequence), 2: digit,
// 3: anything else.
int byte_class(unsigned char c) {
  if (is_space(c)) return 0;
  if (c >= 0x80 || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return 1;
  if (c >= '0' && c <= '9') return 2;
  return 3;
}

// The end of the chunk starting at i, by GPT-2's pattern
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ (tried in order).
std::size_t chunk_end(std::string_view t, std::size_t i) {
  const std::size_t n = t.size();
  if (t[i] == '\'' && i + 1 < n) {
    const char a = t[i + 1], b = i + 2 < n ? t[i + 2] : '\0';
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
  }
  auto c = [&](std::size_t k) { return static_cast<unsigned char>(t[k]); };
  const std::size_t j = t[i] == ' ' && i + 1 < n && !is_space(c(i + 1)) ? i + 1 : i;
  if (!is_space(c(j))) {
    const int kind = byte_class(c(j));
    std::size_t k = j + 1;
    while (k < n && byte_class(c(k)) == kind) ++k;
    return k;
  }
  std::size_t k = i;
  while (k < n && is_space(c(k))) ++k;
  // Followed by a word, a run of two or more leaves its last character to it.
  return k < n && k - i > 1 ? k - 1 : k;
}

// Calls fn(chunk) for each chunk of `t` (pieces of at most kMaxChunk bytes).
template <typename Fn>
void for_each_chunk(std::string_view t, Fn&& fn) {
  for (std::size_t i = 0; i < t.size();) {
    const std::size_t end = chunk_end(t, i);
    for (; i < end; i += std::min(kMaxChunk, end - i))
      fn(t.substr(i, std::min(kMaxChunk, end - i)));
  }
}

// Up to `parts` ranges covering `t`, cut where whitespace follows a non-space: always a chunk
// boundary (the chunk before, a run or a contraction, ends at the whitespace; the one after
// starts there and looks only forward), so the ranges' chunks are the text's.
std::vector<std::string_view> ranges(std::string_view t, int parts) {
  parts = static_cast<int>(
      std::clamp<std::size_t>(t.size() / kMinBytesPerThread, 1, static_cast<std::size_t>(parts)));
  std::vector<std::string_view> out;
  std::size_t start = 0;
  for (int p = 1; p < parts; ++p) {
    std::size_t cut = std::max(
        start + 1, t.size() / static_cast<std::size_t>(parts) * static_cast<std::size_t>(p));
    while (cut < t.size() && !(is_space(static_cast<unsigned char>(t[cut])) &&
                               !is_space(static_cast<unsigned char>(t[cut - 1]))))
      ++cut;
    if (cut >= t.size()) break;
    out.push_back(t.substr(start, cut - start));
    start = cut;
  }
  out.push_back(t.substr(start));
  return out;
}

int thread_count(int threads) { return threads > 0 ? threads : std::max(1, num_threads()); }

// fn(i) for i in [0, n) on n threads (the calling thread runs the first).
template <typename Fn>
void run_parallel(std::size_t n, Fn&& fn) {
  std::vector<std::thread> workers;
  for (std::size_t i = 1; i < n; ++i) workers.emplace_back([&fn, i] { fn(i); });
  if (n > 0) fn(0);
  for (std::thread& w : workers) w.join();
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Merges every occurrence of (left, right) in `s`, left to right, into `id`.
void merge_pair(std::vector<int32_t>& s, int32_t left, int32_t right, int32_t id) {
  std::size_t out = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
      s[out++] = id;
      ++i;
    } else {
      s[out++] = s[i];
    }
  }
  s.resize(out);
}

// BPE training over the distinct chunks (`words`, each with its count).
class Trainer {
 public:
  Trainer(std::vector<std::vector<int32_t>> words, std::vector<int64_t> counts)
      : words_(std::move(words)), counts_(std::move(counts)) {
    for (std::size_t w = 0; w < words_.size(); ++w) add_pairs(static_cast<int32_t>(w), -1, nullptr);
    for (const auto& [key, count] : pairs_) heap_.push({count, key});
  }

  std::vector<Merge> run(int64_t merges) {
    std::vector<Merge> out;
    while (static_cast<int64_t>(out.size()) < merges) {
      const auto best = pop_best();
      if (!best) break;
      const Merge m{static_cast<int32_t>(*best >> 32), static_cast<int32_t>(*best & 0xffffffffu)};
      const auto id = static_cast<int32_t>(256 + out.size());
      out.push_back(m);
      std::vector<int32_t> holders = std::move(where_[*best]);
      where_.erase(*best);
      std::sort(holders.begin(), holders.end());
      holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
      std::vector<uint64_t> fresh;  // pairs with the new token, whose counts only grew
      for (const int32_t w : holders) {
        std::vector<int32_t>& s = words_[static_cast<std::size_t>(w)];
        bool holds = false;
        for (std::size_t i = 0; i + 1 < s.size() && !holds; ++i)
          holds = s[i] == m.left && s[i + 1] == m.right;
        if (!holds) continue;  // merged away by an earlier merge
        remove_pairs(w);
        merge_pair(s, m.left, m.right, id);
        add_pairs(w, id, &fresh);
      }
      pairs_.erase(*best);
      std::sort(fresh.begin(), fresh.end());
      fresh.erase(std::unique(fresh.begin(), fresh.end()), fresh.end());
      for (const uint64_t key : fresh) heap_.push({pairs_.at(key), key});
    }
    return out;
  }

 private:
  struct Entry {
    int64_t count;
    uint64_t key;
    // The heap's top is the largest count, and among equal counts the smallest pair.
    bool operator<(const Entry& o) const {
      return count != o.count ? count < o.count : key > o.key;
    }
  };

  // The most frequent pair now (occurring at least twice), skipping stale heap entries.
  std::optional<uint64_t> pop_best() {
    while (!heap_.empty()) {
      const Entry e = heap_.top();
      heap_.pop();
      const auto it = pairs_.find(e.key);
      const int64_t now = it == pairs_.end() ? 0 : it->second;
      if (now == e.count) {
        if (now < 2) return std::nullopt;
        return e.key;
      }
      if (now > 0) heap_.push({now, e.key});
    }
    return std::nullopt;
  }

  // Counts the pairs of word w; after a merge making `newest`, lists the word under its pairs
  // with `newest` and collects those in `fresh` (the word is listed under the others already).
  void add_pairs(int32_t w, int32_t newest, std::vector<uint64_t>* fresh) {
    const std::vector<int32_t>& s = words_[static_cast<std::size_t>(w)];
    const int64_t count = counts_[static_cast<std::size_t>(w)];
    for (std::size_t i = 0; i + 1 < s.size(); ++i) {
      const uint64_t key = pair_key(s[i], s[i + 1]);
      pairs_[key] += count;
      if (!fresh || s[i] == newest || s[i + 1] == newest) {
        where_[key].push_back(w);
        if (fresh) fresh->push_back(key);
      }
    }
  }

  void remove_pairs(int32_t w) {
    const std::vector<int32_t>& s = words_[static_cast<std::size_t>(w)];
    for (std::size_t i = 0; i + 1 < s.size(); ++i)
      pairs_[pair_key(s[i], s[i + 1])] -= counts_[static_cast<std::size_t>(w)];
  }

  std::vector<std::vector<int32_t>> words_;
  std::vector<int64_t> counts_;
  std::unordered_map<uint64_t, int64_t> pairs_;
  std::unordered_map<uint64_t, std::vector<int32_t>> where_;
  std::priority_queue<Entry> heap_;
};

}  // namespace

std::vector<std::size_t> chunk_ends(std::string_view text) {
  std::vector<std::size_t> ends;
  const char* base = text.data();
  for_each_chunk(text, [&](std::string_view c) {
    ends.push_back(static_cast<std::size_t>(c.data() - base) + c.size());
  });
  return ends;
}

BpeTokenizer::BpeTokenizer() : BpeTokenizer(std::vector<Merge>{}) {}

BpeTokenizer::BpeTokenizer(std::vector<Merge> merges) : merges_(std::move(merges)) {
  if (vocab_size() > kMaxVocab)
    fail(kOp, "too many merges: got ", merges_.size(), ", expected at most ", kMaxVocab - 256);
  bytes_.reserve(static_cast<std::size_t>(vocab_size()));
  for (int c = 0; c < 256; ++c) bytes_.emplace_back(1, static_cast<char>(c));
  for (std::size_t r = 0; r < merges_.size(); ++r) {
    const Merge m = merges_[r];
    const auto made = static_cast<int32_t>(256 + r);
    if (m.left < 0 || m.right < 0 || m.left >= made || m.right >= made)
      fail(kOp, "merge ", r, " names a token not made before it: got (", m.left, ", ", m.right,
           "), expected ids below ", made);
    const std::size_t length = bytes_[static_cast<std::size_t>(m.left)].size() +
                               bytes_[static_cast<std::size_t>(m.right)].size();
    if (length > kMaxChunk)
      fail(kOp, "merge ", r, " makes a token of ", length, " bytes, expected at most ", kMaxChunk,
           " (the longest chunk)");
    if (!rank_.emplace(pair_key(m.left, m.right), static_cast<int32_t>(r)).second)
      fail(kOp, "merge ", r, " repeats merge ", rank_.at(pair_key(m.left, m.right)), ": (", m.left,
           ", ", m.right, ")");
    bytes_.push_back(bytes_[static_cast<std::size_t>(m.left)] +
                     bytes_[static_cast<std::size_t>(m.right)]);
  }
}

BpeTokenizer BpeTokenizer::train(std::string_view text, BpeTrainOptions options) {
  if (options.vocab_size < 256 || options.vocab_size > kMaxVocab)
    fail(kOp, "bad vocabulary size: got ", options.vocab_size, ", expected 256 (the bytes) to ",
         kMaxVocab);
  // The distinct chunks and their counts, counted per range in parallel, then added up.
  const std::vector<std::string_view> parts = ranges(text, thread_count(options.threads));
  std::vector<std::unordered_map<std::string_view, int64_t>> counted(parts.size());
  run_parallel(parts.size(), [&](std::size_t p) {
    for_each_chunk(parts[p], [&](std::string_view c) { ++counted[p][c]; });
  });
  std::unordered_map<std::string_view, int64_t> all = std::move(counted[0]);
  for (std::size_t p = 1; p < counted.size(); ++p)
    for (const auto& [chunk, count] : counted[p]) all[chunk] += count;
  std::vector<std::pair<std::string_view, int64_t>> sorted(all.begin(), all.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> counts;
  for (const auto& [chunk, count] : sorted) {
    if (chunk.size() < 2) continue;  // holds no pair
    words.emplace_back(chunk.begin(), chunk.end());
    for (int32_t& b : words.back()) b = static_cast<unsigned char>(b);
    counts.push_back(count);
  }
  return BpeTokenizer(Trainer(std::move(words), std::move(counts)).run(options.vocab_size - 256));
}

const std::string& BpeTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    fail(kOp, "token id out of range: got ", id, ", expected 0 to ", vocab_size() - 1);
  return bytes_[static_cast<std::size_t>(id)];
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, int threads) const {
  const std::vector<std::string_view> parts = ranges(text, thread_count(threads));
  std::vector<std::vector<int32_t>> out(parts.size());
  run_parallel(parts.size(), [&](std::size_t p) {
    // Chunks seen before in this range: their tokens' place in `tokens`.
    std::unordered_map<std::string_view, std::pair<std::size_t, std::size_t>> seen;
    std::vector<int32_t>& tokens = out[p];
    std::vector<int32_t> s;
    tokens.reserve(parts[p].size() / 3);
    for_each_chunk(parts[p], [&](std::string_view c) {
      if (const auto it = seen.find(c); it != seen.end()) {
        const auto [at, n] = it->second;
        for (std::size_t i = 0; i < n; ++i) tokens.push_back(tokens[at + i]);
        return;
      }
      s.assign(c.begin(), c.end());
      for (int32_t& b : s) b = static_cast<unsigned char>(b);
      // The lowest-ranked merge present, until none is.
      while (s.size() > 1) {
        int32_t best = -1;
        for (std::size_t i = 0; i + 1 < s.size(); ++i)
          if (const auto it = rank_.find(pair_key(s[i], s[i + 1]));
              it != rank_.end() && (best < 0 || it->second < best))
            best = it->second;
        if (best < 0) break;
        const Merge m = merges_[static_cast<std::size_t>(best)];
        merge_pair(s, m.left, m.right, 256 + best);
      }
      if (seen.size() < (std::size_t{1} << 18)) seen.emplace(c, std::pair{tokens.size(), s.size()});
      tokens.insert(tokens.end(), s.begin(), s.end());
    });
  });
  std::vector<int32_t> all = std::move(out[0]);
  for (std::size_t p = 1; p < out.size(); ++p) all.insert(all.end(), out[p].begin(), out[p].end());
  return all;
}

namespace {
template <typename Id>
std::string decode_ids(const BpeTokenizer& t, std::span<const Id> ids) {
  std::string out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= t.vocab_size())
      fail(kOp, "decode: id ", i, " is out of range: got ", ids[i], ", expected 0 to ",
           t.vocab_size() - 1);
    out += t.token_bytes(static_cast<int32_t>(ids[i]));
  }
  return out;
}
}  // namespace

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  return decode_ids(*this, ids);
}
std::string BpeTokenizer::decode(std::span<const int64_t> ids) const {
  return decode_ids(*this, ids);
}

std::string BpeTokenizer::to_string() const {
  std::string out = "kiln-bpe 1\nmerges " + std::to_string(merges_.size()) + "\n";
  for (const Merge& m : merges_)
    out += std::to_string(m.left) + " " + std::to_string(m.right) + "\n";
  return out;
}

BpeTokenizer BpeTokenizer::parse(std::string_view text) {
  std::size_t at = 0, line_number = 0;
  auto next_line = [&]() -> std::optional<std::string_view> {
    if (at >= text.size()) return std::nullopt;
    const std::size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view line = text.substr(at, end - at);
    at = end + 1;
    ++line_number;
    return line;
  };
  // A decimal number in [0, limit) filling `s` exactly.
  auto number = [&](std::string_view s, int64_t limit, const char* what) {
    int64_t v = -1;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || s.empty() || v < 0 || v >= limit)
      fail(kOp, "line ", line_number, ": bad ", what, ": got '", s,
           "', expected a number from 0 to ", limit - 1);
    return v;
  };
  const auto header = next_line();
  if (!header || *header != "kiln-bpe 1")
    fail(kOp, "not a saved tokenizer: got a first line of '", header.value_or("").substr(0, 40),
         "', expected 'kiln-bpe 1'");
  const auto count_line = next_line();
  if (!count_line || count_line->substr(0, 7) != "merges ")
    fail(kOp, "line 2: expected 'merges N', got '", count_line.value_or("").substr(0, 40), "'");
  const int64_t count = number(count_line->substr(7), kMaxVocab - 256 + 1, "merge count");
  std::vector<Merge> merges;
  for (int64_t r = 0; r < count; ++r) {
    const auto line = next_line();
    if (!line) fail(kOp, "truncated: got ", r, " merges, expected ", count);
    const std::size_t space = line->find(' ');
    if (space == std::string_view::npos)
      fail(kOp, "line ", line_number, ": expected two token ids, got '", line->substr(0, 40), "'");
    const int64_t made = 256 + r;
    merges.push_back({static_cast<int32_t>(number(line->substr(0, space), made, "token id")),
                      static_cast<int32_t>(number(line->substr(space + 1), made, "token id"))});
  }
  if (at < text.size())
    fail(kOp, "line ", line_number + 1, ": unexpected text after the ", count, " merges");
  return BpeTokenizer(std::move(merges));
}

}  // namespace kiln::data
