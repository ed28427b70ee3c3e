// Byte-level BPE (kiln::data::BpeTokenizer): training time and encoding throughput on the
// fortunes corpus (the GPT job's default text), for vocabularies of 512, 2048 and 8192 tokens,
// on 1 and 2 threads. Encoding is timed on the whole corpus, each run with a fresh chunk cache
// (as every encode() call starts one), best and median of the runs. No peer: Debian 12
// packages no BPE tokenizer (neither Hugging Face's tokenizers nor tiktoken).
//
//   bench_tokenizer [--runs R] [--text FILE...]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/tokenizer.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string read_all(const std::vector<std::string>& files) {
  std::string text;
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::ostringstream os;
    os << in.rdbuf();
    text += os.str();
  }
  return text;
}

std::vector<std::string> fortunes() {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator("/usr/share/games/fortunes"))
    if (e.is_regular_file() && !e.is_symlink() &&
        e.path().filename().string().find('.') == std::string::npos)
      files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 5;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--runs") && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--text")) {
      while (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) files.push_back(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: bench_tokenizer [--runs R] [--text FILE...]\n");
      return 2;
    }
  }
  if (files.empty()) files = fortunes();
  const std::string text = read_all(files);
  std::printf("BPE on %.2f MB of text (%zu files); %d runs each\n\n", text.size() * 1e-6,
              files.size(), runs);
  std::printf(
      "| vocabulary (reached) | threads | train (s) | encode best (MB/s) | median (MB/s) | "
      "bytes/token |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|\n");
  for (const int64_t vocab : {512, 2048, 8192}) {
    for (const int threads : {1, 2}) {
      const auto t0 = Clock::now();
      const kiln::data::BpeTokenizer tok =
          kiln::data::BpeTokenizer::train(text, {.vocab_size = vocab, .threads = threads});
      const double train_s = seconds_since(t0);
      std::vector<double> rates;
      std::size_t tokens = 0;
      for (int r = 0; r < runs; ++r) {
        const auto t = Clock::now();
        tokens = tok.encode(text, threads).size();
        rates.push_back(static_cast<double>(text.size()) / seconds_since(t) * 1e-6);
      }
      std::sort(rates.begin(), rates.end());
      std::printf("| %lld (%lld) | %d | %.2f | %.1f | %.1f | %.2f |\n",
                  static_cast<long long>(vocab), static_cast<long long>(tok.vocab_size()), threads,
                  train_s, rates.back(), rates[rates.size() / 2],
                  static_cast<double>(text.size()) / static_cast<double>(tokens));
    }
  }
}
