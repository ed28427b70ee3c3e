// One table of sample inputs for every primitive, shared by every walk over the registry:
//
//   tests/test_ad_rules.cpp  JVP vs finite differences, VJP vs the JVP's transpose, second
//                            derivatives (the AD walk);
//   tests/test_vmap.cpp      the batching rule vs a loop over examples (the vmap walk);
//   tests/test_axis_attributes.cpp  negative vs non-negative axis attributes: values,
//                            derivatives and vmap agree (the axis walk);
//   tests/test_compiled_walk.cpp  the LLVM backend vs the interpreter, on every dtype the
//                            kernels accept, edge values, empty, 0-d and non-contiguous inputs
//                            (the compiled walk);
//   tests/test_algebra.cpp   the facts a primitive declares for the optimiser hold (the
//                            algebra walk);
//
// and any later one: a walk is one loop over
// `primitive_samples()` that draws each sample's inputs with a `Gen` and applies the sample's
// function with `apply`. Adding a primitive means adding one entry to the table in
// primitive_samples.cpp; `PrimitiveSamples.EveryPrimitiveHasTheSamplesItsWalksNeed`
// (tests/test_ad_rules.cpp) fails until it has one.
#pragma once

#include <kiln/kiln.h>

#include <cstdint>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

namespace kiln::samples {

using Ts = std::vector<Tensor>;

// FNV-1a of a sample's name: the same inputs on every platform.
uint64_t seed_of(const std::string& s);

// Deterministic random inputs from two streams: shapes (`dim`, from `shape_seed`: every
// example of a vmap batch is drawn with the same one, so examples stack) and values (one key
// per Gen, a fresh subkey per draw). All floating draws are float64.
class Gen {
 public:
  // axis_size: the size of the named axis collectives are applied over (the walk's batch).
  Gen(uint64_t shape_seed, uint64_t value_seed, int64_t axis_size = 4);

  // A random size in [lo, hi], from the shape stream.
  int64_t dim(int64_t lo = 1, int64_t hi = 4);
  int64_t axis_size() const { return axis_size_; }

  Tensor normal(const Shape& s);
  Tensor uniform(const Shape& s, double lo, double hi);
  // |x| in [lo, hi) with a random sign: away from zero (kinks, poles, ties).
  Tensor away_from_zero(const Shape& s, double lo, double hi);
  // Pairwise distinct values (gaps >= 0.2) in random order: no ties for max/min/pooling.
  Tensor distinct(const Shape& s);
  // Small integers as floats in [-2, 1]: comparisons see equal pairs.
  Tensor small_ints(const Shape& s);
  Tensor bernoulli(const Shape& s);
  Tensor indices(const Shape& s, int64_t lo, int64_t hi, DType dtype = int64);
  Tensor key();
  Tensor keys(int64_t n);

 private:
  Tensor next();
  std::mt19937_64 rng_;
  Tensor key_;
  uint32_t counter_ = 0;
  int64_t axis_size_;
};

// One input of the primitive. `wrt`: differentiated by the AD walk; fixed inputs (indices,
// predicates, trip counts) are constants there and get no tangent. Other walks use all inputs
// alike (vmap batches fixed inputs too).
struct Arg {
  Tensor value;
  bool wrt = true;
};
inline Arg fixed(Tensor t) { return Arg{std::move(t), false}; }

struct Sample {
  std::vector<Arg> args;
  Attrs attrs;
  Ts values() const;
};

// The vmap walk's reference: per-example outputs of all examples from per-example inputs.
using Reference = std::function<std::vector<Ts>(const std::vector<Ts>& examples, const Attrs&)>;

// Knobs of the AD walk.
struct AdKnobs {
  bool check = true;         // false: the sample is not for this walk (the entry says why)
  double fd_h = 1e-6;        // step of the first-order finite differences
  double fd_rtol = 1e-6;     // JVP vs finite differences, relative to max(1, |reference|)
  double dot_rtol = 1e-10;   // <ct, J t> vs <J^T ct, t>, relative to the sum of |terms|
  double hvp_rtol = 1e-5;    // Hessian-vector products vs finite differences of the gradient
  bool forward_mode = true;  // false: the primitive has no JVP by design (custom_vjp)
};

// Knobs of the vmap walk.
struct VmapKnobs {
  bool check = true;
  double rtol = 1e-12;
  Reference reference = nullptr;  // default: the sample's function applied to each example
};

// Knobs of the compiled walk.
struct CompiledKnobs {
  bool check = true;
};

struct PrimitiveSample {
  std::string prim;
  std::string label;  // tells apart several samples of one primitive ("" for the first)
  std::function<Sample(Gen&)> make;
  // Primitives a user reaches through an API (control flow, the reverse pass of a loop): a
  // small function built with that API. Walks trace it, check the trace contains `prim`, and
  // transform it as a whole. Without a body, the function is the primitive bound once.
  std::function<Ts(const Ts&)> body = nullptr;
  // Collectives: the named axis they reduce over. Inputs then carry the axis as axis 0, of
  // size Gen::axis_size(), and the function is applied per example inside a vmap of that name.
  std::string axis_name = "";
  AdKnobs ad = {};
  VmapKnobs vmap = {};
  CompiledKnobs compiled = {};
};

std::string name_of(const PrimitiveSample& s);  // "prim" or "prim_label"
void PrintTo(const PrimitiveSample& s, std::ostream* os);

const std::vector<PrimitiveSample>& primitive_samples();
// The table's complex rows (primitive_samples_complex.cpp).
void add_complex_samples(std::vector<PrimitiveSample>& table);

// Which samples a walk checks: the AD walk those of differentiable primitives, the vmap walk
// those of primitives with a batching rule, less the ones whose knobs opt out. The walks and
// the completeness check use these, so they agree.
bool ad_checks(const PrimitiveSample& s);
bool vmap_checks(const PrimitiveSample& s);
bool compiled_checks(const PrimitiveSample& s);
std::vector<PrimitiveSample> ad_samples();
std::vector<PrimitiveSample> vmap_samples();
std::vector<PrimitiveSample> compiled_samples();

// The sample's function (its body, or its primitive bound once) on concrete or traced inputs.
Ts apply(const PrimitiveSample& s, const Ts& inputs, const Attrs& attrs);
// Whether a traced function applies the sample's primitive: a body must reach it.
bool traces_primitive(const ir::Function& f, const PrimitiveSample& s);

// What the table lacks, one message each: a registered primitive with no sample, a
// differentiable primitive with none the AD walk checks, a primitive with a batching rule with
// none the vmap walk checks, a primitive with none the compiled walk checks, a sample naming no
// registered primitive. No primitive is exempt:
// those reached only through an API (while_grad, the reverse pass of while) have a `body`.
std::vector<std::string> coverage_gaps();

// Attributes with a sub-function (for higher-order primitives' samples).
inline Attrs with_fn(const char* name, FunctionRef f, Attrs a = {}) {
  a.set(name, std::move(f));
  return a;
}
// body traced over arguments of the given types.
inline FunctionRef traced(const std::string& name, const std::vector<TensorType>& types,
                          const std::function<Ts(const Ts&)>& body) {
  return ir::trace_function(name, types, body).function;
}

}  // namespace kiln::samples
