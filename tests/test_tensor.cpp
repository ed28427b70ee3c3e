// Tensors: creation, reading values back, 0-d and zero-size tensors, views that share storage,
// printing and the errors of the basic API.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "testing.h"

using namespace kiln;

namespace {

using kiln::testing::expect_error;

using F = std::vector<float>;
using D = std::vector<double>;
using I32 = std::vector<int32_t>;
using I64 = std::vector<int64_t>;

// ---- creation -------------------------------------------------------------------

TEST(Creation, FromInitializerLists) {
  const Tensor a = tensor({1.0f, 2.0f, 3.0f});
  EXPECT_EQ(a.dtype(), float32);
  EXPECT_EQ(a.shape(), (Shape{3}));
  EXPECT_EQ(a.to_vector<float>(), (F{1, 2, 3}));
  EXPECT_TRUE(a.is_contiguous());

  const Tensor b = tensor({1, 2, 3, 4, 5, 6}, Shape{2, 3});
  EXPECT_EQ(b.dtype(), int32);
  EXPECT_EQ(b.shape(), (Shape{2, 3}));
  EXPECT_EQ(b.rank(), 2);
  EXPECT_EQ(b.numel(), 6);
  EXPECT_EQ(b.dim(0), 2);
  EXPECT_EQ(b.dim(-1), 3);
  EXPECT_EQ(b.strides(), (I64{3, 1}));
  EXPECT_EQ(b.to_vector<int32_t>(), (I32{1, 2, 3, 4, 5, 6}));

  EXPECT_EQ(tensor({1.0, 2.0}).dtype(), float64);
  EXPECT_EQ(tensor({int64_t{1}}).dtype(), int64);
  EXPECT_EQ(tensor({1u, 2u}).dtype(), uint32);
  EXPECT_EQ(tensor({uint8_t{255}}).dtype(), uint8);
  const Tensor bools = tensor({true, false, true});
  EXPECT_EQ(bools.dtype(), bool_);
  EXPECT_EQ(bools.to_vector<bool>(), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(bools.to_vector<int32_t>(), (I32{1, 0, 1}));
}

// detail::from_buffer takes raw bytes as bool (tensor<bool> and readers build on it): every
// non-zero byte is true, stored as 1, so that ops see canonical bools.
TEST(Creation, FromBufferStoresBoolsAsZeroOrOne) {
  const std::vector<uint8_t> bytes = {0, 1, 2, 128, 255};
  const Tensor b = detail::from_buffer(bytes.data(), bytes.size(), bool_, Shape{5}, Loc::current());
  const auto* stored = static_cast<const uint8_t*>(b.raw_data());
  for (std::size_t i = 0; i < bytes.size(); ++i) EXPECT_EQ(stored[i], bytes[i] != 0 ? 1 : 0) << i;
  EXPECT_EQ(logical_not(b).to_vector<int32_t>(), (I32{1, 0, 0, 0, 0}));
  EXPECT_EQ(astype(b, int32).to_vector<int32_t>(), (I32{0, 1, 1, 1, 1}));
  EXPECT_EQ(sum(b).item<int64_t>(), 4);
}

TEST(Creation, FromVectors) {
  const std::vector<double> v = {0.5, 1.5, 2.5, 3.5};
  const Tensor a = tensor(v, Shape{2, 1, 2});
  EXPECT_EQ(a.shape(), (Shape{2, 1, 2}));
  EXPECT_EQ(a.dtype(), float64);
  EXPECT_EQ(a.to_vector<double>(), v);
  EXPECT_EQ(tensor(v).shape(), (Shape{4}));
  // The tensor owns a copy: later changes to the vector do not show.
  std::vector<int> w = {1, 2};
  const Tensor b = tensor(w);
  w[0] = 99;
  EXPECT_EQ(b.to_vector<int32_t>(), (I32{1, 2}));
  expect_error([] { (void)tensor({1, 2, 3}, Shape{2, 2}); }, "tensor", {"3 values", "[2, 2]"});
  expect_error([] { (void)tensor(std::vector<float>{}, Shape{-1}); }, "tensor", {"[-1]"});
}

TEST(Creation, ReadBackConverts) {
  const Tensor a = tensor({-1.75f, 2.5f, 300.0f});
  EXPECT_EQ(a.to_vector<int32_t>(), (I32{-1, 2, 300}));  // truncation like static_cast
  EXPECT_EQ(a.to_vector<uint8_t>(), (std::vector<uint8_t>{0, 2, 255}));  // saturating
  EXPECT_EQ(a.to_vector<double>(), (D{-1.75, 2.5, 300.0}));
  EXPECT_EQ(a.to_vector<bool>(), (std::vector<bool>{true, true, true}));
  const Tensor n = tensor({NAN, 0.0f});
  EXPECT_EQ(n.to_vector<int64_t>(), (I64{0, 0}));
  EXPECT_EQ(n.to_vector<bool>(), (std::vector<bool>{true, false}));  // NaN is not zero
}

TEST(Creation, FullZerosOnesLike) {
  const Tensor z = zeros(Shape{2, 3});
  EXPECT_EQ(z.dtype(), float32);
  EXPECT_EQ(z.shape(), (Shape{2, 3}));
  EXPECT_EQ(z.to_vector<float>(), F(6, 0.0f));
  const Tensor o = ones(Shape{4}, int64);
  EXPECT_EQ(o.dtype(), int64);
  EXPECT_EQ(o.to_vector<int64_t>(), I64(4, 1));
  const Tensor f = full(Shape{2, 2}, 2.5, float64);
  EXPECT_EQ(f.to_vector<double>(), D(4, 2.5));
  EXPECT_EQ(full(Shape{2}, 7.9, int32).to_vector<int32_t>(), (I32{7, 7}));
  EXPECT_EQ(full(Shape{1}, 0.1, float16).to_vector<double>(), (D{0.0999755859375}));
  EXPECT_EQ(full(Shape{2}, 3.0, bool_).to_vector<bool>(), (std::vector<bool>{true, true}));
  EXPECT_EQ(full(Shape{}, -4.0, float32).item<float>(), -4.0f);

  const Tensor like = tensor({1, 2, 3}, Shape{3, 1});
  for (const Tensor& t : {zeros_like(like), ones_like(like), full_like(like, 5.0)}) {
    EXPECT_EQ(t.dtype(), int32);
    EXPECT_EQ(t.shape(), (Shape{3, 1}));
    EXPECT_FALSE(t.shares_storage_with(like));
  }
  EXPECT_EQ(zeros_like(like).to_vector<int32_t>(), (I32{0, 0, 0}));
  EXPECT_EQ(ones_like(like).to_vector<int32_t>(), (I32{1, 1, 1}));
  EXPECT_EQ(full_like(like, 5.0).to_vector<int32_t>(), (I32{5, 5, 5}));
  const Tensor hl = full_like(astype(like, bfloat16), 0.5);
  EXPECT_EQ(hl.dtype(), bfloat16);
  EXPECT_EQ(hl.to_vector<float>(), (F{0.5f, 0.5f, 0.5f}));
}

TEST(Creation, Arange) {
  const Tensor a = arange(5);
  EXPECT_EQ(a.dtype(), int64);
  EXPECT_EQ(a.to_vector<int64_t>(), (I64{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(3, int32).dtype(), int32);
  // numpy: np.arange(0, 1, 0.25) -> [0, 0.25, 0.5, 0.75]
  const Tensor b = arange(0.0, 1.0, 0.25);
  EXPECT_EQ(b.dtype(), float32);
  EXPECT_EQ(b.to_vector<float>(), (F{0, 0.25f, 0.5f, 0.75f}));
  // numpy: np.arange(5, 0, -2) -> [5, 3, 1]
  EXPECT_EQ(arange(5.0, 0.0, -2.0, int32).to_vector<int32_t>(), (I32{5, 3, 1}));
  // numpy: np.arange(1, 2.01, 0.5) -> [1, 1.5, 2]; np.arange(0, 1, 0.3) has 4 elements
  EXPECT_EQ(arange(1.0, 2.01, 0.5, float64).to_vector<double>(), (D{1.0, 1.5, 2.0}));
  EXPECT_EQ(arange(0.0, 1.0, 0.3).numel(), 4);
  EXPECT_EQ(arange(0).numel(), 0);
  EXPECT_EQ(arange(3.0, 1.0).numel(), 0);  // empty, not an error
  expect_error([] { (void)arange(0.0, 1.0, 0.0); }, "arange", {"step=0"});
}

TEST(Creation, Linspace) {
  // numpy: np.linspace(0, 1, 5) -> [0, 0.25, 0.5, 0.75, 1]
  EXPECT_EQ(linspace(0, 1, 5).to_vector<float>(), (F{0, 0.25f, 0.5f, 0.75f, 1}));
  // numpy: np.linspace(-1, 1, 3) -> [-1, 0, 1]; np.linspace(2, 3, 1) -> [2]
  EXPECT_EQ(linspace(-1, 1, 3, float64).to_vector<double>(), (D{-1, 0, 1}));
  EXPECT_EQ(linspace(2, 3, 1).to_vector<float>(), (F{2}));
  EXPECT_EQ(linspace(0, 1, 0).numel(), 0);
  // numpy: np.linspace(0, 1, 7)[-1] == 1.0 exactly and [3] == 0.5
  const std::vector<double> v = linspace(0, 1, 7, float64).to_vector<double>();
  EXPECT_EQ(v.back(), 1.0);
  EXPECT_EQ(v[3], 0.5);
  EXPECT_DOUBLE_EQ(v[1], 1.0 / 6.0);
  expect_error([] { (void)linspace(0, 1, -1); }, "linspace", {"num=-1"});
}

TEST(Creation, Eye) {
  EXPECT_EQ(eye(3).to_vector<float>(), (F{1, 0, 0, 0, 1, 0, 0, 0, 1}));
  const Tensor r = eye(2, 3, int32);
  EXPECT_EQ(r.shape(), (Shape{2, 3}));
  EXPECT_EQ(r.to_vector<int32_t>(), (I32{1, 0, 0, 0, 1, 0}));
  EXPECT_EQ(eye(3, 2).to_vector<float>(), (F{1, 0, 0, 1, 0, 0}));
  EXPECT_EQ(eye(0).numel(), 0);
  EXPECT_EQ(eye(2, 0).shape(), (Shape{2, 0}));
  EXPECT_EQ(eye(2, bool_).to_vector<bool>(), (std::vector<bool>{true, false, false, true}));
}

// ---- 0-d and zero-size tensors ---------------------------------------------------------

TEST(Scalars, ZeroDimensional) {
  const Tensor s = tensor(3.5f);
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(s.shape(), Shape{});
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.item<float>(), 3.5f);
  EXPECT_EQ(s.item<int32_t>(), 3);
  EXPECT_EQ(s.item<double>(), 3.5);
  EXPECT_EQ(s.to_vector<float>(), (F{3.5f}));
  EXPECT_TRUE(s.is_contiguous());
  EXPECT_EQ(tensor(7).dtype(), int32);
  EXPECT_EQ(tensor(7).item<int64_t>(), 7);
  EXPECT_EQ(tensor(true).item<bool>(), true);
  EXPECT_EQ(tensor(2.0).dtype(), float64);
  // item() of a one-element tensor of any rank works.
  EXPECT_EQ(tensor({4}, Shape{1, 1, 1}).item<int32_t>(), 4);
  // Arithmetic on 0-d tensors stays 0-d.
  const Tensor t = add(s, tensor(1.5f));
  EXPECT_EQ(t.rank(), 0);
  EXPECT_EQ(t.item<float>(), 5.0f);
  EXPECT_EQ(to_string(s), "3.5");
  EXPECT_EQ(to_string(tensor(42)), "42");
}

TEST(Scalars, ZeroSize) {
  const Tensor e = zeros(Shape{0, 3});
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(e.shape(), (Shape{0, 3}));
  EXPECT_TRUE(e.to_vector<float>().empty());
  EXPECT_TRUE(e.to_vector<bool>().empty());
  const Tensor v = tensor(std::vector<float>{}, Shape{0});
  EXPECT_EQ(v.numel(), 0);
  EXPECT_EQ((v + 1.0).numel(), 0);
  EXPECT_EQ(reshape(e, Shape{3, 0, 5}).shape(), (Shape{3, 0, 5}));
  EXPECT_EQ(transpose(e).shape(), (Shape{3, 0}));
  EXPECT_EQ(to_string(v), "[]");
  expect_error([&] { (void)e.item<float>(); }, "item", {"f32[0,3]", "0 elements"});
}

// ---- views ------------------------------------------------------------------------------

TEST(Views, TransposeSharesStorage) {
  const Tensor x = tensor({1, 2, 3, 4, 5, 6}, Shape{2, 3});
  const Tensor t = transpose(x);
  EXPECT_TRUE(t.shares_storage_with(x));
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_EQ(t.strides(), (I64{1, 3}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.to_vector<int32_t>(), (I32{1, 4, 2, 5, 3, 6}));
  const Tensor c = t.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FALSE(c.shares_storage_with(x));
  EXPECT_EQ(c.to_vector<int32_t>(), (I32{1, 4, 2, 5, 3, 6}));
  EXPECT_TRUE(x.contiguous().shares_storage_with(x));
  // Writing through the base shows in the view.
  x.data<int32_t>()[1] = 20;
  EXPECT_EQ(t.to_vector<int32_t>(), (I32{1, 4, 20, 5, 3, 6}));
}

TEST(Views, SliceWithSteps) {
  const Tensor x = arange(20, int32);  // 0..19
  const Tensor m = reshape(x, Shape{4, 5});
  EXPECT_TRUE(m.shares_storage_with(x));
  // numpy: np.arange(20).reshape(4, 5)[1::2, ::2] -> [[5, 7, 9], [15, 17, 19]]
  const Tensor s = slice(m, {Slice{1, std::nullopt, 2}, Slice{std::nullopt, std::nullopt, 2}});
  EXPECT_TRUE(s.shares_storage_with(x));
  EXPECT_EQ(s.shape(), (Shape{2, 3}));
  EXPECT_EQ(s.strides(), (I64{10, 2}));
  EXPECT_EQ(s.offset(), 5);
  EXPECT_EQ(s.to_vector<int32_t>(), (I32{5, 7, 9, 15, 17, 19}));
  // numpy: ...[::-1, 3:0:-2] -> [[18, 16], [13, 11], [8, 6], [3, 1]]
  const Tensor r = slice(m, {Slice{std::nullopt, std::nullopt, -1}, Slice{3, 0, -2}});
  EXPECT_TRUE(r.shares_storage_with(x));
  EXPECT_EQ(r.to_vector<int32_t>(), (I32{18, 16, 13, 11, 8, 6, 3, 1}));
  // A view of a view.
  const Tensor rr = index(r, 2);
  EXPECT_TRUE(rr.shares_storage_with(x));
  EXPECT_EQ(rr.to_vector<int32_t>(), (I32{8, 6}));
  EXPECT_EQ(index(m, -1).to_vector<int32_t>(), (I32{15, 16, 17, 18, 19}));
}

TEST(Views, BroadcastExpandSqueeze) {
  const Tensor x = tensor({1.0f, 2.0f, 3.0f});
  const Tensor b = broadcast_to(x, Shape{2, 3});
  EXPECT_TRUE(b.shares_storage_with(x));
  EXPECT_EQ(b.strides(), (I64{0, 1}));
  EXPECT_EQ(b.to_vector<float>(), (F{1, 2, 3, 1, 2, 3}));
  const Tensor col = reshape(x, Shape{3, 1});
  const Tensor bc = broadcast_to(col, Shape{3, 2});
  EXPECT_TRUE(bc.shares_storage_with(x));
  EXPECT_EQ(bc.to_vector<float>(), (F{1, 1, 2, 2, 3, 3}));

  const Tensor e = expand_dims(x, 0);
  EXPECT_TRUE(e.shares_storage_with(x));
  EXPECT_EQ(e.shape(), (Shape{1, 3}));
  EXPECT_EQ(expand_dims(x, -1).shape(), (Shape{3, 1}));
  const Tensor sq = squeeze(reshape(x, Shape{1, 3, 1}));
  EXPECT_TRUE(sq.shares_storage_with(x));
  EXPECT_EQ(sq.shape(), (Shape{3}));
  EXPECT_EQ(sq.to_vector<float>(), (F{1, 2, 3}));
  EXPECT_EQ(squeeze(reshape(x, Shape{1, 3, 1}), {-1}).shape(), (Shape{1, 3}));
}

TEST(Views, ReshapeContiguousIsAViewNonContiguousCopies) {
  const Tensor x = arange(6.0, 12.0);
  const Tensor r = reshape(x, Shape{2, 3});
  EXPECT_TRUE(r.shares_storage_with(x));
  EXPECT_EQ(r.to_vector<float>(), (F{6, 7, 8, 9, 10, 11}));
  // A contiguous row of a matrix (non-zero offset) reshapes as a view too.
  const Tensor row = index(r, 1);
  const Tensor rr = reshape(row, Shape{3, 1});
  EXPECT_TRUE(rr.shares_storage_with(x));
  EXPECT_EQ(rr.to_vector<float>(), (F{9, 10, 11}));
  // Transposed data is not contiguous: reshape copies, in row-major order of the view.
  const Tensor t = transpose(r);
  const Tensor flat = reshape(t, Shape{6});
  EXPECT_FALSE(flat.shares_storage_with(x));
  EXPECT_EQ(flat.to_vector<float>(), (F{6, 9, 7, 10, 8, 11}));
  EXPECT_EQ(flatten(t).to_vector<float>(), (F{6, 9, 7, 10, 8, 11}));
  // Stepped slices are not contiguous either.
  const Tensor st = slice(r, {Slice{}, Slice{0, std::nullopt, 2}});  // [[6, 8], [9, 11]]
  const Tensor sr = reshape(st, Shape{4});
  EXPECT_FALSE(sr.shares_storage_with(x));
  EXPECT_EQ(sr.to_vector<float>(), (F{6, 8, 9, 11}));
  // Only adding or removing size-1 axes is a view of any strided input (squeeze, expand_dims).
  const Tensor e = expand_dims(t, 1);  // [3, 1, 2]
  EXPECT_TRUE(e.shares_storage_with(x));
  EXPECT_EQ(e.shape(), (Shape{3, 1, 2}));
  EXPECT_EQ(e.to_vector<float>(), (F{6, 9, 7, 10, 8, 11}));
  const Tensor sq = squeeze(e);
  EXPECT_TRUE(sq.shares_storage_with(x));
  EXPECT_EQ(sq.strides(), t.strides());
  EXPECT_EQ(sq.to_vector<float>(), (F{6, 9, 7, 10, 8, 11}));
  const Tensor col = reshape(slice(x, {Slice{0, std::nullopt, 2}}), Shape{3, 1});
  EXPECT_TRUE(col.shares_storage_with(x));
  EXPECT_EQ(col.to_vector<float>(), (F{6, 8, 10}));
  expect_error([&] { (void)reshape(x, Shape{4, 2}); }, "reshape", {"f32[6]", "[4, 2]", "6", "8"});
}

// ---- printing --------------------------------------------------------------------------

TEST(Printing, NumpyLikeFormat) {
  EXPECT_EQ(to_string(tensor({12, 30})), "[12, 30]");
  EXPECT_EQ(to_string(tensor({1, 100, -5})), "[  1, 100,  -5]");
  EXPECT_EQ(to_string(tensor({1, 2, 3, 4}, Shape{2, 2})), "[[1, 2],\n [3, 4]]");
  // numpy: np.array2string(np.arange(8).reshape(2, 2, 2), separator=', ')
  EXPECT_EQ(to_string(reshape(arange(8), Shape{2, 2, 2})),
            "[[[0, 1],\n  [2, 3]],\n\n [[4, 5],\n  [6, 7]]]");
  EXPECT_EQ(to_string(tensor({0.5f, 2.5f})), "[0.5, 2.5]");
  EXPECT_EQ(to_string(tensor({NAN, INFINITY, -INFINITY})), "[ nan,  inf, -inf]");
  EXPECT_EQ(to_string(tensor({true, false})), "[ true, false]");
  // Integers print exactly, also beyond 2^53 and at the ends of their ranges.
  EXPECT_EQ(to_string(tensor({int64_t{9007199254740993}, int64_t{-1}})),
            "[9007199254740993,               -1]");
  EXPECT_EQ(to_string(tensor({std::numeric_limits<int64_t>::min()})), "[-9223372036854775808]");
  EXPECT_EQ(to_string(tensor(std::vector<unsigned>{4294967295u}, Shape{1})), "[4294967295]");
  EXPECT_EQ(to_string(tensor(std::vector<uint8_t>{255, 0}, Shape{2})), "[255,   0]");
  // Printing a view prints its values, not the underlying buffer.
  EXPECT_EQ(to_string(transpose(tensor({1, 2, 3, 4}, Shape{2, 2}))), "[[1, 3],\n [2, 4]]");
  std::ostringstream os;
  os << tensor({7, 8});
  EXPECT_EQ(os.str(), "[7, 8]");
  std::ostringstream undefined;
  undefined << Tensor();
  EXPECT_EQ(undefined.str(), "Tensor(undefined)");
}

TEST(Printing, SummarisesAboveAThousandElements) {
  // numpy: np.array2string(np.arange(1001), separator=', ')
  EXPECT_EQ(to_string(arange(1001)), "[   0,    1,    2, ...,  998,  999, 1000]");
  // 1000 elements are printed in full.
  const std::string full1000 = to_string(arange(1000));
  EXPECT_EQ(full1000.find("..."), std::string::npos);
  EXPECT_NE(full1000.find("500, 501"), std::string::npos);
  // numpy: np.array2string(np.arange(1200).reshape(40, 30), separator=', ')
  EXPECT_EQ(to_string(reshape(arange(1200), Shape{40, 30})),
            "[[   0,    1,    2, ...,   27,   28,   29],\n"
            " [  30,   31,   32, ...,   57,   58,   59],\n"
            " [  60,   61,   62, ...,   87,   88,   89],\n"
            " ...,\n"
            " [1110, 1111, 1112, ..., 1137, 1138, 1139],\n"
            " [1140, 1141, 1142, ..., 1167, 1168, 1169],\n"
            " [1170, 1171, 1172, ..., 1197, 1198, 1199]]");
}

// ---- errors -------------------------------------------------------------------------

TEST(Errors, ItemOfNonScalar) {
  const Tensor x = zeros(Shape{2, 3});
  expect_error([&] { (void)x.item<float>(); }, "item", {"f32[2,3]", "6 elements"});
}

TEST(Errors, UndefinedTensor) {
  const Tensor u;
  EXPECT_FALSE(u.defined());
  EXPECT_THROW((void)u.shape(), Error);
  EXPECT_THROW((void)u.dtype(), Error);
  expect_error([&] { (void)u.item<float>(); }, "tensor", {"undefined"});
  expect_error([&] { (void)u.to_vector<float>(); }, "tensor", {"undefined"});
  EXPECT_THROW((void)add(u, tensor({1.0f})), Error);
  EXPECT_THROW((void)exp(u), Error);
  EXPECT_FALSE(u.shares_storage_with(u));
}

TEST(Errors, WrongElementTypeAccess) {
  const Tensor x = tensor({1.0f});
  EXPECT_THROW((void)x.data<double>(), Error);
  EXPECT_NO_THROW((void)x.data<float>());
  EXPECT_THROW((void)zeros(Shape{-2}), Error);
}

}  // namespace
