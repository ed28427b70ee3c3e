// Random programs, the program check, the minimiser and the test backends
// (program_generator.h).
#include "program_generator.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <fstream>
#include <numeric>
#include <random>
#include <set>
#include <utility>

namespace kiln::testing {

namespace {

using Ts = std::vector<Tensor>;

const std::set<std::string>& transcendental() {
  static const std::set<std::string> s{"exp", "log",  "log1p",   "expm1", "sin", "cos",
                                       "tan", "tanh", "sigmoid", "erf",   "pow", "rsqrt"};
  return s;
}
// Primitives that add many float terms, in an order a backend may choose.
const std::set<std::string>& accumulating() {
  static const std::set<std::string> s{
      "reduce_sum",      "reduce_prod",       "matmul",     "conv",
      "conv_input_grad", "conv_weight_grad",  "avg_pool2d", "max_pool2d_grad",
      "scatter_add",     "scatter_add_along", "psum",       "psum_scatter"};
  return s;
}

// The float value next to x in dtype's format, `steps` places towards +inf (negative: -inf).
double step_ulps(double x, DType dtype, int steps) {
  if (!std::isfinite(x)) return x;
  for (int i = 0; i < std::abs(steps); ++i) {
    if (dtype == float32) {
      x = std::nextafter(static_cast<float>(x), steps > 0 ? INFINITY : -INFINITY);
    } else {
      x = std::nextafter(x, steps > 0 ? INFINITY : -INFINITY);
    }
  }
  return x;
}

Tensor with_values(const std::vector<double>& v, const TensorType& type) {
  return astype(tensor(v, type.shape), type.dtype);
}

// reduce_sum accumulated in eight lanes of the input's dtype, last element first.
Tensor lane_sum(const Tensor& x, const Attrs& attrs, const TensorType& out_type) {
  const int r = x.rank();
  std::vector<bool> reduced(static_cast<std::size_t>(r), false);
  for (int64_t a : attrs.get_ints("axes"))
    reduced[static_cast<std::size_t>(a < 0 ? a + r : a)] = true;
  Axes perm;  // kept axes first, then the reduced ones
  for (int a = 0; a < r; ++a)
    if (!reduced[static_cast<std::size_t>(a)]) perm.push_back(a);
  for (int a = 0; a < r; ++a)
    if (reduced[static_cast<std::size_t>(a)]) perm.push_back(a);
  const std::vector<double> v = values_of(transpose(x, perm));
  const int64_t outer = out_type.shape.numel();
  const int64_t inner = outer == 0 ? 0 : static_cast<int64_t>(v.size()) / outer;
  std::vector<double> out(static_cast<std::size_t>(outer));
  for (int64_t o = 0; o < outer; ++o) {
    if (x.dtype() == float32) {
      float acc[8] = {};
      for (int64_t i = inner - 1; i >= 0; --i)
        acc[i % 8] += static_cast<float>(v[static_cast<std::size_t>(o * inner + i)]);
      out[static_cast<std::size_t>(o)] =
          ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    } else {
      double acc[8] = {};
      for (int64_t i = inner - 1; i >= 0; --i)
        acc[i % 8] += v[static_cast<std::size_t>(o * inner + i)];
      out[static_cast<std::size_t>(o)] =
          ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
  }
  return with_values(out, out_type);
}

// Binds f's equations in order on args (a trace records them; concrete arguments run
// kernels), passing each one's outputs through `tamper` when given. Unlike ir::evaluate it
// takes arguments of other shapes than f's parameters, for the minimiser to re-trace f on.
Ts replay(const ir::Function& f, std::span<const Tensor> args, const Tamper* tamper) {
  if (args.size() != f.params.size())
    fail("replay", "wrong argument count: got ", args.size(), ", expected ", f.params.size());
  std::vector<Tensor> env(static_cast<std::size_t>(f.next_id()));
  for (std::size_t k = 0; k < args.size(); ++k)
    env[static_cast<std::size_t>(f.params[k].id)] = args[k];
  for (const ir::Constant& c : f.constants) env[static_cast<std::size_t>(c.value.id)] = c.tensor;
  for (const ir::Equation& e : f.equations) {
    Ts ins;
    for (const ir::Value& v : e.inputs) ins.push_back(env[static_cast<std::size_t>(v.id)]);
    Ts outs = kiln::bind(*e.prim, ins, e.attrs);
    if (tamper) outs = (*tamper)(e, ins, std::move(outs));
    for (std::size_t k = 0; k < outs.size(); ++k)
      env[static_cast<std::size_t>(e.outputs[k].id)] = outs[k];
  }
  Ts results;
  for (const ir::Value& v : f.results) results.push_back(env[static_cast<std::size_t>(v.id)]);
  return results;
}

class TamperedExecutable final : public ir::Executable {
 public:
  TamperedExecutable(std::shared_ptr<const ir::Function> f, Tamper tamper)
      : f_(std::move(f)), tamper_(std::move(tamper)) {}
  std::vector<Tensor> run(std::span<const Tensor> args) const override {
    return replay(*f_, args, &tamper_);
  }
  const ir::CompiledInfo& info() const override { return info_; }

 private:
  ir::CompiledInfo info_;
  std::shared_ptr<const ir::Function> f_;
  Tamper tamper_;
};

class DenseReader final : public ir::Executable {
 public:
  explicit DenseReader(std::shared_ptr<const ir::Executable> inner) : inner_(std::move(inner)) {}
  std::vector<Tensor> run(std::span<const Tensor> args) const override {
    Ts dense;
    for (const Tensor& t : args) {
      const auto capacity = static_cast<int64_t>(t.storage()->nbytes() / dtype_size(t.dtype()));
      if (t.is_contiguous() || t.offset() + t.numel() > capacity) {
        dense.push_back(t);
        continue;
      }
      auto impl = std::make_shared<TensorImpl>(*t.impl());
      Tensor c = empty(t.type());  // for its contiguous strides
      impl->strides = c.strides();
      dense.push_back(Tensor(std::move(impl)));
    }
    return inner_->run(dense);
  }
  const ir::CompiledInfo& info() const override { return inner_->info(); }

 private:
  std::shared_ptr<const ir::Executable> inner_;
};

}  // namespace

Factory ignoring_strides(Factory inner) {
  return [inner](std::shared_ptr<const ir::Function> f) -> std::shared_ptr<const ir::Executable> {
    return std::make_shared<DenseReader>(inner(std::move(f)));
  };
}

Factory backend(ir::Backend b) {
  return [b](std::shared_ptr<const ir::Function> f) {
    return ir::compile(std::move(f), ir::CompileOptions{.backend = b});
  };
}

Factory tampered(Tamper tamper) {
  return [tamper](std::shared_ptr<const ir::Function> f) -> std::shared_ptr<const ir::Executable> {
    return std::make_shared<TamperedExecutable>(std::move(f), tamper);
  };
}

Tamper ulps_up(std::string prim, int n) {
  return [prim, n](const ir::Equation& e, std::span<const Tensor>, Ts outs) {
    if (e.prim->name != prim) return outs;
    for (Tensor& o : outs) {
      if (o.dtype() != float32 && o.dtype() != float64) continue;
      std::vector<double> v = values_of(o);
      for (double& x : v) x = step_ulps(x, o.dtype(), n);
      o = with_values(v, o.type());
    }
    return outs;
  };
}

Tamper computed_as(std::string prim, std::string with) {
  return [prim, with](const ir::Equation& e, std::span<const Tensor> ins, Ts outs) {
    if (e.prim->name != prim) return outs;
    return kiln::bind(primitive(with), Ts(ins.begin(), ins.end()), e.attrs);
  };
}

Tamper allowed_differences(uint64_t seed) {
  return [seed](const ir::Equation& e, std::span<const Tensor> ins, Ts outs) {
    const std::string& name = e.prim->name;
    if (transcendental().count(name)) {
      for (Tensor& o : outs) {
        if (o.dtype() != float32 && o.dtype() != float64) continue;
        std::vector<double> v = values_of(o);
        for (std::size_t i = 0; i < v.size(); ++i) {
          // 0, 1 or 2 ulps towards zero, from a hash of the seed, position and value: never
          // past a bound such as tanh's 1.
          const uint64_t h = (seed ^ (i * 0x9e3779b97f4a7c15ull) ^ std::bit_cast<uint64_t>(v[i])) *
                             0xbf58476d1ce4e5b9ull;
          const int steps = static_cast<int>((h >> 33) % (kTranscendentalUlps + 1));
          for (int k = 0; k < steps && v[i] != 0; ++k) {
            const double next = step_ulps(v[i], o.dtype(), v[i] > 0 ? -1 : 1);
            v[i] = next == 0 ? std::copysign(0.0, v[i]) : next;
          }
        }
        o = with_values(v, o.type());
      }
    } else if (name == "reduce_sum" && (ins[0].dtype() == float32 || ins[0].dtype() == float64)) {
      outs[0] = lane_sum(ins[0], e.attrs, outs[0].type());
    }
    return outs;
  };
}

// ---- checking one program -----------------------------------------------------------------

std::vector<Tensor> inputs_for(const std::vector<TensorType>& types, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Tensor> out;
  for (const TensorType& t : types) {
    std::vector<double> v(static_cast<std::size_t>(t.shape.numel()));
    for (double& x : v) {
      const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
      if (is_floating(t.dtype))
        x = -2.0 + 4.0 * u;
      else if (t.dtype == bool_)
        x = u < 0.5 ? 0.0 : 1.0;
      else if (is_unsigned(t.dtype))
        x = std::floor(u * 17.0);
      else
        x = std::floor(u * 17.0) - 8.0;
    }
    out.push_back(with_values(v, t));
  }
  return out;
}

namespace {
bool inexact(const ir::Function& f) {
  for (const ir::Equation& e : f.equations) {
    for (const auto& [name, value] : e.attrs.items())
      if (const FunctionRef* g = std::get_if<FunctionRef>(&value))
        if (*g && inexact(**g)) return true;
    const bool on_floats = std::any_of(e.inputs.begin(), e.inputs.end(), [](const ir::Value& v) {
      return is_floating(v.type.dtype);
    });
    if (on_floats && (transcendental().count(e.prim->name) || accumulating().count(e.prim->name)))
      return true;
  }
  return false;
}
}  // namespace

Rule rule_of(const ir::Function& f) { return inexact(f) ? Rule::program : Rule::exact; }

DType least_precise(const ir::Function& f) {
  // Float dtypes from the least precise to the most.
  static const DType order[] = {bfloat16, float16, float32, float64};
  std::set<DType> seen;
  std::function<void(const ir::Function&)> visit = [&](const ir::Function& g) {
    for (const ir::Value& v : g.params) seen.insert(v.type.dtype);
    for (const ir::Constant& c : g.constants) seen.insert(c.value.type.dtype);
    for (const ir::Equation& e : g.equations) {
      for (const ir::Value& v : e.outputs) seen.insert(v.type.dtype);
      for (const auto& [name, value] : e.attrs.items())
        if (const FunctionRef* h = std::get_if<FunctionRef>(&value))
          if (*h) visit(**h);
    }
  };
  visit(f);
  for (DType d : order)
    if (seen.count(d)) return d;
  return float64;
}

std::optional<std::string> check_program(std::shared_ptr<const ir::Function> f,
                                         std::span<const Tensor> args, const Factory& compiled,
                                         const ToleranceFor& tolerance, const Factory& reference) {
  Ts want, got;
  std::optional<std::string> want_error, got_error;
  try {
    want = reference(f)->run(args);
  } catch (const Error& e) {
    want_error = e.what();
  }
  try {
    got = compiled(f)->run(args);
  } catch (const Error& e) {
    got_error = e.what();
  } catch (const std::exception& e) {  // anything else is a bug whatever the interpreter does
    return std::string("the backend threw something other than a kiln::Error: ") + e.what();
  }
  if (want_error || got_error) {
    if (want_error && got_error) return std::nullopt;
    return want_error ? "the interpreter raised an Error and the backend did not: " + *want_error
                      : "the backend raised an Error and the interpreter did not: " + *got_error;
  }
  if (got.size() != want.size())
    return "got " + std::to_string(got.size()) + " results, expected " +
           std::to_string(want.size());
  for (std::size_t j = 0; j < want.size(); ++j)
    if (auto m = compare(got[j], want[j], tolerance(j)))
      return "result " + std::to_string(j) + ": " + *m;
  return std::nullopt;
}

std::optional<std::string> check_program(std::shared_ptr<const ir::Function> f,
                                         std::span<const Tensor> args, const Factory& compiled,
                                         std::optional<Rule> rule) {
  const Tolerance tol{.rule = rule.value_or(rule_of(*f)), .precision = least_precise(*f)};
  return check_program(f, args, compiled, [tol](std::size_t) { return tol; });
}

// ---- random programs ----------------------------------------------------------------------

namespace {

// A value of the program being built, a bound on its magnitude (floats and integers), so
// that the builder keeps values in a range where comparisons mean something, and whether it
// is computed bit-exactly (only IEEE-exact operations on exact values). Discontinuous
// operations (floor, ceil, round, comparisons, conversions to integers, a cond's predicate)
// only see exact values: a last-bit difference allowed upstream would turn into a jump.
struct Node {
  Tensor t;
  double mag;
  bool exact;
};

constexpr int64_t kMaxElements = 4096;
constexpr double kMaxMag = 16;

class Builder {
 public:
  explicit Builder(uint64_t seed) : rng_(seed) {}

  int64_t uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  bool coin(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  uint64_t next_seed() { return rng_(); }

  Shape random_shape() {
    static const int64_t dims[] = {1, 2, 3, 4, 5, 7, 8, 16, 33, 64};
    const int64_t weights[] = {1, 3, 4, 3, 2};
    std::discrete_distribution<int> rank_dist(std::begin(weights), std::end(weights));
    const int rank = rank_dist(rng_);
    std::vector<int64_t> s;
    for (int i = 0; i < rank; ++i) s.push_back(dims[uniform(0, 9)]);
    while (numel(s) > kMaxElements) *std::max_element(s.begin(), s.end()) /= 4;
    return Shape(s);
  }
  DType random_dtype() {
    const int64_t r = uniform(0, 19);
    return r < 14 ? float32 : r < 16 ? float64 : r < 18 ? int32 : bool_;
  }

  // The program's body: `params` are its tracers. A third of the programs use IEEE-exact
  // operations only, so that they compare bit-exactly.
  Ts build(const Ts& params) {
    exact_only_ = coin(0.35);
    for (const Tensor& p : params) pool_.push_back({p, 2.0, true});
    const int64_t steps = uniform(4, 24);
    for (int64_t i = 0; i < steps; ++i) step();
    Ts results{pool_.back().t};
    if (coin(0.5))
      results.push_back(pool_[static_cast<std::size_t>(uniform(0, pool_.size() - 1))].t);
    if (coin(0.25)) {  // in-place hazards: a parameter returned next to values computed from it
      const Tensor& p = params[static_cast<std::size_t>(uniform(0, params.size() - 1))];
      results.push_back(p);
    }
    return results;
  }

 private:
  static int64_t numel(const std::vector<int64_t>& s) {
    return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>());
  }

  // A recent value of the wanted kind (biased to the newest), or nullopt.
  std::optional<std::size_t> pick(const std::function<bool(const Node&)>& want) {
    std::vector<std::size_t> ok;
    for (std::size_t i = 0; i < pool_.size(); ++i)
      if (want(pool_[i])) ok.push_back(i);
    if (ok.empty()) return std::nullopt;
    const int64_t back = std::min<int64_t>(static_cast<int64_t>(ok.size()) - 1,
                                           std::geometric_distribution<int64_t>(0.4)(rng_));
    return ok[ok.size() - 1 - static_cast<std::size_t>(back)];
  }
  static bool is_float(const Node& n) { return is_floating(n.t.dtype()); }

  // Whether b broadcasts into a's shape.
  static bool broadcasts_into(const Shape& b, const Shape& a) {
    if (b.rank() > a.rank()) return false;
    for (int i = 1; i <= b.rank(); ++i) {
      const int64_t db = b[b.rank() - i], da = a[a.rank() - i];
      if (db != da && db != 1) return false;
    }
    return true;
  }

  // A partner for a binary op with `a`: a pool value of the same kind that broadcasts into
  // a (exact if `exact`), or a max or mean of a over some leading axes (a lower-rank or
  // keepdims value), or a itself.
  Node partner(const Node& a, bool exact = false) {
    const bool fl = is_floating(a.t.dtype());
    const DType dt = a.t.dtype();
    if (coin(0.7)) {
      if (auto j = pick([&](const Node& n) {
            return (fl ? is_float(n) : n.t.dtype() == dt) && (n.exact || !exact) &&
                   broadcasts_into(n.t.shape(), a.t.shape());
          }))
        return pool_[*j];
    }
    if (a.t.rank() > 0 && dt != bool_) {
      const int64_t k = uniform(1, a.t.rank());
      Axes axes(static_cast<std::size_t>(k));
      std::iota(axes.begin(), axes.end(), 0);
      const bool keep = coin(0.5);
      if (fl && !exact && !exact_only_ && coin(0.5)) return {mean(a.t, axes, keep), a.mag, false};
      return {max(a.t, axes, keep), a.mag, a.exact};
    }
    return a;
  }

  void push(Tensor t, double mag, bool exact) {
    if (is_floating(t.dtype()) && mag > kMaxMag) {
      // Scale by a power of two (exact) back into range.
      const double k = std::ceil(std::log2(mag / 4));
      t = t * std::exp2(-k);
      mag = mag * std::exp2(-k);
    }
    pool_.push_back({std::move(t), mag, exact});
  }

  void step() {
    const int64_t r = uniform(0, 99);
    if (r < 18)
      unary();
    else if (r < 42)
      binary();
    else if (r < 54)
      reduction();
    else if (r < 68)
      layout();
    else if (r < 74)
      select();
    else if (r < 82)
      convert();
    else if (r < 87)
      matmul_step();
    else
      control_flow();
  }

  void unary() {
    auto j = pick(is_float);
    if (!j) return convert();
    const Node x = pool_[*j];
    const Tensor& t = x.t;
    const bool e = x.exact;
    const int64_t pick_op = exact_only_ ? uniform(0, 4) : uniform(0, 17);
    // Rounding jumps: only on exact values.
    if (pick_op >= 2 && pick_op <= 4 && !e) return push(-abs(t), x.mag, false);
    switch (pick_op) {
      case 0:
        return push(-t, x.mag, e);
      case 1:
        return push(abs(t), x.mag, e);
      case 2:
        return push(floor(t), x.mag + 1, e);
      case 3:
        return push(ceil(t), x.mag + 1, e);
      case 4:
        return push(round(t), x.mag + 1, e);
      case 5:
        return push(tanh(t), 1, false);
      case 6:
        return push(sigmoid(t), 1, false);
      case 7:
        return push(erf(t), 1, false);
      case 8:
        return push(sin(t), 1, false);
      case 9:
        return push(cos(t), 1, false);
      case 10:
        return push(exp(tanh(t)), 3, false);
      case 11:
        return push(log(abs(t) + 1.0), std::log1p(x.mag), false);
      case 12:
        return push(log1p(abs(t)), std::log1p(x.mag), false);
      case 13:
        return push(expm1(tanh(t)), 2, false);
      case 14:  // sqrt is steep at 0: only exact values go there
        return e ? push(sqrt(abs(t)), std::sqrt(x.mag), true)
                 : push(sqrt(abs(t) + 1.0), std::sqrt(x.mag + 1), false);
      case 15:
        return push(rsqrt(abs(t) + 1.0), 1, false);
      case 16:
        return push(tan(tanh(t)), 1.6, false);
      default: {
        const Node y = partner(x);
        return push(pow(abs(t) + 0.5, tanh(y.t)), std::max(2.0, x.mag + 0.5), false);
      }
    }
  }

  void binary() {
    auto j = pick([](const Node& n) { return n.t.dtype() != bool_; });
    if (!j) return convert();
    const Node a = pool_[*j];
    const Node b = partner(a);
    const bool swap = coin(0.3);
    const Tensor& l = swap ? b.t : a.t;
    const Tensor& rr = swap ? a.t : b.t;
    const bool fl = is_floating(a.t.dtype());
    const bool e = a.exact && b.exact;
    switch (uniform(0, fl ? 5 : 4)) {
      case 0:
        return push(l + rr, a.mag + b.mag, e);
      case 1:
        return push(l - rr, a.mag + b.mag, e);
      case 2:
        return push(l * rr, a.mag * b.mag, e);
      case 3:
        return push(maximum(l, rr), std::max(a.mag, b.mag), e);
      case 4:
        return push(minimum(l, rr), std::max(a.mag, b.mag), e);
      default:
        return push(l / (abs(rr) + 1.0), swap ? b.mag : a.mag, e);
    }
  }

  Axes random_axes(int rank) {
    Axes axes;
    for (int a = 0; a < rank; ++a)
      if (coin(0.5)) axes.push_back(a);
    if (axes.empty()) axes.push_back(uniform(0, rank - 1));
    return axes;
  }

  void reduction() {
    auto j = pick([](const Node& n) { return is_floating(n.t.dtype()) && n.t.rank() > 0; });
    if (!j) return binary();
    const Node x = pool_[*j];
    const Tensor& t = x.t;
    const Axes axes = random_axes(t.rank());
    int64_t n = 1;
    for (int64_t a : axes) n *= t.shape()[static_cast<int>(a)];
    const bool keep = coin(0.5);
    const int64_t op = exact_only_ ? uniform(2, 3) : uniform(0, 8);
    switch (op) {
      case 0:
        return push(sum(t, axes, keep), x.mag * static_cast<double>(n), false);
      case 1:
        return push(mean(t, axes, keep), x.mag, false);
      case 2:
        return push(max(t, axes, keep), x.mag, x.exact);
      case 3:
        return push(min(t, axes, keep), x.mag, x.exact);
      case 4:
        return push(prod(tanh(t), axes, keep), 1, false);
      case 5: {  // softmax over the axes
        const Tensor e = exp(t - max(t, axes, true));
        return push(e / sum(e, axes, true), 1, false);
      }
      case 6: {  // layer norm over the axes
        const Tensor d = t - mean(t, axes, true);
        return push(d * rsqrt(mean(d * d, axes, true) + 1.0), 2 * x.mag, false);
      }
      case 7: {  // logsumexp, broadcast back
        const Tensor m = max(t, axes, true);
        return push(t - (m + log(sum(exp(t - m), axes, true))),
                    2 * x.mag + std::log(static_cast<double>(n)), false);
      }
      default: {  // softmax over the axes, then a sum over the others or over all (a total)
        const Tensor e = exp(t - max(t, axes, true));
        const Tensor p = e / sum(e, axes, true) * t;
        Axes rest;
        for (int64_t a = 0; a < t.rank(); ++a)
          if (std::find(axes.begin(), axes.end(), a) == axes.end()) rest.push_back(a);
        if (rest.empty() || coin(0.3))
          return push(sum(p), x.mag * static_cast<double>(t.numel()), false);
        return push(sum(p, rest, keep),
                    x.mag * static_cast<double>(t.numel() / std::max<int64_t>(n, 1)), false);
      }
    }
  }

  void layout() {
    const Node x = pool_[*pick([](const Node& n) { return n.t.numel() > 0; })];
    const Tensor& t = x.t;
    const Shape& s = t.shape();
    const int r = t.rank();
    switch (uniform(0, 5)) {
      case 0: {  // merge two adjacent axes, split one, or flatten
        std::vector<int64_t> d(s.begin(), s.end());
        if (r >= 2 && coin(0.5)) {
          const auto a = static_cast<std::size_t>(uniform(0, r - 2));
          d[a] *= d[a + 1];
          d.erase(d.begin() + static_cast<std::ptrdiff_t>(a) + 1);
        } else if (r >= 1 && r < 4) {
          const auto a = static_cast<std::size_t>(uniform(0, r - 1));
          if (d[a] % 2 == 0) {
            d[a] /= 2;
            d.insert(d.begin() + static_cast<std::ptrdiff_t>(a) + 1, 2);
          } else {
            d.insert(d.begin() + static_cast<std::ptrdiff_t>(a), 1);
          }
        } else {
          d = {t.numel()};
        }
        return push(reshape(t, Shape(d)), x.mag, x.exact);
      }
      case 1: {
        if (r < 2) return push(reshape(t, Shape{t.numel(), 1}), x.mag, x.exact);
        Axes perm(static_cast<std::size_t>(r));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng_);
        return push(transpose(t, perm), x.mag, x.exact);
      }
      case 2:
      case 3: {
        if (r == 0) return push(broadcast_to(t, Shape{uniform(1, 5)}), x.mag, x.exact);
        std::vector<Slice> sl;
        for (int a = 0; a < r; ++a) {
          const int64_t d = s[a];
          const int64_t start = uniform(0, d - 1), stop = uniform(start + 1, d);
          sl.push_back(Slice{start, stop, uniform(1, 3)});
        }
        return push(slice(t, sl), x.mag, x.exact);
      }
      default: {  // broadcast: a new leading axis, or a size-1 axis widened
        std::vector<int64_t> d(s.begin(), s.end());
        const int64_t k = uniform(2, 4);
        auto one = std::find(d.begin(), d.end(), int64_t{1});
        if (one != d.end() && coin(0.5))
          *one = k;
        else if (r < 4)
          d.insert(d.begin(), k);
        if (numel(d) > kMaxElements) return unary();
        return push(broadcast_to(t, Shape(d)), x.mag, x.exact);
      }
    }
  }

  void select() {
    // The predicate from exact values; the values selected may be anything.
    auto j = pick([](const Node& n) { return n.t.dtype() != bool_ && n.exact; });
    if (!j) return binary();
    const Node a = pool_[*j];
    const Node b = partner(a, true);
    const Node c = partner(a);
    Tensor pred;
    switch (uniform(0, 2)) {
      case 0:
        pred = a.t > b.t;
        break;
      case 1:
        pred = a.t <= b.t;
        break;
      default:
        pred = logical_or(a.t == b.t, a.t < partner(a, true).t);
        break;
    }
    push(where(pred, c.t, a.t), std::max(a.mag, c.mag), a.exact && c.exact);
  }

  void convert() {
    const Node x = pool_[*pick([](const Node&) { return true; })];
    const Tensor& t = x.t;
    switch (t.dtype()) {
      case DType::float32:
        if (coin(0.3) || !x.exact) return push(astype(t, float64), x.mag, x.exact);
        if (coin(0.5)) return push(astype(floor(t * 4.0), int32), 4 * x.mag + 1, true);
        return push(t > 0.25, 1, true);
      case DType::float64:
        if (coin(0.5) || !x.exact) return push(astype(t, float32), x.mag, x.exact);
        return push(astype(round(t * 2.0), int32), 2 * x.mag + 1, true);
      case DType::int32:
        if (coin(0.5)) return push(astype(t, float32) * 0.25, x.mag / 4, true);
        if (coin(0.5)) return push(abs(t) * t - t, x.mag * x.mag + x.mag, true);
        return push(t > 0, 1, true);
      default: {
        if (coin(0.5)) return push(astype(t, float32), 1, true);
        const Node y = partner(x, true);
        return push(logical_xor(t, logical_not(y.t)), 1, true);
      }
    }
  }

  void matmul_step() {
    if (exact_only_) return binary();
    auto j = pick([](const Node& n) { return is_floating(n.t.dtype()) && n.t.rank() >= 2; });
    if (!j) return reduction();
    const Node a = pool_[*j];
    const Shape& s = a.t.shape();
    const int64_t m = s[s.rank() - 2], k = s[s.rank() - 1];
    // Another value [k, n] when there is one (matmul between groups), else a's transpose.
    auto b = pick([&](const Node& n) {
      return is_floating(n.t.dtype()) && n.t.rank() == 2 && n.t.shape()[0] == k;
    });
    if (b && m * pool_[*b].t.shape()[1] * (a.t.numel() / (m * k)) <= kMaxElements)
      return push(matmul(a.t, pool_[*b].t), static_cast<double>(k) * a.mag * pool_[*b].mag, false);
    if (m * m * (a.t.numel() / (m * k)) > kMaxElements) return reduction();
    return push(matmul(a.t, swapaxes(a.t, -1, -2)), static_cast<double>(k) * a.mag * a.mag, false);
  }

  // A short shape- and dtype-preserving chain of elementwise ops (control-flow bodies);
  // IEEE-exact ones only when `exact`.
  static Tensor chain(const Tensor& x, uint64_t seed, bool exact) {
    std::mt19937_64 r(seed);
    Tensor y = x;
    const int n = 1 + static_cast<int>(r() % 3);
    for (int i = 0; i < n; ++i) {
      switch (r() % (exact ? 3 : 6)) {
        case 0:
          y = y * 0.5 + 0.25;
          break;
        case 1:
          y = maximum(y, y * 0.25);
          break;
        case 2:
          y = -abs(y);
          break;
        case 3:
          y = tanh(y);
          break;
        case 4:
          y = sin(y) * 1.5;
          break;
        default:
          y = exp(tanh(y)) - 1.0;
          break;
      }
    }
    return y;
  }

  void control_flow() {
    auto j = pick(is_float);
    if (!j) return convert();
    const Node x = pool_[*j];
    const uint64_t s0 = next_seed(), s1 = next_seed();
    const bool ex = exact_only_;
    switch (uniform(0, 2)) {
      case 0: {
        // The predicate from an exact value (reduce_max rounds nothing).
        auto p = pick([](const Node& n) { return is_floating(n.t.dtype()) && n.exact; });
        if (!p) return unary();
        const Tensor pred = max(pool_[*p].t) > 0.0;
        return push(cond(
                        pred, [s0, ex](const Tensor& v) { return chain(v, s0, ex); },
                        [s1, ex](const Tensor& v) { return chain(v, s1, ex); }, x.t),
                    x.mag + 1, x.exact && ex);
      }
      case 1: {
        using Carry = std::pair<Tensor, Tensor>;
        const Tensor n = tensor(static_cast<int32_t>(uniform(0, 4)));
        const Carry out = while_loop([n](const Carry& c) { return c.first < n; },
                                     [s0, ex](const Carry& c) {
                                       const Tensor y = chain(c.second, s0, ex);
                                       return Carry{c.first + 1, ex ? y : tanh(y)};
                                     },
                                     Carry{tensor(int32_t{0}), x.t});
        return push(out.second, std::max(1.0, x.mag + 1), x.exact && ex);
      }
      default: {
        if (x.t.rank() == 0) return push(x.t * 0.5, x.mag, x.exact);
        Tensor xs = x.t;
        if (xs.shape()[0] > 8) xs = slice(xs, {Slice{0, 8, 1}});
        const bool reverse = coin(0.3);
        auto [carry, ys] = scan(
            [s0, ex](const Tensor& c, const Tensor& xt) {
              const Tensor y = chain(c, s0, ex) * 0.5 + xt;
              return std::pair<Tensor, Tensor>{ex ? maximum(minimum(y, c), y * 0.5) : tanh(y),
                                               c * xt};
            },
            index(xs, 0) * 0.5, xs, ScanOptions{.reverse = reverse, .length = std::nullopt});
        const bool e = x.exact && ex;
        if (coin(0.5)) return push(carry, 2 * x.mag + 1, e);
        return push(ys, (2 * x.mag + 1) * x.mag, e);
      }
    }
  }

  std::mt19937_64 rng_;
  std::vector<Node> pool_;
  bool exact_only_ = false;
};

}  // namespace

std::shared_ptr<const ir::Function> random_program(uint64_t seed) {
  Builder b(seed);
  std::vector<TensorType> types;
  const int64_t n = b.uniform(1, 3);
  const DType main = b.random_dtype() == float64 ? float64 : float32;
  for (int64_t i = 0; i < n; ++i) {
    const DType d = i == 0 ? main : b.random_dtype();
    types.push_back({d, b.random_shape()});
  }
  const ir::Traced t = ir::trace_function("random_" + std::to_string(seed), types,
                                          [&](const Ts& params) { return b.build(params); });
  auto f = std::make_shared<ir::Function>(ir::optimize(*t.function));
  ir::verify(*f);
  return f;
}

// ---- minimising ---------------------------------------------------------------------------

namespace {

// f with every use of value `from` (later equations and results) replaced by `to`.
ir::Function substitute(ir::Function f, const ir::Value& from, const ir::Value& to) {
  for (ir::Equation& e : f.equations)
    for (ir::Value& v : e.inputs)
      if (v.id == from.id) v = to;
  for (ir::Value& v : f.results)
    if (v.id == from.id) v = to;
  return f;
}

std::shared_ptr<const ir::Function> finish(ir::Function f) {
  auto out = std::make_shared<ir::Function>(ir::dce(f));
  ir::verify(*out);
  return out;
}

}  // namespace

std::shared_ptr<const ir::Function> minimise(
    std::shared_ptr<const ir::Function> f,
    const std::function<bool(std::shared_ptr<const ir::Function>)>& fails) {
  bool progress = true;
  while (progress) {
    progress = false;
    // Drop results, one at a time.
    for (std::size_t k = 0; f->results.size() > 1 && k < f->results.size();) {
      ir::Function g = *f;
      g.results.erase(g.results.begin() + static_cast<std::ptrdiff_t>(k));
      auto c = finish(std::move(g));
      if (fails(c)) {
        f = c;
        progress = true;
      } else {
        ++k;
      }
    }
    // Return an input of the equation that computes a result instead (any type): a chain of
    // layout ops after the culprit goes.
    for (std::size_t k = 0; k < f->results.size(); ++k) {
      for (const ir::Equation& e : f->equations) {
        if (std::none_of(e.outputs.begin(), e.outputs.end(),
                         [&](const ir::Value& v) { return v.id == f->results[k].id; }))
          continue;
        for (const ir::Value& in : e.inputs) {
          ir::Function g = *f;
          g.results[k] = in;
          auto c = finish(std::move(g));
          if (c->equations.size() < f->equations.size() && fails(c)) {
            f = c;
            progress = true;
            break;
          }
        }
        break;
      }
    }
    // Replace equations' outputs, last equation first: by an earlier value of the same type
    // (a parameter, a constant or an earlier output), else by a new parameter.
    for (std::size_t i = f->equations.size(); i-- > 0;) {
      if (i >= f->equations.size()) continue;
      bool replaced = false;
      for (const ir::Value& out : f->equations[i].outputs) {
        std::vector<ir::Value> earlier(f->params.begin(), f->params.end());
        for (const ir::Constant& c : f->constants) earlier.push_back(c.value);
        for (std::size_t e = 0; e < i; ++e)
          for (const ir::Value& v : f->equations[e].outputs) earlier.push_back(v);
        std::vector<std::shared_ptr<const ir::Function>> candidates;
        for (const ir::Value& v : earlier)
          if (v.type == out.type) candidates.push_back(finish(substitute(*f, out, v)));
        ir::Function g = *f;
        const ir::Value p{g.next_id(), out.type};
        g.params.push_back(p);
        if (!g.param_names.empty()) g.param_names.push_back("m" + std::to_string(p.id));
        candidates.push_back(finish(substitute(std::move(g), out, p)));
        for (auto& c : candidates) {
          if (c->equations.size() < f->equations.size() && fails(c)) {
            f = c;
            replaced = progress = true;
            break;
          }
        }
        if (replaced) break;
      }
      if (replaced || f->equations[i].outputs.size() < 2) continue;
      // A multi-output equation (a loop) goes only when all its outputs do.
      ir::Function g = *f;
      for (const ir::Value& out : f->equations[i].outputs) {
        const ir::Value p{g.next_id(), out.type};
        g.params.push_back(p);
        if (!g.param_names.empty()) g.param_names.push_back("m" + std::to_string(p.id));
        g = substitute(std::move(g), out, p);
      }
      auto c = finish(std::move(g));
      if (fails(c)) {
        f = c;
        progress = true;
      }
    }
    // Shapes: every parameter axis of one size halved (axes that meet in elementwise work
    // shrink together), or one axis of one parameter; the program is traced again over the
    // smaller types, and its type rules decide (a reshape or a slice with fixed sizes
    // refuses; elementwise work and reductions follow).
    std::vector<std::vector<TensorType>> smaller;
    std::set<int64_t> sizes;
    for (const ir::Value& p : f->params)
      for (int64_t d : p.type.shape) sizes.insert(d);
    for (int64_t size : sizes) {
      if (size < 2) continue;
      std::vector<TensorType> types = f->param_types();
      for (TensorType& t : types) {
        std::vector<int64_t> dims(t.shape.begin(), t.shape.end());
        for (int64_t& d : dims)
          if (d == size) d /= 2;
        t.shape = Shape(dims);
      }
      smaller.push_back(types);
    }
    for (std::size_t k = 0; k < f->params.size(); ++k) {
      for (int a = 0; a < f->params[k].type.shape.rank(); ++a) {
        std::vector<TensorType> types = f->param_types();
        std::vector<int64_t> dims(types[k].shape.begin(), types[k].shape.end());
        if (dims[static_cast<std::size_t>(a)] < 2) continue;
        dims[static_cast<std::size_t>(a)] /= 2;
        types[k].shape = Shape(dims);
        smaller.push_back(types);
      }
    }
    for (const std::vector<TensorType>& types : smaller) {
      std::shared_ptr<const ir::Function> c;
      try {
        const ir::Traced t = ir::trace_function(
            f->name, types, [&](const Ts& params) { return replay(*f, params, nullptr); },
            f->param_names);
        c = finish(ir::optimize(*t.function));
      } catch (const Error&) {
        continue;
      }
      if (fails(c)) {
        f = c;
        progress = true;
        break;
      }
    }
    // Parameters nothing uses any more.
    ir::Function g = *f;
    std::set<int> used;
    for (const ir::Equation& e : g.equations)
      for (const ir::Value& v : e.inputs) used.insert(v.id);
    for (const ir::Value& v : g.results) used.insert(v.id);
    std::vector<ir::Value> params;
    std::vector<std::string> names;
    for (std::size_t k = 0; k < g.params.size(); ++k) {
      if (!used.count(g.params[k].id)) continue;
      params.push_back(g.params[k]);
      if (k < g.param_names.size()) names.push_back(g.param_names[k]);
    }
    if (params.size() < g.params.size()) {
      g.params = params;
      g.param_names = names.size() == params.size() ? names : std::vector<std::string>{};
      auto c = finish(std::move(g));
      if (fails(c)) {
        f = c;
        progress = true;
      }
    }
  }
  return f;
}

std::function<bool(std::shared_ptr<const ir::Function>)> fails_under(Factory compiled,
                                                                     uint64_t seed) {
  return [compiled, seed](std::shared_ptr<const ir::Function> f) {
    const Ts args = inputs_for(f->param_types(), seed);
    return check_program(f, args, compiled).has_value();
  };
}

// ---- the random-program run ---------------------------------------------------------------

RandomRunReport run_random_programs(const RandomRunOptions& options) {
  RandomRunReport report;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < options.count; ++i) {
    if (options.time_budget_s > 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
            options.time_budget_s) {
      report.out_of_time = true;
      break;
    }
    const uint64_t seed = options.seed * 1000003ull + static_cast<uint64_t>(i);
    std::shared_ptr<const ir::Function> f;
    std::optional<std::string> message;
    try {
      f = random_program(seed);
      const Ts args = inputs_for(f->param_types(), seed);
      if (rule_of(*f) == Rule::exact) ++report.exact;
      message = check_program(f, args, options.compiled);
    } catch (const std::exception& e) {
      message = std::string("the program could not be built or run: ") + e.what();
    }
    ++report.checked;
    if (!message) continue;
    RandomFailure failure{seed, *message, "", {}};
    if (f && report.failures.size() < 5) {
      const auto small = minimise(f, fails_under(options.compiled, seed));
      failure.minimised = ir::print(*small);
      std::filesystem::create_directories(options.failure_dir);
      failure.file = options.failure_dir / ("random_" + std::to_string(seed) + ".kir");
      std::ofstream(failure.file) << failure.minimised;
    }
    report.failures.push_back(std::move(failure));
    if (static_cast<int64_t>(report.failures.size()) >= options.max_failures) break;
  }
  return report;
}

}  // namespace kiln::testing
