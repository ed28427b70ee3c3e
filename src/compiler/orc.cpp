#include "compiler/orc.h"

#include <llvm/ADT/StringMap.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ObjectLinkingLayer.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/Host.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/SHA256.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>

#include "detail/files.h"
#include "detail/streaming.h"
#include "kiln/error.h"
#include "math/vector_math.h"

namespace kiln::compiler {
namespace {

std::string llvm_error(llvm::Error e) { return llvm::toString(std::move(e)); }

template <typename T>
T unwrap(llvm::Expected<T> v, std::string_view what) {
  if (!v) fail("jit", "LLVM failed to ", what, ": ", llvm_error(v.takeError()));
  return std::move(*v);
}

HostCpu detect_host() {
  HostCpu h;
  h.name = llvm::sys::getHostCPUName().str();
  llvm::StringMap<bool> features;
  // Sorted: the list is part of the disk cache's key, and a hash map's order is not promised.
  std::vector<std::string> flags;
  if (llvm::sys::getHostCPUFeatures(features))
    for (const auto& f : features) {
      std::string flag(1, f.second ? '+' : '-');
      flag.append(f.first().data(), f.first().size());
      flags.push_back(std::move(flag));
    }
  std::sort(flags.begin(), flags.end());
  for (const std::string& f : flags) h.features += (h.features.empty() ? "" : ",") + f;
  return h;
}

// The one LLJIT of the process. Kernels call the vector math table's functions (SLEEF's and
// Kiln's own), defined in each JITDylib at their addresses, and libm, found in the process.
class Jit {
 public:
  // Never destroyed: jitted functions with static storage are destroyed at exit, after this
  // would be, and still drop their code from it.
  static Jit& get() {
    static Jit& jit = *new Jit;
    return jit;
  }
  llvm::orc::LLJIT& lljit() { return *jit_; }
  llvm::orc::JITTargetMachineBuilder machine() const { return jtmb_; }
  // A new JITDylib that resolves what its code calls in the process.
  llvm::orc::JITDylib& new_dylib(const std::string& name) {
    auto created = jit_->createJITDylib(name);
    if (!created)
      fail("jit", "LLVM failed to create a JITDylib: ", llvm_error(created.takeError()));
    llvm::orc::JITDylib& d = *created;
    const char prefix = jit_->getDataLayout().getGlobalPrefix();
    d.addGenerator(unwrap(llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(prefix),
                          "search the process for symbols"));
    // By address, not by name: under Python, Kiln (with SLEEF) is loaded with RTLD_LOCAL, out of
    // the process's symbol table.
    llvm::orc::SymbolMap math;
    for (const math::SymbolAddress& s : math::symbols())
      math[jit_->mangleAndIntern(s.name)] = llvm::JITEvaluatedSymbol(
          llvm::pointerToJITTargetAddress(s.address), llvm::JITSymbolFlags::Exported);
    if (llvm::Error e = d.define(llvm::orc::absoluteSymbols(std::move(math))))
      fail("jit", "LLVM failed to define the math functions: ", llvm_error(std::move(e)));

    return d;
  }

 private:
  Jit() : jtmb_(unwrap(llvm::orc::JITTargetMachineBuilder::detectHost(), "detect the host")) {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    jtmb_.setCodeGenOptLevel(llvm::CodeGenOpt::Aggressive);
    // The small code model, as for an ordinary shared library: constants are RIP-relative
    // memory operands. LLVM 16 links ELF x86-64 with RuntimeDyld and the large model, where
    // every constant takes a register first; a softmax loop then spent 22 of its 57
    // instructions shuffling registers. JITLink keeps the sections of an object together and
    // reaches far symbols through a GOT and PLT of its own; LLVM itself picks it on MachO, and
    // on ELF in newer releases.
    jtmb_.setRelocationModel(llvm::Reloc::PIC_);
    jtmb_.setCodeModel(llvm::CodeModel::Small);
    jit_ = unwrap(
        llvm::orc::LLJITBuilder()
            .setJITTargetMachineBuilder(jtmb_)
            .setObjectLinkingLayerCreator(
                [](llvm::orc::ExecutionSession& es,
                   const llvm::Triple&) -> llvm::Expected<std::unique_ptr<llvm::orc::ObjectLayer>> {
                  return std::make_unique<llvm::orc::ObjectLinkingLayer>(es);
                })
            .create(),
        "start the ORC JIT");
  }
  llvm::orc::JITTargetMachineBuilder jtmb_;
  std::unique_ptr<llvm::orc::LLJIT> jit_;
};

// Each object gets a JITDylib of its own: two executables of one function define the same
// kernel names, and dropping an executable drops its code.
class LoadedObject final : public NativeCode {
 public:
  explicit LoadedObject(llvm::orc::JITDylib& dylib) : dylib_(dylib) {}
  ~LoadedObject() override {
    if (llvm::Error e = Jit::get().lljit().getExecutionSession().removeJITDylib(dylib_))
      llvm::consumeError(std::move(e));
  }
  void* symbol(const std::string& name) const override {
    auto addr = Jit::get().lljit().lookup(dylib_, name);
    return unwrap(std::move(addr), "find the compiled kernel " + name).toPtr<void*>();
  }

 private:
  llvm::orc::JITDylib& dylib_;
};

std::string read_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return {};
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::filesystem::path& file, const std::string& bytes) {
  detail::write_file_atomically("jit", file.string(), file.string(), [&](int fd) {
    return detail::write_all(fd, bytes.data(), bytes.size());
  });
}

std::optional<std::filesystem::path> env_dir(const char* var) {
  const char* v = std::getenv(var);
  if (!v || !*v) return std::nullopt;
  return std::filesystem::path(v);
}

// Cache entries: magic, the SHA-256 of the full key, the object's size and SHA-256, then
// the object. Anything else in the file (truncated, foreign, corrupt) is ignored and rebuilt.
constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'O', 'B', 'J', '1'};
using Digest = std::array<uint8_t, 32>;

Digest sha256(llvm::StringRef bytes) {
  llvm::SHA256 h;
  h.update(bytes);
  return h.final();
}
std::string hex(const Digest& d) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : d) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

std::string full_key(const std::string& key) {
  const HostCpu& cpu = host_cpu();
  return std::string("kiln-codegen-5\nllvm " LLVM_VERSION_STRING "\ncpu ") + cpu.name + "\n" +
         cpu.features + "\nstreaming " + std::to_string(detail::streaming_bytes()) + "\n" + key;
}

std::optional<std::string> read_cached(const std::filesystem::path& file, const Digest& key) {
  const std::string bytes = read_file(file);
  const std::size_t header = sizeof kMagic + 32 + 8 + 32;
  if (bytes.size() < header || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    return std::nullopt;
  if (std::memcmp(bytes.data() + sizeof kMagic, key.data(), 32) != 0) return std::nullopt;
  uint64_t size = 0;
  std::memcpy(&size, bytes.data() + sizeof kMagic + 32, 8);
  if (size != bytes.size() - header) return std::nullopt;
  std::string object = bytes.substr(header);
  const Digest sum = sha256(object);
  if (std::memcmp(bytes.data() + sizeof kMagic + 40, sum.data(), 32) != 0) return std::nullopt;
  return object;
}

void write_cached(const std::filesystem::path& file, const Digest& key, const std::string& object) {
  std::string bytes(kMagic, sizeof kMagic);
  bytes.append(reinterpret_cast<const char*>(key.data()), 32);
  const uint64_t size = object.size();
  bytes.append(reinterpret_cast<const char*>(&size), 8);
  const Digest sum = sha256(object);
  bytes.append(reinterpret_cast<const char*>(sum.data()), 32);
  bytes += object;
  try {
    std::filesystem::create_directories(file.parent_path());
    write_file(file, bytes);
  } catch (const std::exception&) {
    // A cache that cannot be written is only slower; the compiled code is still good.
  }
}

void optimise(llvm::Module& m, llvm::TargetMachine& tm) {
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  // The kernels are vector code already, with scalar tails: the loop vectoriser, SLP and the
  // unroller only add compile time there (they doubled it, for no measurable speed).
  llvm::PipelineTuningOptions tuning;
  tuning.LoopVectorization = false;
  tuning.SLPVectorization = false;
  tuning.LoopUnrolling = false;
  llvm::PassBuilder pb(&tm, tuning);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O2).run(m, mam);
}

std::string emit(llvm::Module& m, llvm::TargetMachine& tm, llvm::CodeGenFileType type) {
  llvm::SmallVector<char, 0> buffer;
  llvm::raw_svector_ostream os(buffer);
  llvm::legacy::PassManager pm;
  if (tm.addPassesToEmitFile(pm, os, nullptr, type))
    fail("jit", "LLVM cannot emit code for this target (", tm.getTargetTriple().str(), ")");
  pm.run(m);
  return std::string(buffer.data(), buffer.size());
}

void dump(const std::filesystem::path& dir, const std::string& name, const std::string& ext,
          const std::string& text) {
  try {
    std::filesystem::create_directories(dir);
    write_file(dir / (name + ext), text);
  } catch (const std::exception&) {
    // Dumps are for reading; failing to write one must not fail the program.
  }
}

std::string module_text(const llvm::Module& m) {
  std::string s;
  llvm::raw_string_ostream os(s);
  m.print(os, nullptr);
  return s;
}

}  // namespace

const HostCpu& host_cpu() {
  static const HostCpu h = detect_host();
  return h;
}

NativeResult build_native(const std::string& name, const std::string& key,
                          const ModuleBuilder& build) {
  Jit& jit = Jit::get();
  const std::string full = full_key(key);
  const Digest digest = sha256(full);
  const std::optional<std::filesystem::path> cache_dir = env_dir("KILN_CACHE_DIR");
  const std::optional<std::filesystem::path> dump_dir = env_dir("KILN_DUMP_DIR");
  const std::string stem = name + "-" + hex(digest).substr(0, 16);
  std::optional<std::filesystem::path> cache_file;
  if (cache_dir) cache_file = *cache_dir / (hex(digest) + ".o");

  NativeResult result;
  std::optional<std::string> object;
  if (cache_file && (object = read_cached(*cache_file, digest))) result.from_cache = true;
  if (!object) {
    const auto start = std::chrono::steady_clock::now();
    llvm::LLVMContext context;
    std::unique_ptr<llvm::Module> m = build(context);
    std::unique_ptr<llvm::TargetMachine> tm =
        unwrap(jit.machine().createTargetMachine(), "create a target machine");
    m->setDataLayout(tm->createDataLayout());
    m->setTargetTriple(tm->getTargetTriple().str());
    std::string problems;
    llvm::raw_string_ostream problems_os(problems);
    if (llvm::verifyModule(*m, &problems_os))
      fail("jit", "generated LLVM IR for ", name, " does not verify: ", problems);
    optimise(*m, *tm);
    object = emit(*m, *tm, llvm::CGFT_ObjectFile);
    if (dump_dir) {
      dump(*dump_dir, stem, ".ll", module_text(*m));
      dump(*dump_dir, stem, ".s", emit(*m, *tm, llvm::CGFT_AssemblyFile));
    }
    result.optimise_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (cache_file) write_cached(*cache_file, digest, *object);
  }
  static std::atomic<uint64_t> counter{0};
  llvm::orc::JITDylib& dylib = jit.new_dylib("kiln" + std::to_string(counter++));
  result.code = std::make_unique<LoadedObject>(dylib);
  auto buffer = llvm::MemoryBuffer::getMemBufferCopy(*object, stem);
  if (llvm::Error e = jit.lljit().addObjectFile(dylib, std::move(buffer)))
    fail("jit", "LLVM failed to load the compiled object for ", name, ": ",
         llvm_error(std::move(e)));
  return result;
}

}  // namespace kiln::compiler
