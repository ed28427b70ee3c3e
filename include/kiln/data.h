// Native data pipeline (kiln::data): sources, transforms, shuffling, batching and prefetching
// on C++ worker threads. Randomness is a pure function of (seed, epoch, sample index), so the
// same seed gives the same batches whatever the thread count, and a pipeline resumes mid-epoch
// from a small state. See docs/DATA.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::data {

// ---- samples ----------------------------------------------------------------------------

namespace detail {
struct SampleAccess;
}  // namespace detail

// A small named record of tensors (scalars are 0-d tensors), in insertion order. A batch is the
// same record with a leading batch axis on every field.
class Sample {
 public:
  using Field = std::pair<std::string, Tensor>;

  Sample() = default;
  Sample(std::initializer_list<Field> fields);

  bool contains(std::string_view name) const;
  // The field called `name`; raises Error listing the fields there are when it is missing.
  const Tensor& at(std::string_view name) const;
  Tensor& at(std::string_view name);
  const Tensor& operator[](std::string_view name) const { return at(name); }
  // Inserts the field, or replaces its value when it exists.
  void set(std::string_view name, Tensor value);
  bool erase(std::string_view name);
  std::vector<std::string> names() const;

  std::size_t size() const { return fields_.size(); }
  bool empty() const { return fields_.empty(); }
  auto begin() const { return fields_.begin(); }
  auto end() const { return fields_.end(); }
  auto begin() { return fields_.begin(); }
  auto end() { return fields_.end(); }

 private:
  friend struct detail::SampleAccess;
  std::vector<Field> fields_;
};
using Batch = Sample;

// ---- randomness -------------------------------------------------------------------------

// The key of the random stream of one sample: a hash of (seed, epoch, index).
uint64_t sample_key(uint64_t seed, int64_t epoch, int64_t index);

// A counter-based random stream: its numbers are a pure function of the key it starts from.
class Rng {
 public:
  explicit Rng(uint64_t key) : key_(key) {}
  uint64_t next_u64();
  double uniform();                             // [0, 1)
  int64_t uniform_int(int64_t lo, int64_t hi);  // [lo, hi); hi > lo
  bool bernoulli(double p) { return uniform() < p; }

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

// ---- options ----------------------------------------------------------------------------

// What a source or an on_error stage does with a bad record.
enum class OnError { raise, skip };

struct MapOptions {
  // 0 runs the callable on the consuming thread; n > 0 runs it on n worker threads.
  int num_threads = 0;
  // false hands results on as workers finish them: faster when sample costs vary, but the order
  // (and so resuming exactly) is no longer deterministic.
  bool ordered = true;
  // Key of the Rng handed to callables that take one: Rng(sample_key(seed, epoch, index)).
  uint64_t seed = 0;
  // Samples a worker claims at a time; larger amortises locking, smaller lowers latency.
  int chunk_size = 32;
};

struct ShuffleOptions {
  // Used only when the upstream has no random access (streams): a reservoir of this many samples.
  int64_t buffer_size = 10000;
};

struct BatchOptions {
  bool drop_remainder = false;
  // Fields whose shapes vary between samples, each with its padding value. Such a field is padded
  // to the largest extent of each axis in the batch, and a field "<name>_length" (int64 [B]) holds
  // each sample's original size along its first axis.
  std::vector<std::pair<std::string, double>> pad = {};
};

struct IdxOptions {
  // skip: a truncated or corrupt file keeps its complete records; the rest count as skipped.
  OnError on_error = OnError::raise;
  // Most data bytes (after the header, decompressed) a file may declare: a gzip'd file of a few
  // megabytes can otherwise expand until memory runs out. 2 GiB holds every public IDX data set.
  int64_t max_bytes = int64_t{1} << 31;
};

struct CsvOptions {
  char delimiter = ',';
  // Columns to keep, in this order; empty keeps all.
  std::vector<std::string> select = {};
  // Column types; columns not listed are int64 when every value is an integer, else float32.
  std::vector<std::pair<std::string, DType>> types = {};
  // Columns kept as text: a uint8 [n] tensor of the cell's bytes (pad them when batching).
  std::vector<std::string> text_columns = {};
  // skip: a malformed line (wrong field count, unparsable number) is skipped and counted.
  OnError on_error = OnError::raise;
};

struct ImageReadOptions {
  // Convert to this many channels (1 gray, 3 RGB, 4 RGBA); nullopt keeps the file's own.
  std::optional<int> channels = std::nullopt;
  // Most pixels (width x height) an image may declare, checked before decoding: a small file can
  // otherwise decode to gigabytes. The default is Pillow's decompression-bomb threshold.
  int64_t max_pixels = 178956970;
};

// ---- statistics and state -----------------------------------------------------------------

// One stage: a run of nodes that execute together (a random-access chain runs as one stage).
struct StageStats {
  std::string name;
  int64_t items = 0;            // produced since the pipeline was created or reset_stats()
  double items_per_second = 0;  // items over the stage's running time
  double wait_seconds = 0;      // time its consumer was blocked waiting on it (threaded stages)
  int64_t skipped = 0;          // bad records dropped here (on_error(skip), sources' skips)
  std::string last_error;       // message of the last skipped record
};

struct PipelineStats {
  std::vector<StageStats> stages;  // from the sources to the output
  int64_t items = 0;               // elements handed to the training loop
  double seconds = 0;              // time since the first element was asked for
  double items_per_second = 0;
  double wait_seconds = 0;        // time the training loop spent waiting for elements
  int64_t skipped = 0;            // bad records skipped in all stages
  std::string to_string() const;  // a one-line summary for progress bars
};

// Where an iteration stands: the epoch and the number of elements already handed out in it.
// Restoring it into an identically built pipeline gives exactly the elements that would have
// come next (see docs/DATA.md for what "identically built" means).
struct PipelineState {
  uint64_t fingerprint = 0;  // hash of the pipeline's structure and parameters
  int64_t epoch = 0;
  int64_t position = 0;
  std::string to_string() const;  // "kiln.data.state/1 <fingerprint> <epoch> <position>"
  static PipelineState parse(std::string_view text);
  bool operator==(const PipelineState&) const = default;
};

// ---- image transforms ---------------------------------------------------------------------

namespace detail {
class Node;
struct Run;
struct ImageStep;
}  // namespace detail

// A chain of image operations on one field ([H, W] or [H, W, C], uint8 or float32). Chained
// image maps fuse: the whole chain runs on raw buffers with one output allocation per sample.
class ImageTransform {
 public:
  explicit ImageTransform(std::vector<std::shared_ptr<const detail::ImageStep>> steps,
                          std::string field = "image");
  // This chain followed by `next` (which must act on the same field).
  ImageTransform then(const ImageTransform& next) const;
  // The same chain acting on another field.
  ImageTransform on(std::string field) const;
  const std::string& field() const { return field_; }
  std::string describe() const;
  // Applies the chain to one image with the randomness of sample `index` in `epoch`.
  Tensor operator()(const Tensor& image, int64_t epoch = 0, int64_t index = 0) const;
  const std::vector<std::shared_ptr<const detail::ImageStep>>& steps() const { return steps_; }

 private:
  std::vector<std::shared_ptr<const detail::ImageStep>> steps_;
  std::string field_;
};

namespace image {
enum class Interpolation { nearest, bilinear };
// To float32: (x * scale - mean[c]) / std[c]; scale defaults to 1/255 for uint8 input, else 1.
// mean and std hold one value, or one per channel.
ImageTransform normalize(std::vector<float> mean, std::vector<float> std,
                         std::optional<float> scale = std::nullopt);
// Zero-pads each side by `padding`, then crops a height x width window at a random place.
ImageTransform random_crop(int64_t height, int64_t width, int64_t padding = 0, uint64_t seed = 1);
// Mirrors left-right with probability p.
ImageTransform random_horizontal_flip(double p = 0.5, uint64_t seed = 2);
ImageTransform resize(int64_t height, int64_t width,
                      Interpolation interpolation = Interpolation::bilinear);
ImageTransform center_crop(int64_t height, int64_t width);
// [H, W, C] to [C, H, W] (and [H, W] to [1, H, W]); it must come last in a chain.
ImageTransform to_chw();
}  // namespace image

// ---- pipelines ----------------------------------------------------------------------------

using MapFn = std::function<Sample(Sample, Rng&)>;
using FilterFn = std::function<bool(const Sample&)>;

// A dataset description built by chaining, plus its iteration position. Chaining returns a new
// pipeline and leaves this one as it was. Copies share the (immutable) description and start
// from the same position, but iterate independently.
class Pipeline {
 public:
  explicit Pipeline(std::shared_ptr<const detail::Node> node);
  Pipeline(const Pipeline& other);
  Pipeline& operator=(const Pipeline& other);
  Pipeline(Pipeline&&) noexcept;
  Pipeline& operator=(Pipeline&&) noexcept;
  ~Pipeline();

  // ---- transforms
  // f(Sample) -> Sample or f(Sample, Rng&) -> Sample. With num_threads > 0 it must be safe to
  // call from several threads at once.
  template <typename F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, ImageTransform> &&
           (std::is_invocable_r_v<Sample, F&, Sample, Rng&> ||
            std::is_invocable_r_v<Sample, F&, Sample>)) Pipeline map(F&& f, MapOptions options = {})
  const {
    if constexpr (std::is_invocable_r_v<Sample, F&, Sample, Rng&>) {
      return map_fn(MapFn(std::forward<F>(f)), options);
    } else {
      return map_fn(
          MapFn([g = std::forward<F>(f)](Sample s, Rng&) mutable { return g(std::move(s)); }),
          options);
    }
  }
  Pipeline map(const ImageTransform& transform, MapOptions options = {}) const;
  Pipeline filter(FilterFn predicate) const;
  // Whole-dataset permutation per epoch when the upstream has random access, else a buffer.
  Pipeline shuffle(uint64_t seed, ShuffleOptions options = {}) const;
  Pipeline batch(int64_t size, bool drop_remainder = false) const;
  Pipeline batch(int64_t size, BatchOptions options) const;
  // Runs the upstream on a background thread, keeping up to n elements ready.
  Pipeline prefetch(int64_t n) const;
  // Repeats the upstream count times (nullopt: forever), each repetition as a new inner epoch.
  Pipeline repeat(std::optional<int64_t> count = std::nullopt) const;
  Pipeline take(int64_t n) const;
  Pipeline skip(int64_t n) const;
  // Pairs elements with other's (stopping at the shorter); field names must not collide.
  Pipeline zip(const Pipeline& other) const;
  // Every count-th element starting at index: the part of worker `index` of `count`.
  Pipeline shard(int64_t count, int64_t index) const;
  // skip: upstream elements whose production raised an exception are dropped and counted.
  Pipeline on_error(OnError policy) const;

  // ---- description
  std::optional<int64_t> size() const;  // elements per epoch, when known without iterating
  bool random_access() const;
  std::string describe() const;  // "from_idx(...) -> shuffle(seed=1) -> batch(128)"
  // Element `index` of the current epoch; needs random_access().
  Sample get(int64_t index) const;

  // ---- iteration: `for (Batch& b : pipeline)` runs the rest of the current epoch; when it ends
  // the next loop runs the next epoch.
  class Iterator;
  struct Sentinel {};
  Iterator begin();
  Sentinel end() { return {}; }
  // The next element, or nullopt at the end of the epoch (which then moves to the next epoch).
  std::optional<Sample> next();

  int64_t epoch() const;
  void set_epoch(int64_t epoch);  // starts that epoch from its beginning
  PipelineState state() const;
  // Raises Error when the state was taken from a differently built pipeline.
  void restore(const PipelineState& state);
  PipelineStats stats() const;
  void reset_stats();

 private:
  Pipeline map_fn(MapFn f, MapOptions options) const;
  Pipeline then(std::shared_ptr<const detail::Node> node) const;
  friend Pipeline zip(const std::vector<Pipeline>& pipelines);
  std::shared_ptr<const detail::Node> node_;
  std::unique_ptr<detail::Run> run_;
};

class Pipeline::Iterator {
 public:
  using value_type = Sample;
  using difference_type = std::ptrdiff_t;
  Iterator() = default;
  Sample& operator*() const { return *current_; }
  Sample* operator->() const { return current_; }
  Iterator& operator++();
  void operator++(int) { ++*this; }
  bool operator==(const Sentinel&) const { return current_ == nullptr; }

 private:
  friend class Pipeline;
  Iterator(Pipeline* p, Sample* current) : pipeline_(p), current_(current) {}
  Pipeline* pipeline_ = nullptr;
  Sample* current_ = nullptr;
};

Pipeline zip(const std::vector<Pipeline>& pipelines);

// ---- sources ----------------------------------------------------------------------------

// Samples are slices along the leading axis of each tensor (all must have the same length).
Pipeline from_tensors(std::vector<std::pair<std::string, Tensor>> fields);
// MNIST-format IDX files, raw or gzip'd: fields "image" ([rows, cols] uint8 for idx3) and, with
// a labels file, "label" (int64 scalar). The files are decoded once, here.
Pipeline from_idx(const std::string& images, std::optional<std::string> labels = std::nullopt,
                  IdxOptions options = {});
// CSV with a header line: one field per kept column, each a scalar (text columns: uint8 [n]).
// A header name seen before is renamed as pandas does: the second "a" is "a.1", the third "a.2"
// (skipping names already taken).
Pipeline from_csv(const std::string& path, CsvOptions options = {});
// Sorted paths matching a shell pattern ("dir/*.png"); raises Error when nothing matches.
std::vector<std::string> glob(const std::string& pattern);
// Each file's bytes: fields "data" (uint8 [n]) and "index" (int64, position in `paths`).
// Files are read lazily, on the thread that asks for the sample.
Pipeline from_files(std::vector<std::string> paths);
// PNG or JPEG files (told apart by their first bytes), decoded lazily: fields "image" (uint8
// [H, W, C]), "index" (int64), and "label" (int64) when labels are given.
Pipeline from_images(std::vector<std::string> paths, std::vector<int64_t> labels = {},
                     ImageReadOptions options = {});

// ---- file formats -----------------------------------------------------------------------

struct IdxReport {
  int64_t skipped = 0;  // records lost to truncation or corruption (with OnError::skip)
  std::string error;    // what was wrong, when something was
};
// An IDX file, raw or gzip'd, as a tensor of its dtype (ubyte: uint8; byte, short, int: int32;
// float: float32; double: float64).
Tensor read_idx(const std::string& path, IdxOptions options = {}, IdxReport* report = nullptr);
// The bytes of a regular file (a directory, FIFO or device is an Error).
std::vector<uint8_t> read_file(const std::string& path);
// PNG or JPEG bytes to uint8 [H, W, C]; `name` appears in error messages.
Tensor decode_image(std::span<const uint8_t> bytes, std::string_view name,
                    ImageReadOptions options = {});
Tensor read_image(const std::string& path, ImageReadOptions options = {});
// uint8 [H, W] or [H, W, C] (C in 1..4 for PNG, 1 or 3 for JPEG) to file bytes.
std::vector<uint8_t> encode_png(const Tensor& image);
std::vector<uint8_t> encode_jpeg(const Tensor& image, int quality = 90);
// Replaces the file atomically (temporary file, fsync, rename): never half-written. A target
// that exists and is not a regular file (a directory, FIFO, device) is an Error.
void write_file(const std::string& path, std::span<const uint8_t> bytes);

}  // namespace kiln::data
