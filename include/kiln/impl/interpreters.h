// Internal: the IR interpreters the transformations run — forward and reverse mode
// (src/transforms/ad.cpp) and batching (src/transforms/vmap.cpp). Included by kiln/transforms.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/ir.h"

namespace kiln {

namespace ad {

struct JvpResult {
  std::vector<Tensor> outputs;
  std::vector<Tangent> tangents;
};
// Forward mode: evaluates f and its directional derivative along `tangents`.
JvpResult jvp(const ir::Function& f, std::span<const Tensor> primals,
              std::span<const Tangent> tangents);

// The reverse pass of one evaluation; holds the values of the forward pass it needs.
class Pullback {
 public:
  // A backward program traced ahead of time: cotangents of f's results in, the non-zero
  // cotangents of f's parameters out (`result_of_param` says which result is whose).
  struct Program {
    std::shared_ptr<const ir::Function> backward;
    std::vector<std::optional<std::size_t>> result_of_param;
  };
  Pullback() = default;
  // Runs f's VJP rules equation by equation over the forward values `env` when called.
  Pullback(std::shared_ptr<const ir::Function> f, std::vector<Tensor> env)
      : f_(std::move(f)), env_(std::move(env)) {}
  Pullback(std::shared_ptr<const ir::Function> f, Program program)
      : f_(std::move(f)), program_(std::move(program)) {}
  // One cotangent per result (nullopt: zero) -> one cotangent per parameter.
  std::vector<Tangent> operator()(std::span<const Tangent> cotangents) const;

 private:
  std::vector<Tangent> run_rules(std::span<const Tangent> cotangents) const;

  std::shared_ptr<const ir::Function> f_;
  std::vector<Tensor> env_;
  std::optional<Program> program_;
};
struct VjpResult {
  std::vector<Tensor> outputs;
  Pullback pullback;
};
// Reverse mode: evaluates f now and returns the pullback.
VjpResult vjp(std::shared_ptr<const ir::Function> f, std::span<const Tensor> primals);
// The same for the public entry points: with no trace active, the backward program is traced
// once here and pruned, so it computes only cotangents that reach a parameter and holds only
// the forward values it reads. (Rules that call vjp inside kernels use the plain form.)
VjpResult vjp_pruned(std::shared_ptr<const ir::Function> f, std::span<const Tensor> primals);

}  // namespace ad

namespace batching {
// Evaluates a per-example function on inputs with optional batch axes.
std::vector<Batched> evaluate(const ir::Function& f, std::span<const Batched> args, int64_t size,
                              std::string_view axis_name);
// Whether the equation is a collective over `axis`, or holds one in a sub-function (a jitted
// call, a loop body, a branch) at any depth.
bool uses_axis(const ir::Equation& e, std::string_view axis);
}  // namespace batching

namespace detail {

// An axis whose examples are spread over processes (pmap, or a mesh axis of shard_map): how
// many each process holds, in axis order, and which of them this process is. `group` lists
// the processes' ranks in MPI_COMM_WORLD in axis order; empty: every process, in rank order.
struct ProcessSpan {
  std::vector<int64_t> sizes;
  int index = 0;
  std::vector<int64_t> group;
  int64_t local() const { return sizes[static_cast<std::size_t>(index)]; }
  // The axis position of this process's first example.
  int64_t offset() const;
};
// The named axes of the vmaps being traced or evaluated on this thread, innermost last.
struct AxisScope {
  std::string name;
  int64_t size = 0;                      // the whole axis: every process's examples
  std::optional<ProcessSpan> processes;  // set under pmap
};
class AxisScopeGuard {
 public:
  AxisScopeGuard(std::string name, int64_t size, std::optional<ProcessSpan> processes = {});
  ~AxisScopeGuard();
  AxisScopeGuard(const AxisScopeGuard&) = delete;
  AxisScopeGuard& operator=(const AxisScopeGuard&) = delete;
};
// The innermost axis with this name; an Error naming the axes in scope otherwise.
const AxisScope& find_axis(std::string_view op, const std::string& name);
// The axis in scope that spans processes (pmap's), if any.
const AxisScope* find_process_axis();

}  // namespace detail
}  // namespace kiln
