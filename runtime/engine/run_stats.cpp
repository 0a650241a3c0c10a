// Implementation of runtime/engine/run_stats.h.
#include "runtime/engine/run_stats.h"

#include <cstdio>

namespace moestream {

namespace {

nlohmann::json times_json(const ForwardTimes& t) {
  return {{"attention", t.attention_s},
          {"router", t.router_s},
          {"expert_io", t.expert_io_s},
          {"expert_compute", t.expert_compute_s},
          {"other", t.other_s}};
}

// tokens: forward-pass tokens of the phase, so per-token figures sum over layers.
nlohmann::json routing_json(const CacheAwareStats& r, double tokens) {
  return {{"routings", r.routings},
          {"slots", r.slots},
          {"substitutions", r.substitutions},
          {"substitutions_per_token", tokens > 0 ? double(r.substitutions) / tokens : 0.0},
          {"misses_before_per_token", tokens > 0 ? double(r.misses_before) / tokens : 0.0},
          {"misses_after_per_token", tokens > 0 ? double(r.misses_after) / tokens : 0.0},
          {"misses_before", r.misses_before},
          {"misses_after", r.misses_after},
          {"agreement", r.agreement()}};
}

// GPU expert cache counters of a phase (issue 8 telemetry): hits/misses of the VRAM tier (misses
// are served by the host tiers, counted under "experts"), prefetches, look-ahead recall, H2D.
nlohmann::json gpu_json(const GpuForwardStats& g) {
  const CacheStats& p = g.cache.policy;
  return {{"gpu_hits", p.demand_hits + p.prefill_hits},
          {"gpu_misses", p.demand_misses + p.prefill_fills + p.prefill_no_room},
          {"demand_hits", p.demand_hits},
          {"demand_misses", p.demand_misses},
          {"prefill_hits", p.prefill_hits},
          {"prefill_fills", p.prefill_fills},
          {"prefill_no_room", p.prefill_no_room},
          {"scratch_uses", g.cache.scratch_uses},
          {"evictions", p.evictions},
          {"prefetch_issued", g.cache.prefetch_issued},
          {"prefetch_used", g.cache.prefetch_used},
          {"prefetch_dropped", g.cache.prefetch_dropped},
          {"prefetch_ignored", g.cache.prefetch_ignored},
          {"prefetch_cancelled", g.cache.prefetch_cancelled},
          {"prefetch_refills", g.cache.prefetch_refills},
          {"prefetch_waits", g.cache.prefetch_waits},
          {"prefetch_wait_s", g.cache.prefetch_wait_s},
          {"prefetch_h2d_bytes", g.cache.prefetch_h2d_bytes},
          {"lookahead_layers", g.lookahead.layers},
          {"lookahead_demanded", g.lookahead.demanded},
          {"lookahead_demanded_predicted", g.lookahead.demanded_predicted},
          {"lookahead_recall", g.lookahead.recall()},
          {"h2d_bytes", g.cache.h2d_bytes},
          {"h2d_direct_bytes", g.cache.h2d_direct_bytes},
          {"h2d_copies", g.cache.h2d_copies},
          {"demand_wait_s", g.cache.demand_wait_s},
          {"alloc_retries", g.cache.alloc_retries},
          {"resident_steps", g.resident.steps},
          {"resident_redone", g.resident.redone},
          {"resident_wall_s", g.resident.wall_s},
          {"resident_device_s", g.resident.device_s},
          {"graph_launches", g.resident.graphs.launches},
          {"graph_updates", g.resident.graphs.updates},
          {"graph_instantiations", g.resident.graphs.instantiations},
          {"cpu_miss_experts", g.cpu_misses.experts},
          {"cpu_miss_layers", g.cpu_misses.layers}};
}

nlohmann::json phase_json(const PhaseStats& p, bool gpu) {
  nlohmann::json j = {{"tokens", p.tokens},
                      {"seconds", p.seconds},
                      {"tokens_per_s", p.tokens_per_s()},
                      {"phases_s", times_json(p.times)}};
  if (p.routing.routings > 0) j["cache_aware"] = routing_json(p.routing, p.tokens);
  if (gpu) j["gpu_cache"] = gpu_json(p.gpu);
  return j;
}

std::string fmt(const char* f, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a, b, c);
  return buf;
}

std::string times_text(const ForwardTimes& t) {
  const double ms = 1e3;
  std::string s = fmt("  attention %8.1f ms   router %8.1f ms", t.attention_s * ms, t.router_s * ms);
  s += fmt("   expert I/O %8.1f ms   expert compute %8.1f ms", t.expert_io_s * ms,
           t.expert_compute_s * ms);
  s += fmt("   other %8.1f ms\n", t.other_s * ms);
  return s;
}

std::string routing_text(const CacheAwareStats& r, double tokens) {
  if (r.routings == 0) return "";
  const double n = tokens > 0 ? tokens : 1;
  return fmt("  cache-aware: %.2f substitutions/token, misses/token %.2f before -> ",
             double(r.substitutions) / n, double(r.misses_before) / n) +
         fmt("%.2f after substitution, routing agreement %.4f\n", double(r.misses_after) / n,
             r.agreement());
}

std::string gpu_text(const GpuForwardStats& g) {
  const CacheStats& p = g.cache.policy;
  std::string s = "  gpu cache: " + std::to_string(p.demand_hits + p.prefill_hits) + " hits, " +
                  std::to_string(p.demand_misses + p.prefill_fills + p.prefill_no_room) +
                  " misses (" + std::to_string(g.cache.scratch_uses) + " without a slot), " +
                  std::to_string(p.evictions) + " evictions, H2D " +
                  fmt("%.1f MiB in ", double(g.cache.h2d_bytes) / (1 << 20)) +
                  std::to_string(g.cache.h2d_copies) + fmt(" copies, demand wait %.3f s\n",
                                                           g.cache.demand_wait_s);
  if (g.cache.prefetch_issued + g.cache.prefetch_dropped + g.lookahead.layers > 0)
    s += "  look-ahead: prefetches " + std::to_string(g.cache.prefetch_issued) + " issued, " +
         std::to_string(g.cache.prefetch_used) + " used, " +
         std::to_string(g.cache.prefetch_dropped) + " dropped, " +
         std::to_string(g.cache.prefetch_cancelled) + " cancelled, " +
         std::to_string(g.cache.prefetch_waits) + fmt(" waited for (%.3f s); recall ",
                                                      g.cache.prefetch_wait_s) +
         fmt("%.4f", g.lookahead.recall()) + " (" + std::to_string(g.lookahead.demanded_predicted) +
         " of " + std::to_string(g.lookahead.demanded) + " demanded experts predicted)\n";
  if (g.resident.steps > 0)
    s += "  resident decode: " + std::to_string(g.resident.steps) + " steps without a per-layer sync, " +
         std::to_string(g.resident.redone) + " finished through the synced path (an expert missed)" +
         fmt("; %.1f us a step, the device busy for %.1f us of it\n", 1e6 * g.resident.wall_s / double(g.resident.steps),
             1e6 * g.resident.device_s / double(g.resident.steps));
  return s;
}

std::string phase_text(const char* name, const PhaseStats& p, bool gpu) {
  return std::string(name) + ": " + std::to_string(p.tokens) + " tokens in " +
         fmt("%.4f s = %.2f tokens/s\n", p.seconds, p.tokens_per_s()) + times_text(p.times) +
         routing_text(p.routing, p.tokens) + (gpu ? gpu_text(p.gpu) : std::string());
}

}  // namespace

nlohmann::json run_stats_json(const RunInfo& info, const std::optional<GenerateStats>& gen,
                              const std::optional<PerplexityResult>& ppl) {
  nlohmann::json j = {{"model", info.model_dir}, {"arch", info.arch},     {"quant", info.quant},
                      {"threads", info.threads}, {"context", info.context},
                      {"expert_io", info.expert_io}};
  const bool gpu = !info.gpu.empty();
  if (gpu) j["gpu"] = info.gpu;
  j["routing"] = info.routing.empty() ? "router" : "replay";
  if (!info.routing.empty()) j["routing_replay"] = info.routing;
  if (gen) {
    j["prefill"] = phase_json(gen->prefill, gpu);
    j["decode"] = phase_json(gen->decode, gpu);
    const ExpertStoreStats& e = gen->experts;
    j["experts"] = {{"fetch_calls", e.fetch_calls},     {"experts_requested", e.experts_requested},
                    {"experts_read", e.experts_read},   {"bytes_read", e.bytes_read},
                    {"io_seconds", e.io_seconds},
                    {"host_cache_hits", e.host_cache_hits},
                    {"page_cache_hits", e.page_cache_hits},
                    {"read_ops_before_coalescing", e.read_ops_requested},
                    {"read_ops_after_coalescing", e.read_ops_issued},
                    {"bytes_transferred", e.bytes_transferred},
                    {"io_wait_not_hidden_s", e.io_wait_seconds},
                    {"checksum_s", e.checksum_seconds},
                    {"fetches_read_ahead", e.fetches_read_ahead},
                    {"experts_in_place", e.experts_in_place},
                    {"checksums_skipped", e.checksums_skipped},
                    {"verified_in_place", e.verified_in_place}};
    // The CPU look-ahead (--moe-lookahead without --gpu): predictions, their reads, recall.
    j["experts"]["lookahead"] = {{"predictions", e.lookahead_predictions},
                                 {"predicted", e.lookahead_predicted},
                                 {"read", e.lookahead_read},
                                 {"used", e.lookahead_used},
                                 {"awaited", e.lookahead_awaited},
                                 {"wasted", e.lookahead_wasted},
                                 {"cancelled", e.lookahead_cancelled},
                                 {"demanded", e.lookahead_demanded},
                                 {"demanded_predicted", e.lookahead_demanded_predicted},
                                 {"recall", e.lookahead_recall()}};
    // Decode alone (the store's counters minus those at the end of prefill).
    const ExpertStoreStats& p = gen->experts_after_prefill;
    const double n = gen->decode.tokens > 0 ? gen->decode.tokens : 1;
    j["decode_experts"] = {{"experts_requested", e.experts_requested - p.experts_requested},
                           {"experts_read", e.experts_read - p.experts_read},
                           {"bytes_read", e.bytes_read - p.bytes_read},
                           {"bytes_read_per_token", double(e.bytes_read - p.bytes_read) / n}};
  }
  if (ppl)
    j["perplexity"] = {{"perplexity", ppl->perplexity}, {"mean_nll", ppl->mean_nll},
                       {"tokens_scored", ppl->n_scored}, {"windows", ppl->n_windows},
                       {"ctx", ppl->ctx},               {"stride", ppl->stride},
                       {"tokens_run", ppl->tokens_run}, {"seconds", ppl->seconds},
                       {"tokens_per_s", ppl->seconds > 0 ? double(ppl->tokens_run) / ppl->seconds : 0.0},
                       {"phases_s", times_json(ppl->times)}};
  if (ppl && ppl->routing.routings > 0)
    j["perplexity"]["cache_aware"] = routing_json(ppl->routing, double(ppl->tokens_run));
  if (ppl && gpu) j["perplexity"]["gpu_cache"] = gpu_json(ppl->gpu);
  return j;
}

std::string run_stats_text(const RunInfo& info, const std::optional<GenerateStats>& gen,
                           const std::optional<PerplexityResult>& ppl) {
  std::string s = "model " + info.model_dir + " (" + info.arch + ", experts " + info.quant + "), " +
                  std::to_string(info.threads) + " threads, context " + std::to_string(info.context) + "\n";
  if (!info.expert_io.empty()) s += "expert reads: " + info.expert_io + "\n";
  if (!info.routing.empty()) s += "routing: " + info.routing + "\n";
  const bool gpu = !info.gpu.empty();
  if (gpu) s += "gpu: " + info.gpu + "\n";
  if (gen) {
    s += phase_text("prefill", gen->prefill, gpu);
    s += phase_text("decode ", gen->decode, gpu);
    const ExpertStoreStats& e = gen->experts;
    s += "experts: " + std::to_string(e.experts_requested) + " requested, " +
         std::to_string(e.host_cache_hits) + " host-cache hits, " + std::to_string(e.experts_read) + " read, " +
         std::to_string(e.experts_in_place) + " computed in place (" + std::to_string(e.page_cache_hits) +
         " of these found in the page cache), " +
         fmt("%.1f MiB, I/O %.3f s\n", double(e.bytes_read) / (1 << 20), e.io_seconds);
    s += "  read ops " + std::to_string(e.read_ops_requested) + " before coalescing, " +
         std::to_string(e.read_ops_issued) + " after; " +
         fmt("%.1f MiB transferred; I/O wait not hidden by compute %.3f s; checksums %.3f s",
             double(e.bytes_transferred) / (1 << 20), e.io_wait_seconds, e.checksum_seconds);
    if (e.checksums_skipped > 0)
      s += " (" + std::to_string(e.checksums_skipped) + " skipped: pages verified earlier)";
    if (e.verified_in_place > 0)
      s += "; " + std::to_string(e.verified_in_place) + " first uses verified in place";
    if (e.fetches_read_ahead > 0)
      s += "; " + std::to_string(e.fetches_read_ahead) + " expert groups read ahead";
    s += "\n";
    if (e.lookahead_predictions > 0)
      s += "  look-ahead: " + std::to_string(e.lookahead_predictions) + " predictions of " +
           std::to_string(e.lookahead_predicted) + " experts, " + std::to_string(e.lookahead_read) +
           " read ahead (" + std::to_string(e.lookahead_used) + " used, " + std::to_string(e.lookahead_awaited) +
           " of them awaited in flight; " + std::to_string(e.lookahead_wasted) + " wasted, " +
           std::to_string(e.lookahead_cancelled) + " cancelled as too late); recall " +
           fmt("%.4f", e.lookahead_recall()) + " (" + std::to_string(e.lookahead_demanded_predicted) + " of " +
           std::to_string(e.lookahead_demanded) + " demanded experts predicted)\n";
  }
  if (ppl)
    s += fmt("perplexity %.4f (mean NLL %.4f nats", ppl->perplexity, ppl->mean_nll) + ", " +
         std::to_string(ppl->n_scored) + " tokens, " + std::to_string(ppl->n_windows) +
         " windows of ctx " + std::to_string(ppl->ctx) + " stride " + std::to_string(ppl->stride) +
         fmt(", %.2f s, %.1f tokens/s run)\n", ppl->seconds,
             ppl->seconds > 0 ? double(ppl->tokens_run) / ppl->seconds : 0.0) +
         times_text(ppl->times) + routing_text(ppl->routing, double(ppl->tokens_run)) +
         (gpu ? gpu_text(ppl->gpu) : std::string());
  return s;
}

}  // namespace moestream
