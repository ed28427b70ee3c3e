// kiln.fft: numpy.fft's functions (include/kiln/fft.h), with numpy's argument names.
#include "kiln/fft.h"

#include "bindings.h"

namespace kiln::python {
namespace {

fft::Norm to_norm(const std::optional<std::string>& norm) {
  if (!norm || *norm == "backward") return fft::Norm::backward;
  if (*norm == "ortho") return fft::Norm::ortho;
  if (*norm == "forward") return fft::Norm::forward;
  fail("fft", "unknown norm: got \"", *norm,
       "\", expected None, \"backward\", \"ortho\" or \"forward\"");
}

std::optional<std::vector<int64_t>> to_sizes(py::handle value) {
  if (value.is_none()) return std::nullopt;
  return to_axes(value);  // an int or a sequence of ints, as for axes
}

using OneAxis = Tensor (*)(const Tensor&, std::optional<int64_t>, int64_t, fft::Norm, Loc);
using ManyAxes = Tensor (*)(const Tensor&, fft::Sizes, fft::AxesArg, fft::Norm, Loc);
using TwoAxes = Tensor (*)(const Tensor&, fft::Sizes, std::vector<int64_t>, fft::Norm, Loc);

}  // namespace

void bind_fft(py::module_& m) {
  py::module_ f = m.def_submodule(
      "fft",
      "Discrete Fourier transforms (numpy.fft): complex64 results for float32 input, complex128 "
      "for float64; differentiable and batched.");
  struct One {
    const char* name;
    OneAxis fn;
    const char* doc;
  };
  for (const One& op : {
           One{"fft", &fft::fft, "The DFT along one axis; n crops or zero-pads the input."},
           One{"ifft", &fft::ifft, "The inverse DFT along one axis."},
           One{"rfft", &fft::rfft, "The DFT of real input: the n//2 + 1 non-negative frequencies."},
           One{"irfft", &fft::irfft, "The inverse of rfft: n real points (default 2 * (m - 1))."},
           One{"hfft", &fft::hfft, "The real spectrum of a Hermitian signal given by its half."},
           One{"ihfft", &fft::ihfft, "The inverse of hfft."},
       })
    f.def(
        op.name,
        [fn = op.fn](py::object a, std::optional<int64_t> n, int64_t axis,
                     std::optional<std::string> norm) {
          const Tensor t = to_tensor(a);
          const fft::Norm how = to_norm(norm);
          return without_gil([&] { return fn(t, n, axis, how, Loc{}); });
        },
        py::arg("a"), py::arg("n") = py::none(), py::arg("axis") = -1, py::arg("norm") = py::none(),
        op.doc);
  struct Many {
    const char* name;
    ManyAxes fn;
    const char* doc;
  };
  for (const Many& op : {
           Many{"fftn", &fft::fftn,
                "The DFT over several axes (default: all, or the last len(s))."},
           Many{"ifftn", &fft::ifftn, "The inverse DFT over several axes."},
           Many{"rfftn", &fft::rfftn, "The DFT of real input over several axes (the last halved)."},
           Many{"irfftn", &fft::irfftn, "The inverse of rfftn."},
       })
    f.def(
        op.name,
        [fn = op.fn](py::object a, py::object s, py::object axes, std::optional<std::string> norm) {
          const Tensor t = to_tensor(a);
          const fft::Sizes sizes = to_sizes(s);
          const fft::AxesArg ax = to_axes(axes);
          const fft::Norm how = to_norm(norm);
          return without_gil([&] { return fn(t, sizes, ax, how, Loc{}); });
        },
        py::arg("a"), py::arg("s") = py::none(), py::arg("axes") = py::none(),
        py::arg("norm") = py::none(), op.doc);
  struct Two {
    const char* name;
    TwoAxes fn;
    const char* doc;
  };
  for (const Two& op : {
           Two{"fft2", &fft::fft2, "The DFT over two axes (default the last two)."},
           Two{"ifft2", &fft::ifft2, "The inverse DFT over two axes."},
           Two{"rfft2", &fft::rfft2, "The DFT of real input over two axes."},
           Two{"irfft2", &fft::irfft2, "The inverse of rfft2."},
       })
    f.def(
        op.name,
        [fn = op.fn](py::object a, py::object s, py::object axes, std::optional<std::string> norm) {
          const Tensor t = to_tensor(a);
          const fft::Sizes sizes = to_sizes(s);
          const std::vector<int64_t> ax = to_axes(axes).value_or(std::vector<int64_t>{-2, -1});
          const fft::Norm how = to_norm(norm);
          return without_gil([&] { return fn(t, sizes, ax, how, Loc{}); });
        },
        py::arg("a"), py::arg("s") = py::none(), py::arg("axes") = py::make_tuple(-2, -1),
        py::arg("norm") = py::none(), op.doc);
  f.def(
      "fftfreq",
      [](int64_t n, double d, py::object dtype) {
        return fft::fftfreq(n, d, to_optional_dtype(dtype).value_or(float32), Loc{});
      },
      py::arg("n"), py::arg("d") = 1.0, py::arg("dtype") = py::none(),
      "The sample frequencies [0, 1, ..., -(n//2), ..., -1] / (d * n) (float32 by default).");
  f.def(
      "rfftfreq",
      [](int64_t n, double d, py::object dtype) {
        return fft::rfftfreq(n, d, to_optional_dtype(dtype).value_or(float32), Loc{});
      },
      py::arg("n"), py::arg("d") = 1.0, py::arg("dtype") = py::none(),
      "The n//2 + 1 non-negative sample frequencies of rfft.");
  f.def(
      "fftshift",
      [](py::object x, py::object axes) {
        return fft::fftshift(to_tensor(x), to_axes(axes), Loc{});
      },
      py::arg("x"), py::arg("axes") = py::none(), "The zero frequency moved to the centre.");
  f.def(
      "ifftshift",
      [](py::object x, py::object axes) {
        return fft::ifftshift(to_tensor(x), to_axes(axes), Loc{});
      },
      py::arg("x"), py::arg("axes") = py::none(), "The inverse of fftshift.");
}

}  // namespace kiln::python
