// Request building of the engine store: a fetch's experts that no tier handed out become reads,
// each into a host-cache slot (when the cache admits it) or a scratch buffer, one ReadRequest per
// piece (a pack expert one, a GGUF expert three), each marked with whether its checksum is due
// where it lands (checksum_trust.h).
#pragma once

#include <cstdint>

#include "loader/store/checksum_trust.h"
#include "loader/store/engine_fetch.h"
#include "loader/store/host_cache.h"

namespace moestream::engine_store {

class ReadPlan {
 public:
  // `cache` may be null (no host cache); `read_bytes` is one scratch buffer (the largest payload,
  // 4 KiB rounded); `count_hits`: misses found in the page cache count as page-cache hits.
  ReadPlan(HostCache* cache, ChecksumTrust& trust, uint64_t read_bytes, bool count_hits)
      : cache_(cache), trust_(trust), read_bytes_(read_bytes), count_hits_(count_hits) {}

  // Fills f.reqs, f.req_item and f.due with the reads of f's items that are neither ready nor
  // awaited (ready ones are pushed ready); a look-ahead (f.prediction) fills the cache as
  // speculative and is counted when its thread takes the batch. Counts experts_read,
  // bytes_read, page_cache_hits, checksums_skipped.
  void build(Fetch& f, const Layer& L, ChecksumTrust::LayerTrust t, ExpertStoreStats& stats);

 private:
  HostCache* cache_;
  ChecksumTrust& trust_;
  uint64_t read_bytes_;
  bool count_hits_;
};

}  // namespace moestream::engine_store
