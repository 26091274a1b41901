#include "engine/engine.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>

namespace onebox {
namespace {

// A sync call with less estimated work than this runs inline: handing it out costs more.
constexpr double kInlineNs = 40e3;
// An async send with less work than this runs inline; more goes to the workers, to overlap
// with the caller's own work until recv.
constexpr double kAsyncInlineNs = 2e3;
// Target work per chunk when the work is spread over the workers.
constexpr double kChunkNs = 100e3;
// How long an idle thread polls for new work or results before it sleeps. In sync calls the
// stepping threads are exactly num_threads (the caller and one worker fewer), so a poll uses a
// core nothing else of ours needs, and it spans the caller's Python work between two steps. In
// async use the workers and the caller are one thread more than that: a poll would take a core
// from a thread that steps, so it is short.
constexpr auto kSpinSync = std::chrono::microseconds(200);
constexpr auto kSpinAsync = std::chrono::microseconds(30);

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Poll `ready` for up to `spin`; true if it became true.
template <class F>
bool Spin(F ready, std::chrono::microseconds spin) {
  const auto until = std::chrono::steady_clock::now() + spin;
  for (int k = 0;; ++k) {
    if (ready()) return true;
    if ((k & 63) == 63) {
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::yield();
    }
    CpuRelax();
  }
}

std::vector<size_t> RowShape(size_t rows, const std::vector<int64_t>& shape) {
  std::vector<size_t> s{rows};
  for (int64_t d : shape) s.push_back(static_cast<size_t>(d));
  return s;
}

void InitResults(ResultBuffers* r, size_t rows, const EnvSpec& spec) {
  const Space& o = spec.observation;
  const size_t k = spec.info_keys.size();
  r->obs.Init(o.dtype, RowShape(rows, o.shape));
  r->final_obs.Init(o.dtype, RowShape(rows, o.shape));
  r->reward.Init(DType::kFloat64, {rows});
  r->terminated.Init(DType::kBool, {rows});
  r->truncated.Init(DType::kBool, {rows});
  r->final.Init(DType::kBool, {rows});
  r->info.Init(DType::kFloat64, {rows, k});
  r->final_info.Init(DType::kFloat64, {rows, k});
  r->env_id.Init(DType::kInt32, {rows});
}

template <class T>
void GatherT(const T* from, T* to, const int32_t* ids, int b) {
  for (int k = 0; k < b; ++k) to[k] = from[ids[k]];
}

// to[k] = from[ids[k]] for whole rows; `only` (optional) selects the rows to copy.
void Gather(const Buffer& from, Buffer& to, const int32_t* ids, int b, const uint8_t* only = nullptr) {
  const size_t row = from.bytes.size() / from.shape[0];
  const unsigned char* src = from.bytes.data();
  unsigned char* dst = to.bytes.data();
  if (row == 0) return;
  if (!only && row == 1) return GatherT(src, dst, ids, b);
  if (!only && row == 8)
    return GatherT(reinterpret_cast<const uint64_t*>(src), reinterpret_cast<uint64_t*>(dst), ids, b);
  for (int k = 0; k < b; ++k)
    if (!only || only[ids[k]]) std::memcpy(dst + k * row, src + ids[k] * row, row);
}

inline size_t Next(size_t i, size_t cap) { return ++i == cap ? 0 : i; }

}  // namespace

Engine::Engine(const EnvSpec& spec, const EngineOptions& opt) : spec_(spec), opt_(opt) {
  const int n = opt.num_envs;
  if (n <= 0) throw std::invalid_argument("num_envs must be positive");
  if (opt.batch_size <= 0 || opt.batch_size > n)
    throw std::invalid_argument("batch_size must be in [1, num_envs]");
  if (opt.num_threads < 0) throw std::invalid_argument("num_threads must be >= 0");
  obs_size_ = static_cast<size_t>(spec.observation.Size());
  act_size_ = static_cast<size_t>(spec.action.discrete ? 1 : spec.action.Size());
  info_size_ = spec.info_keys.size();
  InitResults(&per_env_, n, spec);
  obs_rows_ = per_env_.obs.bytes.data();
  InitResults(&batch_, opt.batch_size, spec);
  actions_.Init(spec.action.dtype,
                RowShape(n, spec.action.discrete ? std::vector<int64_t>{} : spec.action.shape));
  policy_out_ = static_cast<size_t>(spec.action.discrete ? spec.action.n : spec.action.Size());
  rollout_return_.assign(n, 0.0);
  rollout_length_.assign(n, 0);
  rng_.resize(n);
  seed_.resize(n);
  episode_.assign(n, 0);
  elapsed_.assign(n, 0);
  op_.assign(n, kReset);
  needs_reset_.assign(n, kUnstarted);
  inflight_.assign(n, 0);
  mark_.assign(n, 0);
  all_ids_.resize(n);
  // A queue holds only its home block of env ids (an env is pending at most once, and sync and
  // async work never overlap): at most ceil(num_envs / num_threads) of them.
  const int blocks = std::max(opt.num_threads, 1);
  queues_.resize(opt.num_threads + 1);
  queued_at_.assign(opt.num_envs, 0);
  for (Queue& q : queues_) q.ids.resize((n + blocks - 1) / blocks);
  asleep_.assign(opt.num_threads, 0);
  done_.resize(n);
  for (int i = 0; i < n; ++i) {
    all_ids_[i] = i;
    seed_[i] = opt.seed + static_cast<uint64_t>(i);
    per_env_.env_id.As<int32_t>()[i] = i;
  }
  scratch_.assign(opt.num_threads + 1, std::vector<int32_t>(n));
  for (int k = 0; k < opt.num_threads; ++k) workers_.emplace_back([this, k] { WorkerLoop(k); });
}

Engine::~Engine() { Close(); }

void Engine::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
  closed_ = true;
}

void Engine::CheckUsable() {
  if (closed_) throw std::logic_error("the env pool is closed; make a new one");
  if (failed_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(done_mu_);
    throw std::runtime_error("an env raised an error and the pool is unusable: " + error_);
  }
}

void Engine::ApplySeeds(const std::vector<uint64_t>& seeds) {
  if (seeds.empty()) return;
  if (seeds.size() != seed_.size())
    throw std::invalid_argument("expected " + std::to_string(seed_.size()) + " seeds, got " +
                                std::to_string(seeds.size()));
  seed_ = seeds;
  std::fill(episode_.begin(), episode_.end(), 0);
}

void Engine::ValidateIds(const int32_t* ids, int n, const char* call) {
  if (n <= 0) throw std::invalid_argument(std::string(call) + " needs at least one env id");
  if (++mark_gen_ == 0) {  // wrapped: clear stale marks
    std::fill(mark_.begin(), mark_.end(), 0);
    mark_gen_ = 1;
  }
  for (int k = 0; k < n; ++k) {
    const int32_t id = ids[k];
    if (id < 0 || id >= opt_.num_envs)
      throw std::invalid_argument("env id " + std::to_string(id) + " is out of range [0, " +
                                  std::to_string(opt_.num_envs) + ")");
    if (mark_[id] == mark_gen_)
      throw std::invalid_argument("env id " + std::to_string(id) + " appears twice in one " +
                                  call);
    mark_[id] = mark_gen_;
    if (inflight_[id])
      throw std::invalid_argument("env id " + std::to_string(id) +
                                  " was already sent and not yet received; recv() it first");
  }
}

void Engine::CheckStepable(const int32_t* ids, int n) const {
  const uint8_t worst = opt_.autoreset == Autoreset::kDisabled ? kRunning : kEnded;
  for (int k = 0; k < n; ++k) {
    const uint8_t s = needs_reset_[ids[k]];
    if (s <= worst) continue;
    const std::string env = "env " + std::to_string(ids[k]);
    if (s == kUnstarted)
      throw ResetNeeded(env + " was never reset: call reset() (or async_reset()) before step() "
                              "or send()");
    throw ResetNeeded(env + "'s episode has ended and autoreset is disabled: reset it first with "
                            "reset(options={\"reset_mask\": mask})");
  }
}

void Engine::ValidateActions(const void* actions, const int32_t* ids, int n) const {
  const Space& a = spec_.action;
  if (a.discrete) {
    const int64_t* v = static_cast<const int64_t*>(actions);
    for (int k = 0; k < n; ++k)
      if (v[k] < 0 || v[k] >= a.n)
        throw std::invalid_argument("action " + std::to_string(v[k]) + " for env " +
                                    std::to_string(ids[k]) + " is out of range: Discrete(" +
                                    std::to_string(a.n) + ") takes 0.." + std::to_string(a.n - 1));
  } else if (a.dtype == DType::kFloat32) {
    const float* v = static_cast<const float*>(actions);
    for (size_t j = 0; j < static_cast<size_t>(n) * act_size_; ++j)
      if (std::isnan(v[j]))
        throw std::invalid_argument("action for env " + std::to_string(ids[j / act_size_]) +
                                    " contains NaN; NaN actions are rejected (finite values "
                                    "outside the bounds are clipped by the env)");
  }
}

void Engine::Reset(const std::vector<uint64_t>& seeds) {
  std::lock_guard<std::mutex> api(api_mu_);
  CheckUsable();
  if (inflight_count_) {  // drop outstanding async work: a reset starts everything anew
    WaitDone(inflight_count_);
    std::fill(inflight_.begin(), inflight_.end(), 0);
    inflight_count_ = 0;
  }
  ApplySeeds(seeds);
  std::fill(op_.begin(), op_.end(), kReset);
  Dispatch(all_ids_.data(), opt_.num_envs, true);
  WaitDone(opt_.num_envs);
  CheckUsable();
}

void Engine::ResetEnvs(const int32_t* ids, int n, const std::vector<uint64_t>& seeds) {
  std::lock_guard<std::mutex> api(api_mu_);
  CheckUsable();
  if (inflight_count_)
    throw std::logic_error(std::to_string(inflight_count_) +
                           " envs have async steps pending; recv() them, or reset() every env");
  ValidateIds(ids, n, "reset");
  if (!seeds.empty() && seeds.size() != static_cast<size_t>(n))
    throw std::invalid_argument("expected " + std::to_string(n) + " seeds, got " +
                                std::to_string(seeds.size()));
  for (int k = 0; k < n; ++k) {
    if (!seeds.empty()) {
      seed_[ids[k]] = seeds[k];
      episode_[ids[k]] = 0;
    }
    op_[ids[k]] = kReset;
  }
  RefreshObs();  // the other envs' rows are part of the result
  Dispatch(ids, n, true);
  WaitDone(n);
  CheckUsable();
}

void Engine::Step(const void* actions, void* obs) {
  std::lock_guard<std::mutex> api(api_mu_);
  CheckUsable();
  if (inflight_count_)
    throw std::logic_error(std::to_string(inflight_count_) +
                           " envs have async steps pending; recv() them or reset() before step()");
  CheckStepable(all_ids_.data(), opt_.num_envs);
  ValidateActions(actions, all_ids_.data(), opt_.num_envs);
  std::memcpy(actions_.bytes.data(), actions, actions_.bytes.size());
  std::fill(op_.begin(), op_.end(), kStep);
  // Every env writes its row (a step or a reset): straight into `obs` if the envs can redraw
  // theirs later, when per_env_.obs is needed (RefreshObs).
  const bool direct = obs && Observes();
  if (direct) obs_rows_ = static_cast<unsigned char*>(obs);
  Dispatch(all_ids_.data(), opt_.num_envs, true);
  WaitDone(opt_.num_envs);
  obs_rows_ = per_env_.obs.bytes.data();
  obs_stale_ = direct;
  CheckUsable();
  if (obs && !direct) std::memcpy(obs, obs_rows_, per_env_.obs.bytes.size());
}

void Engine::RefreshObs() {
  if (!obs_stale_) return;
  ObserveAll();
  obs_stale_ = false;
}

int64_t Engine::PolicyParams(int hidden) const {
  const int64_t no = static_cast<int64_t>(obs_size_), na = static_cast<int64_t>(policy_out_);
  return hidden > 0 ? hidden * (no + 1) + na * (hidden + 1) : na * (no + 1);
}

void Engine::Rollout(const RolloutPolicy& policy, const std::vector<uint64_t>& seeds) {
  std::lock_guard<std::mutex> api(api_mu_);
  CheckUsable();
  if (inflight_count_)
    throw std::logic_error(std::to_string(inflight_count_) +
                           " envs have async steps pending; recv() them or reset() before rollout()");
  if (!policy.weights || policy.hidden < 0 || (!policy.obs_mean != !policy.obs_std))
    throw std::invalid_argument("rollout: bad policy (weights, hidden >= 0, mean and std together)");
  if (policy.max_steps <= 0 && opt_.max_episode_steps <= 0)
    throw std::invalid_argument(
        "rollout needs an episode cap: the pool has no time limit, so pass max_steps > 0");
  ApplySeeds(seeds);
  rollout_ = policy;
  std::fill(op_.begin(), op_.end(), kRollout);
  Dispatch(all_ids_.data(), opt_.num_envs, true, true);
  WaitDone(opt_.num_envs);
  rollout_ = RolloutPolicy();
  CheckUsable();
}

void Engine::AsyncReset(const std::vector<uint64_t>& seeds) {
  std::lock_guard<std::mutex> api(api_mu_);
  CheckUsable();
  if (inflight_count_) WaitDone(inflight_count_);
  ApplySeeds(seeds);
  std::fill(op_.begin(), op_.end(), kReset);
  std::fill(inflight_.begin(), inflight_.end(), 1);
  inflight_count_ = opt_.num_envs;
  Dispatch(all_ids_.data(), opt_.num_envs, false);
}

void Engine::Send(const void* actions, const int32_t* ids, int n) {
  std::lock_guard<std::mutex> api(api_mu_);
  CheckUsable();
  ValidateIds(ids, n, "send()");
  CheckStepable(ids, n);
  ValidateActions(actions, ids, n);
  const size_t row = actions_.bytes.size() / opt_.num_envs;
  const unsigned char* src = static_cast<const unsigned char*>(actions);
  for (int k = 0; k < n; ++k) {
    std::memcpy(actions_.bytes.data() + ids[k] * row, src + k * row, row);
    op_[ids[k]] = kStep;
    inflight_[ids[k]] = 1;
  }
  inflight_count_ += n;
  Dispatch(ids, n, false);
}

void Engine::Recv() {
  std::lock_guard<std::mutex> api(api_mu_);
  CheckUsable();
  const int b = opt_.batch_size;
  if (inflight_count_ == 0)
    throw std::logic_error("recv() with nothing pending; call send() or async_reset() first");
  if (inflight_count_ < b)
    throw std::logic_error("recv() would wait forever: " + std::to_string(inflight_count_) +
                           " envs are pending but batch_size is " + std::to_string(b) +
                           "; send() more envs first");
  int32_t* ids = batch_.env_id.As<int32_t>();
  // The caller would only wait: it steps pending envs itself until the batch is complete, oldest
  // first, so that an env whose worker is slow to wake is not passed over call after call.
  while (done_count_.load(std::memory_order_acquire) < b && HelpOnce(true)) {
  }
  {
    std::unique_lock<std::mutex> lock = WaitDoneLocked(b, kSpinAsync);
    if (!error_.empty()) throw std::runtime_error("an env raised an error: " + error_);
    const size_t cap = done_.size();
    for (int k = 0; k < b; ++k) {
      ids[k] = done_[done_tail_];
      done_tail_ = Next(done_tail_, cap);
    }
    done_count_.fetch_sub(b, std::memory_order_relaxed);
  }
  Gather(per_env_.obs, batch_.obs, ids, b);
  Gather(per_env_.reward, batch_.reward, ids, b);
  Gather(per_env_.terminated, batch_.terminated, ids, b);
  Gather(per_env_.truncated, batch_.truncated, ids, b);
  Gather(per_env_.info, batch_.info, ids, b);
  Gather(per_env_.final, batch_.final, ids, b);
  if (opt_.autoreset == Autoreset::kSameStep) {
    const uint8_t* fin = per_env_.final.As<uint8_t>();
    Gather(per_env_.final_obs, batch_.final_obs, ids, b, fin);
    Gather(per_env_.final_info, batch_.final_info, ids, b, fin);
  }
  for (int k = 0; k < b; ++k) inflight_[ids[k]] = 0;
  inflight_count_ -= b;
}

void Engine::Dispatch(const int32_t* ids, int n, bool caller_helps, bool episodes) {
  // num_threads threads step envs at once: the workers, or the caller and one worker fewer.
  const int threads = static_cast<int>(workers_.size());
  const int helpers = threads - (caller_helps ? 1 : 0);
  const double cost = cost_ns_.load(std::memory_order_relaxed);
  // Cheap work runs inline, unless envs sent earlier still wait in the queues: they go first.
  const bool cheap = !episodes && n * cost < (caller_helps ? kInlineNs : kAsyncInlineNs);
  if (helpers <= 0 || (cheap && pending_count_.load(std::memory_order_acquire) == 0)) {
    Execute(ids, n);
    return;
  }
  // Home slots: sync calls split the envs over slots 0..threads-1 (the caller first), sends over
  // the workers' slots 1..threads, in contiguous blocks of env ids.
  const int first = caller_helps ? 0 : 1;
  const int64_t envs = opt_.num_envs;
  // Chunks of about kChunkNs of work (one env when an env costs more), so that the threads finish
  // together; at most one home block's share.
  const int share = (n + threads - 1) / threads;
  const int chunk = episodes ? 1
                             : static_cast<int>(std::clamp(kChunkNs / std::max(cost, 1.0), 1.0,
                                                           static_cast<double>(share)));
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    chunk_size_ = chunk;
    for (int k = 0; k < n; ++k) {
      Queue& q = queues_[first + static_cast<int>(static_cast<int64_t>(ids[k]) * threads / envs)];
      const size_t cap = q.ids.size();
      size_t at = q.head + q.count;
      q.ids[at >= cap ? at - cap : at] = ids[k];
      ++q.count;
      queued_at_[ids[k]] = queue_clock_++;
    }
    workers_in_call_.store(helpers, std::memory_order_relaxed);
    sync_call_.store(caller_helps, std::memory_order_relaxed);
    pending_count_.fetch_add(n, std::memory_order_release);
    for (int k = 0; k < helpers; ++k) wake |= asleep_[k] != 0;
  }
  if (wake) work_cv_.notify_all();
  if (caller_helps)
    while (HelpOnce()) {
    }
}

bool Engine::HelpOnce(bool oldest) {
  int32_t* local = scratch_.back().data();
  int k;
  {
    std::lock_guard<std::mutex> lock(mu_);
    k = PopChunkLocked(0, local, oldest);
  }
  if (k) Execute(local, k);
  return k > 0;
}

int Engine::PopChunkLocked(int slot, int32_t* out, bool oldest) {
  if (pending_count_.load(std::memory_order_relaxed) == 0) return 0;
  Queue* q = &queues_[slot];
  bool front = q->count > 0;
  if (oldest) {  // the queue whose first env has waited longest
    q = nullptr;
    for (Queue& other : queues_)
      if (other.count &&
          (!q || queued_at_[other.ids[other.head]] < queued_at_[q->ids[q->head]]))
        q = &other;
    front = true;
  } else if (!front) {  // steal from the fullest queue
    for (Queue& other : queues_)
      if (other.count > q->count) q = &other;
  }
  const int n = static_cast<int>(std::min<size_t>(chunk_size_, q->count));
  const size_t cap = q->ids.size();
  // The owner takes from the front; a thief from the back (what the owner would step last).
  size_t at = front ? q->head : q->head + q->count - n;
  for (int j = 0; j < n; ++j, ++at) out[j] = q->ids[at % cap];
  if (front) q->head = (q->head + n) % cap;
  q->count -= n;
  pending_count_.fetch_sub(n, std::memory_order_relaxed);
  return n;
}

void Engine::Execute(const int32_t* ids, int n) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string err;
  try {
    RunChunk(ids, n);
  } catch (const std::exception& e) {
    err = e.what();
  }
  if (op_[ids[0]] != kRollout) {  // a rollout chunk is whole episodes, not one step per env
    const double dt =
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    const double old = cost_ns_.load(std::memory_order_relaxed);
    cost_ns_.store(0.8 * old + 0.2 * dt / n, std::memory_order_relaxed);
  }
  bool wake;
  {
    std::lock_guard<std::mutex> lock(done_mu_);
    if (!err.empty() && error_.empty()) {
      error_ = err;
      failed_.store(true, std::memory_order_release);
    }
    const size_t cap = done_.size();
    for (int k = 0; k < n; ++k) {
      done_[done_head_] = ids[k];
      done_head_ = Next(done_head_, cap);
    }
    done_count_.fetch_add(n, std::memory_order_release);
    wake = done_waiters_ > 0;
  }
  if (wake) done_cv_.notify_all();
}

std::unique_lock<std::mutex> Engine::WaitDoneLocked(int count, std::chrono::microseconds spin) {
  // A chunk that fails still reports its ids, so every dispatched env is eventually counted.
  auto ready = [&] { return done_count_.load(std::memory_order_acquire) >= count; };
  Spin(ready, spin);
  std::unique_lock<std::mutex> lock(done_mu_);
  if (!ready()) {
    ++done_waiters_;
    done_cv_.wait(lock, ready);
    --done_waiters_;
  }
  return lock;
}

void Engine::WaitDone(int count) {
  std::unique_lock<std::mutex> lock = WaitDoneLocked(count, kSpinSync);
  done_head_ = done_tail_ = 0;
  done_count_.store(0, std::memory_order_relaxed);
}

void Engine::WorkerLoop(int k) {
  if (opt_.thread_affinity_offset >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    const unsigned ncpu = std::max(1u, std::thread::hardware_concurrency());
    CPU_SET((opt_.thread_affinity_offset + k) % ncpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  }
  int32_t* local = scratch_[k].data();
  // Work for this worker: pending envs, in a call this worker takes part in.
  auto has_work = [&] {
    return pending_count_.load(std::memory_order_acquire) > 0 &&
           k < workers_in_call_.load(std::memory_order_relaxed);
  };
  while (true) {
    const bool sync = sync_call_.load(std::memory_order_relaxed);
    Spin([&] { return has_work() || stop_.load(std::memory_order_relaxed); },
         sync ? kSpinSync : kSpinAsync);
    int n;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!stop_ && !has_work()) {
        asleep_[k] = 1;
        work_cv_.wait(lock, [&] { return stop_ || has_work(); });
        asleep_[k] = 0;
      }
      if (stop_) return;
      n = PopChunkLocked(k + 1, local);
    }
    if (n) Execute(local, n);
  }
}

}  // namespace onebox
