#include "ops/gemm.h"

#include <cblas.h>  // openblas_get_corename

#include <array>
#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "detail/parallel.h"
#include "kiln/error.h"
#include "kiln/tensor.h"
#include "ops/dnnl_engine.h"

namespace kiln {
namespace ops {
namespace {

using dnnl::memory;

// OpenBLAS's cores with AVX-512 sgemm kernels.
bool blas_has_avx512_kernels(std::string_view core) {
  return core == "SkylakeX" || core == "Cooperlake" || core == "SapphireRapids";
}

// oneDNN's matmul dispatches on the CPU's instructions; OpenBLAS picks by CPU model and runs
// AVX2 kernels on AVX-512 CPUs it files under an older core (AMD Zen 4 as Zen or Haswell),
// half the FMA width.
GemmBackend rule() {
  const std::string core = blas_kernels();
  return detail::cpu_vector_isa() == "avx512" && !blas_has_avx512_kernels(core)
             ? GemmBackend::onednn
             : GemmBackend::openblas;
}

// set_gemm_backend's choice: -1 none, else a GemmBackend.
std::atomic<int> g_forced{-1};

struct Plan {
  memory::desc a, b, c, scratch;
  dnnl::matmul prim;
};

// A 3-d descriptor of one operand: [count or 1 (shared), rows, cols].
memory::desc operand_desc(int64_t count, int64_t rows, int64_t cols, const GemmStrides& s) {
  const bool shared = s.batch == 0;
  // A size-1 batch axis's stride is never used; oneDNN still wants it positive.
  const int64_t batch_stride = shared || count == 1 ? rows * cols : s.batch;
  return memory::desc({shared ? 1 : count, rows, cols}, memory::data_type::f32,
                      {batch_stride, s.row, s.col});
}

std::unique_ptr<Plan> make_plan(const SgemmCall& c) {
  const memory::desc a = operand_desc(c.count, c.m, c.k, c.as);
  const memory::desc b = operand_desc(c.count, c.k, c.n, c.bs);
  const memory::desc out({c.count, c.m, c.n}, memory::data_type::f32, memory::format_tag::abc);
  // The scratchpad comes from Kiln's allocator, per call: calls from several threads may then
  // run one primitive at once, and large buffers are reused rather than faulted in afresh.
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, out), attr, dnnl_engine());
  return std::make_unique<Plan>(Plan{a, b, out, pd.scratchpad_desc(), dnnl::matmul(pd)});
}

// The cached plan, or nullptr when oneDNN rejects the layout (remembered too). A primitive
// keeps the thread count it was created with, so the count is part of the key.
const Plan* plan_for(const SgemmCall& c, int threads) {
  static std::mutex mu;
  static std::map<std::array<int64_t, 11>, std::unique_ptr<Plan>> plans;
  const std::array<int64_t, 11> key{threads,  c.count,  c.m,        c.n,      c.k,     c.as.batch,
                                    c.as.row, c.as.col, c.bs.batch, c.bs.row, c.bs.col};
  std::lock_guard lock(mu);
  auto it = plans.find(key);
  if (it == plans.end()) {
    std::unique_ptr<Plan> plan;
    try {
      plan = make_plan(c);
    } catch (const dnnl::error&) {
      plan = nullptr;  // OpenBLAS runs it instead
    }
    it = plans.emplace(key, std::move(plan)).first;
  }
  return it->second.get();
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
  const Plan* plan = plan_for(c, threads);
  if (plan == nullptr) return false;
  const dnnl::engine& eng = dnnl_engine();
  dnnl::stream stream(eng);
  const memory a(plan->a, eng, const_cast<float*>(c.a)), b(plan->b, eng, const_cast<float*>(c.b));
  const memory out(plan->c, eng, c.c);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, out}};
  Tensor scratch;
  if (const std::size_t bytes = plan->scratch.get_size(); bytes > 0) {
    scratch = empty({static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float))}, float32);
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(plan->scratch, eng, scratch.data<float>()));
  }
  plan->prim.execute(stream, args);
  stream.wait();
  return true;
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
