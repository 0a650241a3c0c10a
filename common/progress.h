// Progress of a long job (convert_model, synth_model): on a terminal one line redrawn in place;
// into a pipe or a file (CI logs) a plain line now and then and one at the end, never a '\r'.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace moestream {

class Progress {
 public:
  struct Options {
    double redraw_s = 0.1;  // terminal: redraw at most this often
    double line_s = 10.0;   // pipe or file: at most one line this often, besides the first and last
    // Pipe or file: no first line, and the last only after an earlier one, so a job shorter than
    // line_s prints nothing there (infer --perplexity: short runs keep their output unchanged).
    bool brief = false;
  };

  // Lines start with `label`; a disabled Progress prints nothing. `out` stays the caller's.
  Progress(std::string label, bool enabled, std::FILE* out = stderr);
  Progress(std::string label, bool enabled, std::FILE* out, Options options);
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  ~Progress();  // ends a terminal line left open

  // `done` of `total` units; `detail` follows the percentage. The first update and the last
  // (done >= total) are always shown (but see Options::brief); updates after the last are ignored.
  void update(uint64_t done, uint64_t total, const std::string& detail = {});
  bool terminal() const { return terminal_; }

 private:
  std::string label_;
  bool enabled_;
  std::FILE* out_;
  Options options_;
  bool terminal_ = false;
  bool started_ = false;    // an update came
  bool shown_ = false;      // something printed yet
  bool line_open_ = false;  // a terminal line without its newline
  bool finished_ = false;   // the last update was shown
  size_t last_width_ = 0;   // of the terminal line, to blank a longer previous one
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace moestream
