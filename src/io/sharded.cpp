// Sharded checkpoints (include/kiln/sharded_checkpoint.h): pieces written per process, a step
// committed by its index, tensors put back together whole on load.

#include <cstdio>
#include <filesystem>
#include <limits>

#include "detail/checked.h"
#include "kiln/indexing.h"
#include "kiln/ops.h"
#include "kiln/primitive.h"
#include "kiln/sharded_checkpoint.h"

namespace kiln::distributed {
namespace fs = std::filesystem;

namespace {

constexpr const char* kLoad = "io.load_sharded";
constexpr const char* kSave = "io.save_sharded";
constexpr const char* kWhere = "#at";  // the suffix of a piece's placement tensor

std::string step_dir(const std::string& dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%010lld", static_cast<long long>(step));
  return dir + "/" + name;
}
std::string shard_path(const std::string& step_dir, int64_t p) {
  return step_dir + "/shard-" + std::to_string(p) + ".safetensors";
}
std::string index_path(const std::string& step_dir) { return step_dir + "/index.safetensors"; }

// The step of a directory entry "step-<digits>", if it is one.
std::optional<int64_t> step_of(const std::string& entry) {
  if (entry.size() <= 5 || entry.compare(0, 5, "step-") != 0) return std::nullopt;
  int64_t s = 0;
  for (std::size_t i = 5; i < entry.size(); ++i) {
    if (entry[i] < '0' || entry[i] > '9' || s > (std::numeric_limits<int64_t>::max() - 9) / 10)
      return std::nullopt;
    s = s * 10 + (entry[i] - '0');
  }
  return s;
}

// A decimal count, or 0 for anything else.
int64_t count_of(const std::string& text) {
  try {
    std::size_t used = 0;
    const int64_t n = std::stoll(text, &used);
    return used == text.size() ? n : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

// [flat, rank, whole dims..., start...]
Tensor placement(const Piece& p) {
  std::vector<int64_t> v{p.flat ? 1 : 0, p.whole.shape.rank()};
  for (int64_t d : p.whole.shape.dims()) v.push_back(d);
  for (int64_t s : p.start) v.push_back(s);
  return tensor(v);
}

void check_piece(const Piece& p) {
  if (p.name.empty() || p.name.find('#') != std::string::npos)
    fail(kSave, "a piece needs a name without '#': got '", p.name, "'");
  if (!p.data.defined() || p.data.dtype() != p.whole.dtype)
    fail(kSave, "piece '", p.name, "' must hold ", p.whole.dtype, " data: got ",
         p.data.defined() ? p.data.type().to_string() : std::string("an undefined tensor"));
  const int64_t n = p.whole.shape.numel(kSave);
  if (p.flat) {
    if (p.start.size() != 1 || p.start[0] < 0 || p.data.rank() != 1 ||
        p.start[0] + p.data.numel() > n)
      fail(kSave, "flat piece '", p.name, "' does not fit ", p.whole, ": got ", p.data.type(),
           " from element ", p.start.empty() ? -1 : p.start[0]);
    return;
  }
  bool fits = static_cast<int>(p.start.size()) == p.whole.shape.rank() &&
              p.data.rank() == p.whole.shape.rank();
  for (int d = 0; fits && d < p.data.rank(); ++d)
    fits = p.start[static_cast<std::size_t>(d)] >= 0 &&
           p.start[static_cast<std::size_t>(d)] + p.data.shape()[d] <= p.whole.shape[d];
  if (!fits) fail(kSave, "block '", p.name, "' does not fit ", p.whole, ": got ", p.data.type());
}

}  // namespace

namespace detail {

std::vector<Piece> block_pieces(const std::vector<Tensor>& blocks,
                                const std::vector<std::string>& names,
                                const std::vector<Spec>& specs, const Mesh& mesh) {
  if (specs.size() != blocks.size())
    fail(kSave, "one spec per leaf: got ", specs.size(), " specs for ", blocks.size(), " leaves");
  std::vector<Piece> out;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const Tensor& b = blocks[i];
    if (!b.defined()) continue;
    bool writer = true;  // position 0 along every axis the spec does not name
    for (const MeshAxis& a : mesh.axes())
      writer = writer && (specs[i].names(a.name) || mesh.index(a.name) == 0);
    if (!writer) continue;
    std::vector<int64_t> whole = b.shape().dims(), start(whole.size(), 0);
    for (std::size_t d = 0; d < specs[i].dims.size() && d < whole.size(); ++d) {
      int64_t parts = 1, at = 0;
      for (const std::string& a : specs[i].dims[d]) {
        parts *= mesh.size(a);
        at = at * mesh.size(a) + mesh.index(a);
      }
      start[d] = at * whole[d];
      whole[d] = kiln::detail::checked_mul(kSave, whole[d], parts);
    }
    out.push_back({names[i], {b.dtype(), Shape(whole)}, b, start, false});
  }
  return out;
}

std::vector<Piece> zero_pieces(const std::vector<Tensor>& pieces,
                               const std::vector<std::string>& names, const ShardLayout& layout,
                               int64_t part) {
  if (pieces.size() != layout.full().size())
    fail(kSave, "the tree does not match the shard layout: got ", pieces.size(),
         " leaves, expected ", layout.full().size());
  std::vector<Piece> out;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const TensorType& whole = layout.full()[i];
    const int64_t n = whole.shape.numel(), k = layout.piece(i).shape.dims().back();
    const int64_t start = part * k, valid = std::min(k, n - start);
    if (valid <= 0) continue;  // all padding
    const Tensor flat = reshape(pieces[i], Shape{k});
    out.push_back({names[i], whole, slice(flat, {Slice{0, valid}}), {start}, true});
  }
  return out;
}

}  // namespace detail

io::TensorFile assemble_pieces(const std::vector<io::TensorFile>& shards,
                               const std::string& source) {
  struct Whole {
    TensorType type;
    Tensor data, covered;
  };
  std::map<std::string, Whole> wholes;
  for (std::size_t p = 0; p < shards.size(); ++p) {
    const std::string file = source + "/shard-" + std::to_string(p) + ".safetensors";
    for (const io::NamedTensor& t : shards[p].tensors) {
      // "<name>#<k>": the k-th piece of <name> in this file; "<name>#<k>#at": its placement.
      const bool placement = t.name.size() > 3 && t.name.ends_with(kWhere);
      const std::string stored = placement ? t.name.substr(0, t.name.size() - 3) : t.name;
      const std::size_t hash = stored.rfind('#');
      const bool numbered = hash != std::string::npos && hash > 0 && hash + 1 < stored.size() &&
                            stored.find_first_not_of("0123456789", hash + 1) == std::string::npos;
      if (!numbered || (placement && !shards[p].find(stored)))
        fail(kLoad, "unexpected tensor '", t.name, "' in ", file,
             ": expected pieces '<name>#<k>', each with its placement '<name>#<k>", kWhere, "'");
      if (placement) continue;
      const std::string name = stored.substr(0, hash);
      const Tensor* at = shards[p].find(t.name + kWhere);
      if (!at)
        fail(kLoad, "piece '", t.name, "' in ", file, " has no placement '", t.name, kWhere, "'");
      std::vector<int64_t> v;
      if (at->dtype() == int64 && at->rank() == 1) v = at->to_vector<int64_t>();
      const int64_t rank = v.size() >= 2 ? v[1] : -1;
      if (v.size() < 2 || (v[0] != 0 && v[0] != 1) || rank < 0 || rank > io::kMaxRank ||
          static_cast<int64_t>(v.size()) != 2 + rank + (v[0] == 1 ? 1 : rank))
        fail(kLoad, "bad placement of '", name, "' in ", file, ": got ", at->type(),
             ", expected i64[2 + 2 * rank] (flat, rank, dims, start)");
      const bool flat = v[0] == 1;
      std::vector<int64_t> dims(v.begin() + 2, v.begin() + 2 + rank);
      const std::vector<int64_t> start(v.begin() + 2 + rank, v.end());
      for (int64_t d : dims)
        if (d < 0) fail(kLoad, "negative dimension for '", name, "' in ", file);
      const TensorType type{t.tensor.dtype(), Shape(dims)};
      const int64_t n = type.shape.numel(kLoad);
      auto [it, fresh] = wholes.try_emplace(name);
      Whole& w = it->second;
      if (fresh) {
        w = {type, zeros(type.shape, type.dtype), zeros(type.shape, uint8)};
      } else if (w.type != type) {
        fail(kLoad, "pieces of '", name, "' disagree on its type: got ", w.type, " and ", type,
             " in ", file);
      }
      const Tensor& d = t.tensor;
      if (flat) {
        if (d.rank() != 1 || start[0] < 0 || start[0] > n - d.numel())
          fail(kLoad, "flat piece of '", name, "' in ", file, " does not fit ", type, ": got ",
               d.type(), " from element ", start[0]);
        const std::vector<Tensor> at0{tensor(start[0])};
        w.data = reshape(dynamic_update_slice(reshape(w.data, Shape{n}), d, at0), type.shape);
        w.covered =
            reshape(dynamic_update_slice(reshape(w.covered, Shape{n}), ones(d.shape(), uint8), at0),
                    type.shape);
        continue;
      }
      bool fits = d.rank() == rank;
      for (int64_t k = 0; fits && k < rank; ++k)
        fits = start[static_cast<std::size_t>(k)] >= 0 &&
               start[static_cast<std::size_t>(k)] <=
                   dims[static_cast<std::size_t>(k)] - d.shape()[static_cast<int>(k)];
      if (!fits)
        fail(kLoad, "block of '", name, "' in ", file, " does not fit ", type, ": got ", d.type(),
             " at ", attr_to_string(start));
      std::vector<Tensor> starts;
      for (int64_t s : start) starts.push_back(tensor(s));
      w.data = dynamic_update_slice(w.data, d, starts);
      w.covered = dynamic_update_slice(w.covered, ones(d.shape(), uint8), starts);
    }
  }
  io::TensorFile out;
  for (auto& [name, w] : wholes) {
    const int64_t covered = sum(astype(w.covered, int64)).item<int64_t>();
    if (covered != w.type.shape.numel())
      fail(kLoad, "tensor '", name, "' is incomplete in ", source, ": got pieces covering ",
           covered, " of its ", w.type.shape.numel(), " elements");
    out.tensors.push_back({name, w.data});
  }
  return out;
}

void save_sharded(const std::string& dir, int64_t step, const std::vector<Piece>& pieces,
                  const std::map<std::string, std::string>& metadata) {
  if (step < 0) fail(kSave, "the step must not be negative: got ", step);
  const std::string here = step_dir(dir, step);
  std::error_code ec;
  fs::create_directories(here, ec);
  if (ec) fail(kSave, "cannot create '", here, "': ", ec.message());
  std::vector<io::NamedTensor> tensors;
  std::map<std::string, int> count;  // pieces of each tensor so far
  for (const Piece& p : pieces) {
    check_piece(p);
    const std::string stored = p.name + "#" + std::to_string(count[p.name]++);
    tensors.push_back({stored, p.data});
    tensors.push_back({stored + kWhere, placement(p)});
  }
  const int rank = process_index(), n = process_count();
  io::save_tensors(shard_path(here, rank), tensors);
  // Every process has written its file: one collective, which also reports a process that
  // failed or died meanwhile (then the step is never committed).
  auto all = pmap([](const Tensor& x) { return psum(x, "processes"); }, axis_name("processes"),
                  out_axes(none));
  if (all(expand_dims(tensor(int64_t{1}), 0)).item<int64_t>() != n)
    fail(kSave, "not every process wrote its pieces of step ", step, " into ", here);
  // Process 0 commits; the others learn whether it did before they return.
  std::optional<std::string> problem;
  if (rank == 0) {
    try {
      std::map<std::string, std::string> index = metadata;
      index["shards"] = std::to_string(n);
      index["step"] = std::to_string(step);
      io::save_tensors(index_path(here), {}, index);
      for (const auto& e : fs::directory_iterator(dir, ec))
        if (const auto s = step_of(e.path().filename().string()); s && *s != step)
          fs::remove_all(e.path(), ec);
    } catch (const Error& e) {
      problem = e.what();
    }
  }
  const int64_t committed = rank == 0 && !problem ? 1 : 0;
  if (all(expand_dims(tensor(committed), 0)).item<int64_t>() != 1)
    fail(kSave, "step ", step, " in ", here, " was not committed",
         problem ? ": " + *problem : std::string(" (see process 0)"));
}

std::optional<int64_t> latest_sharded_step(const std::string& dir) {
  std::optional<int64_t> latest;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (const auto s = step_of(e.path().filename().string());
        s && fs::is_regular_file(index_path(e.path().string()), ec) && (!latest || *s > *latest))
      latest = s;
  return latest;
}

namespace {

// The latest committed step's directory and index.
std::pair<std::string, io::TensorFile> latest_index(const std::string& dir) {
  const std::optional<int64_t> step = latest_sharded_step(dir);
  if (!step)
    fail(kLoad, "no committed checkpoint in '", dir,
         "': got no step-<n> directory with an index.safetensors");
  const std::string here = step_dir(dir, *step);
  return {here, io::load_tensors(index_path(here))};
}

}  // namespace

std::map<std::string, std::string> sharded_metadata(const std::string& dir) {
  return latest_index(dir).second.metadata;
}

io::TensorFile load_sharded(const std::string& dir) {
  const auto [here, index] = latest_index(dir);
  const auto shards = index.metadata.find("shards");
  const int64_t n = shards == index.metadata.end() ? 0 : count_of(shards->second);
  if (n < 1 || n > (1 << 20))
    fail(kLoad, "bad index ", index_path(here),
         ": expected \"shards\" in its metadata, a count from 1");
  std::vector<io::TensorFile> files;
  for (int64_t p = 0; p < n; ++p) files.push_back(io::load_tensors(shard_path(here, p)));
  io::TensorFile out = assemble_pieces(files, here);
  out.metadata = index.metadata;
  return out;
}

}  // namespace kiln::distributed
