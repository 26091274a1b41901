// The native environment interface: what one C++ env file provides.
//
// An env is a plain struct E with
//   using Obs = float | double | uint8_t;          // observation element type
//   using Act = int64_t (Discrete) | float (Box);  // action element type
//   static std::vector<OptionDecl> Options();      // constructor options with defaults and docs
//   static EnvSpec Spec(const Config& cfg);        // spaces, time limit, info keys
//   explicit E(const Config& cfg);
//   void Reset(Rng& rng, Obs* obs, double* info);
//   StepResult Step(const Act* action, Rng& rng, Obs* obs, double* info);
// and optionally, for golden tests and debugging,
//   std::vector<double> GetState() const;  void SetState(const std::vector<double>&);
// and, for an env whose observation is a function of its state, void Observe(Obs* obs) const:
// write the observation of the current state (what the last Reset or Step wrote), so that the
// engine can have Step write the observations straight into the caller's array (see
// Engine::Step); and, for an env that keeps its own random stream across episodes (as the reference it mirrors
// does), void Seed(uint64_t seed): called before the first reset after the env's seed is set (at
// pool creation and at reset with seeds); later resets continue the stream.
// Reset and Step write into preallocated rows (obs: Spec().observation.Size() elements, info:
// Spec().info_keys.size() doubles, zeroed before each call). The engine owns time limits,
// autoreset, seeding and threading. Register with ONEBOX_REGISTER_ENV(E, "Name-v0").
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace onebox {

enum class DType : int { kBool = 0, kUInt8 = 1, kInt32 = 2, kInt64 = 3, kFloat32 = 4, kFloat64 = 5 };

template <class T>
constexpr DType DTypeOf() {
  if constexpr (std::is_same_v<T, uint8_t>) return DType::kUInt8;
  else if constexpr (std::is_same_v<T, int32_t>) return DType::kInt32;
  else if constexpr (std::is_same_v<T, int64_t>) return DType::kInt64;
  else if constexpr (std::is_same_v<T, float>) return DType::kFloat32;
  else if constexpr (std::is_same_v<T, double>) return DType::kFloat64;
  else static_assert(sizeof(T) == 0, "unsupported element type");
}

inline size_t DTypeSize(DType d) {
  switch (d) {
    case DType::kBool:
    case DType::kUInt8: return 1;
    case DType::kInt32:
    case DType::kFloat32: return 4;
    default: return 8;
  }
}

constexpr double kInf = std::numeric_limits<double>::infinity();

// A Gymnasium Box or Discrete space.
struct Space {
  bool discrete = false;
  int64_t n = 0;                // Discrete: number of actions
  std::vector<int64_t> shape;   // Box: element shape
  DType dtype = DType::kFloat32;
  std::vector<double> low, high;  // Box: one bound per element (flattened)

  static Space Discrete(int64_t n) {
    Space s;
    s.discrete = true;
    s.n = n;
    s.dtype = DType::kInt64;
    return s;
  }
  static Space Box(std::vector<int64_t> shape, DType dtype, std::vector<double> low,
                   std::vector<double> high) {
    Space s;
    s.shape = std::move(shape);
    s.dtype = dtype;
    s.low = std::move(low);
    s.high = std::move(high);
    return s;
  }
  // Box with the same bound on every element.
  static Space Box(std::vector<int64_t> shape, DType dtype, double low, double high) {
    Space s;
    s.shape = std::move(shape);
    s.dtype = dtype;
    s.low.assign(s.Size(), low);
    s.high.assign(s.Size(), high);
    return s;
  }
  // Elements in one sample (1 for Discrete).
  int64_t Size() const {
    int64_t k = 1;
    for (int64_t d : shape) k *= d;
    return k;
  }
};

// An option value; a vector is a fixed-length tuple of floats (e.g. a (min, max) range).
using Value = std::variant<bool, int64_t, double, std::string, std::vector<double>>;

// One constructor option of an env: name, default (which fixes its type) and a one-line doc.
struct OptionDecl {
  std::string name;
  Value default_value;
  std::string doc;
};

// Resolved options (defaults overridden by the user's keyword arguments, type-checked in Python).
class Config {
 public:
  Config() = default;
  explicit Config(std::map<std::string, Value> values) : values_(std::move(values)) {}
  double Float(const std::string& k) const {
    const Value& v = Get(k);
    if (auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
    return std::get<double>(v);
  }
  int64_t Int(const std::string& k) const { return std::get<int64_t>(Get(k)); }
  bool Bool(const std::string& k) const { return std::get<bool>(Get(k)); }
  const std::string& Str(const std::string& k) const { return std::get<std::string>(Get(k)); }
  const std::vector<double>& Floats(const std::string& k) const {
    return std::get<std::vector<double>>(Get(k));
  }
  const std::map<std::string, Value>& values() const { return values_; }

 private:
  const Value& Get(const std::string& k) const;
  std::map<std::string, Value> values_;
};

struct EnvSpec {
  Space observation;
  Space action;
  int64_t max_episode_steps = 0;  // time limit (truncation); 0 = none
  double reward_threshold = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::string> info_keys;  // per-step float64 infos written by Reset/Step
};

struct StepResult {
  double reward;
  bool terminated;
};

// Per-env random stream (xoshiro256++), seeded from (seed, episode) by the engine at each reset,
// so results do not depend on thread count or scheduling.
class Rng {
 public:
  void Seed(uint64_t seed, uint64_t episode) {
    uint64_t x = Mix(seed) ^ Mix(episode + 0x632be59bd9b4e019ULL);
    for (auto& w : s_) w = Mix(x += 0x9e3779b97f4a7c15ULL);
    has_spare_ = false;
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s_[0] + s_[3], 23) + s_[0];
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  // Uniform integer in [0, n).
  int64_t Int(int64_t n) { return static_cast<int64_t>(Uniform() * static_cast<double>(n)); }
  // Standard normal (Marsaglia polar method).
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u, v, s;
    do {
      u = Uniform(-1.0, 1.0);
      v = Uniform(-1.0, 1.0);
      s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double f = std::sqrt(-2.0 * std::log(s) / s);
    spare_ = v * f;
    has_spare_ = true;
    return u * f;
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static uint64_t Mix(uint64_t z) {  // splitmix64 finalizer
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  uint64_t s_[4] = {1, 2, 3, 4};
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace onebox
