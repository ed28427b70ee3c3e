// The backends ir::compile chooses between: the LLVM compiler and the interpreter.
#include <cstdlib>
#include <string_view>

#include "compiler/executable.h"
#include "kiln/transforms.h"

namespace kiln::ir {

namespace {
class Interpreter final : public Executable {
 public:
  explicit Interpreter(std::shared_ptr<const Function> f) : f_(std::move(f)) {
    for (std::size_t i = 0; i < f_->equations.size(); ++i)
      info_.kernel_calls.push_back(static_cast<int>(i));
  }
  std::vector<Tensor> run(std::span<const Tensor> args) const override {
    return evaluate(*f_, args);
  }
  const CompiledInfo& info() const override { return info_; }

 private:
  std::shared_ptr<const Function> f_;
  CompiledInfo info_;
};
}  // namespace

Backend default_backend() {
  const char* v = std::getenv("KILN_JIT_BACKEND");
  if (!v || !*v || std::string_view(v) == "llvm") return Backend::llvm;
  if (std::string_view(v) == "interpreter") return Backend::interpreter;
  fail("jit", "KILN_JIT_BACKEND is '", v, "', expected 'llvm' or 'interpreter'");
}

std::shared_ptr<const Executable> compile(std::shared_ptr<const Function> f,
                                          const CompileOptions& options) {
  if (options.backend.value_or(default_backend()) == Backend::llvm)
    return compiler::compile(std::move(f));
  return std::make_shared<Interpreter>(std::move(f));
}

}  // namespace kiln::ir
