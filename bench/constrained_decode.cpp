// bench_constrained_decode: what structured output (runtime/grammar) costs a decode step. In
// interleaved rounds, decodes N tokens unconstrained and N tokens under a JSON schema (an output
// that completes starts over, so both arms decode N tokens), both with the same seeded sampler,
// and prints tokens per CPU-second of each arm, their ratio, and the time spent choosing a token
// (sampling, plus the constraint's work in the constrained arm).
// CPU time, not wall time: on a shared machine other processes' load moves wall time by factors,
// while the process's CPU time per step stays what this process spent.
#include <CLI/CLI.hpp>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "runtime/engine/generate.h"
#include "runtime/engine/model.h"
#include "runtime/grammar/output_constraint.h"
#include "runtime/tokenizer/tokenizer.h"

using namespace moestream;

namespace {

double cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

struct Run {
  double step_cpu_s = 0;    // the whole step: choosing the token, then the forward pass
  double choose_cpu_s = 0;  // choosing the token alone (sampling; under a constraint, its mask)
  int restarts = 0;        // constrained outputs completed and started over
};

// The schema of the server's bench: an object holding an array of short words, about 4 tokens
// an item.
std::string words_schema(int items) {
  return R"({"type": "object", "properties": {"words": {"type": "array", "items": {"type": "string",
      "minLength": 3, "maxLength": 6}, "minItems": )" + std::to_string(items) + R"(, "maxItems": )" +
         std::to_string(items) + R"(}}, "required": ["words"], "additionalProperties": false})";
}

Run decode(Model& model, const std::vector<int>& prompt, int n_tokens, uint64_t seed,
           const std::shared_ptr<const CompiledConstraint>& constraint) {
  SamplerParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 0;
  sp.top_p = 1.0f;
  sp.seed = seed;
  Sampler sampler(sp);
  std::vector<float> logits(size_t(model.config().vocab_size));
  std::optional<ConstraintMatcher> m;
  Run r;
  auto start = [&] {
    model.reset();
    model.forward(prompt, logits);
    if (constraint) m.emplace(constraint);
  };
  start();
  for (int i = 0; i < n_tokens; ++i) {
    const double t0 = cpu_s();
    const int id = m ? m->sample(sampler, logits) : sampler.sample(logits);
    const double t1 = cpu_s();
    if (m && m->terminated()) {
      start();  // the output is complete: the same prompt again (the restart is not timed)
      ++r.restarts;
      r.choose_cpu_s += t1 - t0;
      continue;
    }
    if (model.n_past() + 1 >= model.max_context()) start();
    const double t2 = cpu_s();
    model.forward(std::span<const int>(&id, 1), logits);
    const double t3 = cpu_s();
    r.step_cpu_s += (t1 - t0) + (t3 - t2);
    r.choose_cpu_s += t1 - t0;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Decode cost of constrained (JSON schema) against unconstrained output, interleaved rounds"};
  std::string dir = "models/demo";
  int n_tokens = 256, rounds = 9, threads = 1;
  app.add_option("-m,--model", dir, "packed model directory with tokenizer.json")->check(CLI::ExistingDirectory);
  app.add_option("-n,--tokens", n_tokens, "tokens decoded per run")->check(CLI::Range(8, 100000));
  app.add_option("--rounds", rounds, "interleaved rounds")->check(CLI::Range(1, 1000));
  app.add_option("-t,--threads", threads, "model threads")->check(CLI::Range(1, 1024));
  CLI11_PARSE(app, argc, argv);
  try {
    ModelOptions mo;
    mo.n_threads = threads;
    mo.max_context = 2048;
    auto model = Model::load(dir, mo);
    const Tokenizer tok = Tokenizer::load(dir + "/tokenizer.json");
    std::vector<int> stops;
    for (const char* t : {"<|endoftext|>", "<|im_end|>", "</s>", "<|eot_id|>"})
      if (auto id = tok.token_id(t); id && tok.is_special(*id)) stops.push_back(*id);
    if (tok.eos_id() && std::find(stops.begin(), stops.end(), *tok.eos_id()) == stops.end())
      stops.push_back(*tok.eos_id());
    const auto w0 = std::chrono::steady_clock::now();
    const ConstraintCompiler compiler(tok, model->config().vocab_size, stops);
    const auto w1 = std::chrono::steady_clock::now();
    const auto schema = compiler.compile({ConstraintSpec::Kind::kJsonSchema, words_schema(n_tokens / 4), true});
    const auto w2 = std::chrono::steady_clock::now();
    std::vector<int> prompt;
    for (int32_t id : tok.encode("Here is a list of words:", true)) prompt.push_back(id);

    std::printf("model %s, vocab %d, %d tokens a run, %d interleaved rounds, -t %d\n", dir.c_str(),
                model->config().vocab_size, n_tokens, rounds, threads);
    std::printf("vocabulary tables %.1f ms, schema compile %.1f ms (wall, once per server / per new schema)\n\n",
                std::chrono::duration<double, std::milli>(w1 - w0).count(),
                std::chrono::duration<double, std::milli>(w2 - w1).count());
    std::printf("| round | unconstrained tok/CPU-s | constrained tok/CPU-s | ratio | choosing a token, us: unconstrained / constrained | restarts |\n");
    std::printf("|---|---|---|---|---|---|\n");
    decode(*model, prompt, 16, 0, nullptr);  // warm-up
    std::vector<double> ratios, plain, constrained, choose_u_us, choose_c_us;
    for (int r = 0; r < rounds; ++r) {
      Run u, c;
      if (r % 2 == 0) {
        u = decode(*model, prompt, n_tokens, uint64_t(r + 1), nullptr);
        c = decode(*model, prompt, n_tokens, uint64_t(r + 1), schema);
      } else {
        c = decode(*model, prompt, n_tokens, uint64_t(r + 1), schema);
        u = decode(*model, prompt, n_tokens, uint64_t(r + 1), nullptr);
      }
      const double tu = n_tokens / u.step_cpu_s, tc = n_tokens / c.step_cpu_s;
      plain.push_back(tu);
      constrained.push_back(tc);
      ratios.push_back(tc / tu);
      choose_u_us.push_back(u.choose_cpu_s / n_tokens * 1e6);
      choose_c_us.push_back(c.choose_cpu_s / n_tokens * 1e6);
      std::printf("| %d | %.1f | %.1f | %.3f | %.1f / %.1f | %d |\n", r + 1, tu, tc, tc / tu, choose_u_us.back(),
                  choose_c_us.back(), c.restarts);
    }
    std::printf("\nmedian tokens/CPU-s: unconstrained %.1f, constrained %.1f; median per-round ratio %.3f "
                "(%.3f..%.3f); choosing a token %.1f us unconstrained, %.1f us constrained\n",
                median(plain), median(constrained), median(ratios),
                *std::min_element(ratios.begin(), ratios.end()), *std::max_element(ratios.begin(), ratios.end()),
                median(choose_u_us), median(choose_c_us));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_constrained_decode: %s\n", e.what());
    return 1;
  }
  return 0;
}
