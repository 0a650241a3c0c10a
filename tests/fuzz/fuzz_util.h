// Shared by the libFuzzer targets: parsers that take a path get the input through a temp file.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

namespace moestream::fuzz {

// One file per process (libFuzzer runs inputs one at a time), in /dev/shm when present so the
// target does not wear the disk; removed at exit.
inline std::filesystem::path write_input(const uint8_t* data, size_t size, const char* name) {
  static const std::filesystem::path dir = [] {
    std::filesystem::path base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
    auto d = base / ("moestream_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    static struct Cleanup {
      std::filesystem::path p;
      ~Cleanup() { std::error_code ec; std::filesystem::remove_all(p, ec); }
    } cleanup{d};
    return d;
  }();
  auto path = dir / name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

}  // namespace moestream::fuzz
