// The option table of runtime/engine/options.h: one row per option, one per rule. Help text names
// other options with marks (`name`), spelled for whoever reads it.
#include <climits>
#include <cstdint>

#include "common/checked.h"
#include "runtime/engine/options.h"

namespace moestream {

namespace {

#define AT(field) [](EngineSettings& s) -> OptionTarget { return &s.field; }
using enum OptionType;
using enum OptionGroup;
constexpr unsigned kCli = kToolInfer | kToolServer;
constexpr unsigned kEngine = kToolInfer | kToolServer | kToolPythonModel;
constexpr unsigned kGen = kToolInfer | kToolPythonGenerate;
constexpr long double kU64Max = static_cast<long double>(UINT64_MAX);

// name, extra CLI names, type, lo, hi, group, tools, env, negated, engine field, help
constexpr OptionSpec kOptions[] = {
    // Model and run
    {"model", "m", kText, 0, 0, kModel, kCli, false, false, nullptr,
     "packed model directory (convert_model output) or GGUF file (any shard of a split set)"},
    {"threads", "t", kInt, 0, kMaxThreads, kModel, kEngine, true, false, AT(model.n_threads),
     "engine threads; 0 = all cores"},
    {"ctx", "c", kInt, 0, kMaxContext, kModel, kEngine, true, false, AT(model.max_context),
     "context length (KV cache); 0 = min(model, 4096); infer's perplexity window too (0 there: "
     "min(model, 512))"},
    {"batch", "", kInt, 0, 1 << 20, kModel, kToolInfer | kToolPythonModel, true, false, AT(batch),
     "tokens per forward chunk (prompt and perplexity); 1 makes perplexity route token by token like "
     "decode; 0 = default: 64, or 512 with `gpu` (its prefill reads each expert once per chunk)"},
    {"prompt", "p", kText, 0, 0, kModel, kToolInfer, false, false, nullptr,
     "prompt text; - reads it from stdin"},
    {"prompt_file", "f,file", kText, 0, 0, kModel, kToolInfer, false, false, nullptr,
     "read the prompt from this file; `prompt` - reads it from stdin"},
    {"prompt_ids", "", kText, 0, 0, kModel, kToolInfer, false, false, nullptr,
     "prompt as comma-separated token ids (no tokenizer needed)"},
    {"max_tokens", "n,n-predict", kInt, 0, kMaxContext, kModel, kToolInfer | kToolPythonGenerate, false, false, nullptr,
     "tokens to generate"},
    {"print_ids", "", kFlag, 0, 0, kModel, kToolInfer, false, false, nullptr,
     "print generated token ids instead of text"},
    {"ignore_eos", "", kFlag, 0, 0, kModel, kToolInfer | kToolPythonGenerate, false, false, nullptr,
     "keep generating past the end-of-sequence token"},
    {"perplexity", "", kText, 0, 0, kModel, kToolInfer, false, false, nullptr,
     "report the perplexity of this text file"},
    {"stride", "", kInt, 0, kMaxContext, kModel, kToolInfer, false, false, nullptr,
     "perplexity window stride; 0 = ctx/2"},
    {"parallel", "", kInt, 1, 64, kModel, kCli, false, false, nullptr,
     "sequences run at once in one batch, one token each per step: the server's concurrent requests "
     "(continuous batching), or infer's `perplexity` windows of `ctx`, N at a time (what "
     "`cache_aware_union` costs in quality); 1 = one at a time (infer's `stride` applies)"},
    // Chat in the terminal
    {"conversation", "", kFlag, 0, 0, kChat, kToolInfer, false, false, nullptr,
     "chat in the terminal with the model's chat template (llama-cli's -cnv too): each line read from "
     "stdin is a user turn (`prompt` or `prompt_file`, if given, the first), the reply streams back and "
     "stops at the template's end of turn; the conversation stays in the KV cache, so each turn runs "
     "only its new tokens (`timing` prints how many per turn); Ctrl-C stops a reply, at the prompt it "
     "ends the chat, as does the end of input"},
    {"system_prompt", "", kText, 0, 0, kChat, kToolInfer, false, false, nullptr,
     "system message that opens the conversation, with `conversation` (llama-cli's -sys too)"},
    // Sampling (the server takes these per request, as JSON fields)
    {"temperature", "temp", kFloat, 0, 0, kSampling, kGen, false, false, AT(sampling.temperature),
     "temperature, >= 0; 0 = greedy"},
    {"top_k", "", kInt, 0, INT_MAX, kSampling, kGen, false, false, AT(sampling.top_k),
     "keep the k most likely tokens; 0 = all"},
    {"top_p", "", kFloat, 0, 0, kSampling, kGen, false, false, AT(sampling.top_p),
     "nucleus sampling mass in (0, 1]; 1 = off"},
    {"seed", "", kUint64, 0, kU64Max, kSampling, kGen, false, false, AT(sampling.seed),
     "sampling seed: the same seed gives the same tokens"},
    {"min_p", "", kFloat, 0, 0, kSampling, kGen, false, false, AT(sampling.min_p),
     "keep tokens whose probability is at least this fraction, in [0, 1], of the most likely one's; 0 = off"},
    {"typical_p", "", kFloat, 0, 0, kSampling, kGen, false, false, AT(sampling.typical_p),
     "locally typical sampling mass in (0, 1]; 1 = off"},
    {"repeat_penalty", "", kFloat, 0, 0, kSampling, kGen, false, false, AT(sampling.repeat_penalty),
     "divide positive logits and multiply negative ones by this (> 0) for each distinct token of the "
     "last `repeat_last_n` (prompt included); 1 = off"},
    {"repeat_last_n", "", kInt, -1, INT_MAX, kSampling, kGen, false, false, AT(sampling.repeat_last_n),
     "tokens `repeat_penalty` looks back over; -1 = all, 0 = off"},
    {"presence_penalty", "", kFloat, 0, 0, kSampling, kGen, false, false, AT(sampling.presence_penalty),
     "subtract this (finite) from the logit of every token generated so far (the prompt not counted)"},
    {"frequency_penalty", "", kFloat, 0, 0, kSampling, kGen, false, false, AT(sampling.frequency_penalty),
     "subtract this (finite) times its count from the logit of every token generated so far"},
    {"logit_bias", "", kList, 0, 0, kSampling, kGen, false, false, nullptr,
     "ID:BIAS, repeatable (Python: a dict {ID: BIAS}): add BIAS (in [-100, 100]) to token ID's logit; "
     "-100 bans the token"},
    // I/O and store
    {"io", "", kText, 0, 0, kIoStore, kEngine, true, false, AT(store.io),
     "expert reads through the batch engine: auto (io_uring, else the pread pool with a notice), uring, "
     "pread (thread pool), mmap (page-fault baseline); or simple (one blocking pread per expert)"},
    {"io_direct", "", kFlag, 0, 0, kIoStore, kEngine, true, false, AT(store.io_direct),
     "read experts with O_DIRECT (bypass the page cache; buffered with a notice where the filesystem refuses)"},
    {"host_cache_mb", "", kUint64, 0, kMaxHostCacheMb, kIoStore, kEngine, true, false, AT(store.host_cache_mb),
     "host expert cache in MiB (LFU with aging), for `io_direct`; 0 = none"},
    {"auto_direct", "", kFlag, 0, 0, kIoStore, kEngine, false, true, AT(store.auto_direct),
     "keep the page cache for a model larger than memory (by default, with neither `io_direct` nor "
     "`host_cache_mb` given, a model whose files exceed the memory the process may fill, its cgroup's "
     "limit included, is read with O_DIRECT into a host cache of what the dense weights leave, at most "
     "half of it; a notice says so)"},
    {"io_qd", "", kUint32, 1, kMaxIoQueueDepth, kIoStore, kEngine, true, false, AT(store.io_qd),
     "reads in flight per io_uring ring"},
    {"io_rings", "", kUint32, 0, kMaxIoWorkers, kIoStore, kEngine, true, false, AT(store.io_rings),
     "io_uring rings, one thread each; 0 = one per core up to 8"},
    {"io_threads", "", kUint32, 0, kMaxIoWorkers, kIoStore, kEngine, true, false, AT(store.io_threads),
     "pread/mmap worker threads; 0 = cores, 4..16"},
    {"coalesce_gap_kb", "", kUint64, 0, kMaxCoalesceGapKb, kIoStore, kEngine, true, false,
     AT(store.coalesce_gap_kb), "merge reads of experts at most this far apart into one; 0 = no coalescing"},
    {"max_read_kb", "", kUint64, kMinReadKb, kMaxReadKb, kIoStore, kEngine, true, false, AT(store.max_read_kb),
     "largest single read; longer experts are split to keep more reads in flight"},
    {"direct_max_read_kb", "", kUint64, kMinReadKb, kMaxReadKb, kIoStore, kEngine, true, false,
     AT(store.direct_max_read_kb),
     "largest single read with `io_direct` (whole experts read faster from a device than 1 MiB pieces)"},
    {"io_profile", "", kText, 0, 0, kIoStore, kEngine, true, false, AT(store.io_profile),
     "device profile JSON (bench_io `profile_out`): each batch then reads through a gap when the profile "
     "says one read is cheaper than two, and O_DIRECT reads of adjacent experts merge past "
     "`direct_max_read_kb`; default: the fixed `coalesce_gap_kb` and read caps"},
    {"verify_checksums", "no-verify", kFlag, 0, 0, kIoStore, kEngine, false, true, AT(model.verify_checksums),
     "skip the per-expert checksum (by default an expert is verified when read from the device; its "
     "page-cache pages, once verified, are used unhashed while they stay resident and the file is unchanged)"},
    {"moe_lookahead", "", kInt, 0, 1 << 16, kIoStore, kEngine, true, false, AT(model.moe_lookahead),
     "during each decode step's layer L, apply layer L+1's router and read its N most likely experts "
     "ahead: into the GPU cache with `gpu`, else into the host cache (`io_direct` `host_cache_mb`) or "
     "the page cache; at most n_experts; 0 = off (never changes the output)"},
    // GPU
    {"gpu", "", kFlag, 0, 0, kGpu, kEngine, true, false, AT(model.gpu),
     "run the whole forward pass on the GPU (CUDA builds; an error, never a CPU fallback, without a GPU)"},
    {"gpu_cache_mb", "", kUint64, 0, kMaxGpuCacheMb, kGpu, kEngine, true, false, AT(model.gpu_cache_mb),
     "GPU expert cache in MiB, with `gpu`; 0 = the whole model's experts when they fit in 80% of free "
     "VRAM, else 80% of free VRAM"},
    {"gpu_sync_layers", "", kFlag, 0, 0, kGpu, kEngine, true, false, AT(model.gpu_sync_layers),
     "with `gpu`: read every layer's routing on the host, also when the last decode step found all its "
     "experts in VRAM (by default such steps run with one sync per token); the same tokens, for comparison"},
    {"gpu_preload", "", kFlag, 0, 0, kGpu, kEngine, true, false, AT(model.gpu_preload),
     "with `gpu`: read every expert into the GPU cache before the first token, as an engine that keeps "
     "all weights in VRAM loads them at start (an error when the cache's budget cannot hold them all); "
     "by default the cache fills as experts are first used"},
    {"gpu_no_graphs", "", kFlag, 0, 0, kGpu, kEngine, true, false, AT(model.gpu_no_graphs),
     "with `gpu`: launch the kernels of a resident decode step one by one instead of as CUDA graphs "
     "(one per layer and one for lm_head); the same tokens, for comparison"},
    {"gpu_pin_page_cache", "", kFlag, 0, 0, kGpu, kEngine, true, false, AT(model.gpu_pin_page_cache),
     "with `gpu`: page-lock the model's files (they stay in RAM for the run; an error when they exceed "
     "the memory available, or with `io_direct`) so the GPU copies a missed expert straight from the "
     "page cache, with no host copy"},
    {"gpu_cpu_misses", "", kFlag, 0, 0, kGpu, kEngine, true, false, AT(model.gpu_cpu_misses),
     "with `gpu`: compute the decode experts the GPU cache does not hold on the CPU (`threads`), where "
     "their pages lie, beside the GPU's hits; only their outputs cross PCIe and nothing is copied into "
     "VRAM for them"},
    // Routing and cache-aware
    {"cache_aware", "", kFlag, 0, 0, kRouting, kEngine, true, false, AT(model.cache_aware.enabled),
     "after the exact top-k, replace a selected expert that is not resident (GPU expert cache with "
     "`gpu`, host cache or page cache) by the best resident unselected expert whose router LOGIT is "
     "within `cache_tolerance` x (top-k logit range) of it, weakest slot first; weights are then "
     "renormalised as the model does"},
    {"cache_tolerance", "", kFloat, 0, kMaxCacheTolerance, kRouting, kEngine, true, false,
     AT(model.cache_aware.tolerance),
     "tolerance of `cache_aware`, as a fraction of the top-k logit range (top-1 logit minus top-k "
     "logit); with top-k = 1 an absolute logit difference; 0 = no change"},
    {"cache_aware_union", "", kFlag, 0, 0, kRouting, kEngine, true, false, AT(model.cache_aware.batch_union),
     "with `cache_aware`, for batches of sequences (the server's or infer's `parallel`): an expert an "
     "earlier sequence of the step chose (read once for all) counts as resident for the later ones' "
     "substitutions; sequences in the step's order (the server's: decode tokens by slot, then prompt "
     "chunks by slot); one sequence alone routes as without it; tolerance 0 changes nothing"},
    {"collect_routing", "", kText, 0, 0, kRouting, kToolInfer | kToolServer | kToolPythonModel, false, false,
     AT(collect_routing),
     "append every token's per-layer expert choices to this routing log (loader/format/routing_log.h; "
     "created if absent, must be of this model), one request id per prompt, perplexity window or "
     "server request (timings.routing_request_id), concurrent requests apart with `parallel`"},
    {"collect_router_inputs", "", kFlag, 0, 0, kRouting, kToolInfer | kToolPythonModel, false, false,
     AT(collect_router_inputs), "also log each router input vector (hidden floats per token and layer)"},
    {"replay_routing", "", kText, 0, 0, kRouting, kEngine, false, false, AT(replay_routing),
     "take every layer's experts from this routing log (as `collect_routing` writes; the server also "
     "takes a directory of them) instead of the router, mapped onto this model's counts "
     "(runtime/engine/routing_replay.h: layer l <- l mod log layers, expert e -> e mod experts, "
     "collisions to the next free id). infer cycles through the log's tokens in order and its outputs "
     "say 'replay'; the server's request i replays log request i mod n (or the body's replay_request) "
     "on its own sequence, with prefix reuse off"},
    // Benchmarking
    {"timing", "", kFlag, 0, 0, kBenchmarking, kToolInfer, false, false, nullptr,
     "print per-phase times and tokens/s to stderr"},
    {"stats_json", "", kText, 0, 0, kBenchmarking, kToolInfer, false, false, nullptr,
     "write the timing figures as JSON to this file"},
    {"lookahead_replayed", "", kFlag, 0, 0, kBenchmarking, kToolInfer | kToolPythonModel, false, false,
     AT(model.moe_lookahead_replayed),
     "CPU: the look-ahead (`moe_lookahead`) predicts layer L+1 from the replayed log instead of its "
     "router (a perfect predictor: the upper bound of what look-ahead can gain); the log's ids first, "
     "then the router's ranking up to N"},
    // Server
    {"host", "", kText, 0, 0, kServer, kToolServer, false, false, nullptr,
     "address to bind; the default keeps it on this machine"},
    {"port", "", kInt, 0, 65535, kServer, kToolServer, true, false, nullptr, "TCP port; 0 = any free port (printed)"},
    {"api_key", "", kText, 0, 0, kServer, kToolServer, true, false, nullptr,
     "require 'Authorization: Bearer KEY' (all but /health)"},
    {"model_id", "", kText, 0, 0, kServer, kToolServer, false, false, nullptr,
     "model name in /v1/models (default: the directory name)"},
    {"queue_size", "", kUint64, 0, 1024, kServer, kToolServer, false, false, nullptr,
     "requests that may wait behind the running one; more get 503"},
    {"http_threads", "", kInt, 0, 1024, kServer, kToolServer, false, false, nullptr,
     "HTTP connection threads; 0 = queue size + parallel + 3"},
    {"max_waiting_connections", "", kUint64, 0, 4096, kServer, kToolServer, false, false, nullptr,
     "accepted connections that may wait for an HTTP thread; more get 503 at once; 0 = 2 x threads"},
    {"max_body_kb", "", kUint64, 1, 1 << 20, kServer, kToolServer, false, false, nullptr,
     "largest request body; larger get 413"},
    {"default_max_tokens", "", kInt, 1, 1 << 20, kServer, kToolServer, false, false, nullptr,
     "max_tokens when a request gives none"},
    {"prefix_reuse", "", kFlag, 0, 0, kServer, kToolServer, false, true, nullptr,
     "run every prompt from an empty KV cache (for comparison)"},
    {"reply_format", "", kText, 0, 0, kServer, kToolServer, false, false, nullptr,
     "markup of the model's chat replies, parsed into tool_calls and reasoning_content: auto (from the chat "
     "template), plain, hermes, glm45, harmony, kimi_k2, deepseek_v31"},
    {"cors_origin", "", kList, 0, 0, kServer, kToolServer, false, false, nullptr,
     "a browser origin allowed to call the API (repeatable; * = any); default: no CORS headers"},
    {"test_forced_output", "", kFlag, 0, 0, kServer, kToolServer, false, false, nullptr,
     "tests only: a request's forced_output is decoded as its reply instead of sampled"},
};
#undef AT

using enum RuleKind;
constexpr OptionRule kRules[] = {
    {kRequires, "gpu_cache_mb", "gpu", kEngine, ""},
    {kRequires, "gpu_sync_layers", "gpu", kEngine, ""},
    {kRequires, "gpu_preload", "gpu", kEngine, ""},
    {kRequires, "gpu_no_graphs", "gpu", kEngine, ""},
    {kRequires, "gpu_pin_page_cache", "gpu", kEngine, ""},
    {kRequires, "gpu_cpu_misses", "gpu", kEngine, ""},
    {kRequires, "cache_aware_union", "cache_aware", kEngine, "it is a rule of cache-aware routing"},
    {kRequires, "collect_router_inputs", "collect_routing", kToolInfer | kToolPythonModel, ""},
    {kExcludes, "replay_routing", "cache_aware", kEngine, "the replay fixes the experts"},
    {kRequires, "lookahead_replayed", "replay_routing", kToolInfer | kToolPythonModel, ""},
    {kRequires, "lookahead_replayed", "moe_lookahead", kToolInfer | kToolPythonModel, ""},
    {kExcludes, "lookahead_replayed", "gpu", kToolInfer | kToolPythonModel, "the CPU's look-ahead only"},
    {kExcludes, "prompt", "prompt_ids", kToolInfer, "give one of them"},
    {kRequires, "parallel", "perplexity", kToolInfer, "it scores perplexity windows N at a time"},
    {kExcludes, "parallel", "prompt", kToolInfer, "it applies to perplexity windows only"},
    {kExcludes, "parallel", "prompt_ids", kToolInfer, "it applies to perplexity windows only"},
    {kExcludes, "parallel", "replay_routing", kToolInfer, "it runs perplexity windows as one batch"},
    {kExcludes, "parallel", "collect_routing", kToolInfer, "it runs perplexity windows as one batch"},
    {kExcludes, "gpu_cpu_misses", "moe_lookahead", kEngine,
     "the look-ahead copies predicted experts into VRAM, while the CPU computes the misses where they lie"},
    {kExcludes, "gpu_pin_page_cache", "io_direct", kEngine, "O_DIRECT reads have no page cache to pin"},
};

}  // namespace

std::span<const OptionSpec> option_table() { return kOptions; }
std::span<const OptionRule> option_rules() { return kRules; }

}  // namespace moestream
