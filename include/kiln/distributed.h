// Several processes, one program: the MPI runtime, pmap, and meshes with shard_map
// (docs/DISTRIBUTED.md).
//
// Start a program with `mpirun -np N prog` and every process runs main; pmap maps a function
// over a named axis that spans all of them, and the collectives of kiln/transforms.h (psum,
// pmean, all_gather, ...) over that axis communicate between processes. Started without
// mpirun, a program is one process and pmap is jit(vmap(f)).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "kiln/transforms.h"

namespace kiln {
namespace distributed {

// Starts MPI (MPI_Init_thread) when the program was launched by mpirun; otherwise the
// program is one process and MPI stays untouched. Idempotent; the first pmap calls it too.
// Installs Kiln's failure handling: a process that ends with an uncaught exception tells the
// others, whose waiting collectives then raise an Error naming it.
void initialize();
bool initialized();
// This process's index in [0, process_count()), and the number of processes (1 without
// mpirun). Both initialize() first.
int process_index();
int process_count();
// Ends MPI; also called at exit. A process that finalizes while others still wait for it in
// a collective tells them, so they fail with an Error instead of hanging.
void finalize();

// ---- meshes and shard_map -------------------------------------------------------------------

// One named axis of a mesh and its size.
struct MeshAxis {
  std::string name;
  int64_t size = 1;
};

// The processes arranged as an array with named axes, as jax.sharding.Mesh: process r sits at
// the row-major position r (the last axis varies fastest). The sizes multiply to
// process_count(); every process builds the same mesh.
class Mesh {
 public:
  explicit Mesh(std::vector<MeshAxis> axes);

  const std::vector<MeshAxis>& axes() const { return axes_; }
  // The size of the named axis, and this process's position along it (Error: no such axis).
  int64_t size(const std::string& axis) const;
  int64_t index(const std::string& axis) const;
  // The processes (ranks) on the line along `axis` through this one, in axis order: the
  // group a collective over that axis spans.
  std::vector<int64_t> group(const std::string& axis) const;
  std::string to_string() const;  // "{data: 2, model: 2}"

 private:
  std::size_t find(const std::string& axis) const;
  std::vector<MeshAxis> axes_;
  std::vector<int64_t> coords_;  // this process's position along each axis
};

// How an array is laid out over a mesh, as JAX's PartitionSpec: for each leading dimension,
// the mesh axes it is split over (the major one first; none: not split). The array varies
// along the named axes and holds the same values (replicas) along the others.
struct Spec {
  std::vector<std::vector<std::string>> dims;
  bool names(const std::string& axis) const;
};
// One dimension of a spec: none, one axis, or several (major first).
struct SpecDim {
  std::vector<std::string> axes;
  SpecDim(NotBatched) {}                                       // NOLINT: implicit
  SpecDim(const char* axis) : axes{axis} {}                    // NOLINT: implicit
  SpecDim(std::string axis) : axes{std::move(axis)} {}         // NOLINT: implicit
  SpecDim(std::vector<std::string> a) : axes(std::move(a)) {}  // NOLINT: implicit
};
// spec("data", none) splits dimension 0 over "data"; spec(std::vector<std::string>{"data",
// "model"}) splits it over both; spec() is fully replicated.
template <class... D>
Spec spec(D... dims) {
  return {{SpecDim(std::move(dims)).axes...}};
}
// One spec per tensor leaf of an argument, in flatten order.
struct LeafSpecs {
  std::vector<Spec> specs;
};
using ArgSpec = std::variant<Spec, LeafSpecs>;
// Per argument: one spec for all its leaves, or one per leaf.
struct InSpecs {
  std::vector<ArgSpec> args;
};
template <class... A>
InSpecs in_specs(A... a) {
  return {{ArgSpec(std::move(a))...}};
}
// One spec for every result leaf, or one per result leaf in flatten order.
struct OutSpecs {
  std::vector<Spec> leaves;
};
template <class... A>
OutSpecs out_specs(A... a) {
  return {{std::move(a)...}};
}

// Process p's block of a global array laid out by `spec` over the mesh: the slice along each
// split dimension at p's position (no communication; the dimension must divide evenly).
Tensor local_block(const Tensor& global, const Mesh& mesh, const Spec& spec);
// Inside shard_map, the inverse: the global array from every process's block, gathered along
// the axes the spec names (one all_gather per named axis). The same on every process.
Tensor assemble(const Tensor& block, const Spec& spec);

}  // namespace distributed

namespace detail {
class ShardMapCache;
std::shared_ptr<ShardMapCache> make_shard_map_cache(distributed::Mesh mesh, distributed::InSpecs in,
                                                    distributed::OutSpecs out);
FlatTree shard_map_call(ShardMapCache& cache, const TreeDef& args_def,
                        const std::vector<Tensor>& leaves, const FlatFn& fn);

template <class F>
class ShardMapped {
 public:
  ShardMapped(F f, std::shared_ptr<ShardMapCache> cache) : f_(std::move(f)), cache_(cache) {}
  template <class... Args>
  auto operator()(const Args&... args) const {
    if constexpr (!returns_tree<const F&, Args...>) {
      static_assert(returns_tree<const F&, Args...>, "shard_map: " KILN_DETAIL_NOT_TREE_FN);
    } else {
      const FlatTree in = flatten_args(args...);
      return unflatten<result_of<F, Args...>>(
          shard_map_call(*cache_, in.def, in.leaves, flat_fn<Args...>(f_, in.def)));
    }
  }

 private:
  F f_;
  std::shared_ptr<ShardMapCache> cache_;
};

class PmapCache;
std::shared_ptr<PmapCache> make_pmap_cache(const VmapOptions& options);
// Runs fn over the local examples of the arguments (leaves batched as options.in says), with
// the named axis spanning every process's examples.
FlatTree pmap_call(PmapCache& cache, const TreeDef& args_def, const std::vector<Tensor>& leaves,
                   const FlatFn& fn);
// The optimised IR pmap_call runs for these arguments (all processes call it together).
ir::Function pmap_lower(PmapCache& cache, const TreeDef& args_def,
                        const std::vector<Tensor>& leaves, const FlatFn& fn);

template <class F>
class Pmapped {
 public:
  Pmapped(F f, const VmapOptions& o) : f_(std::move(f)), cache_(make_pmap_cache(o)) {}
  template <class... Args>
  auto operator()(const Args&... args) const {
    if constexpr (!returns_tree<const F&, Args...>) {
      static_assert(returns_tree<const F&, Args...>, "pmap: " KILN_DETAIL_NOT_TREE_FN);
    } else {
      const FlatTree in = flatten_args(args...);
      return unflatten<result_of<F, Args...>>(
          pmap_call(*cache_, in.def, in.leaves, flat_fn<Args...>(f_, in.def)));
    }
  }
  // The optimised IR of this process's program: the batched function with its process-level
  // collectives (a collective call: every process must call it too).
  template <class... Args>
  ir::Function lower(const Args&... args) const {
    const FlatTree in = flatten_args(args...);
    return pmap_lower(*cache_, in.def, in.leaves, flat_fn<Args...>(f_, in.def));
  }

 private:
  F f_;
  std::shared_ptr<PmapCache> cache_;
};
}  // namespace detail

// pmap(f, axis_name("dp"), in_axes(...), out_axes(...)): SPMD over processes. Every process
// calls it with its local examples (batched along in_axes, default 0; `none` for arguments
// every process passes alike); the named axis spans all processes' examples, so its size is
// the sum of the local sizes, and collectives over it see every example. f is traced once
// per signature and compiled with jit; each process gets the results of its own examples.
template <class F, class... Options>
auto pmap(F f, Options... options) {
  return detail::Pmapped<F>(std::move(f), detail::vmap_options(options...));
}

// shard_map(f, mesh, in_specs(...), out_specs(...)): SPMD over a mesh of processes, as
// jax.experimental.shard_map. Every process calls it with its own blocks (local_block of the
// global arrays) and f runs once per process on them, with each mesh axis bound as a named
// axis: collectives over "model" (psum, all_gather, psum_scatter, ppermute, all_to_all,
// axis_index) run among the processes that differ only in their "model" position. An
// argument varies along the axes its spec names and is replicated along the others; a result
// may vary only along the axes its out spec names (else an Error: it would not be the same
// on the replicas). Results are this process's blocks. Traced once per signature, compiled
// with jit; grad, vmap and jit compose with it. pmap is the one-axis case with uneven blocks.
template <class F>
auto shard_map(F f, const distributed::Mesh& mesh, distributed::InSpecs in,
               distributed::OutSpecs out) {
  return detail::ShardMapped<F>(std::move(f),
                                detail::make_shard_map_cache(mesh, std::move(in), std::move(out)));
}

}  // namespace kiln
