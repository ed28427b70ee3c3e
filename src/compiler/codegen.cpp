// Each group becomes explicit vector code: the innermost loop runs W lanes at a time (W from
// the host's vector width), then a scalar tail; loads are vector loads, splats or gathers by
// their stride. Values follow the interpreter's kernels operation by operation (the same
// formulas, float16/bfloat16 rounded after every operation), so compiled results match the
// interpreter exactly except where docs/DESIGN.md says otherwise.
#include "compiler/codegen.h"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/IntrinsicsX86.h>
#include <llvm/IR/Module.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <map>

#include "compiler/layout.h"
#include "compiler/lowering_builder.h"
#include "compiler/orc.h"
#include "compiler/reductions.h"
#include "detail/checked.h"
#include "detail/streaming.h"
#include "math/vector_math.h"

namespace kiln::compiler {

using Dims = std::vector<int64_t>;

int64_t kernel_range(const Group& g) {
  if (g.has_reduction()) return g.outer_size();
  int64_t n = 1;
  for (int64_t d : g.domain) n *= d;
  return n;
}

int64_t kernel_cost(const Group& g) {
  const int64_t per_element = 1 + static_cast<int64_t>(g.nodes.size()) / 4;
  if (!g.has_reduction()) return per_element;
  return per_element * std::max<int64_t>(1, g.inner_size());
}

namespace {

// Emits one group's kernel: element values through ScalarOps, reductions through ReduceOps,
// operations through the primitives' lowerings (kiln/lowering.h).
class Emitter : ReduceOps {
 public:
  Emitter(llvm::Module& m, const Group& g, const std::string& name)
      : ReduceOps(m), g_(g), l_(coalesce(g)) {
    // The lanes of the host's float32 vector functions: 16 on AVX-512, 8 on AVX2, 4 on SSE4.1.
    lanes_ = math::host_functions(math::MathFn::exp, float32).vector.lanes;
    row_ = has_reduction() && !l_.reduced.back();
    auto* i64 = b_.getInt64Ty();
    auto* ptr = llvm::PointerType::getUnqual(ctx_);
    auto* type = llvm::FunctionType::get(b_.getVoidTy(), {ptr, i64, i64, ptr}, false);
    fn_ = llvm::Function::Create(type, llvm::Function::ExternalLinkage, name, m);
    fn_->addFnAttr("target-cpu", host_cpu().name);
    fn_->addFnAttr("target-features", host_cpu().features);
    fn_->addFnAttr(llvm::Attribute::NoUnwind);
    for (unsigned i = 0; i < 4; ++i) args_[i] = fn_->getArg(i);
  }

  void run() {
    auto* entry = llvm::BasicBlock::Create(ctx_, "entry", fn_);
    b_.SetInsertPoint(entry);
    const std::size_t n_in = g_.inputs.size();
    for (std::size_t k = 0; k < n_in + g_.outputs.size(); ++k) {
      llvm::Value* slot = b_.CreateConstGEP1_64(b_.getPtrTy(), args_[0], k);
      buffers_.push_back(b_.CreateLoad(b_.getPtrTy(), slot));
    }
    if (has_reduction()) {
      emit_reduction_group();
    } else {
      emit_elementwise_group();
    }
    b_.CreateRetVoid();
  }

 private:
  using Idx = std::vector<llvm::Value*>;  // per domain axis: its index, or null

  bool has_reduction() const {
    return std::find(l_.reduced.begin(), l_.reduced.end(), true) != l_.reduced.end();
  }
  std::size_t rank() const { return l_.domain.size(); }
  llvm::Value* i64(int64_t v) { return b_.getInt64(static_cast<uint64_t>(v)); }

  // ---- memory ------------------------------------------------------------------------------
  // Element offset of an access at `idx` (the innermost axis excluded: it is added per lane).
  llvm::Value* offset_of(const Access& a, const Idx& idx) {
    llvm::Value* off = i64(a.offset);
    for (std::size_t k = 0; k < idx.size(); ++k)
      if (idx[k] && a.strides[k] != 0)
        off = b_.CreateAdd(off, b_.CreateMul(idx[k], i64(a.strides[k])));
    return off;
  }
  // Element offset of an access at idx and innermost index j (null: the innermost excluded).
  llvm::Value* offset_at(const Access& a, const Idx& idx, llvm::Value* j) {
    llvm::Value* off = offset_of(a, idx);
    const int64_t st = j ? a.strides.back() : 0;
    return st == 0 ? off : b_.CreateAdd(off, b_.CreateMul(j, i64(st)));
  }
  // Pointer and lane indices for `lanes` elements starting at innermost index j.
  llvm::Value* load(DType d, llvm::Value* base, const Access& a, const Idx& idx, llvm::Value* j,
                    int lanes) {
    llvm::Type* t = storage_scalar(d);
    const int64_t st = j ? a.strides.back() : 0;
    llvm::Value* p = b_.CreateGEP(t, base, offset_at(a, idx, j));
    llvm::Value* v;
    if (lanes == 1 || st == 0) {
      v = splat(b_.CreateLoad(t, p), lanes);
    } else if (st == 1) {
      v = b_.CreateAlignedLoad(vec(t, lanes), p, llvm::Align(t->getScalarSizeInBits() / 8));
    } else {
      v = gather(t, p, st, lanes);
    }
    return to_compute(d, v);
  }
  llvm::Value* lane_pointers(llvm::Type* t, llvm::Value* p, int64_t st, int lanes) {
    std::vector<llvm::Constant*> steps;
    for (int k = 0; k < lanes; ++k)
      steps.push_back(llvm::ConstantInt::get(b_.getInt64Ty(), static_cast<uint64_t>(k * st)));
    return b_.CreateGEP(t, p, llvm::ConstantVector::get(steps));
  }
  llvm::Value* gather(llvm::Type* t, llvm::Value* p, int64_t st, int lanes) {
    llvm::Value* ptrs = lane_pointers(t, p, st, lanes);
    return b_.CreateMaskedGather(vec(t, lanes), ptrs, llvm::Align(t->getScalarSizeInBits() / 8));
  }
  void store(DType d, llvm::Value* base, const Access& a, const Idx& idx, llvm::Value* j,
             llvm::Value* v) {
    const int lanes = lanes_of(v);
    v = to_storage(d, v);
    llvm::Type* t = storage_scalar(d);
    const int64_t st = j ? a.strides.back() : 0;
    llvm::Value* p = b_.CreateGEP(t, base, offset_at(a, idx, j));
    const llvm::Align align(t->getScalarSizeInBits() / 8);
    if (lanes == 1) {
      b_.CreateStore(v, p);
    } else if (st == 1 && streaming_) {
      llvm::StoreInst* store = b_.CreateAlignedStore(v, p, llvm::Align(stream_align()));
      store->setMetadata(llvm::LLVMContext::MD_nontemporal,
                         llvm::MDNode::get(ctx_, llvm::ConstantAsMetadata::get(b_.getInt32(1))));
    } else if (st == 1) {
      b_.CreateAlignedStore(v, p, align);
    } else {
      b_.CreateMaskedScatter(v, lane_pointers(t, p, st, lanes), align);
    }
  }

  // ---- operations ----------------------------------------------------------------------------
  // The node's primitive through its lowering (kiln/lowering.h), rounded to the node's dtype as
  // the kernels store it; a reduction over no axes (see fusion.cpp) is the identity. An operand
  // of the node's dtype returned as it is holds that dtype's values already.
  llvm::Value* op(const Node& n, const std::vector<llvm::Value*>& a) {
    const lowering::Lowering& lowered = *n.prim->lowering;
    if (lowered.reduction) return a[0];
    LlvmBuilder builder(*this, b_, lanes_of(a.back()));
    std::vector<lowering::Value> operands;
    for (llvm::Value* v : a) operands.push_back(LlvmBuilder::wrap(v));
    const DType in = g_.nodes[static_cast<std::size_t>(n.args.back())].dtype;
    const lowering::Site site{.in = in, .out = n.dtype, .attrs = n.attrs};
    llvm::Value* r = LlvmBuilder::unwrap(lowered.elementwise(builder, operands, site));
    for (std::size_t k = 0; k < a.size(); ++k)
      if (r == a[k] && g_.nodes[static_cast<std::size_t>(n.args[k])].dtype == n.dtype) return r;
    return round_to(n.dtype, r);
  }

  // ---- reductions (ReduceOps) ---------------------------------------------------------------
  Reducer reducer(const Node& n) {
    return {*n.prim->lowering->reduction, g_.nodes[static_cast<std::size_t>(n.args[0])].dtype,
            n.dtype};
  }

  // ---- loops ---------------------------------------------------------------------------------
  // for (i = lo; i + step <= hi; i += step) body(i); returns the first i not run.
  llvm::Value* loop(llvm::Value* lo, llvm::Value* hi, int64_t step,
                    const std::function<void(llvm::Value*)>& body) {
    llvm::BasicBlock* pre = b_.GetInsertBlock();
    auto* head = llvm::BasicBlock::Create(ctx_, "loop", fn_);
    auto* in = llvm::BasicBlock::Create(ctx_, "body", fn_);
    auto* out = llvm::BasicBlock::Create(ctx_, "done", fn_);
    b_.CreateBr(head);
    b_.SetInsertPoint(head);
    llvm::PHINode* i = b_.CreatePHI(b_.getInt64Ty(), 2);
    i->addIncoming(lo, pre);
    llvm::Value* next = b_.CreateAdd(i, i64(step));
    b_.CreateCondBr(b_.CreateICmpSLE(next, hi), in, out);
    b_.SetInsertPoint(in);
    body(i);
    i->addIncoming(next, b_.GetInsertBlock());
    b_.CreateBr(head);
    b_.SetInsertPoint(out);
    return i;
  }
  // The digits of a flat index over `axes` (row-major) into idx.
  void digits(llvm::Value* flat, const std::vector<std::size_t>& axes, Idx& idx) {
    for (std::size_t k = axes.size(); k-- > 0;) {
      const int64_t d = l_.domain[axes[k]];
      if (k == 0) {
        idx[axes[k]] = flat;
      } else {
        idx[axes[k]] = b_.CreateURem(flat, i64(d));
        flat = b_.CreateUDiv(flat, i64(d));
      }
    }
  }
  // Runs body over the innermost axis from j0 to j1: vector steps, then scalar ones.
  // With `halving`, the rest after the full vectors runs as at most one step each of W/2, W/4,
  // ..., 2 lanes before the scalar one: the row template's rows may be short (a bias of 10),
  // and a scalar select there became a mispredicted branch (9x slower than its kernel).
  void inner_loop(llvm::Value* j0, llvm::Value* j1,
                  const std::function<void(llvm::Value* j, int lanes)>& body,
                  bool halving = false) {
    llvm::Value* j = loop(j0, j1, lanes_, [&](llvm::Value* jv) { body(jv, lanes_); });
    for (int w = lanes_ / 2; halving && w > 1; w /= 2) {
      llvm::BasicBlock* pre = b_.GetInsertBlock();
      auto* step = llvm::BasicBlock::Create(ctx_, "half", fn_);
      auto* next = llvm::BasicBlock::Create(ctx_, "halved", fn_);
      b_.CreateCondBr(b_.CreateICmpSLE(b_.CreateAdd(j, i64(w)), j1), step, next);
      b_.SetInsertPoint(step);
      body(j, w);
      llvm::Value* stepped = b_.CreateAdd(j, i64(w));
      llvm::BasicBlock* step_end = b_.GetInsertBlock();
      b_.CreateBr(next);
      b_.SetInsertPoint(next);
      llvm::PHINode* phi = b_.CreatePHI(b_.getInt64Ty(), 2);
      phi->addIncoming(j, pre);
      phi->addIncoming(stepped, step_end);
      j = phi;
    }
    loop(j, j1, 1, [&](llvm::Value* js) { body(js, 1); });
  }

  // ---- node values ---------------------------------------------------------------------------
  // Per inner-loop body: node -> value, for `lanes` lanes at innermost index j.
  struct Scope {
    const Idx* idx;
    llvm::Value* j;
    int lanes;
    std::map<int, llvm::Value*> memo;
  };
  llvm::Value* value(int k, Scope& s) {
    const Node& n = g_.nodes[static_cast<std::size_t>(k)];
    if (n.level == Level::outer && has_reduction() && !row_)
      return invariant(splat(outer_[static_cast<std::size_t>(k)], s.lanes));
    if (auto it = s.memo.find(k); it != s.memo.end()) return it->second;
    llvm::AllocaInst* kept = cache_.empty() ? nullptr : cache_[static_cast<std::size_t>(k)];
    llvm::Value* v;
    if (kept && pass_ > cache_pass_[static_cast<std::size_t>(k)]) {
      v = b_.CreateAlignedLoad(vec(kept->getAllocatedType()->getArrayElementType(), s.lanes),
                               cache_slot(kept, s), llvm::Align(4));
    } else if (row_ && n.level == Level::outer) {
      v = to_compute(n.dtype, block_load(outer_[static_cast<std::size_t>(k)], s));
    } else if (n.kind == Node::Kind::load) {
      v = load(n.dtype, buffers_[static_cast<std::size_t>(n.input)],
               l_.loads[static_cast<std::size_t>(k)], *s.idx, s.j, s.lanes);
    } else {
      std::vector<llvm::Value*> args;
      for (int a : n.args) args.push_back(value(a, s));
      v = op(n, args);
      if (kept) b_.CreateAlignedStore(v, cache_slot(kept, s), llvm::Align(4));
    }
    s.memo[k] = v;
    return v;
  }
  llvm::Value* cache_slot(llvm::AllocaInst* a, const Scope& s) {
    return b_.CreateGEP(a->getAllocatedType()->getArrayElementType(), a, s.j);
  }

  // Column template over one reduced axis: a transcendental node that more than one pass needs
  // (softmax's exp(x - max), in the sum's pass and the output's) is computed once per element
  // and kept in a stack array as long as the row, not recomputed: the exponentials, not the
  // memory, set softmax's time. Pass r in 1..rounds accumulates round r's reductions and
  // stores the inner outputs of round r - 1; pass rounds + 1 those of the last round.
  void plan_cache(const std::vector<int>& round, int rounds) {
    cache_.assign(g_.nodes.size(), nullptr);
    cache_pass_.assign(g_.nodes.size(), 0);
    if (row_ || std::count(l_.reduced.begin(), l_.reduced.end(), true) != 1) return;
    std::vector<int> first(g_.nodes.size(), 0), passes(g_.nodes.size(), 0);
    for (int pass = 1; pass <= rounds + 1; ++pass) {
      std::vector<int> stack;
      for (std::size_t k = 0; k < g_.nodes.size(); ++k)
        if (g_.nodes[k].kind == Node::Kind::reduce && round[k] == pass)
          stack.push_back(g_.nodes[k].args[0]);
      for (const GroupOutput& out : g_.outputs)
        if (out.level == Level::inner && round[static_cast<std::size_t>(out.node)] == pass - 1)
          stack.push_back(out.node);
      for (const Node& n : g_.nodes)
        if (n.kind == Node::Kind::total && round[static_cast<std::size_t>(n.args[0])] == pass - 1)
          stack.push_back(n.args[0]);
      std::vector<bool> seen(g_.nodes.size(), false);
      while (!stack.empty()) {
        const auto k = static_cast<std::size_t>(stack.back());
        stack.pop_back();
        if (seen[k] || g_.nodes[k].level == Level::outer) continue;
        seen[k] = true;
        if (!passes[k]++) first[k] = pass;
        for (int a : g_.nodes[k].args) stack.push_back(a);
      }
    }
    const int64_t len = l_.domain.back();
    int64_t bytes = 0;
    for (std::size_t k = 0; k < g_.nodes.size(); ++k) {
      const Node& n = g_.nodes[k];
      const bool costly = n.kind == Node::Kind::op && n.prim->lowering->transcendental;
      if (!costly || passes[k] < 2 || (n.dtype != float32 && n.dtype != float64)) continue;
      bytes += len * static_cast<int64_t>(dtype_size(n.dtype));
      if (bytes > (int64_t{64} << 10)) break;  // the stack arrays stay within 64 KiB
      cache_[k] =
          entry_alloca(llvm::ArrayType::get(compute_scalar(n.dtype), static_cast<uint64_t>(len)));
      cache_[k]->setAlignment(llvm::Align(64));
      cache_pass_[k] = first[k];
    }
  }
  llvm::Value* output_buffer(std::size_t o) { return buffers_[g_.inputs.size() + o]; }

  // Calls body(idx, j0, n) for the pieces [j0, j0 + n) of [begin, end), a flattened index over
  // the axes `rows` (their indices in idx) and then the innermost axis (length len): each piece
  // lies in one row and holds at most `cap` elements.
  void pieces(const std::vector<std::size_t>& rows, int64_t len, int64_t cap,
              const std::function<void(const Idx& idx, llvm::Value* j0, llvm::Value* n)>& body) {
    auto* head = llvm::BasicBlock::Create(ctx_, "rows", fn_);
    auto* in = llvm::BasicBlock::Create(ctx_, "row", fn_);
    auto* done = llvm::BasicBlock::Create(ctx_, "finished", fn_);
    llvm::BasicBlock* pre = b_.GetInsertBlock();
    b_.CreateBr(head);
    b_.SetInsertPoint(head);
    llvm::PHINode* i = b_.CreatePHI(b_.getInt64Ty(), 2);
    i->addIncoming(args_[1], pre);
    b_.CreateCondBr(b_.CreateICmpSLT(i, args_[2]), in, done);
    b_.SetInsertPoint(in);
    llvm::Value* row = b_.CreateUDiv(i, i64(len));
    llvm::Value* j0 = b_.CreateSub(i, b_.CreateMul(row, i64(len)));
    auto smaller = [&](llvm::Value* a, llvm::Value* c) {
      return b_.CreateSelect(b_.CreateICmpSLT(a, c), a, c);
    };
    llvm::Value* n = smaller(b_.CreateSub(args_[2], i), b_.CreateSub(i64(len), j0));
    if (cap < len) n = smaller(n, i64(cap));
    Idx idx(rank(), nullptr);
    if (!rows.empty()) digits(row, rows, idx);
    body(idx, j0, n);
    i->addIncoming(b_.CreateAdd(i, n), b_.GetInsertBlock());
    b_.CreateBr(head);
    b_.SetInsertPoint(done);
  }

  void emit_elementwise_group() {
    const std::size_t last = rank() - 1;
    auto elements = [&](const Idx& idx, llvm::Value* j0, llvm::Value* j1) {
      inner_loop(j0, j1, [&](llvm::Value* j, int lanes) {
        Scope s{&idx, j, lanes, {}};
        for (std::size_t o = 0; o < g_.outputs.size(); ++o) {
          const GroupOutput& out = g_.outputs[o];
          llvm::Value* v = value(out.node, s);
          store(g_.nodes[static_cast<std::size_t>(out.node)].dtype, output_buffer(o), l_.outputs[o],
                idx, j, v);
        }
      });
    };
    if (streams()) {
      emit_streaming(elements);
      return;
    }
    std::vector<std::size_t> rows;
    for (std::size_t a = 0; a < last; ++a) rows.push_back(a);
    const int64_t len = l_.domain[last];
    if (last == 0 || len >= 4 * lanes_) {
      pieces(rows, len, len, [&](const Idx& idx, llvm::Value* j0, llvm::Value* n) {
        elements(idx, j0, b_.CreateAdd(j0, n));
      });
      return;
    }
    // Rows of a few vectors (a channel block's): pieces of the last two axes together, whose
    // rows a loop of their own steps through, so that a row costs an increment, not the division
    // of its flat index into digits.
    const std::size_t mid = last - 1;
    rows.pop_back();
    const int64_t span = detail::checked_mul("jit", l_.domain[mid], len);
    pieces(rows, span, span, [&](const Idx& outer, llvm::Value* k0, llvm::Value* n) {
      llvm::BasicBlock* pre = b_.GetInsertBlock();
      auto* head = llvm::BasicBlock::Create(ctx_, "subrows", fn_);
      auto* in = llvm::BasicBlock::Create(ctx_, "subrow", fn_);
      auto* done = llvm::BasicBlock::Create(ctx_, "subrows_done", fn_);
      llvm::Value* r0 = b_.CreateUDiv(k0, i64(len));
      llvm::Value* j0 = b_.CreateSub(k0, b_.CreateMul(r0, i64(len)));
      llvm::Value* end = b_.CreateAdd(k0, n);
      b_.CreateBr(head);
      b_.SetInsertPoint(head);
      llvm::PHINode* k = b_.CreatePHI(b_.getInt64Ty(), 2);
      llvm::PHINode* r = b_.CreatePHI(b_.getInt64Ty(), 2);
      llvm::PHINode* j = b_.CreatePHI(b_.getInt64Ty(), 2);
      k->addIncoming(k0, pre);
      r->addIncoming(r0, pre);
      j->addIncoming(j0, pre);
      b_.CreateCondBr(b_.CreateICmpSLT(k, end), in, done);
      b_.SetInsertPoint(in);
      llvm::Value *left = b_.CreateSub(end, k), *row_left = b_.CreateSub(i64(len), j);
      llvm::Value* m = b_.CreateSelect(b_.CreateICmpSLT(left, row_left), left, row_left);
      Idx idx = outer;
      idx[mid] = r;
      elements(idx, j, b_.CreateAdd(j, m));
      llvm::BasicBlock* body_end = b_.GetInsertBlock();
      k->addIncoming(b_.CreateAdd(k, m), body_end);
      r->addIncoming(b_.CreateAdd(r, i64(1)), body_end);
      j->addIncoming(i64(0), body_end);
      b_.CreateBr(head);
      b_.SetInsertPoint(done);
    });
  }

  // ---- streaming stores (detail/streaming.h) -------------------------------------------------
  // A one-loop elementwise group whose outputs, all contiguous with elements of 4 or 8 bytes,
  // total at least detail::streaming_bytes() writes its vector steps with non-temporal stores.
  bool streams() const {
    if (rank() != 1 || lanes_ < 4) return false;
    int64_t bytes = 0;
    for (std::size_t o = 0; o < g_.outputs.size(); ++o) {
      if (!streamable(o)) return false;
      bytes += output_size(o) * l_.domain[0];
    }
    return bytes >= detail::streaming_bytes();
  }
  // An output whose vector steps can stream: 4- or 8-byte elements, contiguous along the
  // loops' innermost axis.
  bool streamable(std::size_t o) const {
    const int64_t size = output_size(o);
    return (size == 4 || size == 8) && l_.outputs[o].strides.back() == 1;
  }
  int64_t output_size(std::size_t o) const {
    return static_cast<int64_t>(
        dtype_size(g_.nodes[static_cast<std::size_t>(g_.outputs[o].node)].dtype));
  }
  // A non-temporal vector store must be aligned to the vector (movntps faults otherwise).
  int64_t stream_align() const { return int64_t{4} * lanes_; }
  llvm::Value* vector_aligned(llvm::Value* address) {
    return b_.CreateICmpEQ(b_.CreateAnd(address, i64(stream_align() - 1)), i64(0));
  }

  // The first iterations of [begin, end) run with ordinary stores up to the index a at which
  // the first output is vector-aligned, the rest streamed when every output is aligned at a
  // (all are, from Kiln's allocator); otherwise the whole range runs with ordinary stores.
  void emit_streaming(
      const std::function<void(const Idx&, llvm::Value* j0, llvm::Value* j1)>& elements) {
    const Idx idx;
    llvm::Value* begin = args_[1];
    llvm::Value* end = args_[2];
    const int64_t align = stream_align();
    auto address = [&](std::size_t o, llvm::Value* j) {
      llvm::Value* base = b_.CreatePtrToInt(output_buffer(o), b_.getInt64Ty());
      llvm::Value* first = b_.CreateAdd(i64(l_.outputs[o].offset), j);
      return b_.CreateAdd(base, b_.CreateMul(first, i64(output_size(o))));
    };
    llvm::Value* gap = b_.CreateAnd(b_.CreateSub(i64(0), address(0, begin)), i64(align - 1));
    llvm::Value* a = b_.CreateAdd(begin, b_.CreateUDiv(gap, i64(output_size(0))));
    a = b_.CreateSelect(b_.CreateICmpSLT(a, end), a, end);
    llvm::Value* aligned = b_.getTrue();
    for (std::size_t o = 0; o < g_.outputs.size(); ++o)
      aligned = b_.CreateAnd(aligned, vector_aligned(address(o, a)));
    streamed_or_plain(
        aligned,
        [&] {
          elements(idx, begin, a);
          streaming_ = true;
          elements(idx, a, end);
        },
        [&] { elements(idx, begin, end); });
  }
  // Emits `stream` where `aligned` holds at run time, `plain` where not; the stores `stream`
  // emits once it sets streaming_ are non-temporal, and an sfence orders them before whatever
  // the caller does next (another thread's read).
  void streamed_or_plain(llvm::Value* aligned, const std::function<void()>& stream,
                         const std::function<void()>& plain) {
    auto* streamed = llvm::BasicBlock::Create(ctx_, "stream", fn_);
    auto* ordinary = llvm::BasicBlock::Create(ctx_, "plain", fn_);
    auto* done = llvm::BasicBlock::Create(ctx_, "streamed", fn_);
    b_.CreateCondBr(aligned, streamed, ordinary);
    b_.SetInsertPoint(streamed);
    stream();
    streaming_ = false;
    b_.CreateIntrinsic(llvm::Intrinsic::x86_sse_sfence, {}, {});
    b_.CreateBr(done);
    b_.SetInsertPoint(ordinary);
    plain();
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
  }
  // The column template streams its inner outputs (softmax's rows) when they total at least
  // detail::streaming_bytes(), each is contiguous along the loops' innermost axis, and every
  // other stride and offset keeps a vector step that starts a row on a vector boundary: then
  // each vector store is aligned wherever the output's buffer is, which the kernel checks on
  // entry. Call after reorder_innermost.
  bool column_streams() const {
    if (lanes_ < 4) return false;
    int64_t elements = 1, bytes = 0;
    for (int64_t d : l_.domain) elements *= d;
    for (std::size_t q = 0; q < g_.outputs.size(); ++q) {
      if (g_.outputs[q].level != Level::inner) continue;
      const Access& a = l_.outputs[q];
      const int64_t size = output_size(q);
      if (!streamable(q) || a.offset * size % stream_align()) return false;
      for (std::size_t k = 0; k + 1 < a.strides.size(); ++k)
        if (a.strides[k] * size % stream_align()) return false;
      bytes += size * elements;
    }
    return bytes > 0 && bytes >= detail::streaming_bytes();
  }
  llvm::Value* inner_outputs_aligned() {
    llvm::Value* aligned = b_.getTrue();
    for (std::size_t q = 0; q < g_.outputs.size(); ++q) {
      if (g_.outputs[q].level != Level::inner) continue;
      aligned = b_.CreateAnd(aligned,
                             vector_aligned(b_.CreatePtrToInt(output_buffer(q), b_.getInt64Ty())));
    }
    return aligned;
  }

  // Nested loops over the reduced axes in domain order, the order in which the interpreter's
  // kernel combines terms. The vector loop is the last reduced axis (column template) or, in
  // the row template, the block of kept indices inside the last reduced loop.
  void reduced_loops(Idx& idx, const std::function<void(llvm::Value* j, int lanes)>& body) {
    std::vector<std::size_t> red;
    for (std::size_t a = 0; a < rank(); ++a)
      if (l_.reduced[a]) red.push_back(a);
    const std::size_t scalar_loops = row_ ? red.size() : red.size() - 1;
    std::function<void(std::size_t)> nest = [&](std::size_t k) {
      if (k == scalar_loops) {
        if (row_) {
          over_block(body);
        } else {
          idx[red[k]] = nullptr;
          inner_loop(i64(0), i64(l_.domain[red[k]]), body);
        }
        return;
      }
      loop(i64(0), i64(l_.domain[red[k]]), 1, [&](llvm::Value* r) {
        idx[red[k]] = r;
        nest(k + 1);
      });
    };
    nest(0);
    for (std::size_t a : red) idx[a] = nullptr;  // the loops' values end with them
  }

  // ---- row template: memory per kept index of the block --------------------------------------
  // Arrays of block_ elements on the stack, one element per kept index of the current block;
  // bool is stored as a byte (an <N x i1> vector would be stored as packed bits).
  llvm::Type* block_element(llvm::Type* t) { return t->isIntegerTy(1) ? b_.getInt8Ty() : t; }
  // Blocks of up to 2048 kept indices (a whole row of most layers: long blocks stream memory
  // best; 512 made a bias gradient 2x slower than its kernel), fewer when the group's arrays
  // would take more than 64 KiB of stack.
  int64_t block_length(const std::vector<llvm::Type*>& arrays) {
    int64_t bytes = 1;
    for (llvm::Type* t : arrays)
      bytes += static_cast<int64_t>(block_element(t)->getPrimitiveSizeInBits() / 8);
    const int64_t fit = (int64_t{64} << 10) / bytes / lanes_ * lanes_;
    return std::clamp<int64_t>(fit, lanes_, 2048);
  }
  llvm::AllocaInst* block_array(llvm::Type* t) {
    llvm::AllocaInst* a =
        entry_alloca(llvm::ArrayType::get(block_element(t), static_cast<uint64_t>(block_)));
    a->setAlignment(llvm::Align(64));
    return a;
  }
  llvm::Value* block_slot(llvm::AllocaInst* a, const Scope& s) {
    llvm::Type* t = a->getAllocatedType()->getArrayElementType();
    return b_.CreateGEP(t, a, b_.CreateSub(s.j, block_lo_));
  }
  llvm::Value* block_load(llvm::Value* array, const Scope& s) {
    auto* a = llvm::cast<llvm::AllocaInst>(array);
    llvm::Type* t = a->getAllocatedType()->getArrayElementType();
    return b_.CreateAlignedLoad(vec(t, s.lanes), block_slot(a, s),
                                llvm::Align(t->getScalarSizeInBits() / 8));
  }
  void block_store(llvm::Value* array, const Scope& s, llvm::Value* v) {
    auto* a = llvm::cast<llvm::AllocaInst>(array);
    llvm::Type* t = a->getAllocatedType()->getArrayElementType();
    b_.CreateAlignedStore(v, block_slot(a, s), llvm::Align(t->getScalarSizeInBits() / 8));
  }
  void over_block(const std::function<void(llvm::Value* j, int lanes)>& body) {
    inner_loop(block_lo_, block_hi_, body, true);
  }

  // ---- reduction groups ----------------------------------------------------------------------
  // An accumulator per reduction of a round: in the column template a vector of lanes and a
  // scalar for the tail, combined in a fixed order; in the row template one per kept index.
  struct Accumulator {
    Reducer r;
    llvm::AllocaInst* lanes = nullptr;  // column: vector; row: the block's array
    llvm::AllocaInst* tail = nullptr;   // column only
    // Column float max/min: lanes and tail hold order keys (ordered_key), and the last NaN
    // seen (if any) is kept apart, so the loop's dependency chain is one integer max per step
    // instead of the compare-and-select chain of combine (a softmax's max pass waited on it).
    // The NaN itself, not a flag: the result keeps its sign, as the interpreter's a + b does.
    llvm::AllocaInst* nan_lanes = nullptr;
    llvm::AllocaInst* nan_tail = nullptr;
  };
  bool keyed(const Reducer& r) {
    return !row_ && (r.kind == Reduction::max || r.kind == Reduction::min) &&
           acc_scalar(r)->isFloatingPointTy();
  }
  Accumulator accumulator(const Node& n) {
    Accumulator a{.r = reducer(n)};
    if (row_) {
      a.lanes = block_array(acc_scalar(a.r));
    } else {
      llvm::Type* t = acc_scalar(a.r);
      if (keyed(a.r)) t = b_.getIntNTy(t->getScalarSizeInBits());  // keys
      a.lanes = entry_alloca(vec(t, lanes_));
      a.tail = entry_alloca(t);
      if (keyed(a.r)) {
        a.nan_lanes = entry_alloca(vec(acc_scalar(a.r), lanes_));
        a.nan_tail = entry_alloca(acc_scalar(a.r));
      }
    }
    return a;
  }
  // In the outer scope s: the identity (row: for these kept indices).
  void reset(const Accumulator& a, const Scope& s) {
    if (row_) {
      llvm::Value* id = identity(a.r, s.lanes);
      if (id->getType()->getScalarType()->isIntegerTy(1))
        id = b_.CreateZExt(id, vec(b_.getInt8Ty(), s.lanes));
      block_store(a.lanes, s, id);
      return;
    }
    if (keyed(a.r)) {
      b_.CreateStore(key_of(identity(a.r, lanes_)), a.lanes);
      b_.CreateStore(key_of(identity(a.r, 1)), a.tail);
      b_.CreateStore(llvm::Constant::getNullValue(a.nan_lanes->getAllocatedType()), a.nan_lanes);
      b_.CreateStore(llvm::Constant::getNullValue(a.nan_tail->getAllocatedType()), a.nan_tail);
      return;
    }
    b_.CreateStore(identity(a.r, lanes_), a.lanes);
    b_.CreateStore(identity(a.r, 1), a.tail);
  }
  // In the inner scope s: combines v into the accumulator.
  void accumulate(const Accumulator& a, const Scope& s, llvm::Value* v) {
    v = to_acc(a.r, v);
    if (row_) {
      llvm::Value* acc = acc_from_block(a, s);
      llvm::Value* c = combine(a.r, acc, v);
      if (c->getType()->getScalarType()->isIntegerTy(1))
        c = b_.CreateZExt(c, vec(b_.getInt8Ty(), s.lanes));
      block_store(a.lanes, s, c);
      return;
    }
    llvm::AllocaInst* acc = s.lanes == 1 ? a.tail : a.lanes;
    if (keyed(a.r)) {
      llvm::AllocaInst* nan = s.lanes == 1 ? a.nan_tail : a.nan_lanes;
      b_.CreateStore(b_.CreateSelect(is_nan(v), v, b_.CreateLoad(nan->getAllocatedType(), nan)),
                     nan);
      b_.CreateStore(extreme_key(a.r, b_.CreateLoad(acc->getAllocatedType(), acc), key_of(v)), acc);
      return;
    }
    b_.CreateStore(combine(a.r, b_.CreateLoad(acc->getAllocatedType(), acc), v), acc);
  }
  // The larger (max) or smaller (min) of two order keys.
  llvm::Value* extreme_key(const Reducer& r, llvm::Value* k1, llvm::Value* k2) {
    const bool is_max = r.kind == Reduction::max;
    return b_.CreateSelect(is_max ? b_.CreateICmpSGT(k2, k1) : b_.CreateICmpSLT(k2, k1), k2, k1);
  }
  llvm::Value* acc_from_block(const Accumulator& a, const Scope& s) {
    llvm::Value* v = block_load(a.lanes, s);
    if (acc_scalar(a.r)->isIntegerTy(1)) v = b_.CreateICmpNE(v, iconst(b_.getInt8Ty(), 0, s.lanes));
    return v;
  }
  // In the outer scope s: the reduction's result.
  llvm::Value* result(const Accumulator& a, const Scope& s) {
    if (row_) return from_acc(a.r, acc_from_block(a, s));
    // The lanes pairwise (each half with the other, then each quarter, ...), then the scalar
    // tail: the same order on every run. A row's result waits on log2(W) steps rather than W
    // (softmax's rows of 128 waited on 16 dependent adds and 16 selects each).
    llvm::Value* vv = b_.CreateLoad(a.lanes->getAllocatedType(), a.lanes);
    llvm::Value* tail = b_.CreateLoad(a.tail->getAllocatedType(), a.tail);
    if (keyed(a.r)) {
      vv = halves(vv, [&](llvm::Value* x, llvm::Value* y) { return extreme_key(a.r, x, y); });
      vv = value_of_key(vv, acc_scalar(a.r));
      tail = value_of_key(tail, acc_scalar(a.r));
    } else {
      vv = halves(vv, [&](llvm::Value* x, llvm::Value* y) { return combine(a.r, x, y); });
    }
    llvm::Value* total = combine(a.r, vv, tail);
    if (keyed(a.r)) {
      // A lane's NaN (the upper half's first at each step: a fixed order), else the tail's.
      llvm::Value* nan =
          halves(b_.CreateLoad(a.nan_lanes->getAllocatedType(), a.nan_lanes),
                 [&](llvm::Value* x, llvm::Value* y) { return b_.CreateSelect(is_nan(y), y, x); });
      llvm::Value* tail_nan = b_.CreateLoad(a.nan_tail->getAllocatedType(), a.nan_tail);
      nan = b_.CreateSelect(is_nan(nan), nan, tail_nan);
      total = b_.CreateSelect(is_nan(nan), nan, total);
    }
    return from_acc(a.r, total);
  }

  // Folds a vector's lanes into one: f(lower half, upper half) until one lane is left (the
  // widths are powers of two: 16, 8, 4 or 1 lanes).
  llvm::Value* halves(llvm::Value* v,
                      const std::function<llvm::Value*(llvm::Value*, llvm::Value*)>& f) {
    for (int w = lanes_of(v); w > 1; w /= 2) {
      std::vector<int> lo, hi;
      for (int k = 0; k < w / 2; ++k) {
        lo.push_back(k);
        hi.push_back(w / 2 + k);
      }
      v = f(b_.CreateShuffleVector(v, lo), b_.CreateShuffleVector(v, hi));
    }
    return lanes_of(v) == 1 && v->getType()->isVectorTy() ? b_.CreateExtractElement(v, uint64_t{0})
                                                          : v;
  }

  // Runs body once per outer scope: per kept index (column template: one lane, no innermost
  // index) or, in the row template, vectorised over the kept indices of the current block.
  void over_outer(const Idx& idx, const std::function<void(Scope&)>& body) {
    if (!row_) {
      Scope s{&idx, nullptr, 1, {}};
      body(s);
      return;
    }
    over_block([&](llvm::Value* j, int lanes) {
      Scope s{&idx, j, lanes, {}};
      body(s);
    });
  }
  void set_outer(int k, Scope& s, llvm::Value* v) {
    s.memo[k] = v;
    if (!row_) {
      outer_[static_cast<std::size_t>(k)] = v;
      return;
    }
    block_store(outer_[static_cast<std::size_t>(k)], s,
                to_storage(g_.nodes[static_cast<std::size_t>(k)].dtype, v));
  }

  // Column template: the first pass over a row reads it from memory, the later ones from
  // L1; in the second, each vector step asks for the next kept index's elements of every
  // input read contiguously along the row, so that its first pass need not wait for memory.
  // (A prefetch past the buffer's end is harmless: prefetches never fault.)
  void prefetch_next_row(const Idx& idx, llvm::Value* j, int lanes) {
    if (row_ || lanes != lanes_) return;
    std::optional<std::size_t> kept;  // the innermost kept axis
    for (std::size_t d = 0; d < rank(); ++d)
      if (!l_.reduced[d]) kept = d;
    if (!kept) return;
    for (std::size_t k = 0; k < g_.nodes.size(); ++k) {
      const Node& n = g_.nodes[k];
      const Access& a = l_.loads[k];
      if (n.kind != Node::Kind::load || n.level != Level::inner || a.strides.back() != 1) continue;
      const int64_t next = a.strides[*kept];
      if (next == 0) continue;
      llvm::Value* off = b_.CreateAdd(offset_at(a, idx, j), i64(next));
      llvm::Value* p =
          b_.CreateGEP(storage_scalar(n.dtype), buffers_[static_cast<std::size_t>(n.input)], off);
      b_.CreateIntrinsic(llvm::Intrinsic::prefetch, {p->getType()},
                         {p, b_.getInt32(0), b_.getInt32(3), b_.getInt32(1)});
    }
  }

  // totals[slot] += v, in double, at innermost index j: lane by lane into consecutive slots
  // where the slots run along the innermost axis; where they do not (the row template's lanes
  // are kept indices that share a slot: a channel-split group's sum over all its rows), the
  // lanes one after another into the one slot, in the kept indices' order.
  void add_to_total(const Access& a, const Idx& idx, llvm::Value* j, llvm::Value* v) {
    const int lanes = lanes_of(v);
    llvm::Type* t = vec(b_.getDoubleTy(), lanes);
    if (v->getType() != t) v = b_.CreateFPExt(v, t);
    llvm::Value* p = b_.CreateGEP(b_.getDoubleTy(), args_[3], offset_at(a, idx, j));
    if (lanes > 1 && j && a.strides.back() == 0) {
      llvm::Value* sum = b_.CreateAlignedLoad(b_.getDoubleTy(), p, llvm::Align(8));
      for (int k = 0; k < lanes; ++k)
        sum = b_.CreateFAdd(sum, b_.CreateExtractElement(v, static_cast<uint64_t>(k)));
      b_.CreateAlignedStore(sum, p, llvm::Align(8));
      return;
    }
    llvm::Value* sum = b_.CreateFAdd(b_.CreateAlignedLoad(t, p, llvm::Align(8)), v);
    b_.CreateAlignedStore(sum, p, llvm::Align(8));
  }

  // Both templates run, per outer index (a kept index, or a block of kept indices along the
  // innermost axis), one pass over the reduced axes per round of reductions (a round waits for
  // the previous one's results: softmax's sum needs its max). Inner outputs are stored in the
  // first pass that can compute them, so a last pass runs only for those that need the last
  // round. Every kept index combines its terms in the interpreter's order in the row template,
  // and over a fixed lane order in the column template.
  void emit_reduction_group() {
    const std::vector<int> phase = g_.rounds();
    const std::vector<Group::TotalSlot> totals = g_.totals();
    const int rounds = *std::max_element(phase.begin(), phase.end());
    plan_cache(phase, rounds);
    if (row_) {
      std::vector<llvm::Type*> arrays;
      for (const Node& n : g_.nodes) {
        if (n.kind == Node::Kind::reduce) arrays.push_back(acc_scalar(reducer(n)));
        if (n.level == Level::outer) arrays.push_back(storage_scalar(n.dtype));
      }
      block_ = block_length(arrays);
    }
    std::vector<Accumulator> accs(g_.nodes.size());
    for (std::size_t k = 0; k < g_.nodes.size(); ++k)
      if (g_.nodes[k].kind == Node::Kind::reduce) accs[k] = accumulator(g_.nodes[k]);
    outer_.assign(g_.nodes.size(), nullptr);
    if (row_)
      for (std::size_t k = 0; k < g_.nodes.size(); ++k)
        if (g_.nodes[k].level == Level::outer)
          outer_[k] = block_array(storage_scalar(g_.nodes[k].dtype));

    auto per_outer_index = [&](Idx& idx) {
      auto compute_outer = [&](int round) {
        over_outer(idx, [&](Scope& s) {
          for (std::size_t k = 0; k < g_.nodes.size(); ++k) {
            const Node& n = g_.nodes[k];
            if (n.level != Level::outer || phase[k] != round) continue;
            llvm::Value* v;
            if (n.kind == Node::Kind::reduce) {
              v = result(accs[k], s);
            } else if (n.kind == Node::Kind::load) {
              v = load(n.dtype, buffers_[static_cast<std::size_t>(n.input)], l_.loads[k], idx, s.j,
                       s.lanes);
            } else {
              std::vector<llvm::Value*> args;
              for (int a : n.args) args.push_back(value(a, s));
              v = op(n, args);
            }
            set_outer(static_cast<int>(k), s, v);
          }
        });
      };
      // Before the pass's stores, as the pass's reductions are (executable.cpp relies on it
      // when it writes an output over an input).
      auto add_inner_totals = [&](Scope& s, int round) {
        for (const Group::TotalSlot& t : totals) {
          const int arg = g_.nodes[static_cast<std::size_t>(t.node)].args[0];
          if (g_.nodes[static_cast<std::size_t>(arg)].level != Level::inner ||
              phase[static_cast<std::size_t>(arg)] != round)
            continue;
          add_to_total(l_.totals[static_cast<std::size_t>(t.node)], idx, s.j, value(arg, s));
        }
      };
      auto store_inner_outputs = [&](Scope& s, int round) {
        for (std::size_t q = 0; q < g_.outputs.size(); ++q) {
          const GroupOutput& out = g_.outputs[q];
          if (out.level != Level::inner || phase[static_cast<std::size_t>(out.node)] != round)
            continue;
          store(g_.nodes[static_cast<std::size_t>(out.node)].dtype, output_buffer(q), l_.outputs[q],
                idx, s.j, value(out.node, s));
        }
      };
      pass_ = 0;  // the column template emits this twice when it streams
      compute_outer(0);
      for (int round = 1; round <= rounds; ++round) {
        std::vector<std::size_t> reds;
        for (std::size_t k = 0; k < g_.nodes.size(); ++k)
          if (g_.nodes[k].kind == Node::Kind::reduce && phase[k] == round) reds.push_back(k);
        over_outer(idx, [&](Scope& s) {
          for (std::size_t k : reds) reset(accs[k], s);
        });
        pass_ = round;
        reduced_loops(idx, [&](llvm::Value* j, int lanes) {
          Scope s{&idx, j, lanes, {}};
          if (round == 2) prefetch_next_row(idx, j, lanes);
          for (std::size_t k : reds) accumulate(accs[k], s, value(g_.nodes[k].args[0], s));
          add_inner_totals(s, round - 1);
          store_inner_outputs(s, round - 1);
        });
        compute_outer(round);
      }
      bool last_pass = false;
      for (const GroupOutput& out : g_.outputs)
        last_pass = last_pass || (out.level == Level::inner &&
                                  phase[static_cast<std::size_t>(out.node)] == rounds);
      for (const Group::TotalSlot& t : totals) {
        const auto arg =
            static_cast<std::size_t>(g_.nodes[static_cast<std::size_t>(t.node)].args[0]);
        last_pass = last_pass || (g_.nodes[arg].level == Level::inner && phase[arg] == rounds);
      }
      pass_ = rounds + 1;
      if (last_pass)
        reduced_loops(idx, [&](llvm::Value* j, int lanes) {
          Scope s{&idx, j, lanes, {}};
          if (rounds == 1) prefetch_next_row(idx, j, lanes);
          add_inner_totals(s, rounds);
          store_inner_outputs(s, rounds);
        });
      // Outer outputs are stored once per kept index; totals of outer nodes add it up.
      over_outer(idx, [&](Scope& s) {
        for (const Group::TotalSlot& t : totals) {
          const int arg = g_.nodes[static_cast<std::size_t>(t.node)].args[0];
          if (g_.nodes[static_cast<std::size_t>(arg)].level != Level::outer) continue;
          add_to_total(l_.totals[static_cast<std::size_t>(t.node)], idx, s.j, value(arg, s));
        }
        for (std::size_t q = 0; q < g_.outputs.size(); ++q) {
          const GroupOutput& out = g_.outputs[q];
          if (out.level != Level::outer) continue;
          store(g_.nodes[static_cast<std::size_t>(out.node)].dtype, output_buffer(q), l_.outputs[q],
                idx, s.j, value(out.node, s));
        }
      });
    };

    std::vector<std::size_t> kept;
    for (std::size_t a = 0; a < rank(); ++a)
      if (!l_.reduced[a]) kept.push_back(a);
    if (row_) {
      // [begin, end) over the kept indices, in blocks along the innermost (kept) axis.
      const std::size_t last = kept.back();
      kept.pop_back();
      pieces(kept, l_.domain[last], block_, [&](const Idx& at, llvm::Value* j0, llvm::Value* n) {
        Idx idx = at;
        block_lo_ = j0;
        block_hi_ = b_.CreateAdd(j0, n);
        per_outer_index(idx);
      });
      return;
    }
    // The innermost reduced axis is the loops' innermost one: accesses use its stride.
    std::size_t innermost = 0;
    for (std::size_t a = 0; a < rank(); ++a)
      if (l_.reduced[a]) innermost = a;
    reorder_innermost(innermost);
    kept.clear();
    for (std::size_t a = 0; a < rank(); ++a)
      if (!l_.reduced[a]) kept.push_back(a);
    auto column = [&] {
      loop(args_[1], args_[2], 1, [&](llvm::Value* o) {
        Idx idx(rank(), nullptr);
        if (!kept.empty()) digits(o, kept, idx);
        per_outer_index(idx);
      });
    };
    if (!column_streams()) {
      column();
      return;
    }
    streamed_or_plain(
        inner_outputs_aligned(),
        [&] {
          streaming_ = true;
          column();
        },
        column);
  }

  // Moves the innermost reduced axis to the end of every access's stride list's meaning:
  // accesses read `strides.back()` as the innermost loop's stride.
  void reorder_innermost(std::size_t axis) {
    if (axis + 1 == rank()) return;
    auto move = [&](auto& v) {
      auto x = v[axis];
      v.erase(v.begin() + static_cast<std::ptrdiff_t>(axis));
      v.push_back(x);
    };
    move(l_.domain);
    {
      std::vector<bool> r = l_.reduced;
      const bool x = r[axis];
      r.erase(r.begin() + static_cast<std::ptrdiff_t>(axis));
      r.push_back(x);
      l_.reduced = r;
    }
    for (Access& a : l_.loads)
      if (!a.strides.empty()) move(a.strides);
    for (Access& a : l_.outputs) move(a.strides);
    for (Access& a : l_.totals)
      if (!a.strides.empty()) move(a.strides);
  }

  llvm::AllocaInst* entry_alloca(llvm::Type* t) {
    llvm::IRBuilder<> e(&fn_->getEntryBlock(), fn_->getEntryBlock().begin());
    return e.CreateAlloca(t);
  }

  const Group& g_;
  Layout l_;
  int lanes_ = 4;
  llvm::Value* args_[4] = {};
  std::vector<llvm::Value*> buffers_;
  // Whether the group is a row reduction: its innermost axis is kept.
  bool row_ = false;
  // Whether vector stores along the innermost axis are being emitted non-temporal.
  bool streaming_ = false;
  // Outer nodes' values: in the column template the current kept index's, in the row template
  // the block arrays that hold them for the current block [block_lo_, block_hi_).
  std::vector<llvm::Value*> outer_;
  llvm::Value* block_lo_ = nullptr;
  llvm::Value* block_hi_ = nullptr;
  int64_t block_ = 0;  // the most kept indices of a block
  // Column template: per node, the row array its values are kept in (plan_cache), the pass
  // that computes them, and the pass being emitted.
  std::vector<llvm::AllocaInst*> cache_;
  std::vector<int> cache_pass_;
  int pass_ = 0;
};

}  // namespace

void emit_group(llvm::Module& m, const Group& g, const std::string& name) {
  Emitter(m, g, name).run();
}

}  // namespace kiln::compiler
