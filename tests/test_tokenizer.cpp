// Tests of kiln::data::BpeTokenizer. The chunks are checked against splits worked out by hand
// from GPT-2's pattern; training against a brute-force trainer written here (every pair
// recounted over every chunk occurrence after each merge) and encoding against applying the
// merges one after another in rank order; the thread count must change nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kiln/tokenizer.h"
#include "testing.h"

namespace {

using kiln::data::BpeTokenizer;
using kiln::data::chunk_ends;
using kiln::data::Merge;
using kiln::testing::expect_error;

std::vector<std::string> chunks(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (const std::size_t end : chunk_ends(text)) {
    out.push_back(text.substr(start, end - start));
    start = end;
  }
  return out;
}

TEST(Tokenizer, ChunksFollowGpt2Pattern) {
  using V = std::vector<std::string>;
  EXPECT_EQ(chunks("Hello world's  end\n\nok 123!! x"),
            (V{"Hello", " world", "'s", " ", " end", "\n", "\n", "ok", " 123", "!!", " x"}));
  // Contractions come first; an apostrophe otherwise joins the symbols around it.
  EXPECT_EQ(chunks("we'll they're I'm it'd !'s 'x"),
            (V{"we", "'ll", " they", "'re", " I", "'m", " it", "'d", " !'", "s", " '", "x"}));
  // Whitespace at the end stays one chunk; a tab does not join the word after it.
  EXPECT_EQ(chunks("a\tb   "), (V{"a", "\t", "b", "   "}));
  EXPECT_EQ(chunks(" \n x"), (V{" \n", " x"}));
  // Non-ASCII UTF-8 bytes count as letters; digits and letters part.
  EXPECT_EQ(chunks("caf\xc3\xa9 2x"), (V{"caf\xc3\xa9", " 2", "x"}));
  // A run longer than 128 bytes is cut into 128-byte pieces.
  const V long_run = chunks(std::string(300, 'a'));
  EXPECT_EQ(long_run, (V{std::string(128, 'a'), std::string(128, 'a'), std::string(44, 'a')}));
  EXPECT_TRUE(chunk_ends("").empty());
}

// The merges by brute force: after each merge every pair is recounted over every chunk of the
// text; the most frequent wins, ties to the smallest (left, right); stop below two.
std::vector<Merge> reference_train(const std::string& text, int64_t vocab) {
  std::vector<std::vector<int32_t>> words;
  for (const std::string& c : chunks(text)) {
    words.emplace_back();
    for (const char b : c) words.back().push_back(static_cast<unsigned char>(b));
  }
  std::vector<Merge> merges;
  while (256 + static_cast<int64_t>(merges.size()) < vocab) {
    std::map<std::pair<int32_t, int32_t>, int64_t> counts;
    for (const auto& w : words)
      for (std::size_t i = 0; i + 1 < w.size(); ++i) ++counts[{w[i], w[i + 1]}];
    std::pair<int32_t, int32_t> best{};
    int64_t most = 1;
    for (const auto& [pair, count] : counts)  // in increasing order: strict > keeps the first
      if (count > most) best = pair, most = count;
    if (most < 2) break;
    const auto id = static_cast<int32_t>(256 + merges.size());
    merges.push_back({best.first, best.second});
    for (auto& w : words) {
      std::vector<int32_t> out;
      for (std::size_t i = 0; i < w.size(); ++i) {
        if (i + 1 < w.size() && w[i] == best.first && w[i + 1] == best.second) {
          out.push_back(id);
          ++i;
        } else {
          out.push_back(w[i]);
        }
      }
      w = out;
    }
  }
  return merges;
}

// Encoding by applying each merge in rank order to every chunk.
std::vector<int32_t> reference_encode(const std::vector<Merge>& merges, const std::string& text) {
  std::vector<int32_t> all;
  for (const std::string& c : chunks(text)) {
    std::vector<int32_t> w;
    for (const char b : c) w.push_back(static_cast<unsigned char>(b));
    for (std::size_t r = 0; r < merges.size(); ++r) {
      std::vector<int32_t> out;
      for (std::size_t i = 0; i < w.size(); ++i) {
        if (i + 1 < w.size() && w[i] == merges[r].left && w[i + 1] == merges[r].right) {
          out.push_back(static_cast<int32_t>(256 + r));
          ++i;
        } else {
          out.push_back(w[i]);
        }
      }
      w = out;
    }
    all.insert(all.end(), w.begin(), w.end());
  }
  return all;
}

// Words from a small alphabet with Zipf-like frequencies, spaces, punctuation and newlines.
std::string sample_text(std::size_t words, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> lexicon;
  for (int i = 0; i < 300; ++i) {
    std::string w;
    const int n = 1 + static_cast<int>(rng() % 8);
    for (int k = 0; k < n; ++k) w += "etaoinshrdlu"[rng() % 12];
    lexicon.push_back(w);
  }
  std::string text;
  for (std::size_t i = 0; i < words; ++i) {
    const auto r = static_cast<double>(rng() % 10000) / 10000.0;
    text += lexicon[static_cast<std::size_t>(r * r * r * 300)];
    const uint32_t sep = rng() % 20;
    text += sep == 0 ? ".\n" : sep == 1 ? ", " : sep == 2 ? "  " : sep == 3 ? "'s " : " ";
  }
  return text;
}

TEST(Tokenizer, TrainingMatchesBruteForce) {
  for (const uint32_t seed : {1u, 2u}) {
    const std::string text = sample_text(3000, seed);
    const std::vector<Merge> expected = reference_train(text, 400);
    ASSERT_GT(expected.size(), 100u);
    const BpeTokenizer t = BpeTokenizer::train(text, {.vocab_size = 400, .threads = 1});
    EXPECT_EQ(t.merges(), expected);
    EXPECT_EQ(t.encode(text, 1), reference_encode(expected, text));
  }
}

TEST(Tokenizer, StopsWhenNoPairRepeats) {
  const BpeTokenizer t = BpeTokenizer::train("abab cd", {.vocab_size = 1000});
  EXPECT_EQ(t.merges(), (std::vector<Merge>{{'a', 'b'}}));  // "ab" twice; nothing else
  EXPECT_EQ(t.vocab_size(), 257);
  EXPECT_EQ(t.token_bytes(256), "ab");
}

TEST(Tokenizer, ThreadCountChangesNothing) {
  // Over 64 KiB per thread, so that 2 and 3 threads do cut the text.
  const std::string text = sample_text(120000, 3);
  ASSERT_GT(text.size(), std::size_t{3} << 16);
  const BpeTokenizer one = BpeTokenizer::train(text, {.vocab_size = 600, .threads = 1});
  const std::vector<int32_t> ids = one.encode(text, 1);
  for (const int threads : {2, 3}) {
    EXPECT_EQ(BpeTokenizer::train(text, {.vocab_size = 600, .threads = threads}), one);
    EXPECT_EQ(one.encode(text, threads), ids);
  }
  EXPECT_EQ(one.decode(ids), text);
}

TEST(Tokenizer, AnyBytesRoundTrip) {
  const BpeTokenizer t = BpeTokenizer::train(sample_text(2000, 4), {.vocab_size = 350});
  std::mt19937 rng(5);
  for (int trial = 0; trial < 50; ++trial) {
    std::string bytes(rng() % 400, '\0');
    for (char& b : bytes)
      b = static_cast<char>(rng() % 4 == 0 ? rng() % 256 : "ab ta'\n"[rng() % 7]);
    const std::vector<int32_t> ids = t.encode(bytes);
    EXPECT_EQ(ids, reference_encode(t.merges(), bytes));
    EXPECT_EQ(t.decode(ids), bytes);
  }
}

TEST(Tokenizer, SavedTextRoundTrips) {
  const BpeTokenizer t = BpeTokenizer::train(sample_text(2000, 6), {.vocab_size = 300});
  const std::string saved = t.to_string();
  EXPECT_EQ(saved.rfind("kiln-bpe 1\nmerges 44\n", 0), 0u);
  EXPECT_EQ(BpeTokenizer::parse(saved), t);
  EXPECT_EQ(BpeTokenizer::parse("kiln-bpe 1\nmerges 0\n").vocab_size(), 256);
}

TEST(Tokenizer, BadInputIsAnError) {
  const std::string op = "data.BpeTokenizer";
  expect_error([] { BpeTokenizer::train("abc", {.vocab_size = 255}); }, op,
               {"bad vocabulary size", "got 255", "expected 256"});
  expect_error([] { BpeTokenizer::parse("gpt2 merges\n"); }, op,
               {"not a saved tokenizer", "'gpt2 merges'"});
  expect_error([] { BpeTokenizer::parse("kiln-bpe 1\nmerges 2\n97 98\n"); }, op,
               {"truncated", "got 1 merges, expected 2"});
  expect_error([] { BpeTokenizer::parse("kiln-bpe 1\nmerges 1\n97 256\n"); }, op,
               {"line 3", "bad token id", "'256'", "from 0 to 255"});
  expect_error([] { BpeTokenizer::parse("kiln-bpe 1\nmerges 1\n97 -1\n"); }, op,
               {"line 3", "bad token id"});
  expect_error([] { BpeTokenizer::parse("kiln-bpe 1\nmerges 1\n97 98\nextra"); }, op,
               {"line 4", "unexpected text"});
  expect_error([] { BpeTokenizer::parse("kiln-bpe 1\nmerges 99999999999\n"); }, op,
               {"bad merge count"});
  expect_error([] { BpeTokenizer({{97, 98}, {97, 98}}); }, op, {"merge 1 repeats merge 0"});
  // Doubling a token's length each merge would outgrow any chunk: rejected, not allocated.
  std::vector<Merge> doubling{{97, 97}};
  for (int32_t r = 0; r < 40; ++r) doubling.push_back({256 + r, 256 + r});
  expect_error([&] { BpeTokenizer{doubling}; }, op, {"makes a token of 256 bytes"});
  const BpeTokenizer t;
  expect_error(
      [&] {
        t.decode(std::vector<int32_t>{1, 300});
      },
      op, {"decode: id 1 is out of range", "got 300", "0 to 255"});
  expect_error([&] { t.token_bytes(-1); }, op, {"out of range"});
}

}  // namespace
