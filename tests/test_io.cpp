// kiln::io: safetensors checkpoints (include/kiln/io.h, docs/CHECKPOINTS.md).
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "kiln/data.h"
#include "kiln/io.h"
#include "kiln/ops.h"
#include "testing.h"

namespace fs = std::filesystem;
namespace io = kiln::io;
using kiln::DType;
using kiln::Shape;
using kiln::Tensor;
using kiln::testing::expect_error;

namespace {

using Bytes = std::vector<uint8_t>;

// ---- helpers ----------------------------------------------------------------------------------

// A fresh empty directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "kiln-io-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    ::chmod(path_.c_str(), 0700);
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  fs::path path_;
};

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file from a header text and data bytes, built by hand (no Kiln code involved).
Bytes make_file(const std::string& header, const Bytes& data = {}) {
  Bytes out;
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

Bytes zeros_bytes(std::size_t n) { return Bytes(n, 0); }

std::vector<uint8_t> tensor_bytes(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.raw_data());
  return {p, p + c.numel() * static_cast<int64_t>(kiln::dtype_size(c.dtype()))};
}

void expect_same_tensor(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  EXPECT_EQ(got.dtype(), want.dtype()) << what;
  EXPECT_EQ(got.shape(), want.shape()) << what;
  EXPECT_TRUE(got.is_contiguous()) << what;
  EXPECT_EQ(tensor_bytes(got), tensor_bytes(want)) << what;
}

const DType kAllDTypes[] = {kiln::bool_,   kiln::uint8,    kiln::uint32,  kiln::int32,  kiln::int64,
                            kiln::float16, kiln::bfloat16, kiln::float32, kiln::float64};

// Values 0..n-1 (bool: alternating) in a contiguous [rows, cols] tensor of dtype d.
Tensor sample(DType d, int64_t rows, int64_t cols) {
  std::vector<double> v(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = d == kiln::bool_
               ? static_cast<double>(i % 2)
               : static_cast<double>(i) - 3.0 * (d != kiln::uint8 && d != kiln::uint32);
  return kiln::astype(kiln::tensor(v, {rows, cols}), d);
}

// ---- round trips ------------------------------------------------------------------------------

TEST(IoSafetensors, RoundTripEveryDtypeInMemoryAndOnDisk) {
  TempDir dir;
  std::vector<io::NamedTensor> tensors;
  for (DType d : kAllDTypes) {
    const std::string n(kiln::dtype_name(d));
    tensors.push_back({n + ".plain", sample(d, 3, 4)});
    tensors.push_back({n + ".transposed", kiln::transpose(sample(d, 3, 5))});  // not contiguous
    tensors.push_back({n + ".sliced", kiln::slice(sample(d, 6, 4),
                                                  {{1, 6, 2}, {std::nullopt, std::nullopt, -1}})});
    tensors.push_back({n + ".broadcast", kiln::broadcast_to(sample(d, 1, 3), {4, 3})});
    tensors.push_back({n + ".scalar", kiln::reshape(sample(d, 1, 1), Shape{})});
    tensors.push_back({n + ".empty", kiln::empty({0, 3}, d)});
  }
  ASSERT_FALSE(tensors[1].tensor.is_contiguous());
  ASSERT_FALSE(tensors[2].tensor.is_contiguous());

  const Bytes bytes = io::serialize_safetensors(tensors);
  const std::string path = dir.file("all.safetensors");
  io::save_tensors(path, tensors);
  EXPECT_EQ(read_file(path), bytes);

  for (const io::TensorFile& f : {io::parse_safetensors(bytes), io::load_tensors(path)}) {
    ASSERT_EQ(f.tensors.size(), tensors.size());
    EXPECT_TRUE(f.metadata.empty());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      EXPECT_EQ(f.tensors[i].name, tensors[i].name);  // file order is the order saved
      expect_same_tensor(f.tensors[i].tensor, tensors[i].tensor, tensors[i].name);
      EXPECT_EQ(f.tensors[i].tensor.to_vector<double>(), tensors[i].tensor.to_vector<double>())
          << tensors[i].name;
    }
    ASSERT_NE(f.find("f32.scalar"), nullptr);
    EXPECT_EQ(f.find("f32.scalar")->rank(), 0);
    EXPECT_EQ(f.find("nope"), nullptr);
  }
}

TEST(IoSafetensors, HeaderIsPaddedAndDataAligned) {
  for (int n = 0; n < 10; ++n) {
    std::vector<io::NamedTensor> t{
        {std::string(static_cast<std::size_t>(n + 1), 'x'), kiln::ones({2})}};
    const Bytes b = io::serialize_safetensors(t);
    uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = header << 8 | b[static_cast<std::size_t>(i)];
    EXPECT_EQ((8 + header) % 8, 0u);
    EXPECT_EQ(b[8], '{');
    EXPECT_EQ(b.size(), 8 + header + 8);
  }
}

// The exact bytes, against a file built by hand from the format description.
TEST(IoSafetensors, BytesMatchHandBuiltFile) {
  std::string header =
      R"({"__metadata__":{"format":"kiln"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("step":{"dtype":"I64","shape":[],"data_offsets":[8,16]},)"
      R"("m":{"dtype":"BOOL","shape":[1,3],"data_offsets":[16,19]}})";
  while ((8 + header.size()) % 8 != 0) header += ' ';
  const Bytes data = {0x00, 0x00, 0x80, 0x3f,              // 1.0f
                      0x00, 0x00, 0x00, 0xc0,              // -2.0f
                      0x07, 0,    0,    0,    0, 0, 0, 0,  // int64 7
                      1,    0,    1};
  const Bytes expected = make_file(header, data);

  const std::vector<io::NamedTensor> tensors = {
      {"w", kiln::tensor({1.0f, -2.0f})},
      {"step", kiln::tensor(int64_t{7})},
      {"m", kiln::tensor(std::vector<bool>{true, false, true}, {1, 3})},
  };
  EXPECT_EQ(io::serialize_safetensors(tensors, {{"format", "kiln"}}), expected);

  // And the hand-built file (also unpadded) reads back.
  std::string unpadded = header;
  while (unpadded.back() == ' ') unpadded.pop_back();
  for (const Bytes& file : {expected, make_file(unpadded, data)}) {
    const io::TensorFile f = io::parse_safetensors(file);
    ASSERT_EQ(f.tensors.size(), 3u);
    EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"format", "kiln"}}));
    EXPECT_EQ(f.tensors[0].tensor.to_vector<float>(), (std::vector<float>{1.0f, -2.0f}));
    EXPECT_EQ(f.tensors[1].tensor.item<int64_t>(), 7);
    EXPECT_EQ(f.tensors[2].tensor.to_vector<bool>(), (std::vector<bool>{true, false, true}));
  }
}

TEST(IoSafetensors, FileOrderIsDataOrder) {
  // Header order differs from data order; whitespace of every JSON kind between tokens.
  const std::string header =
      "{ \"b\" :\n{\"data_offsets\":[4,8],\t\"shape\":[1],\"dtype\":\"I32\"},\r\n"
      "\"a\":{\"dtype\":\"I32\",\"shape\":[ 1 ],\"data_offsets\":[0,4]},"
      "\"e\":{\"dtype\":\"I32\",\"shape\":[0],\"data_offsets\":[8,8]} }";
  const io::TensorFile f = io::parse_safetensors(make_file(header, {1, 0, 0, 0, 2, 0, 0, 0}));
  ASSERT_EQ(f.tensors.size(), 3u);
  EXPECT_EQ(f.tensors[0].name, "a");
  EXPECT_EQ(f.tensors[1].name, "b");
  EXPECT_EQ(f.tensors[2].name, "e");
  EXPECT_EQ(f.tensors[0].tensor.item<int32_t>(), 1);
  EXPECT_EQ(f.tensors[1].tensor.item<int32_t>(), 2);
  EXPECT_EQ(f.tensors[2].tensor.numel(), 0);
}

TEST(IoSafetensors, MetadataRoundTrip) {
  TempDir dir;
  const std::map<std::string, std::string> meta = {
      {"format", "pt"},
      {"quote\"back\\slash", "line\nfeed\ttab\x01\x1f"},
      {"unicode \xc3\xa9", "emoji \xf0\x9f\x98\x80"},
      {"empty", ""},
  };
  const std::string path = dir.file("m.safetensors");
  io::save_tensors(path, {{"x", kiln::ones({2, 2})}}, meta);
  EXPECT_EQ(io::load_tensors(path).metadata, meta);
  EXPECT_EQ(io::parse_safetensors(io::serialize_safetensors({}, meta)).metadata, meta);
  // No tensors, no metadata: "{}" padded.
  const io::TensorFile none = io::parse_safetensors(io::serialize_safetensors({}));
  EXPECT_TRUE(none.tensors.empty());
  EXPECT_TRUE(none.metadata.empty());
}

TEST(IoSafetensors, JsonEscapesAndSurrogatePairs) {
  const std::string header =
      R"({"\u00e9\ud83d\ude00\n\"\\\/":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
      R"("__metadata__":{"k":"\u0041\uD834\uDD1E"}})";
  const io::TensorFile f = io::parse_safetensors(make_file(header, {42}));
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors[0].name, "\xc3\xa9\xf0\x9f\x98\x80\n\"\\/");
  EXPECT_EQ(f.metadata.at("k"), "A\xf0\x9d\x84\x9e");
  // Names with escapes survive a write and read.
  const io::TensorFile again =
      io::parse_safetensors(io::serialize_safetensors(f.tensors, f.metadata));
  EXPECT_EQ(again.tensors[0].name, f.tensors[0].name);
  EXPECT_EQ(again.metadata, f.metadata);
}

// ---- trees ------------------------------------------------------------------------------------

struct Layer {
  Tensor w, b;
};
KILN_TREE(Layer, w, b);

struct Model {
  std::vector<Layer> layers;
  std::map<std::string, Tensor> extras;
  Tensor scale;
  int64_t step = 0;  // static: not saved, comes from `like`
};
KILN_TREE(Model, layers, extras, scale, step);

Model make_model(int n_layers, int64_t width = 3, DType d = kiln::float32) {
  Model m;
  for (int i = 0; i < n_layers; ++i) {
    const double base = 10.0 * (i + 1);
    m.layers.push_back(
        {kiln::astype(kiln::arange(base, base + static_cast<double>(width * 2)), d).contiguous(),
         kiln::full({width}, -base, d)});
    m.layers.back().w = kiln::reshape(m.layers.back().w, {2, width});
  }
  m.extras["running.mean"] = kiln::zeros({width}, d);
  m.scale = kiln::full({}, 0.5, d);
  m.step = 42;
  return m;
}

Model blank_like(const Model& m) {
  return kiln::tree_map([](const Tensor& t) { return kiln::zeros(t.shape(), t.dtype()); }, m);
}

TEST(IoTree, SaveLoadNestedStruct) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  const Model m = make_model(2);
  io::save(path, m, {{"epoch", "3"}});

  const io::TensorFile f = io::load_tensors(path);
  std::vector<std::string> names;
  for (const auto& nt : f.tensors) names.push_back(nt.name);
  EXPECT_EQ(names, (std::vector<std::string>{"layers.0.w", "layers.0.b", "layers.1.w", "layers.1.b",
                                             "extras.running.mean", "scale"}));
  EXPECT_EQ(f.metadata.at("epoch"), "3");

  Model like = blank_like(m);
  like.step = 7;
  const Model got = io::load(path, like);
  EXPECT_EQ(got.step, 7);
  ASSERT_EQ(got.layers.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    expect_same_tensor(got.layers[i].w, m.layers[i].w, "w");
    expect_same_tensor(got.layers[i].b, m.layers[i].b, "b");
  }
  expect_same_tensor(got.extras.at("running.mean"), m.extras.at("running.mean"), "extras");
  expect_same_tensor(got.scale, m.scale, "scale");
}

TEST(IoTree, UndefinedLeaves) {
  TempDir dir;
  const std::string path = dir.file("u.safetensors");
  Model m = make_model(1);
  m.scale = Tensor();  // not written
  io::save(path, m);
  EXPECT_EQ(io::load_tensors(path).find("scale"), nullptr);
  // An undefined leaf in `like` stays undefined when the file has none...
  Model like = blank_like(make_model(1));
  like.scale = Tensor();
  EXPECT_FALSE(io::load(path, like).scale.defined());
  // ...and takes the file's tensor as it is when it has one.
  const std::string full = dir.file("full.safetensors");
  io::save(full, make_model(1));
  const Model got = io::load(full, like);
  expect_same_tensor(got.scale, make_model(1).scale, "scale");
}

TEST(IoTree, MismatchErrorsNameTheParameter) {
  TempDir dir;
  const std::string path = dir.file("two.safetensors");
  io::save(path, make_model(2));

  // Missing: the tree has a third layer.
  expect_error([&] { io::load(path, blank_like(make_model(3))); }, "io.load",
               {"parameter 'layers.2.w'", "missing", path, "expected f32[2,3]", "'layers.2.b'"});
  // Wrong dtype.
  expect_error(
      [&] { io::load(path, blank_like(make_model(2, 3, kiln::float64))); }, "io.load",
      {"parameter 'layers.0.w'", path, "wrong dtype", "got f32[2,3]", "expected f64[2,3]"});
  // Wrong shape.
  expect_error(
      [&] { io::load(path, blank_like(make_model(2, 4))); }, "io.load",
      {"parameter 'layers.0.w'", path, "wrong shape", "got f32[2,3]", "expected f32[2,4]"});
  // Extra tensors in the file.
  expect_error(
      [&] { io::load(path, blank_like(make_model(1))); }, "io.load",
      {path, "2 tensors the tree does not have", "'layers.1.w'", "'layers.1.b'", "allow_extra"});
  const Model one = io::load(path, blank_like(make_model(1)), {.allow_extra = true});
  ASSERT_EQ(one.layers.size(), 1u);
  expect_same_tensor(one.layers[0].w, make_model(2).layers[0].w, "w");
}

TEST(IoTree, BadNames) {
  TempDir dir;
  // A bare tensor has the name "".
  expect_error([&] { io::save(dir.file("t"), kiln::ones({2})); }, "io.save", {"empty tensor name"});
  // A map key with a dot can collide with a struct path.
  std::map<std::string, std::map<std::string, Tensor>> clash{{"a", {{"b.c", kiln::ones({1})}}},
                                                             {"a.b", {{"c", kiln::ones({1})}}}};
  expect_error([&] { io::save(dir.file("t"), clash); }, "io.save",
               {"duplicate tensor name", "'a.b.c'"});
  io::save_tensors(dir.file("ok"), {{"a.b.c", kiln::ones({1})}});
  expect_error([&] { io::load(dir.file("ok"), clash); }, "io.load",
               {"two parameters named 'a.b.c'"});
  expect_error(
      [&] {
        io::save_tensors(dir.file("t"), {{"__metadata__", kiln::ones({1})}});
      },
      "io.save", {"__metadata__"});
  expect_error(
      [&] {
        io::save_tensors(dir.file("t"), {{"bad\xff", kiln::ones({1})}});
      },
      "io.save", {"not valid UTF-8", "'bad\\xff'"});
  expect_error(
      [&] {
        io::save_tensors(dir.file("t"), {{"u", Tensor()}});
      },
      "io.save", {"tensor 'u' is undefined"});
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"ok"});
}

// ---- corrupt files ----------------------------------------------------------------------------

Bytes valid_file() {
  return io::serialize_safetensors({{"a", kiln::tensor({1.0f, 2.0f, 3.0f})},
                                    {"b", kiln::tensor(std::vector<int64_t>{4, 5}, {1, 2})},
                                    {"c", kiln::tensor(std::vector<bool>{true, false})}},
                                   {{"k", "v"}});
}

TEST(IoCorrupt, EveryTruncationRaises) {
  const Bytes full = valid_file();
  ASSERT_NO_THROW(io::parse_safetensors(full));
  for (std::size_t n = 0; n < full.size(); ++n) {
    const Bytes prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(io::parse_safetensors(prefix, "prefix"), kiln::Error) << "length " << n;
  }
  // One byte too many is an error too (data not covered by tensors).
  Bytes longer = full;
  longer.push_back(0);
  expect_error([&] { io::parse_safetensors(longer, "x.safetensors"); }, "io.load",
               {"bytes after the last tensor", "'x.safetensors'"});
}

TEST(IoCorrupt, TruncatedFilesOnDisk) {
  TempDir dir;
  const Bytes full = valid_file();
  const std::string path = dir.file("t.safetensors");
  for (std::size_t n = 0; n < full.size(); ++n) {
    write_file(path, Bytes(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n)));
    EXPECT_THROW(io::load_tensors(path), kiln::Error) << "length " << n;
  }
  expect_error([&] { io::load_tensors(dir.file("absent")); }, "io.load",
               {"cannot open", "absent", "No such file"});
  expect_error([&] { io::load_tensors(dir.path().string()); }, "io.load", {"regular file"});
}

TEST(IoCorrupt, HeaderSize) {
  expect_error(
      [] {
        io::parse_safetensors(Bytes{1, 2, 3});
      },
      "io.load", {"too short", "got 3 bytes", "<memory>"});
  Bytes huge(16, 0xff);
  expect_error([&] { io::parse_safetensors(huge, "h.st"); }, "io.load",
               {"over the limit", "18446744073709551615", "'h.st'"});
  Bytes big = {0x00, 0x00, 0x00, 0x01, 0, 0, 0, 0, '{', '}'};  // 16 MiB header, 2 bytes there
  expect_error([&] { io::parse_safetensors(big); }, "io.load",
               {"larger than the file", "got 16777216 bytes", "at most the 2 bytes"});
  Bytes zero = make_file("");
  expect_error([&] { io::parse_safetensors(zero); }, "io.load",
               {"got the end of the header", "'{'"});
}

struct BadHeader {
  std::string header;
  std::string part;  // expected in the message
  Bytes data = {};
};

TEST(IoCorrupt, BadHeaders) {
  const std::string ok_entry = R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  const std::vector<BadHeader> cases = {
      {"[]", "expected '{'"},
      {" {}", "expected '{'"},
      {"{", "got the end of the header"},
      {"{\"a\":" + ok_entry, "expected ',' or '}'"},
      {"{\"a\":" + ok_entry + "}x", "bytes after the header's JSON object"},
      {"{\"a\":" + ok_entry + "}\n", "bytes after the header's JSON object"},
      {"{\"a\":" + ok_entry + ",}", "expected a tensor name"},
      {"{\"a\" " + ok_entry + "}", "expected ':'"},
      {"{a:" + ok_entry + "}", "got 'a', expected a tensor name"},
      {"{\"a\":" + ok_entry + ",\"a\":" + ok_entry + "}", "duplicate tensor name 'a'"},
      {"{\"a\":[]}", "tensor 'a'"},
      {"{\"a\":null}", "got 'n'"},
      {R"({"a":{"dtype":"F32","shape":[1]}})", "missing field \"data_offsets\""},
      {R"({"a":{"shape":[1],"data_offsets":[0,4]}})", "missing field \"dtype\""},
      {R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", "missing field \"shape\""},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", "unknown field 'x'"},
      {R"({"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
       "duplicate field 'dtype'"},
      {R"({"a":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})",
       "dtype I8 is not supported by Kiln"},
      {R"({"a":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", "not supported"},
      {R"({"a":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})", "unknown dtype: got 'F31'"},
      {R"({"a":{"dtype":1,"shape":[1],"data_offsets":[0,4]}})", "expected a dtype string"},
      {R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
       "got '-', expected a dimension"},
      {R"({"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", "not an integer"},
      {R"({"a":{"dtype":"F32","shape":[1e2],"data_offsets":[0,4]}})", "not an integer"},
      {R"({"a":{"dtype":"F32","shape":[01],"data_offsets":[0,4]}})", "leading zero"},
      {R"({"a":{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}})", "got '['"},
      {R"({"a":{"dtype":"F32","shape":1,"data_offsets":[0,4]}})", "expected '['"},
      {R"({"a":{"dtype":"F32","shape":[1,],"data_offsets":[0,4]}})",
       "got ']', expected a dimension"},
      {R"({"a":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,4]}})",
       "does not fit in 64 bits"},
      {R"({"a":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,4]}})",
       "dimension too large"},
      {R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,4]}})",
       "too large: got shape"},
      {R"({"a":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})",
       "too large: got shape"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", "expected ','"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", "exactly two integers"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":"0,4"}})", "expected '['"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", "reversed data_offsets"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})", "ends past the data"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})",
       "wrong size: got [0, 4] (4 bytes), expected 8 bytes for F32 [2]"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
       "tensors 'a' and 'b'", zeros_bytes(8)},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
       "overlap", zeros_bytes(8)},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", "gap in the data",
       zeros_bytes(8)},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[0],"data_offsets":[2,2]}})",
       "overlap", zeros_bytes(4)},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "bytes after the last tensor",
       zeros_bytes(5)},
      {R"({"a":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", "bad BOOL", Bytes{1, 2}},
      {R"({"__metadata__":{"k":1}})", "expected a metadata value"},
      {R"({"__metadata__":[]})", "\"__metadata__\" is an object"},
      {R"({"__metadata__":{"k":"v","k":"w"}})", "duplicate metadata key 'k'"},
      {R"({"__metadata__":{},"__metadata__":{}})", "duplicate key \"__metadata__\""},
      {R"({"__metadata__":null})", "got 'n'"},
      {R"({"a\x":{}})", "bad escape"},
      {R"({"\u12":{}})", "bad \\u escape"},
      {R"({"\ud800":{}})", "not followed by a low surrogate"},
      {R"({"\ud800\u0041":{}})", "followed by: got \\u0041"},
      {R"({"\udc00":{}})", "lone low surrogate"},
      {"{\"a\nb\":{}}", "control character"},
      {"{\"a\xff\":{}}", "invalid UTF-8"},
      {"{\"\xc0\xaf\":{}}", "invalid UTF-8"},          // overlong '/'
      {"{\"\xed\xa0\x80\":{}}", "invalid UTF-8"},      // UTF-8 encoded surrogate
      {"{\"\xf4\x90\x80\x80\":{}}", "invalid UTF-8"},  // above U+10FFFF
      {"{\"\xe2\x82\":{}}", "invalid UTF-8"},          // cut short
      {"{\"abc", "unterminated string"},
      {"{\"a\":" + ok_entry + std::string("}\0\0", 3), "bytes after the header"},
      {"{\"a\":tru}", "got 't'"},
  };
  for (const BadHeader& c : cases) {
    Bytes data = c.data;
    if (data.empty() && c.part.find("ends past") == std::string::npos &&
        c.header.find("[0,4]") != std::string::npos)
      data = zeros_bytes(4);
    SCOPED_TRACE(c.header);
    expect_error([&] { io::parse_safetensors(make_file(c.header, data), "bad.safetensors"); },
                 "io.load", {c.part, "'bad.safetensors'"});
  }
}

TEST(IoCorrupt, ByteOffsetsInMessages) {
  // "{\"a\":x}": 'x' is header byte 5, file byte 13.
  expect_error([] { io::parse_safetensors(make_file("{\"a\":x}")); }, "io.load",
               {"at byte 13", "got 'x'"});
  expect_error([] { io::parse_safetensors(make_file("{\"a\":\x01}")); }, "io.load",
               {"got byte 0x01"});
  expect_error(
      [] {
        io::parse_safetensors(make_file(
            R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", zeros_bytes(12)));
      },
      "io.load", {"gap in the data", "got bytes [0, 8)"});
}

TEST(IoCorrupt, HugeEmptyShapesAreValid) {
  // Up to Kiln's limit on any shape, counting the non-zero sizes (docs/DESIGN.md, "Sizes").
  const io::TensorFile f = io::parse_safetensors(
      make_file(R"({"a":{"dtype":"U8","shape":[0,1152921504606846975],"data_offsets":[0,0]}})"));
  EXPECT_EQ(f.tensors[0].tensor.shape(), (Shape{0, Shape::kMaxNumel}));
  EXPECT_EQ(f.tensors[0].tensor.numel(), 0);
  expect_error(
      [] {
        io::parse_safetensors(make_file(
            R"({"a":{"dtype":"U8","shape":[0,1152921504606846976],"data_offsets":[0,0]}})"));
      },
      "io.load", {"too large: got shape", "1152921504606846975"});
}

TEST(IoCorrupt, RankLimit) {
  std::string shape = "[";
  for (int i = 0; i < 65; ++i) shape += i ? ",1" : "1";
  shape += "]";
  expect_error(
      [&] {
        io::parse_safetensors(make_file(
            R"({"a":{"dtype":"U8","shape":)" + shape + R"(,"data_offsets":[0,1]}})", {0}));
      },
      "io.load", {"more than 64 dimensions"});
}

// ---- atomic writes ----------------------------------------------------------------------------

TEST(IoAtomic, OverwriteReplacesAndLeavesNoTemporaryFiles) {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  io::save(path, make_model(1));
  io::save(path, make_model(2));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"ckpt.safetensors"});
  EXPECT_EQ(io::load(path, blank_like(make_model(2))).layers.size(), 2u);
  // A relative path (no directory part) works too.
  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path());
  io::save_tensors("rel.safetensors", {{"x", kiln::ones({1})}});
  fs::current_path(cwd);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"ckpt.safetensors", "rel.safetensors"}));
}

TEST(IoAtomic, FailureMidwayKeepsTheOldFile) {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  io::save(path, make_model(1));
  const Bytes before = read_file(path);

  // The file size limit makes write() fail with EFBIG after the temporary file is created and
  // partly written.
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  Model big = make_model(1);
  big.layers[0].w = kiln::zeros({100, 100});
  try {
    io::save(path, big);
    ADD_FAILURE() << "expected the size limit to fail the write";
  } catch (const kiln::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("File too large"), std::string::npos) << msg;
    EXPECT_NE(msg.find("writing the temporary file"), std::string::npos) << msg;
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);

  EXPECT_EQ(read_file(path), before);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"ckpt.safetensors"});
  expect_same_tensor(io::load(path, blank_like(make_model(1))).layers[0].w,
                     make_model(1).layers[0].w, "w");
}

TEST(IoAtomic, DirectoryProblems) {
  TempDir dir;
  // The directory does not exist.
  const std::string missing = dir.file("no/such/dir/ckpt.safetensors");
  expect_error([&] { io::save(missing, make_model(1)); }, "io.save",
               {missing, "temporary file", "No such file or directory"});
  // The target is a directory.
  fs::create_directory(dir.path() / "sub");
  expect_error([&] { io::save(dir.file("sub"), make_model(1)); }, "io.save",
               {"sub", "not a regular file", "a directory"});
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"sub"});
  EXPECT_TRUE(fs::is_empty(dir.path() / "sub"));
  expect_error([&] { io::save(dir.file("sub") + "/", make_model(1)); }, "io.save", {"bad path"});
}

// The pid of a process that has exited and been reaped: no process has it (until it is reused).
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

std::string temp_name(const std::string& target, pid_t pid) {
  return "." + target + ".tmp-" + std::to_string(pid) + "-0123456789abcdef";
}

TEST(IoAtomic, StaleTemporariesOfDeadWritersAreRemovedOnTheNextSave) {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  const std::string dead = temp_name("ckpt.safetensors", dead_pid());
  const std::string live = temp_name("ckpt.safetensors", ::getpid());
  const std::string locked = temp_name("ckpt.safetensors", dead_pid());
  const std::string other_target = temp_name("other.safetensors", dead_pid());
  const std::string not_ours = ".ckpt.safetensors.tmp-notes";
  for (const auto& name : {dead, live, locked, other_target, not_ours})
    write_file(dir.file(name), Bytes(100, 1));
  // A writer whose pid is not ours to see (another machine, another PID namespace) still holds
  // its lock: its temporary file is not stale.
  const int fd = ::open(dir.file(locked).c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  io::save(path, make_model(1));
  ::close(fd);
  std::vector<std::string> want{"ckpt.safetensors", live, locked, other_target, not_ours};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(dir.entries(), want);
  // data::write_file shares the writer.
  kiln::data::write_file(dir.file("other.safetensors"), Bytes{1, 2, 3});
  std::erase(want, other_target);
  want.push_back("other.safetensors");
  std::sort(want.begin(), want.end());
  EXPECT_EQ(dir.entries(), want);
}

TEST(IoAtomic, SaveKilledMidwayIsCleanedUpByTheNextSave) {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  const std::vector<io::NamedTensor> big{{"w", kiln::zeros({8, 1024, 1024})}};  // 32 MiB
  const auto temporaries = [&] {
    int n = 0;
    for (const auto& e : dir.entries()) n += e.rfind(".ckpt.safetensors.tmp-", 0) == 0;
    return n;
  };
  // A child saves over and over and is SIGKILLed once its temporary file exists; should the
  // kill land between a rename and the next save, it is tried again.
  for (int attempt = 0; attempt < 20 && temporaries() == 0; ++attempt) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      for (;;) io::save_tensors(path, big);
    }
    while (temporaries() == 0) std::this_thread::yield();
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
  }
  ASSERT_EQ(temporaries(), 1);
  io::save(path, make_model(1));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"ckpt.safetensors"});
}

TEST(IoAtomic, RefusesTargetsThatAreNotRegularFiles) {
  TempDir dir;
  const std::string fifo = dir.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error([&] { io::save(fifo, make_model(1)); }, "io.save",
               {fifo, "not a regular file", "a FIFO", "expected a regular file"});
  expect_error([&] { kiln::data::write_file(fifo, Bytes{1}); }, "data.write_file",
               {fifo, "a FIFO"});
  // Through a symbolic link too; a link to a regular file is replaced as before.
  ASSERT_EQ(::symlink(fifo.c_str(), dir.file("link").c_str()), 0);
  expect_error([&] { io::save(dir.file("link"), make_model(1)); }, "io.save", {"a FIFO"});
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"link", "pipe"}));
  // A device node (root may make one: a copy of /dev/null's).
  const std::string dev = dir.file("null");
  if (::mknod(dev.c_str(), S_IFCHR | 0600, ::makedev(1, 3)) == 0) {
    expect_error([&] { io::save(dev, make_model(1)); }, "io.save", {"a character device"});
    ASSERT_EQ(::lstat(dev.c_str(), &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode));
  }
}

TEST(IoAtomic, ReadOnlyDirectory) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  io::save(path, make_model(1));
  const Bytes before = read_file(path);
  ASSERT_EQ(::chmod(dir.path().c_str(), 0500), 0);
  expect_error([&] { io::save(path, make_model(2)); }, "io.save", {path, "Permission denied"});
  ::chmod(dir.path().c_str(), 0700);
  EXPECT_EQ(read_file(path), before);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"ckpt.safetensors"});
}

// ---- interop with an independent writer and reader (numpy + json + struct) -------------------

bool have_numpy() {
  return ::access("/usr/bin/python3", X_OK) == 0 &&
         std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
}

const char* kPythonScript = R"PY(
import json, struct, sys
import numpy as np

def write(path, arrays, metadata):
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, (code, a) in arrays.items():
        b = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode("utf-8")  # default separators, ASCII with \u escapes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))

def read(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    types = {"F32": "<f4", "F64": "<f8", "I64": "<i8", "I32": "<i4", "U8": "u1", "BOOL": "?",
             "F16": "<f2", "U32": "<u4"}
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + b:8 + n + end], dtype=types[e["dtype"]]).reshape(e["shape"])
    return out, meta

mode, path = sys.argv[1], sys.argv[2]
if mode == "write":
    write(path, {
        "f32": ("F32", np.arange(6, dtype=np.float32).reshape(2, 3) / 4),
        "f64": ("F64", np.array([1e300, -2.5, np.pi])),
        "i64": ("I64", np.array([[-(2**62)], [7]], dtype=np.int64)),
        "u8": ("U8", np.array([0, 255, 3], dtype=np.uint8)),
        "bool": ("BOOL", np.array([True, False, True])),
        "f16": ("F16", np.array([0.5, -1.0, 65504.0], dtype=np.float16)),
        "caf\u00e9 \U0001F600": ("I32", np.array(5, dtype=np.int32)),
        "empty": ("F32", np.zeros((0, 4), dtype=np.float32)),
    }, {"framework": "numpy", "note": "\u00e9"})
else:
    out, meta = read(path)
    assert meta == {"who": "kiln"}, meta
    assert out["x"].dtype == np.float32 and out["x"].shape == (2, 2), out["x"]
    assert (out["x"] == np.array([[1, 2], [3, 4]], dtype=np.float32)).all(), out["x"]
    assert (out["y"] == np.array([-1, 5], dtype=np.int64)).all(), out["y"]
    assert out["s"].shape == () and out["s"] == 2.5, out["s"]
    print("python-read-ok")
)PY";

TEST(IoInterop, NumpyWrittenFileLoads) {
  if (!have_numpy()) GTEST_SKIP() << "/usr/bin/python3 with numpy not available";
  TempDir dir;
  const std::string script = dir.file("st.py");
  {
    std::ofstream out(script);
    out << kPythonScript;
  }
  const std::string path = dir.file("np.safetensors");
  ASSERT_EQ(std::system(("/usr/bin/python3 " + script + " write " + path).c_str()), 0);
  const io::TensorFile f = io::load_tensors(path);
  EXPECT_EQ(f.metadata,
            (std::map<std::string, std::string>{{"framework", "numpy"}, {"note", "\xc3\xa9"}}));
  ASSERT_EQ(f.tensors.size(), 8u);
  EXPECT_EQ(f.find("f32")->to_vector<float>(),
            (std::vector<float>{0, 0.25f, 0.5f, 0.75f, 1, 1.25f}));
  EXPECT_EQ(f.find("f32")->shape(), (Shape{2, 3}));
  EXPECT_EQ(f.find("f64")->to_vector<double>(),
            (std::vector<double>{1e300, -2.5, 3.141592653589793}));
  EXPECT_EQ(f.find("i64")->to_vector<int64_t>(), (std::vector<int64_t>{-(int64_t{1} << 62), 7}));
  EXPECT_EQ(f.find("i64")->shape(), (Shape{2, 1}));
  EXPECT_EQ(f.find("u8")->to_vector<uint8_t>(), (std::vector<uint8_t>{0, 255, 3}));
  EXPECT_EQ(f.find("bool")->to_vector<bool>(), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(f.find("f16")->dtype(), kiln::float16);
  EXPECT_EQ(f.find("f16")->to_vector<float>(), (std::vector<float>{0.5f, -1.0f, 65504.0f}));
  const Tensor* named = f.find("caf\xc3\xa9 \xf0\x9f\x98\x80");
  ASSERT_NE(named, nullptr);
  EXPECT_EQ(named->rank(), 0);
  EXPECT_EQ(named->item<int32_t>(), 5);
  EXPECT_EQ(f.find("empty")->shape(), (Shape{0, 4}));
}

TEST(IoInterop, KilnWrittenFileReadsInNumpy) {
  if (!have_numpy()) GTEST_SKIP() << "/usr/bin/python3 with numpy not available";
  TempDir dir;
  const std::string script = dir.file("st.py");
  {
    std::ofstream out(script);
    out << kPythonScript;
  }
  const std::string path = dir.file("kiln.safetensors");
  io::save_tensors(path,
                   {{"x", kiln::transpose(kiln::tensor({1.f, 3.f, 2.f, 4.f}, {2, 2}))},
                    {"y", kiln::tensor(std::vector<int64_t>{-1, 5})},
                    {"s", kiln::tensor(2.5f)}},
                   {{"who", "kiln"}});
  ASSERT_EQ(std::system(("/usr/bin/python3 " + script + " read " + path).c_str()), 0);
}

}  // namespace
