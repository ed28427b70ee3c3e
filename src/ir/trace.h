// Tracing: recording primitive applications into an ir::Function instead of running them.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/ir.h"

namespace kiln::detail {

class TraceState;

// What a traced tensor points to: its trace and its value id there.
class Tracer {
 public:
  Tracer(std::shared_ptr<TraceState> trace, ir::Value value)
      : trace_(std::move(trace)), value_(std::move(value)) {}
  const std::shared_ptr<TraceState>& trace() const { return trace_; }
  const ir::Value& value() const { return value_; }

 private:
  std::shared_ptr<TraceState> trace_;
  ir::Value value_;
};

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
// Records prim(inputs) into the innermost trace; returns traced outputs.
std::vector<Tensor> record(const Primitive& prim, std::span<const Tensor> inputs,
                           const Attrs& attrs, const ir::SourceLoc& loc);

// Re-raises e with " (at file:line)" appended, unless it already names a location.
[[noreturn]] void rethrow_at(const Error& e, const ir::SourceLoc& loc);

}  // namespace kiln::detail
