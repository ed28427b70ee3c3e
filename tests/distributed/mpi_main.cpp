// main() of the tests that run under mpirun (tests/distributed/): every process runs every
// test, process 0 reports, and the others print only their failures, with their index.
#include <gtest/gtest.h>
#include <kiln/distributed.h>

#include <cstdio>

namespace {

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int process) : process_(process) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[process %d] %s:%d: Failure\n%s\n", process_,
                   r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }

 private:
  int process_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  kiln::distributed::initialize();
  const int process = kiln::distributed::process_index();
  if (process != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(process));
  }
  return RUN_ALL_TESTS();
}
