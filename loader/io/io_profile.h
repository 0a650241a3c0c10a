// A storage device's read profile (per-op latency, IOPS limit, bandwidth), as bench_io measures
// it: the one file format the clusterer's cost model and the read engine's merge rule both read.
//
// Format (JSON object, UTF-8; docs/io_engine.md "Device profiles"):
//   "format":         "moestream-io-profile" (required, exactly)
//   "version":        1 (required)
//   "op_latency_us":  p50 microseconds of one small (4 KiB) random O_DIRECT read at queue depth 1
//   "iops_limit":     small random O_DIRECT reads per second at depth (the device's op ceiling)
//   "queue_depth":    reads in flight when iops_limit was measured (informational, >= 1)
//   "bandwidth_gbps": GB/s (1e9 bytes per second) of large O_DIRECT reads at depth
//   "single_read_gbps": GB/s of one 1 MiB O_DIRECT read at a time (its size / its p50 time):
//                     what one read alone moves, below bandwidth_gbps where the device needs
//                     several reads in flight to reach it
//   "source":         optional object saying where and how it was measured (not interpreted)
// The five numbers are required, finite and > 0. bench_io writes this object alone
// (`--profile-out`) and also under "profile" in its results JSON; load_io_profile takes either.
#pragma once

#include <filesystem>
#include <string>

namespace moestream {

struct IoProfile {
  double op_latency_us = 80.0;
  double iops_limit = 0.0;     // 0: unknown (only the clusterer's flag defaults have no limit)
  double queue_depth = 0.0;
  double bandwidth_gbps = 3.0;  // GB/s = 1e9 bytes per second
  double single_read_gbps = 0.0;  // 0: unknown (the clusterer's flag defaults)
};

// The price of one read issued after another, which the clusterer's layout objective charges
// per op: the QD-1 latency, or the IOPS limit's spacing when that is longer (a throttled
// volume's p50 latency can be short while its reads are spaced 1 / iops_limit apart).
inline double serial_op_us(const IoProfile& p) {
  return p.iops_limit > 0 && 1e6 / p.iops_limit > p.op_latency_us ? 1e6 / p.iops_limit : p.op_latency_us;
}

inline constexpr const char* kIoProfileFormat = "moestream-io-profile";
inline constexpr int kIoProfileVersion = 1;

// Throws FormatError("<where>: <field> ...") unless every number is finite and > 0.
void validate_io_profile(const IoProfile& p, const std::string& where);

// The JSON text of `p` (validated first) with `source_json` (a JSON object's text, may be
// empty) under "source".
std::string io_profile_json(const IoProfile& p, const std::string& source_json = {});

// Parses a profile object, or a bench_io results file holding one under "profile"; FormatError
// naming `where` and the field for bad JSON, a wrong format/version, a missing, non-numeric,
// negative, zero or non-finite field.
IoProfile parse_io_profile(const std::string& text, const std::string& where);

// parse_io_profile of the file's text; IoError when it cannot be read.
IoProfile load_io_profile(const std::filesystem::path& path);

// Writes io_profile_json(p, source_json) atomically (temp file, fsync, rename).
void save_io_profile(const std::filesystem::path& path, const IoProfile& p, const std::string& source_json = {});

}  // namespace moestream
