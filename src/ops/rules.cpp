#include "ops/rules.h"

#include "kiln/ops.h"

namespace kiln::ops {

std::string types_str(std::span<const TensorType> types) {
  std::string s = "(";
  for (std::size_t i = 0; i < types.size(); ++i) s += (i ? ", " : "") + types[i].to_string();
  return s + ")";
}

void expect_dtype(std::string_view op, const TensorType& t, DTypeSet allowed,
                  std::string_view what) {
  if (!allowed.contains(t.dtype)) fail(op, "unsupported dtype: got ", t, ", expected ", what);
}

void expect_same_types(std::string_view op, std::span<const TensorType> in) {
  for (std::size_t i = 1; i < in.size(); ++i)
    if (in[i] != in[0])
      fail(op, "operands differ in dtype or shape: got ", types_str(in),
           ", expected equal dtypes and shapes (the public op promotes and broadcasts first)");
}

Tensor zeros_of(const TensorType& t) {
  return broadcast_to(full(Shape{}, 0.0, t.dtype), t.shape, Loc{});
}

KernelSignature cpu(std::initializer_list<DTypeSet> inputs) {
  return KernelSignature{.device = Device::cpu, .inputs = inputs, .variadic = false};
}
KernelSignature cpu_variadic(DTypeSet all_inputs) {
  return KernelSignature{.device = Device::cpu, .inputs = {all_inputs}, .variadic = true};
}

Tensor cast_if_needed(const Tensor& x, DType dtype, Loc loc) {
  const detail::CallSite site(loc);
  return x.dtype() == dtype ? x : astype(x, dtype, loc);
}

std::pair<Tensor, Tensor> promote_broadcast(std::string_view op, const Tensor& a, const Tensor& b,
                                            Loc loc) {
  const detail::CallSite site(loc);
  const DType dt = promote_types(a.dtype(), b.dtype());
  Tensor x = cast_if_needed(a, dt, loc), y = cast_if_needed(b, dt, loc);
  if (x.shape() != y.shape()) {
    const Shape s = broadcast_shapes(op, x.shape(), y.shape());
    x = broadcast_to(x, s, loc);
    y = broadcast_to(y, s, loc);
  }
  return {x, y};
}

std::vector<Tangent> linear_jvp(const RuleArgs& r, std::span<const Tangent> t) {
  std::vector<Tensor> ins;
  for (std::size_t i = 0; i < t.size(); ++i)
    ins.push_back(t[i] ? *t[i] : zeros_of(r.inputs[i].type()));
  const std::vector<Tensor> outs = bind(r.primitive, std::move(ins), r.attrs);
  return Ts(outs.begin(), outs.end());
}

// The transpose of slice: ct placed at start + k*step along each axis, zeros elsewhere.
Tensor unslice(const Tensor& ct, const Shape& x, const Axes& start, const Axes& step) {
  Tensor g = ct;
  for (int i = 0; i < x.rank(); ++i) {
    const auto u = static_cast<std::size_t>(i);
    const int64_t len = g.shape()[i], s = step[u];
    if (s > 1) {  // interleave s-1 zeros after each element: expand, pad, merge
      g = expand_dims(g, i + 1);
      std::vector<std::pair<int64_t, int64_t>> w(static_cast<std::size_t>(g.rank()), {0, 0});
      w[u + 1] = {0, s - 1};
      g = pad(g, w);
      std::vector<int64_t> dims = g.shape().dims();
      dims[u] = len * s;
      dims.erase(dims.begin() + i + 1);
      g = reshape(g, Shape(dims));
    }
  }
  // One pad for every axis's room before and after (none when the slice was the whole
  // tensor), then one slice off what a step's zeros added past the end.
  std::vector<std::pair<int64_t, int64_t>> w;
  std::vector<Slice> trim;
  bool pads = false, trims = false;
  for (int i = 0; i < x.rank(); ++i) {
    const auto u = static_cast<std::size_t>(i);
    w.emplace_back(start[u], std::max<int64_t>(0, x[i] - start[u] - g.shape()[i]));
    pads = pads || w.back().first != 0 || w.back().second != 0;
    trim.push_back(Slice{0, x[i], 1});
    trims = trims || g.shape()[i] + w.back().first + w.back().second > x[i];
  }
  if (pads) g = pad(g, w);
  return trims ? slice(g, trim) : g;
}

Tensor batch_first(const Tensor& t, std::optional<int> dim, int64_t size) {
  if (dim) return *dim == 0 ? t : moveaxis(t, *dim, 0);
  std::vector<int64_t> shape{size};
  shape.insert(shape.end(), t.shape().begin(), t.shape().end());
  return broadcast_to(expand_dims(t, 0), Shape(shape));  // a view: nothing is copied
}

std::vector<Batched> batch_elementwise(const BatchArgs& b) {
  // Already aligned (every input batched on the same axis): nothing to move.
  bool aligned = true;
  for (const auto& d : b.dims) aligned = aligned && d && *d == *b.dims[0];
  std::vector<Tensor> ins;
  for (std::size_t i = 0; i < b.inputs.size(); ++i)
    ins.push_back(aligned ? b.inputs[i] : batch_first(b.inputs[i], b.dims[i], b.size));
  std::vector<Batched> out;
  for (Tensor& t : bind(b.primitive, ins, b.attrs))
    out.push_back({std::move(t), aligned ? *b.dims[0] : 0});
  return out;
}

BatchRule batch_leading(std::function<Attrs(const Attrs&, const Tensor& x)> adjust) {
  return [adjust](const BatchArgs& b) -> std::vector<Batched> {
    const Tensor x = batch_first(b.inputs[0], b.dims[0], b.size);
    std::vector<Batched> out;
    for (Tensor& t : bind(b.primitive, {x}, adjust(b.attrs, x))) out.push_back({std::move(t), 0});
    return out;
  };
}

// A negative axis counts from the end, so a new leading axis leaves it as it is.
Attrs shift_ints(const Attrs& a, const char* name) {
  Attrs r = a;
  std::vector<int64_t> v = a.get_ints(name);
  for (int64_t& x : v)
    if (x >= 0) x += 1;
  r.set(name, v);
  return r;
}
Attrs shift_int(const Attrs& a, const char* name) {
  Attrs r = a;
  const int64_t x = a.get_int(name);
  r.set(name, x >= 0 ? x + 1 : x);
  return r;
}
Attrs prepend_int(const Attrs& a, const char* name, int64_t value) {
  Attrs r = a;
  std::vector<int64_t> v = a.get_ints(name);
  v.insert(v.begin(), value);
  r.set(name, v);
  return r;
}

std::vector<Batched> batch_by_loop(const BatchArgs& b) {
  std::vector<Batched> out;
  if (b.size == 0) {  // no example to run: empty outputs of an example's types
    std::vector<TensorType> example;
    for (std::size_t k = 0; k < b.inputs.size(); ++k) {
      TensorType t = b.inputs[k].type();
      if (b.dims[k]) {
        std::vector<int64_t> d(t.shape.begin(), t.shape.end());
        d.erase(d.begin() + *b.dims[k]);
        t.shape = Shape(d);
      }
      example.push_back(t);
    }
    for (const TensorType& t : b.primitive.infer(example, b.attrs)) {
      std::vector<int64_t> d{0};
      d.insert(d.end(), t.shape.begin(), t.shape.end());
      out.push_back({zeros(Shape(d), t.dtype), 0});
    }
    return out;
  }
  std::vector<std::vector<Tensor>> per_output;
  for (int64_t i = 0; i < b.size; ++i) {
    std::vector<Tensor> ins;
    for (std::size_t k = 0; k < b.inputs.size(); ++k)
      ins.push_back(b.dims[k] ? index(moveaxis(b.inputs[k], *b.dims[k], 0), i) : b.inputs[k]);
    std::vector<Tensor> outs = bind(b.primitive, ins, b.attrs);
    per_output.resize(outs.size());
    for (std::size_t k = 0; k < outs.size(); ++k) per_output[k].push_back(outs[k]);
  }
  for (auto& parts : per_output) out.push_back({stack(parts, 0), 0});
  return out;
}

}  // namespace kiln::ops
