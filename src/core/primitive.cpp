// The primitive registry, multiple-dispatch kernel selection and bind.
#include "kiln/primitive.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <source_location>
#include <sstream>
#include <string_view>
#include <unordered_map>

#include "core/builtins.h"
#include "detail/parallel.h"
#include "detail/trace_hooks.h"
#include "ir/trace.h"
#include "kiln/ir.h"

namespace kiln {

// ---- attributes -----------------------------------------------------------------

std::string attr_to_string(const AttrValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) {
          return x ? "true" : "false";
        } else if constexpr (std::is_same_v<T, int64_t>) {
          return std::to_string(x);
        } else if constexpr (std::is_same_v<T, double>) {
          std::ostringstream os;
          os.precision(17);
          os << x;
          std::string s = os.str();
          // Keep doubles recognisable as such in the text form.
          if (s.find_first_of(".eEni") == std::string::npos) s += ".0";
          return s;
        } else if constexpr (std::is_same_v<T, std::string>) {
          return "\"" + x + "\"";
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          std::string s = "[";
          for (std::size_t i = 0; i < x.size(); ++i) s += (i ? ", " : "") + std::to_string(x[i]);
          return s + "]";
        } else if constexpr (std::is_same_v<T, DType>) {
          return std::string(dtype_name(x));
        } else {
          return "@" + (x ? x->name : std::string("null"));
        }
      },
      v);
}

Attrs::Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items) {
  for (const auto& [k, v] : items) set(k, v);
}

bool Attrs::has(std::string_view name) const {
  return std::any_of(items_.begin(), items_.end(),
                     [&](const auto& kv) { return kv.first == name; });
}

const AttrValue& Attrs::at(std::string_view name) const {
  for (const auto& kv : items_)
    if (kv.first == name) return kv.second;
  fail("attrs", "missing attribute: got ", to_string().empty() ? "{}" : to_string(),
       ", expected one named '", name, "'");
}

void Attrs::set(std::string name, AttrValue value) {
  auto it = std::lower_bound(items_.begin(), items_.end(), name,
                             [](const auto& kv, const std::string& n) { return kv.first < n; });
  if (it != items_.end() && it->first == name) {
    it->second = std::move(value);
  } else {
    items_.insert(it, {std::move(name), std::move(value)});
  }
}

std::string Attrs::to_string() const {
  if (items_.empty()) return "";
  std::string s = "{";
  for (std::size_t i = 0; i < items_.size(); ++i)
    s += (i ? ", " : "") + items_[i].first + "=" + attr_to_string(items_[i].second);
  return s + "}";
}

// ---- registry -------------------------------------------------------------------

namespace {

struct Entry {
  Primitive primitive;
  // A deque: compiled code keeps pointers to its kernels (detail::choose_kernel), which a later
  // register_kernel must not move.
  std::deque<KernelRegistration> kernels;
  bool extended = false;  // register_kernel added to `kernels`
  bool users = false;     // registered by register_primitive: its kernels are a user's code
};

struct Registry {
  std::shared_mutex mutex;
  std::deque<Entry> entries;  // deque: references stay valid as it grows
  std::unordered_map<std::string, Entry*> by_name;
};

std::atomic<uint64_t> g_kernel_version{1};

Registry& registry() {
  static Registry r;
  return r;
}

std::string types_to_string(std::span<const TensorType> types) {
  std::string s = "(";
  for (std::size_t i = 0; i < types.size(); ++i) s += (i ? ", " : "") + types[i].to_string();
  return s + ")";
}

}  // namespace

std::string KernelSignature::to_string() const {
  std::string s = std::string(device_name(device)) + "(";
  for (std::size_t i = 0; i < inputs.size(); ++i) s += (i ? ", " : "") + inputs[i].to_string();
  if (variadic) s += ", ...";
  return s + ")";
}

namespace {

// Shape::numel and the creation functions kernels allocate with cannot know which op asked
// them, so they raise under their own names (an invalid shape, an allocation that cannot be
// satisfied); the primitive whose type rule or kernel called them re-raises under its name.
Error claimed(const Error& e, std::string_view op) {
  constexpr std::string_view kHelpers[] = {"shape", "empty", "zeros", "ones", "full"};
  if (std::find(std::begin(kHelpers), std::end(kHelpers), e.op()) == std::end(kHelpers)) return e;
  return Error(op, std::string(std::string_view(e.what()).substr(e.op().size() + 3)));
}

}  // namespace

std::vector<TensorType> Primitive::infer(std::span<const TensorType> inputs,
                                         const Attrs& attrs) const {
  const int n = static_cast<int>(inputs.size());
  if (variadic ? n < arity : n != arity)
    fail(name, "wrong number of inputs: got ", n, ", expected ", variadic ? "at least " : "",
         arity);
  try {
    std::vector<TensorType> out = type_rule(inputs, attrs);
    // Every shape an op makes is checked here, once, so that kernels, tracing, the verifier
    // and parsed IR never meet a negative size or an element count that overflows.
    for (const TensorType& t : out) t.shape.check(name);
    return out;
  } catch (const Error& e) {
    throw claimed(e, name);
  }
}

namespace {

// The root of the source tree as the compiler named this file ("/path/to/kiln/", or "../"
// when ccache rewrote the path): the built-ins' files start with it too.
std::string_view source_root() {
  constexpr std::string_view self = std::source_location::current().file_name();
  constexpr std::string_view tail = "src/core/primitive.cpp";
  return self.ends_with(tail) ? self.substr(0, self.size() - tail.size()) : std::string_view();
}

}  // namespace

std::string Primitive::where_defined() const {
  std::string_view file = defined_at.file_name();
  if (defined_at.line() == 0 || file.empty()) return "";
  const std::string_view root = source_root();
  if (!root.empty() && file.starts_with(root) && file.substr(root.size()).starts_with("src/"))
    file.remove_prefix(root.size());
  return detail::cat(" (defined at ", file, ":", defined_at.line(), ")");
}

namespace {

const Primitive& register_entry(Primitive primitive, std::vector<KernelRegistration> kernels,
                                Loc loc, bool users) {
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  if (primitive.name.empty() || !primitive.type_rule)
    fail("register_primitive", "incomplete primitive: got name '", primitive.name,
         "', expected a name and a type rule");
  if (r.by_name.count(primitive.name))
    fail("register_primitive", "duplicate primitive name: got '", primitive.name,
         "', expected a name not registered yet");
  if (primitive.in_place && (!primitive.in_place->write || primitive.in_place->input < 0 ||
                             primitive.in_place->input >= primitive.arity))
    fail("register_primitive", "in-place kernel of '", primitive.name,
         "' is incomplete: got input ", primitive.in_place->input,
         primitive.in_place->write ? "" : " and no write function",
         ", expected a write function and an input in [0, ", primitive.arity, ")");
  primitive.id = static_cast<int>(r.entries.size());
  primitive.defined_at = loc;
  Entry& e = r.entries.emplace_back(
      Entry{std::move(primitive),
            std::deque<KernelRegistration>(std::make_move_iterator(kernels.begin()),
                                           std::make_move_iterator(kernels.end()))});
  e.users = users;
  r.by_name.emplace(e.primitive.name, &e);
  return e.primitive;
}

}  // namespace

const Primitive& detail::register_builtin(Primitive primitive,
                                          std::vector<KernelRegistration> kernels, Loc loc) {
  return register_entry(std::move(primitive), std::move(kernels), loc, false);
}

namespace {

// Registers every built-in primitive, once and thread-safely (a function-local static), before
// anything looks one up by name, walks them or adds a user's: so names resolve whatever the
// program has called so far, a user's name cannot take a built-in's, and users' ids come after.
// The built-ins register through detail::register_builtin, which never comes back here.
void register_builtins() {
  static const bool registered = [] {
    detail::register_builtin_primitives();
    return true;
  }();
  (void)registered;
}

}  // namespace

const Primitive& register_primitive(Primitive primitive, std::vector<KernelRegistration> kernels,
                                    Loc loc) {
  register_builtins();
  return register_entry(std::move(primitive), std::move(kernels), loc, true);
}

const Primitive* find_primitive(std::string_view name) {
  register_builtins();
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  auto it = r.by_name.find(std::string(name));
  return it == r.by_name.end() ? nullptr : &it->second->primitive;
}

const Primitive& primitive(std::string_view name) {
  if (const Primitive* p = find_primitive(name)) return *p;
  fail("primitive", "unknown primitive: got '", name, "', expected a registered name");
}

std::vector<const Primitive*> all_primitives() {
  register_builtins();
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  std::vector<const Primitive*> out;
  for (const Entry& e : r.entries) out.push_back(&e.primitive);
  return out;
}

void register_kernel(const Primitive& primitive, KernelSignature signature, Kernel kernel) {
  Registry& r = registry();
  std::unique_lock lock(r.mutex);
  Entry& e = r.entries.at(static_cast<std::size_t>(primitive.id));
  e.kernels.push_back({std::move(signature), std::move(kernel)});
  e.extended = true;
  g_kernel_version.fetch_add(1, std::memory_order_release);
}

uint64_t detail::kernel_version() { return g_kernel_version.load(std::memory_order_acquire); }

bool detail::builtin_kernels_only(const Primitive& primitive) {
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  return !r.entries.at(static_cast<std::size_t>(primitive.id)).extended;
}

std::vector<KernelSignature> kernel_signatures(const Primitive& primitive) {
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  std::vector<KernelSignature> out;
  for (const auto& k : r.entries.at(static_cast<std::size_t>(primitive.id)).kernels)
    out.push_back(k.signature);
  return out;
}

namespace {

// The registration that wins the dispatch for these dtypes, or nullptr; the caller holds the
// registry's lock.
const KernelRegistration* best_kernel(const Entry& e, Device device,
                                      std::span<const DType> dtypes) {
  const KernelRegistration* best = nullptr;
  int best_score = -1;
  for (const KernelRegistration& k : e.kernels) {
    const KernelSignature& s = k.signature;
    if (s.device != device) continue;
    if (s.variadic ? s.inputs.empty() : s.inputs.size() != dtypes.size()) continue;
    int score = 0;
    bool ok = true;
    for (std::size_t i = 0; ok && i < dtypes.size(); ++i) {
      const DTypeSet& set = s.variadic ? s.inputs.front() : s.inputs[i];
      ok = set.contains(dtypes[i]);
      score += kNumDTypes - set.size();  // narrower sets are more specific
    }
    if (ok && score >= best_score) {  // ">=": later registrations win ties
      best = &k;
      best_score = score;
    }
  }
  return best;
}

}  // namespace

detail::KernelChoice detail::choose_kernel(const Primitive& primitive,
                                           std::span<const DType> dtypes) {
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  const uint64_t version = kernel_version();
  const Entry& e = r.entries.at(static_cast<std::size_t>(primitive.id));
  const KernelRegistration* best = best_kernel(e, Device::cpu, dtypes);
  return {.kernel = best ? &best->kernel : nullptr,
          .builtin_only = !e.extended,
          .builtin_code = !e.extended && !e.users,
          .version = version};
}

const Kernel& select_kernel(const Primitive& primitive, Device device,
                            std::span<const DType> dtypes) {
  Registry& r = registry();
  std::shared_lock lock(r.mutex);
  const Entry& e = r.entries.at(static_cast<std::size_t>(primitive.id));
  if (const KernelRegistration* best = best_kernel(e, device, dtypes)) return best->kernel;
  std::string got = "(";
  for (std::size_t i = 0; i < dtypes.size(); ++i)
    got += (i ? ", " : "") + std::string(dtype_name(dtypes[i]));
  got += ")";
  std::string have;
  for (const KernelRegistration& k : e.kernels)
    have += (have.empty() ? "" : ", ") + k.signature.to_string();
  fail(primitive.name, "no kernel for these dtypes: got ", device_name(device), got,
       ", expected one of: ", have.empty() ? "(no kernels registered)" : have);
}

// ---- bind -----------------------------------------------------------------------

std::vector<Tensor> BindFn::operator()(const Primitive& p, std::vector<Tensor> inputs,
                                       const Attrs& attrs, Loc loc) const {
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (!inputs[i].defined())
      fail(p.name, "input ", i,
           " is an undefined tensor: got a default-constructed Tensor, "
           "expected one created by an operation",
           detail::location_suffix(loc));
  if (detail::trace_active())
    return detail::record(p, inputs, attrs,
                          ir::SourceLoc{loc.file_name(), static_cast<int>(loc.line())});
  for (const Tensor& t : inputs)
    if (t.is_traced()) detail::throw_concrete_value_error(p.name, t);
  return detail::run_kernel(p, inputs, attrs, std::nullopt, loc);
}

namespace {

std::vector<TensorType> types_of(std::span<const Tensor> inputs) {
  std::vector<TensorType> types;
  types.reserve(inputs.size());
  for (const Tensor& t : inputs) types.push_back(t.type());
  return types;
}
std::string input_types_string(std::span<const Tensor> inputs) {
  return types_to_string(types_of(inputs));
}

// Runs `kernel` and checks its outputs against `out_types`.
std::vector<Tensor> run_checked(const Primitive& p, const Kernel& kernel,
                                std::span<const Tensor> inputs, const Attrs& attrs,
                                std::span<const TensorType> out_types) {
  std::vector<Tensor> outs = kernel(inputs, attrs);
  if (outs.size() != out_types.size())
    fail(p.name, "kernel returned the wrong number of outputs: got ", outs.size(), ", expected ",
         out_types.size());
  for (std::size_t i = 0; i < outs.size(); ++i)
    if (outs[i].type() != out_types[i])
      fail(p.name, "kernel output ", i, " has the wrong type: got ", outs[i].type(), ", expected ",
           out_types[i], " for inputs ", input_types_string(inputs));
  return outs;
}

// Calls f, which runs p's kernel, with its errors claimed by p and placed at loc, and a
// kernel's failure to allocate scratch memory as an Error.
template <typename F>
std::vector<Tensor> with_kernel_errors(const Primitive& p, std::span<const Tensor> inputs, Loc loc,
                                       F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    detail::rethrow_at(claimed(e, p.name), loc);
  } catch (const std::bad_alloc&) {
    // A kernel's scratch buffer (tensors raise Errors of their own when they cannot be had).
    detail::rethrow_at(Error(p.name, "out of memory: got inputs " + input_types_string(inputs) +
                                         ", expected working memory the system can satisfy"),
                       loc);
  }
}

}  // namespace

std::vector<Tensor> detail::run_kernel(const Primitive& p, std::span<const Tensor> inputs,
                                       const Attrs& attrs,
                                       std::optional<std::span<const TensorType>> out_types,
                                       Loc loc) {
  apply_flush_denormal();  // for kernels whose loops run on this thread alone
  return with_kernel_errors(p, inputs, loc, [&] {
    std::vector<TensorType> inferred;
    if (!out_types) {
      inferred = p.infer(types_of(inputs), attrs);
      out_types = inferred;
    }
    std::vector<DType> dtypes;
    dtypes.reserve(inputs.size());
    for (const Tensor& t : inputs) dtypes.push_back(t.dtype());
    return run_checked(p, select_kernel(p, Device::cpu, dtypes), inputs, attrs, *out_types);
  });
}

std::vector<Tensor> detail::run_chosen(const Primitive& p, const Kernel& kernel,
                                       std::span<const Tensor> inputs, const Attrs& attrs,
                                       std::span<const TensorType> out_types, Loc loc) {
  apply_flush_denormal();
  return with_kernel_errors(p, inputs, loc,
                            [&] { return run_checked(p, kernel, inputs, attrs, out_types); });
}

Tensor bind1(const Primitive& p, std::vector<Tensor> inputs, const Attrs& attrs, Loc loc) {
  std::vector<Tensor> outs = bind(p, std::move(inputs), attrs, loc);
  if (outs.size() != 1) fail(p.name, "expected a single output: got ", outs.size());
  return std::move(outs.front());
}

}  // namespace kiln
