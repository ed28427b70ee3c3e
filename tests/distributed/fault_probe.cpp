// A program whose process 1 misbehaves while process 0 waits in a psum; process 0 must fail
// with an Error naming process 1 and the collective, in bounded time (tests/distributed/
// faults.sh runs it under mpirun). Usage: fault_probe throw|inside|ahead|exit|kill|late
#include <kiln/kiln.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

using namespace kiln;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  distributed::initialize();
  const int me = distributed::process_index();
  const auto total = pmap([](const Tensor& v) { return psum(v, "dp"); }, axis_name("dp"));
  total(ones({1, 4}));  // a collective that works, first
  if (me == 1) {
    if (mode == "throw") throw Error("model", "process 1 hit a bad batch");
    if (mode == "exit") return 0;
    if (mode == "kill") std::raise(SIGKILL);
    if (mode == "late") std::this_thread::sleep_for(std::chrono::seconds(4));
  }
  // "inside": process 1 throws while tracing the function, after the call's start, so that
  // process 0 waits inside the compiled psum.
  const auto inside = pmap(
      [me](const Tensor& v) {
        if (me == 1) throw Error("model", "process 1 hit a bad batch");
        return psum(v * 2.0, "dp");
      },
      axis_name("dp"));
  if (mode == "inside" && me == 1) inside(ones({1, 4}));
  // "ahead": the same, while process 0 waits for an all_gather that its compiled function
  // started ahead, on the collectives' thread.
  const auto ahead = pmap(
      [me](const Tensor& v) {
        if (me == 1) throw Error("model", "process 1 hit a bad batch");
        return sum(all_gather(v, "dp") * 2.0);
      },
      axis_name("dp"));
  if (mode == "ahead" && me == 1) ahead(ones({1, 4}));
  try {
    if (mode == "inside") inside(ones({1, 4}));
    if (mode == "ahead") ahead(ones({1, 4}));
    total(ones({1, 4}));
    std::printf("process %d: psum completed\n", me);
  } catch (const Error& e) {
    std::printf("process %d caught: %s\n", me, e.what());
    std::fflush(stdout);
    return 3;
  }
  return 0;
}
