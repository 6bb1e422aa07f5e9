#include "train/step_profile.h"

#include <cstdio>
#include <string>

namespace moe::train {

void StepProfile::add(const mixture::MoeStepTimes& moe, double compute, double optimizer, double sync, double step,
                      double a2a) {
  if (!on_) return;
  mixture::add_step_times(moe_, moe);
  compute_ += compute;
  optimizer_ += optimizer;
  sync_ += sync;
  steps_ += step;
  a2a_ += a2a;
}

void StepProfile::print() const {
  const double moe_s = moe_.forward() + moe_.backward();
  auto line = [&](const char* name, double s) {
    std::fprintf(stderr, "  %-22s %9.3f s %6.1f%%\n", name, s, steps_ > 0 ? 100.0 * s / steps_ : 0.0);
  };
  std::fprintf(stderr, "profile (rank 0, all steps): %.3f s\n", steps_);
  line("MoE layers", moe_s);
  for (const auto& [name, ms] : mixture::moe_step_times_ms(moe_)) line(("  " + name).c_str(), ms * 1e-3);
  line("  expert GEMMs", moe_.expert_parts.gemm());
  // The exchange (inside dispatch, combine and their adjoints): all of its wall time, and what of
  // it no computation covered (--comm.overlap hides some behind the shared experts).
  line("  all-to-all", a2a_);
  line("  all-to-all exposed", a2a_ - moe_.a2a_hidden);
  line("rest of fwd+bwd", compute_ - moe_s);
  line("grad sync", sync_);
  line("optimizer", optimizer_);
  line("other (data, metrics)", steps_ - compute_ - sync_ - optimizer_);
}

void StepProfile::add_to_record(const mixture::MoeStepTimes& moe, StepRecord& rec) const {
  if (!on_) return;
  for (const auto& [name, ms] : mixture::moe_step_times_ms(moe)) rec.time_s.moe.emplace_back(name, ms * 1e-3);
}

}  // namespace moe::train
