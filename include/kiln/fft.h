// Discrete Fourier transforms, as numpy.fft: complex (fft, ifft, fftn, ...), real input
// (rfft, irfft, rfftn, ...), Hermitian (hfft, ihfft), the sample frequencies and shifts.
// Computed by FFTW; differentiable in forward and reverse mode, batched under vmap, any size.
#pragma once

#include <optional>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::fft {

// Which direction is scaled, as numpy's `norm`: by 1/n on the inverse (backward, the
// default), by 1/sqrt(n) both ways (ortho), or by 1/n on the forward transform (forward).
enum class Norm { backward, ortho, forward };

// One axis. `n` crops or zero-pads the input along `axis` to n points first (default: its size).
Tensor fft(const Tensor& x, std::optional<int64_t> n = std::nullopt, int64_t axis = -1,
           Norm norm = Norm::backward, Loc loc = Loc::current());
Tensor ifft(const Tensor& x, std::optional<int64_t> n = std::nullopt, int64_t axis = -1,
            Norm norm = Norm::backward, Loc loc = Loc::current());
// Real input: the n/2 + 1 non-negative frequencies.
Tensor rfft(const Tensor& x, std::optional<int64_t> n = std::nullopt, int64_t axis = -1,
            Norm norm = Norm::backward, Loc loc = Loc::current());
// The inverse of rfft: n real points (default 2 * (size - 1)) from n/2 + 1 frequencies; the
// imaginary parts of the zero (and, for even n, the n/2) frequency are ignored, as numpy does.
Tensor irfft(const Tensor& x, std::optional<int64_t> n = std::nullopt, int64_t axis = -1,
             Norm norm = Norm::backward, Loc loc = Loc::current());
// A Hermitian-symmetric signal given by its first half: real spectrum (numpy.fft.hfft), and back.
Tensor hfft(const Tensor& x, std::optional<int64_t> n = std::nullopt, int64_t axis = -1,
            Norm norm = Norm::backward, Loc loc = Loc::current());
Tensor ihfft(const Tensor& x, std::optional<int64_t> n = std::nullopt, int64_t axis = -1,
             Norm norm = Norm::backward, Loc loc = Loc::current());

// Several axes. `s` gives the points per axis (crop or zero-pad); `axes` defaults to the last
// len(s) axes, or all axes without s. The 2-d forms default to the last two axes.
using Sizes = std::optional<std::vector<int64_t>>;
using AxesArg = std::optional<std::vector<int64_t>>;
Tensor fftn(const Tensor& x, Sizes s = std::nullopt, AxesArg axes = std::nullopt,
            Norm norm = Norm::backward, Loc loc = Loc::current());
Tensor ifftn(const Tensor& x, Sizes s = std::nullopt, AxesArg axes = std::nullopt,
             Norm norm = Norm::backward, Loc loc = Loc::current());
Tensor rfftn(const Tensor& x, Sizes s = std::nullopt, AxesArg axes = std::nullopt,
             Norm norm = Norm::backward, Loc loc = Loc::current());
Tensor irfftn(const Tensor& x, Sizes s = std::nullopt, AxesArg axes = std::nullopt,
              Norm norm = Norm::backward, Loc loc = Loc::current());
Tensor fft2(const Tensor& x, Sizes s = std::nullopt, std::vector<int64_t> axes = {-2, -1},
            Norm norm = Norm::backward, Loc loc = Loc::current());
Tensor ifft2(const Tensor& x, Sizes s = std::nullopt, std::vector<int64_t> axes = {-2, -1},
             Norm norm = Norm::backward, Loc loc = Loc::current());
Tensor rfft2(const Tensor& x, Sizes s = std::nullopt, std::vector<int64_t> axes = {-2, -1},
             Norm norm = Norm::backward, Loc loc = Loc::current());
Tensor irfft2(const Tensor& x, Sizes s = std::nullopt, std::vector<int64_t> axes = {-2, -1},
              Norm norm = Norm::backward, Loc loc = Loc::current());

// The sample frequencies of an n-point transform with sample spacing d: fftfreq gives
// [0, 1, ..., -(n/2), ..., -1] / (d n), rfftfreq the n/2 + 1 non-negative ones.
Tensor fftfreq(int64_t n, double d = 1.0, DType dtype = float32, Loc loc = Loc::current());
Tensor rfftfreq(int64_t n, double d = 1.0, DType dtype = float32, Loc loc = Loc::current());
// The zero frequency moved to the centre (by a roll of size/2 along each axis), and back.
Tensor fftshift(const Tensor& x, AxesArg axes = std::nullopt, Loc loc = Loc::current());
Tensor ifftshift(const Tensor& x, AxesArg axes = std::nullopt, Loc loc = Loc::current());

}  // namespace kiln::fft
