#include "ops/conv_dnnl.h"

#include <cstdlib>
#include <dnnl.hpp>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "detail/operand_cache.h"
#include "detail/parallel.h"
#include "kiln/tensor.h"
#include "ops/dnnl_common.h"

namespace kiln::ops {
namespace {

using dnnl::memory;
using Dims = memory::dims;

// oneDNN picks its own (blocked) layouts; the plain NCHW/OIHW buffers are reordered into
// and out of them around each call, as PyTorch does. Primitive creation JIT-compiles code,
// so the primitives are cached per pass and geometry.
struct Plan {
  memory::desc a, b, out;                 // the caller's plain layouts
  memory::desc a_used, b_used, out_used;  // the primitive's
  dnnl::primitive prim;
  int a_arg, b_arg, out_arg;
  // The primitive's scratchpad, which each call passes (user mode), so that calls from several
  // threads may run one primitive at once and large scratchpads come from Kiln's block cache.
  memory::desc scratch;
  // The reorders between the two where they differ, made once with the plan: creating one
  // per call (a primitive-cache lookup at best) cost about as much as running it.
  std::optional<dnnl::reorder> a_in, b_in, out_back;
};

std::optional<dnnl::reorder> reorder_between(const memory::desc& from, const memory::desc& to) {
  if (from == to) return std::nullopt;
  return dnnl::reorder(dnnl::reorder::primitive_desc(dnnl_engine(), from, dnnl_engine(), to));
}

// The spatial tail (the last `rank` entries) of s, offset by `delta`.
Dims tail(const ConvGeom& g, const Spatial& s, int64_t delta = 0) {
  Dims d;
  for (int i = 3 - g.rank; i < 3; ++i) d.push_back(s[static_cast<std::size_t>(i)] + delta);
  return d;
}
Dims cat(Dims head, const Dims& rest) {
  head.insert(head.end(), rest.begin(), rest.end());
  return head;
}

using tag = memory::format_tag;
constexpr auto f32 = memory::data_type::f32;

// An image operand as the caller lays it out: plain, or 2-d in channel blocks of 8 or 16.
std::optional<memory::desc> image(const Dims& dims, tag plain, std::optional<int64_t> block) {
  if (!block) return memory::desc(dims, f32, plain);
  if (dims.size() != 4 || (*block != 8 && *block != 16)) return std::nullopt;
  return memory::desc(dims, f32, *block == 16 ? tag::nChw16c : tag::nChw8c);
}

std::unique_ptr<Plan> make_plan(ConvPass pass, const ConvGeom& g, const ConvBlocks& blocks) {
  const Dims x_dims = cat({g.N, g.C}, tail(g, g.in)), y_dims = cat({g.N, g.O}, tail(g, g.out));
  const Dims w_dims =
      g.G == 1 ? cat({g.O, g.C}, tail(g, g.k)) : cat({g.G, g.O / g.G, g.C / g.G}, tail(g, g.k));
  const std::size_t r = static_cast<std::size_t>(g.rank - 1);
  const tag data_tag = std::array{tag::ncw, tag::nchw, tag::ncdhw}[r];
  const tag w_tag = g.G == 1 ? std::array{tag::oiw, tag::oihw, tag::oidhw}[r]
                             : std::array{tag::goiw, tag::goihw, tag::goidhw}[r];
  // Which of a, b and out are x, y: the forward reads x and writes y, the data gradient reads
  // dy (y's layout) and writes dx, the weight gradient reads dy and x.
  const std::optional<int64_t> x_block = pass == ConvPass::forward         ? blocks.a
                                         : pass == ConvPass::backward_data ? blocks.out
                                                                           : blocks.b;
  const std::optional<int64_t> y_block = pass == ConvPass::forward ? blocks.out : blocks.a;
  const std::optional<memory::desc> x_user = image(x_dims, data_tag, x_block),
                                    y_user = image(y_dims, data_tag, y_block);
  if (!x_user || !y_user) return nullptr;
  const memory::desc &x_plain = *x_user, &y_plain = *y_user, w_plain(w_dims, f32, w_tag);
  const memory::desc x_any(x_dims, f32, tag::any), y_any(y_dims, f32, tag::any),
      w_any(w_dims, f32, tag::any);
  // The far-side padding that reproduces the output size (floor division may drop rows).
  Spatial far{};
  for (std::size_t i = 0; i < 3; ++i) {
    far[i] = (g.out[i] - 1) * g.stride[i] + (g.k[i] - 1) * g.dil[i] + 1 - g.in[i] - g.pad[i];
    if (far[i] < 0) return nullptr;
  }
  const Dims strides = tail(g, g.stride), dilates = tail(g, g.dil, -1), pad_l = tail(g, g.pad),
             pad_r = tail(g, far);
  const auto alg = dnnl::algorithm::convolution_direct;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::convolution_forward::primitive_desc fwd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, x_any, w_any, y_any,
                                      strides, dilates, pad_l, pad_r),
      attr, dnnl_engine());
  auto plan = std::make_unique<Plan>();
  switch (pass) {
    case ConvPass::forward:
      *plan = {x_plain,
               w_plain,
               y_plain,
               fwd.src_desc(),
               fwd.weights_desc(),
               fwd.dst_desc(),
               dnnl::convolution_forward(fwd),
               DNNL_ARG_SRC,
               DNNL_ARG_WEIGHTS,
               DNNL_ARG_DST};
      plan->scratch = fwd.scratchpad_desc();
      break;
    case ConvPass::backward_data: {
      const dnnl::convolution_backward_data::primitive_desc pd(
          dnnl::convolution_backward_data::desc(alg, x_any, w_any, y_any, strides, dilates, pad_l,
                                                pad_r),
          attr, dnnl_engine(), fwd);
      *plan = {y_plain,
               w_plain,
               x_plain,
               pd.diff_dst_desc(),
               pd.weights_desc(),
               pd.diff_src_desc(),
               dnnl::convolution_backward_data(pd),
               DNNL_ARG_DIFF_DST,
               DNNL_ARG_WEIGHTS,
               DNNL_ARG_DIFF_SRC};
      plan->scratch = pd.scratchpad_desc();
      break;
    }
    case ConvPass::backward_weights: {
      const dnnl::convolution_backward_weights::primitive_desc pd(
          dnnl::convolution_backward_weights::desc(alg, x_any, w_any, y_any, strides, dilates,
                                                   pad_l, pad_r),
          attr, dnnl_engine(), fwd);
      *plan = {y_plain,
               x_plain,
               w_plain,
               pd.diff_dst_desc(),
               pd.src_desc(),
               pd.diff_weights_desc(),
               dnnl::convolution_backward_weights(pd),
               DNNL_ARG_DIFF_DST,
               DNNL_ARG_SRC,
               DNNL_ARG_DIFF_WEIGHTS};
      plan->scratch = pd.scratchpad_desc();
      break;
    }
  }
  plan->a_in = reorder_between(plan->a, plan->a_used);
  plan->b_in = reorder_between(plan->b, plan->b_used);
  plan->out_back = reorder_between(plan->out_used, plan->out);
  return plan;
}

// What tells one blocked layout from another (oneDNN compares descriptors field by field); empty
// for a descriptor of another kind, whose reorders are not shared.
std::vector<int64_t> layout_key(const memory::desc& d) {
  const dnnl_memory_desc_t& m = d.data;
  if (m.format_kind != dnnl_blocked || m.extra.flags != 0) return {};
  const dnnl_blocking_desc_t& b = m.format_desc.blocking;
  std::vector<int64_t> key{m.ndims, m.data_type, m.offset0, b.inner_nblks};
  for (int i = 0; i < m.ndims; ++i)
    key.insert(key.end(), {m.dims[i], m.padded_dims[i], m.padded_offsets[i], b.strides[i]});
  for (int i = 0; i < b.inner_nblks; ++i) key.insert(key.end(), {b.inner_blks[i], b.inner_idxs[i]});
  return key;
}

// Pass, threads, the operands' channel blocks (0: plain), then every size of the geometry.
using Key = std::vector<int64_t>;

// The cached plan, or nullptr when oneDNN rejects the geometry (Kiln's own kernel runs it).
std::shared_ptr<const Plan> plan_for(ConvPass pass, const ConvGeom& g, int threads,
                                     const ConvBlocks& blocks) {
  static PlanCache<Key, Plan> plans;
  Key key{static_cast<int64_t>(pass),
          threads,
          blocks.a.value_or(0),
          blocks.b.value_or(0),
          blocks.out.value_or(0),
          g.rank,
          g.N,
          g.C,
          g.O,
          g.G};
  for (const Spatial* s : {&g.in, &g.k, &g.stride, &g.pad, &g.dil})
    key.insert(key.end(), s->begin(), s->end());
  return plans.get(key, [&] { return make_plan(pass, g, blocks); });
}

bool takes(const ConvGeom& g) { return g.N != 0 && g.C != 0 && g.O != 0 && g.out_size() != 0; }

}  // namespace

bool dnnl_conv_takes(ConvPass pass, const ConvGeom& g) {
  return takes(g) && plan_for(pass, g, detail::set_library_threads(), {}) != nullptr;
}

std::optional<int64_t> dnnl_channel_block() {
  static const std::optional<int64_t> block = []() -> std::optional<int64_t> {
    if (const char* v = std::getenv("KILN_CHANNEL_BLOCKS"); v && std::string_view(v) == "0")
      return std::nullopt;
    // What the forward pass of a typical inner layer (64 channels in and out, 3x3) picks; none
    // where oneDNN declines it.
    const Dims x{1, 64, 14, 14}, w{64, 64, 3, 3};
    try {
      const dnnl::convolution_forward::primitive_desc pd(
          dnnl::convolution_forward::desc(
              dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
              memory::desc(x, f32, tag::any), memory::desc(w, f32, tag::any),
              memory::desc(x, f32, tag::any), {1, 1}, {0, 0}, {1, 1}, {1, 1}),
          dnnl_engine());
      for (const int64_t b : {16, 8})
        if (pd.dst_desc() == *image(x, tag::nchw, b)) return b;
    } catch (const dnnl::error&) {
    }
    return std::nullopt;
  }();
  return block;
}

bool dnnl_conv(ConvPass pass, const ConvGeom& g, const Tensor& a, const Tensor& b, float* out,
               const ConvBlocks& blocks) {
  if (!takes(g)) return false;
  // oneDNN takes its thread count from the calling thread's OpenMP setting.
  const int threads = detail::set_library_threads();
  const std::shared_ptr<const Plan> plan = plan_for(pass, g, threads, blocks);
  if (plan == nullptr) return false;
  const dnnl::engine& eng = dnnl_engine();
  dnnl::stream stream(eng);
  const memory out_user(plan->out, eng, out);
  // The blocked buffers and the scratchpad come from Kiln's block cache rather than oneDNN's
  // malloc: a fresh buffer costs a page fault per 4 KiB page on first touch, and these were
  // fresh every call (a tenth of the demo CNN's training time went to faulting them in).
  std::vector<Tensor> blocked;
  auto buffer = [&](const memory::desc& d) {
    const auto floats = static_cast<int64_t>((d.get_size() + sizeof(float) - 1) / sizeof(float));
    blocked.push_back(empty({floats}, float32));
    return memory(d, eng, blocked.back().data<float>());
  };
  // An operand in the primitive's layout: the caller's buffer, or a reorder of it, which the
  // passes of one compiled call share (the gradients read dy, the forward and dw read x).
  auto into = [&](const Tensor& user, const memory::desc& user_desc,
                  const std::optional<dnnl::reorder>& reorder, const memory::desc& used) {
    const memory from(user_desc, eng, const_cast<float*>(user.data<const float>()));
    if (!reorder) return from;
    auto reordered = [&] {
      memory m = buffer(used);
      reorder->execute(stream, const_cast<memory&>(from), m);
      return blocked.back();
    };
    std::vector<int64_t> key = layout_key(used);
    const Tensor copy =
        key.empty() ? reordered() : detail::cached_copy(user, std::move(key), reordered);
    return memory(used, eng, copy.data<float>());
  };
  const memory a_in = into(a, plan->a, plan->a_in, plan->a_used),
               b_in = into(b, plan->b, plan->b_in, plan->b_used);
  memory result = plan->out_back ? buffer(plan->out_used) : out_user;
  std::unordered_map<int, memory> args{
      {plan->a_arg, a_in}, {plan->b_arg, b_in}, {plan->out_arg, result}};
  if (plan->scratch.get_size() > 0) args.emplace(DNNL_ARG_SCRATCHPAD, buffer(plan->scratch));
  plan->prim.execute(stream, args);
  if (plan->out_back) plan->out_back->execute(stream, result, const_cast<memory&>(out_user));
  stream.wait();
  return true;
}

}  // namespace kiln::ops
