// What a non-blocking collective can hide behind compute on this machine: the ZeRO-3 step's
// all-gather (a block's weights) and reduce-scatter (its gradient) issued before a block's
// worth of matrix products, progressed by MPI_Test between them, against the same collective
// made blocking before the products and against the products alone, in the same run.
//
//   mpirun --allow-run-as-root --oversubscribe -np 2 build/bench/bench_overlap
//   options: --floats N (per process, default 394880: the GPT block of bench/gpt_parallel.py),
//            --chunks K (matrix products per repetition, default 16), --size S (their side,
//            default 256), --reps R (default 15)
//
// Each repetition starts with a barrier; its time is the slowest process's. Reported per
// collective: the median times and the hidden share (blocking - overlapped) / (blocking -
// compute), the part of the collective's cost that overlap removed (1: all of it, 0: none).
#include <kiln/kiln.h>
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds of one repetition of `body`, the slowest process's.
double timed(const std::function<void()>& body) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = now();
  body();
  double t = now() - t0, slowest = 0;
  MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "bench_overlap: %s (options: --floats --chunks --size --reps N)\n", why);
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, procs = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &procs);
  long floats = 394880, chunks = 16, size = 256, reps = 15;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string o = argv[i];
    const long v = std::atol(argv[i + 1]);
    if (o == "--floats")
      floats = v;
    else if (o == "--chunks")
      chunks = v;
    else if (o == "--size")
      size = v;
    else if (o == "--reps")
      reps = v;
    else
      usage(("unknown option " + o).c_str());
  }
  if (floats < 1 || chunks < 1 || size < 1 || reps < 1) usage("every option must be at least 1");
  kiln::set_num_threads(1);
  const kiln::Tensor a = kiln::random::normal(kiln::random::key(1), {size, size});
  const kiln::Tensor b = kiln::random::normal(kiln::random::key(2), {size, size});
  // Buffers touched once, up front (first-touch page faults are not what is measured).
  std::vector<float> piece(static_cast<std::size_t>(floats), 1.0f);
  std::vector<float> whole(static_cast<std::size_t>(floats * procs), 0.0f);
  auto compute = [&](const std::function<void()>& between) {
    for (long c = 0; c < chunks; ++c) {
      (void)kiln::matmul(a, b);
      between();
    }
  };
  const auto nothing = [] {};
  struct Collective {
    const char* name;
    std::function<void(MPI_Request*)> start;  // null request: blocking
  };
  const int n = static_cast<int>(floats);
  const std::vector<Collective> collectives = {
      {"all-gather",
       [&](MPI_Request* r) {
         if (r)
           MPI_Iallgather(piece.data(), n, MPI_FLOAT, whole.data(), n, MPI_FLOAT, MPI_COMM_WORLD,
                          r);
         else
           MPI_Allgather(piece.data(), n, MPI_FLOAT, whole.data(), n, MPI_FLOAT, MPI_COMM_WORLD);
       }},
      {"reduce-scatter", [&](MPI_Request* r) {
         if (r)
           MPI_Ireduce_scatter_block(whole.data(), piece.data(), n, MPI_FLOAT, MPI_SUM,
                                     MPI_COMM_WORLD, r);
         else
           MPI_Reduce_scatter_block(whole.data(), piece.data(), n, MPI_FLOAT, MPI_SUM,
                                    MPI_COMM_WORLD);
       }}};
  if (rank == 0)
    std::printf("# %d processes x 1 thread; %ld floats per process; %ld products %ldx%ld\n", procs,
                floats, chunks, size, size);
  for (int warm = 0; warm < 2; ++warm) compute(nothing);
  for (const Collective& c : collectives) {
    std::vector<double> alone, blocking, overlapped, comm;
    for (long r = 0; r < reps; ++r) {
      alone.push_back(timed([&] { compute(nothing); }));
      comm.push_back(timed([&] { c.start(nullptr); }));
      blocking.push_back(timed([&] {
        c.start(nullptr);
        compute(nothing);
      }));
      overlapped.push_back(timed([&] {
        MPI_Request req;
        c.start(&req);
        int done = 0;
        compute([&] {
          if (!done) MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        });
        if (!done) MPI_Wait(&req, MPI_STATUS_IGNORE);
      }));
    }
    const double ta = median(alone), tb = median(blocking), to = median(overlapped);
    if (rank == 0)
      std::printf(
          "%-15s collective %.3f ms  compute %.3f ms  blocking then compute %.3f ms  "
          "overlapped %.3f ms  hidden %.0f%%\n",
          c.name, 1e3 * median(comm), 1e3 * ta, 1e3 * tb, 1e3 * to,
          100 * (tb - to) / std::max(tb - ta, 1e-12));
  }
  MPI_Finalize();
  return 0;
}
