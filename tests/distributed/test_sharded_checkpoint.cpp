// Sharded checkpoints (run as 1 process and under mpirun with 2 and 3): every process writes
// its pieces of a tree, under every 1-D and 2-D mesh layout and as ZeRO pieces, and loading
// puts back bitwise the whole tensors; a checkpoint written in one layout and rewritten in
// another loads the same; an incomplete or uncommitted step is refused or ignored.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "kiln/kiln.h"
#include "kiln/sharded_checkpoint.h"
#include "meshes.h"

namespace kiln {
namespace {

using distributed::Mesh;
using distributed::spec;
using testing::meshes;
namespace fs = std::filesystem;

// The same fresh directory on every process (process 0's pid names it).
std::string shared_dir(const std::string& name) {
  auto sum = pmap([](const Tensor& x) { return psum(x, "p"); }, axis_name("p"), out_axes(none));
  const int64_t pid = distributed::process_index() == 0 ? int64_t{getpid()} : 0;
  const int64_t id = sum(expand_dims(tensor(pid), 0)).item<int64_t>();
  const std::string dir =
      (fs::temp_directory_path() / ("kiln_sharded_" + name + "_" + std::to_string(id))).string();
  if (distributed::process_index() == 0) fs::remove_all(dir);
  sum(expand_dims(tensor(int64_t{0}), 0));  // nobody writes before it is gone
  return dir;
}

struct Params {
  Tensor embedding, weight, bias, scale;
};
KILN_TREE(Params, embedding, weight, bias, scale);

// The same values on every process, in several dtypes and ranks; sizes divisible by 1-4.
Params globals() {
  const Tensor k = random::split(random::key(5), 4);
  return {random::normal(index(k, 0), {12, 6}), random::normal(index(k, 1), {6, 12}),
          astype(random::normal(index(k, 2), {12}), bfloat16),
          astype(random::uniform(index(k, 3), {12, 2, 2}), float64)};
}

void expect_same(const io::TensorFile& file, const Params& want, const std::string& what) {
  const std::vector<std::string> names = tree_names(want);
  const std::vector<Tensor> leaves = tree_leaves(want);
  ASSERT_EQ(file.tensors.size(), leaves.size()) << what;
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    const Tensor* got = file.find(names[i]);
    ASSERT_NE(got, nullptr) << what << ": " << names[i];
    ASSERT_EQ(got->type(), leaves[i].type()) << what << ": " << names[i];
    const std::size_t bytes = static_cast<std::size_t>(got->numel()) * dtype_size(got->dtype());
    EXPECT_EQ(std::memcmp(got->contiguous().raw_data(), leaves[i].contiguous().raw_data(), bytes),
              0)
        << what << ": " << names[i] << " differs";
  }
}

// Per leaf: rows, columns, nothing, or the first dimension over every axis of the mesh.
std::vector<distributed::Spec> specs_for(const Mesh& m) {
  std::vector<std::string> all;
  for (const distributed::MeshAxis& a : m.axes()) all.push_back(a.name);
  const std::string last = all.back();
  return {spec(all.front(), none), spec(none, last), spec(), spec(all)};
}

Params blocks_of(const Params& p, const Mesh& m, const std::vector<distributed::Spec>& specs) {
  std::vector<Tensor> leaves = tree_leaves(p);
  for (std::size_t i = 0; i < leaves.size(); ++i)
    leaves[i] = distributed::local_block(leaves[i], m, specs[i]);
  return tree_unflatten<Params>(tree_structure(p), leaves);
}

TEST(ShardedCheckpoint, BlocksOfEveryMeshLoadWhole) {
  const Params whole = globals();
  for (const Mesh& m : meshes()) {
    const std::string dir = shared_dir("blocks");
    const std::vector<distributed::Spec> specs = specs_for(m);
    distributed::save_sharded(dir, 7,
                              distributed::block_pieces(blocks_of(whole, m, specs), specs, m),
                              {{"note", "blocks"}});
    const io::TensorFile loaded = distributed::load_sharded(dir);
    expect_same(loaded, whole, m.to_string());
    EXPECT_EQ(loaded.metadata.at("step"), "7");
    EXPECT_EQ(loaded.metadata.at("note"), "blocks");
  }
}

TEST(ShardedCheckpoint, ZeroPiecesRewrittenAsBlocksLoadTheSame) {
  const int n = distributed::process_count(), rank = distributed::process_index();
  const Params whole = globals();
  const std::string dir = shared_dir("zero");
  const distributed::ShardLayout layout(whole, n);
  distributed::save_sharded(
      dir, 1, distributed::zero_pieces(distributed::shard(whole, layout, rank), layout, rank));
  const io::TensorFile first = distributed::load_sharded(dir);
  expect_same(first, whole, "ZeRO pieces");
  // Resharded: what was loaded, cut as 2-D blocks, written as the next step.
  const Mesh m({{"data", 1}, {"model", n}});
  const Params reloaded = tree_unflatten<Params>(
      tree_structure(whole),
      io::detail::match_leaves(first, tree_names(whole), tree_leaves(whole), dir, {}));
  distributed::save_sharded(
      dir, 2, distributed::block_pieces(blocks_of(reloaded, m, specs_for(m)), specs_for(m), m));
  expect_same(distributed::load_sharded(dir), whole, "ZeRO pieces rewritten as blocks");
  EXPECT_EQ(distributed::latest_sharded_step(dir), 2);
  EXPECT_FALSE(fs::exists(dir + "/step-0000000001"));  // older steps are removed
}

TEST(ShardedCheckpoint, IgnoresUncommittedStepsAndRefusesIncompleteOnes) {
  const int n = distributed::process_count(), rank = distributed::process_index();
  const Params whole = globals();
  const std::string dir = shared_dir("incomplete");
  const distributed::ShardLayout layout(whole, n);
  distributed::save_sharded(
      dir, 3, distributed::zero_pieces(distributed::shard(whole, layout, rank), layout, rank));
  auto barrier = pmap([](const Tensor& x) { return psum(x, "p"); }, axis_name("p"), out_axes(none));
  if (rank == 0) {
    // A later step whose writing stopped before its index: never loaded.
    fs::create_directories(dir + "/step-0000000004");
    fs::copy_file(dir + "/step-0000000003/shard-0.safetensors",
                  dir + "/step-0000000004/shard-0.safetensors");
    EXPECT_EQ(distributed::latest_sharded_step(dir), 3);
    expect_same(distributed::load_sharded(dir), whole, "after an uncommitted step");
    // A committed step that lacks a piece: refused, naming the tensor.
    if (n > 1) {
      fs::remove(dir + "/step-0000000003/shard-1.safetensors");
      try {
        distributed::load_sharded(dir);
        ADD_FAILURE() << "loaded a step with a missing shard file";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("shard-1"), std::string::npos) << e.what();
      }
    }
  }
  barrier(expand_dims(tensor(int64_t{0}), 0));
  // A committed step whose pieces leave elements uncovered: refused, naming the tensor.
  std::vector<distributed::Piece> pieces =
      distributed::zero_pieces(distributed::shard(whole, layout, rank), layout, rank);
  if (rank == 0)  // its piece of 'scale' one element short
    pieces.back().data = slice(pieces.back().data, {Slice{0, pieces.back().data.numel() - 1}});
  distributed::save_sharded(dir, 5, pieces);
  try {
    distributed::load_sharded(dir);
    ADD_FAILURE() << "loaded a step with a piece missing";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'scale' does not add up"), std::string::npos) << e.what();
  }
  try {
    distributed::load_sharded(dir + "/none");
    ADD_FAILURE() << "loaded from a directory without a checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no committed checkpoint"), std::string::npos);
  }
}

TEST(ShardedCheckpoint, SavingAStepAgainReplacesIt) {
  const int n = distributed::process_count(), rank = distributed::process_index();
  const Params whole = globals();
  const Params doubled = tree_map([](const Tensor& t) { return t * 2.0; }, whole);
  const std::string dir = shared_dir("again");
  const distributed::ShardLayout layout(whole, n);
  for (const Params* p : {&whole, &doubled})
    distributed::save_sharded(
        dir, 9, distributed::zero_pieces(distributed::shard(*p, layout, rank), layout, rank));
  expect_same(distributed::load_sharded(dir), doubled, "the second save of step 9");
}

// Shard files are untrusted input: each bad placement is an Error naming the tensor.
TEST(ShardedCheckpoint, RefusesPiecesThatDoNotFit) {
  const Tensor four = tensor(std::vector<float>{1, 2, 3, 4});
  auto at = [](std::vector<int64_t> v) { return tensor(v); };
  auto refuse = [&](std::vector<io::NamedTensor> tensors, const std::string& part) {
    io::TensorFile f;
    f.tensors = std::move(tensors);
    try {
      distributed::assemble_pieces({f}, "<test>");
      ADD_FAILURE() << "assembled pieces that should fail with '" << part << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  // A 4-element piece claiming a tensor of 2^40 elements: refused before any allocation.
  refuse({{"w#0", four}, {"w#0#at", at({1, 2, int64_t{1} << 20, int64_t{1} << 20, 0})}},
         "does not add up");
  refuse({{"w#0", four}, {"w#0#at", at({1, 1, 4, 1})}}, "does not fit");
  refuse({{"w#0", four}, {"w#0#at", at({0, 1, 8, 0})}, {"w#1", four}, {"w#1#at", at({0, 1, 8, 2})}},
         "covered unevenly");  // overlapping
  refuse({{"w#0", four}}, "has no placement");
  refuse({{"w", four}}, "unexpected tensor");
  refuse({{"w#0", four}, {"w#0#at", at({0, 2, 4})}}, "bad placement");
  refuse({{"w#0", four}, {"w#0#at", at({0, 1, -4, 0})}}, "sizes >= 0");
}

}  // namespace
}  // namespace kiln
