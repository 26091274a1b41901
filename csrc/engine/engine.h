// The batched environment engine: a thread pool stepping chunks of envs, with a Gymnasium-style sync
// API (Reset/Step over all envs, results in env order) and an EnvPool-style async API (Send/Recv, Recv
// returning the first batch_size envs to finish).
//
// All results are written into per-env rows of preallocated buffers; Recv gathers the finished rows
// into preallocated batch buffers. Cheap work is stepped inline on the calling thread (a thread
// hand-off would cost more than the work); expensive work is spread over the threads. Each env
// has a home thread, so that it is stepped by the same thread call after call and its data stays
// in that core's cache; a thread with nothing left of its own takes chunks from the others' (work
// stealing), in chunks sized from a running estimate of the per-env step cost.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/env.h"

namespace onebox {

// NextStep: the step after an episode end resets the env (its action is ignored). SameStep: the
// env resets in the step that ends it. Disabled: an env whose episode ended must be reset by the
// caller (ResetEnvs) before its next step; stepping it throws ResetNeeded.
enum class Autoreset : int { kNextStep = 0, kSameStep = 1, kDisabled = 2 };

// Stepping an env that was never reset, or that ended with autoreset disabled. The bindings map it
// to a subclass of gymnasium.error.ResetNeeded.
struct ResetNeeded : std::logic_error {
  using std::logic_error::logic_error;
};

struct EngineOptions {
  int num_envs = 1;
  int batch_size = 1;
  int num_threads = 1;                // worker threads
  int thread_affinity_offset = -1;    // pin worker k to core offset + k; -1: no pinning
  Autoreset autoreset = Autoreset::kNextStep;
  int64_t max_episode_steps = 0;      // 0: none
  uint64_t seed = 0;
};

// A policy that Engine::Rollout evaluates in C++, one parameter vector per env:
//   hidden == 0:  out = W o + b                      (W: [out, obs], then b: [out])
//   hidden  > 0:  out = W2 tanh(W1 o + b1) + b2      (W1: [hidden, obs], b1, W2: [out, hidden], b2)
// in float64, on o normalized as (o - obs_mean) / obs_std when those are given. A Box action is out
// clipped to the action bounds; a Discrete action is argmax(out) (out has n elements).
struct RolloutPolicy {
  const float* weights = nullptr;    // [num_envs, PolicyParams(hidden)]
  int hidden = 0;
  const double* obs_mean = nullptr;  // [obs size] or null
  const double* obs_std = nullptr;   // [obs size] or null
  int64_t max_steps = 0;             // episode cap; 0: the pool's time limit
  double obs_clip = 0.0;             // clip normalized observations to [-obs_clip, obs_clip]; 0: no
  bool squash = false;               // Box actions: low + (high - low) (tanh(out) + 1) / 2, not clip
  double* obs_sums = nullptr;        // [num_envs, 2, obs size]: sums of o and o^2 seen, or null
};

// A raw byte buffer with the dtype and shape it is exposed as.
struct Buffer {
  std::vector<unsigned char> bytes;
  DType dtype = DType::kFloat64;
  std::vector<size_t> shape;
  void Init(DType d, std::vector<size_t> s) {
    dtype = d;
    shape = std::move(s);
    size_t n = DTypeSize(d);
    for (size_t k : shape) n *= k;
    bytes.assign(n, 0);
  }
  template <class T>
  T* As() { return reinterpret_cast<T*>(bytes.data()); }
};

// The named buffers of one result set (per env, or one recv batch).
struct ResultBuffers {
  Buffer obs, reward, terminated, truncated, info, final_obs, final_info, final, env_id;
};

class Engine {
 public:
  Engine(const EnvSpec& spec, const EngineOptions& opt);
  virtual ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Sync: reset every env (seeds: empty, or one per env) and wait; results in per_env().
  void Reset(const std::vector<uint64_t>& seeds);
  // Sync: reset envs ids[0..n) only (seeds: empty, or one per id) and wait; results in their
  // per_env() rows, the other envs' rows untouched. Needs no async steps pending.
  void ResetEnvs(const int32_t* ids, int n, const std::vector<uint64_t>& seeds);
  // Sync: step every env with actions[num_envs, ...] and wait; results in per_env(), except the
  // observations if `obs` is given: those go to obs[num_envs, ...], written there by envs that can
  // redraw theirs (E::Observe; per_env().obs catches up when a call needs it), else copied. Every
  // env must have been reset once (and, with autoreset disabled, reset after its episode ended).
  void Step(const void* actions, void* obs = nullptr);
  // Async: reset every env; their results come out of Recv.
  void AsyncReset(const std::vector<uint64_t>& seeds);
  // Async: step envs ids[0..n) with actions[n, ...]; returns at once for expensive envs.
  void Send(const void* actions, const int32_t* ids, int n);
  // Async: wait for the first batch_size envs to finish and gather them into batch().
  void Recv();
  void Close();
  // Closed loop: every env runs one whole episode (from a fresh reset) with its own policy
  // parameters, on all threads; results in rollout_returns() and rollout_lengths(). Afterwards
  // each env needs a reset, which its next step does (as after an episode end; with autoreset
  // disabled, ResetEnvs or Reset must).
  void Rollout(const RolloutPolicy& policy, const std::vector<uint64_t>& seeds);
  // Parameters of one rollout policy with `hidden` tanh units (0: linear).
  int64_t PolicyParams(int hidden) const;
  const std::vector<double>& rollout_returns() const { return rollout_return_; }
  const std::vector<int64_t>& rollout_lengths() const { return rollout_length_; }
  // Each env's seed: its episodes' random streams derive from it (and the episode count).
  const std::vector<uint64_t>& seeds() const { return seed_; }

  ResultBuffers& per_env() { return per_env_; }
  ResultBuffers& batch() { return batch_; }
  const EnvSpec& spec() const { return spec_; }
  const EngineOptions& options() const { return opt_; }
  bool closed() const { return closed_; }
  int pending() const { return inflight_count_; }
  // Estimated cost of one env step in nanoseconds (drives chunking).
  double step_cost_ns() const { return cost_ns_.load(std::memory_order_relaxed); }

  virtual std::vector<double> GetState(int env_id) const = 0;
  virtual void SetState(int env_id, const std::vector<double>& state) = 0;

 protected:
  enum Op : uint8_t { kStep = 0, kReset = 1, kRollout = 2 };
  // needs_reset_[i]: running, ended (the next step resets it, unless autoreset is disabled), or
  // never reset (stepping it throws ResetNeeded).
  enum Status : uint8_t { kRunning = 0, kEnded = 1, kUnstarted = 2 };
  // Run one chunk of envs (each doing op_[id]) and write their per-env rows (the observations
  // into obs_rows_).
  virtual void RunChunk(const int32_t* ids, int n) = 0;
  // Whether the envs can redraw their observations (E::Observe), and redrawing them all into
  // per_env_.obs.
  virtual bool Observes() const = 0;
  virtual void ObserveAll() = 0;
  // Bring per_env_.obs up to date if a Step wrote the observations elsewhere since.
  void RefreshObs();

  // Per-env bookkeeping shared with EngineT.
  EnvSpec spec_;
  EngineOptions opt_;
  size_t obs_size_, act_size_, info_size_;  // elements per env
  ResultBuffers per_env_, batch_;
  unsigned char* obs_rows_;  // the observations' rows: per_env_.obs, or Step's `obs` during it
  bool obs_stale_ = false;   // per_env_.obs may be behind the envs (see RefreshObs)
  Buffer actions_;
  std::vector<Rng> rng_;
  std::vector<uint64_t> seed_, episode_;
  std::vector<int64_t> elapsed_;
  std::vector<uint8_t> op_, needs_reset_;
  RolloutPolicy rollout_;  // set by Rollout for its duration
  size_t policy_out_;      // policy outputs: action elements, or n for Discrete
  std::vector<double> rollout_return_;
  std::vector<int64_t> rollout_length_;

 private:
  void CheckUsable();
  void ValidateIds(const int32_t* ids, int n, const char* call);
  void CheckStepable(const int32_t* ids, int n) const;  // throws ResetNeeded
  void ValidateActions(const void* actions, const int32_t* ids, int n) const;
  void ApplySeeds(const std::vector<uint64_t>& seeds);
  // `episodes`: each env is a whole rollout, one env per chunk, always spread over the threads.
  void Dispatch(const int32_t* ids, int n, bool caller_helps, bool episodes = false);
  void Execute(const int32_t* ids, int n);
  // With mu_ held: pop a chunk for `slot` (0: the caller, k: worker k-1) into out, from its own
  // queue, else from the back of the fullest other queue; `oldest`: from the front of the queue
  // whose first env was queued longest ago. Returns the chunk's size (0: none left).
  int PopChunkLocked(int slot, int32_t* out, bool oldest = false);
  // The calling thread steps one pending chunk (`oldest`: as PopChunkLocked); false if none was.
  bool HelpOnce(bool oldest = false);
  void WaitDone(int count);  // wait for `count` completions, then empty the done ring
  // Wait (polling for `spin`, then asleep) for `count` completions; returns with done_mu_ held.
  std::unique_lock<std::mutex> WaitDoneLocked(int count, std::chrono::microseconds spin);
  void WorkerLoop(int k);

  std::vector<int32_t> all_ids_;       // 0..num_envs-1
  std::vector<uint8_t> inflight_;      // sent and not yet received
  std::vector<uint32_t> mark_;         // repeated-id detection
  uint32_t mark_gen_ = 0;
  int inflight_count_ = 0;
  bool closed_ = false;
  std::mutex api_mu_;                  // one API call at a time

  // Pending env ids: one FIFO queue per slot (slot 0: the calling thread, slot k: worker k-1), each
  // env in its home slot's queue. Sync calls use slots 0..num_threads-1 (the caller and all workers
  // but the last), async sends slots 1..num_threads (the workers; the caller helps in recv).
  struct Queue {
    std::vector<int32_t> ids;  // a ring
    size_t head = 0, count = 0;
  };
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::vector<Queue> queues_;
  std::vector<uint64_t> queued_at_;  // per env: when it was last queued (a count of queued envs)
  uint64_t queue_clock_ = 0;
  std::atomic<int> pending_count_{0};  // in all queues
  int chunk_size_ = 1;
  std::vector<uint8_t> asleep_;        // per worker, under mu_
  std::atomic<int> workers_in_call_{0};  // workers 0..this-1 take part in the current call
  std::atomic<bool> sync_call_{false};   // the current call is sync (the caller steps too)
  std::atomic<bool> stop_{false};  // set under mu_; read lock-free while spinning

  // Completed env ids, in completion order.
  std::mutex done_mu_;
  std::condition_variable done_cv_;
  std::vector<int32_t> done_;
  size_t done_head_ = 0, done_tail_ = 0;
  std::atomic<int> done_count_{0};
  int done_waiters_ = 0;
  std::string error_;
  std::atomic<bool> failed_{false};

  std::atomic<double> cost_ns_{1000.0};
  std::vector<std::thread> workers_;
  std::vector<std::vector<int32_t>> scratch_;  // one id buffer per worker, one for the caller
};

namespace detail {
// sum_j w[j] * x[j] in float64 over float32 weights, in four interleaved partial sums: independent
// chains of additions (four times the throughput of one), which the compiler also vectorizes.
inline double Dot(const float* w, const double* x, size_t n) {
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  size_t j = 0;
  for (; j + 4 <= n; j += 4)
    for (size_t l = 0; l < 4; ++l) s[l] += static_cast<double>(w[j + l]) * x[j + l];
  for (; j < n; ++j) s[j % 4] += static_cast<double>(w[j]) * x[j];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

template <class E, class = void>
struct HasState : std::false_type {};
template <class E>
struct HasState<E, std::void_t<decltype(std::declval<const E&>().GetState()),
                               decltype(std::declval<E&>().SetState(std::vector<double>()))>>
    : std::true_type {};

template <class E, class = void>
struct HasObserve : std::false_type {};
template <class E>
struct HasObserve<E, std::void_t<decltype(std::declval<const E&>().Observe(
                         std::declval<typename E::Obs*>()))>> : std::true_type {};

template <class E, class = void>
struct HasSeed : std::false_type {};
template <class E>
struct HasSeed<E, std::void_t<decltype(std::declval<E&>().Seed(uint64_t{0}))>> : std::true_type {};
}  // namespace detail

// The engine for one env type: the inner loop over a chunk is inlined, with no virtual call per env.
template <class E>
class EngineT final : public Engine {
  using Obs = typename E::Obs;
  using Act = typename E::Act;

 public:
  EngineT(const Config& cfg, const EnvSpec& spec, const EngineOptions& opt) : Engine(spec, opt) {
    envs_.reserve(opt.num_envs);
    for (int i = 0; i < opt.num_envs; ++i) envs_.emplace_back(cfg);
  }
  // Stop the workers before envs_ is destroyed: they may still be stepping them.
  ~EngineT() override { Close(); }

  std::vector<double> GetState(int env_id) const override {
    if constexpr (detail::HasState<E>::value) return envs_.at(env_id).GetState();
    else throw std::logic_error("this env does not expose its state");
  }
  void SetState(int env_id, const std::vector<double>& state) override {
    if constexpr (detail::HasState<E>::value) {
      RefreshObs();  // the observation stays the one of the state before
      envs_.at(env_id).SetState(state);
    } else {
      throw std::logic_error("this env does not expose its state");
    }
  }

 protected:
  bool Observes() const override { return detail::HasObserve<E>::value; }
  void ObserveAll() override {
    if constexpr (detail::HasObserve<E>::value) {
      Obs* obs = per_env_.obs.As<Obs>();
      for (size_t i = 0; i < envs_.size(); ++i) envs_[i].Observe(obs + i * obs_size_);
    } else {
      throw std::logic_error("this env cannot redraw its observation");
    }
  }

  void RunChunk(const int32_t* ids, int n) override {
    Obs* obs = reinterpret_cast<Obs*>(obs_rows_);
    double* reward = per_env_.reward.As<double>();
    uint8_t* term = per_env_.terminated.As<uint8_t>();
    uint8_t* trunc = per_env_.truncated.As<uint8_t>();
    uint8_t* fin = per_env_.final.As<uint8_t>();
    double* info = per_env_.info.As<double>();
    const Act* act = actions_.As<Act>();
    const bool same_step = opt_.autoreset == Autoreset::kSameStep;
    const int64_t limit = opt_.max_episode_steps;
    for (int k = 0; k < n; ++k) {
      const int i = ids[k];
      Obs* o = obs + i * obs_size_;
      double* inf = info + i * info_size_;
      fin[i] = 0;
      if (op_[i] == kRollout) {
        RunEpisode(i, o, inf);
        continue;
      }
      if (op_[i] == kReset || needs_reset_[i] == kEnded) {
        DoReset(i, o, inf);
        reward[i] = 0.0;
        term[i] = trunc[i] = 0;
        continue;
      }
      if (info_size_) std::memset(inf, 0, info_size_ * sizeof(double));
      const StepResult r = envs_[i].Step(act + i * act_size_, rng_[i], o, inf);
      const bool tr = ++elapsed_[i] >= limit && limit > 0;
      reward[i] = r.reward;
      term[i] = r.terminated;
      trunc[i] = tr;
      if (r.terminated || tr) {
        if (same_step) {
          fin[i] = 1;
          std::memcpy(per_env_.final_obs.As<Obs>() + i * obs_size_, o, obs_size_ * sizeof(Obs));
          if (info_size_)
            std::memcpy(per_env_.final_info.As<double>() + i * info_size_, inf,
                        info_size_ * sizeof(double));
          DoReset(i, o, inf);
        } else {
          needs_reset_[i] = kEnded;
        }
      }
    }
  }

 private:
  void DoReset(int i, Obs* o, double* inf) {
    if constexpr (detail::HasSeed<E>::value)
      if (episode_[i] == 0) envs_[i].Seed(seed_[i]);
    rng_[i].Seed(seed_[i], episode_[i]++);
    elapsed_[i] = 0;
    needs_reset_[i] = kRunning;
    if (info_size_) std::memset(inf, 0, info_size_ * sizeof(double));
    envs_[i].Reset(rng_[i], o, inf);
  }

  void RunEpisode(int i, Obs* o, double* inf) {
    const RolloutPolicy& p = rollout_;
    const float* w = p.weights + i * PolicyParams(p.hidden);
    std::vector<double> x(obs_size_), h(p.hidden), out(policy_out_);
    std::vector<Act> act(act_size_);
    const int64_t limit = p.max_steps > 0 ? p.max_steps : opt_.max_episode_steps;
    double ret = 0.0;
    int64_t len = 0;
    DoReset(i, o, inf);
    double* sums = p.obs_sums ? p.obs_sums + static_cast<size_t>(i) * 2 * obs_size_ : nullptr;
    while (len < limit) {
      if (sums)
        for (size_t j = 0; j < obs_size_; ++j) {
          const double v = static_cast<double>(o[j]);
          sums[j] += v;
          sums[obs_size_ + j] += v * v;
        }
      if (!Policy(w, o, x.data(), h.data(), out.data(), act.data())) {
        ret = std::numeric_limits<double>::quiet_NaN();  // NaN policy output: no valid action
        break;
      }
      if (info_size_) std::memset(inf, 0, info_size_ * sizeof(double));
      const StepResult r = envs_[i].Step(act.data(), rng_[i], o, inf);
      ++len;
      ret += r.reward;
      if (r.terminated) break;
    }
    elapsed_[i] = len;
    needs_reset_[i] = kEnded;
    rollout_return_[i] = ret;
    rollout_length_[i] = len;
  }

  // The action of the policy with parameters w for observation o; false if an output is NaN.
  bool Policy(const float* w, const Obs* o, double* x, double* h, double* out, Act* act) const {
    const RolloutPolicy& p = rollout_;
    const size_t no = obs_size_, nh = static_cast<size_t>(p.hidden), na = policy_out_;
    for (size_t j = 0; j < no; ++j) x[j] = static_cast<double>(o[j]);
    if (p.obs_mean)
      for (size_t j = 0; j < no; ++j) x[j] = (x[j] - p.obs_mean[j]) / p.obs_std[j];
    if (p.obs_clip > 0)
      for (size_t j = 0; j < no; ++j) x[j] = std::min(std::max(x[j], -p.obs_clip), p.obs_clip);
    const double* in = x;
    size_t nin = no;
    if (nh) {
      for (size_t k = 0; k < nh; ++k)
        h[k] = std::tanh(detail::Dot(w + k * no, x, no) + static_cast<double>(w[nh * no + k]));
      w += nh * no + nh;
      in = h;
      nin = nh;
    }
    for (size_t a = 0; a < na; ++a) {
      out[a] = detail::Dot(w + a * nin, in, nin) + static_cast<double>(w[na * nin + a]);
      if (std::isnan(out[a])) return false;
    }
    if constexpr (std::is_integral_v<Act>) {
      size_t best = 0;
      for (size_t a = 1; a < na; ++a)
        if (out[a] > out[best]) best = a;
      act[0] = static_cast<Act>(best);
    } else {
      const Space& s = spec_.action;
      for (size_t a = 0; a < na; ++a)
        act[a] = static_cast<Act>(
            p.squash ? (s.high[a] + s.low[a]) / 2 + (s.high[a] - s.low[a]) / 2 * std::tanh(out[a])
                     : std::min(std::max(out[a], s.low[a]), s.high[a]));
    }
    return true;
  }

  std::vector<E> envs_;
};

}  // namespace onebox
