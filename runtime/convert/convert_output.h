// What both converters (Hugging Face checkpoints, GGUF files) share about their output: a progress
// bar on stderr, a temp directory removed unless the conversion completed, and the crash-safe
// publication of the finished directory with its model.json.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>

#include <nlohmann/json_fwd.hpp>

#include "common/progress.h"
#include "loader/format/model_config.h"

namespace moestream {

// The conversion's progress on stderr: a bar on a terminal, sparse lines in a log (common/progress.h).
class ProgressBar {
 public:
  ProgressBar(bool enabled, uint64_t total) : progress_("convert", enabled), total_(total) {}
  void update(uint64_t done, const std::string& label) { progress_.update(done, total_, label); }
  void finish() { progress_.update(total_, total_, "done"); }  // no-op when the last item showed

 private:
  Progress progress_;
  uint64_t total_;
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

// Sets c.dense_xxh3 from the dense file in tmp, writes tmp/model.json (c, and under "source" what
// it was converted from, by convert_model), then publishes tmp as out_dir (publish_output).
void publish_model(TempOutput& tmp, const std::filesystem::path& out_dir, ModelConfig& c,
                   const nlohmann::json& source);

}  // namespace moestream
