// The process's one LLVM ORC JIT: turns a module of kernels into native code for this CPU,
// through the on-disk object cache when KILN_CACHE_DIR is set, and dumps what it compiled
// into KILN_DUMP_DIR.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace llvm {
class LLVMContext;
class Module;
}  // namespace llvm

namespace kiln::compiler {

// What the host CPU offers, as LLVM detects it at run time (never the build machine's).
struct HostCpu {
  std::string name;       // "skylake-avx512", "znver3", ...
  std::string features;   // "+avx2,+fma,..." as LLVM spells them
  int vector_bits = 128;  // the widest vectors the generated loops use: 512, 256 or 128
};
const HostCpu& host_cpu();

// Native code for one module; its functions stay valid while this object lives.
class NativeCode {
 public:
  virtual ~NativeCode() = default;
  // The address of a function the module defines.
  virtual void* symbol(const std::string& name) const = 0;
};

// How many NativeCode objects are alive: modules loaded and not yet dropped (for tests).
std::size_t live_native_code();

struct NativeResult {
  std::unique_ptr<NativeCode> code;
  bool from_cache = false;  // the object came from KILN_CACHE_DIR, LLVM was skipped
  double optimise_ms = 0;   // LLVM's optimisation and code generation (0 from the cache)
};

// Builds a module into `context` (called only when the cache has no object for `key`), then
// optimises, compiles and loads it. `key` names what the module computes: equal keys must
// mean equal modules (the IR text of the function it was generated from does). `name`
// prefixes dump files.
using ModuleBuilder = std::function<std::unique_ptr<llvm::Module>(llvm::LLVMContext&)>;
NativeResult build_native(const std::string& name, const std::string& key,
                          const ModuleBuilder& build);

}  // namespace kiln::compiler
