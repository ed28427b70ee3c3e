// Per-epoch metrics of a training run, written as CSV and as an SVG chart of the training
// curves (loss on the left, accuracy on the right) that a browser opens (demo.cpp); chart()
// draws any series against a shared x axis (gpt.cpp's losses against the step).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace report {

struct Epoch {
  int epoch = 0;
  double train_loss = 0, train_accuracy = 0, test_loss = 0, test_accuracy = 0;
  double seconds = 0, images_per_second = 0;
};

inline const char* kCsvHeader =
    "epoch,train_loss,train_accuracy,test_loss,test_accuracy,seconds,images_per_second";

inline std::string to_csv(const std::vector<Epoch>& rows) {
  std::ostringstream os;
  os << kCsvHeader << "\n";
  char line[256];
  for (const Epoch& e : rows) {
    std::snprintf(line, sizeof line, "%d,%.6f,%.6f,%.6f,%.6f,%.3f,%.1f\n", e.epoch, e.train_loss,
                  e.train_accuracy, e.test_loss, e.test_accuracy, e.seconds, e.images_per_second);
    os << line;
  }
  return os.str();
}

// Reads back what to_csv wrote (to continue the metrics of a resumed run).
inline std::vector<Epoch> from_csv(const std::string& path) {
  std::ifstream in(path);
  std::vector<Epoch> rows;
  std::string line;
  if (!std::getline(in, line)) return rows;
  if (line != kCsvHeader) throw std::runtime_error("unexpected header in " + path);
  while (std::getline(in, line)) {
    Epoch e;
    if (std::sscanf(line.c_str(), "%d,%lf,%lf,%lf,%lf,%lf,%lf", &e.epoch, &e.train_loss,
                    &e.train_accuracy, &e.test_loss, &e.test_accuracy, &e.seconds,
                    &e.images_per_second) == 7)
      rows.push_back(e);
  }
  return rows;
}

namespace detail {

struct Series {
  const char* name;
  const char* color;
  std::vector<double> values;
};

// The x values to label: every one when there are few, else five spread over the range.
inline std::vector<double> ticks(const std::vector<double>& xs) {
  if (xs.size() <= 10) return xs;
  std::vector<double> t;
  for (int i = 0; i <= 4; ++i)
    t.push_back(std::round(xs.front() + (xs.back() - xs.front()) * i / 4));
  return t;
}

// One panel over the x values `xs`: axes, ticks, a polyline with dots per series and a legend.
inline void panel(std::ostringstream& os, double x0, const std::string& title,
                  const std::vector<Series>& series, const std::vector<double>& xs,
                  const std::string& x_label) {
  constexpr double w = 380, h = 260, left = 50, top = 40, pw = w - left - 20, ph = h - top - 40;
  double lo = INFINITY, hi = -INFINITY;
  for (const Series& s : series)
    for (double v : s.values) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!(hi > lo)) lo -= 0.5, hi += 0.5;
  const double pad = (hi - lo) * 0.08;
  lo -= pad, hi += pad;
  const double x_lo = xs.empty() ? 0 : xs.front(), x_hi = xs.empty() ? 1 : xs.back();
  auto X = [&](double x) {
    return x0 + left + (x_hi > x_lo ? pw * (x - x_lo) / (x_hi - x_lo) : pw / 2);
  };
  auto Y = [&](double v) { return top + ph * (1 - (v - lo) / (hi - lo)); };
  os << "<text x='" << x0 + left + pw / 2 << "' y='22' text-anchor='middle' font-size='15'>"
     << title << "</text>\n";
  os << "<rect x='" << x0 + left << "' y='" << top << "' width='" << pw << "' height='" << ph
     << "' fill='none' stroke='#444'/>\n";
  for (int i = 0; i <= 4; ++i) {
    const double v = lo + (hi - lo) * i / 4, y = Y(v);
    os << "<line x1='" << x0 + left << "' x2='" << x0 + left + pw << "' y1='" << y << "' y2='" << y
       << "' stroke='#ddd'/><text x='" << x0 + left - 6 << "' y='" << y + 4
       << "' text-anchor='end' font-size='11'>"
       << (std::abs(hi) < 10 ? std::round(v * 1000) / 1000 : std::round(v)) << "</text>\n";
  }
  for (double x : ticks(xs))
    os << "<text x='" << X(x) << "' y='" << top + ph + 16
       << "' text-anchor='middle' font-size='11'>" << x << "</text>\n";
  os << "<text x='" << x0 + left + pw / 2 << "' y='" << top + ph + 34
     << "' text-anchor='middle' font-size='12'>" << x_label << "</text>\n";
  double ly = top + 14;
  for (const Series& s : series) {
    os << "<polyline fill='none' stroke-width='2' stroke='" << s.color << "' points='";
    for (std::size_t i = 0; i < s.values.size(); ++i)
      os << X(xs[i]) << "," << Y(s.values[i]) << " ";
    os << "'/>\n";
    for (std::size_t i = 0; i < s.values.size(); ++i)
      os << "<circle r='3' fill='" << s.color << "' cx='" << X(xs[i]) << "' cy='" << Y(s.values[i])
         << "'/>\n";
    os << "<text x='" << x0 + left + pw - 8 << "' y='" << ly
       << "' text-anchor='end' font-size='12' fill='" << s.color << "'>" << s.name << "</text>\n";
    ly += 16;
  }
}

}  // namespace detail

// A chart of panels side by side over the same x values.
struct Panel {
  std::string title;
  std::vector<detail::Series> series;
};
inline std::string chart(const std::string& title, const std::vector<double>& xs,
                         const std::string& x_label, const std::vector<Panel>& panels) {
  std::ostringstream os;
  os << "<svg xmlns='http://www.w3.org/2000/svg' width='" << 390 * panels.size()
     << "' height='300' font-family='sans-serif'>\n<rect width='100%' height='100%' "
        "fill='white'/>\n"
     << "<title>" << title << "</title>\n";
  for (std::size_t i = 0; i < panels.size(); ++i)
    detail::panel(os, 390.0 * static_cast<double>(i), panels[i].title, panels[i].series, xs,
                  x_label);
  os << "</svg>\n";
  return os.str();
}

inline std::string to_svg(const std::vector<Epoch>& rows, const std::string& title) {
  std::vector<double> xs, tl, vl, ta, va;
  for (const Epoch& e : rows) {
    xs.push_back(e.epoch);
    tl.push_back(e.train_loss), vl.push_back(e.test_loss);
    ta.push_back(100 * e.train_accuracy), va.push_back(100 * e.test_accuracy);
  }
  return chart(title, xs, "epoch",
               {{"loss", {{"train", "#1f77b4", tl}, {"test", "#d62728", vl}}},
                {"accuracy (%)", {{"train", "#1f77b4", ta}, {"test", "#d62728", va}}}});
}

}  // namespace report
