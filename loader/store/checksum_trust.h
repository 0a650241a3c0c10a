// Checksum trust of the engine store: which expert bytes must be hashed before they are handed
// out, and what a passed hash vouches for afterwards. Checksums verify what comes from the
// device; a page-cache copy that passed is not hashed again while its pages stay resident and its
// file is unchanged (verified_pages.h); a first use of resident pages is hashed there, now or
// beside its compute (pending_checks.h). A pass that fails on a read leaves no hash behind for a
// later pass to reuse (abandon_if_throws). Caller's thread only, except the deferred hashes.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "loader/store/expert_layers.h"
#include "loader/store/expert_store.h"
#include "loader/store/pending_checks.h"
#include "loader/store/verified_pages.h"

namespace moestream::engine_store {

class ChecksumTrust {
 public:
  explicit ChecksumTrust(bool verify) : verify_(verify) {}

  // Tracks the page-cache copies of L's experts (sets L.verified) when L is a checksummed pack
  // layer read through the page cache. IoError naming the file when it cannot be opened.
  void track(Layer& L);
  void set_parallel_for(ExpertStore::ParallelFor pf) { parallel_for_ = std::move(pf); }
  void set_deferred(ExpertStore::Post post) { post_ = std::move(post); }

  // One fetch's view of a layer: its checksums are due; its page-cache copies are tracked; marks
  // taken earlier still hold (the file did not change since: VerifiedPages::refresh).
  struct LayerTrust {
    bool due = false, tracked = false, trusted = false;
  };
  LayerTrust begin(const Layer& L);

  // Whether the expert in `slot` may be used from its mapped pages (`resident`: they are in the
  // page cache): kYes when no checksum is due or those pages passed before, kFirstUse when they
  // are resident but never verified (check_first_uses), else kNo (read it).
  enum class InPlace { kNo, kFirstUse, kYes };
  InPlace in_place(const Layer& L, LayerTrust t, uint32_t slot, bool resident);

  // Whether a read of `slot` must be hashed where it lands: not when it copies resident pages that
  // passed earlier. `resident` is only looked at when t.tracked (the caller probes then).
  bool read_needs_hash(const Layer& L, LayerTrust t, uint32_t slot, bool resident);
  // A read of `slot` hashed to its checksum: its page-cache copy passed.
  void passed(const Layer& L, uint32_t slot);

  // First uses: ms[i] are the mapped matrices of L's resident, never verified slots[i]. Without
  // deferred checks each is hashed now (on the lent threads) and ok[i] says whether it matched
  // (then marked); one that does not stays for the read path, whose checksum names it. With
  // them each is queued (ms[i].unverified) and may be handed out at once (ok[i] = 1).
  void check_first_uses(const Layer& L, std::span<const uint32_t> slots, std::span<ExpertMatrices> ms,
                        std::vector<uint8_t>& ok, ExpertStoreStats& stats);

  // Waits for the deferred hashes, marks those that match (verified_in_place, checksum_seconds)
  // and throws the checksum FormatError of the first that does not (ExpertStore::verify_pending).
  void settle(const std::vector<Layer>& layers, ExpertStoreStats& stats);

  // Runs step(), a step of a pass that hands out experts; when it throws, the pass's deferred
  // hashes are abandoned (PendingChecks::abandon) and the error goes on.
  template <class Step>
  void abandon_if_throws(Step&& step) {
    pending_.abandon_if_throws(std::forward<Step>(step));
  }

 private:
  bool verify_;
  VerifiedPages verified_;
  ExpertStore::ParallelFor parallel_for_;  // the caller's threads, for hashing in place (may be unset)
  ExpertStore::Post post_;                 // set: first uses are hashed beside their compute
  PendingChecks pending_;
};

}  // namespace moestream::engine_store
