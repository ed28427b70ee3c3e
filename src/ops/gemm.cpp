#include "ops/gemm.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "detail/parallel.h"
#include "kiln/error.h"
#include "kiln/tensor.h"
#include "ops/dnnl_common.h"

namespace kiln {
namespace ops {
namespace {

using dnnl::memory;

// oneDNN's matmul dispatches on the instructions the CPU has, OpenBLAS's kernels on its model
// name; oneDNN measured as fast or faster on the training steps of both vector widths
// (docs/DESIGN.md, "GEMM backend"). Unmeasured without AVX2, where OpenBLAS stays.
GemmBackend rule() {
  return detail::cpu_vector_isa() == "baseline" ? GemmBackend::openblas : GemmBackend::onednn;
}

// set_gemm_backend's choice: -1 none, else a GemmBackend.
std::atomic<int> g_forced{-1};

struct Plan {
  memory::desc a, b, c, scratch;
  dnnl::matmul prim;
};

// The descriptor of one operand: [count or 1 (shared), rows, cols], with [outer or 1] in front
// when the call has an outer batch axis.
memory::desc operand_desc(int64_t outer, int64_t count, int64_t rows, int64_t cols,
                          const GemmStrides& s) {
  // A size-1 batch axis's stride is never used; oneDNN still wants it positive.
  const bool shared = s.batch == 0, shared_outer = s.outer == 0;
  const int64_t batch_stride = shared || count == 1 ? rows * cols : s.batch;
  if (outer == 1)
    return memory::desc({shared ? 1 : count, rows, cols}, memory::data_type::f32,
                        {batch_stride, s.row, s.col});
  const int64_t outer_stride = shared_outer ? rows * cols * count : s.outer;
  return memory::desc({shared_outer ? 1 : outer, shared ? 1 : count, rows, cols},
                      memory::data_type::f32, {outer_stride, batch_stride, s.row, s.col});
}

// c's rows are ldc apart (n, or more for a block of c's columns).
std::unique_ptr<Plan> make_plan(const SgemmCall& c, int64_t ldc) {
  const memory::desc a = operand_desc(c.outer, c.count, c.m, c.k, c.as);
  const memory::desc b = operand_desc(c.outer, c.count, c.k, c.n, c.bs);
  const memory::desc out =
      c.outer == 1 ? memory::desc({c.count, c.m, c.n}, memory::data_type::f32, {c.m * ldc, ldc, 1})
                   : memory::desc({c.outer, c.count, c.m, c.n}, memory::data_type::f32,
                                  {c.count * c.m * ldc, c.m * ldc, ldc, 1});
  // The scratchpad is the caller's (prepare): calls from several threads may then run one
  // primitive at once, and large buffers come from Kiln's block cache rather than fresh pages.
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, out), attr, dnnl_engine());
  return std::make_unique<Plan>(Plan{a, b, out, pd.scratchpad_desc(), dnnl::matmul(pd)});
}

// The cached plan, or nullptr when oneDNN rejects the layout (OpenBLAS runs it).
std::shared_ptr<const Plan> plan_for(const SgemmCall& c, int64_t ldc, int threads) {
  static PlanCache<std::array<int64_t, 15>, Plan> plans;
  const std::array<int64_t, 15> key{threads,    c.count,  c.m,      c.n,        c.k,
                                    c.as.batch, c.as.row, c.as.col, c.bs.batch, c.bs.row,
                                    c.bs.col,   ldc,      c.outer,  c.as.outer, c.bs.outer};
  return plans.get(key, [&] { return make_plan(c, ldc); });
}

// Products below this many multiply-adds run on one thread, as OpenBLAS runs them: splitting
// them costs more than it saves (bench_matmul, two threads against one: 64³ 53 against 107
// GFLOP/s, x[64,512] @ W[512,10] 61 against 82; 128³ gains, 231 against 194).
constexpr double kSerialMacs = 1 << 20;

// ... except a product of a few rows with a large matrix (a token's step through a layer when
// generating): it is bound by reading the matrix, which the threads split by columns. A GPT's
// [1, 256] @ [256, 1024] took 42 µs on one thread (25 GB/s out of the last-level cache).
constexpr int64_t kFewRows = 8;
constexpr double kLargeMatrix = 1 << 17;  // elements: 512 KiB of float32

int team_size(const SgemmCall& c, int threads) {
  const double macs = static_cast<double>(c.outer) * static_cast<double>(c.count) *
                      static_cast<double>(c.m) * static_cast<double>(c.n) *
                      static_cast<double>(c.k);
  const bool reads_a_large_matrix =
      c.outer * c.count * c.m <= kFewRows &&
      static_cast<double>(c.k) * static_cast<double>(c.n) >= kLargeMatrix;
  return macs < kSerialMacs && !reads_a_large_matrix ? 1 : threads;
}

// Sets the calling thread's OpenMP count (which oneDNN reads when it creates and runs a
// primitive) for a scope, and back afterwards.
class OmpThreads {
 public:
  OmpThreads(int n, int restore) : n_(n), restore_(restore) {
    if (n_ != restore_) omp_set_num_threads(n_);
  }
  ~OmpThreads() {
    if (n_ != restore_) omp_set_num_threads(restore_);
  }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;

 private:
  int n_, restore_;
};

// A block of c's columns (rows ldc > n apart) with k at least this long goes to a contiguous
// staging buffer first and is copied into place: oneDNN 2.6's fast (brgemm) kernels write only
// contiguous rows, and its older gemm kernel, which it takes for strided rows, ran
// dy[64,512] @ Wᵀ[512,784] on two threads at 60% of their peak against 68% staged, while
// staging xᵀ[784,64] @ dy[64,512] (k = 64) cost it a third.
constexpr int64_t kMinStagedK = 256;

// A product with its plan and buffers, made beforehand so that running it inside a parallel
// region creates no primitive and takes no tensor memory. c's rows are ldc apart.
struct Ready {
  SgemmCall call;
  int64_t ldc;
  std::shared_ptr<const Plan> plan;
  std::size_t scratch_bytes;  // oneDNN's scratchpad: the running thread's buffer up to
  Tensor owned;               // kThreadScratchBytes, else this
  Tensor staging;             // c's block, contiguous (kMinStagedK), or undefined
};

// Scratchpads up to this size come from a buffer the calling thread keeps: small products'
// scratchpads went through malloc and free on every call, a tenth of their time.
constexpr std::size_t kThreadScratchBytes = std::size_t{1} << 20;

std::optional<Ready> prepare(const SgemmCall& c, int64_t ldc, int threads) {
  const bool staged = ldc != c.n && c.k >= kMinStagedK;
  std::shared_ptr<const Plan> plan = plan_for(c, staged ? c.n : ldc, threads);
  if (plan == nullptr) return std::nullopt;
  Ready r{c, ldc, plan, plan->scratch.get_size(), {}, {}};
  if (r.scratch_bytes > kThreadScratchBytes)
    r.owned = empty({static_cast<int64_t>((r.scratch_bytes + sizeof(float) - 1) / sizeof(float))},
                    float32);
  if (staged) r.staging = empty({c.outer * c.count * c.m * c.n}, float32);
  return r;
}

// The scratchpad of a product about to run on this thread.
float* scratch_for(Ready& r) {
  if (r.owned.defined()) return r.owned.data<float>();
  if (r.scratch_bytes == 0) return nullptr;
  thread_local std::vector<float> buffer;
  const std::size_t floats = (r.scratch_bytes + sizeof(float) - 1) / sizeof(float);
  if (buffer.size() < floats) buffer.resize(floats);
  return buffer.data();
}

void run(Ready& r) {
  const dnnl::engine& eng = dnnl_engine();
  // One stream per thread: making one per call cost a tenth of a small product's time.
  thread_local dnnl::stream stream(eng);
  const Plan& p = *r.plan;
  float* out = r.staging.defined() ? r.staging.data<float>() : r.call.c;
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, memory(p.a, eng, const_cast<float*>(r.call.a))},
      {DNNL_ARG_WEIGHTS, memory(p.b, eng, const_cast<float*>(r.call.b))},
      {DNNL_ARG_DST, memory(p.c, eng, out)}};
  if (float* scratch = scratch_for(r))
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(p.scratch, eng, scratch));
  p.prim.execute(stream, args);
  stream.wait();
  if (!r.staging.defined()) return;
  const int64_t rows = r.call.outer * r.call.count * r.call.m, n = r.call.n;
  for (int64_t i = 0; i < rows; ++i) std::copy_n(out + i * n, n, r.call.c + i * r.ldc);
}

// One product on several threads runs as a one-threaded product per thread on a block of c's
// columns (a multiple of 16, AVX-512's float lanes), or of its rows, when the blocks are wide
// (kMinBlock): each thread then packs only its share of b. On a batch-64 layer's products
// oneDNN's own split reached 45-60% of two cores' peak, against 75-85% of one core's for each
// half; narrower products (x[64,3136] @ W[3136,128]) do better with oneDNN's split.
constexpr int64_t kMinBlock = 256;
// ... except where oneDNN's own split measured faster on two threads: column blocks of a
// product with many rows, a row-major a and k from kMinStagedK to kMinBlockedK (a GPT layer's
// x[1024, 256] @ W[256, 1024]: 9-17%), which are staged, the copy of c not small against the
// product (from k = 512 on the blocks are as fast or faster: 2048³ by 12%; below kMinStagedK
// they run on the slower kernel, and measured either way); and rows of a transposed a whose
// columns lie a multiple of 4 KiB apart (hᵀ[1024, 1024] @ dy[1024, 256]: 16%), as each
// block's loads then fall into the same cache sets.
constexpr int64_t kMinBlockedK = 512;
constexpr int64_t kCacheSetStrideBytes = 4096;  // strides of a multiple alias in the caches

bool onednn_splits_better(const SgemmCall& c, int threads) {
  const bool many_rows = c.m >= kMinBlock * threads, a_transposed = c.as.col != 1;
  if (many_rows && !a_transposed && c.n >= kMinBlock * threads && c.k >= kMinStagedK &&
      c.k < kMinBlockedK)
    return true;
  return many_rows && a_transposed && c.n < kMinBlock * threads &&
         c.as.col * static_cast<int64_t>(sizeof(float)) % kCacheSetStrideBytes == 0;
}

std::vector<SgemmCall> blocks(const SgemmCall& c, int threads) {
  std::vector<SgemmCall> parts;
  if (c.count != 1 || c.outer != 1 || threads < 2 || onednn_splits_better(c, threads)) return parts;
  if (c.n >= kMinBlock * threads) {
    const int64_t width = (c.n + threads - 1) / threads, step = (width + 15) / 16 * 16;
    for (int64_t j = 0; j < c.n; j += step) {
      SgemmCall p = c;
      p.n = std::min(step, c.n - j);
      p.b = c.b + j * c.bs.col;
      p.c = c.c + j;
      parts.push_back(p);
    }
  } else if (c.m >= kMinBlock * threads) {
    const int64_t step = (c.m + threads - 1) / threads;
    for (int64_t i = 0; i < c.m; i += step) {
      SgemmCall p = c;
      p.m = std::min(step, c.m - i);
      p.a = c.a + i * c.as.row;
      p.c = c.c + i * c.n;
      parts.push_back(p);
    }
  }
  return parts;
}

// Runs `calls` on `team` threads, each call's primitive on one thread; c's rows are ldc apart
// (-1: each call's own n). False, before running any, when oneDNN rejects one's layout.
bool run_each(std::span<const SgemmCall> calls, int64_t ldc, int team, int threads) {
  std::vector<Ready> ready;
  {
    const OmpThreads scope(1, threads);  // each primitive runs on one thread
    for (const SgemmCall& p : calls) {
      std::optional<Ready> r = prepare(p, ldc < 0 ? p.n : ldc, 1);
      if (!r) return false;
      ready.push_back(std::move(*r));
    }
  }
  const auto count = static_cast<int64_t>(ready.size());
#pragma omp parallel for num_threads(team) schedule(static, 1)
  for (int64_t i = 0; i < count; ++i) {
    detail::apply_flush_denormal();
    run(ready[static_cast<std::size_t>(i)]);
  }
  return true;
}

}  // namespace

std::optional<GemmBackend> parse_gemm_env(const char* value) {
  if (value == nullptr) return std::nullopt;
  for (GemmBackend b : {GemmBackend::onednn, GemmBackend::openblas})
    if (gemm_backend_name(b) == value) return b;
  fail("matmul", "invalid KILN_GEMM: got \"", value, "\", expected \"onednn\" or \"openblas\"");
}

GemmBackend sgemm_backend() {
  if (const int forced = g_forced.load(std::memory_order_relaxed); forced >= 0)
    return static_cast<GemmBackend>(forced);
  // Read once; an invalid value throws here, and again on every later call.
  static const std::optional<GemmBackend> env = parse_gemm_env(std::getenv("KILN_GEMM"));
  if (env) return *env;
  static const GemmBackend chosen = rule();
  return chosen;
}

bool dnnl_sgemm(const SgemmCall& c) {
  // oneDNN takes its thread count from the calling thread's OpenMP setting.
  const int threads = detail::set_library_threads();
  const int team = team_size(c, threads);
  const std::vector<SgemmCall> parts = blocks(c, team);
  if (parts.empty()) {
    const OmpThreads scope(team, threads);
    std::optional<Ready> r = prepare(c, c.n, team);
    if (r) run(*r);
    return r.has_value();
  }
  return run_each(parts, c.n, team, threads);
}

bool dnnl_sgemm_each(std::span<const SgemmCall> calls) {
  const int threads = detail::set_library_threads();
  double macs = 0;
  for (const SgemmCall& c : calls)
    macs += static_cast<double>(c.outer) * static_cast<double>(c.count) * static_cast<double>(c.m) *
            static_cast<double>(c.n) * static_cast<double>(c.k);
  // Fewer products than threads, each worth splitting: one after another on every thread.
  if (std::ssize(calls) < threads && macs >= kSerialMacs * static_cast<double>(calls.size())) {
    for (const SgemmCall& c : calls)
      if (!dnnl_sgemm(c)) return false;
    return true;
  }
  const int team = macs < kSerialMacs ? 1 : std::min(threads, static_cast<int>(std::ssize(calls)));
  return run_each(calls, -1, team, threads);
}

}  // namespace ops

std::string_view gemm_backend_name(GemmBackend backend) {
  return backend == GemmBackend::onednn ? "onednn" : "openblas";
}

void set_gemm_backend(std::optional<GemmBackend> backend) {
  ops::g_forced.store(backend ? static_cast<int>(*backend) : -1, std::memory_order_relaxed);
}

RuntimeInfo runtime_info() {
  return {ops::sgemm_backend(), blas_kernels(), std::string(detail::cpu_vector_isa()),
          num_threads()};
}

}  // namespace kiln
