// Internal node graph of kiln::data pipelines.
//
// A Node is an immutable description shared by every Pipeline built from it. Iterating opens a
// Cursor per epoch; nodes with random access also give an Indexed view of an epoch that is safe
// to read from several threads at once (parallel maps fetch through it).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "detail/files.h"
#include "kiln/data.h"

struct z_stream_s;  // zlib's

namespace kiln::data::detail {

using Clock = std::chrono::steady_clock;

// Counters of one stage. Written by worker threads, read by stats().
struct StageCounters {
  std::string name;
  std::atomic<int64_t> items{0};
  std::atomic<int64_t> wait_ns{0};
  std::atomic<int64_t> skipped{0};
  std::atomic<int64_t> first_ns{-1};  // when the stage first produced or was asked for data
  std::mutex error_mutex;
  std::string last_error;
};

// Stage counters of one pipeline, keyed by the node that heads the stage, so they accumulate
// over epochs and reopenings.
class StatsTable {
 public:
  StageCounters& stage(const void* node, const std::string& name);
  std::vector<StageCounters*> stages();  // in registration order (upstream first)
  void reset();

 private:
  std::mutex mutex_;
  std::vector<std::pair<const void*, std::unique_ptr<StageCounters>>> stages_;
};

int64_t now_ns();
void mark_started(StageCounters& c);

struct OpenCtx {
  int64_t epoch = 0;
  StatsTable* stats = nullptr;  // never null while iterating
};

// Random access to one epoch of a node. get() is const and thread-safe.
// A slot of a batch being assembled: a contiguous view of the batch buffer where a field of one
// sample belongs.
struct FieldSlot {
  std::string_view name;
  const Tensor* batch = nullptr;  // [B, ...] contiguous
  int64_t row = 0;                // this sample's index in the batch
};

class Indexed {
 public:
  virtual ~Indexed() = default;
  virtual int64_t size() const = 0;
  virtual Sample get(int64_t index) const = 0;
  // Like get(), but a node that computes a field may write it straight into its slot (when the
  // types match) and return a view of the slot: batching then needs no copy for that field.
  virtual Sample get_into(int64_t index, const std::vector<FieldSlot>& slots) const {
    (void)slots;
    return get(index);
  }
  // A hint that element `index` is wanted soon: in-memory sources pull its bytes into cache.
  virtual void prefetch(int64_t index) const { (void)index; }
};

// Sequential iteration. next() leaves the cursor after the element even when it throws, so a
// stage that skips errors can carry on.
class Cursor {
 public:
  virtual ~Cursor() = default;
  virtual std::optional<Sample> next() = 0;
};

class Node {
 public:
  virtual ~Node() = default;
  // Name with parameters, e.g. "shuffle(seed=3)"; part of the pipeline's fingerprint.
  virtual std::string name() const = 0;
  virtual std::vector<std::shared_ptr<const Node>> inputs() const { return {}; }
  virtual bool indexed() const { return false; }
  // Elements per epoch, when known without iterating.
  virtual std::optional<int64_t> size() const { return std::nullopt; }
  // Only for indexed() nodes.
  virtual std::shared_ptr<const Indexed> open_indexed(const OpenCtx& ctx) const;
  // A cursor positioned after the first `start` elements of epoch ctx.epoch. The default, for
  // indexed nodes, walks open_indexed().
  virtual std::unique_ptr<Cursor> open(const OpenCtx& ctx, int64_t start) const;
  // Records a source dropped while loading (OnError::skip), reported in its stage.
  virtual int64_t load_skipped() const { return 0; }
  virtual std::string load_error() const { return {}; }
  // Parallelism a map asks for; a random-access chain runs with the most any of its maps asks.
  virtual int threads() const { return 0; }
  virtual bool ordered() const { return true; }
  virtual int chunk_size() const { return 32; }
  virtual bool is_batch() const { return false; }
};
using NodePtr = std::shared_ptr<const Node>;

// Name of the random-access chain that ends at `node` ("a -> b -> c").
std::string chain_name(const Node& node);
// Sum of load-time skips in the random-access chain ending at `node`.
void add_load_skips(const Node& node, StageCounters& c);

// Iterates an Indexed view, counting into its stage.
class IndexedCursor : public Cursor {
 public:
  IndexedCursor(std::shared_ptr<const Indexed> view, int64_t start, StageCounters* stats)
      : view_(std::move(view)), pos_(start), stats_(stats) {}
  std::optional<Sample> next() override;

 private:
  std::shared_ptr<const Indexed> view_;
  int64_t pos_;
  StageCounters* stats_;
};

// Builds samples from fields whose names are known to be distinct, without Sample::set's search
// for an existing name: a sample of n fields is then made in O(n), not O(n^2).
struct SampleAccess {
  static void reserve(Sample& s, std::size_t n) { s.fields_.reserve(n); }
  static void append(Sample& s, std::string name, Tensor value) {
    s.fields_.emplace_back(std::move(name), std::move(value));
  }
};

// Helpers shared by the sources and transforms.
Tensor slice_view(const Tensor& t, int64_t index);  // t[index] as a view
Tensor bytes_tensor(const uint8_t* data, std::size_t n);

// A map's function of (element, epoch, index of the element in the map's input).
using IndexedFn = std::function<Sample(Sample, int64_t epoch, int64_t index)>;
NodePtr make_map(NodePtr input, IndexedFn fn, std::string name, MapOptions options);

// Runs an image transform on its field of `s` (image.cpp).
// With `dest`, the result is written into it when its type matches the result's.
Sample apply_image(const ImageTransform& t, Sample s, int64_t epoch, int64_t index,
                   const Tensor* dest = nullptr);

// ---- file reading and decoding (codecs.cpp)

// Raises Error of `op` for options no image can be read with.
void check_image_options(const char* op, const ImageReadOptions& options);

// A regular file opened for reading. Opening raises Error (op data.read_file) when `path` cannot
// be opened or is not a regular file (a FIFO is refused without waiting for a writer).
struct InputFile {
  explicit InputFile(const std::string& path);
  // Reads up to n bytes at `offset` into `dst`; returns how many there were.
  std::size_t read_at(uint8_t* dst, std::size_t n, uint64_t offset) const;
  std::string path;
  kiln::detail::Fd fd;
  uint64_t size = 0;
};

// The bytes of a raw or gzip'd file (told apart by the gzip magic), decoded only as far as they
// are asked for, so a reader can check what the data declares before decoding the rest.
class DecodedFile {
 public:
  explicit DecodedFile(const std::string& path);
  ~DecodedFile();
  DecodedFile(const DecodedFile&) = delete;
  DecodedFile& operator=(const DecodedFile&) = delete;
  bool compressed() const { return zs_ != nullptr; }
  // Appends up to n more bytes to `out`: fewer only at the end of the data, or where compressed
  // data is damaged (problem() then says why). `out` grows with what arrives, never by n at once.
  void read(std::vector<uint8_t>& out, std::size_t n);
  // Why compressed data stopped early ("truncated gzip file ..."), or empty.
  const std::string& problem() const { return problem_; }

 private:
  bool inflate_into(std::vector<uint8_t>& out, std::size_t want);
  InputFile file_;
  uint64_t offset_ = 0;              // raw: next byte of the file
  std::vector<uint8_t> compressed_;  // gzip: the whole file
  std::size_t compressed_pos_ = 0;   // gzip: bytes handed to zlib so far
  uint64_t decoded_ = 0;             // gzip: bytes decompressed so far
  std::unique_ptr<z_stream_s> zs_;   // gzip only
  bool done_ = false;
  std::string problem_;
};

}  // namespace kiln::data::detail
