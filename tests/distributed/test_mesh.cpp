// Meshes and shard_map (run as 1 process and under mpirun with 2, 3 and 4): on every 1-D and
// 2-D mesh of the processes, collectives over one axis run among the processes of that axis's
// line, checked against values each process computes from the mesh's coordinates; a
// tensor-parallel product and its gradients (grad of shard_map and shard_map of grad) match
// one process computing on the whole arrays; misuse is an Error naming the axis.
#include <kiln/kiln.h>

#include <numeric>

#include "../testing.h"
#include "meshes.h"

namespace kiln {
namespace {

using distributed::Mesh;
using distributed::spec;
using testing::expect_allclose;
using testing::expect_error;
using testing::meshes;

// What process r holds in the collectives test: a vector that tells processes apart.
std::vector<double> value_of(int64_t r) { return {double(r) + 1, 2.0 * double(r) * double(r)}; }

TEST(Mesh, PlacesProcessesRowMajor) {
  const int rank = distributed::process_index();
  for (const Mesh& m : meshes()) {
    int64_t position = 0;
    for (const distributed::MeshAxis& a : m.axes()) {
      position = position * a.size + m.index(a.name);
      const std::vector<int64_t> g = m.group(a.name);
      ASSERT_EQ(static_cast<int64_t>(g.size()), a.size) << m.to_string();
      EXPECT_EQ(g[static_cast<std::size_t>(m.index(a.name))], rank) << m.to_string();
    }
    EXPECT_EQ(position, rank) << m.to_string();
  }
}

TEST(Mesh, CollectivesRunAmongTheProcessesOfTheirAxis) {
  const int rank = distributed::process_index();
  for (const Mesh& m : meshes()) {
    for (const distributed::MeshAxis& axis : m.axes()) {
      const std::string a = axis.name;
      // Every leaf varies along every axis (each process brings its own value).
      std::vector<std::string> all;
      for (const distributed::MeshAxis& b : m.axes()) all.push_back(b.name);
      auto mapped = shard_map(
          [&a, n = axis.size](const Tensor& x) {
            return std::tuple{psum(x, a), all_gather(x, a), astype(axis_index(a), float64),
                              psum_scatter(reshape(tile(x, {n}), {n, 2}), a, 0), pmax(x, a)};
          },
          m, distributed::in_specs(spec(all)), distributed::out_specs(spec(all)));
      const auto [sum, gathered, index, scattered, largest] = mapped(tensor(value_of(rank)));
      // The reference: the values of the processes on this one's line along the axis.
      std::vector<double> want_sum(2, 0.0), want_gather, want_max(2, -1e300), want_scatter(2, 0.0);
      const std::vector<int64_t> line = m.group(a);
      for (const int64_t r : line) {
        const std::vector<double> v = value_of(r);
        for (int k = 0; k < 2; ++k) {
          want_sum[k] += v[k];
          want_max[k] = std::max(want_max[k], v[k]);
        }
        want_gather.insert(want_gather.end(), v.begin(), v.end());
      }
      // psum_scatter of n copies of x ([n, 2]): row i of their sum, the sum of x itself.
      want_scatter = want_sum;
      const std::string where = m.to_string() + " over '" + a + "'";
      expect_allclose(sum, want_sum, {.rtol = 1e-15, .atol = 0}, "psum " + where);
      expect_allclose(gathered, want_gather, {.rtol = 0, .atol = 0}, "all_gather " + where);
      expect_allclose(index, {double(m.index(a))}, {.rtol = 0, .atol = 0}, "axis_index " + where);
      expect_allclose(scattered, want_scatter, {.rtol = 1e-15, .atol = 0}, "psum_scatter " + where);
      expect_allclose(largest, want_max, {.rtol = 0, .atol = 0}, "pmax " + where);
    }
  }
}

// Over all of a mesh's axes at once, in the mesh's order, a collective spans every process in
// rank order; in the reverse order, the minor axis leads. (All-reduces over the two axes in
// both orders in one program: bucketing must not merge them into a cycle.)
TEST(Mesh, CollectivesOverSeveralAxesSpanTheirProcesses) {
  const int rank = distributed::process_index(), n = distributed::process_count();
  for (const Mesh& m : meshes()) {
    AxisNames order, reversed;
    std::vector<std::string> all;
    for (const distributed::MeshAxis& a : m.axes()) {
      order.names.push_back(a.name);
      reversed.names.insert(reversed.names.begin(), a.name);
      all.push_back(a.name);
    }
    auto mapped = shard_map(
        [&](const Tensor& x) {
          // psum_scatter of [n, 2]: row r holds x·(r + 1), so process r gets (r + 1)·Σ x.
          const Tensor rows =
              matmul(reshape(astype(arange(n), float64) + 1.0, {n, 1}), reshape(x, {1, 2}));
          return std::tuple{psum(x, order),          all_gather(x, order),
                            all_gather(x, reversed), astype(axis_index(order), float64),
                            pmean(x, reversed),      pmax(x, order),
                            pmin(x, reversed),       psum_scatter(rows, order, 0)};
        },
        m, distributed::in_specs(spec(all)), distributed::out_specs(spec(all)));
    const auto [sum, gathered, gathered_reversed, index, mean, largest, smallest, scattered] =
        mapped(tensor(value_of(rank)));
    std::vector<double> want_sum(2, 0.0), want_gather, want_reversed, want_max(2, -1e300),
        want_min(2, 1e300);
    for (int64_t r = 0; r < n; ++r) {
      const std::vector<double> v = value_of(r);
      for (int k = 0; k < 2; ++k) {
        want_sum[k] += v[k];
        want_max[k] = std::max(want_max[k], v[k]);
        want_min[k] = std::min(want_min[k], v[k]);
      }
      want_gather.insert(want_gather.end(), v.begin(), v.end());
    }
    std::vector<double> want_mean = want_sum, want_scatter = want_sum;
    for (double& e : want_mean) e /= double(n);
    for (double& e : want_scatter) e *= double(rank + 1);
    // Reversed: the processes ordered by their last coordinate first (meshes() has at most two
    // axes, so the rest is one axis).
    const std::vector<distributed::MeshAxis> axes = m.axes();
    const int64_t minor = axes.back().size, major = n / minor;
    for (int64_t q = 0; q < minor; ++q)
      for (int64_t p = 0; p < major; ++p) {
        const std::vector<double> v = value_of(p * minor + q);
        want_reversed.insert(want_reversed.end(), v.begin(), v.end());
      }
    const std::string where = m.to_string();
    expect_allclose(sum, want_sum, {.rtol = 1e-15, .atol = 0}, "psum over " + where);
    expect_allclose(gathered, want_gather, {.rtol = 0, .atol = 0}, "all_gather over " + where);
    expect_allclose(gathered_reversed, want_reversed, {.rtol = 0, .atol = 0},
                    "all_gather, reversed, over " + where);
    expect_allclose(index, {double(rank)}, {.rtol = 0, .atol = 0}, "axis_index over " + where);
    expect_allclose(mean, want_mean, {.rtol = 1e-15, .atol = 0}, "pmean over " + where);
    expect_allclose(largest, want_max, {.rtol = 0, .atol = 0}, "pmax over " + where);
    expect_allclose(smallest, want_min, {.rtol = 0, .atol = 0}, "pmin over " + where);
    expect_allclose(scattered, want_scatter, {.rtol = 1e-15, .atol = 0},
                    "psum_scatter over " + where);
  }
}

// A tensor-parallel layer: rows of x split over "data", columns of w over "model"; the loss
// sums over both. Its gradient with respect to w's block is the block of the whole gradient.
Tensor layer_loss(const Tensor& x, const Tensor& w) { return sum(square(tanh(matmul(x, w)))); }

TEST(Mesh, TensorParallelGradientsMatchOneProcess) {
  const int64_t B = 12, D = 5, F = 12;  // B and F split over any mesh of 1-4 processes
  const Tensor x = tensor(testing::random_values(B * D, 3), {B, D});
  const Tensor w = tensor(testing::random_values(D * F, 4), {D, F});
  const Tensor want_loss = layer_loss(x, w);
  const Tensor want_grad = grad(layer_loss, argnums<1>)(x, w);
  for (const Mesh& m : meshes()) {
    if (m.axes().size() < 2) continue;
    const auto x_spec = spec("data", none), w_spec = spec(none, "model");
    const Tensor xb = distributed::local_block(x, m, x_spec);
    const Tensor wb = distributed::local_block(w, m, w_spec);
    auto total = [](const Tensor& xl, const Tensor& wl) {
      return psum(psum(layer_loss(xl, wl), "model"), "data");
    };
    // grad outside shard_map: the loss is replicated (out spec names no axis).
    auto loss =
        shard_map(total, m, distributed::in_specs(x_spec, w_spec), distributed::out_specs(spec()));
    const std::string where = m.to_string();
    expect_allclose(loss(xb, wb), want_loss, {.rtol = 1e-12, .atol = 0}, "loss on " + where);
    expect_allclose(grad([&](const Tensor& wl) { return loss(xb, wl); })(wb),
                    distributed::local_block(want_grad, m, w_spec), {.rtol = 1e-12, .atol = 1e-14},
                    "grad(shard_map) on " + where);
    // grad inside: each process differentiates its own part, summed over the data axis (the
    // weights' replicas), so the gradient varies along "model" only.
    auto inside = shard_map(
        [](const Tensor& xl, const Tensor& wl) {
          return psum(grad(layer_loss, argnums<1>)(xl, wl), "data");
        },
        m, distributed::in_specs(x_spec, w_spec), distributed::out_specs(w_spec));
    expect_allclose(inside(xb, wb), distributed::local_block(want_grad, m, w_spec),
                    {.rtol = 1e-12, .atol = 1e-14}, "shard_map(grad) on " + where);
  }
}

// Megatron's layers: a vocabulary-parallel embedding, a column-parallel Linear, a
// row-parallel Linear, logits against the embedding's block and a vocabulary-parallel
// cross-entropy, against the same model on whole arrays with nn's own layers.
struct Mini {
  nn::Embedding emb;
  nn::Linear col, row;
};
KILN_TREE(Mini, emb, col, row);

TEST(Mesh, TensorParallelLayersMatchOneProcess) {
  const int64_t V = 12, D = 4, F = 12, N = 12;  // V, F and N split over 1-4 processes
  const Tensor keys = random::split(random::key(21), 3);
  const Mini full{nn::Embedding(V, D, index(keys, 0)), nn::Linear(D, F, index(keys, 1)),
                  nn::Linear(F, D, index(keys, 2))};
  const Tensor ids = tensor(std::vector<int64_t>{0, 5, 11, 3, 7, 7, 2, 9, 10, 1, 6, 4});
  const Tensor labels = tensor(std::vector<int64_t>{11, 0, 4, 4, 8, 1, 3, 6, 2, 10, 9, 5});
  auto whole = [&](const Mini& p) {
    const Tensor y = p.row(tanh(p.col(p.emb(ids))));
    return nn::cross_entropy(matmul(y, transpose(p.emb.weight)), labels);
  };
  const Tensor want_loss = whole(full);
  const Mini want_grad = grad(whole)(full);
  const distributed::LeafSpecs specs{
      {spec("model", none), spec("model", none), spec("model"), spec(none, "model"), spec()}};
  for (const Mesh& m : meshes()) {
    if (m.axes().size() < 2 || N % m.size("data") != 0) continue;
    auto blocks = [&](const Mini& p) {
      std::vector<Tensor> leaves = tree_leaves(p);
      for (std::size_t i = 0; i < leaves.size(); ++i)
        leaves[i] = distributed::local_block(leaves[i], m, specs.specs[i]);
      return tree_unflatten<Mini>(tree_flatten(p).second, leaves);
    };
    auto loss = shard_map(
        [](const Mini& p, const Tensor& i, const Tensor& l) {
          const Tensor h = tanh(p.col(nn::parallel_embedding(p.emb, i, "model")));
          const Tensor y = nn::row_parallel_linear(p.row, h, "model");
          return pmean(nn::parallel_cross_entropy(matmul(y, transpose(p.emb.weight)), l, "model"),
                       "data");
        },
        m, distributed::in_specs(specs, spec("data"), spec("data")),
        distributed::out_specs(spec()));
    const Tensor my_ids = distributed::local_block(ids, m, spec("data"));
    const Tensor my_labels = distributed::local_block(labels, m, spec("data"));
    const std::string where = m.to_string();
    expect_allclose(loss(blocks(full), my_ids, my_labels), want_loss, {.rtol = 1e-6, .atol = 0},
                    "tensor-parallel loss on " + where);
    const Mini g = grad([&](const Mini& p) { return loss(p, my_ids, my_labels); })(blocks(full));
    const std::vector<Tensor> got = tree_leaves(g), want = tree_leaves(blocks(want_grad));
    for (std::size_t i = 0; i < got.size(); ++i)
      expect_allclose(got[i], want[i], {.rtol = 1e-5, .atol = 1e-7},
                      "gradient leaf " + std::to_string(i) + " on " + where);
  }
}

TEST(Mesh, PermutationsAndAssemblyRunAmongTheProcessesOfTheirAxis) {
  const int rank = distributed::process_index();
  for (const Mesh& m : meshes()) {
    for (const distributed::MeshAxis& axis : m.axes()) {
      const std::string a = axis.name;
      const int64_t n = axis.size;
      // One pair only (0 -> n - 1): the line's other processes take part without sending.
      auto f = shard_map(
          [&a, n](const Tensor& x) {
            return std::tuple{ppermute(x, a, {{0, n - 1}}),
                              all_to_all(reshape(tile(x, {n}), {n, 2}), a, 0, 0),
                              distributed::assemble(x, spec(a))};
          },
          m, distributed::in_specs(spec(a)), distributed::out_specs(spec(a)));
      const auto [moved, exchanged, whole] = f(tensor(value_of(rank)));
      const std::vector<int64_t> line = m.group(a);
      const int64_t me = m.index(a);
      std::vector<double> want_moved(2, 0.0), want_exchanged, want_whole;
      if (me == n - 1) want_moved = value_of(line[0]);
      for (const int64_t r : line) {
        const std::vector<double> v = value_of(r);
        want_exchanged.insert(want_exchanged.end(), v.begin(), v.end());
        want_whole.insert(want_whole.end(), v.begin(), v.end());
      }
      const std::string where = m.to_string() + " over '" + a + "'";
      expect_allclose(moved, want_moved, {.rtol = 0, .atol = 0}, "ppermute " + where);
      expect_allclose(exchanged, want_exchanged, {.rtol = 0, .atol = 0}, "all_to_all " + where);
      expect_allclose(whole, want_whole, {.rtol = 0, .atol = 0}, "assemble " + where);
    }
  }
}

TEST(Mesh, ResultsMustNotVaryAlongAnAxisTheirSpecOmits) {
  const Mesh m({{"data", 1}, {"model", distributed::process_count()}});
  auto f = shard_map([](const Tensor& x) { return x * 2.0; }, m,
                     distributed::in_specs(spec("model")), distributed::out_specs(spec()));
  expect_error([&] { f(tensor({1.0, 2.0})); }, "shard_map", {"mesh axis 'model'", "out spec"});
  // A failed check is not remembered as passed.
  expect_error([&] { f(tensor({1.0, 2.0})); }, "shard_map", {"mesh axis 'model'"});
}

TEST(Mesh, RejectsMeshesAndSpecsThatDoNotFit) {
  const int n = distributed::process_count();
  expect_error(
      [&] {
        Mesh({{"data", n + 1}});
      },
      "Mesh", {"holds " + std::to_string(n + 1) + " processes"});
  expect_error([&] { Mesh({{"a", 1}, {"a", n}}); }, "Mesh", {"axis 'a' appears twice"});
  const Mesh m({{"data", n}});
  auto f = shard_map([](const Tensor& x) { return x; }, m, distributed::in_specs(spec("model")),
                     distributed::out_specs(spec("data")));
  expect_error([&] { f(tensor({1.0})); }, "shard_map", {"'model'", "{data: " + std::to_string(n)});
  if (n > 1)
    expect_error([&] { distributed::local_block(zeros({n + 1}), m, spec("data")); }, "local_block",
                 {"does not split into " + std::to_string(n)});
}

}  // namespace
}  // namespace kiln
