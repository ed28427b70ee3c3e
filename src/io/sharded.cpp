// Sharded checkpoints (include/kiln/sharded_checkpoint.h): pieces written per process, a step
// committed by its index, tensors put back together whole on load.

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>

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

// The step of a directory entry named as step_dir names them ("step-" and ten digits).
std::optional<int64_t> step_of(const std::string& entry) {
  if (entry.size() != 15 || entry.compare(0, 5, "step-") != 0 ||
      entry.find_first_not_of("0123456789", 5) != std::string::npos)
    return std::nullopt;
  return std::stoll(entry.substr(5));
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
    fail(kSave, "bad piece name: got '", p.name, "', expected a non-empty name without '#'");
  if (!p.data.defined() || p.data.dtype() != p.whole.dtype)
    fail(kSave, "piece '", p.name, "' holds the wrong data: got ",
         p.data.defined() ? p.data.type().to_string() : std::string("an undefined tensor"),
         ", expected ", p.whole.dtype, " data");
  const int64_t n = p.whole.shape.numel(kSave);
  if (p.flat) {
    if (p.start.size() != 1 || p.start[0] < 0 || p.data.rank() != 1 ||
        p.start[0] > n - p.data.numel())
      fail(kSave, "flat piece '", p.name, "' does not fit its tensor: got ", p.data.type(),
           " from element ", p.start.empty() ? -1 : p.start[0], ", expected a 1-d run inside ",
           p.whole);
    return;
  }
  bool fits = static_cast<int>(p.start.size()) == p.whole.shape.rank() &&
              p.data.rank() == p.whole.shape.rank();
  for (int d = 0; fits && d < p.data.rank(); ++d)
    fits = p.start[static_cast<std::size_t>(d)] >= 0 &&
           p.start[static_cast<std::size_t>(d)] <= p.whole.shape[d] - p.data.shape()[d];
  if (!fits)
    fail(kSave, "block '", p.name, "' does not fit its tensor: got ", p.data.type(), " at ",
         attr_to_string(p.start), ", expected a block inside ", p.whole);
}

}  // namespace

namespace detail {

std::vector<Piece> block_pieces(const std::vector<Tensor>& blocks,
                                const std::vector<std::string>& names,
                                const std::vector<Spec>& specs, const Mesh& mesh) {
  if (specs.size() != blocks.size())
    fail(kSave, "wrong number of specs: got ", specs.size(), " for ", blocks.size(),
         " leaves, expected one per leaf");
  std::vector<Piece> out;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const Tensor& b = blocks[i];
    if (!b.defined()) continue;
    bool writer = true;  // position 0 along every axis the spec does not name
    for (const MeshAxis& a : mesh.axes())
      writer = writer && (specs[i].names(a.name) || mesh.index(a.name) == 0);
    if (!writer) continue;
    std::vector<int64_t> whole = b.shape().dims(), start(whole.size(), 0);
    if (specs[i].dims.size() > whole.size())
      fail(kSave, "the spec of '", names[i], "' lists ", specs[i].dims.size(),
           " dimensions: got a block ", b.type(), ", expected at most its rank");
    for (std::size_t d = 0; d < specs[i].dims.size(); ++d) {
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
  if (part < 0 || part >= layout.parts())
    fail(kSave, "bad part: got ", part, ", expected one in [0, ", layout.parts(), ")");
  if (pieces.size() != layout.full().size())
    fail(kSave, "the tree does not match the shard layout: got ", pieces.size(),
         " leaves, expected ", layout.full().size());
  std::vector<Piece> out;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const TensorType& whole = layout.full()[i];
    const int64_t n = whole.shape.numel(), k = layout.piece(i).shape.dims().back();
    if (!pieces[i].defined() || pieces[i].type() != layout.piece(i))
      fail(kSave, "piece ", i, " ('", names[i], "') does not match the shard layout: got ",
           pieces[i].defined() ? pieces[i].type().to_string() : std::string("undefined"),
           ", expected ", layout.piece(i));
    const int64_t start = part * k, valid = std::min(k, n - start);
    if (valid < 0 || (valid == 0 && !(n == 0 && part == 0))) continue;  // all padding
    const Tensor flat = reshape(pieces[i], Shape{k});
    out.push_back({names[i], whole, slice(flat, {Slice{0, valid}}), {start}, true});
  }
  return out;
}

}  // namespace detail

namespace {

// One piece as a shard file holds it, its placement checked.
struct Placed {
  std::string name;  // the whole tensor's
  TensorType whole;
  const Tensor* data = nullptr;
  std::vector<int64_t> start;
  bool flat = false;
};

// The pieces of one shard file, each checked against its placement and the bounds it names.
std::vector<Placed> placed_pieces(const io::TensorFile& shard, const std::string& file) {
  std::vector<Placed> out;
  for (const io::NamedTensor& t : shard.tensors) {
    // "<name>#<k>": the k-th piece of <name> in this file; "<name>#<k>#at": its placement.
    const bool placement = t.name.size() > 3 && t.name.ends_with(kWhere);
    const std::string stored = placement ? t.name.substr(0, t.name.size() - 3) : t.name;
    const std::size_t hash = stored.rfind('#');
    const bool numbered = hash != std::string::npos && hash > 0 && hash + 1 < stored.size() &&
                          stored.find_first_not_of("0123456789", hash + 1) == std::string::npos;
    if (!numbered || (placement && !shard.find(stored)))
      fail(kLoad, "unexpected tensor in ", file, ": got '", t.name,
           "', expected pieces '<name>#<k>', each with its placement '<name>#<k>", kWhere, "'");
    if (placement) continue;
    const std::string name = stored.substr(0, hash);
    const Tensor* at = shard.find(t.name + kWhere);
    if (!at)
      fail(kLoad, "piece '", t.name, "' in ", file, " has no placement: got no '", t.name, kWhere,
           "', expected one beside it");
    std::vector<int64_t> v;
    if (at->dtype() == int64 && at->rank() == 1) v = at->to_vector<int64_t>();
    const int64_t rank = v.size() >= 2 ? v[1] : -1;
    if (v.size() < 2 || (v[0] != 0 && v[0] != 1) || rank < 0 || rank > io::kMaxRank ||
        static_cast<int64_t>(v.size()) != 2 + rank + (v[0] == 1 ? 1 : rank))
      fail(kLoad, "bad placement of '", t.name, "' in ", file, ": got ", at->type(),
           ", expected i64[2 + rank + (rank, or 1 for a flat piece)] (flat, rank, dims, start)");
    for (auto d = v.begin() + 2; d != v.begin() + 2 + rank; ++d)
      if (*d < 0)
        fail(kLoad, "bad placement of '", t.name, "' in ", file, ": got the dimension ", *d,
             ", expected sizes >= 0");
    Placed p{name,
             {t.tensor.dtype(), Shape(std::vector<int64_t>(v.begin() + 2, v.begin() + 2 + rank))},
             &t.tensor,
             std::vector<int64_t>(v.begin() + 2 + rank, v.end()),
             v[0] == 1};
    const int64_t n = p.whole.shape.numel(kLoad);  // checked: no negative or huge dimensions
    const Tensor& d = t.tensor;
    bool fits = true;
    if (p.flat) {
      fits = d.rank() == 1 && p.start[0] >= 0 && p.start[0] <= n - d.numel();
    } else {
      fits = d.rank() == rank;
      for (int k = 0; fits && k < d.rank(); ++k)
        fits = p.start[static_cast<std::size_t>(k)] >= 0 &&
               p.start[static_cast<std::size_t>(k)] <= p.whole.shape[k] - d.shape()[k];
    }
    if (!fits)
      fail(kLoad, "piece '", t.name, "' in ", file, " does not fit its tensor: got ", d.type(),
           " at ", attr_to_string(p.start), ", expected it inside ", p.whole);
    out.push_back(std::move(p));
  }
  return out;
}

// Copies a piece into the whole tensor's contiguous bytes and counts what it covers.
void place(const Placed& p, std::byte* whole, std::vector<uint8_t>& covered) {
  const Tensor d = p.data->contiguous();
  const auto* from = static_cast<const std::byte*>(d.raw_data());
  const std::size_t es = dtype_size(d.dtype());
  auto cover = [&](int64_t at, int64_t n) {
    std::memcpy(whole + at * static_cast<int64_t>(es), from, static_cast<std::size_t>(n) * es);
    from += n * static_cast<int64_t>(es);
    for (int64_t i = 0; i < n; ++i) ++covered[static_cast<std::size_t>(at + i)];
  };
  if (p.flat || d.numel() == 0) {
    if (d.numel() > 0) cover(p.start[0], d.numel());
    return;
  }
  // Row-major over the block: one run of the last dimension at a time.
  const int r = d.rank();
  if (r == 0) return cover(0, 1);
  std::vector<int64_t> strides(static_cast<std::size_t>(r), 1),
      index(static_cast<std::size_t>(r), 0);
  for (int k = r - 2; k >= 0; --k)
    strides[static_cast<std::size_t>(k)] =
        strides[static_cast<std::size_t>(k) + 1] * p.whole.shape[k + 1];
  const int64_t run = d.shape()[r - 1];
  for (int64_t row = 0; row < d.numel() / run; ++row) {
    int64_t at = 0;
    for (int k = 0; k < r; ++k)
      at += (p.start[static_cast<std::size_t>(k)] + index[static_cast<std::size_t>(k)]) *
            strides[static_cast<std::size_t>(k)];
    cover(at, run);
    for (int k = r - 2; k >= 0; --k) {  // the next row of the block
      if (++index[static_cast<std::size_t>(k)] < d.shape()[k]) break;
      index[static_cast<std::size_t>(k)] = 0;
    }
  }
}

}  // namespace

io::TensorFile assemble_pieces(const std::vector<io::TensorFile>& shards,
                               const std::string& source) {
  // First every placement, checked, and each tensor's elements added up: the whole tensors are
  // allocated only when their pieces hold exactly as many elements (a file cannot make a
  // reader allocate more than it holds).
  std::vector<std::vector<Placed>> files;
  struct Whole {
    TensorType type;
    int64_t pieces_elements = 0;
    std::string first_file;
  };
  std::map<std::string, Whole> wholes;
  for (std::size_t p = 0; p < shards.size(); ++p) {
    const std::string file = shard_path(source, static_cast<int64_t>(p));
    files.push_back(placed_pieces(shards[p], file));
    for (const Placed& piece : files.back()) {
      auto [it, fresh] = wholes.try_emplace(piece.name, Whole{piece.whole, 0, file});
      if (!fresh && it->second.type != piece.whole)
        fail(kLoad, "pieces of '", piece.name, "' disagree on its type: got ", piece.whole, " in ",
             file, ", expected ", it->second.type, " as in ", it->second.first_file);
      it->second.pieces_elements =
          kiln::detail::checked_add(kLoad, it->second.pieces_elements, piece.data->numel());
    }
  }
  for (const auto& [name, w] : wholes)
    if (w.pieces_elements != w.type.shape.numel())
      fail(kLoad, "tensor '", name, "' does not add up in ", source, ": got pieces of ",
           w.pieces_elements, " elements, expected its ", w.type.shape.numel(),
           " elements, each once");
  io::TensorFile out;
  for (const auto& [name, w] : wholes) {
    Tensor whole = empty(w.type.shape, w.type.dtype);
    std::vector<uint8_t> covered(static_cast<std::size_t>(w.type.shape.numel()), 0);
    for (const std::vector<Placed>& pieces : files)
      for (const Placed& p : pieces)
        if (p.name == name) place(p, static_cast<std::byte*>(whole.raw_data()), covered);
    const auto once = std::count(covered.begin(), covered.end(), uint8_t{1});
    if (once != static_cast<std::ptrdiff_t>(covered.size()))
      fail(kLoad, "tensor '", name, "' is covered unevenly in ", source, ": got ", once, " of its ",
           covered.size(), " elements in exactly one piece, expected all of them");
    out.tensors.push_back({name, whole});
  }
  return out;
}

void save_sharded(const std::string& dir, int64_t step, const std::vector<Piece>& pieces,
                  const std::map<std::string, std::string>& metadata) {
  save_sharded(
      dir, step, [&pieces] { return pieces; }, metadata);
}

void save_sharded(const std::string& dir, int64_t step,
                  const std::function<std::vector<Piece>()>& make_pieces,
                  const std::map<std::string, std::string>& metadata) {
  if (step < 0 || step > 9'999'999'999)  // step_dir's ten digits
    fail(kSave, "bad step: got ", step, ", expected a count from 0 to 9999999999");
  const std::string here = step_dir(dir, step);
  const int rank = process_index(), n = process_count();
  // Each phase's failures are caught and counted in one collective, so that every process
  // fails together instead of leaving the others waiting.
  auto all = pmap([](const Tensor& x) { return psum(x, "processes"); }, axis_name("processes"),
                  out_axes(none));
  auto together = [&](const char* phase, const std::function<void()>& work) {
    std::optional<std::string> problem;
    try {
      work();
    } catch (const std::exception& e) {
      problem = e.what();
    }
    if (all(expand_dims(tensor(int64_t{problem ? 1 : 0}), 0)).item<int64_t>() != 0)
      fail(kSave, "step ", step, " in ", here, " was not committed: ", phase, " failed",
           problem ? " here: " + *problem : std::string(" on another process"));
  };
  // An index of an earlier save of this step goes first: until the new one is written, the
  // step is not committed (its files would mix two saves).
  together("clearing the step", [&] {
    std::error_code ec;
    if (rank == 0) fs::remove(index_path(here), ec);
    if (ec) throw std::runtime_error("cannot remove " + index_path(here) + ": " + ec.message());
  });
  together("writing this process's pieces", [&] {
    std::error_code ec;
    fs::create_directories(here, ec);
    if (ec) throw std::runtime_error("cannot create '" + here + "': " + ec.message());
    std::vector<io::NamedTensor> tensors;
    std::map<std::string, int> count;  // pieces of each tensor so far
    for (const Piece& p : make_pieces()) {
      check_piece(p);
      const std::string stored = p.name + "#" + std::to_string(count[p.name]++);
      tensors.push_back({stored, p.data});
      tensors.push_back({stored + kWhere, placement(p)});
    }
    io::save_tensors(shard_path(here, rank), tensors);
  });
  // Every file is written: process 0 commits, then removes every other step.
  together("committing", [&] {
    if (rank != 0) return;
    std::map<std::string, std::string> index = metadata;
    index["shards"] = std::to_string(n);
    index["step"] = std::to_string(step);
    io::save_tensors(index_path(here), {}, index);
    std::error_code ec;
    for (fs::directory_iterator e(dir, ec), end; !ec && e != end; e.increment(ec))
      if (const auto s = step_of(e->path().filename().string()); s && *s != step)
        fs::remove_all(e->path(), ec);
  });
}

std::optional<int64_t> latest_sharded_step(const std::string& dir) {
  std::optional<int64_t> latest;
  std::error_code ec;
  for (fs::directory_iterator e(dir, ec), end; !ec && e != end; e.increment(ec)) {
    std::error_code missing;  // a step without an index is not committed
    if (const auto s = step_of(e->path().filename().string());
        s && fs::is_regular_file(index_path(e->path().string()), missing) &&
        (!latest || *s > *latest))
      latest = s;
  }
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
    fail(kLoad, "bad index ", index_path(here), ": got shards = '",
         shards == index.metadata.end() ? std::string("(none)") : shards->second,
         "', expected a count of shard files from 1 in its metadata");
  std::vector<io::TensorFile> files;
  for (int64_t p = 0; p < n; ++p) files.push_back(io::load_tensors(shard_path(here, p)));
  io::TensorFile out = assemble_pieces(files, here);
  out.metadata = index.metadata;
  return out;
}

}  // namespace kiln::distributed
