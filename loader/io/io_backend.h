// Internal to the read engine: the interface each backend (io_uring, pread pool, mmap)
// implements to execute a planned batch, and the factories the engine picks from.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <memory>
#include <mutex>
#include <span>

#include "loader/io/io_engine.h"
#include "loader/io/io_plan.h"

namespace moestream::io {

// One planned batch as the backend sees it. Backends run every extent to a final result
// (never throwing), call finish_extent() on it, and add their counters under `mu`.
struct BatchContext {
  IoPlan& plan;
  std::span<ReadRequest> reqs;
  std::span<const FileEntry> files;
  const IoEngineOptions& opts;
  uint8_t* sink = nullptr;  // gap sink of scatter extents (contents never read)
  uint64_t sink_bytes = 0;
  std::mutex mu;
  CompletionCounters counters;

  // A one-line notice from a worker thread (serialised; the engine's sink may not be).
  void notice(const std::string& line) {
    std::lock_guard<std::mutex> lock(mu);
    if (opts.notice)
      opts.notice(line);
    else
      std::fprintf(stderr, "moestream: %s\n", line.c_str());
  }

  void add_counters(const CompletionCounters& c) {
    std::lock_guard<std::mutex> lock(mu);
    counters.short_reads += c.short_reads;
    counters.retries += c.retries;
  }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual IoBackend kind() const = 0;
  virtual void on_file_added(uint32_t index, const FileEntry& f) {}
  // The bounce arena moved or grew (io_uring registers it as a fixed buffer).
  virtual void on_arena(uint8_t* data, size_t bytes) {}
  virtual void run(BatchContext& ctx) = 0;
};

// Reads extent `e` with pread(2) until it reaches a final result (shared by the pread backend
// and the io_uring backend's rescue path).
void pread_extent(Extent& e, BatchContext& ctx, CompletionCounters& counters);

// Returns null and sets *err (positive errno) when io_uring cannot be set up.
std::unique_ptr<Backend> make_uring_backend(const IoEngineOptions& opts, int* err);
std::unique_ptr<Backend> make_pread_backend(const IoEngineOptions& opts);
std::unique_ptr<Backend> make_mmap_backend(const IoEngineOptions& opts);

}  // namespace moestream::io
