// The scan primitive (docs/CONTROL_FLOW.md), which scan records under a trace: its type rule,
// interpreter kernel, derivative rules, batching rule and pruning in one place.
//
//   scan {body, length, reverse, num_carry, num_xs}
//                                            (carry..., xs..., captures...) -> (carry..., ys...)
//
// The body takes the primitive's operands in order, with one slice of each xs in place of xs.
#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "ir/partial_eval.h"
#include "ops/primitives.h"
#include "ops/rules.h"
#include "transforms/control_flow.h"

namespace kiln {
namespace {

using namespace detail::cf;

// A scan without the ys nobody reads, and then without the xs and captures its body no longer
// reads; carries stay (each step reads the last). The body is pruned the same way.
ir::Equation prune_scan(const ir::Equation& e, const std::set<int>& live) {
  using ir::Equation;
  using ir::Function;
  using ir::Value;
  const auto nc = static_cast<std::size_t>(e.attrs.get_int("num_carry"));
  const auto nx = static_cast<std::size_t>(e.attrs.get_int("num_xs"));
  Function body = *e.attrs.get<FunctionRef>("body");
  Equation out = e;
  out.outputs.resize(nc);
  body.results.resize(nc);
  for (std::size_t k = nc; k < e.outputs.size(); ++k)
    if (live.count(e.outputs[k].id)) {
      out.outputs.push_back(e.outputs[k]);
      body.results.push_back(e.attrs.get<FunctionRef>("body")->results[k]);
    }
  body = ir::dce(body);
  std::set<int> read;
  for (const Equation& b : body.equations)
    for (const Value& v : b.inputs) read.insert(v.id);
  for (const Value& v : body.results) read.insert(v.id);
  const std::vector<Value> params = body.params;
  const std::vector<std::string> names = body.param_names;
  body.params.clear();
  body.param_names.clear();
  out.inputs.clear();
  std::size_t kept_xs = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (i >= nc && !read.count(params[i].id)) continue;
    body.params.push_back(params[i]);
    if (i < names.size()) body.param_names.push_back(names[i]);
    out.inputs.push_back(e.inputs[i]);
    kept_xs += i >= nc && i < nc + nx;
  }
  // Unchanged: keep the body shared (CSE compares sub-functions by identity).
  if (out.inputs.size() == e.inputs.size() && out.outputs.size() == e.outputs.size()) return e;
  out.attrs.set("body", std::make_shared<const Function>(std::move(body)));
  out.attrs.set("num_xs", static_cast<int64_t>(kept_xs));
  return out;
}

struct ScanLayout {
  std::size_t nc, nx, ncap;
  int64_t length;
  bool reverse;
};
ScanLayout scan_layout(std::size_t n_in, const Attrs& a) {
  ScanLayout l;
  l.nc = static_cast<std::size_t>(a.get_int("num_carry"));
  l.nx = static_cast<std::size_t>(a.get_int("num_xs"));
  if (l.nc + l.nx > n_in)
    fail("scan", "num_carry + num_xs exceed the operands: got ", l.nc, " + ", l.nx, " for ", n_in,
         " operands");
  l.ncap = n_in - l.nc - l.nx;
  l.length = a.get_int("length");
  if (l.length < 0) fail("scan", "negative length: got ", l.length, ", expected >= 0");
  l.reverse = a.get_bool("reverse");
  return l;
}

TypeList scan_types(ops::Types in, const Attrs& a) {
  const ScanLayout l = scan_layout(in.size(), a);
  const FunctionRef& body = a.get<FunctionRef>("body");
  const TypeList p = body->param_types();
  if (p.size() != in.size())
    fail("scan", "@", body->name, " takes ", p.size(), " parameters: got ", in.size(), " operands");
  for (std::size_t i = 0; i < in.size(); ++i) {
    const bool x = i >= l.nc && i < l.nc + l.nx;
    const TensorType want = x ? stacked(p[i], l.length) : p[i];
    if (in[i] != want)
      fail("scan", x ? "xs " : "operand ", x ? i - l.nc : i, " does not match @", body->name,
           ": got ", in[i], ", expected ", want);
  }
  const TypeList r = body->result_types();
  if (r.size() < l.nc)
    fail("scan", "@", body->name, " returns ", r.size(), " values, expected at least ", l.nc);
  TypeList out;
  for (std::size_t i = 0; i < r.size(); ++i) {
    if (i < l.nc && r[i] != in[i])
      fail("scan", "the body changes the type of carry ", i, ": got ", r[i], ", expected ", in[i]);
    out.push_back(i < l.nc ? r[i] : stacked(r[i], l.length));
  }
  return out;
}

// The interpreter: xs are sliced natively, ys stacked at the end. With `residuals`, also
// stacks each step's incoming carry (what reverse mode needs).
Tensors scan_run(const ir::Function& body, const ScanLayout& l, ops::Ins in, bool residuals) {
  Tensors carry = sub(in, 0, l.nc);
  const TypeList rt = body.result_types();
  const std::size_t ny = rt.size() - l.nc;
  const std::size_t nstack = ny + (residuals ? l.nc : 0);
  std::vector<Tensors> ys(nstack);  // sized below: with nothing stacked, length is just a count
  for (Tensors& y : ys) y.resize(static_cast<std::size_t>(l.length));
  for (int64_t t = 0; t < l.length; ++t) {
    const int64_t i = l.reverse ? l.length - 1 - t : t;
    Tensors args = carry;
    for (std::size_t k = 0; k < l.nx; ++k) args.push_back(index(in[l.nc + k], i));
    append(args, in.subspan(l.nc + l.nx));
    Tensors out = ir::evaluate(body, args);
    const auto ii = static_cast<std::size_t>(i);
    for (std::size_t k = 0; k < ny; ++k) ys[k][ii] = out[l.nc + k];
    if (residuals)
      for (std::size_t k = 0; k < l.nc; ++k) ys[ny + k][ii] = carry[k];
    carry.assign(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(l.nc));
  }
  Tensors result = carry;
  for (std::size_t k = 0; k < nstack; ++k) {
    const TensorType yt = k < ny ? rt[l.nc + k] : in[k - ny].type();
    result.push_back(l.length == 0 ? zeros(stacked(yt, 0).shape, yt.dtype) : stack(ys[k], 0));
  }
  return result;
}

// Forward mode: a scan over (carry, carry tangents) with (xs, xs tangents) whose body is the
// JVP of the body.
ops::Ts scan_jvp(const RuleArgs& r, std::span<const Tangent> t) {
  const FunctionRef body = r.attrs.get<FunctionRef>("body");
  const ScanLayout l = scan_layout(r.inputs.size(), r.attrs);
  const std::size_t n = r.inputs.size(), ny = r.outputs.size() - l.nc;
  const TypeList in_t = types_of(r.inputs), p_t = body->param_types(), r_t = body->result_types();
  const Idx fc = inexact(in_t, 0, l.nc), fx = inexact(in_t, l.nc, l.nx),
            fk = inexact(in_t, l.nc + l.nx, l.ncap), fy = inexact(r_t, l.nc, ny);
  ops::Ts result(r.outputs.size());
  if (fc.empty() && fy.empty()) return result;
  // Layout: carry, carry tangents | xs, xs tangents | captures, capture tangents.
  const std::size_t c0 = 0, ct0 = l.nc, x0 = ct0 + fc.size(), xt0 = x0 + l.nx, k0 = xt0 + fx.size(),
                    kt0 = k0 + l.ncap;
  TypeList params;
  auto add_group = [&](std::size_t b, std::size_t cnt, const Idx& f) {
    for (std::size_t i = 0; i < cnt; ++i) params.push_back(p_t[b + i]);
    for (std::size_t i : f) params.push_back(p_t[b + i]);
  };
  add_group(0, l.nc, fc);
  add_group(l.nc, l.nx, fx);
  add_group(l.nc + l.nx, l.ncap, fk);
  FunctionRef fn = closed(body->name + "_jvp", params, [&](const Tensors& p) {
    Tensors prim = sub(p, c0, l.nc);
    append(prim, sub(p, x0, l.nx));
    append(prim, sub(p, k0, l.ncap));
    ops::Ts tan(n);
    for (std::size_t j = 0; j < fc.size(); ++j) tan[fc[j]] = p[ct0 + j];
    for (std::size_t j = 0; j < fx.size(); ++j) tan[l.nc + fx[j]] = p[xt0 + j];
    for (std::size_t j = 0; j < fk.size(); ++j) tan[l.nc + l.nx + fk[j]] = p[kt0 + j];
    const ad::JvpResult res = ad::jvp(*body, prim, tan);
    Tensors out = sub(res.outputs, 0, l.nc);
    for (std::size_t i : fc) out.push_back(or_zero(res.tangents[i], r_t[i]));
    append(out, sub(res.outputs, l.nc, ny));
    for (std::size_t i : fy) out.push_back(or_zero(res.tangents[l.nc + i], r_t[l.nc + i]));
    return out;
  });
  Tensors ins = sub(r.inputs, 0, l.nc);
  for (std::size_t i : fc) ins.push_back(or_zero(t[i], in_t[i]));
  append(ins, sub(r.inputs, l.nc, l.nx));
  for (std::size_t i : fx) ins.push_back(or_zero(t[l.nc + i], in_t[l.nc + i]));
  append(ins, sub(r.inputs, l.nc + l.nx, l.ncap));
  for (std::size_t i : fk) ins.push_back(or_zero(t[l.nc + l.nx + i], in_t[l.nc + l.nx + i]));
  const Tensors outs = bind(
      r.primitive, ins, scan_attrs(fn, l.length, l.reverse, l.nc + fc.size(), l.nx + fx.size()));
  for (std::size_t j = 0; j < fc.size(); ++j) result[fc[j]] = outs[l.nc + j];
  const std::size_t yt0 = l.nc + fc.size() + ny;
  for (std::size_t j = 0; j < fy.size(); ++j) result[l.nc + fy[j]] = outs[yt0 + j];
  return result;
}

// Residuals the forward scan computes anyway, so that they are not stacked a second time:
// a residual equal to one of the body's ys is read from the stacked ys, and one equal to a
// next carry whose incoming value is stacked (rc) is carried through the backward scan.
struct ResidualReuse {
  ir::Function forward;                           // without the reused residuals among its results
  std::map<std::size_t, std::size_t> as_ys;       // residual -> ys index
  std::map<std::size_t, std::size_t> next_carry;  // residual -> position in rc
  std::map<std::size_t, std::size_t> stacked;     // residual -> position among stacked ones
};
ResidualReuse reuse_residuals(const ir::Function& fwd, std::size_t nc, std::size_t ny,
                              const Idx& rc, std::size_t num_residuals) {
  ResidualReuse r;
  const std::size_t res0 = nc + ny + rc.size();
  std::vector<ir::Value> kept(fwd.results.begin(),
                              fwd.results.begin() + static_cast<std::ptrdiff_t>(res0));
  auto position = [&](const ir::Value& v, std::size_t from, std::size_t to) {
    std::optional<std::size_t> found;
    for (std::size_t i = from; i < to && !found; ++i)
      if (fwd.results[i] == v) found = i;
    return found;
  };
  std::vector<bool> carried(nc, false);
  for (std::size_t k = 0; k < num_residuals; ++k) {
    const ir::Value& v = fwd.results[res0 + k];
    if (const auto y = position(v, nc, nc + ny)) {
      r.as_ys[k] = *y - nc;
      continue;
    }
    const auto c = std::ranges::find_if(rc, [&](std::size_t i) { return fwd.results[i] == v; });
    if (c != rc.end() && !carried[*c]) {
      carried[*c] = true;
      r.next_carry[k] = static_cast<std::size_t>(c - rc.begin());
      continue;
    }
    r.stacked[k] = kept.size() - res0;
    kept.push_back(v);
  }
  r.forward = fwd;
  r.forward.results = std::move(kept);
  r.forward = ir::dce(r.forward);
  return r;
}

// Reverse mode: the per-step backward body (the body's VJP) split by what is known before
// any cotangent exists (ir::split_known, docs/DESIGN.md "Reverse mode through scan stores
// residuals"). A forward scan runs the body and the known part, stacking the residuals (and
// the incoming carries the rest reads) as extra ys; a scan in the opposite direction runs
// the unknown part, carrying the carry's cotangent and the captures' accumulated cotangents.
// Both are scans, so this differentiates again.
ops::Ts scan_vjp(const RuleArgs& r, std::span<const Tangent> ct) {
  const FunctionRef body = r.attrs.get<FunctionRef>("body");
  const ScanLayout l = scan_layout(r.inputs.size(), r.attrs);
  const std::size_t n = r.inputs.size(), ny = r.outputs.size() - l.nc;
  const TypeList in_t = types_of(r.inputs), p_t = body->param_types(), r_t = body->result_types();
  const TypeList out_t = types_of(r.outputs);
  const Idx fc = inexact(in_t, 0, l.nc), fx = inexact(in_t, l.nc, l.nx),
            fk = inexact(in_t, l.nc + l.nx, l.ncap), fy = inexact(r_t, l.nc, ny);
  ops::Ts result(n);
  if (fc.empty() && fx.empty() && fk.empty()) return result;
  // 1. One backward step. Parameters: carry cotangents, capture cotangents (the backward
  // scan's carry); the step's carry and xs; ys cotangents; captures.
  TypeList params;
  for (std::size_t i : fc) params.push_back(in_t[i]);
  for (std::size_t i : fk) params.push_back(in_t[l.nc + l.nx + i]);
  for (std::size_t i = 0; i < l.nc; ++i) params.push_back(p_t[i]);
  for (std::size_t i = 0; i < l.nx; ++i) params.push_back(p_t[l.nc + i]);
  for (std::size_t i : fy) params.push_back(r_t[l.nc + i]);
  for (std::size_t i = 0; i < l.ncap; ++i) params.push_back(p_t[l.nc + l.nx + i]);
  const std::size_t nbc = fc.size() + fk.size(), at_x = nbc + l.nc, at_y = at_x + l.nx,
                    at_k = at_y + fy.size();
  FunctionRef step = closed(body->name + "_bwd", params, [&](const Tensors& p) {
    Tensors prim = sub(p, nbc, l.nc + l.nx);
    ops::Ts cts(l.nc + ny);
    for (std::size_t j = 0; j < fc.size(); ++j) cts[fc[j]] = p[j];
    for (std::size_t j = 0; j < fy.size(); ++j) cts[l.nc + fy[j]] = p[at_y + j];
    append(prim, sub(p, at_k, l.ncap));
    const ops::Ts g = ad::vjp(body, prim).pullback(cts);
    Tensors out;
    for (std::size_t i : fc) out.push_back(or_zero(g[i], in_t[i]));
    for (std::size_t j = 0; j < fk.size(); ++j) {
      const Tangent& gk = g[l.nc + l.nx + fk[j]];
      out.push_back(gk ? add(p[fc.size() + j], *gk) : p[fc.size() + j]);
    }
    for (std::size_t i : fx) out.push_back(or_zero(g[l.nc + i], p_t[l.nc + i]));
    return out;
  });
  // Known: the step's carry, xs slice and captures — the forward body's own parameters.
  std::vector<bool> known(params.size(), false);
  for (std::size_t i = nbc; i < at_y; ++i) known[i] = true;
  for (std::size_t i = at_k; i < params.size(); ++i) known[i] = true;
  const ir::KnownSplit split = ir::split_known(*step, known);
  const std::vector<bool> reads = ir::params_read(*split.unknown);
  auto read = [&](std::size_t from, std::size_t count) {
    Idx r;
    for (std::size_t i = 0; i < count; ++i)
      if (reads[from + i]) r.push_back(i);
    return r;
  };
  const Idx rc = read(nbc, l.nc), rx = read(at_x, l.nx), ry = read(at_y, fy.size()),
            rk = read(at_k, l.ncap);
  // 2. Forward, with the carries the backward reads and the residuals as extra ys.
  const ir::Function fwd_trace = *closed(body->name + "_fwd", p_t, [&](const Tensors& p) {
    Tensors out = ir::evaluate(*body, p);
    for (std::size_t i : rc) out.push_back(p[i]);
    append(out, ir::evaluate(*split.known, p));
    return out;
  });
  // The known part recomputes the body's forward: merge the two.
  const ir::Function merged = ir::dce(ir::cse(fwd_trace));
  const ResidualReuse reuse = reuse_residuals(merged, l.nc, ny, rc, split.num_residuals);
  FunctionRef fwd = std::make_shared<const ir::Function>(reuse.forward);
  const Tensors f = bind(r.primitive, Tensors(r.inputs.begin(), r.inputs.end()),
                         scan_attrs(fwd, l.length, l.reverse, l.nc, l.nx));
  // 3. Backward over the unknown part, taking only the parameters it reads. Carry: the
  // cotangents, then the next carries reused as residuals; xs: carries, xs, ys cotangents,
  // residuals; then captures.
  ir::Function bwd = *split.unknown;
  const std::vector<ir::Value> all = bwd.params;
  bwd.params.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(nbc));
  auto residual = [&](std::size_t k) { return all[params.size() + k]; };
  // A next carry read at step t is the incoming carry stacked for step t + 1 (t - 1 when
  // reversed): the backward scan carries it, starting from the final carry.
  const auto cot_out = static_cast<std::ptrdiff_t>(nbc);
  std::vector<ir::Value> next_carries;
  for (const auto& [k, c] : reuse.next_carry) {
    bwd.params.push_back(residual(k));
    next_carries.push_back(all[nbc + rc[c]]);
  }
  bwd.results.insert(bwd.results.begin() + cot_out, next_carries.begin(), next_carries.end());
  auto take = [&](std::size_t from, const Idx& which) {
    for (std::size_t i : which) bwd.params.push_back(all[from + i]);
  };
  take(nbc, rc);
  take(at_x, rx);
  take(at_y, ry);
  for (std::size_t k = 0; k < split.num_residuals; ++k)
    if (!reuse.next_carry.contains(k)) bwd.params.push_back(residual(k));
  take(at_k, rk);
  bwd.name = body->name + "_bwd";
  Tensors ins;
  for (std::size_t i : fc) ins.push_back(or_zero(ct[i], out_t[i]));
  for (std::size_t i : fk) ins.push_back(ops::zeros_of(in_t[l.nc + l.nx + i]));
  for (const auto& [k, c] : reuse.next_carry) ins.push_back(f[rc[c]]);
  for (std::size_t j = 0; j < rc.size(); ++j) ins.push_back(f[l.nc + ny + j]);
  for (std::size_t i : rx) ins.push_back(r.inputs[l.nc + i]);
  for (std::size_t j : ry) ins.push_back(or_zero(ct[l.nc + fy[j]], out_t[l.nc + fy[j]]));
  for (std::size_t k = 0; k < split.num_residuals; ++k) {
    if (const auto y = reuse.as_ys.find(k); y != reuse.as_ys.end())
      ins.push_back(f[l.nc + y->second]);
    else if (const auto s = reuse.stacked.find(k); s != reuse.stacked.end())
      ins.push_back(f[l.nc + ny + rc.size() + s->second]);
  }
  for (std::size_t i : rk) ins.push_back(r.inputs[l.nc + l.nx + i]);
  const std::size_t nbn = nbc + next_carries.size();
  const std::size_t nbx =
      rc.size() + rx.size() + ry.size() + split.num_residuals - reuse.next_carry.size();
  const Tensors b = bind(r.primitive, ins,
                         scan_attrs(std::make_shared<const ir::Function>(std::move(bwd)), l.length,
                                    !l.reverse, nbn, nbx));
  for (std::size_t j = 0; j < fc.size(); ++j) result[fc[j]] = b[j];
  for (std::size_t j = 0; j < fk.size(); ++j) result[l.nc + l.nx + fk[j]] = b[fc.size() + j];
  for (std::size_t j = 0; j < fx.size(); ++j) result[l.nc + fx[j]] = b[nbn + j];
  return result;
}

// vmap: carries batched in front; batched xs get the batch axis second (the scan axis stays
// first), so each step's slice has it in front; stacked ys come back batched on axis 1.
std::vector<Batched> scan_batch(const BatchArgs& b) {
  const FunctionRef body = b.attrs.get<FunctionRef>("body");
  const ScanLayout l = scan_layout(b.inputs.size(), b.attrs);
  const TypeList p_t = body->param_types();
  Tensors ins;
  std::vector<std::optional<int>> dims;
  TypeList params;
  for (std::size_t i = 0; i < b.inputs.size(); ++i) {
    if (i < l.nc) {
      ins.push_back(ops::batch_first(b.inputs[i], b.dims[i], b.size));
      dims.push_back(0);
      params.push_back(ins.back().type());
    } else if (i < l.nc + l.nx) {
      if (b.dims[i]) {
        ins.push_back(moveaxis(b.inputs[i], *b.dims[i], 1));
        dims.push_back(0);
        params.push_back(unstacked(ins.back().type()));
      } else {
        ins.push_back(b.inputs[i]);
        dims.push_back(std::nullopt);
        params.push_back(p_t[i]);
      }
    } else {
      ins.push_back(b.inputs[i]);
      dims.push_back(b.dims[i]);
      params.push_back(ins.back().type());
    }
  }
  const std::string axis(b.axis_name);
  FunctionRef fn = closed(body->name, params, [&](const Tensors& p) {
    return batch_apply(*body, p, dims, b.size, axis);
  });
  Attrs a = b.attrs;
  a.set("body", fn);
  std::vector<Batched> out;
  const Tensors outs = bind(b.primitive, ins, a);
  for (std::size_t i = 0; i < outs.size(); ++i) out.push_back({outs[i], i < l.nc ? 0 : 1});
  return out;
}

}  // namespace

const Primitive& prim::scan() {
  static const Primitive& p = detail::register_builtin(
      {.name = "scan",
       .arity = 0,
       .variadic = true,
       .type_rule = scan_types,
       .jvp = scan_jvp,
       .vjp = scan_vjp,
       .batch = scan_batch,
       .algebra = {.scans_body = true},
       .prune = prune_scan},
      interpreter_kernels(
          [](ops::Ins in, const Attrs& a) {
            return scan_run(*a.get<FunctionRef>("body"), scan_layout(in.size(), a), in, false);
          },
          true));
  return p;
}

}  // namespace kiln
