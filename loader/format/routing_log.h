// The routing log written by `infer --collect-routing` and read by `cluster_experts`: which
// experts the router chose for every token and layer. Plain bytes here; models stay in runtime/.
//
// File layout (all integers little-endian, floats IEEE-754 binary32):
//   Header, exactly 64 bytes:
//   offset  size  field
//   0       8     magic "MOEROUTE"
//   8       4     version (kRoutingLogVersion = 1)
//   12      4     reserved, 0
//   16      8     model_hash: XXH64 (seed 0) of the model directory's model.json bytes
//                 (of a GGUF: of its first shard's bytes before the data section)
//   24      4     n_layers
//   28      4     n_experts (<= 65535: ids are stored as uint16)
//   32      4     top_k (1..n_experts)
//   36      4     hidden: width of a router input vector
//   40      16    reserved, 0
//   56      8     header checksum: XXH64 (seed 0) of bytes [0, 56)
//   Then records back to back until the end of the file, each:
//   0       4     tag "RREC"
//   4       4     record_bytes: the whole record, tag to checksum included
//   8       8     request_id (one prompt or perplexity window; unique within the file)
//   16      4     position: token position in its request (0-based)
//   20      1     phase: 0 prefill, 1 decode
//   21      1     flags: bit 0 = a router input vector follows the weights
//   22      2     layer
//   24      2*k   selected logical expert ids (uint16), in router score order (best first)
//   24+2k   4*k   their router weights (after top-k renormalisation when the model does it)
//   24+6k   4*hidden  router input (the normalised hidden state), only when flags bit 0
//   end-8   8     checksum: XXH64 (seed 0) of the record's bytes before it
// A record whose length runs past the end of the file, or the last record when its checksum
// fails (a torn write), is a truncated tail: the reader skips it and reports a warning. A bad
// record followed by more data is corruption: FormatError naming the file and offset.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace moestream {

inline constexpr char kRoutingLogMagic[8] = {'M', 'O', 'E', 'R', 'O', 'U', 'T', 'E'};
inline constexpr uint32_t kRoutingLogVersion = 1;
inline constexpr size_t kRoutingLogHeaderBytes = 64;

enum class RoutingPhase : uint8_t { kPrefill = 0, kDecode = 1 };

struct RoutingLogHeader {
  uint64_t model_hash = 0;
  uint32_t n_layers = 0, n_experts = 0, top_k = 0, hidden = 0;
  bool operator==(const RoutingLogHeader&) const = default;
};

struct RoutingRecord {
  uint64_t request_id = 0;
  uint32_t position = 0;
  RoutingPhase phase = RoutingPhase::kPrefill;
  uint16_t layer = 0;
  std::vector<uint16_t> ids;        // top_k logical ids, best first
  std::vector<float> weights;       // top_k router weights
  std::vector<float> router_input;  // hidden floats, or empty
};

// XXH64 of dir/model.json (of a GGUF file or shard: of the first shard's header, metadata and
// tensor table): the model identity a log is tied to.
uint64_t model_identity_hash(const std::filesystem::path& model_dir);

std::string encode_routing_header(const RoutingLogHeader& h);
// Throws FormatError naming `path` and the field when the header is invalid.
RoutingLogHeader decode_routing_header(std::string_view bytes, const std::filesystem::path& path);
// Appends one encoded record; MOE_ASSERTs the sizes match the header (a caller bug).
void encode_routing_record(const RoutingLogHeader& h, const RoutingRecord& r, std::string& out);

struct RoutingLog {
  RoutingLogHeader header;
  std::vector<RoutingRecord> records;
  uint64_t valid_bytes = 0;      // end of the last good record
  uint64_t truncated_bytes = 0;  // bytes skipped at the tail (0 when the file is whole)
  std::string warning;           // non-empty when a tail was skipped
};

// Reads and validates a whole log. Throws IoError (cannot read), FormatError (bad header, a
// corrupt record before the tail, a record inconsistent with the header).
RoutingLog read_routing_log(const std::filesystem::path& path);

// Appends records to a log, creating it with `header` when absent or empty. An existing log must
// have the same header (else ConfigError naming both); a truncated tail left by a crash is cut off
// first (reported by warning()). Records are written whole with one write(2) per flush.
class RoutingLogWriter {
 public:
  RoutingLogWriter(const std::filesystem::path& path, const RoutingLogHeader& header);
  ~RoutingLogWriter();  // flushes; never throws (errors are reported by an explicit close())
  RoutingLogWriter(const RoutingLogWriter&) = delete;
  RoutingLogWriter& operator=(const RoutingLogWriter&) = delete;

  void append(const RoutingRecord& r);
  void flush();                 // writes the buffered records
  void close();                 // flush + fsync + close; throws IoError
  uint64_t next_request_id() const { return next_request_id_; }  // 1 + largest id in the file
  uint64_t take_request_id() { return next_request_id_++; }
  const std::string& warning() const { return warning_; }
  const RoutingLogHeader& header() const { return header_; }

 private:
  std::filesystem::path path_;
  RoutingLogHeader header_;
  int fd_ = -1;
  std::string buf_;
  uint64_t next_request_id_ = 0;
  std::string warning_;
};

}  // namespace moestream
