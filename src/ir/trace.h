// Tracing: recording primitive applications into an ir::Function instead of running them.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/ir.h"

namespace kiln::detail {

class TraceState;

// What a traced tensor points to: its trace and its value id there.
class Tracer {
 public:
  Tracer(std::shared_ptr<TraceState> trace, ir::Value value, ir::SourceLoc created_at = {})
      : trace_(std::move(trace)), value_(std::move(value)), created_at_(std::move(created_at)) {}
  const std::shared_ptr<TraceState>& trace() const { return trace_; }
  const ir::Value& value() const { return value_; }
  // True once its trace has finished: the value escaped the function that traced it.
  bool escaped() const;
  const ir::SourceLoc& created_at() const { return created_at_; }

 private:
  std::shared_ptr<TraceState> trace_;
  ir::Value value_;
  ir::SourceLoc created_at_;  // the op that made it, when known
};

// The Error for a tracer used after its trace finished, naming where it was created.
[[noreturn]] void throw_escaped(std::string_view op, const Tensor& t);

// Traces one function. While a Trace is alive it is the innermost trace of this thread and
// every bind records into it. Traces nest: values of an outer trace that the inner function
// uses become extra parameters of the inner function (closure conversion); `captures()`
// lists the outer tensors to pass for them.
class Trace {
 public:
  explicit Trace(std::string name);
  ~Trace();
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;

  // A new parameter of the function being traced, as a traced tensor.
  Tensor param(const TensorType& type, std::string name = "");
  // Ends tracing with these results; returns the function (params: declared, then captured).
  std::shared_ptr<ir::Function> finish(std::span<const Tensor> results);
  // Outer values the function captured, in the order of its extra parameters.
  const std::vector<Tensor>& captures() const;

 private:
  std::shared_ptr<TraceState> state_;
  bool finished_ = false;
};

bool trace_active();

// While alive, this thread records into no trace: bind computes. For work that must be concrete
// even when it happens inside a trace, such as constant folding while jit compiles a function
// that is first called under grad or an outer jit.
class TracingPaused {
 public:
  TracingPaused();
  ~TracingPaused();
  TracingPaused(const TracingPaused&) = delete;
  TracingPaused& operator=(const TracingPaused&) = delete;

 private:
  std::vector<TraceState*> saved_;
};
// Records prim(inputs) into the innermost trace; returns traced outputs.
std::vector<Tensor> record(const Primitive& prim, std::span<const Tensor> inputs,
                           const Attrs& attrs, const ir::SourceLoc& loc);

// Re-raises e with " (at file:line)" appended, unless it already names a location.
[[noreturn]] void rethrow_at(const Error& e, const ir::SourceLoc& loc);

}  // namespace kiln::detail
