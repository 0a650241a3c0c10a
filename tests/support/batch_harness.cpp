// Implementation of tests/support/batch_harness.h.
#include "tests/support/batch_harness.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <span>

namespace moestream::test {

namespace {

int argmax(const std::vector<float>& v) { return int(std::max_element(v.begin(), v.end()) - v.begin()); }

}  // namespace

std::vector<int> random_tokens(std::mt19937& rng, int n, int vocab) {
  std::vector<int> t(static_cast<size_t>(n));
  for (int& x : t) x = int(rng() % unsigned(vocab));
  return t;
}

std::vector<int> prefill_each(Model& m, const std::vector<std::vector<int>>& prompts) {
  std::vector<int> seqs;
  std::vector<float> l(size_t(m.config().vocab_size));
  for (const auto& p : prompts) {
    seqs.push_back(m.create_sequence());
    const SequenceInput in{seqs.back(), p, l, false};
    m.forward_batch(std::span<const SequenceInput>(&in, 1));
  }
  return seqs;
}

void StepUnion::record(Model& m) {
  per_layer.assign(size_t(m.config().n_moe_layers()), {});
  sequences.clear();
  m.set_routing_callback([this, &m](const RoutingEvent& ev) {
    EXPECT_FALSE(ev.prefill);
    EXPECT_EQ(ev.n_tokens, 1);
    EXPECT_EQ(ev.position, m.sequence_n_past(ev.sequence));
    sequences.insert(ev.sequence);
    for (int j = 0; j < ev.top_k; ++j) per_layer[size_t(ev.layer)].insert(ev.ids[j]);
  });
}

size_t StepUnion::experts() const {
  size_t n = 0;
  for (const auto& u : per_layer) n += u.size();
  return n;
}

std::vector<BatchRequest> four_requests(unsigned seed, int vocab, bool fixed_decode) {
  std::mt19937 rng(seed);
  const int prompt[4] = {5, 19, 1, 9}, join[4] = {0, 1, 1, 8}, n_new[4] = {6, 5, 7, 4};
  std::vector<BatchRequest> rs(4);
  for (size_t i = 0; i < rs.size(); ++i) {
    rs[i].prompt = random_tokens(rng, prompt[i], vocab);
    rs[i].join_step = join[i];
    if (fixed_decode) rs[i].decode = random_tokens(rng, n_new[i], vocab);
    else rs[i].n_new = n_new[i];
  }
  return rs;
}

void run_alone(Model& m, BatchRequest& r) {
  std::vector<float> l(size_t(m.config().vocab_size));
  m.reset();
  m.forward(r.prompt, l);
  r.logits.push_back(l);
  for (int i = 0; i < r.decode_tokens(); ++i) {
    const int tok = r.decode.empty() ? argmax(l) : r.decode[size_t(i)];
    m.forward(std::span<const int>(&tok, 1), l);
    r.logits.push_back(l);
  }
}

void run_batched(Model& m, std::vector<BatchRequest>& rs, int chunk,
                 const std::function<void(size_t, int)>& on_create) {
  const size_t V = size_t(m.config().vocab_size);
  struct Live {
    int seq = -1;
    size_t fed = 0, decoded = 0;
    int token = -1;  // the next decode input
    int produced = 0;  // logits rows this run added to the request (it may hold earlier ones)
    std::vector<float> l;
    bool done = false;
  };
  std::vector<Live> live(rs.size());
  for (int step = 0;; ++step) {
    std::vector<SequenceInput> batch;
    std::vector<size_t> who;
    for (size_t i = 0; i < rs.size(); ++i) {
      BatchRequest& r = rs[i];
      Live& s = live[i];
      if (s.done || step < r.join_step) continue;
      if (s.seq < 0) {
        s.seq = m.create_sequence();
        if (on_create) on_create(i, s.seq);
      }
      s.l.assign(V, 0.0f);
      SequenceInput in;
      in.sequence = s.seq;
      if (s.fed < r.prompt.size()) {
        const size_t n = std::min(r.prompt.size() - s.fed, size_t(chunk));
        in.tokens = std::span<const int>(r.prompt.data() + s.fed, n);
        s.fed += n;
        if (s.fed == r.prompt.size()) in.logits = s.l;  // only the prompt's last chunk predicts
      } else {
        if (!r.decode.empty()) s.token = r.decode[s.decoded];
        ++s.decoded;
        in.tokens = std::span<const int>(&s.token, 1);
        in.logits = s.l;
      }
      batch.push_back(in);
      who.push_back(i);
    }
    if (batch.empty()) {
      if (std::all_of(live.begin(), live.end(), [](const Live& s) { return s.done; })) return;
      continue;
    }
    m.forward_batch(batch);
    for (size_t b = 0; b < batch.size(); ++b) {
      BatchRequest& r = rs[who[b]];
      Live& s = live[who[b]];
      if (batch[b].logits.empty()) continue;
      r.logits.push_back(s.l);
      s.token = argmax(s.l);
      if (++s.produced == r.decode_tokens() + 1) {
        m.free_sequence(s.seq);
        s.done = true;
      }
    }
  }
}

RoutingLog random_log(const ModelConfig& c, int requests, int positions, unsigned seed) {
  std::mt19937 rng(seed);
  RoutingLog log;
  log.header = {1, uint32_t(c.n_moe_layers()), uint32_t(c.n_experts), uint32_t(c.n_experts_per_tok),
                uint32_t(c.hidden_size)};
  for (int r = 0; r < requests; ++r)
    for (int p = 0; p < positions; ++p)
      for (int l = 0; l < c.n_moe_layers(); ++l) {
        RoutingRecord rec;
        rec.request_id = uint64_t(100 + r);
        rec.position = uint32_t(p);
        rec.layer = uint16_t(l);
        std::vector<int> all(size_t(c.n_experts));
        for (int e = 0; e < c.n_experts; ++e) all[size_t(e)] = e;
        std::shuffle(all.begin(), all.end(), rng);
        float sum = 0;
        for (int j = 0; j < c.n_experts_per_tok; ++j) {
          rec.ids.push_back(uint16_t(all[size_t(j)]));
          rec.weights.push_back(0.1f + float(rng() % 1000) / 1000.0f);
          sum += rec.weights.back();
        }
        for (float& w : rec.weights) w /= sum;
        log.records.push_back(rec);
      }
  return log;
}

RoutingOverrideFn replaying(const RoutingReplay& r, size_t request) {
  return [&r, request](int l, uint64_t pos, int n, int* ids, float* w) { r.route_request(request, l, pos, n, ids, w); };
}

ReplayedRuns run_replayed(Model& solo, Model& batched, std::vector<BatchRequest>& rs, const RoutingReplay& replay,
                          const std::vector<size_t>& request_of, int chunk) {
  ReplayedRuns out;
  out.alone = rs;
  out.first_on_router = rs.front();
  run_alone(solo, out.first_on_router);
  for (size_t i = 0; i < rs.size(); ++i) {
    solo.set_sequence_routing(-1, replaying(replay, request_of[i]));
    run_alone(solo, out.alone[i]);
  }
  solo.set_sequence_routing(-1, {});
  std::map<int, size_t> request_of_seq;
  batched.set_routing_callback([&](const RoutingEvent& ev) {
    std::vector<int> ids(size_t(ev.top_k));
    std::vector<float> w(size_t(ev.top_k));
    for (int t = 0; t < ev.n_tokens; ++t, ++out.events) {
      replay.route_request(request_of_seq.at(ev.sequence), ev.layer, uint64_t(ev.position + t), 1, ids.data(), w.data());
      out.mismatched += !std::equal(ids.begin(), ids.end(), ev.ids + size_t(t) * size_t(ev.top_k));
    }
  });
  run_batched(batched, rs, chunk, [&](size_t i, int seq) {
    request_of_seq[seq] = request_of[i];
    batched.set_sequence_routing(seq, replaying(replay, request_of[i]));
  });
  batched.set_routing_callback({});
  return out;
}

}  // namespace moestream::test
