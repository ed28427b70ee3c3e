// Tests of kiln::data. File fixtures are written byte by byte here (IDX, gzip with stored
// deflate blocks, PNG with stored deflate, CSV), so the decoders are checked against contents
// known independently of zlib/libpng; JPEG files come from libjpeg and are compared within the
// codec's tolerance.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kiln/data.h"
#include "sanitizers.h"
#include "testing.h"

namespace fs = std::filesystem;
namespace data = kiln::data;
using data::Batch;
using data::Pipeline;
using data::Sample;
using kiln::Tensor;

namespace {

using kiln::testing::expect_allclose;

// ---- byte-level fixture writers -------------------------------------------------------------

using Bytes = std::vector<uint8_t>;

uint32_t crc32(const uint8_t* p, std::size_t n, uint32_t crc = 0) {
  crc = ~crc;
  for (std::size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint32_t adler32(const Bytes& b) {
  uint32_t a = 1, s = 0;
  for (uint8_t x : b) {
    a = (a + x) % 65521;
    s = (s + a) % 65521;
  }
  return s << 16 | a;
}

void put_be32(Bytes& out, uint32_t v) {
  for (int k = 3; k >= 0; --k) out.push_back(static_cast<uint8_t>(v >> (8 * k)));
}
void put_le32(Bytes& out, uint32_t v) {
  for (int k = 0; k < 4; ++k) out.push_back(static_cast<uint8_t>(v >> (8 * k)));
}

// Deflate "stored" blocks: no compression, so the bytes are known without zlib.
void put_stored(Bytes& out, const Bytes& payload) {
  std::size_t pos = 0;
  do {
    const std::size_t n = std::min<std::size_t>(65535, payload.size() - pos);
    const bool last = pos + n == payload.size();
    out.push_back(last ? 1 : 0);
    out.push_back(static_cast<uint8_t>(n));
    out.push_back(static_cast<uint8_t>(n >> 8));
    out.push_back(static_cast<uint8_t>(~n));
    out.push_back(static_cast<uint8_t>(~n >> 8));
    out.insert(out.end(), payload.begin() + static_cast<long>(pos),
               payload.begin() + static_cast<long>(pos + n));
    pos += n;
  } while (pos < payload.size());
}

Bytes gzip_stored(const Bytes& payload) {
  Bytes out{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff};
  put_stored(out, payload);
  put_le32(out, crc32(payload.data(), payload.size()));
  put_le32(out, static_cast<uint32_t>(payload.size()));
  return out;
}

// A gzip member holding `prefix` then `zeros` zero bytes, deflated with fixed Huffman codes (RFC
// 1951, 3.2.6): the prefix as literals, then a zero literal and copies of 258 bytes at distance 1,
// 13 bits each. 4 MiB of zeros take about 26 KB: a decompression bomb built without zlib.
Bytes gzip_zero_run(const Bytes& prefix, int64_t zeros) {
  Bytes out{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff};
  uint32_t acc = 0;
  int nbits = 0;
  const auto bits = [&](uint32_t v, int n) {  // LSB first
    acc |= v << nbits;
    nbits += n;
    while (nbits >= 8) {
      out.push_back(static_cast<uint8_t>(acc));
      acc >>= 8;
      nbits -= 8;
    }
  };
  const auto code = [&](uint32_t c, int n) {  // Huffman codes go MSB first
    for (int i = n - 1; i >= 0; --i) bits((c >> i) & 1u, 1);
  };
  const auto literal = [&](uint8_t v) {
    if (v < 144) {
      code(0x30u + v, 8);
    } else {
      code(0x190u + (v - 144u), 9);
    }
  };
  bits(1, 1);  // BFINAL
  bits(1, 2);  // BTYPE 01: fixed codes
  for (uint8_t v : prefix) literal(v);
  int64_t left = zeros;
  if (left > 0) {
    literal(0);
    --left;
  }
  for (; left >= 258; left -= 258) {
    code(0xC5, 8);  // length code 285: 258 bytes
    code(0, 5);     // distance code 0: distance 1
  }
  for (; left > 0; --left) literal(0);
  code(0, 7);  // end of block (256)
  if (nbits) bits(0, 8 - nbits);
  uint32_t crc = crc32(prefix.data(), prefix.size());
  const Bytes block(1 << 16, 0);
  for (int64_t done = 0; done < zeros; done += static_cast<int64_t>(block.size()))
    crc = crc32(block.data(),
                static_cast<std::size_t>(std::min<int64_t>(zeros - done, block.size())), crc);
  put_le32(out, crc);
  put_le32(out, static_cast<uint32_t>(static_cast<int64_t>(prefix.size()) + zeros));
  return out;
}

Bytes idx_file(uint8_t type, const std::vector<uint32_t>& dims, const Bytes& payload) {
  Bytes out{0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) put_be32(out, d);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

void put_chunk(Bytes& out, const char* type, const Bytes& body) {
  put_be32(out, static_cast<uint32_t>(body.size()));
  Bytes typed(type, type + 4);
  typed.insert(typed.end(), body.begin(), body.end());
  out.insert(out.end(), typed.begin(), typed.end());
  put_be32(out, crc32(typed.data(), typed.size()));
}

// An 8-bit PNG (colour type 0 gray, 2 RGB, 6 RGBA) with unfiltered rows in stored deflate.
Bytes png_stored(uint32_t w, uint32_t h, uint8_t color_type, const Bytes& pixels) {
  const uint32_t c = color_type == 0 ? 1 : color_type == 2 ? 3 : 4;
  Bytes out{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  Bytes ihdr;
  put_be32(ihdr, w);
  put_be32(ihdr, h);
  ihdr.insert(ihdr.end(), {8, color_type, 0, 0, 0});
  put_chunk(out, "IHDR", ihdr);
  Bytes raw;
  for (uint32_t y = 0; y < h; ++y) {
    raw.push_back(0);  // filter type None
    raw.insert(raw.end(), pixels.begin() + y * w * c, pixels.begin() + (y + 1) * w * c);
  }
  Bytes z{0x78, 0x01};
  put_stored(z, raw);
  put_be32(z, adler32(raw));
  put_chunk(out, "IDAT", z);
  put_chunk(out, "IEND", {});
  return out;
}

// A scratch directory per test (ctest may run tests as parallel processes).
class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("kiln_data_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const Bytes& b) const {
    data::write_file(path(name), b);
    return path(name);
  }
  std::string write_text(const std::string& name, const std::string& s) const {
    return write(name, Bytes(s.begin(), s.end()));
  }
  fs::path dir_;
};

// Expects a kiln::Error whose message contains every fragment.
template <typename F>
void expect_error(F&& f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "expected a kiln::Error containing '" << fragments.front() << "'";
  } catch (const kiln::Error& e) {
    const std::string msg = e.what();
    for (const auto& frag : fragments)
      EXPECT_NE(msg.find(frag), std::string::npos) << "message: " << msg << "\nmissing: " << frag;
  }
}

Pipeline range_pipeline(int64_t n) {
  std::vector<int64_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return data::from_tensors({{"x", kiln::tensor(v, kiln::Shape{n})}});
}

std::vector<int64_t> collect_x(Pipeline& p) {
  std::vector<int64_t> out;
  for (Sample& s : p) {
    const auto v = s.at("x").to_vector<int64_t>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

std::vector<int64_t> iota_vec(int64_t n) {
  std::vector<int64_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

std::vector<std::vector<uint8_t>> batch_bytes(Pipeline& p, int max_batches = 1 << 30) {
  std::vector<std::vector<uint8_t>> out;
  if (max_batches == 0) return out;
  for (Batch& b : p) {
    std::vector<uint8_t> bytes;
    for (const auto& [name, t] : b) {
      const auto* d = static_cast<const uint8_t*>(t.contiguous().raw_data());
      bytes.insert(bytes.end(), name.begin(), name.end());
      bytes.insert(bytes.end(), d,
                   d + t.numel() * static_cast<int64_t>(kiln::dtype_size(t.dtype())));
    }
    out.push_back(std::move(bytes));
    if (static_cast<int>(out.size()) == max_batches) break;
  }
  return out;
}

// 8x8 gray images whose pixels encode their sample index (pixel = (i * 7 + y * 8 + x) % 256).
Pipeline image_pipeline(int64_t n) {
  Tensor img = kiln::empty(kiln::Shape{n, 8, 8}, kiln::uint8);
  auto* p = img.data<uint8_t>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < 64; ++k) p[i * 64 + k] = static_cast<uint8_t>((i * 7 + k) % 256);
  std::vector<int64_t> labels(static_cast<std::size_t>(n));
  std::iota(labels.begin(), labels.end(), 0);
  return data::from_tensors({{"image", img}, {"label", kiln::tensor(labels, kiln::Shape{n})}});
}

}  // namespace

// ---- samples and randomness ------------------------------------------------------------------

TEST(DataSample, FieldsInOrderAndMissingFieldError) {
  Sample s{{"a", kiln::tensor(1.0f)}, {"b", kiln::tensor(2)}};
  s.set("c", kiln::tensor(3.0));
  s.set("a", kiln::tensor(5.0f));
  EXPECT_EQ(s.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(s.at("a").item<float>(), 5.0f);
  EXPECT_TRUE(s.erase("b"));
  EXPECT_FALSE(s.contains("b"));
  expect_error([&] { (void)s.at("zz"); }, {"[data.sample]", "no field 'zz'", "{a, c}"});
}

TEST(DataRng, PureFunctionOfKeyAndUniformRange) {
  EXPECT_EQ(data::sample_key(1, 2, 3), data::sample_key(1, 2, 3));
  EXPECT_NE(data::sample_key(1, 2, 3), data::sample_key(1, 2, 4));
  EXPECT_NE(data::sample_key(1, 2, 3), data::sample_key(1, 3, 3));
  EXPECT_NE(data::sample_key(1, 2, 3), data::sample_key(2, 2, 3));
  data::Rng a(42), b(42);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.next_u64(), b.next_u64());
  // 60,000 draws in [0, 6): each value within 5 standard deviations of 10,000.
  data::Rng r(7);
  std::vector<int> hist(6);
  for (int i = 0; i < 60000; ++i) {
    const int64_t v = r.uniform_int(0, 6);
    ASSERT_GE(v, 0);
    ASSERT_LT(v, 6);
    ++hist[static_cast<std::size_t>(v)];
  }
  for (int h : hist) EXPECT_NEAR(h, 10000, 5 * std::sqrt(60000 * (1.0 / 6) * (5.0 / 6)));
}

// ---- basic transforms --------------------------------------------------------------------------

TEST(DataPipeline, FromTensorsBatchesWithRemainder) {
  auto p = range_pipeline(10).batch(4);
  ASSERT_EQ(p.size(), 3);
  std::vector<std::vector<int64_t>> got;
  for (Batch& b : p) {
    EXPECT_TRUE(b.at("x").is_contiguous());
    got.push_back(b.at("x").to_vector<int64_t>());
  }
  EXPECT_EQ(got, (std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}}));
  auto q = range_pipeline(10).batch(4, /*drop_remainder=*/true);
  EXPECT_EQ(q.size(), 2);
  EXPECT_EQ(collect_x(q), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(DataPipeline, BatchOfImagesHasLeadingAxis) {
  auto p = image_pipeline(5).batch(2);
  auto it = p.begin();
  const Tensor& img = it->at("image");
  EXPECT_EQ(img.shape(), (kiln::Shape{2, 8, 8}));
  EXPECT_EQ(it->at("label").shape(), (kiln::Shape{2}));
  // Sample 1, pixel (2, 3): (1 * 7 + 19) % 256 = 26.
  EXPECT_EQ(img.data<uint8_t>()[64 + 2 * 8 + 3], 26);
}

TEST(DataPipeline, BatchPadsVariableLengthFields) {
  auto p = range_pipeline(3)
               .map([](Sample s) {
                 const int64_t x = s.at("x").item<int64_t>();
                 std::vector<int> seq(static_cast<std::size_t>(x + 1), static_cast<int>(x + 1));
                 s.set("seq", kiln::tensor(seq));
                 return s;
               })
               .batch(3, data::BatchOptions{.pad = {{"seq", -1}}});
  auto it = p.begin();
  EXPECT_EQ(it->at("seq").shape(), (kiln::Shape{3, 3}));
  EXPECT_EQ(it->at("seq").to_vector<int>(), (std::vector<int>{1, -1, -1, 2, 2, -1, 3, 3, 3}));
  EXPECT_EQ(it->at("seq_length").to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3}));
  auto unpadded = range_pipeline(3)
                      .map([](Sample s) {
                        s.set("seq", kiln::zeros(kiln::Shape{s.at("x").item<int64_t>() + 1}));
                        return s;
                      })
                      .batch(3);
  expect_error([&] { unpadded.begin(); },
               {"[data.batch]", "'seq' changes shape", "BatchOptions::pad"});
}

TEST(DataPipeline, FilterTakeSkipRepeat) {
  auto even =
      range_pipeline(10).filter([](const Sample& s) { return s.at("x").item<int64_t>() % 2 == 0; });
  EXPECT_FALSE(even.size().has_value());
  EXPECT_EQ(collect_x(even), (std::vector<int64_t>{0, 2, 4, 6, 8}));
  auto t = range_pipeline(10).skip(3).take(4);
  EXPECT_EQ(t.size(), 4);
  EXPECT_EQ(collect_x(t), (std::vector<int64_t>{3, 4, 5, 6}));
  auto r = range_pipeline(3).repeat(2);
  EXPECT_EQ(r.size(), 6);
  EXPECT_EQ(collect_x(r), (std::vector<int64_t>{0, 1, 2, 0, 1, 2}));
  auto forever = range_pipeline(2).repeat().take(5);
  EXPECT_EQ(collect_x(forever), (std::vector<int64_t>{0, 1, 0, 1, 0}));
  auto stream_take = even.take(2);
  EXPECT_EQ(collect_x(stream_take), (std::vector<int64_t>{0, 2}));
}

TEST(DataPipeline, BatchByNameWhateverTheFieldOrderAndNoSilentOverwrite) {
  // Odd samples list their fields in the other order: batching goes by name.
  auto swapped =
      range_pipeline(4)
          .map([](Sample s) {
            const Tensor x = s.at("x");
            const Tensor y = kiln::tensor(10 * x.item<int64_t>());
            return x.item<int64_t>() % 2 ? Sample{{"y", y}, {"x", x}} : Sample{{"x", x}, {"y", y}};
          })
          .batch(4);
  const Batch b = *swapped.next();
  EXPECT_EQ(b.names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(b.at("x").to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(b.at("y").to_vector<int64_t>(), (std::vector<int64_t>{0, 10, 20, 30}));
  // Padding "x" adds "x_length": a field of that name already there was silently replaced.
  auto clash =
      data::from_tensors({{"x", kiln::zeros(kiln::Shape{2, 3}, kiln::int64)},
                          {"x_length", kiln::tensor(std::vector<int64_t>{7, 7}, kiln::Shape{2})}})
          .batch(2, data::BatchOptions{.pad = {{"x", 0}}});
  expect_error([&] { clash.next(); }, {"[data.batch]", "'x_length' exists already"});
}

TEST(DataPipeline, SizesAreCheckedArithmetic) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  // 1000 x INT64_MAX elements do not fit in int64: the size is unknown, as for repeat().
  EXPECT_EQ(range_pipeline(1000).repeat(kMax).size(), std::nullopt);
  EXPECT_EQ(range_pipeline(1000).repeat(kMax).batch(10).size(), std::nullopt);
  EXPECT_EQ(range_pipeline(1000).repeat(kMax / 1000).size(), kMax / 1000 * 1000);
  // ceil(10 / INT64_MAX) is 1, where (10 + INT64_MAX - 1) / INT64_MAX overflows.
  EXPECT_EQ(range_pipeline(10).batch(kMax).size(), 1);
  EXPECT_EQ(range_pipeline(10).shard(kMax, 0).size(), 1);
  EXPECT_EQ(range_pipeline(10).shard(kMax, 5).size(), 1);
  EXPECT_EQ(range_pipeline(10).shard(kMax, 10).size(), 0);
  EXPECT_EQ(range_pipeline(10).skip(kMax).size(), 0);
  EXPECT_EQ(range_pipeline(10).take(kMax).size(), 10);
  auto shard = range_pipeline(10).shard(kMax, 5);
  EXPECT_EQ(collect_x(shard), (std::vector<int64_t>{5}));
  auto stream_shard = range_pipeline(10).filter([](const Sample&) { return true; }).shard(kMax, 5);
  EXPECT_EQ(collect_x(stream_shard), (std::vector<int64_t>{5}));
  auto whole = range_pipeline(10).batch(kMax);
  EXPECT_EQ(collect_x(whole), iota_vec(10));
  // A batch or a chunk as large as asked is never reserved up front.
  auto stream_whole = range_pipeline(10).filter([](const Sample&) { return true; }).batch(kMax);
  EXPECT_EQ(collect_x(stream_whole), iota_vec(10));
  auto huge_chunks =
      range_pipeline(10)
          .filter([](const Sample&) { return true; })
          .map([](Sample s) { return s; }, {.num_threads = 2, .chunk_size = INT_MAX});
  EXPECT_EQ(collect_x(huge_chunks), iota_vec(10));
  // Inner epochs of far repetitions wrap around instead of overflowing (UBSan checks this).
  auto rep = range_pipeline(3).repeat(kMax);
  rep.set_epoch(5);
  EXPECT_EQ(rep.next()->at("x").item<int64_t>(), 0);
  auto forever = range_pipeline(3).repeat();
  forever.set_epoch(int64_t{1} << 40);
  EXPECT_EQ(forever.next()->at("x").item<int64_t>(), 0);
  // Resuming a stream at a position whose input element does not fit in int64 is an Error.
  auto resumed = range_pipeline(10).filter([](const Sample&) { return true; }).shard(kMax, 1);
  resumed.restore({resumed.state().fingerprint, 0, 2});
  expect_error([&] { resumed.next(); }, {"[data.shard]", "position 2", "fits in int64"});
  auto resumed_batch =
      range_pipeline(10).filter([](const Sample&) { return true; }).batch(kMax / 2);
  resumed_batch.restore({resumed_batch.state().fingerprint, 0, 3});
  expect_error([&] { resumed_batch.next(); }, {"[data.batch]", "position 3", "fits in int64"});
}

TEST(DataPipeline, ZipAndShard) {
  auto a = range_pipeline(5);
  auto b = range_pipeline(4).map([](Sample s) {
    Sample out;
    out.set("y", kiln::tensor(s.at("x").item<int64_t>() * 10));
    return out;
  });
  auto z = a.zip(b);
  EXPECT_EQ(z.size(), 4);
  std::vector<int64_t> ys;
  for (Sample& s : z) {
    EXPECT_EQ(s.at("y").item<int64_t>(), 10 * s.at("x").item<int64_t>());
    ys.push_back(s.at("y").item<int64_t>());
  }
  EXPECT_EQ(ys, (std::vector<int64_t>{0, 10, 20, 30}));
  expect_error([&] { a.zip(a).begin(); }, {"[data.zip]", "field 'x'"});

  // Shards of an indexed and of a streaming pipeline partition the data.
  for (bool stream : {false, true}) {
    std::vector<int64_t> all;
    for (int k = 0; k < 3; ++k) {
      auto base = range_pipeline(10);
      if (stream) base = base.filter([](const Sample&) { return true; });
      auto s = base.shard(3, k);
      const auto got = collect_x(s);
      for (std::size_t j = 0; j < got.size(); ++j)
        EXPECT_EQ(got[j], static_cast<int64_t>(k + 3 * j));
      all.insert(all.end(), got.begin(), got.end());
    }
    std::sort(all.begin(), all.end());
    EXPECT_EQ(all, iota_vec(10));
  }
  expect_error([] { range_pipeline(3).shard(2, 2); }, {"[data.shard]", "index 2"});
}

TEST(DataPipeline, ShuffleIsAPermutationPerEpoch) {
  auto p = range_pipeline(100).shuffle(5);
  const auto e0 = collect_x(p);
  const auto e1 = collect_x(p);
  EXPECT_EQ(p.epoch(), 2);
  auto sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, iota_vec(100));
  EXPECT_NE(e0, e1);
  auto again = range_pipeline(100).shuffle(5);
  EXPECT_EQ(collect_x(again), e0);
  auto other = range_pipeline(100).shuffle(6);
  EXPECT_NE(collect_x(other), e0);
  // Buffered shuffle of a stream: still a permutation, reproducible.
  auto stream = range_pipeline(100)
                    .filter([](const Sample&) { return true; })
                    .shuffle(5, {.buffer_size = 10});
  const auto s0 = collect_x(stream);
  auto s_sorted = s0;
  std::sort(s_sorted.begin(), s_sorted.end());
  EXPECT_EQ(s_sorted, sorted);
  EXPECT_NE(s0, sorted);
  auto stream2 = range_pipeline(100)
                     .filter([](const Sample&) { return true; })
                     .shuffle(5, {.buffer_size = 10});
  EXPECT_EQ(collect_x(stream2), s0);
}

// ---- determinism and parallelism
// -----------------------------------------------------------------

namespace {
Pipeline augmented(int threads, bool prefetch) {
  auto p = image_pipeline(203)
               .shuffle(11)
               .map(data::image::normalize({0.5f}, {0.25f})
                        .then(data::image::random_crop(8, 8, 2))
                        .then(data::image::random_horizontal_flip()),
                    {.num_threads = threads, .chunk_size = 7})
               .map(
                   [](Sample s, data::Rng& rng) {
                     s.set("noise", kiln::tensor(static_cast<float>(rng.uniform())));
                     return s;
                   },
                   {.num_threads = threads, .seed = 3})
               .batch(16);
  return prefetch ? p.prefetch(3) : p;
}
}  // namespace

TEST(DataDeterminism, SameBatchesWhateverTheThreadCount) {
  auto ref = augmented(0, false);
  const auto e0 = batch_bytes(ref);
  const auto e1 = batch_bytes(ref);
  ASSERT_EQ(e0.size(), 13u);
  EXPECT_NE(e0, e1);  // a new epoch reshuffles and re-augments
  for (int threads : {1, 2, 4}) {
    for (bool prefetch : {false, true}) {
      auto p = augmented(threads, prefetch);
      EXPECT_EQ(batch_bytes(p), e0) << threads << " threads, prefetch " << prefetch;
      EXPECT_EQ(batch_bytes(p), e1) << threads << " threads, prefetch " << prefetch;
    }
  }
}

TEST(DataDeterminism, ParallelStreamMapMatchesInline) {
  auto make = [](int threads, bool ordered) {
    return range_pipeline(1000)
        .filter([](const Sample& s) { return s.at("x").item<int64_t>() % 3 != 0; })
        .map(
            [](Sample s, data::Rng& rng) {
              s.set("r", kiln::tensor(static_cast<int64_t>(rng.uniform_int(0, 1000000))));
              return s;
            },
            {.num_threads = threads, .ordered = ordered, .chunk_size = 5});
  };
  auto pairs = [](Pipeline p) {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (Sample& s : p) out.emplace_back(s.at("x").item<int64_t>(), s.at("r").item<int64_t>());
    return out;
  };
  const auto ref = pairs(make(0, true));
  ASSERT_EQ(ref.size(), 666u);
  EXPECT_EQ(pairs(make(3, true)), ref);
  auto unordered = pairs(make(3, false));
  std::sort(unordered.begin(), unordered.end());
  auto sorted_ref = ref;
  std::sort(sorted_ref.begin(), sorted_ref.end());
  EXPECT_EQ(unordered, sorted_ref);  // the same elements, in any order
}

TEST(DataDeterminism, UnorderedIndexedMapYieldsEveryElementOnce) {
  auto p =
      range_pipeline(5000).map([](Sample s) { return s; }, {.num_threads = 4, .ordered = false});
  auto got = collect_x(p);
  std::sort(got.begin(), got.end());
  std::vector<int64_t> want(5000);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(got, want);
}

// ---- state and resume --------------------------------------------------------------------------

TEST(DataState, ResumeMidEpochGivesTheSameNextBatches) {
  for (int threads : {0, 2}) {
    auto full = augmented(threads, threads > 0);
    const auto e0 = batch_bytes(full);
    const auto e1 = batch_bytes(full);
    auto all = e0;
    all.insert(all.end(), e1.begin(), e1.end());

    auto first = augmented(threads, threads > 0);
    const auto head = batch_bytes(first, 5);
    ASSERT_EQ(head.size(), 5u);
    const data::PipelineState st = first.state();
    EXPECT_EQ(st.epoch, 0);
    EXPECT_EQ(st.position, 5);
    // Through text, as a checkpoint would store it.
    const auto restored_state = data::PipelineState::parse(st.to_string());
    EXPECT_EQ(restored_state, st);

    auto resumed = augmented(threads, threads > 0);
    resumed.restore(restored_state);
    auto rest = batch_bytes(resumed);
    const auto next_epoch = batch_bytes(resumed);
    rest.insert(rest.end(), next_epoch.begin(), next_epoch.end());
    std::vector<std::vector<uint8_t>> want(all.begin() + 5, all.end());
    EXPECT_EQ(rest, want) << threads << " threads";
    // The original carries on identically after state().
    auto tail = batch_bytes(first);
    EXPECT_EQ(tail, std::vector<std::vector<uint8_t>>(e0.begin() + 5, e0.end()));
  }
}

TEST(DataState, ResumeStreamsAndRepeats) {
  auto make = [] {
    return range_pipeline(50)
        .filter([](const Sample& s) { return s.at("x").item<int64_t>() % 4 != 1; })
        .shuffle(9, {.buffer_size = 8})
        .repeat(3)
        .batch(5);
  };
  auto full = make();
  const auto all = batch_bytes(full);
  for (int cut : {0, 3, 7, 16}) {
    auto a = make();
    batch_bytes(a, cut);
    auto b = make();
    b.restore(a.state());
    EXPECT_EQ(batch_bytes(b), std::vector<std::vector<uint8_t>>(all.begin() + cut, all.end()))
        << "cut at " << cut;
  }
}

TEST(DataState, RestoreRejectsAnotherPipeline) {
  auto a = range_pipeline(10).batch(2);
  auto b = range_pipeline(10).batch(3);
  expect_error([&] { b.restore(a.state()); }, {"[data.restore]", "fingerprint"});
  expect_error([] { data::PipelineState::parse("garbage"); }, {"[data.state]", "garbage"});
  data::PipelineState past = a.state();
  past.position = 6;
  expect_error([&] { a.restore(past); }, {"[data.restore]", "past the end"});
}

// ---- faults
// ---------------------------------------------------------------------------------------

TEST(DataFaults, WorkerExceptionReachesTheConsumer) {
  for (int threads : {0, 1, 3}) {
    for (bool ordered : {true, false}) {
      for (bool prefetch : {false, true}) {
        auto p = range_pipeline(200)
                     .map(
                         [](Sample s) {
                           if (s.at("x").item<int64_t>() == 77)
                             throw std::runtime_error("bad sample 77");
                           return s;
                         },
                         {.num_threads = threads, .ordered = ordered, .chunk_size = 4})
                     .batch(8);
        if (prefetch) p = p.prefetch(2);
        int batches = 0;
        try {
          for (Batch& b : p) {
            (void)b;
            ++batches;
          }
          ADD_FAILURE() << "no exception";
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "bad sample 77");
        }
        if (ordered) {
          EXPECT_EQ(batches, 9);  // batches 0..8 hold elements 0..71
        }
      }
    }
  }
}

TEST(DataFaults, DestroyingMidIterationIsClean) {
  std::atomic<int> calls{0};
  for (int round = 0; round < 20; ++round) {
    auto p = range_pipeline(10000)
                 .map(
                     [&](Sample s) {
                       ++calls;
                       return s;
                     },
                     {.num_threads = 3, .chunk_size = 3})
                 .batch(10)
                 .prefetch(4);
    int n = 0;
    for (Batch& b : p) {
      (void)b;
      if (++n == round % 5 + 1) break;  // leaves workers mid-flight
    }
  }
  EXPECT_GT(calls.load(), 0);
}

// Counts the threads that have called a callable, and those of them that have ended: a
// thread_local's destructor runs as its thread exits.
struct ThreadCounter {
  std::atomic<int>* started;
  std::atomic<int>* exits;
  ThreadCounter(std::atomic<int>* s, std::atomic<int>* e) : started(s), exits(e) { ++*started; }
  ~ThreadCounter() { ++*exits; }
};

TEST(DataFaults, DestructionStopsWorkersBetweenElements) {
  // Two workers, chunks of 32: one blocks in the map at element 32 (chunk 1) until released; the
  // other, once it has started mapping, fills chunks until too many are in flight and waits.
  // Destruction asks both to stop; the other one exits, which shows the stop request was made,
  // and only then is the blocked call released. No further map call may start: the rest of
  // chunk 1 is abandoned.
  for (const bool stream : {false, true}) {
    std::atomic<int> started{0}, exits{0};
    std::atomic<bool> released{false};
    std::atomic<int> calls_after_release{0};
    std::mutex m;
    std::condition_variable cv;
    bool blocked = false, release = false;
    auto f = [&](Sample s) {
      thread_local ThreadCounter counter(&started, &exits);
      (void)counter;
      if (released) ++calls_after_release;
      if (s.at("x").item<int64_t>() == 32) {
        std::unique_lock lock(m);
        blocked = true;
        cv.notify_all();
        cv.wait(lock, [&] { return release; });
      }
      return s;
    };
    Pipeline source = stream ? range_pipeline(1000).filter([](const Sample&) { return true; })
                             : range_pipeline(1000);
    auto p = std::make_unique<Pipeline>(source.map(f, {.num_threads = 2, .chunk_size = 32}));
    ASSERT_EQ(p->next()->at("x").item<int64_t>(), 0);
    {
      std::unique_lock lock(m);
      cv.wait(lock, [&] { return blocked; });
    }
    while (started.load() < 2) std::this_thread::yield();
    std::thread destroyer([&] { p.reset(); });
    while (exits.load() == 0) std::this_thread::yield();
    released = true;
    {
      std::lock_guard lock(m);
      release = true;
    }
    cv.notify_all();
    destroyer.join();
    EXPECT_EQ(exits.load(), 2) << (stream ? "stream" : "random access");
    EXPECT_EQ(calls_after_release.load(), 0) << (stream ? "stream" : "random access");
  }
}

TEST(DataFaults, OnErrorSkipDropsAndCountsBadRecords) {
  auto p = range_pipeline(100)
               .map(
                   [](Sample s) {
                     if (s.at("x").item<int64_t>() % 10 == 3) kiln::fail("user", "odd record");
                     return s;
                   },
                   {.num_threads = 2})
               .on_error(data::OnError::skip)
               .batch(10);
  const auto xs = collect_x(p);
  EXPECT_EQ(xs.size(), 90u);
  EXPECT_TRUE(std::none_of(xs.begin(), xs.end(), [](int64_t x) { return x % 10 == 3; }));
  const auto st = p.stats();
  EXPECT_EQ(st.skipped, 10);
  EXPECT_NE(st.to_string().find("skipped 10"), std::string::npos);
  bool found = false;
  for (const auto& s : st.stages)
    if (s.name == "on_error(skip)") {
      found = true;
      EXPECT_EQ(s.skipped, 10);
      EXPECT_NE(s.last_error.find("odd record"), std::string::npos);
    }
  EXPECT_TRUE(found);
}

TEST(DataStats, CountsItemsPerStage) {
  auto p =
      range_pipeline(64).map([](Sample s) { return s; }, {.num_threads = 2}).batch(8).prefetch(2);
  EXPECT_EQ(collect_x(p).size(), 64u);
  const auto st = p.stats();
  EXPECT_EQ(st.items, 8);
  ASSERT_EQ(st.stages.size(), 2u);
  EXPECT_EQ(st.stages[0].name, "from_tensors(x:i64[64]) -> map(seed=0) -> batch(8)");
  EXPECT_EQ(st.stages[0].items, 8);
  EXPECT_EQ(st.stages[1].name, "prefetch(2)");
  EXPECT_EQ(st.stages[1].items, 8);
  EXPECT_GE(st.wait_seconds, 0.0);
  EXPECT_GT(st.items_per_second, 0.0);
}

// ---- IDX
// ------------------------------------------------------------------------------------------

TEST_F(DataTest, IdxRawAndGzipDecodeToKnownContents) {
  Bytes pixels(3 * 2 * 4);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 10);
  const Bytes imgs = idx_file(0x08, {3, 2, 4}, pixels);
  const Bytes labs = idx_file(0x08, {3}, {7, 0, 9});
  const auto raw_i = write("img.idx", imgs), raw_l = write("lab.idx", labs);
  const auto gz_i = write("img.idx.gz", gzip_stored(imgs)),
             gz_l = write("lab.idx.gz", gzip_stored(labs));
  for (const auto& [ip, lp] : {std::pair{raw_i, raw_l}, std::pair{gz_i, gz_l}}) {
    auto p = data::from_idx(ip, lp);
    ASSERT_EQ(p.size(), 3);
    std::vector<int64_t> labels;
    int64_t k = 0;
    for (Sample& s : p) {
      EXPECT_EQ(s.at("image").shape(), (kiln::Shape{2, 4}));
      EXPECT_EQ(s.at("image").to_vector<uint8_t>(),
                Bytes(pixels.begin() + k * 8, pixels.begin() + (k + 1) * 8));
      EXPECT_EQ(s.at("label").dtype(), kiln::int64);
      labels.push_back(s.at("label").item<int64_t>());
      ++k;
    }
    EXPECT_EQ(labels, (std::vector<int64_t>{7, 0, 9}));
  }
  // Multi-byte types are big-endian: int 0x01020304 and float 1.5 (0x3fc00000).
  const auto ints = write("i.idx", idx_file(0x0C, {2}, {1, 2, 3, 4, 0xff, 0xff, 0xff, 0xfe}));
  EXPECT_EQ(data::read_idx(ints).to_vector<int32_t>(), (std::vector<int32_t>{0x01020304, -2}));
  const auto floats = write("f.idx", idx_file(0x0D, {1}, {0x3f, 0xc0, 0, 0}));
  EXPECT_EQ(data::read_idx(floats).to_vector<float>(), (std::vector<float>{1.5f}));
}

TEST_F(DataTest, IdxFaultsNameTheFileAndOffset) {
  expect_error([&] { data::read_idx(path("nope.idx")); },
               {"[data.read_file]", "nope.idx", "No such file"});
  Bytes pixels(3 * 4, 1);
  Bytes trunc = idx_file(0x08, {3, 2, 2}, pixels);
  trunc.resize(trunc.size() - 5);  // 7 of 12 data bytes: one complete 4-byte record
  const auto tp = write("trunc.idx", trunc);
  expect_error([&] { data::read_idx(tp); }, {"[data.idx]", "truncated IDX file", "trunc.idx",
                                             "7 data bytes", "at byte 16", "expected 12"});
  data::IdxReport rep;
  const Tensor t = data::read_idx(tp, {.on_error = data::OnError::skip}, &rep);
  EXPECT_EQ(t.shape(), (kiln::Shape{1, 2, 2}));
  EXPECT_EQ(rep.skipped, 2);
  Bytes bad_magic = idx_file(0x08, {1}, {0});
  bad_magic[0] = 7;
  expect_error([&] { data::read_idx(write("magic.idx", bad_magic)); },
               {"not an IDX file", "magic.idx", "byte 0"});
  Bytes bad_type = idx_file(0x08, {1}, {0});
  bad_type[2] = 0x42;
  expect_error([&] { data::read_idx(write("type.idx", bad_type)); }, {"element type", "byte 2"});
  // A gzip stream with a flipped payload byte fails its CRC check.
  Bytes gz = gzip_stored(idx_file(0x08, {4}, {1, 2, 3, 4}));
  gz[gz.size() - 9] ^= 0xff;
  expect_error([&] { data::read_idx(write("crc.idx.gz", gz)); },
               {"[data.gzip]", "corrupt gzip file", "crc.idx.gz"});
  Bytes gz_cut = gzip_stored(idx_file(0x08, {4}, {1, 2, 3, 4}));
  gz_cut.resize(gz_cut.size() - 10);
  expect_error([&] { data::read_idx(write("cut.idx.gz", gz_cut)); },
               {"truncated gzip file", "cut.idx.gz"});
  // from_idx with skip reports the loss in the pipeline's statistics.
  const auto labels = write("l.idx", idx_file(0x08, {3}, {1, 2, 3}));
  auto p = data::from_idx(tp, labels, {.on_error = data::OnError::skip});
  EXPECT_EQ(p.size(), 1);
  for (Sample& s : p) (void)s;
  EXPECT_EQ(p.stats().skipped, 2);
  expect_error(
      [&] {
        data::from_idx(write("ok.idx", idx_file(0x08, {2, 1}, {1, 2})), labels);
      },
      {"record counts differ", "2 images", "3 labels"});
}

TEST_F(DataTest, IdxDeclaredSizesAreCheckedBeforeAllocating) {
  // 24 bytes: ubyte, dimensions 1 x 65536^4, whose product 2^64 wraps to 0 in 64 bits.
  const auto wrap = write("wrap.idx", idx_file(0x08, {1, 65536, 65536, 65536, 65536}, {}));
  ASSERT_EQ(fs::file_size(wrap), 24u);
  for (auto on_error : {data::OnError::raise, data::OnError::skip})
    expect_error([&] { data::read_idx(wrap, {.on_error = on_error}); },
                 {"[data.idx]", "wrap.idx", "too large", "1 x 65536 x 65536 x 65536 x 65536"});
  // 2^31 x 2^31 ints are 2^64 bytes; an empty leading axis does not make 2^96 elements fit.
  expect_error(
      [&] {
        data::read_idx(write("ints.idx", idx_file(0x0C, {1u << 31, 1u << 31}, {})));
      },
      {"[data.idx]", "ints.idx", "too large"});
  expect_error(
      [&] {
        data::read_idx(write("empty.idx", idx_file(0x08, {0, ~0u, ~0u, ~0u}, {})));
      },
      {"[data.idx]", "empty.idx", "too large"});
  EXPECT_EQ(data::read_idx(write("none.idx", idx_file(0x08, {0, 3}, {}))).shape(),
            (kiln::Shape{0, 3}));
}

TEST_F(DataTest, IdxDecompressionIsBoundedByMaxBytes) {
  // 4 MiB of zeros in about 26 KB: an IDX file declaring 4 x 1024 x 1024 ubytes.
  const auto bomb =
      write("bomb.idx.gz", gzip_zero_run(idx_file(0x08, {4, 1024, 1024}, {}), 4 << 20));
  EXPECT_LT(fs::file_size(bomb), 30000u);
  const std::vector<std::string> too_large{"[data.idx]", "bomb.idx.gz",
                                           "declares 4194304 data bytes",
                                           "at most 1048576 (IdxOptions::max_bytes)"};
  expect_error([&] { data::read_idx(bomb, {.max_bytes = 1 << 20}); }, too_large);
  expect_error([&] { data::from_idx(bomb, std::nullopt, {.max_bytes = 1 << 20}); }, too_large);
  // Within the limit (the default is 2 GiB) it is an ordinary file.
  const Tensor all = data::read_idx(bomb);
  EXPECT_EQ(all.shape(), (kiln::Shape{4, 1024, 1024}));
  EXPECT_EQ(all.data<uint8_t>()[all.numel() - 1], 0);
  // A header that understates the data: decoding stops one byte past what it declares.
  const auto liar = write("liar.idx.gz", gzip_zero_run(idx_file(0x08, {1, 16}, {}), 4 << 20));
  expect_error([&] { data::read_idx(liar); },
               {"[data.idx]", "oversized IDX file", "liar.idx.gz", "more than 16 data bytes"});
  data::IdxReport rep;
  EXPECT_EQ(data::read_idx(liar, {.on_error = data::OnError::skip}, &rep).shape(),
            (kiln::Shape{1, 16}));
  EXPECT_EQ(rep.skipped, 0);
  EXPECT_NE(rep.error.find("oversized"), std::string::npos) << rep.error;
  // Raw files have the same limit.
  const auto raw = write("raw.idx", idx_file(0x08, {2, 3}, Bytes(6, 7)));
  expect_error([&] { data::read_idx(raw, {.max_bytes = 5}); },
               {"declares 6 data bytes", "at most 5"});
  EXPECT_EQ(data::read_idx(raw, {.max_bytes = 6}).to_vector<uint8_t>(), Bytes(6, 7));
  expect_error([&] { data::read_idx(raw, {.max_bytes = -1}); }, {"bad IdxOptions::max_bytes"});
}

// ---- CSV
// ------------------------------------------------------------------------------------------

TEST_F(DataTest, CsvTypedColumnsAndText) {
  const auto p = write_text("t.csv",
                            "id,score,name,flag\n"
                            "1,0.5,\"Smith, J\",1\r\n"
                            "2,3,\"say \"\"hi\"\"\",0\n"
                            "\n"
                            "3,-1e2,plain,1\n");
  auto ds = data::from_csv(p, {.types = {{"flag", kiln::uint8}}, .text_columns = {"name"}});
  ASSERT_EQ(ds.size(), 3);
  std::vector<int64_t> ids;
  std::vector<float> scores;
  std::vector<std::string> names;
  std::vector<int> flags;
  for (Sample& s : ds) {
    EXPECT_EQ(s.names(), (std::vector<std::string>{"id", "score", "name", "flag"}));
    EXPECT_EQ(s.at("id").dtype(), kiln::int64);
    EXPECT_EQ(s.at("score").dtype(), kiln::float32);
    EXPECT_EQ(s.at("flag").dtype(), kiln::uint8);
    ids.push_back(s.at("id").item<int64_t>());
    scores.push_back(s.at("score").item<float>());
    const auto bytes = s.at("name").to_vector<uint8_t>();
    names.emplace_back(bytes.begin(), bytes.end());
    flags.push_back(s.at("flag").item<int>());
  }
  EXPECT_EQ(ids, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(scores, (std::vector<float>{0.5f, 3.0f, -100.0f}));
  EXPECT_EQ(names, (std::vector<std::string>{"Smith, J", "say \"hi\"", "plain"}));
  EXPECT_EQ(flags, (std::vector<int>{1, 0, 1}));
  // Selected columns, batched with the text padded.
  auto sel = data::from_csv(p, {.select = {"name", "id"}, .text_columns = {"name"}})
                 .batch(3, data::BatchOptions{.pad = {{"name", 0}}});
  auto it = sel.begin();
  EXPECT_EQ(it->names(), (std::vector<std::string>{"name", "name_length", "id"}));
  EXPECT_EQ(it->at("name_length").to_vector<int64_t>(), (std::vector<int64_t>{8, 8, 5}));
}

TEST_F(DataTest, CsvBadLinesRaiseOrAreSkipped) {
  const auto p = write_text("bad.csv", "a,b\n1,2\n3\n4,x\n5,6\n");
  expect_error([&] { data::from_csv(p); },
               {"[data.csv]", "bad.csv", "line 3", "byte 8", "got 1 fields, expected 2"});
  expect_error([&] { data::from_csv(p, {.select = {"a"}}); }, {"line 3"});
  auto ds = data::from_csv(p, {.on_error = data::OnError::skip});
  std::vector<int64_t> a;
  for (Sample& s : ds) a.push_back(s.at("a").item<int64_t>());
  EXPECT_EQ(a, (std::vector<int64_t>{1, 5}));
  const auto st = ds.stats();
  EXPECT_EQ(st.skipped, 2);
  EXPECT_NE(st.stages.at(0).last_error.find("line 4"), std::string::npos);
  expect_error([&] { data::from_csv(p, {.select = {"zz"}}); }, {"no column 'zz'", "{a, b}"});
  expect_error([&] { data::from_csv(path("missing.csv")); }, {"missing.csv"});
  expect_error([&] { data::from_csv(write_text("q.csv", "a\n\"open\n")); },
               {"unterminated quote", "line 2"});
  expect_error(
      [&] {
        data::from_csv(write_text("r.csv", "a\n300\n"), {.types = {{"a", kiln::uint8}}});
      },
      {"got 300", "fits u8"});
}

TEST_F(DataTest, ReadersRefuseWhatIsNotARegularFile) {
  const std::string dir = dir_.string();
  const std::vector<std::string> want{"[data.read_file]", dir, "a directory", "regular file"};
  expect_error([&] { data::read_file(dir); }, want);
  expect_error([&] { data::read_idx(dir); }, want);
  expect_error([&] { data::from_csv(dir); }, want);
  expect_error([&] { data::read_image(dir); }, want);
  // A FIFO is refused without waiting for a writer.
  const std::string fifo = path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error([&] { data::read_file(fifo); }, {"[data.read_file]", fifo, "a FIFO"});
}

TEST_F(DataTest, CsvDuplicateHeaderNamesAreRenamedAsPandasDoes) {
  // pandas.read_csv's dedup_names: a repeated name gets ".k" with the next free k, where names
  // already taken (even by an earlier rename) count too. Worked by hand from that algorithm:
  // a, b, a, a.1, a -> a, b, a.1, a.1.1, a.2.
  const auto p = write_text("dup.csv", "a,b,a,a.1,a\n1,2,3,4,5\n");
  auto ds = data::from_csv(p);
  const Sample s = *ds.next();
  EXPECT_EQ(s.names(), (std::vector<std::string>{"a", "b", "a.1", "a.1.1", "a.2"}));
  std::vector<int64_t> values;
  for (const auto& [name, t] : s) values.push_back(t.item<int64_t>());
  EXPECT_EQ(values, (std::vector<int64_t>{1, 2, 3, 4, 5}));
  auto sel = data::from_csv(p, {.select = {"a.2", "a"}});
  EXPECT_EQ(sel.next()->at("a.2").item<int64_t>(), 5);
  expect_error(
      [&] {
        data::from_csv(p, {.select = {"b", "b"}});
      },
      {"[data.csv]", "'b' twice in CsvOptions::select"});
}

TEST_F(DataTest, CsvWithHundredThousandColumns) {
  // Column handling is linear: 100k columns load (and batch) at once. Cell (r, j) holds r * 1e6 +
  // j.
  constexpr int kCols = 100000;
  const auto col = [](int j) { return std::string("c").append(std::to_string(j)); };
  std::string text;
  for (int j = 0; j < kCols; ++j) {
    text += j ? ",c" : "c";
    text += std::to_string(j);
  }
  text += '\n';
  for (int r = 0; r < 2; ++r) {
    for (int j = 0; j < kCols; ++j) {
      if (j) text += ',';
      text += std::to_string(r * 1000000 + j);
    }
    text += '\n';
  }
  const auto p = write_text("wide.csv", text);
  std::vector<std::pair<std::string, kiln::DType>> types;
  for (int j = 0; j < kCols; j += 2) types.emplace_back(col(j), kiln::int32);
  auto ds = data::from_csv(p, {.types = types});
  ASSERT_EQ(ds.size(), 2);
  int64_t r = 0;
  for (Sample& s : ds) {
    ASSERT_EQ(s.size(), static_cast<std::size_t>(kCols));
    for (int j : {0, 1, 4242, kCols - 1}) {
      const Tensor& t = s.at(col(j));
      EXPECT_EQ(t.dtype(), j % 2 ? kiln::int64 : kiln::int32);
      const int64_t v = j % 2 ? t.item<int64_t>() : t.item<int32_t>();
      EXPECT_EQ(v, r * 1000000 + j) << "column " << j;
    }
    ++r;
  }
  auto batched = data::from_csv(p).batch(2);
  const Batch b = *batched.next();
  ASSERT_EQ(b.size(), static_cast<std::size_t>(kCols));
  EXPECT_EQ(b.at("c99999").to_vector<int64_t>(), (std::vector<int64_t>{99999, 1099999}));
  EXPECT_EQ(std::prev(b.end())->first, "c99999");
}

// ---- images
// ---------------------------------------------------------------------------------------

TEST_F(DataTest, PngDecodesKnownPixels) {
  const Bytes gray{0, 50, 100, 150, 200, 250};
  const auto g = write("g.png", png_stored(3, 2, 0, gray));
  Tensor t = data::read_image(g);
  EXPECT_EQ(t.shape(), (kiln::Shape{2, 3, 1}));
  EXPECT_EQ(t.to_vector<uint8_t>(), gray);
  Bytes rgb;
  for (int i = 0; i < 4; ++i)
    rgb.insert(rgb.end(), {static_cast<uint8_t>(i), static_cast<uint8_t>(10 * i), 200});
  const auto c = write("c.png", png_stored(2, 2, 2, rgb));
  EXPECT_EQ(data::read_image(c).to_vector<uint8_t>(), rgb);
  // Channel conversion: gray to RGB repeats the value; RGB to RGBA adds an opaque alpha.
  Tensor g3 = data::read_image(g, {.channels = 3});
  EXPECT_EQ(g3.shape(), (kiln::Shape{2, 3, 3}));
  EXPECT_EQ(g3.to_vector<uint8_t>()[3 * 4 + 2], 200);
  Tensor c4 = data::read_image(c, {.channels = 4});
  EXPECT_EQ(c4.to_vector<uint8_t>(),
            (Bytes{0, 0, 200, 255, 1, 10, 200, 255, 2, 20, 200, 255, 3, 30, 200, 255}));
  // Round trip through the encoder.
  Tensor rgba = kiln::tensor(std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8}, kiln::Shape{1, 2, 4});
  EXPECT_EQ(data::decode_image(data::encode_png(rgba), "mem").to_vector<uint8_t>(),
            rgba.to_vector<uint8_t>());
}

TEST_F(DataTest, PngAndJpegFaultsNameTheFileAndByte) {
  Bytes png = png_stored(3, 2, 0, {0, 50, 100, 150, 200, 250});
  Bytes cut(png.begin(), png.begin() + 40);
  expect_error([&] { data::read_image(write("cut.png", cut)); },
               {"[data.png]", "corrupt PNG", "cut.png", "at byte 40"});
  Bytes crc = png;
  crc[20] ^= 0x01;  // inside IHDR, whose CRC then fails
  expect_error([&] { data::read_image(write("crc.png", crc)); },
               {"[data.png]", "crc.png", "at byte 33", "CRC"});
  Tensor img = kiln::empty(kiln::Shape{64, 64, 3}, kiln::uint8);
  for (int64_t i = 0; i < img.numel(); ++i)
    img.data<uint8_t>()[i] = static_cast<uint8_t>(i * 37 % 251);
  Bytes jpg = data::encode_jpeg(img);
  // Cut inside the entropy-coded scan: libjpeg only warns, which the decoder turns into an error.
  Bytes jcut(jpg.begin(), jpg.begin() + static_cast<long>(jpg.size() * 3 / 4));
  expect_error([&] { data::read_image(write("cut.jpg", jcut)); },
               {"[data.jpeg]", "corrupt JPEG", "cut.jpg", "at byte " + std::to_string(jcut.size()),
                "Premature end"});
  Bytes jhead(jpg.begin(), jpg.begin() + 100);
  expect_error([&] { data::read_image(write("head.jpg", jhead)); },
               {"[data.jpeg]", "head.jpg", "at byte"});
  // A tEXt chunk declaring 1.7 GB in a 78-byte file (found by fuzz_png): libpng allocated the
  // declared length before reading; text chunks are now skipped, read through in small pieces.
  Bytes text = png_stored(2, 1, 0, {1, 2});
  text.resize(33);  // signature and IHDR
  put_be32(text, 0x6660c871);
  text.insert(text.end(), {'t', 'E', 'X', 't', 'a', 'b', 'c'});
  expect_error([&] { data::read_image(write("huge_text.png", text)); },
               {"[data.png]", "huge_text.png", "unexpected end of file"});
  Bytes junk{0xff, 0xd8, 0xff, 0x00, 0x01, 0x02};
  expect_error([&] { data::read_image(write("junk.jpg", junk)); },
               {"[data.jpeg]", "junk.jpg", "at byte"});
  expect_error(
      [&] {
        data::read_image(write("text.png", Bytes{'h', 'i'}));
      },
      {"[data.decode_image]", "unknown image format", "68 69"});
  expect_error([&] { data::read_image(path("absent.png")); }, {"absent.png"});
}

TEST_F(DataTest, ImagesOverMaxPixelsAreRefusedBeforeDecoding) {
  // A PNG declaring 40000 x 40000 gray pixels (1.6 GB decoded) that holds a few bytes of data.
  Bytes png{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  Bytes ihdr;
  put_be32(ihdr, 40000);
  put_be32(ihdr, 40000);
  ihdr.insert(ihdr.end(), {8, 0, 0, 0, 0});
  put_chunk(png, "IHDR", ihdr);
  put_chunk(png, "IDAT", {0x78, 0x01, 0x01, 0x00, 0x00, 0xff, 0xff});
  put_chunk(png, "IEND", {});
  expect_error([&] { data::read_image(write("big.png", png)); },
               {"[data.png]", "PNG image too large", "big.png", "40000x40000 = 1600000000 pixels",
                "at most 178956970 (ImageReadOptions::max_pixels)"});
  const auto small = write("small.png", png_stored(8, 8, 0, Bytes(64, 3)));
  expect_error([&] { data::read_image(small, {.max_pixels = 63}); },
               {"[data.png]", "8x8 = 64 pixels", "at most 63"});
  EXPECT_EQ(data::read_image(small, {.max_pixels = 64}).shape(), (kiln::Shape{8, 8, 1}));
  // JPEG: the limit, and a frame header patched to declare 60000 x 60000.
  Bytes jpg = data::encode_jpeg(kiln::full(kiln::Shape{64, 64, 3}, 90.0, kiln::uint8));
  expect_error([&] { data::decode_image(jpg, "small.jpg", {.max_pixels = 4095}); },
               {"[data.jpeg]", "JPEG image too large", "small.jpg", "64x64 = 4096 pixels"});
  EXPECT_EQ(data::decode_image(jpg, "small.jpg", {.max_pixels = 4096}).shape(),
            (kiln::Shape{64, 64, 3}));
  std::size_t sof = 2;
  while (sof + 9 < jpg.size() && !(jpg[sof] == 0xff && jpg[sof + 1] == 0xc0)) ++sof;
  ASSERT_LT(sof + 9, jpg.size());
  for (std::size_t k : {sof + 5, sof + 7}) {  // height, then width, big-endian
    jpg[k] = 60000 >> 8;
    jpg[k + 1] = 60000 & 0xff;
  }
  expect_error([&] { data::decode_image(jpg, "huge.jpg"); },
               {"[data.jpeg]", "huge.jpg", "60000x60000 = 3600000000 pixels"});
  // Lazily decoded sources carry the option; a limit below one pixel is refused up front.
  auto lazy = data::from_images({small}, {}, {.max_pixels = 10});
  expect_error([&] { lazy.next(); }, {"[data.png]", "at most 10"});
  expect_error([&] { data::from_images({small}, {}, {.max_pixels = 0}); },
               {"[data.from_images]", "bad ImageReadOptions::max_pixels"});
  expect_error([&] { data::read_image(small, {.max_pixels = 0}); },
               {"[data.decode_image]", "bad ImageReadOptions::max_pixels"});
}

TEST(DataImage, JpegOfAnUnknownColourSpaceIsRefused) {
  // 8x8, two components of an unknown colour space, from libjpeg (jpeg_set_defaults with
  // in_color_space = JCS_UNKNOWN, input_components = 2, quality 50, optimized Huffman tables):
  // it decoded to a u8[8, 8, 2] that is neither gray+alpha nor anything else.
  const Bytes two{
      0xff, 0xd8, 0xff, 0xdb, 0x00, 0x43, 0x00, 0x10, 0x0b, 0x0c, 0x0e, 0x0c, 0x0a, 0x10, 0x0e,
      0x0d, 0x0e, 0x12, 0x11, 0x10, 0x13, 0x18, 0x28, 0x1a, 0x18, 0x16, 0x16, 0x18, 0x31, 0x23,
      0x25, 0x1d, 0x28, 0x3a, 0x33, 0x3d, 0x3c, 0x39, 0x33, 0x38, 0x37, 0x40, 0x48, 0x5c, 0x4e,
      0x40, 0x44, 0x57, 0x45, 0x37, 0x38, 0x50, 0x6d, 0x51, 0x57, 0x5f, 0x62, 0x67, 0x68, 0x67,
      0x3e, 0x4d, 0x71, 0x79, 0x70, 0x64, 0x78, 0x5c, 0x65, 0x67, 0x63, 0xff, 0xc0, 0x00, 0x0e,
      0x08, 0x00, 0x08, 0x00, 0x08, 0x02, 0x00, 0x11, 0x00, 0x01, 0x11, 0x00, 0xff, 0xc4, 0x00,
      0x14, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x07, 0xff, 0xc4, 0x00, 0x14, 0x10, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xda, 0x00, 0x0a,
      0x02, 0x00, 0x00, 0x01, 0x00, 0x00, 0x3f, 0x00, 0x3f, 0x1f, 0xbf, 0xff, 0xd9};
  expect_error([&] { data::decode_image(two, "two.jpg"); },
               {"[data.jpeg]", "two.jpg", "unsupported unknown colour space with 2 components"});
}

TEST_F(DataTest, JpegRoundTripWithinCodecTolerance) {
  Tensor img = kiln::empty(kiln::Shape{16, 24, 3}, kiln::uint8);
  auto* p = img.data<uint8_t>();
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 24; ++x)
      for (int c = 0; c < 3; ++c)
        p[(y * 24 + x) * 3 + c] = static_cast<uint8_t>(60 + 4 * x + 2 * y + 20 * c);
  const auto path_jpg = write("g.jpg", data::encode_jpeg(img, 95));
  Tensor back = data::read_image(path_jpg);
  ASSERT_EQ(back.shape(), img.shape());
  const auto a = img.to_vector<uint8_t>(), b = back.to_vector<uint8_t>();
  int worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(int(a[i]) - int(b[i])));
  EXPECT_LE(worst, 8);
  Tensor gray = data::read_image(path_jpg, {.channels = 1});
  EXPECT_EQ(gray.shape(), (kiln::Shape{16, 24, 1}));
}

TEST_F(DataTest, ImageFilesFromAGlobWithSkippedCorruptOnes) {
  for (int i = 0; i < 6; ++i) {
    Tensor img = kiln::full(kiln::Shape{4, 5, 3}, 40.0 * i, kiln::uint8);
    if (i % 2) {
      write("img" + std::to_string(i) + ".jpg", data::encode_jpeg(img, 100));
    } else {
      write("img" + std::to_string(i) + ".png", data::encode_png(img));
    }
  }
  write("img6.png", Bytes{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 1, 2, 3});
  const auto files = data::glob(path("img*"));
  ASSERT_EQ(files.size(), 7u);
  std::vector<int64_t> labels{0, 1, 2, 3, 4, 5, 6};
  auto strict = data::from_images(files, labels).batch(7);
  expect_error([&] { strict.begin(); }, {"[data.png]", "img6.png"});
  auto p = data::from_images(files, labels)
               .map(data::image::normalize({0}, {1}, 1.0f), {.num_threads = 2})
               .on_error(data::OnError::skip)
               .batch(10);
  int batches = 0;
  for (Batch& b : p) {
    ++batches;
    EXPECT_EQ(b.at("image").shape(), (kiln::Shape{6, 4, 5, 3}));
    EXPECT_EQ(b.at("label").to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
    const auto v = b.at("image").to_vector<float>();
    for (int i = 0; i < 6; ++i) EXPECT_NEAR(v[static_cast<std::size_t>(i * 60 + 7)], 40.0 * i, 2.0);
  }
  EXPECT_EQ(batches, 1);
  EXPECT_EQ(p.stats().skipped, 1);
  expect_error([&] { data::glob(path("*.none")); }, {"[data.glob]", "no files match"});
  expect_error([&] { data::from_images({path("gone.png")}); }, {"[data.from_images]", "gone.png"});
  auto raw = data::from_files({files[0]});
  EXPECT_EQ(raw.begin()->at("data").numel(), static_cast<int64_t>(fs::file_size(files[0])));
}

// ---- image transforms
// ------------------------------------------------------------------------------

TEST(DataImage, NormalizeResizeCropFlipByHand) {
  Tensor img = kiln::tensor(std::vector<uint8_t>{0, 51, 102, 255}, kiln::Shape{1, 4});
  expect_allclose(data::image::normalize({0.2f}, {0.5f})(img),
                  kiln::tensor({-0.4f, 0.0f, 0.4f, 1.6f}, kiln::Shape{1, 4}),
                  {.rtol = 0, .atol = 1e-6});
  // Per-channel statistics.
  Tensor rgb = kiln::tensor(std::vector<float>{1, 2, 3, 4, 5, 6}, kiln::Shape{1, 2, 3});
  expect_allclose(data::image::normalize({1, 2, 3}, {1, 2, 4})(rgb),
                  kiln::tensor({0.f, 0.f, 0.f, 3.f, 1.5f, 0.75f}, kiln::Shape{1, 2, 3}),
                  {.rtol = 0, .atol = 1e-6});
  // Bilinear with half-pixel centres: [0, 100] to width 4 is [0, 25, 75, 100].
  Tensor row = kiln::tensor(std::vector<float>{0, 100}, kiln::Shape{1, 2});
  EXPECT_EQ(data::image::resize(1, 4)(row).to_vector<float>(),
            (std::vector<float>{0, 25, 75, 100}));
  Tensor row4 = kiln::tensor(std::vector<uint8_t>{10, 20, 30, 40}, kiln::Shape{1, 4});
  EXPECT_EQ(
      data::image::resize(1, 2, data::image::Interpolation::nearest)(row4).to_vector<uint8_t>(),
      (std::vector<uint8_t>{10, 30}));
  Tensor sq = kiln::tensor(std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}, kiln::Shape{3, 3});
  EXPECT_EQ(data::image::center_crop(1, 1)(sq).to_vector<uint8_t>(), (std::vector<uint8_t>{5}));
  EXPECT_EQ(data::image::random_horizontal_flip(1.0)(sq).to_vector<uint8_t>(),
            (std::vector<uint8_t>{3, 2, 1, 6, 5, 4, 9, 8, 7}));
  EXPECT_EQ(data::image::random_horizontal_flip(0.0)(sq).to_vector<uint8_t>(),
            sq.to_vector<uint8_t>());
  Tensor chw = data::image::to_chw()(rgb);
  EXPECT_EQ(chw.shape(), (kiln::Shape{3, 1, 2}));
  EXPECT_EQ(chw.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  // Every random crop is a window of the zero-padded image; over many samples all 9 offsets occur.
  std::set<std::pair<int, int>> seen;
  const auto crop = data::image::random_crop(3, 3, 1);
  for (int64_t i = 0; i < 200; ++i) {
    const auto out = crop(sq, 0, i).to_vector<uint8_t>();
    bool matched = false;
    for (int dy = 0; dy <= 2 && !matched; ++dy)
      for (int dx = 0; dx <= 2 && !matched; ++dx) {
        bool eq = true;
        for (int y = 0; y < 3; ++y)
          for (int x = 0; x < 3; ++x) {
            const int sy = y + dy - 1, sx = x + dx - 1;
            const uint8_t want =
                (sy < 0 || sy > 2 || sx < 0 || sx > 2)
                    ? 0
                    : sq.to_vector<uint8_t>()[static_cast<std::size_t>(sy * 3 + sx)];
            eq = eq && out[static_cast<std::size_t>(y * 3 + x)] == want;
          }
        if (eq) {
          matched = true;
          seen.insert({dy, dx});
        }
      }
    EXPECT_TRUE(matched) << "sample " << i;
  }
  EXPECT_EQ(seen.size(), 9u);
  expect_error([&] { data::image::random_crop(9, 9, 1)(sq); },
               {"[data.image.random_crop]", "too small"});
  expect_error(
      [&] {
        data::image::normalize({1, 2}, {1})(sq);
      },
      {"[data.image.normalize]", "2 means"});
}

TEST(DataImage, SizeArgumentsAreCheckedBeforeAnyArithmetic) {
  constexpr int64_t kHuge = int64_t{1} << 62;
  expect_error([&] { data::image::resize(kHuge, 4); },
               {"[data.image.resize]", "4611686018427387904", "expected 1 to 1048576"});
  expect_error([&] { data::image::center_crop(4, kHuge); }, {"[data.image.center_crop]"});
  expect_error([&] { data::image::random_crop(kHuge, 4); }, {"[data.image.random_crop]"});
  expect_error([&] { data::image::random_crop(4, 4, kHuge); },
               {"[data.image.random_crop]", "padding"});
  // Inputs are held to 2^20 a side and 2^20 channels too, so no size computed from them overflows:
  // 2^20 x 2^20 x 2^23 would, and an empty [2^40, 0] image would overflow the crop's offsets.
  Tensor deep = kiln::zeros(kiln::Shape{1, 1, int64_t{1} << 23}, kiln::uint8);
  expect_error([&] { data::image::resize(1 << 20, 1 << 20)(deep); },
               {"[data.image]", "image too large", "[1, 1, 8388608]", "1048576 channels"});
  Tensor tall = kiln::empty(kiln::Shape{int64_t{1} << 40, 0}, kiln::uint8);
  expect_error([&] { data::image::random_crop(1, 1, 1)(tall); },
               {"[data.image]", "image too large", "[1099511627776, 0]"});
}

TEST(DataImage, OutOfMemoryIsAnError) {
#if defined(KILN_TEST_ASAN) || defined(KILN_TEST_TSAN)
  GTEST_SKIP() << "the sanitizers reserve more address space than the limit below allows";
#else
  // Room for 2 GiB more than the process maps now; a 32768 x 32768 x 3 resize needs 3 GiB.
  std::ifstream status("/proc/self/status");
  std::string line;
  int64_t vm_kib = -1;
  while (std::getline(status, line))
    if (line.rfind("VmSize:", 0) == 0) vm_kib = std::stoll(line.substr(7));
  ASSERT_GT(vm_kib, 0);
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_AS, &old), 0);
  rlimit tight = old;
  tight.rlim_cur = static_cast<rlim_t>(vm_kib * 1024 + (int64_t{2} << 30));
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &tight), 0);
  const Tensor rgb = kiln::zeros(kiln::Shape{1, 1, 3}, kiln::uint8);
  // The tensor allocator reports it (naming the op that allocates, the type and the bytes).
  expect_error([&] { data::image::resize(32768, 32768)(rgb); },
               {"out of memory", "u8[32768,32768,3]", "3221225472 bytes"});
  ::setrlimit(RLIMIT_AS, &old);
#endif
}

TEST(DataImage, FusedMapsEqualTheTransformApplied) {
  const auto t1 = data::image::random_crop(8, 8, 3, 5);
  const auto t2 = data::image::random_horizontal_flip(0.5, 6);
  const auto t3 = data::image::normalize({0.1f}, {0.3f});
  auto fused = image_pipeline(40).map(t1).map(t2).map(t3);
  EXPECT_EQ(
      fused.describe(),
      "from_tensors(image:u8[40,8,8], label:i64[40]) -> map[image: random_crop(8x8, pad 3) -> "
      "random_horizontal_flip(0.5) -> normalize]");
  const auto chain = t1.then(t2).then(t3);
  auto plain = image_pipeline(40);
  int64_t i = 0;
  for (Sample& s : fused) {
    const Tensor want = chain(plain.get(i).at("image"), 0, i);
    EXPECT_EQ(s.at("image").to_vector<float>(), want.to_vector<float>());
    ++i;
  }
  EXPECT_EQ(i, 40);
}

TEST(DataImage, BatchedImageMapsWriteTheSameRowsAsSamples) {
  // Batching right after an image map computes each image in its batch row: check it against
  // the unbatched samples, with and without threads, and with a 2-d and a 3-d image.
  const auto aug = data::image::normalize({0.5f}, {0.2f})
                       .then(data::image::random_crop(8, 8, 2))
                       .then(data::image::random_horizontal_flip());
  auto samples = image_pipeline(50).shuffle(3).map(aug);
  std::vector<std::vector<float>> want;
  for (Sample& s : samples) want.push_back(s.at("image").to_vector<float>());
  for (int threads : {0, 2}) {
    auto batched = image_pipeline(50).shuffle(3).map(aug, {.num_threads = threads}).batch(16);
    std::size_t k = 0;
    for (Batch& b : batched) {
      const auto v = b.at("image").to_vector<float>();
      for (std::size_t j = 0; j < v.size() / 64; ++j, ++k)
        EXPECT_EQ(std::vector<float>(v.begin() + static_cast<long>(j * 64),
                                     v.begin() + static_cast<long>((j + 1) * 64)),
                  want[k])
            << "sample " << k << ", " << threads << " threads";
    }
    EXPECT_EQ(k, 50u);
  }
}

// ---- Fashion-MNIST (Debian's dataset-fashion-mnist)
// -------------------------------------------------

TEST(DataFashionMnist, TrainingLabelsHaveTheDocumentedHistogram) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir + "/train-labels-idx1-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  auto p = data::from_idx(dir + "/train-images-idx3-ubyte.gz", dir + "/train-labels-idx1-ubyte.gz")
               .batch(1000);
  ASSERT_EQ(p.size(), 60);
  std::vector<int64_t> hist(10);
  int64_t n = 0;
  for (Batch& b : p) {
    EXPECT_EQ(b.at("image").shape(), (kiln::Shape{1000, 28, 28}));
    for (int64_t l : b.at("label").to_vector<int64_t>()) {
      ASSERT_GE(l, 0);
      ASSERT_LT(l, 10);
      ++hist[static_cast<std::size_t>(l)];
      ++n;
    }
  }
  EXPECT_EQ(n, 60000);
  EXPECT_EQ(hist, std::vector<int64_t>(10, 6000));
}
