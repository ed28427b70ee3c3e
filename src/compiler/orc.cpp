#include "compiler/orc.h"

#include <fcntl.h>
#include <llvm/ADT/StringMap.h>
#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/Bitcode/BitcodeWriter.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/ExecutionEngine/JITLink/JITLinkMemoryManager.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ObjectLinkingLayer.h>
#include <llvm/ExecutionEngine/Orc/Shared/WrapperFunctionUtils.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Object/ELF.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/Host.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/SHA256.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <sched.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>

#include "core/allocator.h"  // detail::parse_env_int
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

// Whether LLVM may use feature `name` when Kiln runs at instruction set `isa` (KILN_ISA): below
// avx512, AVX-512's instructions and registers stay out, so that code at avx2 on an AVX-512
// CPU is what an AVX2 CPU runs. (Below avx2 the code keeps the VEX encodings the CPU has: the
// set then narrows the vectors and the math table, which is what those runs test.)
bool allowed_at(std::string_view name, math::Isa isa) {
  return isa >= math::Isa::avx512 || !(name.starts_with("avx512") || name.starts_with("amx"));
}

HostCpu detect_host() {
  HostCpu h;
  h.name = llvm::sys::getHostCPUName().str();
  llvm::StringMap<bool> features;
  // Sorted: the list is part of the disk cache's key, and a hash map's order is not promised.
  std::vector<std::string> flags;
  const math::Isa isa = math::host_isa();
  if (llvm::sys::getHostCPUFeatures(features))
    for (const auto& f : features) {
      const std::string_view name(f.first().data(), f.first().size());
      std::string flag(1, f.second && allowed_at(name, isa) ? '+' : '-');
      flag.append(name);
      flags.push_back(std::move(flag));
    }
  std::sort(flags.begin(), flags.end());
  for (const std::string& f : flags) h.features += (h.features.empty() ? "" : ",") + f;
  return h;
}

// A deallocation action that does nothing (see ReleasingMemoryManager).
llvm::orc::shared::CWrapperFunctionResult no_action(const char* args, std::size_t size) {
  using Signature = llvm::orc::shared::SPSError();
  return llvm::orc::shared::WrapperFunction<Signature>::handle(
             args, size, [] { return llvm::Error::success(); })
      .release();
}

// JITLink's in-process memory manager, each allocation given a deallocation action: LLVM 16's
// unmaps an allocation's code and data only when it has one (fixed in LLVM 19), so the code of
// every executable dropped stayed mapped, a page or more each.
class ReleasingMemoryManager final : public llvm::jitlink::JITLinkMemoryManager {
 public:
  ReleasingMemoryManager()
      : memory_(unwrap(llvm::jitlink::InProcessMemoryManager::Create(), "set up JIT memory")) {}
  void allocate(const llvm::jitlink::JITLinkDylib* dylib, llvm::jitlink::LinkGraph& graph,
                OnAllocatedFunction allocated) override {
    graph.allocActions().push_back(
        {{},
         llvm::orc::shared::WrapperFunctionCall(llvm::orc::ExecutorAddr::fromPtr(&no_action), {})});
    memory_->allocate(dylib, graph, std::move(allocated));
  }
  void deallocate(std::vector<FinalizedAlloc> allocs, OnDeallocatedFunction done) override {
    memory_->deallocate(std::move(allocs), std::move(done));
  }
  using JITLinkMemoryManager::allocate;
  using JITLinkMemoryManager::deallocate;

 private:
  std::unique_ptr<llvm::jitlink::InProcessMemoryManager> memory_;
};

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
                  return std::make_unique<llvm::orc::ObjectLinkingLayer>(
                      es, std::make_unique<ReleasingMemoryManager>());
                })
            .create(),
        "start the ORC JIT");
  }
  llvm::orc::JITTargetMachineBuilder jtmb_;
  std::unique_ptr<llvm::orc::LLJIT> jit_;
};

// Each program's objects get a JITDylib of their own: every program names its kernels alike,
// and dropping a program's executables drops its code.
std::atomic<std::size_t> g_live_code{0};

class LoadedObject final : public NativeCode {
 public:
  explicit LoadedObject(llvm::orc::JITDylib& dylib) : dylib_(dylib) { ++g_live_code; }
  ~LoadedObject() override {
    --g_live_code;
    if (llvm::Error e = Jit::get().lljit().getExecutionSession().removeJITDylib(dylib_))
      llvm::consumeError(std::move(e));
  }

 private:
  llvm::orc::JITDylib& dylib_;
};

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

// Cache entries: magic, the full key's size and text, the payload's size and SHA-256, then the
// payload: the number of objects, each one's size, and the objects. Anything else in the file
// (truncated, foreign, corrupt, another key's) is ignored and rebuilt.
constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'O', 'B', 'J', '3'};
// No entry is larger: the objects of the largest programs measured are a few MB.
constexpr uint64_t kMaxEntryBytes = uint64_t{256} << 20;
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

// Everything the generated code depends on besides the program: the code generator's version,
// LLVM's, the CPU, the instruction set the vector math was chosen for (KILN_ISA) and the
// streaming threshold.
std::string full_key(const std::string& key) {
  const HostCpu& cpu = host_cpu();
  return std::string("kiln-codegen-9\nllvm " LLVM_VERSION_STRING "\ncpu ") + cpu.name + "\n" +
         cpu.features + "\nisa " + std::string(math::isa_name(math::host_isa())) + "\nstreaming " +
         std::to_string(detail::streaming_bytes()) + "\n" + key;
}

void append_u64(std::string& bytes, uint64_t v) {
  bytes.append(reinterpret_cast<const char*>(&v), 8);
}

// Reads an entry's fields in order; each size is checked against what is left first.
class EntryReader {
 public:
  explicit EntryReader(std::string_view bytes) : rest_(bytes) {}
  std::optional<std::string_view> bytes(uint64_t n) {
    if (n > rest_.size()) return std::nullopt;
    const std::string_view out = rest_.substr(0, static_cast<std::size_t>(n));
    rest_.remove_prefix(static_cast<std::size_t>(n));
    return out;
  }
  std::optional<uint64_t> u64() {
    const std::optional<std::string_view> b = bytes(8);
    if (!b) return std::nullopt;
    uint64_t v = 0;
    std::memcpy(&v, b->data(), 8);
    return v;
  }
  std::string_view rest() const { return rest_; }

 private:
  std::string_view rest_;
};

// The bytes of cache entry `file` when it is a regular file of at most kMaxEntryBytes. Opened
// without following a symbolic link or waiting on a FIFO: a link, directory, FIFO or device is
// no entry.
std::optional<std::string> read_entry(const std::filesystem::path& file) {
  const detail::Fd f(::open(file.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat st {};
  if (f.fd < 0 || ::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) > kMaxEntryBytes)
    return std::nullopt;
  std::string bytes(static_cast<std::size_t>(st.st_size), '\0');
  for (std::size_t got = 0; got < bytes.size();) {
    const ssize_t r = ::read(f.fd, bytes.data() + got, bytes.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return std::nullopt;
    got += static_cast<std::size_t>(r);
  }
  return bytes;
}

// The value of `v`, or nullopt when it holds an error (dropped).
template <typename T>
std::optional<T> value_of(llvm::Expected<T> v) {
  if (v) return std::move(*v);
  llvm::consumeError(v.takeError());
  return std::nullopt;
}

using Elf = llvm::object::ELF64LE;

// Whether the symbols of symbol table `table` have names and sections within the file.
bool well_formed_symbols(const llvm::object::ELFFile<Elf>& file, const Elf::Shdr& table,
                         std::size_t sections) {
  const auto symbols = value_of(file.symbols(&table));
  const auto names = value_of(file.getStringTableForSymtab(table));
  if (!symbols || !names) return false;
  for (const Elf::Sym& sym : *symbols)
    if (!value_of(sym.getName(*names)) ||
        (sym.st_shndx < llvm::ELF::SHN_LORESERVE && sym.st_shndx >= sections))
      return false;
  return true;
}

// Whether the entries of relocation section `rela` patch a section of the file within its size
// and name symbols of its symbol table.
bool well_formed_relocations(const llvm::object::ELFFile<Elf>& file, const Elf::Shdr& rela,
                             llvm::ArrayRef<Elf::Shdr> sections) {
  const auto entries = value_of(file.relas(rela));
  if (!entries || rela.sh_info >= sections.size() || rela.sh_link >= sections.size()) return false;
  const Elf::Shdr& target = sections[rela.sh_info];
  for (const Elf::Rela& r : *entries)
    if (r.r_offset >= target.sh_size ||
        !value_of(file.getRelocationSymbol(r, &sections[rela.sh_link])))
      return false;
  return true;
}

// Whether `object` is a relocatable x86-64 ELF object whose sections, symbols and relocations
// all parse within its bounds: what the JIT linker reads of it. Read with ELFFile, whose every
// accessor reports an error (ObjectFile's iterators end the process on some).
bool well_formed_object(std::string_view object) {
  static_assert(sizeof(void*) == 8);
  auto file =
      value_of(llvm::object::ELFFile<Elf>::create(llvm::StringRef(object.data(), object.size())));
  if (!file) return false;
  const Elf::Ehdr& header = file->getHeader();
  if (!header.checkMagic() || header.getFileClass() != llvm::ELF::ELFCLASS64 ||
      header.getDataEncoding() != llvm::ELF::ELFDATA2LSB || header.e_type != llvm::ELF::ET_REL ||
      header.e_machine != llvm::ELF::EM_X86_64)
    return false;
  const auto sections = value_of(file->sections());
  if (!sections) return false;
  for (const Elf::Shdr& s : *sections) {
    if (!value_of(file->getSectionName(s)) ||
        (s.sh_type != llvm::ELF::SHT_NOBITS && !value_of(file->getSectionContents(s))) ||
        s.sh_type == llvm::ELF::SHT_REL ||  // x86-64 objects relocate with RELA only
        (s.sh_type == llvm::ELF::SHT_SYMTAB && !well_formed_symbols(*file, s, sections->size())) ||
        (s.sh_type == llvm::ELF::SHT_RELA && !well_formed_relocations(*file, s, *sections)))
      return false;
  }
  return true;
}

void write_cached(const std::filesystem::path& file, const std::string& key,
                  const std::vector<std::string>& objects) {
  try {
    std::filesystem::create_directories(file.parent_path());
    write_file(file, encode_cache_entry(key, objects));
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

// `name` as one file name inside a directory: characters other than [A-Za-z0-9_.-] and a leading
// dot become '_', so "../x" or "/abs" cannot leave the dump directory.
std::string file_name_of(const std::string& name) {
  std::string out = name.empty() ? "_" : name;
  for (char& c : out)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-') c = '_';
  if (out[0] == '.') out[0] = '_';
  return out;
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

// How many threads may compile one module: KILN_COMPILE_THREADS, else the cores this process
// may run on. Compiling happens once per signature, so it does not follow set_num_threads (nor
// do XLA's or PyTorch's compilers).
int compile_threads() {
  if (auto n = detail::parse_env_int("KILN_COMPILE_THREADS", std::getenv("KILN_COMPILE_THREADS"), 1,
                                     256))
    return static_cast<int>(*n);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (sched_getaffinity(0, sizeof cpus, &cpus) != 0) return 1;
  return std::max(1, CPU_COUNT(&cpus));
}

// A part smaller than this many instructions (before optimisation) is not worth a thread:
// LLVM spends about 75 µs per instruction of the MLP step's module here, a thread and its
// copy of the module about 1 ms.
constexpr unsigned kMinPartInstructions = 500;

// The module's kernels (its function definitions) dealt into at most `threads` parts of
// similar size, heaviest first to the lightest part: LLVM's time grows with the instructions.
std::vector<std::vector<std::string>> deal_kernels(const llvm::Module& m, int threads) {
  struct Kernel {
    std::string name;
    unsigned size;
  };
  std::vector<Kernel> kernels;
  unsigned total = 0;
  for (const llvm::Function& f : m)
    if (!f.isDeclaration()) {
      kernels.push_back({f.getName().str(), f.getInstructionCount()});
      total += kernels.back().size;
    }
  const std::size_t parts = std::max<std::size_t>(
      1, std::min<std::size_t>(
             {static_cast<std::size_t>(threads), kernels.size(), total / kMinPartInstructions}));
  std::stable_sort(kernels.begin(), kernels.end(),
                   [](const Kernel& a, const Kernel& b) { return a.size > b.size; });
  std::vector<std::vector<std::string>> names(parts);
  std::vector<unsigned> load(parts, 0);
  for (const Kernel& k : kernels) {
    const std::size_t p =
        static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    names[p].push_back(k.name);
    load[p] += k.size;
  }
  return names;
}

// Optimises the kernels named `keep` (the module's other definitions are dropped) and
// compiles them into an object file.
std::string compile_part(llvm::Module& m, const std::vector<std::string>& keep,
                         const std::string& dump_stem) {
  std::vector<llvm::Function*> dropped;
  for (llvm::Function& f : m)
    if (!f.isDeclaration() && std::find(keep.begin(), keep.end(), f.getName()) == keep.end())
      dropped.push_back(&f);
  for (llvm::Function* f : dropped) f->eraseFromParent();
  std::unique_ptr<llvm::TargetMachine> tm =
      unwrap(Jit::get().machine().createTargetMachine(), "create a target machine");
  optimise(m, *tm);
  std::string object = emit(m, *tm, llvm::CGFT_ObjectFile);
  if (const std::optional<std::filesystem::path> dir = env_dir("KILN_DUMP_DIR")) {
    dump(*dir, dump_stem, ".ll", module_text(m));
    dump(*dir, dump_stem, ".s", emit(m, *tm, llvm::CGFT_AssemblyFile));
  }
  return object;
}

// The module's objects: its kernels split into parts that compile at once on threads of their
// own, each in an LLVMContext of its own (a context is one thread's), which reads the module
// from bitcode written here, as LLVM's LTO splits its code generation.
std::vector<std::string> compile_in_parts(llvm::Module& m, const std::string& stem, int threads) {
  m.setDataLayout(Jit::get().lljit().getDataLayout());
  m.setTargetTriple(Jit::get().lljit().getTargetTriple().str());
  std::string problems;
  llvm::raw_string_ostream problems_os(problems);
  if (llvm::verifyModule(m, &problems_os))
    fail("jit", "generated LLVM IR for ", stem, " does not verify: ", problems);
  const std::vector<std::vector<std::string>> parts = deal_kernels(m, threads);
  if (parts.size() == 1) return {compile_part(m, parts[0], stem)};

  llvm::SmallVector<char, 0> bitcode;
  llvm::raw_svector_ostream bitcode_os(bitcode);
  llvm::WriteBitcodeToFile(m, bitcode_os);
  const llvm::StringRef bitcode_ref(bitcode.data(), bitcode.size());
  auto part_stem = [&](std::size_t p) { return stem + "-part" + std::to_string(p); };
  std::vector<std::future<std::string>> others;
  for (std::size_t p = 1; p < parts.size(); ++p)
    others.push_back(std::async(std::launch::async, [&, p] {
      llvm::LLVMContext context;
      std::unique_ptr<llvm::Module> copy =
          unwrap(llvm::parseBitcodeFile(llvm::MemoryBufferRef(bitcode_ref, stem), context),
                 "read back a module's bitcode");
      return compile_part(*copy, parts[p], part_stem(p));
    }));
  std::vector<std::string> objects;
  objects.push_back(compile_part(m, parts[0], part_stem(0)));
  for (std::future<std::string>& o : others) objects.push_back(o.get());
  return objects;
}

}  // namespace

std::size_t live_native_code() { return g_live_code.load(); }

const HostCpu& host_cpu() {
  static const HostCpu h = detect_host();
  return h;
}

std::string encode_cache_entry(const std::string& key, const std::vector<std::string>& objects) {
  std::string payload;
  append_u64(payload, objects.size());
  for (const std::string& o : objects) append_u64(payload, o.size());
  for (const std::string& o : objects) payload += o;
  std::string bytes(kMagic, sizeof kMagic);
  append_u64(bytes, key.size());
  bytes += key;
  append_u64(bytes, payload.size());
  const Digest sum = sha256(payload);
  bytes.append(reinterpret_cast<const char*>(sum.data()), 32);
  return bytes + payload;
}

std::optional<std::vector<std::string>> decode_cache_entry(std::string_view entry,
                                                           const std::string& key) {
  EntryReader in(entry);
  const auto magic = in.bytes(sizeof kMagic);
  if (!magic || std::memcmp(magic->data(), kMagic, sizeof kMagic) != 0) return std::nullopt;
  const auto key_size = in.u64();
  if (!key_size || in.bytes(*key_size) != std::optional<std::string_view>(key)) return std::nullopt;
  const auto payload_size = in.u64();
  const auto sum = in.bytes(32);
  if (!payload_size || !sum || *payload_size != in.rest().size()) return std::nullopt;
  const Digest want = sha256(llvm::StringRef(in.rest().data(), in.rest().size()));
  if (std::memcmp(sum->data(), want.data(), 32) != 0) return std::nullopt;
  const auto count = in.u64();
  if (!count || *count == 0 || *count > in.rest().size() / 8) return std::nullopt;
  std::vector<uint64_t> sizes;
  for (uint64_t i = 0; i < *count; ++i) sizes.push_back(*in.u64());
  std::vector<std::string> objects;
  for (uint64_t size : sizes) {
    const auto object = in.bytes(size);
    if (!object) return std::nullopt;
    // A copy of its own, aligned as the ELF reader needs (the entry places it at any offset).
    objects.emplace_back(*object);
    if (!well_formed_object(objects.back())) return std::nullopt;
  }
  if (!in.rest().empty()) return std::nullopt;
  return objects;
}

std::string cache_key(const std::string& key) { return full_key(key); }

namespace {

// `objects` loaded into a JITDylib of their own, and the addresses of `functions`; an Error
// when LLVM cannot link them or one of the functions is missing.
NativeResult load(const std::vector<std::string>& objects, const std::string& stem,
                  std::span<const std::string> functions) {
  Jit& jit = Jit::get();
  static std::atomic<uint64_t> counter{0};
  llvm::orc::JITDylib& dylib = jit.new_dylib("kiln" + std::to_string(counter++));
  NativeResult result;
  result.code = std::make_unique<LoadedObject>(dylib);
  for (const std::string& object : objects) {
    auto buffer = llvm::MemoryBuffer::getMemBufferCopy(object, stem);
    if (llvm::Error e = jit.lljit().addObjectFile(dylib, std::move(buffer)))
      fail("jit", "LLVM failed to load the compiled object for ", stem, ": ",
           llvm_error(std::move(e)));
  }
  for (const std::string& f : functions) {
    auto address = jit.lljit().lookup(dylib, f);
    result.functions.push_back(
        unwrap(std::move(address), "find the compiled kernel " + f).toPtr<void*>());
  }
  return result;
}

}  // namespace

NativeResult build_native(const std::string& name, const std::string& key,
                          std::span<const std::string> functions, const ModuleBuilder& build) {
  const std::string full = full_key(key);
  const Digest digest = sha256(full);
  const std::optional<std::filesystem::path> cache_dir = env_dir("KILN_CACHE_DIR");
  const std::string stem = file_name_of(name) + "-" + hex(digest).substr(0, 16);
  std::optional<std::filesystem::path> cache_file;
  if (cache_dir) cache_file = *cache_dir / (hex(digest) + ".o");

  if (cache_file)
    if (const std::optional<std::string> entry = read_entry(*cache_file))
      if (const auto objects = decode_cache_entry(*entry, full)) {
        // An entry that passed every check but still does not link is rebuilt too.
        try {
          NativeResult cached = load(*objects, stem, functions);
          cached.from_cache = true;
          return cached;
        } catch (const Error&) {
        }
      }
  const auto start = std::chrono::steady_clock::now();
  llvm::LLVMContext context;
  std::unique_ptr<llvm::Module> m = build(context);
  const std::vector<std::string> objects = compile_in_parts(*m, stem, compile_threads());
  const double optimise_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (cache_file) write_cached(*cache_file, full, objects);
  NativeResult result = load(objects, stem, functions);
  result.optimise_ms = optimise_ms;
  return result;
}

}  // namespace kiln::compiler
