// Primitives and multiple-dispatch kernels: the public API the built-in operations use too.
//
// A primitive is registered once with its type rule; kernels are registered per
// (primitive, device, input dtypes) and the most specific match runs. `bind` applies a
// primitive: eagerly it checks types and runs a kernel, under a trace it records an equation.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/lowering.h"
#include "kiln/tensor.h"

namespace kiln {

namespace ir {
struct Function;
struct Equation;
}  // namespace ir
// A sub-function held by a higher-order primitive (call, cond, while, ...).
using FunctionRef = std::shared_ptr<const ir::Function>;

// A named attribute value. Attributes are static: part of the equation, never traced.
using AttrValue =
    std::variant<bool, int64_t, double, std::string, std::vector<int64_t>, DType, FunctionRef>;
std::string attr_to_string(const AttrValue& v);

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items);

  bool has(std::string_view name) const;
  const AttrValue& at(std::string_view name) const;  // throws Error if absent
  template <typename T>
  const T& get(std::string_view name) const {
    const AttrValue& v = at(name);
    if (const T* p = std::get_if<T>(&v)) return *p;
    fail("attrs", "attribute '", name, "' has another type: got ", attr_to_string(v));
  }
  int64_t get_int(std::string_view name) const { return get<int64_t>(name); }
  const std::vector<int64_t>& get_ints(std::string_view name) const {
    return get<std::vector<int64_t>>(name);
  }
  bool get_bool(std::string_view name) const { return get<bool>(name); }
  double get_double(std::string_view name) const { return get<double>(name); }
  DType get_dtype(std::string_view name) const { return get<DType>(name); }

  void set(std::string name, AttrValue value);
  // Sorted by name, so that printing and comparison are canonical.
  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }
  bool empty() const { return items_.empty(); }
  std::string to_string() const;  // "{axes=[0], keepdims=false}" or "" when empty
  bool operator==(const Attrs&) const = default;

 private:
  std::vector<std::pair<std::string, AttrValue>> items_;
};

// Infers output types from input types and attributes, or throws an Error that names the
// primitive, the input types and what was expected.
using TypeRule =
    std::function<std::vector<TensorType>(std::span<const TensorType> inputs, const Attrs&)>;
// Computes outputs from concrete inputs. Inputs may be any strided view; outputs are new
// tensors (or views of inputs, for view primitives) of exactly the types the rule inferred.
using Kernel = std::function<std::vector<Tensor>(std::span<const Tensor> inputs, const Attrs&)>;

// Which inputs a kernel accepts: one DTypeSet per input, or one for all when variadic.
struct KernelSignature {
  Device device = Device::cpu;
  std::vector<DTypeSet> inputs;
  bool variadic = false;
  std::string to_string() const;  // "cpu(f32|f64, f32|f64)"
};

struct KernelRegistration {
  KernelSignature signature;
  Kernel kernel;
};

// A tangent or cotangent; nullopt is a symbolic zero (nothing is materialised for it).
using Tangent = std::optional<Tensor>;

struct Primitive;

// What a derivative rule sees of one application: inputs, outputs, attributes, and the
// primitive applied (a rule that applies its own primitive again binds this one).
struct RuleArgs {
  std::span<const Tensor> inputs;
  std::span<const Tensor> outputs;
  const Attrs& attrs;
  const Primitive& primitive;
};
// Forward mode: output tangents from input tangents (at least one is non-zero).
using JvpRule = std::function<std::vector<Tangent>(const RuleArgs&, std::span<const Tangent>)>;
// Reverse mode: input cotangents from output cotangents (at least one is non-zero).
// Rules are written with public ops, so they trace and can be differentiated again.
using VjpRule = std::function<std::vector<Tangent>(const RuleArgs&, std::span<const Tangent>)>;

// Everything the system knows of one operation. Built-in primitives are defined in one place
// each (src/ops/…): name, arity, type rule and kernels together.
// Batching (vmap): inputs carry an optional batch axis each (nullopt: the same for every
// example); a rule returns outputs with theirs. `size` is the batch size.
struct BatchArgs {
  std::span<const Tensor> inputs;
  std::span<const std::optional<int>> dims;
  const Attrs& attrs;
  int64_t size;
  std::string_view axis_name;  // of the vmap being applied; empty when unnamed
  const Primitive& primitive;  // the primitive being batched
};
struct Batched {
  Tensor value;
  std::optional<int> dim;
};
using BatchRule = std::function<std::vector<Batched>(const BatchArgs&)>;

// Facts the IR optimiser rewrites by (ir::simplify, ir::fold_constants), declared with the
// primitive so that the passes name none. Each is exact in IEEE arithmetic, signed zeros
// included.
struct Algebra {
  // op(x, c) == x for a constant c filled with this value: mul and div 1, add -0, sub +0 (a
  // zero's sign matters for floats only).
  std::optional<double> right_identity;
  // op(c, x) == x: mul 1, add -0.
  std::optional<double> left_identity;
  // op(x, 0) == op(0, x) == 0 for integers and bools, not floats (inf * 0 is NaN): mul.
  bool integer_zero_absorbs = false;
  // op(op(x)) == x: neg.
  bool involution = false;
  // A view determined by its output type: op(op(x)) == op(x), op(x) == x when the types
  // agree, and a constant-filled input gives a constant-filled output (reshape, broadcast_to).
  bool reshapes = false;
  // The attribute of this name permutes the input's axes: op(op(x, p), q) == op(x, p o q) and
  // op(x, identity) == x (transpose's "perm").
  std::string_view permutation_attr;
  // (A B)^T == B^T A^T over the last two axes (matmul).
  bool transposes_as_product = false;
  // Folding constant inputs would only make a larger constant (broadcast_to).
  bool expands = false;
  // Input 0 is an index choosing the sub-function "branch<k>" that the other inputs are given
  // to (cond): with a constant index, the equation is that branch.
  bool selects_branch = false;
  // The sub-function "body" runs once per step on the carry (the first "num_carry" operands,
  // then the carry results of the step before) and the other operands, and the outputs are the
  // last carry, then the body's other results stacked over the steps (scan): equations with
  // the same operands and attributes whose bodies compute the same carry are one equation.
  bool scans_body = false;
  // op(a, b) == op(b, a) bit for bit (add, mul, eq, ...; not max and min, whose choice between
  // +0 and -0 depends on the order): common-subexpression elimination merges both orders.
  bool commutative = false;
  // Moves or repeats elements without arithmetic (reshape, transpose, slice, ...): reverse
  // mode's partial evaluation recomputes it instead of storing its result.
  bool rearranges = false;
  // Arithmetic without transcendental functions (add, mul, select, ...): recomputed instead
  // of stored when at most one of its inputs varies per step.
  bool cheap_arithmetic = false;
  // The outputs are the sub-function in the first of these attributes that the equation has,
  // applied to its inputs; its other sub-functions are rules that only transformations read
  // (checkpoint and custom_jvp: "fn"; custom_vjp: "fwd" in its residual form, else "fn").
  // Compiled code runs that body inline (ir::inline_calls).
  std::vector<std::string_view> computes;
  // op(a, b) == a + b (add): fold_pad_sums regroups sums of these.
  bool adds = false;
  // Input 0 placed at offsets "low" in an output grown by "low" and "high" along each axis,
  // the rest filled with the constant "value" (pad).
  bool pads = false;
};

struct Primitive {
  std::string name;
  // Number of inputs; a variadic primitive (concatenate) takes `arity` or more.
  int arity = 1;
  bool variadic = false;
  TypeRule type_rule;
  // Derivatives (docs/DESIGN.md, "Automatic differentiation"). A primitive whose outputs
  // do not depend differentiably on its inputs (comparisons, integer ops, random bits)
  // sets differentiable = false and has no rules: its derivatives are zero.
  bool differentiable = true;
  JvpRule jvp;
  VjpRule vjp;
  // Batching rule (docs/DESIGN.md, "vmap"). Inputs that are all unbatched never reach it.
  BatchRule batch;
  // False for primitives whose kernels talk to other processes (the process-level
  // collectives): the optimiser must not run them at compile time.
  bool foldable = true;
  Algebra algebra;
  // How compiled code computes it in a fused loop (kiln/lowering.h); without one, compiled code
  // runs its kernel.
  std::optional<::kiln::lowering::Lowering> lowering;
  // A kernel that writes the result over input `input` instead of into new memory, for
  // compiled code that owns that input and reads it nowhere later (a key/value cache or a
  // buffer filled a position at a time inside a loop, which would otherwise be copied whole at
  // every step). `write` gets the inputs and `target`, a contiguous tensor of the output's
  // type that holds input `input`'s values and is that input (the same memory, so `write`
  // must not read it where it has written), and leaves the result in it: the same bits as the
  // kernels give. Compiled code uses it only while the primitive has its built-in kernels.
  struct InPlace {
    int input = 0;
    std::function<void(std::span<const Tensor> inputs, const Tensor& target, const Attrs& attrs)>
        write;
  };
  std::optional<InPlace> in_place;
  // Kernels that read and write images [N, C, H, W] stored channel-blocked: as [N, C/b, H, W,
  // b], b channels innermost (oneDNN's nChw16c and nChw8c), the layout compiled code keeps
  // between convolutions and what runs around them (docs/DESIGN.md, "Channel-blocked
  // values"). Compiled code uses it only while the primitive has its built-in kernels.
  struct ChannelBlocked {
    // Which operands are blocked in one call: inputs by index, and output 0.
    struct Call {
      int64_t block = 0;
      std::vector<int> inputs;
      bool output = false;
    };
    std::vector<int> inputs;  // the inputs that may come blocked
    bool output = false;      // whether output 0 may be written blocked
    // Whether its kernels compute in channel blocks anyway (oneDNN's convolutions), so that
    // plain operands cost it a reordering copy: what makes blocking the values around it pay.
    bool computes_blocked = false;
    // Whether it takes these operand types and attributes with channel blocks of `block`.
    std::function<bool(std::span<const TensorType> inputs, const Attrs& attrs, int64_t block)>
        applies;
    // Writes output 0 into `out`, a contiguous tensor of its type, with the operands laid out
    // as `call` says: the same bits as the kernels give.
    std::function<void(std::span<const Tensor> inputs, const Call& call, const Tensor& out,
                       const Attrs& attrs)>
        write;
  };
  std::optional<ChannelBlocked> channel_blocked;
  // The arithmetic of one application, for profiles (kiln/profile.h): 2 per multiply-add, from
  // the operand and result types. Set by primitives bound by arithmetic rather than memory
  // (matmul, the convolutions); without one a profile shows bytes only.
  std::function<double(std::span<const TensorType> inputs, std::span<const TensorType> outputs,
                       const Attrs& attrs)>
      flops;
  // Dead-code elimination of some outputs (ir::dce): the equation without the outputs not in
  // `live` (value ids) that it can drop, when it can drop any (scan: unread ys).
  std::function<ir::Equation(const ir::Equation&, const std::set<int>& live)> prune;
  // Checks the input count, applies type_rule, then checks every output shape (Shape::check)
  // under the primitive's name.
  std::vector<TensorType> infer(std::span<const TensorType> inputs, const Attrs& attrs) const;
  int id = -1;  // index in the registry, set by register_primitive
  // Where the primitive was registered (for a table-driven built-in family, its table entry),
  // set by register_primitive from its `loc`. The errors for a missing JVP, VJP or batching
  // rule name it.
  Loc defined_at = {};
  // " (defined at file:line)" for messages, a built-in's file relative to Kiln's source tree
  // (src/ops/unary.cpp); "" when unknown.
  std::string where_defined() const;
};

// Registers a primitive and its first kernels; names are unique, and every built-in primitive
// is registered first. `loc` (the caller's line) becomes Primitive::defined_at. The returned
// reference stays valid for the life of the program.
const Primitive& register_primitive(Primitive primitive,
                                    std::vector<KernelRegistration> kernels = {},
                                    Loc loc = Loc::current());
// Looks a primitive up by name; throws Error listing nothing-found.
const Primitive& primitive(std::string_view name);
const Primitive* find_primitive(std::string_view name);
// Every registered primitive, built-ins included, in the order of their ids.
std::vector<const Primitive*> all_primitives();

// Registers a kernel. Among the registrations that accept the inputs' dtypes, the one with
// the fewest accepted dtypes per input wins; a later registration wins a tie, so users can
// override built-in kernels.
void register_kernel(const Primitive& primitive, KernelSignature signature, Kernel kernel);
// The kernel that would run for these inputs, or an Error listing the registered signatures.
const Kernel& select_kernel(const Primitive& primitive, Device device,
                            std::span<const DType> input_dtypes);
std::vector<KernelSignature> kernel_signatures(const Primitive& primitive);

// Applies a primitive: records into the active trace, or checks types and runs a kernel.
// A function object rather than a function, so that argument-dependent lookup never picks
// std::bind for a call like bind(prim, std::vector<Tensor>{...}, attrs).
struct BindFn {
  std::vector<Tensor> operator()(const Primitive& primitive, std::vector<Tensor> inputs,
                                 const Attrs& attrs = {}, Loc loc = Loc::current()) const;
};
inline constexpr BindFn bind{};
Tensor bind1(const Primitive& primitive, std::vector<Tensor> inputs, const Attrs& attrs = {},
             Loc loc = Loc::current());

}  // namespace kiln
