// kiln.data.BpeTokenizer (include/kiln/tokenizer.h): training and encoding run without the GIL;
// text is bytes or str (as UTF-8), ids come back as a NumPy int32 array.
#include "kiln/tokenizer.h"

#include <pybind11/numpy.h>

#include <string>
#include <vector>

#include "bindings.h"

namespace kiln::python {
namespace {

// The bytes of a bytes, bytearray or str (UTF-8) argument.
std::string text_of(py::handle value, const char* who) {
  if (py::isinstance<py::str>(value)) return value.cast<std::string>();
  if (py::isinstance<py::bytes>(value)) return value.cast<std::string>();
  if (py::isinstance<py::bytearray>(value))
    return std::string(PyByteArray_AsString(value.ptr()),
                       static_cast<std::size_t>(PyByteArray_Size(value.ptr())));
  fail(who, "text must be bytes, bytearray or str: got ",
       py::str(value.get_type().attr("__name__")).cast<std::string>());
}

}  // namespace

void bind_tokenizer(py::module_& data) {
  using data::BpeTokenizer;
  py::class_<BpeTokenizer> t(
      data, "BpeTokenizer",
      "Byte-level BPE (GPT-2's scheme): tokens 0-255 are the bytes, token 256 + r the r-th "
      "merge. BpeTokenizer.train(text, vocab_size) learns the merges; encode and decode are "
      "exact inverses on any bytes; to_string()/parse() save and load it (docs/DATA.md).");
  t.def(py::init<>(), "The byte tokens alone.");
  t.def(py::init([](const std::vector<std::pair<int32_t, int32_t>>& merges) {
          std::vector<data::Merge> m;
          for (const auto& [l, r] : merges) m.push_back({l, r});
          return BpeTokenizer(std::move(m));
        }),
        py::arg("merges"), "From merges, a list of (left, right) token ids.");
  t.def_static(
      "train",
      [](py::handle text, int64_t vocab_size, int threads) {
        const std::string bytes = text_of(text, "data.BpeTokenizer");
        py::gil_scoped_release release;
        return BpeTokenizer::train(bytes, {.vocab_size = vocab_size, .threads = threads});
      },
      py::arg("text"), py::arg("vocab_size") = 512, py::arg("threads") = 0,
      "Merges learned from text (bytes or str) until vocab_size tokens or no pair occurs twice: "
      "the most frequent pair within GPT-2's chunks, ties to the smallest ids. threads=0: "
      "kiln.num_threads(); the result does not depend on it.");
  t.def_property_readonly("vocab_size", &BpeTokenizer::vocab_size);
  t.def_property_readonly(
      "merges",
      [](const BpeTokenizer& self) {
        std::vector<std::pair<int32_t, int32_t>> out;
        for (const data::Merge& m : self.merges()) out.emplace_back(m.left, m.right);
        return out;
      },
      "The merges in rank order, as (left, right) token ids.");
  t.def(
      "token_bytes",
      [](const BpeTokenizer& self, int32_t id) { return py::bytes(self.token_bytes(id)); },
      py::arg("id"), "The bytes of a token.");
  t.def(
      "encode",
      [](const BpeTokenizer& self, py::handle text, int threads) {
        const std::string bytes = text_of(text, "data.BpeTokenizer");
        std::vector<int32_t> ids;
        {
          py::gil_scoped_release release;
          ids = self.encode(bytes, threads);
        }
        py::array_t<int32_t> out(static_cast<py::ssize_t>(ids.size()));
        std::copy(ids.begin(), ids.end(), out.mutable_data());
        return out;
      },
      py::arg("text"), py::arg("threads") = 0,
      "The token ids of text (bytes or str as UTF-8), an int32 array.");
  t.def(
      "decode",
      [](const BpeTokenizer& self, py::handle ids) {
        // Integers only: forcecast would turn 97.9 into 97.
        const py::array given = py::array::ensure(ids);
        const char kind = given ? given.dtype().kind() : '?';
        if (!given || (given.size() > 0 && kind != 'i' && kind != 'u'))
          fail("data.BpeTokenizer", "decode: ids must be integers: got ",
               given ? std::string(py::str(given.dtype())) : std::string("a non-array"));
        const auto flat = py::array_t<int64_t, py::array::forcecast | py::array::c_style>(given);
        return py::bytes(self.decode(
            std::span<const int64_t>(flat.data(), static_cast<std::size_t>(flat.size()))));
      },
      py::arg("ids"), "The bytes of a sequence of token ids.");
  t.def("to_string", &BpeTokenizer::to_string, "The saved form: a header, one merge per line.");
  t.def_static("parse", &BpeTokenizer::parse, py::arg("text"), "Reads to_string()'s text back.");
  t.def("__len__", &BpeTokenizer::vocab_size);
  t.def("__eq__", &BpeTokenizer::operator==, py::arg("other"));
  t.def("__repr__", [](const BpeTokenizer& self) {
    return "BpeTokenizer(vocab_size=" + std::to_string(self.vocab_size()) + ")";
  });
}

}  // namespace kiln::python
