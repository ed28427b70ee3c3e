// `make demo-gpt`: trains a GPT (GPT-2's architecture, examples/support/gpt_model.h) on text, byte
// by byte, and samples from it. The default corpus is the fortune cookies of Debian's `fortunes`
// package (about 2.5 MB of English quotations, jokes and verse, installed by
// scripts/install-deps.sh); `--text FILE...` takes any UTF-8 files. The last tenth of the text
// is held out for validation. Each step trains on random windows of block_size + 1 tokens
// drawn from a generator keyed by the seed and the step (so a run is reproducible and resumes
// exactly), with AdamW (weight decay on matrices only), linear warmup then cosine decay,
// gradient clipping and optional gradient accumulation and dropout, all in one jitted step.
// The progress bar shows the loss, tokens/s and the model FLOPs utilisation (the share of the
// machine's FMA peak, kiln::machine_peak); every --eval-every steps it measures the validation
// loss and writes an atomic checkpoint, metrics.csv and an SVG of the loss curves. At the end
// it samples --sample bytes from --prompt. `--dtype bf16` computes the forward and backward
// passes in bfloat16 with float32 master weights; `mpirun -np N gpt --data-parallel` trains on
// N processes, each taking 1/N of every batch, and `--zero 1|2|3` shards the optimiser state
// (and at stage 3 the weights) over them (docs/DISTRIBUTED.md). `gpt --help` lists the flags.
#include <kiln/distributed.h>
#include <kiln/io.h>
#include <kiln/kiln.h>
#include <kiln/optim.h>
#include <kiln/profile.h>
#include <kiln/sharded_checkpoint.h>
#include <kiln/tokenizer.h>
#include <kiln/zero.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/gpt_layouts.h"
#include "support/gpt_model.h"
#include "support/mpirun.h"
#include "support/report.h"

using namespace kiln;
using mpirun::leader;
namespace fs = std::filesystem;

using gpt::TrainState;

// ---- checkpoints -----------------------------------------------------------------------------

// A run's checkpoint in its directory: checkpoint.safetensors, the whole state (one process,
// data parallelism), or checkpoint/, each process's pieces (--zero, --tensor-parallel):
// whichever holds the later step.
struct Saved {
  std::string path;
  bool sharded = false;
};
Saved saved_checkpoint(const std::string& dir) {
  const Saved whole{dir + "/checkpoint.safetensors", false}, pieces{dir + "/checkpoint", true};
  const std::optional<int64_t> step = distributed::latest_sharded_step(pieces.path);
  if (!step) return whole;
  if (!fs::exists(whole.path)) return pieces;
  const auto meta = io::load_tensors(whole.path).metadata;
  const auto done = meta.find("steps_done");
  if (done == meta.end())
    throw std::runtime_error(whole.path + " is not a checkpoint of this job: it has no steps_done");
  return *step > std::stoll(done->second) ? pieces : whole;
}
std::map<std::string, std::string> metadata_of(const Saved& s) {
  return s.sharded ? distributed::sharded_metadata(s.path) : io::load_tensors(s.path).metadata;
}
// Names, dtypes and shapes checked against `like`; a sharded checkpoint is put back together
// whole, whatever layout wrote it.
TrainState load_state(const Saved& s, const TrainState& like) {
  if (!s.sharded) return io::load(s.path, like);
  auto [leaves, def] = tree_flatten(like);
  return tree_unflatten<TrainState>(
      def, io::detail::match_leaves(distributed::load_sharded(s.path), tree_names(def), leaves,
                                    s.path, {}));
}

// ---- flags ---------------------------------------------------------------------------------

const char* kDefaultCorpus = "/usr/share/games/fortunes";
constexpr int64_t kDefaultBpeVocab = 1024;

struct Flags {
  int64_t layers = 4, heads = 4, d_model = 128, block_size = 128;
  int64_t batch_size = 16, accum = 1, steps = 3000, warmup = 100;
  int64_t eval_every = 500, eval_batches = 8;
  double lr = 2e-3, weight_decay = 0.1, clip = 1.0, dropout = 0.0;
  uint64_t seed = 0;
  std::string tokenizer = "bytes";  // or "bpe": a byte-level BPE trained on the training text
  int64_t vocab = 0;                // --tokenizer bpe: its tokens (0: kDefaultBpeVocab)
  std::string dtype = "f32";        // what the forward and backward passes compute in
  bool data_parallel = false;       // one of process_count() processes started by mpirun
  int64_t zero = 0;                 // ZeRO stage of --data-parallel (0: the state replicated)
  bool tensor_parallel = false;     // Megatron's layout over the mesh's "model" axis
  std::vector<distributed::MeshAxis> mesh;  // --mesh data=D,model=M (empty: data=1, model=N)
  std::vector<std::string> text;            // files; empty: kDefaultCorpus
  std::string out = "gpt-out";
  std::optional<std::string> resume;
  int64_t stop_after = 0;  // stop after this many steps, as if interrupted; 0: never
  int64_t sample = 300;
  std::string prompt = "\n";
  double temperature = 0.8;
  int64_t top_k = 0;            // 0: sample from every byte
  std::set<std::string> given;  // flags set on the command line

  // The run's settings, stored in the checkpoint so that --resume continues the same run.
  static constexpr const char* kSaved[] = {
      "layers", "heads",      "d-model",      "block-size",   "batch-size", "accum",
      "steps",  "warmup",     "lr",           "weight-decay", "clip",       "dropout",
      "seed",   "eval-every", "eval-batches", "dtype",        "tokenizer",  "vocab"};
  std::map<std::string, std::string> settings() const {
    std::map<std::string, std::string> m;
    for (const char* key : kSaved) m[key] = get(std::string("--") + key);
    std::string files;
    for (const std::string& t : text) files += (files.empty() ? "" : "\n") + t;
    m["text"] = files;
    return m;
  }
  void restore(const std::map<std::string, std::string>& m) {
    for (const char* key : kSaved) {
      const std::string flag = std::string("--") + key;
      if (!given.count(flag) && m.count(key)) set(flag, m.at(key));
    }
    if (!given.count("--text") && m.count("text")) {
      text.clear();
      std::istringstream in(m.at("text"));
      for (std::string line; std::getline(in, line);)
        if (!line.empty()) text.push_back(line);
    }
  }
  std::string get(const std::string& flag) const {
    std::ostringstream os;
    os.precision(17);
    if (flag == "--layers") os << layers;
    if (flag == "--heads") os << heads;
    if (flag == "--d-model") os << d_model;
    if (flag == "--block-size") os << block_size;
    if (flag == "--batch-size") os << batch_size;
    if (flag == "--accum") os << accum;
    if (flag == "--steps") os << steps;
    if (flag == "--warmup") os << warmup;
    if (flag == "--lr") os << lr;
    if (flag == "--weight-decay") os << weight_decay;
    if (flag == "--clip") os << clip;
    if (flag == "--dropout") os << dropout;
    if (flag == "--seed") os << seed;
    if (flag == "--eval-every") os << eval_every;
    if (flag == "--eval-batches") os << eval_batches;
    if (flag == "--dtype") os << dtype;
    if (flag == "--tokenizer") os << tokenizer;
    if (flag == "--vocab") os << vocab;
    return os.str();
  }
  void set(const std::string& flag, const std::string& v) {
    std::size_t used = 0;
    auto integer = [&] {
      const int64_t x = std::stoll(v, &used);
      if (used != v.size()) throw std::invalid_argument(v);
      return x;
    };
    auto real = [&] {
      const double x = std::stod(v, &used);
      if (used != v.size()) throw std::invalid_argument(v);
      return x;
    };
    if (flag == "--layers")
      layers = integer();
    else if (flag == "--heads")
      heads = integer();
    else if (flag == "--d-model")
      d_model = integer();
    else if (flag == "--block-size")
      block_size = integer();
    else if (flag == "--batch-size")
      batch_size = integer();
    else if (flag == "--accum")
      accum = integer();
    else if (flag == "--steps")
      steps = integer();
    else if (flag == "--warmup")
      warmup = integer();
    else if (flag == "--eval-every")
      eval_every = integer();
    else if (flag == "--eval-batches")
      eval_batches = integer();
    else if (flag == "--lr")
      lr = real();
    else if (flag == "--weight-decay")
      weight_decay = real();
    else if (flag == "--clip")
      clip = real();
    else if (flag == "--dropout")
      dropout = real();
    else if (flag == "--vocab")
      vocab = integer();
    else if (flag == "--tokenizer")
      tokenizer = v;
    else if (flag == "--seed") {
      if (v.empty() || v[0] == '-') throw std::invalid_argument(v);  // stoull would wrap it
      seed = std::stoull(v, &used);
      if (used != v.size()) throw std::invalid_argument(v);
    } else if (flag == "--dtype")
      dtype = v;
    else if (flag == "--out")
      out = v;
    else if (flag == "--resume")
      resume = v;
    else if (flag == "--stop-after")
      stop_after = integer();
    else if (flag == "--sample")
      sample = integer();
    else if (flag == "--prompt")
      prompt = v;
    else if (flag == "--temperature")
      temperature = real();
    else if (flag == "--top-k")
      top_k = integer();
    else if (flag == "--zero")
      zero = integer();
    else
      throw std::invalid_argument("unknown flag " + flag);
  }
};

const char* kUsage = R"(usage: gpt [flags]
Trains a GPT (GPT-2's architecture) on text, byte by byte or on BPE tokens, and samples from it.
  --text FILE...      UTF-8 text files to train on (default: every fortune file in
                      /usr/share/games/fortunes, Debian's fortunes package)
  --tokenizer T       bytes: one token per byte; bpe: a byte-level BPE (GPT-2's scheme) trained
                      on the training text, saved in the checkpoint (default bytes)
  --vocab N           --tokenizer bpe: its tokens, 256 bytes and N - 256 merges (default 1024)
  --layers N          transformer blocks (default 4)
  --heads N           attention heads per block (default 4)
  --d-model N         width of the residual stream, a multiple of --heads (default 128)
  --block-size N      context length in tokens (default 128)
  --dropout X         dropout rate while training (default 0: off)
  --dtype D           f32, or bf16: the forward and backward passes in bfloat16, the weights
                      and the optimiser in float32, the loss in float32 (default f32)
  --batch-size N      sequences per step (default 16)
  --accum N           micro-batches of --batch-size per step, gradients averaged (default 1)
  --steps N           training steps (default 3000)
  --lr X              peak AdamW learning rate (default 0.002)
  --warmup N          steps of linear warmup from 0, then cosine decay to lr/10 (default 100)
  --weight-decay X    AdamW's decoupled weight decay on matrices and embeddings (default 0.1)
  --clip X            clip the gradients to this global norm (default 1)
  --seed N            seed of the initial weights, the windows and the sampling (default 0)
  --eval-every N      steps between validation losses and checkpoints (default 500)
  --eval-batches N    batches of the validation text per evaluation (default 8)
  --out DIR           where to write checkpoint.safetensors (with --zero or --tensor-parallel:
                      checkpoint/, each process's pieces), metrics.csv, loss.svg
                      (default gpt-out, or the --resume directory)
  --resume DIR        continue the run saved in DIR (model, optimiser, step and the settings
                      above; flags given explicitly override them)
  --stop-after N      stop after step N as if interrupted (continue with --resume)
  --sample N          tokens to generate after training (default 300; 0: none)
  --prompt TEXT       what the sample continues (default a newline)
  --temperature X     sampling temperature; 0 picks the most likely token (default 0.8)
  --top-k N           sample among the N most likely tokens only (default 0: all)
  --data-parallel     train on every process mpirun started (mpirun -np N gpt --data-parallel):
                      each computes the gradients of its 1/N of every batch and they average
                      them, so the run follows the one-process run up to round-off (with
                      dropout, each process draws its own masks); process 0 prints and writes
                      the files. A checkpoint resumes under any process count.
  --tensor-parallel   train on every process mpirun started with Megatron's layout: each
                      process of the mesh's model axis holds 1/M of the vocabulary, of every
                      block's heads and of the MLP's hidden units; the data axis splits each
                      batch. Same run up to round-off, dropout included (the one-process
                      run's masks, each process taking its rows and heads); each process
                      writes its pieces of the checkpoint, which resumes under any layout
  --mesh data=D,model=M  the processes as a D x M mesh for --tensor-parallel (default
                      data=1,model=N)
  --zero S            with --data-parallel: each process keeps only its 1/N of the optimiser
                      state (S = 1: gradients all-reduced; 2: reduce-scattered) or of the
                      optimiser state and the weights (3: the step gathers the weights), as
                      DeepSpeed's ZeRO; same run up to round-off. Each process writes its
                      pieces of the checkpoint, which resumes under any layout.
  --help              this text
)";

[[noreturn]] void usage_error(const std::string& why) {
  if (leader()) std::fprintf(stderr, "gpt: %s (try --help)\n", why.c_str());
  std::exit(2);
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      if (leader()) std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (a == "--data-parallel") {
      f.data_parallel = true;
      continue;
    }
    if (a == "--tensor-parallel") {
      f.tensor_parallel = true;
      continue;
    }
    if (a == "--mesh") {  // data=D,model=M
      if (i + 1 >= argc) usage_error("--mesh needs a value");
      f.mesh.clear();
      std::istringstream in(argv[++i]);
      for (std::string part; std::getline(in, part, ',');) {
        const std::size_t eq = part.find('=');
        try {
          std::size_t used = 0;
          const std::string size = eq == std::string::npos ? "" : part.substr(eq + 1);
          const int64_t n = std::stoll(size, &used);
          if (used != size.size() || n < 1) throw std::invalid_argument(part);
          f.mesh.push_back({part.substr(0, eq), n});
        } catch (const std::exception&) {
          usage_error("bad --mesh " + std::string(argv[i]) + ": expected data=D,model=M");
        }
      }
      continue;
    }
    if (a == "--text") {  // every following argument up to the next flag
      f.text.clear();
      while (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0)
        f.text.push_back(argv[++i]);
      if (f.text.empty()) usage_error("--text needs at least one file");
      f.given.insert(a);
      continue;
    }
    if (i + 1 >= argc) usage_error(a + " needs a value");
    try {
      f.set(a, argv[++i]);
    } catch (const std::exception& e) {
      usage_error(std::string(e.what()).rfind("unknown", 0) == 0
                      ? "unknown flag " + a
                      : "bad value for " + a + ": " + argv[i]);
    }
    f.given.insert(a);
  }
  if (f.resume) {
    if (!f.given.count("--out")) f.out = *f.resume;
    const Saved checkpoint = saved_checkpoint(*f.resume);
    const std::string& path = checkpoint.path;
    const std::map<std::string, std::string> saved = metadata_of(checkpoint);
    // The model's vocabulary is the tokenizer's: a resumed run keeps the checkpoint's.
    for (const std::string key : {"tokenizer", "vocab"})
      if (f.given.count("--" + key) && saved.count(key) && f.get("--" + key) != saved.at(key))
        usage_error("--" + key + " " + f.get("--" + key) + " differs from " + path + "'s " +
                    saved.at(key) + ": a resumed run keeps its tokenizer");
    f.restore(saved);
  }
  auto positive = [](const char* name, int64_t v) {
    if (v < 1) usage_error(std::string(name) + " must be positive, got " + std::to_string(v));
  };
  positive("--layers", f.layers), positive("--heads", f.heads), positive("--d-model", f.d_model);
  positive("--block-size", f.block_size), positive("--batch-size", f.batch_size);
  positive("--accum", f.accum), positive("--steps", f.steps),
      positive("--eval-every", f.eval_every);
  positive("--eval-batches", f.eval_batches);
  if (f.block_size < 2)
    usage_error("--block-size must be at least 2 (a token and the next), got " +
                std::to_string(f.block_size));
  if (f.d_model % f.heads != 0)
    usage_error("--d-model must be a multiple of --heads, got " + std::to_string(f.d_model) +
                " and " + std::to_string(f.heads));
  if (!(f.lr > 0) || !(f.weight_decay >= 0) || !(f.clip > 0) || f.warmup < 0)
    usage_error("--lr and --clip must be positive, --weight-decay and --warmup not negative");
  if (!(f.dropout >= 0 && f.dropout < 1))
    usage_error("--dropout must be in [0, 1), got " + std::to_string(f.dropout));
  if (!(f.temperature >= 0) || f.top_k < 0 || f.sample < 0)
    usage_error("--temperature, --top-k and --sample must not be negative");
  if (f.tokenizer != "bytes" && f.tokenizer != "bpe")
    usage_error("--tokenizer must be bytes or bpe, got " + f.tokenizer);
  if (f.tokenizer == "bytes" && f.vocab != 0 && f.vocab != 256)
    usage_error("--vocab " + std::to_string(f.vocab) +
                " needs --tokenizer bpe (bytes are 256 tokens)");
  if (f.tokenizer == "bytes") f.vocab = 256;
  if (f.tokenizer == "bpe" && f.vocab == 0) f.vocab = kDefaultBpeVocab;
  if (f.tokenizer == "bpe" && (f.vocab < 257 || f.vocab > (int64_t{1} << 20)))
    usage_error(
        "--vocab must be from 257 (the 256 bytes and a merge) to 1048576 for "
        "--tokenizer bpe, got " +
        std::to_string(f.vocab));
  if (f.dtype != "f32" && f.dtype != "bf16")
    usage_error("--dtype must be f32 or bf16, got " + f.dtype);
  if (f.tensor_parallel) {
    const int n = distributed::process_count();
    if (f.mesh.empty()) f.mesh = {{"data", 1}, {"model", n}};
    if (f.mesh.size() != 2 || f.mesh[0].name != "data" || f.mesh[1].name != "model")
      usage_error("--mesh must name the axes data and model, in that order: data=D,model=M");
    if (f.mesh[0].size > n || f.mesh[1].size > n || f.mesh[0].size * f.mesh[1].size != n)
      usage_error("--mesh data=" + std::to_string(f.mesh[0].size) +
                  ",model=" + std::to_string(f.mesh[1].size) + " holds " +
                  std::to_string(f.mesh[0].size * f.mesh[1].size) + " processes: got " +
                  std::to_string(n));
    if (f.batch_size % f.mesh[0].size != 0)
      usage_error("--batch-size must be divisible by the mesh's data=" +
                  std::to_string(f.mesh[0].size) + ", got " + std::to_string(f.batch_size));
    if (f.heads % f.mesh[1].size != 0)
      usage_error(
          "--heads must be divisible by the mesh's model=" + std::to_string(f.mesh[1].size) +
          " (each process holds heads), got " + std::to_string(f.heads));
    if (f.data_parallel || f.zero)
      usage_error("--tensor-parallel takes its data parallelism from --mesh, and no --zero yet");
  } else if (!f.mesh.empty()) {
    usage_error("--mesh lays out --tensor-parallel: add it");
  } else if (const auto problem =
                 mpirun::count_problem(f.data_parallel, f.batch_size, "sequences")) {
    usage_error(*problem);
  }
  if (f.zero < 0 || f.zero > 3)
    usage_error("--zero must be 1, 2 or 3 (the ZeRO stage), got " + std::to_string(f.zero));
  if (f.zero && !f.data_parallel) usage_error("--zero shards over processes: add --data-parallel");
  return f;
}

// ---- data ----------------------------------------------------------------------------------

// The default corpus: the fortune files themselves (not their .dat indices or .u8 links).
std::vector<std::string> default_corpus() {
  std::vector<std::string> files;
  if (!fs::is_directory(kDefaultCorpus))
    throw std::runtime_error(std::string(kDefaultCorpus) +
                             " is missing: install Debian's fortunes package "
                             "(scripts/install-deps.sh --demo does), or pass --text FILE...");
  for (const auto& e : fs::directory_iterator(kDefaultCorpus))
    if (e.is_regular_file() && !e.is_symlink() &&
        e.path().filename().string().find('.') == std::string::npos)
      files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

// Where `bytes` stops being UTF-8 text (a NUL, or an invalid or truncated sequence), if it does.
std::optional<std::size_t> not_text_at(const std::string& bytes) {
  std::size_t i = 0;
  while (i < bytes.size()) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c == 0) return i;
    const int extra = c < 0x80         ? 0
                      : (c >> 5) == 6  ? 1
                      : (c >> 4) == 14 ? 2
                      : (c >> 3) == 30 ? 3
                                       : -1;
    if (extra < 0 || i + static_cast<std::size_t>(extra) >= bytes.size()) return i;
    for (int k = 1; k <= extra; ++k)
      if ((static_cast<unsigned char>(bytes[i + static_cast<std::size_t>(k)]) >> 6) != 2) return i;
    i += static_cast<std::size_t>(extra) + 1;
  }
  return std::nullopt;
}

// The files' bytes, one after another; an empty or non-text file is an error naming it.
std::string read_corpus(const std::vector<std::string>& files) {
  std::string all;
  for (const std::string& path : files) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read " + path);
    std::ostringstream os;
    os << in.rdbuf();
    const std::string bytes = os.str();
    if (bytes.empty()) throw std::runtime_error(path + " is empty: expected UTF-8 text");
    if (const auto at = not_text_at(bytes))
      throw std::runtime_error(
          path + " is not UTF-8 text: byte " + std::to_string(*at) + " is 0x" + [&] {
            char hex[3];
            std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned char>(bytes[*at]));
            return std::string(hex);
          }());
    all += bytes;
  }
  return all;
}

// A split of the corpus: its tokens, from which windows of block_size + 1 are drawn.
struct Split {
  std::string name;
  std::size_t bytes = 0;
  std::vector<int32_t> tokens;
};

// SplitMix64: a window's start from (seed, stream, step, index), independent of everything else
// that ran before, so that a resumed run draws the same windows.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Inputs and next-token targets, [count, B, T] each (int64), of the windows of `stream` (0:
// training, 1: validation) at `step`.
std::pair<Tensor, Tensor> windows(const Split& s, int64_t count, int64_t B, int64_t T,
                                  uint64_t seed, uint64_t stream, int64_t step) {
  const auto n = static_cast<int64_t>(s.tokens.size());
  std::vector<int64_t> x(static_cast<std::size_t>(count * B * T)), y(x.size());
  for (int64_t w = 0; w < count * B; ++w) {
    const uint64_t h = mix(mix(mix(seed ^ (stream << 62)) + static_cast<uint64_t>(step)) +
                           static_cast<uint64_t>(w));
    const auto start = static_cast<int64_t>(h % static_cast<uint64_t>(n - T));
    for (int64_t t = 0; t < T; ++t) {
      x[static_cast<std::size_t>(w * T + t)] = s.tokens[static_cast<std::size_t>(start + t)];
      y[static_cast<std::size_t>(w * T + t)] = s.tokens[static_cast<std::size_t>(start + t + 1)];
    }
  }
  return {tensor(x, {count, B, T}), tensor(y, {count, B, T})};
}

// data::write_file replaces a file atomically (temporary file, fsync, rename).
void write_text(const std::string& path, const std::string& text) {
  data::write_file(path, {reinterpret_cast<const uint8_t*>(text.data()), text.size()});
}

// ---- metrics -------------------------------------------------------------------------------

struct Row {
  int64_t step = 0;
  double train_loss = 0, val_loss = 0, lr = 0, tokens_per_second = 0, mfu = 0;
};
const char* kCsvHeader = "step,train_loss,val_loss,lr,tokens_per_second,mfu";

std::string to_csv(const std::vector<Row>& rows) {
  std::ostringstream os;
  os << kCsvHeader << "\n";
  char line[256];
  for (const Row& r : rows) {
    std::snprintf(line, sizeof line, "%lld,%.6f,%.6f,%.6g,%.1f,%.4f\n",
                  static_cast<long long>(r.step), r.train_loss, r.val_loss, r.lr,
                  r.tokens_per_second, r.mfu);
    os << line;
  }
  return os.str();
}

std::vector<Row> from_csv(const std::string& path) {
  std::ifstream in(path);
  std::vector<Row> rows;
  std::string line;
  if (!std::getline(in, line)) return rows;
  if (line != kCsvHeader) throw std::runtime_error("unexpected header in " + path);
  while (std::getline(in, line)) {
    Row r;
    long long step = 0;
    if (std::sscanf(line.c_str(), "%lld,%lf,%lf,%lf,%lf,%lf", &step, &r.train_loss, &r.val_loss,
                    &r.lr, &r.tokens_per_second, &r.mfu) == 6) {
      r.step = step;
      rows.push_back(r);
    }
  }
  return rows;
}

std::string to_svg(const std::vector<Row>& rows, const std::string& title) {
  std::vector<double> xs, train, val, mfu;
  for (const Row& r : rows) {
    xs.push_back(static_cast<double>(r.step));
    train.push_back(r.train_loss), val.push_back(r.val_loss), mfu.push_back(100 * r.mfu);
  }
  return report::chart(
      title, xs, "step",
      {{"loss (nats per byte)", {{"train", "#1f77b4", train}, {"validation", "#d62728", val}}},
       {"model FLOPs utilisation (%)", {{"", "#2ca02c", mfu}}}});
}

// ---- sampling ------------------------------------------------------------------------------

// `prompt` and `n` tokens after it, generated with the key/value cache (gpt::generate: each
// chunk one compiled loop): when the block is full, its last half is the next chunk's prompt.
std::string sample_text(const gpt::Model& m, const data::BpeTokenizer& tokenizer,
                        const std::string& prompt, int64_t n, const gpt::Sampling& s, uint64_t seed,
                        int64_t block) {
  const std::vector<int32_t> ids = tokenizer.encode(prompt.empty() ? "\n" : prompt, 1);
  std::vector<int64_t> text(ids.begin(), ids.end());
  auto compile = [&s](int64_t count) {
    return jit([s, count](const gpt::Model& model, const Tensor& p,
                          const Tensor& key) { return gpt::generate(model, p, count, s, key); },
               "gpt_generate");
  };
  std::map<int64_t, decltype(compile(0))> by_count;  // one compiled loop per chunk length
  for (int64_t done = 0, chunk = 0; done < n; ++chunk) {
    const auto have = static_cast<int64_t>(text.size());
    const int64_t P = std::min(have, done == 0 ? block - 1 : std::max<int64_t>(block / 2, 1));
    const int64_t count = std::min(n - done, block - P);
    const std::vector<int64_t> context(text.end() - P, text.end());
    auto it = by_count.find(count);
    if (it == by_count.end()) it = by_count.emplace(count, compile(count)).first;
    const std::vector<int64_t> out =
        it->second(m, tensor(context, {1, P}),
                   random::key(mix(seed + static_cast<uint64_t>(chunk))))
            .to_vector<int64_t>();
    text.insert(text.end(), out.end() - count, out.end());
    done += count;
  }
  return tokenizer.decode(text);
}

// The run's tokenizer: the bytes, the checkpoint's BPE when resuming, else a BPE trained on
// the training text.
data::BpeTokenizer make_tokenizer(const Flags& flags, std::string_view training_text) {
  if (flags.tokenizer == "bytes") return {};
  if (flags.resume) {
    const Saved checkpoint = saved_checkpoint(*flags.resume);
    const std::string& path = checkpoint.path;
    const auto meta = metadata_of(checkpoint);
    if (!meta.count("merges"))
      throw std::runtime_error(path + " holds no BPE merges: expected a checkpoint of a " +
                               "--tokenizer bpe run");
    try {
      return data::BpeTokenizer::parse(meta.at("merges"));
    } catch (const Error& e) {
      throw std::runtime_error(path + ": " + e.what());
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  data::BpeTokenizer t =
      data::BpeTokenizer::train(training_text, {.vocab_size = flags.vocab, .threads = 0});
  if (leader())
    std::printf("BPE tokenizer: %lld tokens%s, trained on %zu bytes in %.2f s\n",
                static_cast<long long>(t.vocab_size()),
                t.vocab_size() < flags.vocab ? " (no pair repeats beyond them)" : "",
                training_text.size(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return t;
}

// ---- training ------------------------------------------------------------------------------

int run(const Flags& flags) {
  const int processes = distributed::process_count(), rank = distributed::process_index();
  const std::vector<std::string> files = flags.text.empty() ? default_corpus() : flags.text;
  const std::string corpus = read_corpus(files);
  const auto n = static_cast<int64_t>(corpus.size()), n_val = n / 10;
  const std::string_view train_text = std::string_view(corpus).substr(0, corpus.size() - n_val),
                         val_text = std::string_view(corpus).substr(corpus.size() - n_val);
  const data::BpeTokenizer tokenizer = make_tokenizer(flags, train_text);
  const Split train{"training", train_text.size(), tokenizer.encode(train_text)},
      val{"validation", val_text.size(), tokenizer.encode(val_text)};
  for (const Split* s : {&train, &val})
    if (static_cast<int64_t>(s->tokens.size()) <= flags.block_size + 1)
      throw std::runtime_error("--block-size " + std::to_string(flags.block_size) +
                               " is larger than the " + s->name + " text (" +
                               std::to_string(s->tokens.size()) + " tokens of " +
                               std::to_string(files.size()) + " file(s), first " + files.front() +
                               "): expected more text or a smaller block");
  // Losses per token become bits per byte through the validation text's bytes per token.
  const double bytes_per_token =
      static_cast<double>(val.bytes) / static_cast<double>(val.tokens.size());

  const gpt::Config config{flags.layers, flags.heads, flags.d_model, flags.block_size,
                           tokenizer.vocab_size()};
  char tokens_text[96] = "byte tokens";
  if (flags.tokenizer == "bpe")
    std::snprintf(tokens_text, sizeof tokens_text, "BPE of %lld tokens, %.2f bytes per token",
                  static_cast<long long>(tokenizer.vocab_size()), bytes_per_token);
  // The recipe: AdamW with decay on matrices, warmup then cosine decay, and clipping.
  const gpt::Recipe recipe{.adamw = {.lr = optim::warmup_cosine_decay(
                                         0.0, flags.lr, flags.warmup,
                                         std::max(flags.steps, flags.warmup + 1), flags.lr / 10),
                                     .weight_decay = flags.weight_decay,
                                     .decay_on = optim::DecayOn::matrices,
                                     .clip_norm = flags.clip},
                           .accum = flags.accum,
                           .dropout = flags.dropout,
                           .compute = flags.dtype == "bf16" ? bfloat16 : float32};
  const optim::Optimizer opt = optim::adamw(recipe.adamw);
  TrainState state{gpt::init(config, random::key(flags.seed)), {}};
  state.optimizer = opt.init(state.model);
  int64_t first_step = 0;
  std::vector<Row> history;
  if (flags.resume) {
    const Saved checkpoint = saved_checkpoint(*flags.resume);
    const std::string& path = checkpoint.path;
    state = load_state(checkpoint, state);
    first_step = std::stoll(metadata_of(checkpoint).at("steps_done"));
    history = from_csv(*flags.resume + "/metrics.csv");
    std::erase_if(history, [&](const Row& r) { return r.step > first_step; });
    if (leader())
      std::printf("resumed from %s after step %lld\n", path.c_str(),
                  static_cast<long long>(first_step));
  }

  const int64_t B = flags.batch_size, T = flags.block_size;
  const double flops_per_step = gpt::train_flops(config, B * flags.accum, T);
  // Under --data-parallel the peak is every process's peak added up (one psum).
  auto add_up =
      pmap([](const Tensor& x) { return psum(x, "dp"); }, axis_name("dp"), out_axes(none));
  const MachinePeak peak = machine_peak(num_threads());
  const double peak_gflops = flags.data_parallel || flags.tensor_parallel
                                 ? add_up(expand_dims(tensor(peak.fma_gflops), 0)).item<double>()
                                 : peak.fma_gflops;
  std::string layout_text;
  if (flags.data_parallel)
    layout_text = ", data-parallel on " + std::to_string(processes) + " processes" +
                  (flags.zero ? ", ZeRO stage " + std::to_string(flags.zero) : "");
  if (flags.tensor_parallel)
    layout_text = ", tensor-parallel on the mesh {data: " + std::to_string(flags.mesh[0].size) +
                  ", model: " + std::to_string(flags.mesh[1].size) + "}";
  if (leader())
    std::printf(
        "GPT on %lld bytes of text (%zu file(s)), %s: %lld layers, %lld heads, d_model %lld, "
        "block %lld, %lld parameters, %s; %lld steps of %lld x %lld tokens%s; %.2f GFLOP a step; "
        "FMA peak %.0f GFLOP/s on %d thread(s)%s\n",
        static_cast<long long>(n), files.size(), tokens_text, static_cast<long long>(flags.layers),
        static_cast<long long>(flags.heads), static_cast<long long>(flags.d_model),
        static_cast<long long>(T), static_cast<long long>(nn::parameter_count(state.model)),
        flags.dtype.c_str(), static_cast<long long>(flags.steps),
        static_cast<long long>(B * flags.accum), static_cast<long long>(T), layout_text.c_str(),
        flops_per_step * 1e-9, peak_gflops, peak.threads, processes > 1 ? " per process" : "");

  // The state's layout over the processes, from the whole state (gpt_layouts.h).
  std::unique_ptr<gpt::Layout> layout;
  if (flags.tensor_parallel)
    layout = std::make_unique<gpt::TensorParallel>(state, recipe, config, flags.mesh);
  else if (flags.zero)
    layout = std::make_unique<gpt::Zero>(state, recipe, static_cast<int>(flags.zero));
  else
    layout = std::make_unique<gpt::Replicated>(state, recipe, flags.data_parallel);
  state = {};  // the layout holds it; the whole state is gathered when needed
  const DType compute = recipe.compute;
  auto eval_loss =
      jit([compute](const gpt::Model& m, const Tensor& x,
                    const Tensor& y) { return gpt::loss(gpt::cast(m, compute), x, y); },
          "gpt_eval");
  // The mean loss of the validation windows, each process taking its share of every batch.
  auto validation_loss = [&] {
    auto [x, y] = windows(val, flags.eval_batches, B, T, flags.seed, 1, 0);
    if (flags.data_parallel)
      x = index(gpt::share(x, rank, processes), 0), y = index(gpt::share(y, rank, processes), 0);
    double sum = 0;
    for (int64_t i = 0; i < flags.eval_batches; ++i)
      sum += eval_loss(state.model, index(x, i), index(y, i)).item<double>();
    const double mean = sum / static_cast<double>(flags.eval_batches);
    if (!flags.data_parallel) return mean;
    return add_up(expand_dims(tensor(mean), 0)).item<double>() / processes;
  };

  // Process 0 writes the files; the others' progress bars draw into nothing.
  if (leader()) fs::create_directories(flags.out);
  std::FILE* const progress = leader() ? stderr : std::fopen("/dev/null", "w");
  const int64_t last = std::max(
      first_step, flags.stop_after > 0 ? std::min(flags.stop_after, flags.steps) : flags.steps);
  ProgressBar bar("train", (last - first_step) * B * flags.accum * T, "tok", progress);
  double loss_sum = 0;
  int64_t losses = 0;
  auto since = std::chrono::steady_clock::now();
  int64_t tokens_since = 0;
  char metrics[160] = "";
  for (int64_t step = first_step; step < last; ++step) {
    const auto [x, y] = windows(train, flags.accum, B, T, flags.seed, 0, step);
    const Tensor loss = layout->step(x, y, mix(flags.seed ^ static_cast<uint64_t>(step)));
    loss_sum += loss.item<double>(), ++losses;
    tokens_since += B * flags.accum * T;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
    const double mfu = flops_per_step * static_cast<double>(tokens_since / (B * flags.accum * T)) /
                       seconds * 1e-9 / peak_gflops;
    std::snprintf(metrics, sizeof metrics, "step %lld  loss %.3f  MFU %.0f%%",
                  static_cast<long long>(step + 1), loss_sum / static_cast<double>(losses),
                  100 * mfu);
    bar.update((step + 1 - first_step) * B * flags.accum * T, metrics);
    if ((step + 1) % flags.eval_every != 0 && step + 1 != last) continue;

    const double tokens_per_second = static_cast<double>(tokens_since) / seconds;
    state = layout->whole();
    Row row{step + 1,
            loss_sum / static_cast<double>(losses),
            validation_loss(),
            opt.algorithm().learning_rate(tensor(static_cast<int32_t>(step))).item<double>(),
            tokens_per_second,
            mfu};
    history.push_back(row);
    loss_sum = 0, losses = 0, tokens_since = 0;
    // The checkpoint and the metrics are replaced atomically.
    std::map<std::string, std::string> metadata = flags.settings();
    metadata["steps_done"] = std::to_string(step + 1);
    if (flags.tokenizer == "bpe") metadata["merges"] = tokenizer.to_string();
    // One format per directory: a checkpoint of the other kind, from another run, would
    // otherwise be resumed if it held a later step.
    if (layout->sharded())
      distributed::save_sharded(
          flags.out + "/checkpoint", step + 1, [&] { return layout->pieces(); }, metadata);
    if (leader()) {
      if (layout->sharded()) {
        fs::remove(flags.out + "/checkpoint.safetensors");
      } else {
        io::save(flags.out + "/checkpoint.safetensors", state, metadata);
        fs::remove_all(flags.out + "/checkpoint");
      }
      write_text(flags.out + "/metrics.csv", to_csv(history));
      write_text(flags.out + "/loss.svg", to_svg(history, std::string("Kiln GPT, ") + tokens_text));
      if (isatty(fileno(stderr))) std::fprintf(stderr, "\r\033[K");  // over the bar's line
      std::printf("step %lld: train loss %.4f | validation loss %.4f | %.0f tok/s | MFU %.1f%%\n",
                  static_cast<long long>(row.step), row.train_loss, row.val_loss,
                  row.tokens_per_second, 100 * row.mfu);
      std::fflush(stdout);
    }
    state = {};
    since = std::chrono::steady_clock::now();
  }
  bar.finish(metrics);
  state = layout->whole();

  if (!leader()) return 0;
  if (flags.sample > 0) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string text =
        sample_text(state.model, tokenizer, flags.prompt, flags.sample,
                    {.temperature = flags.temperature, .top_k = flags.top_k}, flags.seed, T);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf(
        "---- sample (%lld tokens in %.2f s with compiling, %.0f tokens/s; temperature %g%s) "
        "----\n",
        static_cast<long long>(flags.sample), seconds, static_cast<double>(flags.sample) / seconds,
        flags.temperature,
        flags.top_k > 0 ? (", top-k " + std::to_string(flags.top_k)).c_str() : "");
    std::fwrite(text.data(), 1, text.size(), stdout);  // the bytes as sampled, NULs included
    std::printf("\n----\n");
  }
  if (history.empty()) return 0;
  const Row& end = history.back();
  std::printf(
      "%s after %lld of %lld steps: validation loss %.4f (%.3f bits per byte); wrote "
      "%s/{%s,metrics.csv,loss.svg}\n",
      last < flags.steps ? "stopped" : "done", static_cast<long long>(end.step),
      static_cast<long long>(flags.steps), end.val_loss,
      end.val_loss / bytes_per_token / std::log(2.0), flags.out.c_str(),
      layout->sharded() ? "checkpoint/ (each process's pieces)" : "checkpoint.safetensors");
  return 0;
}

int main(int argc, char** argv) {
  try {
    distributed::initialize();            // one process unless mpirun started several
    return run(parse_flags(argc, argv));  // --resume reads the checkpoint's settings
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt: %s\n", e.what());
    return 1;
  }
}
