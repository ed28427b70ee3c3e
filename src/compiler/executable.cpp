#include "compiler/executable.h"

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_map>

#include "compiler/channel_blocks.h"
#include "compiler/codegen.h"
#include "compiler/fusion.h"
#include "compiler/loops.h"
#include "compiler/orc.h"
#include "compiler/plan.h"
#include "compiler/thin_products.h"
#include "core/builtins.h"
#include "core/profiling.h"
#include "detail/checked.h"
#include "detail/copy.h"
#include "detail/operand_cache.h"
#include "detail/parallel.h"
#include "ir/compiled_bodies.h"
#include "ir/trace.h"
#include "ops/conv_dnnl.h"
#include "ops/pool_blocked.h"

namespace kiln::compiler {
namespace {

using ir::CompiledInfo;

using SubFunctions = ir::CompiledBodies;  // every entry is a CompiledFunction, so a Code

// Arena slots are 64-byte aligned, as tensor storage is (src/core/allocator.cpp).
constexpr int64_t kSlotAlignment = 64;

std::size_t bytes_of(const TensorType& t) {
  return static_cast<std::size_t>(detail::checked_mul("jit", t.shape.numel(), dtype_size(t.dtype)));
}

const char* level_name(Level l) {
  static constexpr const char* names[] = {"inner", "outer", "total"};
  return names[static_cast<int>(l)];
}

// A text that determines a group's kernel: the compile cache's key and the inspection dump.
void describe(std::ostream& os, const Group& g) {
  os << "group domain=[";
  for (std::size_t a = 0; a < g.domain.size(); ++a)
    os << (a ? "," : "") << g.domain[a] << (g.reduced[a] ? "r" : "");
  os << "] inputs=" << g.inputs.size() << "\n";
  for (std::size_t k = 0; k < g.nodes.size(); ++k) {
    const Node& n = g.nodes[k];
    os << "  n" << k << " " << level_name(n.level) << " " << dtype_name(n.dtype) << " ";
    if (n.kind == Node::Kind::load) {
      os << "load in" << n.input << " @" << n.access.offset << " [";
      for (std::size_t a = 0; a < n.access.strides.size(); ++a)
        os << (a ? "," : "") << n.access.strides[a];
      os << "]";
    } else {
      os << n.prim->name;
      for (const auto& [name, attr] : n.attrs.items()) {
        os << " " << name << "=";
        if (const auto* d = std::get_if<DType>(&attr)) os << dtype_name(*d);
        if (const auto* v = std::get_if<std::vector<int64_t>>(&attr))
          for (int64_t x : *v) os << x << ",";
      }
      for (int a : n.args) os << " n" << a;
      if (n.kind == Node::Kind::total) {
        os << " slots=";
        for (int64_t a : n.slots_over) os << a << ",";
      }
    }
    os << "\n";
  }
  for (const GroupOutput& o : g.outputs)
    os << "  out n" << o.node << " " << level_name(o.level) << "\n";
}

// Whether every read of group input `in` is at the very element the group's inner outputs
// write (offset 0, the domain's row-major strides, inner level): then lane k of a vector step
// and each scalar tail step read and write the same element, and threads own disjoint ones.
bool read_elementwise(const Group& g, int in) {
  std::vector<int64_t> contiguous(g.domain.size());
  int64_t stride = 1;
  for (std::size_t a = g.domain.size(); a-- > 0;) {
    contiguous[a] = stride;
    stride *= g.domain[a];
  }
  for (const Node& n : g.nodes) {
    if (n.kind != Node::Kind::load || n.input != in) continue;
    if (n.level != Level::inner || n.access.offset != 0) return false;
    for (std::size_t a = 0; a < g.domain.size(); ++a)
      if (g.domain[a] != 1 && n.access.strides[a] != contiguous[a]) return false;
  }
  return true;
}

// Whether inner output q may overwrite input `in` element by element. A group stores its
// inner outputs in passes (one for an elementwise group; Group::rounds for a reduction group):
// output q is stored in the pass of its round, after that pass's reductions have accumulated,
// with the outputs in order, each loading an input on first use (codegen.cpp). So no later pass
// may read `in`, and within q's pass every read of `in` that a later output needs must already
// have happened. Outer nodes are computed between passes and read no inner loads.
bool loads_precede_store(const Group& g, std::size_t q, int in) {
  const std::vector<int> round = g.rounds();
  auto round_of = [&](std::size_t o) { return round[static_cast<std::size_t>(g.outputs[o].node)]; };
  const int pass = round_of(q);  // q is stored where the reductions of round pass + 1 run
  auto reach = [&](const std::vector<int>& from) {
    std::vector<bool> seen(g.nodes.size(), false);
    std::vector<int> stack = from;
    while (!stack.empty()) {
      const auto k = static_cast<std::size_t>(stack.back());
      stack.pop_back();
      if (seen[k] || g.nodes[k].level == Level::outer) continue;
      seen[k] = true;
      for (int a : g.nodes[k].args) stack.push_back(a);
    }
    return seen;
  };
  std::vector<int> before, after, later;  // read in q's pass before and after its store; later
  // A total of an inner node adds it up in the pass of a reduction one round after it, before
  // that pass's stores (codegen.cpp), so it reads where such a reduction does.
  for (std::size_t k = 0; k < g.nodes.size(); ++k) {
    const Node& n = g.nodes[k];
    const auto operand = static_cast<std::size_t>(n.args.empty() ? 0 : n.args[0]);
    int reads_in;  // the round of reductions in whose pass node k reads its operand
    if (n.kind == Node::Kind::reduce) {
      reads_in = round[k];
    } else if (n.kind == Node::Kind::total && g.nodes[operand].level == Level::inner) {
      reads_in = round[operand] + 1;
    } else {
      continue;
    }
    if (reads_in == pass + 1) before.push_back(static_cast<int>(operand));
    if (reads_in > pass + 1) later.push_back(static_cast<int>(operand));
  }
  for (std::size_t o = 0; o < g.outputs.size(); ++o) {
    if (g.outputs[o].level != Level::inner || round_of(o) < pass) continue;
    const int node = g.outputs[o].node;
    (round_of(o) > pass ? later : o <= q ? before : after).push_back(node);
  }
  const std::vector<bool> early = reach(before), late = reach(after), next = reach(later);
  for (std::size_t k = 0; k < g.nodes.size(); ++k)
    if (g.nodes[k].kind == Node::Kind::load && g.nodes[k].input == in &&
        (next[k] || (late[k] && !early[k])))
      return false;
  return true;
}

// The native kernels of one compiled program. Each of its functions (the top level, loop
// bodies, branches) adds its groups' kernels, a kernel text once, and one module holds them
// all: a kernel that several functions share (the loops of a generation over spans, a branch
// and its caller) compiles once.
class ProgramKernels {
 public:
  // The index of the kernel of group g, described by `text`; g must outlive build().
  std::size_t add(const std::string& text, const Group& g) {
    const auto [it, fresh] = index_.emplace(text, groups_.size());
    if (fresh) {
      groups_.push_back(&g);
      key_ += text;
    }
    return it->second;
  }
  // Compiles the kernels added (or loads them from KILN_CACHE_DIR), into a module named after
  // the program's top-level function.
  void build(const std::string& name) {
    if (groups_.empty()) return;
    std::vector<std::string> names;
    for (std::size_t k = 0; k < groups_.size(); ++k)
      names.push_back("kiln_group" + std::to_string(k));
    NativeResult native = build_native(name, key_, names, [&](llvm::LLVMContext& c) {
      auto m = std::make_unique<llvm::Module>(name, c);
      for (std::size_t k = 0; k < groups_.size(); ++k) emit_group(*m, *groups_[k], names[k]);
      return m;
    });
    code_ = std::move(native.code);
    functions_ = std::move(native.functions);
    from_cache_ = native.from_cache;
  }
  KernelFn function(std::size_t k) const { return reinterpret_cast<KernelFn>(functions_[k]); }
  const std::shared_ptr<NativeCode>& code() const { return code_; }
  bool from_cache() const { return from_cache_; }

 private:
  std::map<std::string, std::size_t> index_;
  std::vector<const Group*> groups_;  // the group each kernel is emitted from
  std::string key_;
  std::shared_ptr<NativeCode> code_;
  std::vector<void*> functions_;
  bool from_cache_ = false;
};

// One step of the plan as the runtime walks it.
struct GroupStep {
  Group group;
  std::size_t kernel_index = 0;  // in its program's kernels
  KernelFn kernel = nullptr;
  int64_t range = 0, cost = 1;
  std::vector<Group::TotalSlot> totals;  // group.totals(), and the doubles they take per call
  int64_t total_doubles = 0;
};
struct OpaqueStep {
  int equation = -1;
  std::vector<TensorType> out_types;  // its outputs' types, which its kernel must return
  std::vector<DType> in_dtypes;       // its inputs' dtypes, which choose its kernel
  // The value its primitive may write its result over (Primitive::in_place): an input that this
  // step reads last, that is no argument's view, constant or result, and that no other input
  // of the step shares memory with.
  std::optional<int> overwrites;
  // Its operands that are stored channel-blocked (Primitive::ChannelBlocked), if any.
  std::optional<Primitive::ChannelBlocked::Call> blocked;
};

// Where a value's memory is while a call runs.
struct Slot {
  std::optional<std::size_t> arena_offset;  // an arena slot; else a Tensor of its own
  // A kernel's output that dies in the group computing this value, whose buffer the value
  // takes when the run finds no other reference to it.
  std::optional<int> reuses;
  // A kernel's output that a group may take over: bound under a TensorImpl of its own, so
  // that the count of its storage's owners tells whether anything else holds it.
  bool sole_owner = false;
};

// How the steps use a value.
struct Use {
  enum class Maker { other, group, kernel };  // other: an argument, a constant or a view
  Maker made_by = Maker::other;
  bool escapes = false;     // a kernel reads it or the caller receives it
  std::size_t defined = 0;  // the step that makes it
  // The last step that reads it: `defined` when none does, one past the last step for a result.
  std::size_t last_use = 0;
  // Only fused kernels read it: an arena slot holds it.
  bool in_arena() const { return made_by == Maker::group && !escapes; }
};

class CompiledFunction final : public Code {
 public:
  // `subs`: the compiled sub-functions of the whole program, owned by its top-level function
  // (`owned`), which outlives every run of the others. The function's kernels are added to
  // `kernels`, and it runs once link() has given it their code.
  CompiledFunction(std::shared_ptr<const ir::Function> f, const SubFunctions* subs,
                   ProgramKernels& kernels, std::unique_ptr<const SubFunctions> owned = nullptr)
      : f_(std::move(f)),
        owned_subs_(std::move(owned)),
        subs_(owned_subs_ ? owned_subs_.get() : subs) {
    const auto start = std::chrono::steady_clock::now();
    profile_id_ = detail::next_profile_id();
    Partition p = partition(*f_);
    const ChannelBlocks blocks = block_channels(*f_, p, ops::dnnl_channel_block());
    for (std::size_t v = 0; v < blocks.blocked.size(); ++v)
      if (blocks.blocked[v]) info_.channel_blocked.push_back(static_cast<int>(v));
    views_ = std::move(p.views);
    // Groups with the same description compute the same way (an unrolled loop's steps, equal
    // layers, the same layer in two loop bodies): one function serves them all, so LLVM
    // compiles each distinct kernel of the program once.
    for (Step& s : p.steps) {
      if (auto* g = std::get_if<Group>(&s)) {
        std::ostringstream text;
        describe(text, *g);
        info_.groups.push_back({.equations = g->equations, .kernel = text.str()});
        GroupStep gs{.group = std::move(*g)};
        gs.range = kernel_range(gs.group);
        gs.cost = kernel_cost(gs.group);
        gs.totals = gs.group.totals();
        gs.total_doubles = gs.group.total_doubles();
        steps_.emplace_back(std::move(gs));
      } else {
        const int eq = std::get<Opaque>(s).equation;
        const ir::Equation& e = f_->equations[static_cast<std::size_t>(eq)];
        OpaqueStep os{.equation = eq};
        for (const ir::Value& v : e.outputs) os.out_types.push_back(v.type);
        for (const ir::Value& v : e.inputs) os.in_dtypes.push_back(v.type.dtype);
        os.blocked = blocked_call(e, blocks);
        steps_.emplace_back(std::move(os));
        info_.kernel_calls.push_back(eq);
      }
    }
    // steps_ is complete: its groups stay where they are until the program is built.
    std::set<std::size_t> distinct;
    std::size_t k = 0;
    for (auto& s : steps_)
      if (auto* g = std::get_if<GroupStep>(&s)) {
        g->kernel_index = kernels.add(info_.groups[k++].kernel, g->group);
        distinct.insert(g->kernel_index);
      }
    lay_out_memory();
    for (const ir::Constant& c : f_->constants) constants_.push_back(c.tensor.contiguous());
    info_.backend = ir::Backend::llvm;
    info_.arena_bytes = static_cast<int64_t>(arena_bytes_);
    info_.kernels = static_cast<int64_t>(distinct.size());
    k = 0;
    for (const auto& s : steps_)
      if (const auto* g = std::get_if<GroupStep>(&s)) {
        CompiledInfo::Group& gi = info_.groups[k++];
        for (int v : g->group.inputs)
          gi.bytes_read +=
              static_cast<int64_t>(bytes_of(value_types_[static_cast<std::size_t>(v)]));
        for (const GroupOutput& o : g->group.outputs)
          gi.bytes_written +=
              static_cast<int64_t>(bytes_of(value_types_[static_cast<std::size_t>(o.value)]));
      }
    info_.compile_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  }

  // Takes the kernels' code once the program is built; `compile_ms` includes the build when the
  // function is the program's top level.
  void link(const ProgramKernels& kernels, std::optional<double> compile_ms) {
    for (auto& s : steps_)
      if (auto* g = std::get_if<GroupStep>(&s)) g->kernel = kernels.function(g->kernel_index);
    code_ = kernels.code();
    info_.from_cache = kernels.from_cache();
    if (compile_ms) info_.compile_ms = *compile_ms;
  }

  const ir::CompiledInfo& info() const override { return info_; }

  std::vector<Tensor> run(std::span<const Tensor> args) const override {
    check_argument_count(args);
    return execute(args, {}, {}, nullptr);
  }

  std::unique_ptr<Calls> calls(std::size_t first_fixed) const override {
    return std::make_unique<Series>(*this, first_fixed);
  }

  const std::vector<std::size_t>& updates_in_place() const override { return updates_in_place_; }

 private:
  // What a call works in, kept between calls (one per concurrent call): the arena, and per
  // value its tensor, its data and its storage's holders.
  struct Frame {
    Tensor memory;
    char* arena = nullptr;
    std::vector<Tensor> env;
    std::vector<char*> data;
    std::vector<long> owners;
    std::vector<char*> buffers;  // a group step's inputs and outputs
    std::vector<Tensor> ins;     // a kernel step's inputs, cleared after it
    std::vector<Tensor> views;   // per value read as a view by a kernel, its TensorImpl
    // Per step, the kernel a kernel step chose and when (refreshed when the registry's kernel
    // version moves).
    std::vector<kiln::detail::KernelChoice> choices;
  };
  // What a series of calls keeps between them: a frame in which, after the first call, the
  // fixed arguments and the constants stay bound (`kept`, per value), and those arguments'
  // storages. A step then neither takes a frame from the pool nor clears it, nor checks and
  // binds its captures again (a loop over a model's weights has dozens). A call that threw
  // (`unfinished`) leaves its frame half filled: the next call, or the series' end, drops it.
  struct Held {
    Frame frame;
    std::size_t first_fixed = 0;
    bool bound = false;
    bool unfinished = false;
    std::vector<bool> kept;
    std::vector<const Storage*> fixed_storages;
  };
  class Series final : public Calls {
   public:
    Series(const CompiledFunction& fn, std::size_t first_fixed) : fn_(fn) {
      held_.frame = fn.take_frame();
      held_.first_fixed = std::min(first_fixed, fn.f_->params.size());
      held_.kept.assign(fn.value_types_.size(), false);
      for (std::size_t i = held_.first_fixed; i < fn.f_->params.size(); ++i)
        held_.kept[static_cast<std::size_t>(fn.f_->params[i].id)] = true;
      for (const ir::Constant& c : fn.f_->constants)
        held_.kept[static_cast<std::size_t>(c.value.id)] = true;
    }
    ~Series() override {
      if (!held_.unfinished) fn_.give_back(std::move(held_.frame));
    }
    Series(const Series&) = delete;
    Series& operator=(const Series&) = delete;
    void run_into(std::span<const Tensor> args, std::span<const Tensor> dests) override {
      fn_.run_into(args, dests, held_);
    }

   private:
    const CompiledFunction& fn_;
    Held held_;
  };

  void check_argument_count(std::span<const Tensor> args) const {
    if (args.size() != f_->params.size())
      fail("jit", "@", f_->name, " takes ", f_->params.size(), " arguments: got ", args.size(),
           ", expected ", f_->params.size());
  }

  void run_into(std::span<const Tensor> args, std::span<const Tensor> dests, Held& held) const {
    const ir::Function& f = *f_;
    check_argument_count(args);
    if (dests.size() != f.results.size())
      fail("jit", "@", f.name, " returns ", f.results.size(), " results: got ", dests.size(),
           " destinations, expected ", f.results.size());
    for (std::size_t i = 0; i < dests.size(); ++i)
      if (dests[i].type() != f.results[i].type || !dests[i].is_contiguous())
        fail("jit", "@", f.name, " result ", i, " cannot be written to its destination: got ",
             dests[i].type(), ", expected a contiguous ", f.results[i].type);
    // The arguments the caller donates (updates_in_place): passed as their result's
    // destination too, and sharing their memory with no other argument.
    std::vector<const Storage*> storages;  // the arguments' memory, when any may be donated
    if (!updates_in_place_.empty()) {
      const std::size_t fixed = held.bound ? held.first_fixed : args.size();
      for (std::size_t i = 0; i < fixed; ++i) storages.push_back(args[i].storage().get());
      if (!held.bound)
        held.fixed_storages.assign(storages.begin() + held.first_fixed, storages.end());
      storages.insert(storages.end(), held.fixed_storages.begin(), held.fixed_storages.end());
    }
    auto shared = [&](std::size_t i) {
      return std::count(storages.begin(), storages.end(), storages[i]) > 1;
    };
    std::vector<bool> donated(dests.size(), false);
    for (std::size_t i : updates_in_place_)
      donated[i] = dests[i].storage() == args[i].storage() &&
                   dests[i].raw_data() == args[i].raw_data() && !shared(i);
    const std::vector<Tensor> results = execute(args, dests, donated, &held);
    // A donated argument's destination (its in-place write refused) is filled last: a result
    // that is that argument itself, a kernel's output passing it through, must be copied out
    // before the argument's new value lands over it.
    for (const bool last : {false, true})
      for (std::size_t i = 0; i < results.size(); ++i)
        if (donated[i] == last && results[i].raw_data() != dests[i].raw_data())
          detail::copy_cast(results[i], dests[i]);
  }

  // Runs f; a fused output that is result i is written into dests[i] when given, and kernels
  // may write over argument i in place where donated[i] (run_into). In a series (`held`) the
  // fixed arguments and the constants are bound at its first call only.
  std::vector<Tensor> execute(std::span<const Tensor> args, std::span<const Tensor> dests,
                              const std::vector<bool>& donated, Held* held) const {
    using Clock = std::chrono::steady_clock;
    const bool profiling = detail::profiling();
    kiln::detail::apply_flush_denormal();  // for steps that run no parallel region or bind
    const Clock::time_point call_start = profiling ? Clock::now() : Clock::time_point{};
    double in_steps = 0;
    const ir::Function& f = *f_;
    const ir::ActiveCompiledBodies active(subs_);
    kiln::detail::OperandCacheScope operand_copies;
    Frame own;
    if (!held) {
      own = take_frame();
    } else if (held->unfinished) {
      held->frame = take_frame();
      held->bound = false;
    }
    if (held) held->unfinished = true;
    Frame& frame = held ? held->frame : own;
    const bool bind_all = !held || !held->bound;
    std::vector<Tensor>& env = frame.env;
    std::vector<char*>& data = frame.data;
    auto bind_value = [&](int id, Tensor t) {
      data[static_cast<std::size_t>(id)] = static_cast<char*>(t.raw_data());
      env[static_cast<std::size_t>(id)] = std::move(t);
    };
    for (std::size_t i = 0; i < (bind_all ? args.size() : held->first_fixed); ++i) {
      if (args[i].type() != f.params[i].type)
        fail("jit", "@", f.name, " argument ", i, " has the wrong type: got ", args[i].type(),
             ", expected ", f.params[i].type);
      bind_value(f.params[i].id, args[i].contiguous());
    }
    // Per value, how many holders its storage has while it is this call's alone: one (its
    // TensorImpl in env) for what the call made; for an argument the caller donated, the
    // holders it had when the call began, the caller's included; and for what is written in
    // place over one of those, the same. More holders at a kernel call in place means something
    // else (a view, a kernel's output) shares it.
    std::vector<long>& owners = frame.owners;
    std::fill(owners.begin(), owners.end(), 1);
    for (std::size_t i = 0; i < donated.size(); ++i)
      if (donated[i]) {
        const auto v = static_cast<std::size_t>(f.params[i].id);
        env[v] = Tensor(std::make_shared<TensorImpl>(*env[v].impl()));
        owners[v] = env[v].storage().use_count();
      }
    if (bind_all)
      for (std::size_t i = 0; i < constants_.size(); ++i)
        bind_value(f.constants[i].value.id, constants_[i]);

    std::vector<char*>& buffers = frame.buffers;
    for (std::size_t s = 0; s < steps_.size(); ++s) {
      const Clock::time_point step_start = profiling ? Clock::now() : Clock::time_point{};
      if (const auto* g = std::get_if<GroupStep>(&steps_[s])) {
        buffers.clear();
        for (int v : g->group.inputs) buffers.push_back(data[static_cast<std::size_t>(v)]);
        for (const GroupOutput& o : g->group.outputs) {
          const auto& slot = slots_[static_cast<std::size_t>(o.value)];
          if (slot.arena_offset) {
            data[static_cast<std::size_t>(o.value)] = frame.arena + *slot.arena_offset;
          } else if (const Tensor* d = destination(o.value, dests)) {
            bind_value(o.value, *d);
          } else {
            bind_value(o.value, own_buffer(o.value, slot.reuses, env));
          }
          buffers.push_back(data[static_cast<std::size_t>(o.value)]);
        }
        char* const* b = buffers.data();
        const KernelFn k = g->kernel;
        const int64_t chunks = detail::parallel_chunks(g->range, g->cost);
        const int64_t slots = g->total_doubles;
        std::vector<double> partial(static_cast<std::size_t>(
            detail::checked_mul("jit", std::max<int64_t>(chunks, 1), slots)));
        double* p = partial.data();
        detail::run_chunks(g->range, chunks,
                           [&](int64_t c, int64_t lo, int64_t hi) { k(b, lo, hi, p + c * slots); });
        if (slots) finish_totals(*g, partial, std::max<int64_t>(chunks, 1), buffers);
      } else {
        const OpaqueStep& step = std::get<OpaqueStep>(steps_[s]);
        const ir::Equation& e = f.equations[static_cast<std::size_t>(step.equation)];
        kiln::detail::KernelChoice& choice = frame.choices[s];
        if (choice.version != kiln::detail::kernel_version())
          choice = kiln::detail::choose_kernel(*e.prim, step.in_dtypes);
        // Over its input in place when nothing but this call holds that input's memory.
        std::optional<Tensor> target;
        if (step.overwrites && choice.builtin_only) {  // no kernel added over the in-place one
          const auto v = static_cast<std::size_t>(*step.overwrites);
          const Tensor& x = env[v];
          operand_copies.forget(x);  // read last here: a copy would only block the write
          // A series' fixed argument stays bound for its next call: never written over, even
          // where the call made it contiguous and so holds the only reference.
          if (x.impl_ptr().use_count() == 1 && x.storage().use_count() == owners[v] &&
              !(held && held->kept[v])) {
            target = x;
            owners[static_cast<std::size_t>(e.outputs[0].id)] = owners[v];
          }
        }
        std::vector<Tensor>& ins = frame.ins;
        for (const ir::Value& v : e.inputs) ins.push_back(input_of(v.id, frame));
        std::vector<Tensor> outs;
        // A user's kernel may refill a buffer it keeps between two convolutions: no copies.
        std::optional<kiln::detail::OperandCacheOff> no_copies;
        if (!choice.builtin_code) no_copies.emplace();
        try {
          if (target) {
            e.prim->in_place->write(ins, *target, e.attrs);
            outs.push_back(*target);
          } else if (step.blocked) {
            outs = run_blocked(e, step, choice.builtin_only, ins);
          } else {
            outs = loops::drives(*e.prim) ? loops::run(e, ins)
                   : choice.kernel
                       ? kiln::detail::run_chosen(*e.prim, *choice.kernel, ins, e.attrs,
                                                  step.out_types, Loc{})
                       : kiln::detail::run_kernel(*e.prim, ins, e.attrs, step.out_types, Loc{});
          }
        } catch (const Error& err) {
          kiln::detail::rethrow_at(err, e.loc);
        }
        ins.clear();  // so that later in-place checks count only env's holders
        release_views(e, frame);
        // ... and may return a buffer it keeps and refills: forget the copies of an earlier fill.
        if (no_copies)
          for (const Tensor& t : outs) operand_copies.forget(t);
        for (std::size_t k = 0; k < outs.size(); ++k) {
          Tensor t = outs[k].is_contiguous() ? std::move(outs[k]) : outs[k].contiguous();
          // A TensorImpl that the kernel keeps too would hide its hold on the storage.
          if (slots_[static_cast<std::size_t>(e.outputs[k].id)].sole_owner &&
              t.impl_ptr().use_count() > 1)
            t = Tensor(std::make_shared<TensorImpl>(*t.impl()));
          bind_value(e.outputs[k].id, std::move(t));
        }
      }
      if (profiling) {
        const double seconds = std::chrono::duration<double>(Clock::now() - step_start).count();
        in_steps += seconds;
        detail::record_step(profile_id_, static_cast<int>(s), seconds,
                            [&] { return describe_step(s); });
      }
      for (int v : release_after_[s])
        if (!held || !held->kept[static_cast<std::size_t>(v)])
          env[static_cast<std::size_t>(v)] = Tensor();
      operand_copies.drop_unheld();
    }
    std::vector<Tensor> results;
    for (const ir::Value& v : f.results) results.push_back(tensor_of(v.id, env));
    if (held) {
      for (std::size_t v = 0; v < env.size(); ++v)
        if (!held->kept[v]) env[v] = Tensor();
      held->bound = true;
      held->unfinished = false;
    } else {
      give_back(std::move(own));
    }
    if (profiling)
      detail::record_step(
          profile_id_, -1,
          std::chrono::duration<double>(Clock::now() - call_start).count() - in_steps, [&] {
            return ProfileRow{.function = f.name,
                              .what = "outside the steps: arguments, memory, results"};
          });
    return results;
  }

  // Step s as a profile row (kiln/profile.h) without its timing.
  ProfileRow describe_step(std::size_t s) const {
    ProfileRow row{.function = f_->name};
    auto add_bytes = [&](int v) {
      row.bytes += static_cast<double>(bytes_of(value_types_[static_cast<std::size_t>(v)]));
    };
    std::ostringstream what;
    if (const auto* g = std::get_if<GroupStep>(&steps_[s])) {
      row.fused = true;
      std::vector<std::string_view> names;
      for (const Node& n : g->group.nodes)
        if (n.prim && std::find(names.begin(), names.end(), n.prim->name) == names.end())
          names.push_back(n.prim->name);
      for (std::size_t i = 0; i < names.size(); ++i) what << (i ? "," : "") << names[i];
      what << " [";
      for (std::size_t a = 0; a < g->group.domain.size(); ++a)
        what << (a ? "," : "") << g->group.domain[a];
      what << "]";
      for (int v : g->group.inputs) add_bytes(v);
      for (const GroupOutput& o : g->group.outputs) add_bytes(o.value);
    } else {
      const ir::Equation& e =
          f_->equations[static_cast<std::size_t>(std::get<OpaqueStep>(steps_[s]).equation)];
      std::vector<TensorType> ins, outs;
      what << e.prim->name;
      for (const ir::Value& v : e.inputs) {
        what << (ins.empty() ? " " : ", ") << v.type;
        ins.push_back(v.type);
        add_bytes(v.id);
      }
      what << " ->";
      for (const ir::Value& v : e.outputs) {
        what << " " << v.type;
        outs.push_back(v.type);
        add_bytes(v.id);
      }
      if (e.prim->flops) row.flops = e.prim->flops(ins, outs, e.attrs);
    }
    row.what = what.str();
    return row;
  }

  // Adds the kernel calls' partial sums of each total in chunk order (deterministic for a
  // given thread count) and stores them in the total's outputs.
  static void finish_totals(const GroupStep& step, const std::vector<double>& partial,
                            int64_t chunks, const std::vector<char*>& buffers) {
    const Group& g = step.group;
    const auto slots = static_cast<std::size_t>(step.total_doubles);
    for (const Group::TotalSlot& t : step.totals)
      for (std::size_t q = 0; q < g.outputs.size(); ++q) {
        if (g.outputs[q].node != t.node) continue;
        char* out = buffers[g.inputs.size() + q];
        const bool f64 = g.nodes[static_cast<std::size_t>(t.node)].dtype == float64;
        for (int64_t j = 0; j < t.size; ++j) {
          double sum = 0;
          for (int64_t c = 0; c < chunks; ++c)
            sum += partial[static_cast<std::size_t>(c) * slots +
                           static_cast<std::size_t>(t.offset + j)];
          if (f64) {
            reinterpret_cast<double*>(out)[j] = sum;
          } else {
            reinterpret_cast<float*>(out)[j] = static_cast<float>(sum);
          }
        }
      }
  }

  // A step with channel-blocked operands: its rule's kernel while only the built-in kernels are
  // registered (`builtin_only`), or, where a user's kernel has replaced them since the plan was
  // made, that kernel on plain copies.
  static std::vector<Tensor> run_blocked(const ir::Equation& e, const OpaqueStep& step,
                                         bool builtin_only, std::vector<Tensor>& ins) {
    const Primitive::ChannelBlocked::Call& call = *step.blocked;
    if (builtin_only) {
      std::vector<Tensor> outs{empty(step.out_types[0])};
      e.prim->channel_blocked->write(ins, call, outs[0], e.attrs);
      return outs;
    }
    auto relayout = [&](const Tensor& t, ops::Layout to) {
      Tensor out = empty(t.type());
      ops::relayout_images(t.shape(), call.block, to, t.contiguous().data<const float>(),
                           out.data<float>());
      return out;
    };
    for (const int i : call.inputs)
      ins[static_cast<std::size_t>(i)] =
          relayout(ins[static_cast<std::size_t>(i)], ops::Layout::plain);
    std::vector<Tensor> outs =
        kiln::detail::run_kernel(*e.prim, ins, e.attrs, step.out_types, Loc{});
    if (call.output) outs[0] = relayout(outs[0], ops::Layout::blocked);
    return outs;
  }

  // Which of e's operands are stored blocked, when any is.
  static std::optional<Primitive::ChannelBlocked::Call> blocked_call(const ir::Equation& e,
                                                                     const ChannelBlocks& blocks) {
    Primitive::ChannelBlocked::Call call{.block = blocks.block};
    auto blocked = [&](const ir::Value& v) {
      return blocks.blocked[static_cast<std::size_t>(v.id)];
    };
    for (std::size_t k = 0; k < e.inputs.size(); ++k)
      if (blocked(e.inputs[k])) call.inputs.push_back(static_cast<int>(k));
    call.output = !e.outputs.empty() && blocked(e.outputs[0]);
    if (call.inputs.empty() && !call.output) return std::nullopt;
    return call;
  }

  // The destination of value v when it is a result (its first occurrence) and one is given.
  const Tensor* destination(int v, std::span<const Tensor> dests) const {
    for (std::size_t i = 0; i < dests.size(); ++i)
      if (f_->results[i].id == v) return &dests[i];
    return nullptr;
  }

  // A buffer for group output v: the dead kernel output `reuses` when nothing but env holds
  // its storage (a kernel may have kept a reference: then it must not change), else a new one.
  Tensor own_buffer(int v, std::optional<int> reuses, const std::vector<Tensor>& env) const {
    const TensorType& type = value_types_[static_cast<std::size_t>(v)];
    if (reuses) {
      const Tensor& dead = env[static_cast<std::size_t>(*reuses)];
      if (dead.storage().use_count() == 1) {
        auto impl = std::make_shared<TensorImpl>();
        impl->type = type;
        impl->storage = dead.storage();
        impl->strides = contiguous_strides(type.shape);
        impl->offset = dead.offset();
        return Tensor(std::move(impl));
      }
    }
    return empty(type);
  }

  // A Tensor for value v: its own, or a strided view of the buffer it is a view of.
  Tensor tensor_of(int v, const std::vector<Tensor>& env) const {
    const auto& view = views_[static_cast<std::size_t>(v)];
    const Tensor& base = env[static_cast<std::size_t>(view->buffer)];
    if (view->buffer == v) return base;
    auto impl = std::make_shared<TensorImpl>();
    impl->type = value_types_[static_cast<std::size_t>(v)];
    impl->storage = base.storage();
    impl->strides = view->access.strides;
    impl->offset = base.offset() + view->access.offset;
    return Tensor(std::move(impl));
  }

  // Value v as a kernel's input: its own tensor, or a view of its buffer through the
  // TensorImpl that the frame keeps for it, so that a call allocates none, while nothing else
  // holds that TensorImpl (a kernel may have kept it, or an operand copy its source).
  const Tensor& input_of(int v, Frame& frame) const {
    const View& view = *views_[static_cast<std::size_t>(v)];
    const Tensor& base = frame.env[static_cast<std::size_t>(view.buffer)];
    if (view.buffer == v) return base;
    Tensor& kept = frame.views[static_cast<std::size_t>(v)];
    if (kept.defined() && kept.impl_ptr().use_count() == 1) {
      kept.impl()->storage = base.storage();
      kept.impl()->offset = base.offset() + view.access.offset;
    } else {
      kept = tensor_of(v, frame.env);
    }
    return kept;
  }
  // After e's kernel: the views kept for its inputs let go of their buffers' memory, whose
  // holders decide what may be written in place and when it is freed; a view that something
  // else still holds is no longer kept.
  static void release_views(const ir::Equation& e, Frame& frame) {
    for (const ir::Value& v : e.inputs) {
      Tensor& kept = frame.views[static_cast<std::size_t>(v.id)];
      if (!kept.defined()) continue;
      if (kept.impl_ptr().use_count() == 1)
        kept.impl()->storage.reset();
      else
        kept = Tensor();
    }
  }

  // Per value, how the steps use it.
  std::vector<Use> uses() const {
    const ir::Function& f = *f_;
    std::vector<Use> use(static_cast<std::size_t>(f.next_id()));
    auto of_buffer = [&](int v) -> Use& {
      return use[static_cast<std::size_t>(views_[static_cast<std::size_t>(v)]->buffer)];
    };
    auto make = [&](int v, Use::Maker maker, std::size_t s) {
      use[static_cast<std::size_t>(v)] = {.made_by = maker, .defined = s, .last_use = s};
    };
    for (std::size_t s = 0; s < steps_.size(); ++s) {
      if (const auto* g = std::get_if<GroupStep>(&steps_[s])) {
        for (int v : g->group.inputs) use[static_cast<std::size_t>(v)].last_use = s;
        for (const GroupOutput& o : g->group.outputs) make(o.value, Use::Maker::group, s);
      } else {
        const ir::Equation& e =
            f.equations[static_cast<std::size_t>(std::get<OpaqueStep>(steps_[s]).equation)];
        for (const ir::Value& v : e.inputs) {
          of_buffer(v.id).escapes = true;
          of_buffer(v.id).last_use = s;
        }
        for (const ir::Value& v : e.outputs) make(v.id, Use::Maker::kernel, s);
      }
    }
    for (const ir::Value& v : f.results) {
      of_buffer(v.id).escapes = true;
      of_buffer(v.id).last_use = steps_.size();
    }
    return use;
  }

  // Where each value's memory is: arena slots for values only fused kernels read (never a
  // result, never a kernel's input: those may keep a reference), planned by liveness
  // (plan.h), outputs written in place over inputs that die with them, and values released
  // after their last use.
  void lay_out_memory() {
    const ir::Function& f = *f_;
    const std::size_t n = static_cast<std::size_t>(f.next_id());
    value_types_.assign(n, TensorType{});
    for (const ir::Value& v : f.params) value_types_[static_cast<std::size_t>(v.id)] = v.type;
    for (const ir::Constant& c : f.constants)
      value_types_[static_cast<std::size_t>(c.value.id)] = c.value.type;
    for (const ir::Equation& e : f.equations)
      for (const ir::Value& v : e.outputs) value_types_[static_cast<std::size_t>(v.id)] = v.type;
    const std::vector<Use> use = uses();
    release_after_.assign(steps_.size(), {});
    for (std::size_t v = 0; v < n; ++v)
      if (use[v].last_use < steps_.size() && views_[v] && views_[v]->buffer == static_cast<int>(v))
        release_after_[use[v].last_use].push_back(static_cast<int>(v));
    std::vector<Buffer> buffers(n);
    for (std::size_t v = 0; v < n; ++v)
      buffers[v] = {.bytes = static_cast<int64_t>(bytes_of(value_types_[v])),
                    .alignment = kSlotAlignment,
                    .defined = use[v].defined,
                    .last_use = use[v].last_use,
                    .excluded = !use[v].in_arena()};
    slots_.assign(n, Slot{});
    std::size_t group_index = 0;
    for (std::size_t s = 0; s < steps_.size(); ++s)
      if (const auto* g = std::get_if<GroupStep>(&steps_[s]))
        write_in_place(g->group, s, use, info_.groups[group_index++], buffers);
    plan_kernels_in_place(use);
    const MemoryPlan plan = plan_memory(buffers);
    for (std::size_t v = 0; v < n; ++v)
      if (plan.offsets[v]) slots_[v].arena_offset = static_cast<std::size_t>(*plan.offsets[v]);
    arena_bytes_ = static_cast<std::size_t>(plan.arena_bytes);
  }

  // Picks, for each inner output of the group at step s, an input that dies there to write it
  // over, recording the choice in `info`: an arena output takes the input's slot (`buffers`),
  // an output of its own the input's buffer when nothing else holds it at run time (slots_).
  void write_in_place(const Group& group, std::size_t s, const std::vector<Use>& use,
                      CompiledInfo::Group& info, std::vector<Buffer>& buffers) {
    std::vector<bool> taken(group.inputs.size(), false);
    for (std::size_t q = 0; q < group.outputs.size(); ++q) {
      const std::size_t v = static_cast<std::size_t>(group.outputs[q].value);
      // In place over an input that dies here, of the same size and element size, read only
      // element by element: for an arena value, an arena input; for a value of its own (a
      // result or a kernel's input), a kernel's output that only groups read. Never an
      // argument, a constant, a result or a kernel's input.
      auto fits = [&](std::size_t i) {
        const std::size_t in = static_cast<std::size_t>(group.inputs[i]);
        const bool same_kind = use[v].escapes
                                   ? use[in].made_by == Use::Maker::kernel && !use[in].escapes
                                   : use[in].in_arena();
        return same_kind && !taken[i] && use[in].last_use == s &&
               group.outputs[q].level == Level::inner &&
               bytes_of(value_types_[in]) == bytes_of(value_types_[v]) &&
               dtype_size(value_types_[in].dtype) == dtype_size(value_types_[v].dtype) &&
               read_elementwise(group, static_cast<int>(i)) &&
               loads_precede_store(group, q, static_cast<int>(i));
      };
      std::optional<std::size_t> over;
      for (std::size_t i = 0; i < group.inputs.size() && !over; ++i)
        if (fits(i)) over = i;
      if (!over) continue;
      taken[*over] = true;
      const int in = group.inputs[*over];
      info.in_place.push_back(
          {.output = static_cast<int>(v), .input = in, .arena = !use[v].escapes});
      if (use[v].escapes) {
        slots_[v].reuses = in;
        slots_[static_cast<std::size_t>(in)].sole_owner = true;
      } else {
        buffers[v].overwrites = static_cast<std::size_t>(in);
      }
    }
  }

  // Marks the kernel calls that may write over an input (OpaqueStep::overwrites), and the
  // results that such calls make from the argument of the same index alone, a chain of them
  // (updates_in_place_: a loop's carry updated a block at a time).
  void plan_kernels_in_place(const std::vector<Use>& use) {
    const ir::Function& f = *f_;
    std::vector<bool> constant(use.size(), false);
    for (const ir::Constant& c : f.constants) constant[static_cast<std::size_t>(c.value.id)] = true;
    auto buffer_of = [&](int v) { return views_[static_cast<std::size_t>(v)]->buffer; };
    std::map<int, int> made_over;  // an output written in place -> the input it overwrites
    for (std::size_t s = 0; s < steps_.size(); ++s) {
      auto* step = std::get_if<OpaqueStep>(&steps_[s]);
      if (!step) continue;
      const ir::Equation& e = f.equations[static_cast<std::size_t>(step->equation)];
      if (!e.prim->in_place || e.outputs.size() != 1) continue;
      const auto k = static_cast<std::size_t>(e.prim->in_place->input);
      const int v = e.inputs[k].id;
      const auto vi = static_cast<std::size_t>(v);
      bool alone = buffer_of(v) == v;
      for (std::size_t j = 0; j < e.inputs.size() && alone; ++j)
        alone = j == k || buffer_of(e.inputs[j].id) != v;
      if (!alone || constant[vi] || use[vi].last_use != s || value_types_[vi] != e.outputs[0].type)
        continue;
      step->overwrites = v;
      made_over[e.outputs[0].id] = v;
      info_.kernel_calls_in_place.push_back(step->equation);
    }
    const std::size_t n = std::min(f.params.size(), f.results.size());
    for (std::size_t i = 0; i < n; ++i) {
      int v = f.results[i].id;
      if (buffer_of(v) != v || !made_over.count(v)) continue;
      while (made_over.count(v)) v = made_over.at(v);
      if (v != f.params[i].id) continue;
      updates_in_place_.push_back(i);
      info_.results_in_place.push_back(static_cast<int>(i));
    }
  }

  Frame take_frame() const {
    {
      std::lock_guard lock(frames_mutex_);
      if (!frames_.empty()) {
        Frame fr = std::move(frames_.back());
        frames_.pop_back();
        return fr;
      }
    }
    Frame fr;
    if (arena_bytes_) {
      fr.memory = empty(Shape({static_cast<int64_t>(arena_bytes_)}), uint8);
      fr.arena = static_cast<char*>(fr.memory.raw_data());
    }
    const std::size_t n = value_types_.size();
    fr.env.resize(n);
    fr.data.resize(n);
    fr.owners.resize(n);
    fr.views.resize(n);
    fr.choices.resize(steps_.size());
    return fr;
  }
  // Keeps a frame for the next call, holding no tensor of this one.
  void give_back(Frame fr) const {
    for (Tensor& t : fr.env) t = Tensor();
    std::lock_guard lock(frames_mutex_);
    frames_.push_back(std::move(fr));
  }

  std::shared_ptr<const ir::Function> f_;
  uint64_t profile_id_ = 0;  // the function's rows in profiles
  std::unique_ptr<const SubFunctions> owned_subs_;
  const SubFunctions* subs_;
  std::vector<std::optional<View>> views_;
  std::vector<std::variant<GroupStep, OpaqueStep>> steps_;
  std::shared_ptr<NativeCode> code_;  // the program's kernels
  std::vector<Tensor> constants_;
  std::vector<TensorType> value_types_;
  std::vector<Slot> slots_;
  std::vector<std::vector<int>> release_after_;
  std::size_t arena_bytes_ = 0;
  std::vector<std::size_t> updates_in_place_;
  ir::CompiledInfo info_;
  mutable std::mutex frames_mutex_;
  mutable std::vector<Frame> frames_;
};

// Plans every sub-function of f (recursively) into `subs`, their kernels into `kernels`;
// `made` collects them for linking.
void collect_subs(const ir::Function& f, SubFunctions& subs, ProgramKernels& kernels,
                  std::vector<std::shared_ptr<CompiledFunction>>& made) {
  for (const ir::Equation& e : f.equations)
    for (const auto& [name, attr] : e.attrs.items()) {
      const auto* sub = std::get_if<FunctionRef>(&attr);
      if (!sub || !*sub || subs.count(sub->get())) continue;
      made.push_back(std::make_shared<CompiledFunction>(*sub, &subs, kernels));
      subs.emplace(sub->get(), made.back());
      collect_subs(**sub, subs, kernels, made);
    }
}

}  // namespace

std::shared_ptr<const ir::Executable> compile(std::shared_ptr<const ir::Function> f) {
  // Calls whose rules only transformations read (checkpoint, custom_jvp, custom_vjp) run as
  // their bodies, fused with what surrounds them. No CSE after it: that would merge a
  // checkpoint's recomputation in the backward pass with the forward pass's values and keep
  // them alive in between, which is what the checkpoint avoids.
  const auto start = std::chrono::steady_clock::now();
  f = std::make_shared<const ir::Function>(reduce_thin_products(ir::inline_calls(*f)));
  auto subs = std::make_unique<SubFunctions>();
  ProgramKernels kernels;
  std::vector<std::shared_ptr<CompiledFunction>> made;
  collect_subs(*f, *subs, kernels, made);
  const SubFunctions* table = subs.get();
  const std::string name = f->name;
  auto top = std::make_shared<CompiledFunction>(std::move(f), table, kernels, std::move(subs));
  kernels.build(name);
  for (const auto& sub : made) sub->link(kernels, std::nullopt);
  top->link(
      kernels,
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  return top;
}

const Code* compiled_sub_function(const ir::Function& f) {
  return static_cast<const Code*>(ir::compiled_body(f));
}

}  // namespace kiln::compiler
