// The process-wide runtime: tensor memory (a caching allocator for large buffers) and the one
// thread pool that Kiln's loops, OpenBLAS and oneDNN share.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kiln {

// Tensor storage in this process. Freed buffers of at least 256 KiB are kept in a cache and
// reused by later requests of a similar size (a fresh buffer pays a page fault per page on
// first touch); smaller ones go back to malloc, except that each thread keeps a few freed
// buffers of up to 4 KiB for its next requests (at most 256 KiB a thread, outside
// bytes_cached; its hits count in cache_hits). The cache holds at most cache_limit bytes
// (default: the smaller of 2 GiB and 1/8 of physical memory; the environment variable
// KILN_ALLOCATOR_CACHE_LIMIT, in bytes, overrides it and 0 disables caching, the threads'
// lists included) and evicts the least recently freed buffers first. The counters run from
// process start.
struct MemoryStats {
  int64_t bytes_in_use = 0;        // bytes of tensor storage alive now, as requested
  int64_t peak_bytes_in_use = 0;   // the most bytes_in_use since start or the last reset
  int64_t bytes_cached = 0;        // bytes of freed buffers held by the cache for reuse
  int64_t cache_limit = 0;         // the bound on bytes_cached
  int64_t allocations = 0;         // storage buffers handed out
  int64_t cache_hits = 0;          // ... of which the cache served
  int64_t os_allocations = 0;      // ... of which the system allocator served
  int64_t os_bytes_allocated = 0;  // bytes asked of the system allocator (large ones rounded up
                                   // to the cache's size bins)
  int64_t os_releases = 0;  // cached buffers handed back to the system (bound, pressure, request)
};
MemoryStats memory_stats();
// Sets peak_bytes_in_use to bytes_in_use.
void reset_peak_memory_stats();
// Hands every cached buffer back to the system, the calling thread's small ones too (and
// trims malloc's free pages). An allocation
// that fails also releases the cache and tries once more before raising an Error.
void release_cached_memory();

// The number of threads Kiln's parallel loops, OpenBLAS and oneDNN use: one OpenMP pool in
// the process. The setting holds for calls from any thread. Initially KILN_NUM_THREADS when
// it is set to a valid count (an invalid value prints a warning and is ignored), otherwise
// OpenMP's default (OMP_NUM_THREADS, or the number of cores). Threads that are themselves one
// of many workers (the data pipeline's) run their loops serially whatever the count.
inline constexpr int kMaxThreads = 1024;
// n in [1, kMaxThreads], else an Error.
void set_num_threads(int n);
int num_threads();

// Whether float arithmetic flushes denormals to zero (x86's FTZ and DAZ modes: a result below
// the smallest normal number becomes 0, and such an operand reads as 0), on every thread that
// computes for Kiln: the caller's, the pool's, and so in compiled code, OpenBLAS and oneDNN.
// Off by default: IEEE gradual underflow, as PyTorch (torch.set_flush_denormal is this switch);
// until the first call Kiln leaves each thread's mode as it finds it.
// On, as XLA computes on CPU, it is faster where values pass through the denormal range (an
// optimiser's decaying moments): each instruction that makes or reads a denormal costs the CPU
// a slow path.
void set_flush_denormal(bool on);
bool flush_denormal();

// The kernel set OpenBLAS runs matmul on (its core name, e.g. "SkylakeX", "Haswell", "Zen").
// OpenBLAS picks it when it loads; on a CPU newer than it knows it falls back to its SSE3
// kernels ("Prescott"), and Kiln then selects kernels by the instruction sets the CPU has
// (AVX-512: SkylakeX, AVX2 with FMA: Haswell) before its first BLAS call. Setting
// OPENBLAS_CORETYPE in the environment chooses instead and turns this off.
std::string blas_kernels();

// The library that computes float32 matrix products (matmul and everything built on it, in
// eager and compiled code): oneDNN's matmul primitive or OpenBLAS's sgemm. float64 products
// always run on OpenBLAS (oneDNN has no float64 matmul), complex ones on its cgemm/zgemm.
// The rule: oneDNN when the CPU has AVX2 with FMA or AVX-512, else OpenBLAS. The environment
// variable KILN_GEMM (onednn or openblas, read once) overrides the rule, and set_gemm_backend
// overrides both.
enum class GemmBackend { onednn, openblas };
std::string_view gemm_backend_name(GemmBackend backend);  // "onednn", "openblas"
// std::nullopt: back to KILN_GEMM or the rule.
void set_gemm_backend(std::optional<GemmBackend> backend);

// What this process computes with.
struct RuntimeInfo {
  GemmBackend gemm_backend;  // float32 products' backend (an invalid KILN_GEMM raises an Error)
  std::string blas_kernels;  // OpenBLAS's core name, as blas_kernels()
  std::string cpu_isa;       // the widest vector instructions Kiln detected: "avx512" (F, BW, DQ,
                             // VL, CD), "avx2" (with FMA) or "baseline"
  int num_threads;           // as num_threads()
};
RuntimeInfo runtime_info();

// Asks the compiled loops running in this process to stop: the next step of a compiled
// while_loop or scan (in any thread) raises Error "[while] interrupted: ..." (or "[scan]"), and
// the request is then cleared; one made while no loop runs stops the next one to start.
// Async-signal-safe, so a SIGINT handler may call it. Python's Ctrl-C stops them as
// KeyboardInterrupt (docs/PYTHON.md).
void request_interrupt() noexcept;
// Installs `check` (null: none), which compiled loops call at most every 10 ms of a thread's
// running; it may raise an exception, which leaves the loop, or call request_interrupt. The
// Python module installs one that runs Python's signal handlers.
void set_interrupt_check(void (*check)());

}  // namespace kiln
