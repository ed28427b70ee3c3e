// Sources: in-memory tensors, IDX files, CSV files, lists of files and images.
#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "data/node.h"
#include "data/sizes.h"

namespace kiln::data {
namespace detail {
namespace {

using Fields = std::vector<std::pair<std::string, Tensor>>;

std::string type_list(const Fields& fields) {
  std::string s;
  for (const auto& [name, t] : fields)
    s += (s.empty() ? "" : ", ") + name + ":" + t.type().to_string();
  return s;
}

class FieldsView : public Indexed {
 public:
  explicit FieldsView(Fields fields) : fields_(std::move(fields)) {
    n_ = fields_.empty() ? 0 : fields_[0].second.shape()[0];
  }
  int64_t size() const override { return n_; }
  Sample get(int64_t i) const override {
    Sample s;  // the names are distinct (checked by the sources)
    SampleAccess::reserve(s, fields_.size());
    for (const auto& [name, t] : fields_) SampleAccess::append(s, name, slice_view(t, i));
    return s;
  }
  void prefetch(int64_t i) const override {
    if (i < 0 || i >= n_) return;
    for (const auto& [name, t] : fields_) {
      const std::size_t row =
          static_cast<std::size_t>(t.numel() / std::max<int64_t>(n_, 1)) * dtype_size(t.dtype());
      const auto* p = static_cast<const char*>(t.raw_data()) + static_cast<std::size_t>(i) * row;
      for (std::size_t off = 0; off < row; off += 64) __builtin_prefetch(p + off);
    }
  }
  const Fields& fields() const { return fields_; }

 private:
  Fields fields_;
  int64_t n_ = 0;
};

// Fields sliced along their leading axis: from_tensors, from_idx and from_csv.
class TensorSource : public Node {
 public:
  TensorSource(std::string kind, Fields fields, int64_t skipped = 0, std::string error = {})
      : kind_(std::move(kind)),
        view_(std::make_shared<FieldsView>(std::move(fields))),
        skipped_(skipped),
        error_(std::move(error)) {}
  std::string name() const override { return kind_ + "(" + type_list(view_->fields()) + ")"; }
  bool indexed() const override { return true; }
  std::optional<int64_t> size() const override { return view_->size(); }
  int64_t load_skipped() const override { return skipped_; }
  std::string load_error() const override { return error_; }
  std::shared_ptr<const Indexed> open_indexed(const OpenCtx&) const override { return view_; }

 private:
  std::string kind_;
  std::shared_ptr<const FieldsView> view_;
  int64_t skipped_;
  std::string error_;
};

// ---- IDX --------------------------------------------------------------------------------------

struct IdxType {
  uint8_t code;
  const char* name;
  std::size_t size;
  DType dtype;
};
constexpr IdxType kIdxTypes[] = {
    {0x08, "ubyte", 1, uint8}, {0x09, "byte", 1, int32},    {0x0B, "short", 2, int32},
    {0x0C, "int", 4, int32},   {0x0D, "float", 4, float32}, {0x0E, "double", 8, float64},
};

uint32_t be32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) << 24 | static_cast<uint32_t>(p[1]) << 16 |
         static_cast<uint32_t>(p[2]) << 8 | p[3];
}

template <typename Out, typename In>
void convert_be(const uint8_t* src, Out* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint8_t b[sizeof(In)];
    for (std::size_t k = 0; k < sizeof(In); ++k)
      b[k] = src[i * static_cast<int64_t>(sizeof(In)) + static_cast<int64_t>(sizeof(In) - 1 - k)];
    In v;
    std::memcpy(&v, b, sizeof(In));
    dst[i] = static_cast<Out>(v);
  }
}

}  // namespace
}  // namespace detail

using namespace detail;  // NOLINT: this file is the detail namespace's main user

Tensor read_idx(const std::string& path, IdxOptions options, IdxReport* report) {
  if (options.max_bytes < 0)
    fail("data.idx", "bad IdxOptions::max_bytes: got ", options.max_bytes, ", expected >= 0");
  const OnError on_error = options.on_error;
  detail::DecodedFile in(path);
  const char* where = in.compressed() ? " of the decompressed data" : "";
  // Damaged compressed data is the first thing to report.
  const auto check_stream = [&] {
    if (!in.problem().empty() && on_error == OnError::raise) fail("data.gzip", in.problem());
  };
  std::vector<uint8_t> bytes;
  in.read(bytes, 4);
  check_stream();
  if (bytes.size() < 4)
    fail("data.idx", "truncated IDX header in '", path, "': got ", bytes.size(), " bytes", where,
         ", expected at least 4");
  if (bytes[0] != 0 || bytes[1] != 0)
    fail("data.idx", "not an IDX file '", path, "' at byte 0", where, ": got magic ",
         static_cast<int>(bytes[0]), " ", static_cast<int>(bytes[1]), ", expected 0 0");
  const detail::IdxType* type = nullptr;
  for (const auto& t : detail::kIdxTypes)
    if (t.code == bytes[2]) type = &t;
  if (!type)
    fail("data.idx", "unknown IDX element type in '", path, "' at byte 2", where, ": got 0x",
         std::hex, static_cast<int>(bytes[2]), ", expected 0x08, 0x09, 0x0b, 0x0c, 0x0d or 0x0e");
  const int ndim = bytes[3];
  if (ndim < 1)
    fail("data.idx", "bad IDX rank in '", path, "' at byte 3", where, ": got 0, expected >= 1");
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(ndim);
  in.read(bytes, header - 4);
  check_stream();
  if (bytes.size() < header)
    fail("data.idx", "truncated IDX header in '", path, "': got ", bytes.size(), " bytes", where,
         ", expected ", header, " for ", ndim, " dimensions");
  // The sizes the header declares, checked before anything is allocated from them.
  std::vector<int64_t> dims;
  std::string dims_text;
  for (int d = 0; d < ndim; ++d) {
    dims.push_back(be32(bytes.data() + 4 + 4 * d));
    dims_text += (d ? " x " : "") + std::to_string(dims.back());
  }
  std::vector<int64_t> factors(dims.begin(), dims.end());
  factors.push_back(static_cast<int64_t>(type->size));
  const std::optional<int64_t> total = detail::checked_product(factors);
  if (!total)
    fail("data.idx", "IDX dimensions too large in '", path, "' at byte 4", where, ": got ",
         dims_text, " ", type->name, ", expected a size in bytes that fits in 63 bits");
  const int64_t want = *total;
  if (want > options.max_bytes)
    fail("data.idx", "IDX file too large: '", path, "' declares ", want, " data bytes (", dims_text,
         " ", type->name, "), expected at most ", options.max_bytes, " (IdxOptions::max_bytes)");
  // Elements per record (all dims but the first): a sub-product of `total`, so it fits.
  const int64_t item = *detail::checked_product(std::span<const int64_t>(dims).subspan(1));
  const int64_t item_bytes = item * static_cast<int64_t>(type->size);
  const int64_t count = dims[0];
  in.read(bytes, static_cast<std::size_t>(want));
  const auto have = static_cast<int64_t>(bytes.size() - header);
  bool oversized = false;
  if (have == want) {
    std::vector<uint8_t> extra;
    in.read(extra, 1);
    oversized = !extra.empty();
  }
  check_stream();
  std::string problem = in.problem();
  int64_t kept = count;
  if (have != want || oversized || !problem.empty()) {
    if (problem.empty())
      problem = kiln::detail::cat(oversized ? "oversized" : "truncated", " IDX file '", path,
                                  "': got ", oversized ? "more than " : "", have,
                                  " data bytes after the header at byte ", header, where,
                                  ", expected ", want, " (", count, " records of ", item_bytes,
                                  " bytes, ", type->name, ")");
    if (on_error == OnError::raise) fail("data.idx", problem);
    kept = item_bytes ? have / item_bytes : count;
  }
  dims[0] = kept;
  Tensor out = empty(Shape(dims), type->dtype);
  const int64_t n = kept * item;
  const uint8_t* src = bytes.data() + header;
  switch (type->code) {
    case 0x08:
      std::memcpy(out.data<uint8_t>(), src, static_cast<std::size_t>(n));
      break;
    case 0x09:
      detail::convert_be<int32_t, int8_t>(src, out.data<int32_t>(), n);
      break;
    case 0x0B:
      detail::convert_be<int32_t, int16_t>(src, out.data<int32_t>(), n);
      break;
    case 0x0C:
      detail::convert_be<int32_t, int32_t>(src, out.data<int32_t>(), n);
      break;
    case 0x0D:
      detail::convert_be<float, float>(src, out.data<float>(), n);
      break;
    default:
      detail::convert_be<double, double>(src, out.data<double>(), n);
      break;
  }
  if (report) {
    report->skipped = count - kept;
    report->error = problem;
  }
  return out;
}

namespace {
Tensor to_int64(const Tensor& t) {
  Tensor out = empty(t.shape(), int64);
  int64_t* d = out.data<int64_t>();
  const int64_t n = t.numel();
  if (t.dtype() == uint8) {
    const uint8_t* s = t.data<uint8_t>();
    for (int64_t i = 0; i < n; ++i) d[i] = s[i];
  } else if (t.dtype() == int32) {
    const int32_t* s = t.data<int32_t>();
    for (int64_t i = 0; i < n; ++i) d[i] = s[i];
  } else {
    fail("data.from_idx", "labels must be integers: got ", dtype_name(t.dtype()),
         ", expected an IDX file of ubyte, byte, short or int");
  }
  return out;
}

Tensor head(const Tensor& t, int64_t n) {
  if (t.shape()[0] == n) return t;
  std::vector<int64_t> dims = t.shape().dims();
  dims[0] = n;
  Tensor out = empty(Shape(dims), t.dtype());
  std::memcpy(out.raw_data(), t.raw_data(),
              static_cast<std::size_t>(out.numel()) * dtype_size(t.dtype()));
  return out;
}
}  // namespace

Pipeline from_idx(const std::string& images, std::optional<std::string> labels,
                  IdxOptions options) {
  IdxReport ri, rl;
  Tensor img = read_idx(images, options, &ri);
  detail::Fields fields{{"image", img}};
  int64_t skipped = ri.skipped;
  std::string error = ri.error;
  if (labels) {
    Tensor lab = read_idx(*labels, options, &rl);
    if (lab.rank() != 1)
      fail("data.from_idx", "labels file '", *labels, "' is not 1-d: got shape ", lab.shape(),
           ", expected [N]");
    lab = to_int64(lab);
    const int64_t ni = img.shape()[0], nl = lab.shape()[0];
    if (ni != nl) {
      if (options.on_error == OnError::raise || (ri.skipped == 0 && rl.skipped == 0))
        fail("data.from_idx", "record counts differ: got ", ni, " images in '", images, "' and ",
             nl, " labels in '", *labels, "', expected equal counts");
      // Both were read with skip: keep the records that have both halves.
      const int64_t n = std::min(ni, nl);
      skipped = std::max(ni + ri.skipped, nl + rl.skipped) - n;
      img = head(img, n);
      lab = head(lab, n);
      fields = {{"image", img}};
    }
    if (!rl.error.empty()) error = rl.error;
    fields.emplace_back("label", lab);
  }
  return Pipeline(std::make_shared<detail::TensorSource>("from_idx", std::move(fields), skipped,
                                                         std::move(error)));
}

Pipeline from_tensors(std::vector<std::pair<std::string, Tensor>> fields) {
  if (fields.empty()) fail("data.from_tensors", "no fields: got 0 tensors, expected at least one");
  for (auto& [name, t] : fields) {
    if (!t.defined() || t.rank() < 1)
      fail("data.from_tensors", "field '", name, "' has no leading axis: got ",
           t.defined() ? t.type().to_string() : std::string("an undefined tensor"),
           ", expected rank >= 1");
    if (t.shape()[0] != fields[0].second.shape()[0])
      fail("data.from_tensors", "field '", name, "' has another length: got ", t.shape()[0],
           ", expected ", fields[0].second.shape()[0], " like '", fields[0].first, "'");
    if (!t.is_contiguous()) t = t.contiguous();  // sample slices are then contiguous too
  }
  std::unordered_set<std::string_view> seen;
  for (const auto& [name, t] : fields)
    if (!seen.insert(name).second)
      fail("data.from_tensors", "duplicate field name: got '", name,
           "' twice, expected distinct names");
  return Pipeline(std::make_shared<detail::TensorSource>("from_tensors", std::move(fields)));
}

// ---- CSV
// ------------------------------------------------------------------------------------------

namespace {

struct CsvRecord {
  std::vector<std::string> fields;
  int64_t line = 0;        // 1-based line where the record starts
  std::size_t offset = 0;  // byte offset where it starts
};

// RFC 4180 records: quoted fields may hold delimiters, newlines and doubled quotes.
std::vector<CsvRecord> split_csv(const std::vector<uint8_t>& bytes, char delim,
                                 const std::string& path) {
  std::vector<CsvRecord> out;
  const char* s = reinterpret_cast<const char*>(bytes.data());
  const std::size_t n = bytes.size();
  std::size_t i = 0;
  int64_t line = 1;
  if (n >= 3 && std::memcmp(s, "\xEF\xBB\xBF", 3) == 0) i = 3;  // UTF-8 byte order mark
  while (i < n) {
    CsvRecord rec;
    rec.line = line;
    rec.offset = i;
    std::string field;
    bool quoted_field = false;
    for (;;) {
      if (i < n && s[i] == '"' && field.empty() && !quoted_field) {
        quoted_field = true;
        const std::size_t open = i++;
        const int64_t open_line = line;
        for (;;) {
          if (i >= n)
            fail("data.csv", "unterminated quote in '", path, "' at line ", open_line, " (byte ",
                 open, "): got end of file, expected a closing '\"'");
          if (s[i] == '"') {
            if (i + 1 < n && s[i + 1] == '"') {
              field += '"';
              i += 2;
              continue;
            }
            ++i;
            break;
          }
          if (s[i] == '\n') ++line;
          field += s[i++];
        }
        continue;
      }
      if (i >= n || s[i] == '\n' || s[i] == '\r' || s[i] == delim) {
        rec.fields.push_back(std::move(field));
        field.clear();
        quoted_field = false;
        if (i < n && s[i] == delim) {
          ++i;
          continue;
        }
        if (i < n && s[i] == '\r') ++i;
        if (i < n && s[i] == '\n') ++i;
        ++line;
        break;
      }
      field += s[i++];
    }
    const bool blank = rec.fields.size() == 1 && rec.fields[0].empty();
    if (!blank) out.push_back(std::move(rec));
  }
  return out;
}

std::string_view trim(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  return v;
}

// The whole field as a number (blanks around it and a leading '+' allowed), or nothing.
template <typename T>
std::optional<T> parse_number(std::string_view v) {
  v = trim(v);
  if (!v.empty() && v.front() == '+') v.remove_prefix(1);
  T x{};
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || ec != std::errc() || p != v.data() + v.size()) return std::nullopt;
  return x;
}
std::optional<int64_t> parse_int(std::string_view v) { return parse_number<int64_t>(v); }
std::optional<double> parse_double(std::string_view v) { return parse_number<double>(v); }

enum class ColKind { integer, floating, text };

struct CsvColumn {
  std::string name;
  std::size_t source = 0;  // index in the header
  ColKind kind = ColKind::integer;
  std::optional<DType> dtype;  // given by the user
};

// Why a value does not fit its column, or nullopt when it does.
std::optional<std::string> check_value(const CsvColumn& c, std::string_view v) {
  if (c.kind == ColKind::text) return std::nullopt;
  if (c.kind == ColKind::integer) {
    if (const auto x = parse_int(v)) {
      const DType dt = c.dtype.value_or(int64);
      const bool fits = dt == int64 ||
                        (dt == int32 && *x >= std::numeric_limits<int32_t>::min() &&
                         *x <= std::numeric_limits<int32_t>::max()) ||
                        (dt == uint32 && *x >= 0 && *x <= std::numeric_limits<uint32_t>::max()) ||
                        (dt == uint8 && *x >= 0 && *x <= 255) ||
                        (dt == bool_ && (*x == 0 || *x == 1));
      if (fits) return std::nullopt;
      return kiln::detail::cat("got ", *x, ", expected a value that fits ", dtype_name(dt));
    }
  }
  if (c.kind == ColKind::floating && parse_double(v)) return std::nullopt;
  return kiln::detail::cat(
      "got '", v, "', expected ", c.kind == ColKind::integer ? "an integer" : "a number",
      c.dtype ? "" : " (list the column in CsvOptions::text_columns to keep it as text)");
}

// One kept column: numeric as a 1-d tensor (sliced to scalars), text as strings.
struct CsvValues {
  std::string name;
  Tensor numeric;                 // undefined for text
  std::vector<std::string> text;  // per row, for text columns
};

class CsvView : public Indexed {
 public:
  CsvView(int64_t n, std::vector<CsvValues> columns) : n_(n), columns_(std::move(columns)) {}
  int64_t size() const override { return n_; }
  Sample get(int64_t i) const override {
    Sample out;  // the names are distinct (header names deduplicated, select checked)
    SampleAccess::reserve(out, columns_.size());
    for (const auto& c : columns_) {
      if (c.numeric.defined()) {
        SampleAccess::append(out, c.name, slice_view(c.numeric, i));
      } else {
        const std::string& v = c.text[static_cast<std::size_t>(i)];
        SampleAccess::append(out, c.name,
                             bytes_tensor(reinterpret_cast<const uint8_t*>(v.data()), v.size()));
      }
    }
    return out;
  }

 private:
  int64_t n_;
  std::vector<CsvValues> columns_;
};

// pandas.read_csv's renaming of repeated header names: the k-th repeat of "a" becomes "a.k",
// where k skips past names already taken (by the header or an earlier rename).
std::vector<std::string> dedup_names(std::vector<std::string> names) {
  std::unordered_map<std::string, int64_t> counts;
  for (auto& name : names) {
    int64_t count = counts[name];
    while (count > 0) {
      counts[name] = count + 1;
      name.append(".").append(std::to_string(count));
      count = counts[name];
    }
    counts[name] = count + 1;
  }
  return names;
}

template <typename T>
Tensor column_tensor(const std::vector<int64_t>& v) {
  std::vector<T> out(v.begin(), v.end());
  return tensor(out, Shape{static_cast<int64_t>(v.size())});
}

class CsvSource : public Node {
 public:
  CsvSource(std::shared_ptr<const Indexed> view, std::string desc, int64_t skipped,
            std::string error)
      : view_(std::move(view)),
        desc_(std::move(desc)),
        skipped_(skipped),
        error_(std::move(error)) {}
  std::string name() const override { return desc_; }
  bool indexed() const override { return true; }
  std::optional<int64_t> size() const override { return view_->size(); }
  int64_t load_skipped() const override { return skipped_; }
  std::string load_error() const override { return error_; }
  std::shared_ptr<const Indexed> open_indexed(const OpenCtx&) const override { return view_; }

 private:
  std::shared_ptr<const Indexed> view_;
  std::string desc_;
  int64_t skipped_;
  std::string error_;
};

}  // namespace

Pipeline from_csv(const std::string& path, CsvOptions options) {
  const auto bytes = read_file(path);
  auto records = split_csv(bytes, options.delimiter, path);
  if (records.empty())
    fail("data.csv", "empty CSV file '", path, "': got no header line, expected a header");
  const std::vector<std::string> header = dedup_names(records[0].fields);
  std::unordered_map<std::string_view, std::size_t> index;  // header name -> position
  for (std::size_t k = 0; k < header.size(); ++k) index.emplace(header[k], k);
  auto find_col = [&](const std::string& name) {
    const auto it = index.find(name);
    if (it == index.end()) {
      constexpr std::size_t kShown = 20;  // a wide file's whole header would drown the message
      std::string have;
      for (std::size_t k = 0; k < std::min(header.size(), kShown); ++k)
        have += (k ? ", " : "") + header[k];
      if (header.size() > kShown) have += kiln::detail::cat(", ... (", header.size(), " in all)");
      fail("data.csv", "no column '", name, "' in '", path, "': got columns {", have,
           "}, expected one named '", name, "'");
    }
    return it->second;
  };
  // Per-column options by name; a later entry for the same column wins.
  std::unordered_map<std::string_view, DType> types;
  for (const auto& [name, dt] : options.types) {
    find_col(name);
    if (dt != float32 && dt != float64 && dt != int32 && dt != int64 && dt != uint8 &&
        dt != uint32 && dt != bool_)
      fail("data.csv", "unsupported column type for '", name, "': got ", dtype_name(dt),
           ", expected f32, f64, i32, i64, u8, u32 or bool");
    types.insert_or_assign(name, dt);
  }
  std::unordered_set<std::string_view> text_columns;
  for (const auto& name : options.text_columns) {
    find_col(name);
    text_columns.insert(name);
  }
  std::vector<CsvColumn> cols;
  const std::vector<std::string>& keep = options.select.empty() ? header : options.select;
  std::unordered_set<std::string_view> kept;
  for (const auto& name : keep) {
    if (!kept.insert(name).second)
      fail("data.csv", "column '", name, "' twice in CsvOptions::select: got it twice, ",
           "expected each column at most once");
    CsvColumn c{name, find_col(name), ColKind::integer, std::nullopt};
    if (text_columns.contains(name)) c.kind = ColKind::text;
    if (const auto t = types.find(name); t != types.end()) {  // a type overrides text
      c.kind = t->second == float32 || t->second == float64 ? ColKind::floating : ColKind::integer;
      c.dtype = t->second;
    }
    cols.push_back(c);
  }

  // Pass 1: keep the well-formed records. Unlisted columns start as integers and widen to floats.
  std::vector<const CsvRecord*> good;
  int64_t skipped = 0;
  std::string last_error;
  auto bad = [&](const CsvRecord& r, const std::string& why) {
    const std::string msg = kiln::detail::cat("bad record in '", path, "' at line ", r.line,
                                              " (byte ", r.offset, "): ", why);
    if (options.on_error == OnError::raise) fail("data.csv", msg);
    ++skipped;
    last_error = msg;
  };
  for (std::size_t k = 1; k < records.size(); ++k) {
    const CsvRecord& r = records[k];
    if (r.fields.size() != header.size()) {
      bad(r, kiln::detail::cat("got ", r.fields.size(), " fields, expected ", header.size(),
                               " as in the header"));
      continue;
    }
    std::optional<std::string> why;
    for (auto& c : cols) {
      const std::string& v = r.fields[c.source];
      if (!c.dtype && c.kind == ColKind::integer && !parse_int(v) && parse_double(v)) {
        c.kind = ColKind::floating;  // widen: earlier integers parse as floats too
      }
      if (auto w = check_value(c, v)) {
        why = "column '" + c.name + "' " + *w;
        break;
      }
    }
    if (why) {
      bad(r, *why);
      continue;
    }
    good.push_back(&r);
  }
  // Pass 2: fill one tensor per column.
  const auto n = static_cast<int64_t>(good.size());
  std::vector<CsvValues> columns;
  columns.reserve(cols.size());
  std::string desc;
  for (const auto& c : cols) {
    if (c.kind == ColKind::text) {
      std::vector<std::string> vals;
      vals.reserve(good.size());
      for (const auto* r : good) vals.push_back(r->fields[c.source]);
      columns.push_back({c.name, Tensor(), std::move(vals)});
      desc += (desc.empty() ? "" : ", ") + c.name + ":text";
      continue;
    }
    Tensor t;
    if (c.kind == ColKind::integer) {
      std::vector<int64_t> iv;
      iv.reserve(good.size());
      for (const auto* r : good) iv.push_back(*parse_int(r->fields[c.source]));
      switch (c.dtype.value_or(int64)) {
        case DType::int32:
          t = column_tensor<int>(iv);
          break;
        case DType::uint32:
          t = column_tensor<unsigned>(iv);
          break;
        case DType::uint8:
          t = column_tensor<uint8_t>(iv);
          break;
        case DType::bool_:
          t = column_tensor<bool>(iv);
          break;
        default:
          t = column_tensor<int64_t>(iv);
          break;
      }
    } else {
      std::vector<double> dv;
      dv.reserve(good.size());
      for (const auto* r : good) dv.push_back(*parse_double(r->fields[c.source]));
      if (c.dtype.value_or(float32) == float64) {
        t = tensor(dv, Shape{n});
      } else {
        t = tensor(std::vector<float>(dv.begin(), dv.end()), Shape{n});
      }
    }
    desc += (desc.empty() ? "" : ", ") + c.name + ":" + std::string(dtype_name(t.dtype()));
    columns.push_back({c.name, std::move(t), {}});
  }
  auto view = std::make_shared<CsvView>(n, std::move(columns));
  return Pipeline(std::make_shared<CsvSource>(
      view, kiln::detail::cat("from_csv(", n, " rows: ", desc, ")"), skipped, last_error));
}

// ---- files and images -------------------------------------------------------------------------

std::vector<std::string> glob(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  if (rc == GLOB_NOMATCH || (rc == 0 && out.empty()))
    fail("data.glob", "no files match: got pattern '", pattern, "', expected at least one match");
  if (rc != 0)
    fail("data.glob", "cannot search: got error ", rc, " for pattern '", pattern,
         "', expected a readable directory");
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

void check_files(const char* op, const std::vector<std::string>& paths) {
  for (const auto& p : paths) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      fail(op, "missing file: got '", p, "', expected an existing regular file");
  }
}

enum class FileKind { bytes, image };

class FileView : public Indexed {
 public:
  FileView(const std::vector<std::string>* paths, const std::vector<int64_t>* labels, FileKind kind,
           ImageReadOptions opt)
      : paths_(paths), labels_(labels), kind_(kind), opt_(opt) {}
  int64_t size() const override { return static_cast<int64_t>(paths_->size()); }
  Sample get(int64_t i) const override {
    const std::string& path = (*paths_)[static_cast<std::size_t>(i)];
    Sample s;
    const auto bytes = read_file(path);
    if (kind_ == FileKind::image) {
      s.set("image", decode_image(bytes, path, opt_));
    } else {
      s.set("data", bytes_tensor(bytes.data(), bytes.size()));
    }
    s.set("index", tensor(static_cast<int64_t>(i)));
    if (!labels_->empty()) s.set("label", tensor((*labels_)[static_cast<std::size_t>(i)]));
    return s;
  }

 private:
  const std::vector<std::string>* paths_;  // owned by the node
  const std::vector<int64_t>* labels_;
  FileKind kind_;
  ImageReadOptions opt_;
};

class FileSource : public Node {
 public:
  FileSource(std::vector<std::string> paths, std::vector<int64_t> labels, FileKind kind,
             ImageReadOptions opt)
      : paths_(std::move(paths)), labels_(std::move(labels)), kind_(kind), opt_(opt) {}
  std::string name() const override {
    return kiln::detail::cat(
        kind_ == FileKind::image ? "from_images(" : "from_files(", paths_.size(), " files",
        opt_.channels ? kiln::detail::cat(", channels=", *opt_.channels) : "", ")");
  }
  bool indexed() const override { return true; }
  std::optional<int64_t> size() const override { return static_cast<int64_t>(paths_.size()); }
  std::shared_ptr<const Indexed> open_indexed(const OpenCtx&) const override {
    return std::make_shared<FileView>(&paths_, &labels_, kind_, opt_);
  }

 private:
  std::vector<std::string> paths_;
  std::vector<int64_t> labels_;
  FileKind kind_;
  ImageReadOptions opt_;
};

}  // namespace

Pipeline from_files(std::vector<std::string> paths) {
  check_files("data.from_files", paths);
  return Pipeline(std::make_shared<FileSource>(std::move(paths), std::vector<int64_t>{},
                                               FileKind::bytes, ImageReadOptions{}));
}

Pipeline from_images(std::vector<std::string> paths, std::vector<int64_t> labels,
                     ImageReadOptions options) {
  check_files("data.from_images", paths);
  if (!labels.empty() && labels.size() != paths.size())
    fail("data.from_images", "label count differs: got ", labels.size(), " labels for ",
         paths.size(), " files, expected one per file");
  detail::check_image_options("data.from_images", options);
  return Pipeline(
      std::make_shared<FileSource>(std::move(paths), std::move(labels), FileKind::image, options));
}

}  // namespace kiln::data
