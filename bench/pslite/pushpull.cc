// ps-lite's stock server, timed from one worker: the peer of bench/pushpull.py (issue 44.3).
//
// Our own driver, linked against ps-lite's library (bench/pslite/build.sh builds both, outside the
// repository).  One binary plays every role, as ps-lite's own tests do: DMLC_ROLE says which
// (scheduler, server or worker), and bench/pslite/driver.py starts the three with the DMLC_* variables.
//
//   server:    KVServer<float> with KVServerDefaultHandle, ps-lite's stock handle (a
//              std::unordered_map<Key, float>: a push adds, a pull reads), untouched
//   worker:    for each batch size n, n random uint64 keys (sorted and unique, as ps-lite requires;
//              spread over the whole key space as bench/pushpull.py's are), dim 1; one push makes
//              them exist, then pulls are timed, then pushes, each direction as bench/pushpull.py's
//              measure() does: one warm-up request, then requests with `window` in flight until
//              min_keys have gone and 0.2 s has passed, or max_s has
//   scheduler: ps-lite's, unchanged
//
// The worker's requests are ZPush/ZPull (the zero-copy calls: ps-lite's fastest client path).  It
// prints one JSON object on stdout; everything ps-lite logs goes to stderr.
//
//   pushpull --batches 1000,100000 --min-keys 2e7 --max-s 10 --window 1 --seed 0

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "ps/ps.h"

#ifndef PSLITE_COMMIT
#define PSLITE_COMMIT "unknown"
#endif

namespace {

struct Options {
  std::vector<size_t> batches{1000, 100000, 1000000};
  double min_keys = 2e7;
  double max_s = 10.0;
  int window = 1;
  uint64_t seed = 0;
};

void Usage(const char* why) {
  std::fprintf(stderr,
               "pushpull: %s\nusage: pushpull [--batches N,N,...] [--min-keys K] [--max-s S] [--window W] "
               "[--seed X]\n(every node reads DMLC_ROLE; bench/pslite/driver.py starts them)\n",
               why);
  std::exit(2);
}

Options Parse(int argc, char* argv[]) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) Usage(("a value must follow " + flag).c_str());
    const char* value = argv[++i];
    char* end = nullptr;
    if (flag == "--batches") {
      o.batches.clear();
      for (const char* p = value; *p;) {
        unsigned long long n = std::strtoull(p, &end, 10);
        if (end == p || n == 0) Usage("--batches takes positive integers separated by commas");
        o.batches.push_back(static_cast<size_t>(n));
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') Usage("--batches takes positive integers separated by commas");
      }
    } else if (flag == "--min-keys") {
      o.min_keys = std::strtod(value, &end);
    } else if (flag == "--max-s") {
      o.max_s = std::strtod(value, &end);
    } else if (flag == "--window") {
      o.window = static_cast<int>(std::strtol(value, &end, 10));
      if (o.window < 1) Usage("--window must be at least 1");
    } else if (flag == "--seed") {
      o.seed = std::strtoull(value, &end, 10);
    } else {
      Usage(("unknown flag " + flag).c_str());
    }
    if (end != nullptr && *end != '\0') Usage(("not a number after " + flag + ": " + value).c_str());
  }
  if (o.batches.empty()) Usage("--batches needs at least one size");
  return o;
}

double Now() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

struct Timing {
  size_t keys = 0;
  size_t requests = 0;
  double seconds = 0;
};

// `issue(i)` sends request i and returns its timestamp; keys_per_request keys each
template <typename Issue>
Timing Measure(ps::KVWorker<float>* kv, Issue issue, size_t keys_per_request, const Options& o) {
  size_t issued = 0;
  kv->Wait(issue(issued++));  // warm-up: connections, allocator, the server's first touch
  Timing t;
  std::deque<int> inflight;
  double t0 = Now();
  for (;;) {
    while (static_cast<int>(inflight.size()) < o.window) inflight.push_back(issue(issued++));
    kv->Wait(inflight.front());
    inflight.pop_front();
    t.keys += keys_per_request;
    t.requests += 1;
    double elapsed = Now() - t0;
    if ((t.keys >= o.min_keys && elapsed >= 0.2) || elapsed >= o.max_s) break;
  }
  for (int ts : inflight) {
    kv->Wait(ts);
    t.keys += keys_per_request;
    t.requests += 1;
  }
  t.seconds = Now() - t0;
  return t;
}

std::vector<ps::Key> RandomKeys(size_t n, std::mt19937_64* rng) {
  std::vector<ps::Key> keys(n);
  for (auto& k : keys) k = (*rng)();
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());  // a repeat is 1 in 2^64/n: rare
  return keys;
}

// `batch` the size asked for, `n` the keys sent (the same but for a repeated random key)
void Row(std::string* out, const char* op, size_t batch, size_t n, const Timing& t) {
  char line[320];
  std::snprintf(line, sizeof line,
                "%s{\"op\": \"%s\", \"batch\": %zu, \"keys\": %zu, \"dim\": 1, \"servers\": 1, \"requests\": %zu, "
                "\"seconds\": %.6f, \"keys_per_s\": %.1f}",
                out->empty() ? "" : ", ", op, batch, n, t.requests, t.seconds, t.keys / t.seconds);
  *out += line;
}

void RunWorker(const Options& o) {
  ps::KVWorker<float> kv(0, 0);
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<float> grad(-1e-3f, 1e-3f);
  std::string rows;
  for (size_t want : o.batches) {
    std::vector<ps::Key> key_vec = RandomKeys(want, &rng);
    size_t n = key_vec.size();
    ps::SArray<ps::Key> keys(key_vec);  // copied once here; every request then sends it as is
    ps::SArray<float> grads(n);
    for (size_t i = 0; i < n; ++i) grads[i] = grad(rng);
    kv.Wait(kv.ZPush(keys, grads));  // the keys exist: steady state, as bench/pushpull.py does
    std::vector<ps::SArray<float>> pulled;  // a buffer of its own for each request in flight
    for (int w = 0; w < o.window; ++w) pulled.emplace_back(n);
    Timing pull = Measure(&kv, [&](size_t i) { return kv.ZPull(keys, &pulled[i % o.window]); }, n, o);
    Timing push = Measure(&kv, [&](size_t) { return kv.ZPush(keys, grads); }, n, o);
    Row(&rows, "pull", want, n, pull);
    Row(&rows, "push", want, n, push);
    std::fprintf(stderr, "ps-lite keys=%zu: pull %.2f M keys/s, push %.2f M keys/s\n", n,
                 pull.keys / pull.seconds / 1e6, push.keys / push.seconds / 1e6);
  }
  std::printf("{\"server\": \"ps-lite KVServerDefaultHandle<float>\", \"pslite_commit\": \"%s\", "
              "\"window\": %d, \"rows\": [%s]}\n",
              PSLITE_COMMIT, o.window, rows.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char* argv[]) {
  Options o = Parse(argc, argv);
  ps::Start(0, argv[0]);
  if (ps::IsServer()) {
    auto server = new ps::KVServer<float>(0);
    server->set_request_handle(ps::KVServerDefaultHandle<float>());
    ps::RegisterExitCallback([server]() { delete server; });
  }
  if (ps::IsWorker()) RunWorker(o);
  ps::Finalize(0, true);
  return 0;
}
