// What the MinAtar games share (Young and Tian, 2019; the `minatar` package, version 1.0.15):
// numpy's legacy RandomState stream that the games draw from, sticky actions, the 10x10 grid of
// boolean channels, the action sets, and the registration of the package's Gymnasium ids.
//
// API for a game file (csrc/envs/minatar/<game>.cc), in namespace onebox; name the class
// MinAtar<Game> (the registration makes aliases <class>V0 and <class>V1):
//
//   struct MinAtarMyGame {
//     static constexpr int kChannels = 4;                          // observation (10, 10, C)
//     static constexpr std::array<int64_t, 3> kMinimalActions{     // the package's
//         minatar::kNoop, minatar::kLeft, minatar::kRight};        //   minimal_action_set()
//     explicit MinAtarMyGame(bool ramping);                        // difficulty_ramping option
//     void Reset(minatar::RandomState& random);                    // the game's reset()
//     StepResult Act(int64_t action, minatar::RandomState& random);  // act(a): {reward, terminal}
//                                                                  //   for a = 0..5 ('n', 'l',
//                                                                  //   'u', 'r', 'd', 'f')
//     void Draw(uint8_t* obs) const;                               // state(): sets cells with
//   };                                                             //   minatar::Set; obs is zeroed
//   ONEBOX_REGISTER_MINATAR(MinAtarMyGame, "MyGame");  // MinAtar/MyGame-v0 (6 actions) and
//                                                      // MinAtar/MyGame-v1 (minimal action set)
//
//   minatar::RandomState  numpy.random.RandomState, bit for bit:
//     Seed(s)             RandomState(s) for s < 2**32 (MT19937 init_genrand); larger seeds,
//                         which numpy rejects, as RandomState([s & 0xffffffff, s >> 32])
//     Rand()              rand() / random_sample(): a double from two 32-bit draws
//     RandInt(low, high)  randint(low, high), high exclusive (masked rejection sampling; no draw
//                         when high - low == 1); RandInt(high) is randint(high). randint(a, b, n)
//                         is n calls in a row, rand(n) n calls of Rand().
//   minatar::Set(obs, C, y, x, c)  state[y, x, c] = True in a (10, 10, C) observation.
//   minatar::kSize = 10; actions kNoop, kLeft, kUp, kRight, kDown, kFire = 0..5.
//
// A game may also have std::vector<double> GetState() const and void SetState(const
// std::vector<double>&) (the env's get_state/set_state, for tests).
//
// minatar::Env<Game, minimal_by_default> wraps a game as the package's Gymnasium env
// (minatar.gym.BaseEnv over minatar.Environment): options sticky_action_prob (0.1),
// difficulty_ramping (true) and use_minimal_action_set (false for -v0, true for -v1); observations
// (10, 10, C) bool; no time limit. Its one RandomState serves the sticky draws and the game, as in
// the package after `reset(seed=s)`: the engine calls Seed(s) at the first reset after a seed is
// given (pool creation, `reset(seed=...)`), later episodes continue the stream, and the last
// action (for sticky actions) carries over episodes, as in the package.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/registry.h"

namespace onebox::minatar {

constexpr int kSize = 10;
constexpr int64_t kNoop = 0, kLeft = 1, kUp = 2, kRight = 3, kDown = 4, kFire = 5;
constexpr int64_t kNumActions = 6;

// numpy.random.RandomState (MT19937 and numpy's legacy samplers).
class RandomState {
 public:
  void Seed(uint64_t seed) {
    if (seed <= 0xffffffffULL) {
      InitGenrand(static_cast<uint32_t>(seed));
      return;
    }
    // numpy's init_by_array with the key [low 32 bits, high 32 bits].
    const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
    InitGenrand(19650218U);
    int i = 1, j = 0;
    for (int k = kN; k; --k) {
      mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525U)) + key[j] + j;
      if (++i >= kN) {
        mt_[0] = mt_[kN - 1];
        i = 1;
      }
      if (++j >= 2) j = 0;
    }
    for (int k = kN - 1; k; --k) {
      mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941U)) - i;
      if (++i >= kN) {
        mt_[0] = mt_[kN - 1];
        i = 1;
      }
    }
    mt_[0] = 0x80000000U;
  }

  uint32_t Next32() {
    if (pos_ >= kN) Twist();
    uint32_t y = mt_[pos_++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680U;
    y ^= (y << 15) & 0xefc60000U;
    return y ^ (y >> 18);
  }

  double Rand() {
    const uint32_t a = Next32() >> 5, b = Next32() >> 6;
    return (a * 67108864.0 + b) / 9007199254740992.0;
  }

  // randint(low, high) of a range below 2**32: numpy's masked rejection sampling on 32-bit draws.
  int64_t RandInt(int64_t low, int64_t high) {
    const uint64_t range = static_cast<uint64_t>(high - 1 - low);
    if (range == 0) return low;
    uint64_t mask = range;
    for (int s = 1; s <= 32; s *= 2) mask |= mask >> s;
    uint64_t v;
    do v = Next32() & mask;
    while (v > range);
    return low + static_cast<int64_t>(v);
  }
  int64_t RandInt(int64_t high) { return RandInt(0, high); }

 private:
  static constexpr int kN = 624, kM = 397;
  void InitGenrand(uint32_t s) {
    mt_[0] = s;
    for (int i = 1; i < kN; ++i) mt_[i] = 1812433253U * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + i;
    pos_ = kN;
  }
  static uint32_t Mix(uint32_t a, uint32_t b, uint32_t c) {
    const uint32_t y = (a & 0x80000000U) | (b & 0x7fffffffU);
    return c ^ (y >> 1) ^ ((0U - (y & 1U)) & 0x9908b0dfU);
  }
  void Twist() {  // the next 624 words, in three loops without index wrapping
    int i = 0;
    for (; i < kN - kM; ++i) mt_[i] = Mix(mt_[i], mt_[i + 1], mt_[i + kM]);
    for (; i < kN - 1; ++i) mt_[i] = Mix(mt_[i], mt_[i + 1], mt_[i + kM - kN]);
    mt_[kN - 1] = Mix(mt_[kN - 1], mt_[0], mt_[kM - 1]);
    pos_ = 0;
  }
  uint32_t mt_[kN] = {};
  int pos_ = kN;
};

// state[y, x, c] = True in a (10, 10, channels) observation.
inline void Set(uint8_t* obs, int channels, int y, int x, int c) {
  obs[(y * kSize + x) * channels + c] = 1;
}

// A game as the package's Gymnasium env; see the comment at the top.
template <class Game, bool kMinimalByDefault>
class Env {
 public:
  using Obs = uint8_t;
  using Act = int64_t;
  static constexpr int kObsSize = kSize * kSize * Game::kChannels;

  static std::vector<OptionDecl> Options() {
    return {{"sticky_action_prob", 0.1,
             "Probability, at each step, of repeating the previous action instead (in [0, 1])."},
            {"difficulty_ramping", true,
             "Speed the game up over time (Asterix, Seaquest, Space Invaders; no effect in "
             "Breakout and Freeway)."},
            {"use_minimal_action_set", kMinimalByDefault,
             "Only the game's distinct actions (-v1) instead of all 6 (-v0)."}};
  }

  static EnvSpec Spec(const Config& cfg) {
    const double p = cfg.Float("sticky_action_prob");
    if (!(p >= 0.0 && p <= 1.0)) {
      char got[32];
      std::snprintf(got, sizeof(got), "%g", p);
      throw std::invalid_argument(
          std::string("sticky_action_prob must be a probability in [0, 1], got ") + got);
    }
    EnvSpec s;
    s.observation = Space::Box({kSize, kSize, Game::kChannels}, DType::kBool, 0.0, 1.0);
    s.action = Space::Discrete(cfg.Bool("use_minimal_action_set")
                                   ? static_cast<int64_t>(Game::kMinimalActions.size())
                                   : kNumActions);
    return s;
  }

  explicit Env(const Config& cfg)
      : sticky_(cfg.Float("sticky_action_prob")),
        minimal_(cfg.Bool("use_minimal_action_set")),
        game_(cfg.Bool("difficulty_ramping")) {}

  // A seeded reset starts the env as a new one would: the random stream and the last action,
  // which the package keeps across every reset, even seeded ones (its first step after one could
  // repeat the last episode's action); a reset without a seed keeps both, as the package does.
  void Seed(uint64_t seed) {
    random_.Seed(seed);
    last_action_ = kNoop;
  }

  void Reset(Rng&, Obs* obs, double*) {
    game_.Reset(random_);
    Observe(obs);
  }

  StepResult Step(const Act* action, Rng&, Obs* obs, double*) {
    int64_t a = minimal_ ? Game::kMinimalActions[action[0]] : action[0];
    if (random_.Rand() < sticky_) a = last_action_;
    last_action_ = a;
    const StepResult r = game_.Act(a, random_);
    Observe(obs);
    return r;
  }

  // The game's state(): what Reset and Step write.
  void Observe(Obs* obs) const {
    // A size the compiler does not know: it calls libc's memset (vectorized for the CPU at run
    // time) instead of inlining `rep stos`, which took 3x longer for these 400 bytes.
    std::memset(obs, 0, obs_bytes_);
    game_.Draw(obs);
  }

  // The game's state as numbers, for tests that set up a situation (only for a game that has
  // GetState/SetState; the random stream and the last action are not part of it).
  template <class G = Game>
  auto GetState() const -> decltype(std::declval<const G&>().GetState()) {
    return game_.GetState();
  }
  template <class G = Game>
  auto SetState(const std::vector<double>& s) -> decltype(std::declval<G&>().SetState(s)) {
    game_.SetState(s);
  }

 private:
  size_t obs_bytes_ = kObsSize;
  double sticky_;
  bool minimal_;
  Game game_;
  RandomState random_;
  int64_t last_action_ = kNoop;
};

}  // namespace onebox::minatar

// Registers MinAtar/<NAME>-v0 (all 6 actions) and MinAtar/<NAME>-v1 (the minimal action set).
#define ONEBOX_REGISTER_MINATAR(Game, NAME)                          \
  using Game##V0 = ::onebox::minatar::Env<Game, false>;              \
  using Game##V1 = ::onebox::minatar::Env<Game, true>;               \
  ONEBOX_REGISTER_ENV(Game##V0, "MinAtar/" NAME "-v0");              \
  ONEBOX_REGISTER_ENV(Game##V1, "MinAtar/" NAME "-v1")
