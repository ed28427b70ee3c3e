// bucket_all_reduces: independent process_all_reduce equations of one reduction, axis (and
// group of processes) and dtype become one all-reduce per bucket of at most
// KILN_ALLREDUCE_BUCKET_MB (default 4) megabytes: flatten, concatenate, one MPI call, slice back.
// Data-parallel training's gradient pmean is one all-reduce per parameter tensor before this pass;
// the latency of an MPI call is paid per bucket after it (docs/DESIGN.md, "pmap and the distributed
// runtime").
#include "distributed/bucket_all_reduces.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <tuple>
#include <unordered_map>

#include "kiln/ir.h"
#include "kiln/ops.h"
#include "ops/primitives.h"

namespace kiln::distributed {
namespace {

using ir::Constant;
using ir::Equation;
using ir::Function;
using ir::Traced;
using ir::Value;

std::size_t bucket_bytes() {
  static const std::size_t bytes = [] {
    const char* v = std::getenv("KILN_ALLREDUCE_BUCKET_MB");
    const double mb = v && *v ? std::strtod(v, nullptr) : 4.0;
    return static_cast<std::size_t>((mb > 0 ? mb : 4.0) * (1 << 20));
  }();
  return bytes;
}

std::size_t bytes_of(const TensorType& t) {
  return static_cast<std::size_t>(t.shape.numel()) * dtype_size(t.dtype);
}

struct Bucket {
  std::vector<std::size_t> members;  // equation indices, in program order
  std::size_t bytes = 0;
  // Bit sets over the candidates: the members, and every candidate the bucket's one MPI call
  // waits for (its members' dependencies, through other buckets too).
  std::vector<uint64_t> member_bits, closure;
};

bool intersects(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  for (std::size_t w = 0; w < a.size(); ++w)
    if (a[w] & b[w]) return true;
  return false;
}

// d with everything the buckets it reaches wait for: a bucket computes all its members at
// once, so depending on one member means waiting for every member's dependencies.
std::vector<uint64_t> through_buckets(std::vector<uint64_t> d, const std::vector<Bucket>& buckets) {
  for (bool grew = true; grew;) {
    grew = false;
    for (const Bucket& b : buckets)
      if (intersects(d, b.member_bits))
        for (std::size_t w = 0; w < d.size(); ++w)
          if ((d[w] | b.closure[w]) != d[w]) {
            d[w] |= b.closure[w];
            grew = true;
          }
  }
  return d;
}

// The equations computing the bucket: its members' inputs in, their outputs out (same ids).
std::vector<Equation> bucket_equations(const Function& f, const Bucket& b, int& next_id,
                                       std::vector<Constant>& constants) {
  const Equation& first = f.equations[b.members.front()];
  std::vector<TensorType> types;
  for (std::size_t m : b.members) types.push_back(f.equations[m].inputs[0].type);
  const Traced t = ir::trace_function("bucket", types, [&](const std::vector<Tensor>& xs) {
    std::vector<Tensor> flat;
    for (const Tensor& x : xs) flat.push_back(reshape(x, {-1}));
    const Tensor all = bind1(*first.prim, {concatenate(flat)}, first.attrs, Loc{});
    std::vector<Tensor> out;
    int64_t start = 0;
    for (const Tensor& x : xs) {
      out.push_back(reshape(slice(all, {Slice{start, start + x.numel()}}), x.shape()));
      start += x.numel();
    }
    return out;
  });
  std::unordered_map<int, Value> renamed;
  for (std::size_t i = 0; i < b.members.size(); ++i) {
    renamed[t.function->params[i].id] = f.equations[b.members[i]].inputs[0];
    renamed[t.function->results[i].id] = f.equations[b.members[i]].outputs[0];
  }
  auto in_f = [&](const Value& v) {
    auto it = renamed.find(v.id);
    return it != renamed.end() ? it->second : (renamed[v.id] = Value{next_id++, v.type});
  };
  for (const Constant& c : t.function->constants) constants.push_back({in_f(c.value), c.tensor});
  std::vector<Equation> out;
  for (const Equation& e : t.function->equations) {
    Equation copy = e;
    for (Value& v : copy.inputs) v = in_f(v);
    for (Value& v : copy.outputs) v = in_f(v);
    copy.loc = first.loc;
    out.push_back(std::move(copy));
  }
  return out;
}

// Equations in an order where every value is defined before use, keeping the given order
// wherever it already allows (Kahn's algorithm, lowest position first).
std::vector<Equation> topological(std::vector<Equation> eqs, const Function& f) {
  std::unordered_map<int, std::size_t> producer;
  for (std::size_t i = 0; i < eqs.size(); ++i)
    for (const Value& v : eqs[i].outputs) producer[v.id] = i;
  std::vector<std::vector<std::size_t>> users(eqs.size());
  std::vector<int> waiting(eqs.size(), 0);
  for (std::size_t i = 0; i < eqs.size(); ++i)
    for (const Value& v : eqs[i].inputs)
      if (auto it = producer.find(v.id); it != producer.end()) {
        users[it->second].push_back(i);
        ++waiting[i];
      }
  std::map<std::size_t, bool> ready;
  for (std::size_t i = 0; i < eqs.size(); ++i)
    if (waiting[i] == 0) ready[i] = true;
  std::vector<Equation> out;
  while (!ready.empty()) {
    const std::size_t i = ready.begin()->first;
    ready.erase(ready.begin());
    for (std::size_t u : users[i])
      if (--waiting[u] == 0) ready[u] = true;
    out.push_back(std::move(eqs[i]));
  }
  if (out.size() != eqs.size())
    fail("bucket_all_reduces", "a cycle in @", f.name, " after bucketing: got ", out.size(), " of ",
         eqs.size(), " equations in order");
  return out;
}

// One function's all-reduces, its sub-functions untouched.
Function bucket_in(const Function& f) {
  const Primitive& all_reduce = prim::process_all_reduce();
  // For each value, the candidate all-reduces it depends on (bit k: the k-th of them).
  const auto candidates = static_cast<std::size_t>(
      std::count_if(f.equations.begin(), f.equations.end(),
                    [&](const Equation& e) { return e.prim == &all_reduce; }));
  if (candidates < 2) return f;
  const std::size_t words = (candidates + 63) / 64;
  std::unordered_map<int, std::vector<uint64_t>> depends;
  std::vector<Bucket> buckets;
  // Keyed by reduction, axis, processes (a mesh axis's group) and dtype.
  std::map<std::tuple<std::string, std::string, std::vector<int64_t>, DType>,
           std::vector<std::size_t>>
      open;
  std::size_t k = 0;  // candidates seen
  for (std::size_t i = 0; i < f.equations.size(); ++i) {
    const Equation& e = f.equations[i];
    std::vector<uint64_t> d(words, 0);
    for (const Value& v : e.inputs)
      if (auto it = depends.find(v.id); it != depends.end())
        for (std::size_t w = 0; w < words; ++w) d[w] |= it->second[w];
    if (e.prim == &all_reduce) {
      const std::size_t bytes = bytes_of(e.inputs[0].type);
      auto& keyed = open[{e.attrs.get<std::string>("op"), e.attrs.get<std::string>("over"),
                          e.attrs.has("group") ? e.attrs.get_ints("group") : std::vector<int64_t>{},
                          e.inputs[0].type.dtype}];
      // The first open bucket it fits whose members it does not wait for, even through other
      // buckets (merging would make a cycle: the all-reduces of two mesh axes in both orders).
      const std::vector<uint64_t> waits = through_buckets(d, buckets);
      std::optional<std::size_t> chosen;
      for (std::size_t b : keyed)
        if (buckets[b].bytes + bytes <= bucket_bytes() &&
            !intersects(waits, buckets[b].member_bits)) {
          chosen = b;
          break;
        }
      if (!chosen) {
        chosen = buckets.size();
        buckets.push_back(
            {{}, 0, std::vector<uint64_t>(words, 0), std::vector<uint64_t>(words, 0)});
        keyed.push_back(*chosen);
      }
      Bucket& bucket = buckets[*chosen];
      bucket.members.push_back(i);
      bucket.bytes += bytes;
      bucket.member_bits[k / 64] |= uint64_t{1} << (k % 64);
      for (std::size_t w = 0; w < words; ++w) bucket.closure[w] |= waits[w] | bucket.member_bits[w];
      d[k / 64] |= uint64_t{1} << (k % 64);
      ++k;
    }
    for (const Value& v : e.outputs) depends[v.id] = d;
  }
  Function out = f;
  out.equations.clear();
  int next_id = f.next_id();
  std::vector<std::optional<std::size_t>> bucket_of(f.equations.size());
  for (std::size_t b = 0; b < buckets.size(); ++b)
    if (buckets[b].members.size() > 1)
      for (std::size_t m : buckets[b].members) bucket_of[m] = b;
  bool changed = false;
  for (std::size_t i = 0; i < f.equations.size(); ++i) {
    if (!bucket_of[i]) {
      out.equations.push_back(f.equations[i]);
      continue;
    }
    // A bucket is computed where its last member was; the stable sort below moves the uses
    // of earlier members after it.
    const Bucket& b = buckets[*bucket_of[i]];
    if (i != b.members.back()) continue;
    for (Equation& e : bucket_equations(f, b, next_id, out.constants))
      out.equations.push_back(std::move(e));
    changed = true;
  }
  if (!changed) return f;
  out.equations = topological(std::move(out.equations), f);
  return out;
}

}  // namespace

Function bucket_all_reduces(const Function& f) {
  return bucket_in(ir::map_sub_functions(f, bucket_all_reduces));
}

}  // namespace kiln::distributed
