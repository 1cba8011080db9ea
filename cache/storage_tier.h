// Where chunk KV can live, as the loading controller and placement see it:
// a name, a read speed and a cost rank.
#pragma once

#include <string>

namespace cb::cache {

// Lower cost_rank = cheaper per byte (an SD card ranks below internal
// flash, which ranks below RAM).
struct StorageTier {
  std::string name;
  double read_bytes_per_s = 0.0;  // 0: reads cost nothing (data already in RAM)
  int cost_rank = 0;
  bool operator==(const StorageTier&) const = default;
};

}  // namespace cb::cache
