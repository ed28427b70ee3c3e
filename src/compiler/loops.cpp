#include "compiler/loops.h"

#include <algorithm>
#include <array>
#include <string>

#include "compiler/executable.h"
#include "core/interrupt.h"
#include "detail/copy.h"
#include "ops/primitives.h"

namespace kiln::compiler::loops {
namespace {

using Tensors = std::vector<Tensor>;

const Code& code_of(std::string_view op, const FunctionRef& fn) {
  const Code* code = compiled_sub_function(*fn);
  if (!code)
    fail(op, "internal error: @", fn->name,
         " has no compiled code, expected it compiled with the function that holds it");
  return *code;
}

// Checks the operands as bind does before a kernel runs (the same errors as the interpreter's
// for malformed equations), and returns the output types.
std::vector<TensorType> checked_types(const ir::Equation& e, std::span<const Tensor> ins) {
  std::vector<TensorType> types;
  types.reserve(ins.size());
  for (const Tensor& t : ins) types.push_back(t.type());
  return e.prim->infer(types, e.attrs);
}

// Points `row` at row i (along axis 0) of `stacked`: a view, no copy. The view's TensorImpl is
// reused across steps while nothing else holds it, so a step allocates nothing for it.
void point_at(Tensor& row, const Tensor& stacked, int64_t i) {
  if (!row.defined() || row.impl_ptr().use_count() != 1) {
    auto impl = std::make_shared<TensorImpl>();
    std::vector<int64_t> dims = stacked.shape().dims();
    dims.erase(dims.begin());
    impl->type = TensorType{stacked.dtype(), Shape(dims)};
    impl->storage = stacked.storage();
    impl->strides.assign(stacked.strides().begin() + 1, stacked.strides().end());
    row = Tensor(std::move(impl));
  }
  row.impl()->offset = stacked.offset() + i * stacked.strides()[0];
}

// The carry's buffers: a step reads one set and writes the other, so the buffers allocated by
// the first two steps serve every later one; a carry the body updates in place
// (Code::updates_in_place) has one buffer, a copy of the caller's made before the first step,
// which each step donates to the body as both its argument and its destination. (Without the
// copy the first step would copy twice: its kernel out of place, then its result into the
// destination.)
class CarryBuffers {
 public:
  CarryBuffers(std::string_view op, std::span<const TensorType> types, const Code& body)
      : op_(op), types_(types), in_place_(types.size(), false) {
    for (std::size_t i : body.updates_in_place())
      if (i < types.size()) in_place_[i] = true;
  }
  // The buffers step t writes (t counts from 0), given the carry it reads; at the first step
  // a carry updated in place becomes the loop's own copy.
  const Tensors& for_step(int64_t t, std::span<Tensor> carry) {
    Tensors& b = sets_[static_cast<std::size_t>(t & 1)];
    if (b.empty()) b.resize(types_.size());
    for (std::size_t i = 0; i < types_.size(); ++i) {
      if (in_place_[i] && t == 0) {
        b[i] = detail::allocate(op_, types_[i]);
        detail::copy_cast(carry[i], b[i]);
        carry[i] = b[i];
      } else if (in_place_[i]) {
        b[i] = carry[i];
      } else if (!b[i].defined()) {
        b[i] = detail::allocate(op_, types_[i]);
      }
    }
    return b;
  }

 private:
  std::string_view op_;
  std::span<const TensorType> types_;
  std::vector<bool> in_place_;
  std::array<Tensors, 2> sets_;
};

// Operands every step reads unchanged, made contiguous once (the body's code would otherwise
// copy a strided one at every step).
void contiguous_in_place(Tensors& args, std::size_t from, std::size_t to) {
  for (std::size_t i = from; i < to; ++i) args[i] = args[i].contiguous();
}

// scan {body, length, reverse, num_carry, num_xs}: (carry..., xs..., captures...) ->
// (carry..., ys...), steps in the interpreter's order (from the end with `reverse`).
Tensors run_scan(const ir::Equation& e, std::span<const Tensor> ins) {
  const std::vector<TensorType> out_t = checked_types(e, ins);
  const FunctionRef& body = e.attrs.get<FunctionRef>("body");
  const auto nc = static_cast<std::size_t>(e.attrs.get_int("num_carry"));
  const auto nx = static_cast<std::size_t>(e.attrs.get_int("num_xs"));
  const int64_t length = e.attrs.get_int("length");
  const bool reverse = e.attrs.get_bool("reverse");
  const Code& code = code_of("scan", body);
  const std::size_t ny = out_t.size() - nc;
  Tensors out(out_t.size());
  for (std::size_t k = nc; k < out.size(); ++k) out[k] = detail::allocate("scan", out_t[k]);
  Tensors args(ins.begin(), ins.end()), xs(nx), dests(out.size());
  for (std::size_t k = 0; k < nx; ++k) xs[k] = ins[nc + k].contiguous();
  contiguous_in_place(args, nc + nx, args.size());
  CarryBuffers carry("scan", std::span(out_t).first(nc), code);
  const std::unique_ptr<Calls> steps = code.calls(nc + nx);
  for (int64_t t = 0; t < length; ++t) {
    detail::check_interrupt("scan");
    const int64_t i = reverse ? length - 1 - t : t;
    for (std::size_t k = 0; k < nx; ++k) point_at(args[nc + k], xs[k], i);
    const Tensors& next = carry.for_step(t, std::span(args).first(nc));
    std::copy(next.begin(), next.end(), dests.begin());
    for (std::size_t k = 0; k < ny; ++k) point_at(dests[nc + k], out[nc + k], i);
    steps->run_into(args, dests);
    std::copy(next.begin(), next.end(), args.begin());
  }
  std::copy(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(nc), out.begin());
  return out;
}

// while {cond_fn, body_fn}: (carry..., captures...) -> carry.
Tensors run_while(const ir::Equation& e, std::span<const Tensor> ins) {
  const std::vector<TensorType> carry_t = checked_types(e, ins);
  const Code& cond = code_of("while", e.attrs.get<FunctionRef>("cond_fn"));
  const Code& body = code_of("while", e.attrs.get<FunctionRef>("body_fn"));
  const std::size_t nc = carry_t.size();
  Tensors args(ins.begin(), ins.end());
  contiguous_in_place(args, nc, args.size());
  const Tensors pred{detail::allocate("while", TensorType{bool_, Shape{}})};
  CarryBuffers carry("while", carry_t, body);
  const std::unique_ptr<Calls> tests = cond.calls(nc), steps = body.calls(nc);
  for (int64_t t = 0;; ++t) {
    detail::check_interrupt("while");
    tests->run_into(args, pred);
    if (!*static_cast<const bool*>(pred[0].raw_data())) break;
    const Tensors& next = carry.for_step(t, std::span(args).first(nc));
    steps->run_into(args, next);
    std::copy(next.begin(), next.end(), args.begin());
  }
  args.resize(nc);
  return args;
}

// cond {branch0, ..., branchN}: (index, operands...) -> the chosen branch's results, the index
// clamped to the branches.
Tensors run_cond(const ir::Equation& e, std::span<const Tensor> ins) {
  checked_types(e, ins);
  int64_t n = 0;
  while (e.attrs.has("branch" + std::to_string(n))) ++n;
  const int64_t k = std::clamp<int64_t>(ins[0].item<int32_t>(), 0, n - 1);
  return code_of("cond", e.attrs.get<FunctionRef>("branch" + std::to_string(k)))
      .run(ins.subspan(1));
}

}  // namespace

bool drives(const Primitive& p) {
  return &p == &prim::scan() || &p == &prim::while_() || &p == &prim::cond();
}

std::vector<Tensor> run(const ir::Equation& e, std::span<const Tensor> ins) {
  if (e.prim == &prim::scan()) return run_scan(e, ins);
  if (e.prim == &prim::while_()) return run_while(e, ins);
  return run_cond(e, ins);
}

}  // namespace kiln::compiler::loops
