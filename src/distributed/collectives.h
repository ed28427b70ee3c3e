// Internal: the process-level collectives that the named ones (psum, all_gather, ...) become
// after their local part when their axis spans processes (docs/DESIGN.md, "pmap and the
// distributed runtime"). Each binds a primitive, so it traces, differentiates and batches.
// `axis` names the axis in messages; `span` gives each process's local example count and the
// processes the axis spans (all, or a mesh axis's group).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "kiln/impl/interpreters.h"
#include "kiln/tensor.h"

namespace kiln::distributed {

enum class Reduce { sum, max, min };

// x on every process -> the elementwise sum (max, min) over processes.
Tensor all_reduce(const Tensor& x, Reduce op, const detail::ProcessSpan& span,
                  const std::string& axis);
// [L_p, ...] on process p -> [N, ...]: every process's rows, in process order.
Tensor all_gather(const Tensor& local, const detail::ProcessSpan& span, const std::string& axis);
// [N, ...] -> [L_p, ...]: this process's rows of the sum over processes.
Tensor reduce_scatter(const Tensor& x, const detail::ProcessSpan& span, const std::string& axis);
// [N, L_p, ...] -> [L_p, N, ...]: result[i, j] = y_q[offset_p + i, j - offset_q] on process p,
// for the process q that owns example j (rows of y are sent to the processes owning them).
Tensor all_to_all(const Tensor& y, const detail::ProcessSpan& span, const std::string& axis);
// [L_p, ...] -> [L_p, ...]: example `dest` receives example `source`'s row for each pair of
// `perm` (global example indices); rows no pair reaches are zero.
Tensor permute(const Tensor& local, std::span<const std::pair<int64_t, int64_t>> perm,
               const detail::ProcessSpan& span, const std::string& axis);
// shard_map's replicas. x, the same on every process of the span, as it enters a computation
// that varies over them: the identity, whose transpose adds up the processes' cotangents
// (each holds only its own contribution to the replicated value's gradient).
Tensor broadcast_over(const Tensor& x, const detail::ProcessSpan& span, const std::string& axis);
// A result the same on every process of the span, one value held N times: the identity, whose
// transpose gives each copy 1/N of the cotangent.
Tensor replicated_over(const Tensor& x, const detail::ProcessSpan& span, const std::string& axis);

}  // namespace kiln::distributed
