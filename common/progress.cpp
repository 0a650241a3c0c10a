// Progress lines: a redrawn bar on a terminal, sparse plain lines elsewhere (see progress.h).
#include "common/progress.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

namespace moestream {

Progress::Progress(std::string label, bool enabled, std::FILE* out)
    : Progress(std::move(label), enabled, out, Options{}) {}

Progress::Progress(std::string label, bool enabled, std::FILE* out, Options options)
    : label_(std::move(label)), enabled_(enabled && out != nullptr), out_(out), options_(options) {
  if (enabled_) terminal_ = ::isatty(::fileno(out_)) == 1;
}

Progress::~Progress() {
  if (line_open_) {
    std::fputc('\n', out_);
    std::fflush(out_);
  }
}

void Progress::update(uint64_t done, uint64_t total, const std::string& detail) {
  if (!enabled_ || finished_) return;
  const bool last = done >= total;
  const auto now = std::chrono::steady_clock::now();
  const double since = std::chrono::duration<double>(now - last_).count();
  const bool brief = options_.brief && !terminal_;
  if (!started_) {
    started_ = true;
    if (brief) {  // the interval counts from the start; nothing shown yet
      last_ = now;
      return;
    }
  } else {
    const double every = terminal_ ? options_.redraw_s : options_.line_s;
    if (last ? brief && !shown_ : since < every) return;
  }
  last_ = now;
  const uint64_t whole = std::max<uint64_t>(total, 1);
  const uint64_t part = last ? whole : done;
  const int percent = static_cast<int>(100 * part / whole);
  if (terminal_) {
    constexpr int kWidth = 30;
    const int fill = static_cast<int>(kWidth * part / whole);
    std::string line = label_ + " [" + std::string(size_t(fill), '#') +
                       std::string(size_t(kWidth - fill), '.') + "] " + std::to_string(percent) + "%" +
                       (detail.empty() ? "" : " " + detail);
    const size_t width = line.size();
    if (width < last_width_) line.append(last_width_ - width, ' ');  // blank the longer previous line
    last_width_ = width;
    std::fprintf(out_, "\r%s", line.c_str());
    line_open_ = !last;
    if (last) std::fputc('\n', out_);
  } else {
    std::fprintf(out_, "%s: %d%%%s%s\n", label_.c_str(), percent, detail.empty() ? "" : " ",
                 detail.c_str());
  }
  std::fflush(out_);
  shown_ = true;
  finished_ = last;  // a job's last line is shown once
}

}  // namespace moestream
