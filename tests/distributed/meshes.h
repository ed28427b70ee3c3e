// The meshes the distributed tests run on: every process count's 1-D mesh ("x") and each of
// its factorisations as a 2-D mesh (data x model).
#pragma once

#include <kiln/distributed.h>

#include <vector>

namespace kiln::testing {

inline std::vector<distributed::Mesh> meshes() {
  const int n = distributed::process_count();
  std::vector<distributed::Mesh> out{distributed::Mesh({{"x", n}})};
  for (int d = 1; d <= n; ++d)
    if (n % d == 0)
      out.emplace_back(std::vector<distributed::MeshAxis>{{"data", d}, {"model", n / d}});
  return out;
}

}  // namespace kiln::testing
