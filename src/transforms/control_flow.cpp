// Structured control flow (docs/CONTROL_FLOW.md): the eager paths of cond / while_loop / scan,
// which under a trace record the primitives of cond.cpp, while_loop.cpp and scan.cpp, and the
// helpers those primitives share (control_flow.h).
#include "kiln/control_flow.h"

#include <algorithm>

#include "ops/primitives.h"
#include "ops/rules.h"
#include "transforms/control_flow.h"

namespace kiln::detail::cf {

// ---- the helpers of control_flow.h -------------------------------------------------------

Tensors sub(std::span<const Tensor> v, std::size_t b, std::size_t n) {
  return Tensors(v.begin() + static_cast<std::ptrdiff_t>(b),
                 v.begin() + static_cast<std::ptrdiff_t>(b + n));
}
void append(Tensors& a, std::span<const Tensor> b) { a.insert(a.end(), b.begin(), b.end()); }
Tensor or_zero(const Tangent& t, const TensorType& type) { return t ? *t : ops::zeros_of(type); }
Idx inexact(const TypeList& types, std::size_t b, std::size_t n) {
  Idx r;
  for (std::size_t i = 0; i < n; ++i)
    if (is_inexact(types[b + i].dtype)) r.push_back(i);
  return r;
}
TensorType unstacked(const TensorType& t) {
  std::vector<int64_t> d = t.shape.dims();
  d.erase(d.begin());
  return {t.dtype, Shape(d)};
}
TensorType stacked(const TensorType& t, int64_t n) {
  std::vector<int64_t> d{n};
  d.insert(d.end(), t.shape.begin(), t.shape.end());
  return {t.dtype, Shape(d)};
}

FunctionRef closed(const std::string& name, const TypeList& types,
                   const std::function<Tensors(const Tensors&)>& body) {
  ir::Traced t = ir::trace_function(name, types, body);
  if (!t.captures.empty())
    fail("control_flow", "internal error: the rule-built sub-function @", name, " captured ",
         t.captures.size(), " traced value(s), expected none");
  return t.function;
}

std::string bname(std::size_t k) { return "branch" + std::to_string(k); }
std::size_t clamp_index(const Tensor& idx, std::size_t n) {
  const int64_t i = idx.item<int32_t>();
  return static_cast<std::size_t>(std::clamp<int64_t>(i, 0, static_cast<int64_t>(n) - 1));
}

Tensors batch_apply(const ir::Function& fn, std::span<const Tensor> ins,
                    std::span<const std::optional<int>> dims, int64_t size, std::string_view axis) {
  std::vector<Batched> args;
  for (std::size_t i = 0; i < ins.size(); ++i) args.push_back({ins[i], dims[i]});
  Tensors out;
  for (const Batched& o : batching::evaluate(fn, args, size, axis))
    out.push_back(ops::batch_first(o.value, o.dim, size));
  return out;
}
Tensor mask_for(const Tensor& m, int rank) {
  std::vector<int64_t> d{m.shape()[0]};
  d.resize(static_cast<std::size_t>(std::max(rank, 1)), 1);
  return reshape(m, Shape(d));
}

std::vector<KernelRegistration> interpreter_kernels(Kernel k, bool nullary) {
  std::vector<KernelRegistration> r{{ops::cpu_variadic(DTypeSet::all()), k}};
  if (nullary)
    r.push_back({KernelSignature{.device = Device::cpu, .inputs = {}, .variadic = false}, k});
  return r;
}

Attrs scan_attrs(FunctionRef body, int64_t length, bool reverse, std::size_t nc, std::size_t nx) {
  Attrs a;
  a.set("body", std::move(body));
  a.set("length", length);
  a.set("reverse", reverse);
  a.set("num_carry", static_cast<int64_t>(nc));
  a.set("num_xs", static_cast<int64_t>(nx));
  return a;
}

// ---- the public entry points -------------------------------------------------------------

namespace {

// fn (params: explicit..., own captures...) as a function of the shared layout
// (explicit..., all captures...), where its own captures sit at [cap_at, cap_at + n_caps).
FunctionRef relayout(const FunctionRef& fn, const TypeList& all, std::size_t n_explicit,
                     std::size_t cap_at, std::size_t n_caps) {
  if (fn->params.size() == all.size() && cap_at == n_explicit) return fn;
  return closed(fn->name, all, [&](const Tensors& p) {
    Tensors args = sub(p, 0, n_explicit);
    append(args, sub(p, cap_at, n_caps));
    return ir::evaluate(*fn, args);
  });
}

std::string path_at(const std::vector<std::string>& paths, std::size_t i) {
  if (i >= paths.size() || paths[i].empty()) return "(root)";
  return paths[i];
}

// Errors for sub-functions whose results must agree in structure and leaf types.
void check_same_tree(std::string_view op, const std::string& what, const TreeDef& want_def,
                     const TypeList& want, const std::string& want_name, const TreeDef& got_def,
                     const TypeList& got, const std::string& got_name) {
  if (auto d = first_difference(want_def, got_def))
    fail(op, what, " differ in structure: ", want_name, " vs ", got_name, " at ", *d, " (got ",
         got_def.to_string(), " from ", got_name, ", expected ", want_def.to_string(), ")");
  const std::vector<std::string> paths = tree_paths(want_def);
  for (std::size_t i = 0; i < want.size() && i < got.size(); ++i)
    if (want[i] != got[i])
      fail(op, what, " differ in type at leaf ", path_at(paths, i), ": got ", got[i], " from ",
           got_name, ", expected ", want[i], " (as ", want_name, ")");
}

}  // namespace

Tensor int_scalar(int64_t v) { return full(Shape{}, static_cast<double>(v), int32); }

int64_t trip_count(int64_t lo, int64_t hi) {
  if (hi <= lo) return 0;
  int64_t n = 0;
  if (__builtin_sub_overflow(hi, lo, &n) || lo < INT32_MIN || hi - 1 > INT32_MAX)
    fail("fori_loop", "the bounds do not fit the int32 counter: got lo=", lo, ", hi=", hi,
         ", expected both within int32");
  return n;
}

Tensor predicate_index(std::string_view op, const Tensor& pred) {
  if (!pred.defined())
    fail(op, "the predicate is undefined: got a default-constructed Tensor, expected bool[]");
  if (pred.dtype() != bool_ || pred.rank() != 0)
    fail(op, "the predicate must be a bool scalar: got ", pred.type(),
         ", expected bool[] (compare, e.g. x > 0, and reduce with any/all)");
  return astype(pred, int32);
}

std::pair<Tensors, TreeDef> switch_flat(std::string_view op, const Tensor& index,
                                        const std::vector<FlatFn>& branches,
                                        const std::vector<std::string>& names,
                                        const Tensors& operands) {
  if (branches.empty()) fail(op, "no branches: got 0, expected at least one");
  if (!index.defined() || index.rank() != 0 ||
      !(is_integral(index.dtype()) || index.dtype() == bool_))
    fail(op, "the branch index must be an integer scalar: got ",
         index.defined() ? index.type() : TensorType{}, ", expected i32[]");
  const Tensor idx = astype(index, int32);
  // Every branch is traced, eagerly too, so that eager and traced code accept the same
  // programs: branches must agree in structure and types whichever one runs.
  const TypeList op_t = types_of(operands);
  std::vector<Staged> traced;
  for (std::size_t k = 0; k < branches.size(); ++k) {
    traced.push_back(
        stage(op == "cond" ? names[k] : "branch" + std::to_string(k), op_t, branches[k]));
    if (k > 0)
      check_same_tree(op, "branch results", traced[0].out_def, traced[0].function->result_types(),
                      names[0], traced[k].out_def, traced[k].function->result_types(), names[k]);
  }
  if (!ir::tracing()) {
    const std::size_t k = clamp_index(idx, branches.size());
    TreeDef def;
    Tensors out = branches[k](operands, def);
    return {std::move(out), std::move(def)};
  }
  Tensors ins{idx};
  append(ins, operands);
  TypeList all = op_t;
  std::vector<std::size_t> cap_at;
  for (const Staged& t : traced) {
    cap_at.push_back(all.size());
    append(ins, t.captures);
    for (const Tensor& c : t.captures) all.push_back(c.type());
  }
  Attrs a;
  for (std::size_t k = 0; k < branches.size(); ++k)
    a.set(bname(k),
          relayout(traced[k].function, all, op_t.size(), cap_at[k], traced[k].captures.size()));
  return {bind(prim::cond(), ins, a), traced[0].out_def};
}

namespace {
void check_carry(std::string_view op, const std::string& what, const TreeDef& want_def,
                 const TypeList& want, const TreeDef& got_def, const TypeList& got) {
  if (auto d = first_difference(want_def, got_def))
    fail(op, what, " changes the carry's structure at ", *d, ": got ", got_def.to_string(),
         ", expected ", want_def.to_string(), " (the initial carry)");
  const std::vector<std::string> paths = tree_paths(want_def);
  for (std::size_t i = 0; i < want.size() && i < got.size(); ++i)
    if (want[i] != got[i])
      fail(op, what, " changes the type of carry leaf ", path_at(paths, i), ": got ", got[i],
           ", expected ", want[i], " (the initial carry's type)");
}
void check_pred(std::string_view op, const Tensors& p) {
  if (p.size() != 1 || p[0].dtype() != bool_ || p[0].rank() != 0)
    fail(op, "cond_fn must return a bool scalar: got ", p.size() == 1 ? p[0].type() : TensorType{},
         ", expected bool[]");
}
}  // namespace

Tensors while_flat(const FlatFn& cond_fn, const FlatFn& body_fn, const Tensors& init,
                   const TreeDef& init_def) {
  const TypeList init_t = types_of(init);
  TreeDef def;
  auto trace_body = [&] {
    return stage("body_fn", init_t, [&](const Tensors& p, TreeDef& d) {
      Tensors r = body_fn(p, d);
      check_carry("while_loop", "body_fn", init_def, init_t, d, types_of(r));
      return r;
    });
  };
  if (!ir::tracing()) {
    Tensors carry = init;
    bool ran = false;
    while (true) {
      const Tensors p = cond_fn(carry, def);
      check_pred("while_loop", p);
      if (!p[0].item<bool>()) break;
      Tensors next = body_fn(carry, def);
      check_carry("while_loop", "body_fn", init_def, init_t, def, types_of(next));
      carry = std::move(next);
      ran = true;
    }
    // A body that never ran is still checked, as a traced loop checks it.
    if (!ran) trace_body();
    return carry;
  }
  const Staged c = stage("cond_fn", init_t, [&](const Tensors& p, TreeDef& d) {
    Tensors r = cond_fn(p, d);
    check_pred("while_loop", r);
    return r;
  });
  const Staged b = trace_body();
  Tensors ins = init;
  append(ins, c.captures);
  append(ins, b.captures);
  const TypeList all = types_of(ins);
  const std::size_t nc = init.size();
  Attrs a;
  a.set("cond_fn", relayout(c.function, all, nc, nc, c.captures.size()));
  a.set("body_fn", relayout(b.function, all, nc, nc + c.captures.size(), b.captures.size()));
  return bind(prim::while_(), ins, a);
}

namespace {
// ScanOptions::unroll under a trace: a scan of L / k iterations whose body applies `body` to k
// consecutive slices (xs reshaped to [L / k, k, ...]), then, for the L % k remaining steps, a
// second scan with the plain body (run first with `reverse`, which visits them first).
std::pair<Tensors, TreeDef> scan_unrolled(const FlatFn& body, const Tensors& init,
                                          const TreeDef& init_def, const Tensors& xs, int64_t L,
                                          bool reverse, int64_t k) {
  const int64_t q = L / k, r = L - q * k;
  const std::size_t nc = init.size();
  Tensors xm, xr;
  for (const Tensor& x : xs) {
    const Tensor head = r ? slice(x, {Slice{0, q * k}}) : x;
    std::vector<int64_t> dims{q, k};
    dims.insert(dims.end(), x.shape().begin() + 1, x.shape().end());
    xm.push_back(reshape(head, Shape(dims)));
    if (r) xr.push_back(slice(x, {Slice{q * k, L}}));
  }
  FlatFn body_k = [&](const Tensors& in, TreeDef& out_def) {
    Tensors carry = sub(in, 0, nc);
    std::vector<Tensors> ys;
    for (int64_t t = 0; t < k; ++t) {
      const int64_t j = reverse ? k - 1 - t : t;
      Tensors args = carry;
      for (std::size_t m = nc; m < in.size(); ++m) args.push_back(index(in[m], j));
      Tensors out = body(args, out_def);
      if (out.size() < nc || (t > 0 && out.size() - nc != ys.size()))
        return out;  // malformed: the enclosing scan_flat's checks report it
      if (t == 0) ys.assign(out.size() - nc, Tensors(static_cast<std::size_t>(k)));
      for (std::size_t m = 0; m < ys.size(); ++m) ys[m][static_cast<std::size_t>(j)] = out[nc + m];
      carry = sub(out, 0, nc);
    }
    Tensors result = carry;
    for (Tensors& y : ys) result.push_back(stack(y, 0));
    return result;
  };
  auto run_main = [&](const Tensors& c0) {
    return scan_flat(body_k, c0, init_def, xm, q, reverse, 1);
  };
  auto run_rem = [&](const Tensors& c0) {
    return scan_flat(body, c0, init_def, xr, r, reverse, 1);
  };
  std::pair<Tensors, TreeDef> m, rm;
  Tensors carry;
  if (reverse && r) {
    rm = run_rem(init);
    m = run_main(sub(rm.first, 0, nc));
    carry = sub(m.first, 0, nc);
  } else {
    m = run_main(init);
    carry = sub(m.first, 0, nc);
    if (r) {
      rm = run_rem(carry);
      carry = sub(rm.first, 0, nc);
    }
  }
  Tensors result = carry;
  for (std::size_t i = nc; i < m.first.size(); ++i) {
    const Tensor& y = m.first[i];
    std::vector<int64_t> dims{q * k};
    dims.insert(dims.end(), y.shape().begin() + 2, y.shape().end());
    Tensor ym = reshape(y, Shape(dims));
    result.push_back(r ? concatenate({ym, rm.first[i]}, 0) : ym);
  }
  return {std::move(result), std::move(m.second)};
}
}  // namespace

std::pair<Tensors, TreeDef> scan_flat(const FlatFn& body, const Tensors& init,
                                      const TreeDef& init_def, const Tensors& xs,
                                      std::optional<int64_t> length, bool reverse, int64_t unroll) {
  int64_t n = -1;
  for (std::size_t k = 0; k < xs.size(); ++k) {
    if (xs[k].rank() == 0)
      fail("scan", "xs leaf ", k, " has no leading axis to scan over: got ", xs[k].type(),
           ", expected rank >= 1");
    if (n >= 0 && xs[k].shape()[0] != n)
      fail("scan", "xs leaves differ in length: got ", xs[k].shape()[0], " for leaf ", k,
           ", expected ", n, " (the leading axis of leaf 0)");
    n = xs[k].shape()[0];
  }
  if (length && n >= 0 && *length != n)
    fail("scan", "length does not match xs: got length=", *length, ", expected ", n);
  if (!length && n < 0)
    fail("scan", "no length: got xs without leaves, expected ScanOptions{.length = n}");
  if (length && *length < 0) fail("scan", "negative length: got ", *length, ", expected >= 0");
  const int64_t L = length ? *length : n;
  if (unroll < 1) fail("scan", "unroll must be >= 1: got unroll=", unroll, " for length=", L);
  if (ir::tracing() && unroll > 1 && L > 1)
    return scan_unrolled(body, init, init_def, xs, L, reverse, std::min(unroll, L));
  const std::size_t nc = init.size();
  const TypeList init_t = types_of(init);
  TypeList x_t;
  for (const Tensor& x : xs) x_t.push_back(unstacked(x.type()));
  TreeDef def;
  auto check = [&](const Tensors& out) {
    if (def.kind != TreeDef::Kind::tuple || def.children.size() != 2)
      fail("scan", "the body must return a (carry, y) pair: got ", def.to_string());
    TypeList got = types_of(out);
    got.resize(std::min(nc, got.size()));
    check_carry("scan", "the body", init_def, init_t, def.children[0], got);
  };
  if (!ir::tracing()) {
    Tensors carry = init;
    std::vector<Tensors> ys;
    TypeList y_t;
    TreeDef y_def;
    for (int64_t t = 0; t < L; ++t) {
      const int64_t i = reverse ? L - 1 - t : t;
      Tensors args = carry;
      for (const Tensor& x : xs) args.push_back(index(x, i));
      Tensors out = body(args, def);
      check(out);
      const Tensors y = sub(out, nc, out.size() - nc);
      if (t == 0) {
        y_def = def.children[1];
        y_t = types_of(y);
        ys.assign(y.size(), Tensors(static_cast<std::size_t>(L)));
      } else {
        check_carry("scan", "the body's y", y_def, y_t, def.children[1], types_of(y));
      }
      for (std::size_t k = 0; k < y.size(); ++k) ys[k][static_cast<std::size_t>(i)] = y[k];
      carry = sub(out, 0, nc);
    }
    if (L == 0) {
      // The structure and types of y come from a trace of the body (nothing runs).
      const Staged tr = stage("body", init_t, [&](const Tensors& p, TreeDef& d) {
        Tensors args = p;
        for (const TensorType& t : x_t) args.push_back(zeros(t.shape, t.dtype));
        Tensors out = body(args, d);
        def = d;
        check(out);
        return out;
      });
      Tensors result = carry;
      const TypeList rt = tr.function->result_types();
      for (std::size_t k = nc; k < rt.size(); ++k)
        result.push_back(zeros(stacked(rt[k], 0).shape, rt[k].dtype));
      return {std::move(result), def.children.size() == 2 ? def.children[1] : TreeDef{}};
    }
    Tensors result = carry;
    for (Tensors& y : ys) result.push_back(stack(y, 0));
    return {std::move(result), std::move(y_def)};
  }
  TypeList params = init_t;
  params.insert(params.end(), x_t.begin(), x_t.end());
  const Staged tr = stage("body", params, [&](const Tensors& p, TreeDef& d) {
    Tensors out = body(p, d);
    def = d;
    check(out);
    return out;
  });
  Tensors ins = init;
  append(ins, xs);
  append(ins, tr.captures);
  return {bind(prim::scan(), ins, scan_attrs(tr.function, L, reverse, nc, xs.size())),
          def.children[1]};
}

}  // namespace kiln::detail::cf
