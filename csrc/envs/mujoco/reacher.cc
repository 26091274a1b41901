// Reacher-v5: Gymnasium's two-joint arm that reaches for a random target in the plane.
#include "envs/mujoco/mujoco_env.h"

namespace onebox {

struct Reacher {
  using Obs = double;
  using Act = float;
  enum Info { kDist, kCtrl };

  static std::vector<OptionDecl> Options() {
    auto o = mj::BaseOptions("reacher.xml", 2);
    o.push_back({"reward_dist_weight", 1.0, "Weight of the fingertip-to-target distance cost."});
    o.push_back({"reward_control_weight", 1.0, "Weight of the control cost sum(action^2)."});
    return o;
  }
  static EnvSpec Spec(const Config& cfg) {
    auto m = mj::ModelOf(cfg);
    if (m->nq != 4 || m->nv != 4) throw std::invalid_argument("Reacher needs a model with nq = nv = 4");
    return mj::MakeSpec(m.get(), 10, {"reward_dist", "reward_ctrl"}, -3.75, 50);
  }

  explicit Reacher(const Config& cfg)
      : sim_(cfg),
        dist_weight_(cfg.Float("reward_dist_weight")),
        ctrl_weight_(cfg.Float("reward_control_weight")),
        fingertip_(sim_.BodyId("fingertip")),
        target_(sim_.BodyId("target")) {
    sim_.post_constraint = false;  // cfrc_ext is not used
    Spec(cfg);  // checks the model's shape
  }

  void Reset(Rng& rng, Obs* obs, double*) {
    const mjModel* m = sim_.m;
    sim_.ResetData();
    std::vector<double> qpos(sim_.init_qpos), qvel(sim_.init_qvel);
    for (int i = 0; i < m->nq; ++i) qpos[i] = rng.Uniform(-0.1, 0.1) + qpos[i];
    double gx, gy;
    do {
      gx = rng.Uniform(-0.2, 0.2);
      gy = rng.Uniform(-0.2, 0.2);
    } while (!(mj::Norm2(gx, gy) < 0.2));
    qpos[m->nq - 2] = gx;
    qpos[m->nq - 1] = gy;
    for (int i = 0; i < m->nv; ++i) qvel[i] += rng.Uniform(-0.005, 0.005);
    qvel[m->nv - 2] = qvel[m->nv - 1] = 0.0;
    sim_.SetState(qpos.data(), qvel.data());
    Write(obs);
  }

  StepResult Step(const Act* action, Rng&, Obs* obs, double* info) {
    sim_.Simulate(action);
    Write(obs);
    const double dist = -mj::Norm3(sim_.BodyPos(fingertip_), sim_.BodyPos(target_)) * dist_weight_;
    // -np.square(action).sum() * weight: float32 in NumPy 2.
    const double ctrl = -mj::SquaredSum(action, sim_.m->nu) * static_cast<float>(ctrl_weight_);
    info[kDist] = dist;
    info[kCtrl] = ctrl;
    return {dist + ctrl, false};
  }

  std::vector<double> GetState() const { return sim_.GetState(); }
  void SetState(const std::vector<double>& s) { sim_.SetState(s); }

 private:
  void Write(Obs* o) const {
    const double* q = sim_.d->qpos;
    const double* f = sim_.BodyPos(fingertip_);
    const double* t = sim_.BodyPos(target_);
    o[0] = std::cos(q[0]);
    o[1] = std::cos(q[1]);
    o[2] = std::sin(q[0]);
    o[3] = std::sin(q[1]);
    o[4] = q[2];
    o[5] = q[3];
    o[6] = sim_.d->qvel[0];
    o[7] = sim_.d->qvel[1];
    o[8] = f[0] - t[0];
    o[9] = f[1] - t[1];
  }

  mj::Sim sim_;
  double dist_weight_, ctrl_weight_;
  int fingertip_, target_;
};

ONEBOX_REGISTER_ENV(Reacher, "Reacher-v5");

}  // namespace onebox
