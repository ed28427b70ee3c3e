// The process's one LLVM ORC JIT: turns a module of kernels into native code for this CPU,
// through the on-disk object cache when KILN_CACHE_DIR is set, and dumps what it compiled
// into KILN_DUMP_DIR.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace llvm {
class LLVMContext;
class Module;
}  // namespace llvm

namespace kiln::compiler {

// What the host CPU offers, as LLVM detects it at run time (never the build machine's).
struct HostCpu {
  std::string name;      // "skylake-avx512", "znver3", ...
  std::string features;  // "+avx2,+fma,..." as LLVM spells them; AVX-512's off below avx512
                         // (KILN_ISA)
};
const HostCpu& host_cpu();

// Native code for one module: its functions stay valid while this object lives.
class NativeCode {
 public:
  virtual ~NativeCode() = default;
};

// How many NativeCode objects are alive: modules loaded and not yet dropped (for tests).
std::size_t live_native_code();

struct NativeResult {
  std::unique_ptr<NativeCode> code;
  std::vector<void*> functions;  // the address of each function asked for, in order
  bool from_cache = false;       // the object came from KILN_CACHE_DIR, LLVM was skipped
  double optimise_ms = 0;        // LLVM's optimisation and code generation (0 from the cache)
};

// Builds a module into `context` (called only when the cache has no usable object for `key`),
// then optimises, compiles and loads it, and looks up `functions`, which it must define. `key`
// names what the module computes: equal keys must mean equal modules (the descriptions of
// the kernels it holds, in order, do). `name` prefixes dump files.
using ModuleBuilder = std::function<std::unique_ptr<llvm::Module>(llvm::LLVMContext&)>;
NativeResult build_native(const std::string& name, const std::string& key,
                          std::span<const std::string> functions, const ModuleBuilder& build);

// The disk cache's entries (docs/DESIGN.md, "Compiler"), for the tests and the fuzz target.
// The full key of a module's `key`: it with the code generator's and LLVM's versions, the CPU,
// the instruction set and the streaming threshold.
std::string cache_key(const std::string& key);
// An entry holding `objects` under full key `key`.
std::string encode_cache_entry(const std::string& key, const std::vector<std::string>& objects);
// The objects of `entry` when it is an intact entry for full key `key` and each object is a
// well-formed relocatable ELF object for this JIT's target; nullopt for anything else.
std::optional<std::vector<std::string>> decode_cache_entry(std::string_view entry,
                                                           const std::string& key);

}  // namespace kiln::compiler
