// safetensors reading and writing (include/kiln/io.h, docs/CHECKPOINTS.md).
//
// Reading: the header is parsed by a small strict JSON parser that knows the format's schema
// (an object of tensor entries and "__metadata__"; nothing deeper), then every entry is checked
// against the real byte count before any tensor is allocated, and the tensors' offsets must tile
// the data section exactly. Writing: the header and data are produced from a plan computed up
// front, so a bad tensor fails before any file is created.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "detail/files.h"
#include "kiln/io.h"

namespace kiln::io {

static_assert(std::endian::native == std::endian::little,
              "kiln::io copies tensor bytes as they are: safetensors data is little-endian");

namespace {

constexpr std::string_view kLoad = "io.load";
constexpr std::string_view kSave = "io.save";

struct DTypeEntry {
  std::string_view name;
  DType dtype;
};
constexpr DTypeEntry kDTypes[] = {
    {"BOOL", bool_},  {"U8", uint8},      {"U32", uint32},  {"I32", int32},   {"I64", int64},
    {"F16", float16}, {"BF16", bfloat16}, {"F32", float32}, {"F64", float64},
};
constexpr std::string_view kSupportedList = "BOOL, U8, U32, I32, I64, F16, BF16, F32, F64";
// Valid safetensors dtypes that Kiln has no dtype for.
constexpr std::string_view kUnsupported[] = {
    "I8", "I16", "U16", "U64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "C64"};

// ---- text helpers ---------------------------------------------------------------------------

// Length of the valid UTF-8 sequence starting at s[i] (1 for ASCII), or 0 when it is not one
// (overlong forms, surrogates and code points above U+10FFFF are invalid).
std::size_t utf8_char(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned c = b(i);
  if (c < 0x80) return 1;
  std::size_t n = 0;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (s.size() - i < n) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if ((b(i + k) & 0xC0) != 0x80) return 0;
  return n;
}

bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_char(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

void append_hex_byte(std::string& out, unsigned char c) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += "\\x";
  out += kHex[c >> 4];
  out += kHex[c & 15];
}

// 'name' for messages: control characters and invalid UTF-8 escaped as \xNN, long names cut.
std::string quoted(std::string_view s) {
  constexpr std::size_t kMax = 80;
  std::string out = "'";
  std::size_t i = 0;
  while (i < s.size() && i < kMax) {
    const std::size_t n = utf8_char(s, i);
    const auto c = static_cast<unsigned char>(s[i]);
    if (n == 0 || (n == 1 && (c < 0x20 || c == 0x7f))) {
      append_hex_byte(out, c);
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  if (i < s.size()) out += "...";
  out += "'";
  return out;
}

// The file named in load messages: 'path', or <memory> as it is.
std::string where(std::string_view source) {
  if (!source.empty() && source.front() == '<') return std::string(source);
  return quoted(source);
}

std::string shape_text(const std::vector<int64_t>& dims) { return Shape(dims).to_string(); }

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint64_t load_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// ---- the header -----------------------------------------------------------------------------

struct Entry {
  std::string name;
  DType dtype = float32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct Header {
  std::vector<Entry> entries;  // in header order
  std::map<std::string, std::string> metadata;
};

// A strict parser for exactly what a safetensors header may hold: the root object, tensor entry
// objects, "__metadata__" (an object of strings), arrays of non-negative integers. Anything
// else (true, null, fractions, negative numbers, unknown fields, duplicate keys, invalid UTF-8,
// lone surrogates, trailing bytes other than spaces) is an error naming the byte offset.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, std::string_view source) : s_(text), source_(source) {}

  Header parse() {
    Header h;
    // The format requires the header to start with '{'.
    expect('{', "'{' (a safetensors header is a JSON object)");
    std::unordered_set<std::string> names;
    bool have_metadata = false;
    skip_ws();
    if (!consume('}')) {
      for (;;) {
        skip_ws();
        const std::size_t key_pos = pos_;
        std::string key = parse_string("a tensor name (a JSON string)");
        skip_ws();
        expect(':', "':'");
        skip_ws();
        if (key == "__metadata__") {
          if (have_metadata)
            fail_at(key_pos, "duplicate key \"__metadata__\"", "a second one", "it at most once");
          have_metadata = true;
          parse_metadata(h.metadata);
        } else {
          if (names.count(key))
            fail_at(key_pos, "duplicate tensor name " + quoted(key), "a second entry",
                    "unique names");
          names.insert(key);
          h.entries.push_back(parse_entry(std::move(key)));
        }
        skip_ws();
        if (consume(',')) continue;
        expect('}', "',' or '}'");
        break;
      }
    }
    // Writers pad the header with spaces (0x20) to align the data; nothing else may follow.
    while (pos_ < s_.size() && s_[pos_] == ' ') ++pos_;
    if (pos_ != s_.size())
      error("bytes after the header's JSON object", "only space padding up to the header size");
    return h;
  }

 private:
  std::string_view s_;
  std::string_view source_;
  std::size_t pos_ = 0;
  std::string context_;  // " (entry of tensor 'x')" while inside an entry

  std::string got_at(std::size_t pos) const {
    if (pos >= s_.size()) return "the end of the header";
    const auto c = static_cast<unsigned char>(s_[pos]);
    if (c >= 0x20 && c < 0x7f) return std::string("'") + static_cast<char>(c) + "'";
    std::string out = "byte ";
    static constexpr char kHex[] = "0123456789abcdef";
    out += "0x";
    out += kHex[c >> 4];
    out += kHex[c & 15];
    return out;
  }

  [[noreturn]] void fail_at(std::size_t pos, std::string_view what, std::string_view got,
                            std::string_view expected) const {
    // Offsets are file offsets: the header starts after the 8-byte size.
    fail(kLoad, "bad safetensors header in ", where(source_), " at byte ", pos + 8, context_,
         what.empty() ? "" : ": ", what, ": got ", got, ", expected ", expected);
  }
  [[noreturn]] void error_at(std::size_t pos, std::string_view what,
                             std::string_view expected) const {
    fail_at(pos, what, got_at(pos), expected);
  }
  [[noreturn]] void error(std::string_view what, std::string_view expected) const {
    error_at(pos_, what, expected);
  }

  void skip_ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  bool consume(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c, std::string_view expected) {
    if (!consume(c)) error("", expected);
  }

  uint32_t hex4() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      if (pos_ >= s_.size()) error("unfinished \\u escape", "4 hex digits");
      const char c = s_[pos_];
      uint32_t d;
      if (c >= '0' && c <= '9') {
        d = static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        d = static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        d = static_cast<uint32_t>(c - 'A' + 10);
      } else {
        error("bad \\u escape", "4 hex digits");
      }
      v = v * 16 + d;
      ++pos_;
    }
    return v;
  }

  std::string parse_string(std::string_view expected) {
    if (!consume('"')) error("", expected);
    std::string out;
    for (;;) {
      if (pos_ >= s_.size()) error("unterminated string", "'\"'");
      const auto c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c == '\\') {
        ++pos_;
        if (pos_ >= s_.size()) error("unfinished escape", "an escape character");
        const char e = s_[pos_++];
        switch (e) {
          case '"':
            out += '"';
            break;
          case '\\':
            out += '\\';
            break;
          case '/':
            out += '/';
            break;
          case 'b':
            out += '\b';
            break;
          case 'f':
            out += '\f';
            break;
          case 'n':
            out += '\n';
            break;
          case 'r':
            out += '\r';
            break;
          case 't':
            out += '\t';
            break;
          case 'u': {
            const std::size_t at = pos_ - 2;
            uint32_t cp = hex4();
            if (cp >= 0xDC00 && cp <= 0xDFFF)
              fail_at(at, "lone low surrogate in \\u escape", "\\u" + hex_text(cp),
                      "a high surrogate (\\uD800-\\uDBFF) first");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
              if (s_.substr(pos_, 2) != "\\u")
                error("high surrogate \\u" + hex_text(cp) + " not followed by a low surrogate",
                      "\\uDC00-\\uDFFF");
              pos_ += 2;
              const uint32_t low = hex4();
              if (low < 0xDC00 || low > 0xDFFF)
                fail_at(pos_ - 6, "high surrogate \\u" + hex_text(cp) + " followed by",
                        "\\u" + hex_text(low), "a low surrogate \\uDC00-\\uDFFF");
              cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            }
            append_utf8(out, cp);
            break;
          }
          default:
            error_at(pos_ - 1, "bad escape in string", "one of \" \\ / b f n r t u");
        }
        continue;
      }
      if (c < 0x20) error("control character in string", "it escaped (\\n, \\u0001, ...)");
      const std::size_t n = utf8_char(s_, pos_);
      if (n == 0) error("invalid UTF-8 in string", "valid UTF-8");
      out.append(s_.substr(pos_, n));
      pos_ += n;
    }
  }

  static std::string hex_text(uint32_t v) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "%04X", v);
    return buf;
  }

  uint64_t parse_uint(std::string_view expected) {
    const std::size_t start = pos_;
    if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9') error("", expected);
    uint64_t v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      const auto d = static_cast<uint64_t>(s_[pos_] - '0');
      if (v > (std::numeric_limits<uint64_t>::max() - d) / 10)
        error_at(start, "integer does not fit in 64 bits", "at most 18446744073709551615");
      v = v * 10 + d;
      ++pos_;
    }
    if (s_[start] == '0' && pos_ - start > 1)
      error_at(start, "integer with a leading zero", expected);
    if (pos_ < s_.size() && (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E'))
      error("not an integer", expected);
    return v;
  }

  void parse_metadata(std::map<std::string, std::string>& out) {
    context_ = " (in \"__metadata__\")";
    expect('{', "'{' (\"__metadata__\" is an object of strings)");
    skip_ws();
    if (!consume('}')) {
      for (;;) {
        skip_ws();
        const std::size_t key_pos = pos_;
        std::string key = parse_string("a metadata key (a JSON string)");
        skip_ws();
        expect(':', "':'");
        skip_ws();
        std::string value = parse_string("a metadata value (a JSON string)");
        if (out.count(key))
          fail_at(key_pos, "duplicate metadata key " + quoted(key), "a second value",
                  "unique keys");
        out.emplace(std::move(key), std::move(value));
        skip_ws();
        if (consume(',')) continue;
        expect('}', "',' or '}'");
        break;
      }
    }
    context_.clear();
  }

  DType parse_dtype() {
    const std::size_t at = pos_;
    const std::string d = parse_string("a dtype string such as \"F32\"");
    for (const DTypeEntry& e : kDTypes)
      if (e.name == d) return e.dtype;
    for (std::string_view u : kUnsupported)
      if (u == d)
        fail_at(at, "dtype " + d + " is not supported by Kiln", d,
                std::string("one of ") + std::string(kSupportedList));
    fail_at(at, "unknown dtype", quoted(d), std::string("one of ") + std::string(kSupportedList));
  }

  std::vector<int64_t> parse_shape() {
    std::vector<int64_t> dims;
    expect('[', "'[' (shape is an array of non-negative integers)");
    skip_ws();
    if (consume(']')) return dims;
    for (;;) {
      skip_ws();
      if (static_cast<int>(dims.size()) == kMaxRank)
        error("more than " + std::to_string(kMaxRank) + " dimensions",
              "at most " + std::to_string(kMaxRank));
      const std::size_t at = pos_;
      const uint64_t d = parse_uint("a dimension (a non-negative integer)");
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        error_at(at, "dimension too large", "at most 2^63-1");
      dims.push_back(static_cast<int64_t>(d));
      skip_ws();
      if (consume(',')) continue;
      expect(']', "',' or ']'");
      return dims;
    }
  }

  std::pair<uint64_t, uint64_t> parse_offsets() {
    expect('[', "'[' (data_offsets is [begin, end])");
    skip_ws();
    const uint64_t begin = parse_uint("an integer (data_offsets is [begin, end])");
    skip_ws();
    expect(',', "',' (data_offsets is [begin, end])");
    skip_ws();
    const uint64_t end = parse_uint("an integer (data_offsets is [begin, end])");
    skip_ws();
    expect(']', "']' (data_offsets holds exactly two integers)");
    return {begin, end};
  }

  Entry parse_entry(std::string name) {
    Entry e;
    context_ = " (entry of tensor " + quoted(name) + ")";
    e.name = std::move(name);
    expect('{', "'{' (a tensor entry is an object with dtype, shape and data_offsets)");
    bool has_dtype = false, has_shape = false, has_offsets = false;
    skip_ws();
    if (!consume('}')) {
      for (;;) {
        skip_ws();
        const std::size_t key_pos = pos_;
        const std::string key = parse_string("a field name (a JSON string)");
        skip_ws();
        expect(':', "':'");
        skip_ws();
        bool* seen = nullptr;
        if (key == "dtype") {
          seen = &has_dtype;
        } else if (key == "shape") {
          seen = &has_shape;
        } else if (key == "data_offsets") {
          seen = &has_offsets;
        } else {
          error_at(key_pos, "unknown field " + quoted(key), "only dtype, shape and data_offsets");
        }
        if (*seen)
          fail_at(key_pos, "duplicate field " + quoted(key), "a second one", "each field once");
        *seen = true;
        if (key == "dtype") {
          e.dtype = parse_dtype();
        } else if (key == "shape") {
          e.shape = parse_shape();
        } else {
          std::tie(e.begin, e.end) = parse_offsets();
        }
        skip_ws();
        if (consume(',')) continue;
        expect('}', "',' or '}'");
        break;
      }
    }
    const char* missing = !has_dtype     ? "dtype"
                          : !has_shape   ? "shape"
                          : !has_offsets ? "data_offsets"
                                         : nullptr;
    if (missing)
      fail_at(pos_ - 1, std::string("missing field \"") + missing + "\"", "an entry without it",
              "dtype, shape and data_offsets");
    context_.clear();
    return e;
  }
};

// Header size checks shared by parse_safetensors and load_tensors. `available` is what follows
// the 8-byte size field.
void check_header_size(uint64_t n, uint64_t available, std::string_view source) {
  if (n > kMaxHeaderBytes)
    fail(kLoad, "header size of ", where(source), " is over the limit: got ", n,
         " bytes, expected at most ", kMaxHeaderBytes);
  if (n > available)
    fail(kLoad, "header size of ", where(source), " is larger than the file: got ", n,
         " bytes, expected at most the ", available, " bytes after the 8-byte size field");
}

void check_file_size(uint64_t size, std::string_view source) {
  if (size < 8)
    fail(kLoad, "not a safetensors file: ", where(source), " is too short: got ", size,
         " bytes, expected at least the 8-byte header size");
}

// Checks every entry against the data section of `data_size` bytes and returns the entries'
// indices in data order. The offsets must tile [0, data_size) exactly: no gaps, no overlaps.
std::vector<std::size_t> validate(const Header& h, uint64_t data_size, uint64_t data_start,
                                  std::string_view source) {
  for (const Entry& e : h.entries) {
    // Kiln's limit on every shape (docs/DESIGN.md, "Sizes"): the product of the non-zero
    // dimensions at most Shape::kMaxNumel, as numel and strides come from partial products,
    // even for empty tensors. Bytes then fit in int64_t at any element size.
    uint64_t bound = 1;
    bool zero = false;
    for (int64_t d : e.shape) {
      zero = zero || d == 0;
      if (__builtin_mul_overflow(bound, static_cast<uint64_t>(std::max<int64_t>(d, 1)), &bound) ||
          bound > static_cast<uint64_t>(Shape::kMaxNumel))
        fail(kLoad, "tensor ", quoted(e.name), " in ", where(source), " is too large: got shape ",
             shape_text(e.shape), " of ", safetensors_dtype_name(e.dtype),
             ", expected its non-zero sizes to multiply to at most ", Shape::kMaxNumel);
    }
    const uint64_t nbytes = zero ? 0 : bound * dtype_size(e.dtype);
    if (e.begin > e.end)
      fail(kLoad, "tensor ", quoted(e.name), " in ", where(source),
           " has reversed data_offsets: got [", e.begin, ", ", e.end, "], expected begin <= end");
    if (e.end > data_size)
      fail(kLoad, "tensor ", quoted(e.name), " in ", where(source),
           " ends past the data: got data_offsets [", e.begin, ", ", e.end,
           "], expected end <= ", data_size, " (the data section's size)");
    if (e.end - e.begin != nbytes)
      fail(kLoad, "tensor ", quoted(e.name), " in ", where(source),
           " has data_offsets of the wrong size: got [", e.begin, ", ", e.end, "] (",
           e.end - e.begin, " bytes), expected ", nbytes, " bytes for ",
           safetensors_dtype_name(e.dtype), " ", shape_text(e.shape));
  }
  std::vector<std::size_t> order(h.entries.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const Entry& x = h.entries[a];
    const Entry& y = h.entries[b];
    return std::pair(x.begin, x.end) < std::pair(y.begin, y.end);
  });
  uint64_t next = 0;
  const Entry* prev = nullptr;
  for (std::size_t i : order) {
    const Entry& e = h.entries[i];
    if (e.begin < next)
      fail(kLoad, "tensors ", quoted(prev->name), " and ", quoted(e.name), " in ", where(source),
           " overlap: got data_offsets [", prev->begin, ", ", prev->end, "] and [", e.begin, ", ",
           e.end, "], expected disjoint ranges");
    if (e.begin > next)
      fail(kLoad, "gap in the data of ", where(source), ": got bytes [", next, ", ", e.begin,
           ") (file byte ", data_start + next, ") before tensor ", quoted(e.name),
           " in no tensor, expected the tensors to cover the data without holes");
    next = e.end;
    prev = &e;
  }
  if (next != data_size)
    fail(kLoad, "bytes after the last tensor in ", where(source), ": got a data section of ",
         data_size, " bytes (from file byte ", data_start, "), expected ", next,
         " (the end of the last tensor)");
  return order;
}

// BOOL data must be 0 or 1 (anything else is not a valid C++ bool).
void check_bool_bytes(const Entry& e, const Tensor& t, uint64_t file_offset,
                      std::string_view source) {
  const auto* p = static_cast<const uint8_t*>(t.raw_data());
  const auto n = static_cast<std::size_t>(e.end - e.begin);
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] > 1)
      fail(kLoad, "tensor ", quoted(e.name), " in ", where(source),
           " holds a bad BOOL at file byte ", file_offset + i, ": got ", static_cast<int>(p[i]),
           ", expected 0 or 1");
}

// Allocates and fills the tensors (validated entries only). read(dst, begin, n) copies n bytes
// of the data section from `begin`.
template <class Read>
TensorFile materialize(Header h, const std::vector<std::size_t>& order, uint64_t data_start,
                       std::string_view source, Read&& read) {
  TensorFile out;
  out.metadata = std::move(h.metadata);
  out.tensors.reserve(order.size());
  for (std::size_t i : order) {
    Entry& e = h.entries[i];
    Tensor t = empty(Shape(e.shape), e.dtype);
    if (e.end > e.begin) {
      read(t.raw_data(), e.begin, e.end - e.begin);
      if (e.dtype == bool_) check_bool_bytes(e, t, data_start + e.begin, source);
    }
    out.tensors.push_back({std::move(e.name), std::move(t)});
  }
  return out;
}

// ---- writing --------------------------------------------------------------------------------

struct WritePlan {
  std::string header;        // JSON padded with spaces so that 8 + size is a multiple of 8
  std::vector<Tensor> data;  // contiguous, in file order
  uint64_t data_bytes = 0;
};

// `ctx` starts each message ("cannot write 'path': ").
WritePlan plan_write(const std::vector<NamedTensor>& tensors,
                     const std::map<std::string, std::string>& metadata, std::string_view ctx) {
  WritePlan p;
  std::string& j = p.header;
  j = "{";
  if (!metadata.empty()) {
    j += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!valid_utf8(k))
        fail(kSave, ctx, "metadata key ", quoted(k),
             " is not valid UTF-8: got invalid bytes, expected UTF-8 text");
      if (!valid_utf8(v))
        fail(kSave, ctx, "metadata value of ", quoted(k), " is not valid UTF-8: got ", quoted(v),
             ", expected UTF-8 text");
      if (!first) j += ',';
      first = false;
      append_json_string(j, k);
      j += ':';
      append_json_string(j, v);
    }
    j += '}';
  }
  std::unordered_set<std::string_view> seen;
  for (const NamedTensor& nt : tensors) {
    const std::string& name = nt.name;
    if (name.empty())
      fail(kSave, ctx,
           "empty tensor name: got \"\", expected a non-empty name (a tree that is a "
           "single Tensor has no name: wrap it in a struct or a map)");
    if (name == "__metadata__")
      fail(kSave, ctx,
           "bad tensor name: got \"__metadata__\", expected any other name (the "
           "format reserves it)");
    if (!valid_utf8(name))
      fail(kSave, ctx, "tensor name is not valid UTF-8: got ", quoted(name),
           ", expected UTF-8 text");
    if (!seen.insert(name).second)
      fail(kSave, ctx, "duplicate tensor name: got ", quoted(name),
           " twice, expected unique names");
    const Tensor& t = nt.tensor;
    if (!t.defined())
      fail(kSave, ctx, "tensor ", quoted(name),
           " is undefined: got a default-constructed Tensor, "
           "expected a tensor with data");
    if (t.is_traced())
      fail(kSave, ctx, "tensor ", quoted(name), " is traced: got a tracer of ", t.type(),
           ", expected a concrete tensor (save outside jit/grad/vmap)");
    Tensor c = t.contiguous();
    const uint64_t nbytes = static_cast<uint64_t>(c.numel()) * dtype_size(c.dtype());
    if (j.size() > 1) j += ',';
    append_json_string(j, name);
    j += ":{\"dtype\":\"";
    j += safetensors_dtype_name(c.dtype());
    j += "\",\"shape\":[";
    for (int i = 0; i < c.rank(); ++i) {
      if (i) j += ',';
      j += std::to_string(c.shape()[i]);
    }
    j += "],\"data_offsets\":[";
    j += std::to_string(p.data_bytes);
    j += ',';
    j += std::to_string(p.data_bytes + nbytes);
    j += "]}";
    p.data_bytes += nbytes;
    p.data.push_back(std::move(c));
  }
  j += '}';
  while ((j.size() + 8) % 8 != 0) j += ' ';
  if (j.size() > kMaxHeaderBytes)
    fail(kSave, ctx, "header too large: got ", j.size(), " bytes, expected at most ",
         kMaxHeaderBytes, " (readers reject larger headers)");
  return p;
}

void store_le64(uint8_t* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

std::string errno_text(int e) { return std::strerror(e); }

// Reads exactly n bytes at `offset`; returns false at end of file; raises on errors.
bool read_all(int fd, void* data, std::size_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const std::size_t chunk = std::min<std::size_t>(n, std::size_t{1} << 30);
    const ssize_t r = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail(kLoad, "cannot read ", quoted(path), " at byte ", offset, ": ", errno_text(errno));
    }
    if (r == 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

void read_or_fail(int fd, void* data, std::size_t n, uint64_t offset, const std::string& path) {
  if (!read_all(fd, data, n, offset, path))
    fail(kLoad, "cannot read ", quoted(path), ": got the end of the file before byte ", offset + n,
         ", expected the size it had when opened (was it changed while being read?)");
}

}  // namespace

// ---- public functions -----------------------------------------------------------------------

std::string_view safetensors_dtype_name(DType d) {
  for (const DTypeEntry& e : kDTypes)
    if (e.dtype == d) return e.name;
  fail(kSave, "no safetensors name for dtype ", dtype_name(d));
}

const Tensor* TensorFile::find(std::string_view name) const {
  for (const NamedTensor& nt : tensors)
    if (nt.name == name) return &nt.tensor;
  return nullptr;
}

std::vector<uint8_t> serialize_safetensors(const std::vector<NamedTensor>& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  const WritePlan p = plan_write(tensors, metadata, "");
  std::vector<uint8_t> out(8 + p.header.size() + p.data_bytes);
  store_le64(out.data(), p.header.size());
  std::memcpy(out.data() + 8, p.header.data(), p.header.size());
  std::size_t at = 8 + p.header.size();
  for (const Tensor& t : p.data) {
    const std::size_t n = static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype());
    if (n) std::memcpy(out.data() + at, t.raw_data(), n);
    at += n;
  }
  return out;
}

TensorFile parse_safetensors(std::span<const uint8_t> bytes, std::string_view source) {
  check_file_size(bytes.size(), source);
  const uint64_t n = load_le64(bytes.data());
  check_header_size(n, bytes.size() - 8, source);
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8),
                              static_cast<std::size_t>(n));
  Header h = HeaderParser(text, source).parse();
  const std::span<const uint8_t> data = bytes.subspan(8 + static_cast<std::size_t>(n));
  const uint64_t data_start = 8 + n;
  const std::vector<std::size_t> order = validate(h, data.size(), data_start, source);
  return materialize(std::move(h), order, data_start, source,
                     [&](void* dst, uint64_t begin, uint64_t count) {
                       std::memcpy(dst, data.data() + begin, static_cast<std::size_t>(count));
                     });
}

TensorFile load_tensors(const std::string& path) {
  kiln::detail::Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.fd < 0) fail(kLoad, "cannot open ", quoted(path), ": ", errno_text(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) fail(kLoad, "cannot stat ", quoted(path), ": ", errno_text(errno));
  if (!S_ISREG(st.st_mode))
    fail(kLoad, "cannot load ", quoted(path),
         ": got something other than a file (a directory?), "
         "expected a regular file");
  const auto size = static_cast<uint64_t>(st.st_size);
  check_file_size(size, path);
  uint8_t size_field[8];
  read_or_fail(f.fd, size_field, 8, 0, path);
  const uint64_t n = load_le64(size_field);
  check_header_size(n, size - 8, path);
  std::string text(static_cast<std::size_t>(n), '\0');
  read_or_fail(f.fd, text.data(), text.size(), 8, path);
  Header h = HeaderParser(text, path).parse();
  const uint64_t data_start = 8 + n;
  const std::vector<std::size_t> order = validate(h, size - data_start, data_start, path);
  return materialize(
      std::move(h), order, data_start, path, [&](void* dst, uint64_t begin, uint64_t count) {
        read_or_fail(f.fd, dst, static_cast<std::size_t>(count), data_start + begin, path);
      });
}

void save_tensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                  const std::map<std::string, std::string>& metadata) {
  const WritePlan p = plan_write(tensors, metadata, "cannot write " + quoted(path) + ": ");

  kiln::detail::write_file_atomically(kSave, path, quoted(path), [&](int fd) {
    uint8_t size_field[8];
    store_le64(size_field, p.header.size());
    if (int e = kiln::detail::write_all(fd, size_field, 8)) return e;
    if (int e = kiln::detail::write_all(fd, p.header.data(), p.header.size())) return e;
    for (const Tensor& t : p.data) {
      const std::size_t n = static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype());
      if (n == 0) continue;
      if (int e = kiln::detail::write_all(fd, t.raw_data(), n)) return e;
    }
    return 0;
  });
}

// ---- trees ----------------------------------------------------------------------------------

namespace detail {

std::vector<NamedTensor> named_leaves(const std::vector<Tensor>& leaves,
                                      const std::vector<std::string>& names) {
  std::vector<NamedTensor> out;
  out.reserve(leaves.size());
  for (std::size_t i = 0; i < leaves.size() && i < names.size(); ++i)
    if (leaves[i].defined()) out.push_back({names[i], leaves[i]});
  return out;
}

std::vector<Tensor> match_leaves(TensorFile file, const std::vector<std::string>& names,
                                 const std::vector<Tensor>& like, std::string_view path,
                                 const LoadOptions& options) {
  std::unordered_map<std::string_view, std::size_t> index;
  for (std::size_t i = 0; i < file.tensors.size(); ++i) index.emplace(file.tensors[i].name, i);

  std::unordered_set<std::string_view> tree_names_seen;
  for (const std::string& n : names)
    if (!tree_names_seen.insert(n).second)
      fail(kLoad, "cannot load ", quoted(path), " into this tree: got two parameters named ",
           quoted(n), ", expected unique names (a map key with a '.' can collide with a path)");

  std::vector<bool> used(file.tensors.size(), false);
  std::vector<Tensor> out(like.size());
  for (std::size_t i = 0; i < like.size(); ++i) {
    const auto it = index.find(names[i]);
    if (it == index.end()) {
      if (!like[i].defined()) continue;  // an unset leaf stays unset
      std::vector<std::string> missing;
      for (std::size_t k = i; k < like.size(); ++k)
        if (like[k].defined() && !index.count(names[k])) missing.push_back(quoted(names[k]));
      std::string list;
      for (std::size_t k = 1; k < missing.size() && k <= 10; ++k)
        list += (k > 1 ? ", " : "") + missing[k];
      if (missing.size() > 11) list += ", ...";
      fail(kLoad, "parameter ", quoted(names[i]), " is missing from ", quoted(path),
           ": got no tensor of that name, expected ", like[i].type(),
           missing.size() > 1 ? " (also missing: " + list + ")" : std::string());
    }
    used[it->second] = true;
    const Tensor& got = file.tensors[it->second].tensor;
    if (like[i].defined()) {
      if (got.dtype() != like[i].dtype())
        fail(kLoad, "parameter ", quoted(names[i]), " in ", quoted(path),
             " has the wrong dtype: got ", got.type(), ", expected ", like[i].type());
      if (got.shape() != like[i].shape())
        fail(kLoad, "parameter ", quoted(names[i]), " in ", quoted(path),
             " has the wrong shape: got ", got.type(), ", expected ", like[i].type());
    }
    out[i] = got;
  }
  if (!options.allow_extra) {
    std::vector<std::string> extra;
    for (std::size_t i = 0; i < file.tensors.size(); ++i)
      if (!used[i]) extra.push_back(quoted(file.tensors[i].name));
    if (!extra.empty()) {
      std::string list;
      for (std::size_t k = 0; k < extra.size() && k < 10; ++k) list += (k ? ", " : "") + extra[k];
      if (extra.size() > 10) list += ", ...";
      fail(kLoad, quoted(path), " has ", extra.size(), " tensor", extra.size() == 1 ? "" : "s",
           " the tree does not have: got ", list, ", expected only the tree's ", like.size(),
           " parameters (LoadOptions{.allow_extra = true} ignores them)");
    }
  }
  return out;
}

}  // namespace detail

}  // namespace kiln::io
