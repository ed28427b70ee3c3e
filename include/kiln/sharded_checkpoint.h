// Sharded checkpoints: each process writes only its own pieces of the training state, and a
// checkpoint loads onto any number of processes and any layout, as Orbax does for JAX
// (docs/CHECKPOINTS.md, "Sharded checkpoints").
//
// dir/step-<S>/shard-<p>.safetensors holds process p's pieces, each with where it lies in the
// whole tensor; dir/step-<S>/index.safetensors, written by process 0 once every process has
// written its file, commits the step. Loading reads the latest committed step and puts every
// tensor back together whole; the caller then takes its own blocks of it for its layout.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/distributed.h"
#include "kiln/io.h"
#include "kiln/zero.h"

namespace kiln::distributed {

// One tensor's part held by this process.
struct Piece {
  std::string name;  // the whole tensor's name (a tree_names path)
  TensorType whole;  // the whole tensor's type
  Tensor data;       // the part, in the whole tensor's dtype
  // A block: where it starts along each dimension of the whole tensor (data's shape is its
  // extent). Flat: start[0] is where data's elements start in the flattened whole tensor.
  std::vector<int64_t> start;
  bool flat = false;
};

namespace detail {
std::vector<Piece> block_pieces(const std::vector<Tensor>& blocks,
                                const std::vector<std::string>& names,
                                const std::vector<Spec>& specs, const Mesh& mesh);
std::vector<Piece> zero_pieces(const std::vector<Tensor>& pieces,
                               const std::vector<std::string>& names, const ShardLayout& layout,
                               int64_t part);
}  // namespace detail

// The pieces this process writes of a tree of blocks laid out by `specs` (one per leaf, in
// flatten order) over the mesh: one replica of each block writes it, the one at position 0
// along the axes its spec does not name. Names are `prefix` + the leaves' tree_names.
template <Tree T>
std::vector<Piece> block_pieces(const T& blocks, const std::vector<Spec>& specs, const Mesh& mesh,
                                const std::string& prefix = "") {
  auto [leaves, def] = tree_flatten(blocks);
  std::vector<std::string> names = tree_names(def);
  for (std::string& n : names) n = prefix + n;
  return detail::block_pieces(leaves, names, specs, mesh);
}

// The pieces of a tree of ZeRO pieces (kiln/zero.h) of this process, part `part` of the layout.
template <Tree T>
std::vector<Piece> zero_pieces(const T& pieces, const ShardLayout& layout, int64_t part,
                               const std::string& prefix = "") {
  auto [leaves, def] = tree_flatten(pieces);
  std::vector<std::string> names = tree_names(def);
  for (std::string& n : names) n = prefix + n;
  return detail::zero_pieces(leaves, names, layout, part);
}

// Writes step `step` of a sharded checkpoint: every process calls it with the pieces it writes
// (together they must cover every tensor), each writes its file atomically, and once all have
// (a collective over every process) process 0 writes the index, which commits the step, and
// removes every other step (older ones, and any left uncommitted). Saving a step again first
// removes its index. A failure on any process is an Error on every process. A step whose writing
// was interrupted has no index and is never loaded. `metadata` is stored in the index.
void save_sharded(const std::string& dir, int64_t step, const std::vector<Piece>& pieces,
                  const std::map<std::string, std::string>& metadata = {});
// The same with the pieces made inside the save, so that an Error while making them on one
// process is an Error on every process too.
void save_sharded(const std::string& dir, int64_t step,
                  const std::function<std::vector<Piece>()>& make_pieces,
                  const std::map<std::string, std::string>& metadata = {});

// The latest committed step under dir, if any, and its index's metadata (plus "step"). Every
// process reads the directory itself: under mpirun it must be one shared filesystem.
std::optional<int64_t> latest_sharded_step(const std::string& dir);
std::map<std::string, std::string> sharded_metadata(const std::string& dir);

// Every tensor whole from the pieces in shard files as read (shards[p] is process p's), each
// piece checked against its tensor's type and bounds, every element covered; `source` names
// the step directory in errors. load_sharded reads the files and calls it.
io::TensorFile assemble_pieces(const std::vector<io::TensorFile>& shards,
                               const std::string& source);

// The latest committed step under dir with every tensor put back together whole, and the
// index's metadata (plus "step"). Every piece is checked against its tensor's type and bounds,
// and every element must be covered; an Error names the file otherwise.
io::TensorFile load_sharded(const std::string& dir);

}  // namespace kiln::distributed
