// What both converters (Hugging Face checkpoints, GGUF files) share about their output: a progress
// bar on stderr, a temp directory removed unless the conversion completed, and the crash-safe
// publication of the finished directory.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>

namespace moestream {

// A one-line progress bar on stderr, redrawn at most every 100 ms.
class ProgressBar {
 public:
  ProgressBar(bool enabled, uint64_t total) : enabled_(enabled), total_(total ? total : 1) {}
  void update(uint64_t done, const std::string& label) {
    if (!enabled_) return;
    auto now = std::chrono::steady_clock::now();
    if (done < total_ && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    constexpr int kWidth = 30;
    int fill = static_cast<int>(kWidth * done / total_);
    std::fprintf(stderr, "\rconvert [%s%s] %3d%% %-28s", std::string(fill, '#').c_str(),
                 std::string(kWidth - fill, '.').c_str(), static_cast<int>(100 * done / total_),
                 label.c_str());
    std::fflush(stderr);
  }
  void finish() {
    if (enabled_) std::fprintf(stderr, "\n");
  }

 private:
  bool enabled_;
  uint64_t total_;
  std::chrono::steady_clock::time_point last_{};
};

// Removes the temp output directory unless the conversion completed.
struct TempOutput {
  std::filesystem::path path;
  bool keep = false;
  TempOutput(std::filesystem::path p) : path(std::move(p)) {}
  TempOutput(const TempOutput&) = delete;
  TempOutput& operator=(const TempOutput&) = delete;
  ~TempOutput() {
    std::error_code ec;
    if (!keep) std::filesystem::remove_all(path, ec);
  }
};

// `out_dir.tmp.<pid>`, emptied and created with its experts/ subdirectory.
std::filesystem::path make_temp_output(const std::filesystem::path& out_dir, const std::string& experts_dir);

// fsyncs tmp (and tmp/experts_dir), then renames it to out_dir (an existing out_dir moved aside
// first and removed after): the new directory appears whole or not at all. Sets tmp.keep.
void publish_output(TempOutput& tmp, const std::filesystem::path& out_dir, const std::string& experts_dir);

}  // namespace moestream
