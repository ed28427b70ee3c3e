// A progress bar for long-running work (training epochs, big pipelines): done/total, rate,
// ETA and a free-form metrics text. Redraws in place on a terminal; elsewhere (logs, CI) it
// prints one line per tenth of the work so that the output stays readable.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace kiln {

class ProgressBar {
 public:
  // `unit` names what is counted ("img"); the rate is shown as "<n> img/s".
  ProgressBar(std::string label, int64_t total, std::string unit = "it", std::FILE* out = stderr);
  // Sets the amount done so far; redraws at most ten times a second.
  void update(int64_t done, std::string_view metrics = {});
  // Draws the final state with the total time and ends the line.
  void finish(std::string_view metrics = {});
  // Seconds since construction, up to finish().
  double elapsed_seconds() const;
  double rate() const;  // units per second over elapsed_seconds()

 private:
  void draw(bool final);
  std::string label_, unit_, metrics_;
  int64_t total_, done_ = 0;
  std::FILE* out_;
  bool tty_;
  int last_tenth_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
  std::optional<std::chrono::steady_clock::time_point> finished_;
};

// "1:05", "12:03:09": a duration for progress and summaries.
std::string format_duration(double seconds);

}  // namespace kiln
