// bench_io's device profile: the three O_DIRECT measurements a loader/io/io_profile.h profile is
// made of (QD 1 small reads: latency; QD 1 1 MiB reads: single-read bandwidth; small reads at
// depth: IOPS; large reads at depth: bandwidth).
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>

#include "loader/io/io_profile.h"

namespace moestream::bench {

struct ProfileArgs {
  std::string out;            // --profile-out: write the profile here (atomically)
  bool only = false;          // --profile-only: measure the profile and nothing else
  double seconds = 1.0;       // per measurement (a throttled volume needs >= 1 s to show its rate)
  unsigned queue_depth = 64;  // reads in flight for the IOPS and bandwidth cells
  uint64_t small_bytes = 4096;
  uint64_t large_kb = 4096;   // read size of the bandwidth measurement
  uint64_t single_kb = 1024;  // read size of the single-read bandwidth measurement
};

void add_profile_options(CLI::App& app, ProfileArgs& a);

struct ProfileRun {
  IoProfile profile;
  nlohmann::json source;  // how it was measured (file, engine, sizes, counts), saved under "source"
};

// Measures on `path` (at least `file_bytes` long; large and single reads are cut to a quarter of
// it when it is small) with O_DIRECT reads at random aligned offsets,
// through io_uring when it is available, else a pread pool of queue_depth threads. Prints one
// line per measurement. Throws IoError when the file system refuses O_DIRECT (a profile of the
// page cache would say nothing of the device).
ProfileRun measure_io_profile(const std::filesystem::path& path, uint64_t file_bytes, const ProfileArgs& a);

}  // namespace moestream::bench
