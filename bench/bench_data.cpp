// Data pipeline throughput against PyTorch's DataLoader, side by side in one run.
//
// Fashion-MNIST training set: decode IDX (gzip), normalise, random crop 28x28 after zero padding
// by 4, random horizontal flip, shuffle, batch 128; 20,000 images per run. Kiln runs with 1
// thread (everything on the calling thread) and 2 worker threads; bench_data_torch.py runs the
// same pipeline with DataLoader num_workers 0 and 2 under /usr/bin/python3.
//
//   bench_data [--images N] [--runs R] [--no-torch] [--torch-script PATH] [--dir DIR]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/data.h"

namespace data = kiln::data;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  int64_t images = 20000;
  int runs = 5;
  bool torch = true;
  std::string script;
  std::string dir = "/usr/share/datasets/fashion-mnist";
};

struct Result {
  std::string name;
  double best = 0;    // images/s
  double median = 0;  // images/s
  double load_s = 0;
};

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

Result run_kiln(const data::Pipeline& source, int threads, const Options& o) {
  const auto augment = data::image::normalize({0.2860f}, {0.3530f})
                           .then(data::image::random_crop(28, 28, 4))
                           .then(data::image::random_horizontal_flip());
  // threads == 1: no worker threads at all, the loop below does every step itself.
  auto p = source.shuffle(1)
               .take(o.images)
               .map(augment, {.num_threads = threads == 1 ? 0 : threads})
               .batch(128);
  std::vector<double> rates;
  for (int r = 0; r <= o.runs; ++r) {  // run 0 warms up caches and the allocator
    const auto t = Clock::now();
    int64_t n = 0;
    float checksum = 0;
    for (data::Batch& b : p) {
      const kiln::Tensor& x = b.at("image");
      n += x.shape()[0];
      checksum += x.data<float>()[0];
    }
    const double dt = seconds_since(t);
    if (n != o.images)
      std::fprintf(stderr, "bad count %lld (checksum %f)\n", (long long)n, checksum);
    if (r > 0) rates.push_back(static_cast<double>(n) / dt);
  }
  std::sort(rates.begin(), rates.end());
  return {"kiln, " + std::to_string(threads) + (threads == 1 ? " thread" : " threads"),
          rates.back(), rates[rates.size() / 2], 0};
}

std::vector<Result> run_torch(const Options& o) {
  std::vector<Result> out;
  const std::string cmd = "/usr/bin/python3 '" + o.script + "' --images " +
                          std::to_string(o.images) + " --runs " + std::to_string(o.runs) +
                          " --dir '" + o.dir + "'";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return out;
  char line[4096];
  while (std::fgets(line, sizeof line, f)) {
    int workers = -1;
    double best = 0, load = 0;
    const char* w = std::strstr(line, "\"workers\": ");
    const char* b = std::strstr(line, "\"images_per_s\": ");
    const char* l = std::strstr(line, "\"load_s\": ");
    const char* runs = std::strstr(line, "\"runs\": [");
    if (!w || !b || !runs) continue;
    workers = std::atoi(w + 11);
    best = std::atof(b + 16);
    if (l) load = std::atof(l + 10);
    std::vector<double> rs;
    for (const char* p = runs + 9; *p && *p != ']';) {
      char* end = nullptr;
      rs.push_back(std::strtod(p, &end));
      p = end;
      while (*p == ',' || *p == ' ') ++p;
    }
    std::sort(rs.begin(), rs.end());
    out.push_back({"pytorch 1.13 DataLoader, num_workers " + std::to_string(workers), best,
                   rs.empty() ? best : rs[rs.size() / 2], load});
  }
  pclose(f);
  return out;
}

std::string default_script(const char* argv0) {
  std::vector<std::filesystem::path> candidates;
#ifdef KILN_SOURCE_DIR
  candidates.emplace_back(std::filesystem::path(KILN_SOURCE_DIR) / "bench/bench_data_torch.py");
#endif
  candidates.emplace_back("bench/bench_data_torch.py");
  candidates.emplace_back(std::filesystem::path(argv0).parent_path() /
                          "../../bench/bench_data_torch.py");
  for (const auto& c : candidates)
    if (std::filesystem::exists(c)) return c.string();
  return "bench/bench_data_torch.py";
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.script = default_script(argv[0]);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--images" && i + 1 < argc)
      o.images = std::atoll(argv[++i]);
    else if (a == "--runs" && i + 1 < argc)
      o.runs = std::max(1, std::atoi(argv[++i]));
    else if (a == "--no-torch")
      o.torch = false;
    else if (a == "--torch-script" && i + 1 < argc)
      o.script = argv[++i];
    else if (a == "--dir" && i + 1 < argc)
      o.dir = argv[++i];
    else {
      std::fprintf(
          stderr,
          "usage: %s [--images N] [--runs R] [--no-torch] [--torch-script PATH] [--dir DIR]\n",
          argv[0]);
      return 2;
    }
  }
  const std::string images = o.dir + "/train-images-idx3-ubyte.gz";
  const std::string labels = o.dir + "/train-labels-idx1-ubyte.gz";
  if (!std::filesystem::exists(images)) {
    std::printf("bench_data: %s not found (install dataset-fashion-mnist); skipped\n",
                images.c_str());
    return 0;
  }
  const auto t = Clock::now();
  const data::Pipeline source = data::from_idx(images, labels);
  const double load_s = seconds_since(t);

  std::vector<Result> results;
  for (int threads : {1, 2}) {
    results.push_back(run_kiln(source, threads, o));
    results.back().load_s = load_s;
  }
  std::vector<Result> torch;
  if (o.torch) torch = run_torch(o);
  double best_torch = 0;
  for (const auto& r : torch) best_torch = std::max(best_torch, r.best);

  std::printf(
      "Fashion-MNIST: normalise, random crop (pad 4), flip, shuffle, batch 128; %lld images"
      " per run, best and median of %d runs\n\n",
      (long long)o.images, o.runs);
  std::printf("%-40s %14s %14s %10s %12s\n", "pipeline", "best img/s", "median img/s", "IDX load",
              "vs torch");
  for (const auto* group : {&results, &torch}) {
    for (const auto& r : *group) {
      char ratio[32] = "-";
      if (best_torch > 0) std::snprintf(ratio, sizeof ratio, "%.1fx", r.best / best_torch);
      std::printf("%-40s %14.0f %14.0f %9.2fs %12s\n", r.name.c_str(), r.best, r.median, r.load_s,
                  ratio);
    }
  }
  if (o.torch && torch.empty())
    std::printf("\n(pytorch peer did not run: is python3-torch installed? script: %s)\n",
                o.script.c_str());
  if (best_torch > 0)
    std::printf("\nratio = images/s over the better PyTorch figure of this run (%.0f images/s)\n",
                best_torch);
  return 0;
}
