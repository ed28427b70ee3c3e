// A native data pipeline over a small generated image dataset: shuffle, augment on two worker
// threads, batch, prefetch; two epochs, then a mid-epoch checkpoint and resume.
#include <cstdio>
#include <vector>

#include "kiln/data.h"

namespace data = kiln::data;

int main() {
  // 512 gray 16x16 images whose pixels depend on their class (0..9), and their labels.
  const int64_t n = 512;
  kiln::Tensor images = kiln::empty(kiln::Shape{n, 16, 16}, kiln::uint8);
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) {
    labels[static_cast<std::size_t>(i)] = i % 10;
    for (int64_t k = 0; k < 256; ++k)
      images.data<uint8_t>()[i * 256 + k] = static_cast<uint8_t>((i % 10) * 25 + k % 7);
  }

  auto augment = data::image::normalize({0.5f}, {0.25f})
                     .then(data::image::random_crop(16, 16, 2))
                     .then(data::image::random_horizontal_flip());
  auto pipeline =
      data::from_tensors({{"image", images}, {"label", kiln::tensor(labels, kiln::Shape{n})}})
          .shuffle(/*seed=*/42)
          .map(augment, {.num_threads = 2})
          .batch(64, /*drop_remainder=*/true)
          .prefetch(2);
  std::printf("%s\n%lld batches per epoch\n", pipeline.describe().c_str(),
              static_cast<long long>(*pipeline.size()));

  for (int epoch = 0; epoch < 2; ++epoch) {
    double label_sum = 0;
    for (data::Batch& b : pipeline) {
      for (int64_t l : b.at("label").to_vector<int64_t>()) label_sum += static_cast<double>(l);
    }
    std::printf("epoch %d: mean label %.3f | %s\n", epoch, label_sum / n,
                pipeline.stats().to_string().c_str());
  }

  // Checkpoint after three batches of epoch 2, then resume in a fresh pipeline.
  int seen = 0;
  float third_next = 0;
  for (data::Batch& b : pipeline) {
    (void)b;
    if (++seen == 3) break;
  }
  const std::string checkpoint = pipeline.state().to_string();
  third_next = pipeline.next()->at("image").data<float>()[0];

  auto resumed =
      data::from_tensors({{"image", images}, {"label", kiln::tensor(labels, kiln::Shape{n})}})
          .shuffle(42)
          .map(augment, {.num_threads = 2})
          .batch(64, true)
          .prefetch(2);
  resumed.restore(data::PipelineState::parse(checkpoint));
  const float resumed_next = resumed.next()->at("image").data<float>()[0];
  std::printf("checkpoint '%s': next batch %s after resume\n", checkpoint.c_str(),
              resumed_next == third_next ? "identical" : "DIFFERENT");
  return resumed_next == third_next ? 0 : 1;
}
