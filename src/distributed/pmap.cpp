// pmap: vmap whose named axis spans every process's examples, compiled with jit
// (docs/DESIGN.md, "pmap and the distributed runtime").
#include <map>
#include <sstream>

#include "distributed/runtime.h"
#include "kiln/distributed.h"

namespace kiln::detail {

class PmapCache {
 public:
  explicit PmapCache(VmapOptions options) : options(std::move(options)) {}
  VmapOptions options;
  // One jit cache per split of the axis over processes: the split is part of the program
  // (pmean's divisor, all_gather's shape, axis_index's offset).
  std::map<std::vector<int64_t>, std::shared_ptr<JitCache>> jits;
};

std::shared_ptr<PmapCache> make_pmap_cache(const VmapOptions& options) {
  return std::make_shared<PmapCache>(options);
}

namespace {

// What every process must agree on: the argument structure, and each leaf's dtype and shape
// with its mapped axis shown as `*` (local example counts may differ).
std::string signature(const TreeDef& def, const std::vector<Tensor>& leaves,
                      const MappedLeaves& mapped) {
  std::ostringstream os;
  os << def.to_string() << " with (";
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    if (i) os << ", ";
    if (!leaves[i].defined()) {
      os << "undefined";
      continue;
    }
    os << leaves[i].dtype() << "[";
    for (int d = 0; d < leaves[i].rank(); ++d)
      os << (d ? "," : "")
         << (mapped.dims[i] == d ? std::string("*") : std::to_string(leaves[i].shape()[d]));
    os << "]";
  }
  os << ")";
  return os.str();
}

// Runs `run` with the jit cache of this call's split over processes and f vmapped over the
// local examples with the axis spanning the processes.
template <class Run>
auto with_split(PmapCache& cache, const TreeDef& args_def, const std::vector<Tensor>& leaves,
                const FlatFn& fn, Run run) {
  if (const AxisScope* outer = find_process_axis())
    fail("pmap", "nested pmap: got a pmap inside the pmap over '", outer->name,
         "', expected one pmap at a time (map an inner axis with vmap)");
  const MappedLeaves mapped = mapped_leaves(cache.options, args_def, leaves);
  VmapOptions options = cache.options;
  options.processes = distributed::exchange_sizes(mapped.size, signature(args_def, leaves, mapped),
                                                  cache.options.name);
  std::shared_ptr<JitCache>& jit = cache.jits[options.processes->sizes];
  if (!jit) jit = make_jit_cache("pmap", std::nullopt);
  const FlatFn mapped_fn = [&](const std::vector<Tensor>& in, TreeDef& out_def) {
    FlatTree r = vmap_call(options, args_def, in, fn);
    out_def = std::move(r.def);
    return std::move(r.leaves);
  };
  return run(*jit, mapped_fn);
}

}  // namespace

FlatTree pmap_call(PmapCache& cache, const TreeDef& args_def, const std::vector<Tensor>& leaves,
                   const FlatFn& fn) {
  return with_split(cache, args_def, leaves, fn, [&](JitCache& jit, const FlatFn& mapped) {
    return jit_call(jit, args_def, leaves, mapped);
  });
}

ir::Function pmap_lower(PmapCache& cache, const TreeDef& args_def,
                        const std::vector<Tensor>& leaves, const FlatFn& fn) {
  return with_split(cache, args_def, leaves, fn, [&](JitCache& jit, const FlatFn& mapped) {
    return jit_lower(jit, args_def, leaves, mapped);
  });
}

}  // namespace kiln::detail
