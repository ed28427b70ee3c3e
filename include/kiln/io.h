// Checkpoints: tensors and trees of tensors to and from safetensors files (docs/CHECKPOINTS.md).
//
// The format (https://github.com/huggingface/safetensors): an 8-byte little-endian header size N,
// N bytes of JSON mapping each tensor name to {"dtype", "shape", "data_offsets"} plus an optional
// "__metadata__" string map, then the tensors' bytes, row-major and little-endian. Loading trusts
// nothing in the file: every malformed input raises kiln::Error ("[io.load] ...") naming the file.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/tensor.h"
#include "kiln/tree.h"

namespace kiln::io {

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

// What a safetensors file holds.
struct TensorFile {
  std::vector<NamedTensor> tensors;             // in file order (by data offset)
  std::map<std::string, std::string> metadata;  // the "__metadata__" string map
  // The tensor called `name`, or nullptr.
  const Tensor* find(std::string_view name) const;
};

struct LoadOptions {
  // Ignore tensors in the file that the tree does not have (otherwise they raise an Error).
  bool allow_extra = false;
};

// Limits on what a file may declare (the header of a larger file is rejected before any of it
// is read or allocated).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;
inline constexpr int kMaxRank = 64;

// The safetensors name of a Kiln dtype ("F32", "BF16", "BOOL", ...).
std::string_view safetensors_dtype_name(DType d);

// ---- tensors by name ------------------------------------------------------------------------

// Writes the tensors (any strides; written contiguous) in the given order, atomically: a
// temporary file in the same directory is written, fsync'ed and renamed over `path`, then the
// directory is fsync'ed. On failure the temporary file is removed, an existing file at `path`
// is left as it was, and an Error names the path and the system's reason.
// Names must be non-empty, valid UTF-8, unique and not "__metadata__".
void save_tensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                  const std::map<std::string, std::string>& metadata = {});
// Reads and validates a whole file.
TensorFile load_tensors(const std::string& path);

// The same in memory. `source` names the bytes in error messages.
std::vector<uint8_t> serialize_safetensors(const std::vector<NamedTensor>& tensors,
                                           const std::map<std::string, std::string>& metadata = {});
TensorFile parse_safetensors(std::span<const uint8_t> bytes, std::string_view source = "<memory>");

// ---- trees ----------------------------------------------------------------------------------

namespace detail {
// The defined leaves with their tree_names, for writing (undefined leaves are skipped).
std::vector<NamedTensor> named_leaves(const std::vector<Tensor>& leaves,
                                      const std::vector<std::string>& names);
// The file's tensors in the order of `names`, checked against the dtypes and shapes of `like`.
std::vector<Tensor> match_leaves(TensorFile file, const std::vector<std::string>& names,
                                 const std::vector<Tensor>& like, std::string_view path,
                                 const LoadOptions& options);
}  // namespace detail

// Saves every Tensor leaf of `tree` under its kiln::tree_names name ("layers.0.w"). Undefined
// leaves are not written.
template <Tree T>
void save(const std::string& path, const T& tree,
          const std::map<std::string, std::string>& metadata = {}) {
  auto [leaves, def] = tree_flatten(tree);
  save_tensors(path, detail::named_leaves(leaves, tree_names(def)), metadata);
}

// Loads a tree shaped like `like`: each of its leaf names must be in the file with the leaf's
// dtype and shape (an undefined leaf takes the file's tensor as it is, or stays undefined when
// the file has none). Tensors in the file the tree does not have raise an Error unless
// options.allow_extra. Static values and container sizes come from `like`.
template <Tree T>
T load(const std::string& path, const T& like, LoadOptions options = {}) {
  auto [leaves, def] = tree_flatten(like);
  std::vector<Tensor> loaded =
      detail::match_leaves(load_tensors(path), tree_names(def), leaves, path, options);
  return tree_unflatten<T>(def, loaded);
}

}  // namespace kiln::io
