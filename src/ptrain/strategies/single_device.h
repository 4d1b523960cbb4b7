// One process, one device: the baseline every other strategy is measured against.
#pragma once

#include "ptrain/strategies/strategy.h"

namespace ptrain::strategies {

class SingleDevice final : public Strategy {
 public:
  explicit SingleDevice(torch::Device device) : device_(device) {}
  std::string name() const override { return "single"; }
  int64_t rank() const override { return 0; }
  int64_t world_size() const override { return 1; }
  void prepare(models::Model&) override {}
  void set_gradient_sync(bool) override {}
  void finish_backward() override {}
  torch::Tensor all_reduce_sum(torch::Tensor t) override { return t; }
  std::string capture_obstacle() const override { return ""; }

 private:
  torch::Device device_;
};

}  // namespace ptrain::strategies
