// Several processes, one program: the MPI runtime and pmap (docs/DISTRIBUTED.md).
//
// Start a program with `mpirun -np N prog` and every process runs main; pmap maps a function
// over a named axis that spans all of them, and the collectives of kiln/transforms.h (psum,
// pmean, all_gather, ...) over that axis communicate between processes. Started without
// mpirun, a program is one process and pmap is jit(vmap(f)).
#pragma once

#include <memory>

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

}  // namespace distributed

namespace detail {
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

}  // namespace kiln
