// Pusher-v5: Gymnasium's seven-joint arm that pushes a cylinder to a goal.
#include "envs/mujoco/mujoco_env.h"

namespace onebox {

struct Pusher {
  using Obs = double;
  using Act = float;
  enum Info { kDist, kCtrl, kNear };

  static std::vector<OptionDecl> Options() {
    auto o = mj::BaseOptions("pusher_v5.xml", 5);
    o.push_back({"reward_near_weight", 0.5, "Weight of the fingertip-to-object distance cost."});
    o.push_back({"reward_dist_weight", 1.0, "Weight of the object-to-goal distance cost."});
    o.push_back({"reward_control_weight", 0.1, "Weight of the control cost sum(action^2)."});
    return o;
  }
  static EnvSpec Spec(const Config& cfg) {
    auto m = mj::ModelOf(cfg);
    if (m->nq < 7 + 4 || m->nv < 7 + 4)
      throw std::invalid_argument("Pusher needs a model with 7 arm joints, object and goal");
    return mj::MakeSpec(m.get(), 23, {"reward_dist", "reward_ctrl", "reward_near"}, 0.0, 100);
  }

  explicit Pusher(const Config& cfg)
      : sim_(cfg),
        near_weight_(cfg.Float("reward_near_weight")),
        dist_weight_(cfg.Float("reward_dist_weight")),
        ctrl_weight_(cfg.Float("reward_control_weight")),
        tips_(sim_.BodyId("tips_arm")),
        object_(sim_.BodyId("object")),
        goal_(sim_.BodyId("goal")) {
    sim_.post_constraint = false;  // cfrc_ext is not used
    Spec(cfg);  // checks the model's shape
  }

  void Reset(Rng& rng, Obs* obs, double*) {
    const mjModel* m = sim_.m;
    sim_.ResetData();
    std::vector<double> qpos(sim_.init_qpos), qvel(sim_.init_qvel);
    double cx, cy;
    do {
      cx = rng.Uniform(-0.3, 0.0);
      cy = rng.Uniform(-0.2, 0.2);
    } while (!(mj::Norm2(cx, cy) > 0.17));  // the goal is at (0, 0)
    qpos[m->nq - 4] = cx;
    qpos[m->nq - 3] = cy;
    qpos[m->nq - 2] = qpos[m->nq - 1] = 0.0;
    for (int i = 0; i < m->nv; ++i) qvel[i] += rng.Uniform(-0.005, 0.005);
    for (int i = m->nv - 4; i < m->nv; ++i) qvel[i] = 0.0;
    sim_.SetState(qpos.data(), qvel.data());
    Write(obs);
  }

  StepResult Step(const Act* action, Rng&, Obs* obs, double* info) {
    sim_.Simulate(action);
    Write(obs);
    const double* object = sim_.BodyPos(object_);
    const double near = -mj::Norm3(object, sim_.BodyPos(tips_)) * near_weight_;
    const double dist = -mj::Norm3(object, sim_.BodyPos(goal_)) * dist_weight_;
    // -np.square(action).sum() * weight: float32 in NumPy 2.
    const double ctrl = -mj::SquaredSum(action, sim_.m->nu) * static_cast<float>(ctrl_weight_);
    info[kDist] = dist;
    info[kCtrl] = ctrl;
    info[kNear] = near;
    return {dist + ctrl + near, false};
  }

  std::vector<double> GetState() const { return sim_.GetState(); }
  void SetState(const std::vector<double>& s) { sim_.SetState(s); }

 private:
  void Write(Obs* o) const {
    o = mj::Put(o, sim_.d->qpos, 7);
    o = mj::Put(o, sim_.d->qvel, 7);
    o = mj::Put(o, sim_.BodyPos(tips_), 3);
    o = mj::Put(o, sim_.BodyPos(object_), 3);
    mj::Put(o, sim_.BodyPos(goal_), 3);
  }

  mj::Sim sim_;
  double near_weight_, dist_weight_, ctrl_weight_;
  int tips_, object_, goal_;
};

ONEBOX_REGISTER_ENV(Pusher, "Pusher-v5");

}  // namespace onebox
