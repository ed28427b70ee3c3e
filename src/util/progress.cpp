#include "kiln/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace kiln {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<long long>(std::llround(seconds));
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit, std::FILE* out)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(std::max<int64_t>(total, 0)),
      out_(out),
      tty_(isatty(fileno(out)) != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

double ProgressBar::elapsed_seconds() const {
  return std::chrono::duration<double>(finished_.value_or(std::chrono::steady_clock::now()) -
                                       start_)
      .count();
}

double ProgressBar::rate() const {
  const double t = elapsed_seconds();
  return t > 0 ? static_cast<double>(done_) / t : 0.0;
}

void ProgressBar::update(int64_t done, std::string_view metrics) {
  done_ = std::clamp<int64_t>(done, 0, total_);
  metrics_ = metrics;
  const auto now = std::chrono::steady_clock::now();
  if (tty_) {
    if (now - last_draw_ < std::chrono::milliseconds(100)) return;
  } else {
    const int tenth = total_ > 0 ? static_cast<int>(done_ * 10 / total_) : 10;
    if (tenth == last_tenth_ || tenth == 0 || tenth == 10) return;  // finish() prints the end
    last_tenth_ = tenth;
  }
  last_draw_ = now;
  draw(false);
}

void ProgressBar::finish(std::string_view metrics) {
  done_ = total_;
  metrics_ = metrics;
  finished_ = std::chrono::steady_clock::now();
  draw(true);
}

void ProgressBar::draw(bool final) {
  constexpr int kWidth = 24;
  const double frac = total_ > 0 ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.resize(kWidth, '.');
  const double r = rate();
  const std::string time =
      final ? "in " + format_duration(elapsed_seconds())
            : "ETA " + format_duration(r > 0 ? static_cast<double>(total_ - done_) / r : NAN);
  std::fprintf(out_, "%s%s [%s] %3d%% %.0f %s/s %s  %s%s", tty_ ? "\r" : "", label_.c_str(),
               bar.c_str(), static_cast<int>(frac * 100), r, unit_.c_str(), time.c_str(),
               metrics_.c_str(), tty_ ? "\033[K" : "");
  if (final || !tty_) std::fputc('\n', out_);
  std::fflush(out_);
}

}  // namespace kiln
