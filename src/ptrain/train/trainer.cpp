#include "ptrain/train/trainer.h"

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "ptrain/core/cuda_runtime.h"
#include "ptrain/core/error.h"
#include "ptrain/core/torch_compat.h"
#include "ptrain/data/image_folder.h"
#include "ptrain/data/loader.h"
#include "ptrain/data/registry.h"
#include "ptrain/kernels/cross_entropy.h"
#include "ptrain/metrics/cpu_allocator.h"
#include "ptrain/metrics/environment.h"
#include "ptrain/metrics/gpu_sampler.h"
#include "ptrain/metrics/memory.h"
#include "ptrain/metrics/step_phases.h"
#include "ptrain/metrics/timer.h"
#include "ptrain/models/state_dict.h"
#include "ptrain/models/zoo.h"
#include "ptrain/precision/autocast_guard.h"
#include "ptrain/precision/loss_scaler.h"
#include "ptrain/strategies/model_state_arithmetic.h"
#include "ptrain/strategies/strategy.h"
#include "ptrain/train/captured_step.h"
#include "ptrain/train/checkpoint.h"
#include "ptrain/train/divergence.h"
#include "ptrain/train/grad_clip.h"
#include "ptrain/train/optimizer.h"
#include "ptrain/train/progress.h"
#include "ptrain/train/schedule.h"

namespace ptrain::train {

namespace {

// NCCL and the caching allocator work on the current device: make it this process's one first.
std::unique_ptr<strategies::Strategy> make_strategy_on_device(const Plan& plan) {
  const torch::Device& device = plan.device;
  if (device.is_cuda()) cuda_runtime::set_current_device(device.index());
  return strategies::make_strategy(plan.strategy, plan.config, plan.precision, device, plan.launch);
}

// Image models give logits [B, classes] for labels [B]; language models [B, T, vocab] for labels [B, T], every
// position a prediction of its next token. Both flatten to [predictions, classes] and [predictions].
torch::Tensor prediction_logits(const torch::Tensor& logits) { return logits.dim() > 2 ? logits.flatten(0, -2) : logits; }
torch::Tensor prediction_labels(const torch::Tensor& labels) { return labels.dim() > 1 ? labels.flatten() : labels; }

void convert_to_channels_last(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters()) {
    if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
  }
}

constexpr const char* kDivergenceAdvice =
    ". Try a lower --lr or --clip-grad-norm, or --on-divergence warn to train on";

// Sums kept on the device during an epoch; read back only when progress is shown. A captured step adds
// into these very tensors at every replay, so they are reset in place, never replaced.
struct RunningTotals {
  torch::Tensor loss_sum, correct, samples;
  torch::Tensor window_loss;  // the loss sum since the last progress line

  explicit RunningTotals(const torch::Device& device) {
    auto options = torch::TensorOptions().dtype(torch::kDouble).device(device);
    loss_sum = torch::zeros({}, options);
    correct = torch::zeros({}, options);
    samples = torch::zeros({}, options);
    window_loss = torch::zeros({}, options);
  }
  void reset() {
    loss_sum.zero_();
    correct.zero_();
    samples.zero_();
    window_loss.zero_();
  }
  io::NamedTensors named() const { return {{"loss_sum", loss_sum}, {"correct", correct}, {"samples", samples}}; }
  void load(const io::NamedTensors& saved) {
    for (const auto& [name, value] : saved) {
      if (name == "loss_sum") loss_sum.copy_(value);
      if (name == "correct") correct.copy_(value);
      if (name == "samples") samples.copy_(value);
    }
  }
};

struct Evaluation {
  double loss = 0, accuracy = 0;
};

class TrainingRun {
 public:
  TrainingRun(const Plan& plan, const std::string& command_line, const TrainHooks& hooks)
      : plan_(plan), c_(plan.config), device_(plan.device), policy_(plan.precision), hooks_(hooks),
        strategy_(make_strategy_on_device(plan)),
        progress_style_(Progress::style_from(c_.run.progress)), phases_(device_) {
    record_.command_line = command_line;
  }

  metrics::RunRecord run();

 private:
  void load_data();
  // load_data, with out of memory there explained as the dataset's (not the model states').
  void load_data_or_explain();
  void build_model();
  void build_optimizer();
  void resume();
  // Returns the steps of the epoch done when it stopped (steps_per_epoch_, or fewer at --max-steps).
  int64_t train_epoch(int64_t epoch, int64_t first_micro_batch, Progress& progress);
  // One optimizer step on micro-batches already on the device: eagerly, or by capturing or replaying it.
  void run_step(const std::vector<torch::Tensor>& images, const std::vector<torch::Tensor>& labels);
  // What a step does on the device, host-free where the strategy is: what a CUDA graph captures.
  void device_step(const std::vector<torch::Tensor>& images, const std::vector<torch::Tensor>& labels);
  void capture_step(const std::vector<torch::Tensor>& images, const std::vector<torch::Tensor>& labels);
  torch::Tensor optimizer_step();
  // Why this run's steps cannot be captured as a CUDA graph, or "" when they can.
  std::string capture_obstacle() const;
  // Takes the step phases measured since the last call into the totals; where the host has waited anyway.
  void collect_step_phases();
  void start_or_stop_trace(bool before_step);
  Evaluation evaluate();
  void save(TrainingPosition position);
  // The epoch's running totals summed over the ranks (a collective: every rank calls it).
  RunningTotals reduced_totals() const;
  // Stops a diverged run (--on-divergence stop) or reports it once (warn). Every rank calls it together.
  void check_divergence();
  // Whether every rank's parameters (and masters, shards) and buffers are finite. Collective.
  bool state_is_finite();
  void export_weights();
  void load_model_state(const io::NamedTensors& saved);
  // Devices sharing each step: processes x the replicas each drives. --batch-size counts per device.
  int64_t devices() const { return strategy_->world_size() * strategy_->replicas(); }
  // The devices of this process: the plan's device and, under dp, the ones after it.
  std::vector<torch::Device> local_devices() const;

  const Plan& plan_;
  const config::TrainConfig& c_;
  torch::Device device_;
  precision::PrecisionPolicy policy_;
  TrainHooks hooks_;
  std::unique_ptr<strategies::Strategy> strategy_;
  Progress::Style progress_style_;

  data::Dataset train_set_, test_set_;
  std::unique_ptr<data::Loader> train_loader_, test_loader_;
  std::shared_ptr<models::Model> model_;
  std::unique_ptr<strategies::UpdateTarget> target_;  // what the optimizer updates on this rank
  std::unique_ptr<Optimizer> optimizer_;
  std::optional<precision::LossScaler> scaler_;
  std::unique_ptr<LrSchedule> schedule_;
  std::unique_ptr<RunningTotals> totals_;
  std::unique_ptr<DivergenceWatch> divergence_;
  std::optional<int64_t> diverged_at_step_;

  int64_t steps_per_epoch_ = 0, total_steps_ = 0, global_step_ = 0;
  TrainingPosition start_;
  double train_seconds_ = 0;
  // Steady throughput (RunRecord::steady_images_per_second): the clock starts once step steady_from_step_
  // is over and stops, like train_seconds_, outside training (evaluation, checkpoints).
  int64_t steady_from_step_ = -1;
  std::optional<std::chrono::steady_clock::time_point> steady_start_;
  double steady_seconds_ = 0;
  int64_t steady_steps_ = 0;
  int64_t images_trained_ = 0;
  int64_t classes_ = 0;  // the model's classes: its logits may be wider (a padded vocabulary)
  int64_t cpu_bytes_before_model_ = 0;  // CPU runs: held by tensors once the data is loaded
  metrics::RunRecord record_;

  metrics::StepPhaseTimer phases_;
  // CUDA graphs: eager steps on the capture stream first (cuDNN's autotuning and the allocator's pools
  // settle there), then one capture, then replays fed through static input tensors.
  static constexpr int64_t kEagerStepsBeforeCapture = 3;
  std::unique_ptr<CapturedStep> graph_;
  bool captured_ = false;
  int64_t eager_steps_ = 0;
  int64_t replays_since_collect_ = 0;
  std::vector<torch::Tensor> static_images_, static_labels_;
  torch::Tensor step_loss_;  // the step's summed micro-batch losses, for the library's on_step hook only
  bool tracing_ = false;
};

// "image folder /data/train" of "image folder /data/train (50000 images 3x32x32)": where a split comes from.
std::string source_of(const data::Dataset& set) { return set.description.substr(0, set.description.find(" (")); }

void TrainingRun::load_data() {
  const int threads = static_cast<int>(c_.data.loader_threads);
  const data::DataSpec spec = plan_.open_data ? plan_.data : data::resolve_image_loading(plan_.data);
  const auto open = [&](bool train) {
    return plan_.open_data ? plan_.open_data(train) : data::open_dataset(spec, train, threads);
  };
  train_set_ = data::spread_subset(open(/*train=*/true), c_.data.train_limit);
  test_set_ = data::spread_subset(open(/*train=*/false), c_.data.test_limit);
  if (!train_set_.is_tokens())
    data::check_same_classes(source_of(train_set_), train_set_.classes, source_of(test_set_), test_set_.classes);
  const int64_t loader_batch = c_.run.batch_size * strategy_->replicas();
  check(train_set_.size() >= loader_batch,
        "--batch-size " + std::to_string(c_.run.batch_size) + " x " + std::to_string(strategy_->replicas()) +
            " replicas is larger than the " + std::to_string(train_set_.size()) + " training samples");

  const auto norm = data::default_normalization(c_.data.dataset);
  data::AugmentOptions eval_augment;
  eval_augment.resize = c_.data.image_size;
  eval_augment.mean = norm.mean;
  eval_augment.std = norm.std;
  eval_augment.out_dtype = policy_.compute_dtype;
  eval_augment.channels_last = plan_.channels_last;
  data::AugmentOptions train_augment = eval_augment;
  train_augment.random_crop = c_.data.augment;
  train_augment.horizontal_flip = c_.data.augment;

  data::LoaderOptions train_options;
  train_options.batch_size = loader_batch;
  train_options.shuffle = true;
  train_options.drop_last = true;
  train_options.seed = c_.run.seed;
  train_options.rank = strategy_->rank();
  train_options.world_size = strategy_->world_size();
  train_options.device = device_;
  train_options.prefetch = c_.data.prefetch;
  train_options.augment = train_augment;
  train_options.train = true;
  train_loader_ = std::make_unique<data::Loader>(train_set_, train_options);

  data::LoaderOptions test_options = train_options;
  test_options.batch_size =
      (c_.run.eval_batch_size > 0 ? c_.run.eval_batch_size : c_.run.batch_size) * strategy_->replicas();
  test_options.shuffle = false;
  test_options.drop_last = false;
  test_options.augment = eval_augment;
  test_options.train = false;
  test_loader_ = std::make_unique<data::Loader>(test_set_, test_options);

  steps_per_epoch_ = train_loader_->batches_per_epoch() / c_.optim.grad_accum;
  check(steps_per_epoch_ > 0, "--grad-accum " + std::to_string(c_.optim.grad_accum) + " x --batch-size " +
                                  std::to_string(c_.run.batch_size) + " is more than one epoch of data");
  check(c_.run.epochs <= std::numeric_limits<int64_t>::max() / steps_per_epoch_,
        "--epochs " + std::to_string(c_.run.epochs) + " x " + std::to_string(steps_per_epoch_) +
            " steps an epoch overflows the step count");
  total_steps_ = steps_per_epoch_ * c_.run.epochs;
  if (c_.run.max_steps > 0) total_steps_ = std::min(total_steps_, c_.run.max_steps);
}

bool is_out_of_memory(const std::string& what) {
  // CUDA's caching allocator says "out of memory", the CPU allocator "can't allocate memory".
  return what.find("out of memory") != std::string::npos || what.find("can't allocate memory") != std::string::npos;
}

void TrainingRun::load_data_or_explain() {
  const auto advice = [&](const std::string& what) {
    const auto newline = what.find('\n');
    return Error("out of host memory while loading the data (" + what.substr(0, newline) + "): --dataset " +
                 c_.data.dataset + " is held in memory whole, every sample at its decoded size" +
                 (c_.data.image_size > 0 ? " (resized to --image-size " + std::to_string(c_.data.image_size) + ")" : "") +
                 ". To fit: fewer samples (--train-limit, --test-limit), a smaller --image-size or --seq-len, or "
                 "more host memory; the model and its batch size are not the cause");
  };
  try {
    load_data();
  } catch (const c10::Error& e) {
    if (!is_out_of_memory(e.what_without_backtrace())) throw;
    throw advice(e.what_without_backtrace());
  } catch (const std::bad_alloc& e) {
    throw advice(e.what());
  }
}

void TrainingRun::build_model() {
  torch::manual_seed(c_.run.seed);
  const models::ModelSpec spec = model_spec(c_, train_set_, test_set_);
  classes_ = spec.num_classes;
  model_ = plan_.make_model ? plan_.make_model(spec) : models::make_model(spec);
  if (!c_.model.weights.empty()) models::load_weights(*model_, c_.model.weights);
  model_->to(device_);
  if (policy_.param_dtype != torch::kFloat) model_->to(policy_.param_dtype);
  if (plan_.channels_last) convert_to_channels_last(*model_);
  model_->set_activation_checkpointing(c_.model.activation_checkpointing);
  model_->set_fused_kernels(c_.run.fused_kernels);
  model_->train();
  strategy_->prepare(*model_);
}

std::vector<torch::Device> TrainingRun::local_devices() const {
  std::vector<torch::Device> devices{device_};
  for (int64_t i = 1; i < strategy_->replicas() && device_.is_cuda(); ++i)
    devices.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(device_.index() + i));
  return devices;
}

void TrainingRun::build_optimizer() {
  target_ = strategy_->update_target(*model_, policy_.master_weights);
  optimizer_ = make_optimizer(c_.optim, target_->params(), target_->names(), kOptimizerBatchElements,
                              c_.run.fused_kernels);
  const auto state_bytes = target_->model_state_bytes(optimizer_->state());
  record_.model_state_param_bytes = state_bytes.params;
  record_.model_state_grad_bytes = state_bytes.grads;
  record_.model_state_optimizer_bytes = state_bytes.optimizer;
  if (policy_.loss_scaling) scaler_.emplace(precision::loss_scaler_options(policy_), device_);
  schedule_ = std::make_unique<LrSchedule>(c_.optim, steps_per_epoch_, std::max<int64_t>(total_steps_, 1));
  totals_ = std::make_unique<RunningTotals>(device_);
  step_loss_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device_));
}

void TrainingRun::resume() {
  if (plan_.resume_path.empty()) return;
  Checkpoint ckpt = load_checkpoint(plan_.resume_path);
  load_model_state(ckpt.model);
  optimizer_->load_state(target_->local_optimizer_state(ckpt.optimizer), plan_.resume_path);
  if (scaler_) scaler_->load_state(ckpt.scaler);
  // The saved totals are summed over the ranks of the run that saved them: one rank carries them on.
  if (strategy_->rank() == 0) totals_->load(ckpt.progress);
  start_ = ckpt.position;
  global_step_ = ckpt.position.global_step;
  const int64_t world = devices();
  if (ckpt.position.world_size != world || ckpt.position.batch_size != c_.run.batch_size) {
    // Another world size or per-device batch: continue from the same number of samples into the epoch, at
    // a step boundary of the new layout, with the schedule's step counted in the new layout too. The order of
    // the epoch's remaining samples differs, as it must once the ranks split the data differently.
    const int64_t samples = ckpt.position.micro_batch * ckpt.position.batch_size * ckpt.position.world_size;
    const int64_t step_in_epoch = samples / (c_.run.batch_size * c_.optim.grad_accum * world);
    start_.micro_batch = step_in_epoch * c_.optim.grad_accum;
    global_step_ = ckpt.position.epoch * steps_per_epoch_ + step_in_epoch;
    if (strategy_->is_main())
      std::cout << "resuming a checkpoint of " << ckpt.position.world_size << " device(s) x batch "
                << ckpt.position.batch_size << " with " << world << " x " << c_.run.batch_size << ": epoch "
                << ckpt.position.epoch + 1 << " continues after about " << samples << " samples, at step "
                << global_step_ << std::endl;
  }
}

// The checkpoint holds every parameter whole (the fp32 masters where there are any) and the buffers:
// parameters go through the update target, which owns their shards and masters; buffers are copied here.
void TrainingRun::load_model_state(const io::NamedTensors& saved) {
  target_->load_full_parameters(saved, plan_.resume_path);
  std::map<std::string, torch::Tensor> by_name(saved.begin(), saved.end());
  torch::NoGradGuard no_grad;
  for (const auto& item : model_->named_buffers()) {
    auto it = by_name.find(item.key());
    check(it != by_name.end(), plan_.resume_path + ": buffer '" + item.key() + "' is missing");
    check(it->second.sizes() == item.value().sizes(), plan_.resume_path + ": buffer '" + item.key() + "' has shape " +
                                                          c10::str(it->second.sizes()) + ", expected " +
                                                          c10::str(item.value().sizes()));
    item.value().copy_(it->second);
  }
}

void TrainingRun::save(TrainingPosition position) {
  if (c_.run.checkpoint_dir.empty()) return;
  check_divergence();
  if (!state_is_finite()) {
    const std::string what = "training diverged at step " + std::to_string(position.global_step) +
                             ": the weights are not finite; no checkpoint saved";
    check(c_.run.on_divergence == "warn", what + kDivergenceAdvice);
    if (strategy_->is_main()) std::cerr << "ptrain: warning: " << what << std::endl;
    if (!diverged_at_step_) diverged_at_step_ = position.global_step;
    return;
  }
  const RunningTotals progress_totals = reduced_totals();
  const std::string path = checkpoint_path(c_.run.checkpoint_dir, position.global_step);
  Checkpoint ckpt;
  ckpt.model = models::state_dict(*model_);
  if (c_.sharding.state_dict == "sharded") {
    // Every rank writes its shards; once all have, rank 0 writes the checkpoint that names them. The
    // sum's value read on the host is the barrier: it exists only once every rank has contributed (an
    // NCCL wait alone only orders the stream).
    nlohmann::json layout;
    const auto shards = target_->local_shards(optimizer_->state(), &layout);
    save_shard(path, strategy_->rank(), strategy_->world_size(), shards, layout);
    strategy_->all_reduce_sum(torch::ones({1}, device_)).item<float>();
    if (!strategy_->is_main()) return;
    std::set<std::string> sharded;
    for (const auto& group : layout)
      for (const auto& p : group.at("params")) sharded.insert(p.at("name").get<std::string>());
    io::NamedTensors rest;
    for (auto& [name, tensor] : ckpt.model)
      if (!sharded.count(name)) rest.emplace_back(name, tensor);
    ckpt.model = std::move(rest);
    ckpt.shards = strategy_->world_size();
  } else {
    // Gathering shards is collective: every rank takes part, rank 0 writes.
    const auto params = target_->full_parameters();
    ckpt.optimizer = target_->full_optimizer_state(optimizer_->state());
    if (!strategy_->is_main()) return;
    std::map<std::string, torch::Tensor> full(params.begin(), params.end());
    for (auto& [name, tensor] : ckpt.model) {
      auto it = full.find(name);
      if (it != full.end()) tensor = it->second;
    }
  }
  position.world_size = devices();
  position.batch_size = c_.run.batch_size;
  ckpt.position = position;
  if (scaler_) ckpt.scaler = scaler_->state();
  ckpt.progress = progress_totals.named();
  ckpt.run = config::to_json(c_);
  save_checkpoint(path, ckpt);
  prune_checkpoints(c_.run.checkpoint_dir, c_.run.keep_checkpoints, plan_.resume_path);
}

RunningTotals TrainingRun::reduced_totals() const {
  RunningTotals sum(device_);
  sum.loss_sum.copy_(totals_->loss_sum);
  sum.correct.copy_(totals_->correct);
  sum.samples.copy_(totals_->samples);
  strategy_->all_reduce_sum(sum.loss_sum);
  strategy_->all_reduce_sum(sum.correct);
  strategy_->all_reduce_sum(sum.samples);
  return sum;
}

void TrainingRun::check_divergence() {
  const auto status = divergence_->read([&](torch::Tensor& t) { strategy_->all_reduce_sum(t); });
  if (!status.diverged()) return;
  const std::string what = divergence_->describe(status, global_step_);
  check(c_.run.on_divergence == "warn", what + "; stopped before saving anything from then on" + kDivergenceAdvice);
  if (diverged_at_step_) return;
  diverged_at_step_ = status.first_step.value_or(global_step_);
  if (strategy_->is_main()) std::cerr << "ptrain: warning: " << what << "; training on (--on-divergence warn)" << std::endl;
}

bool TrainingRun::state_is_finite() {
  torch::NoGradGuard no_grad;
  auto bad = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device_));
  const auto count = [&](const torch::Tensor& t) {
    if (t.defined() && t.is_floating_point() && t.numel() > 0)
      bad.add_(torch::logical_not(torch::isfinite(t)).sum().to(bad.device()));
  };
  for (const auto& p : optimizer_->params()) count(p);
  for (const auto& b : model_->buffers()) count(b);
  strategy_->all_reduce_sum(bad);
  return bad.item<double>() == 0;
}

// --save-weights: the model's state_dict with every parameter whole (gathering shards is collective;
// rank 0 writes), fp32 masters where there are any.
void TrainingRun::export_weights() {
  if (c_.model.save_weights.empty()) return;
  const auto params = target_->full_parameters();
  if (!strategy_->is_main()) return;
  std::map<std::string, torch::Tensor> full(params.begin(), params.end());
  auto tensors = models::state_dict(*model_);
  for (auto& [name, tensor] : tensors) {
    auto it = full.find(name);
    tensor = (it != full.end() ? it->second : tensor).to(torch::kCPU);
  }
  const auto parent = std::filesystem::path(c_.model.save_weights).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  models::write_weights(c_.model.save_weights, tensors);
}

// Unscale, clip, update: everything after the last micro-batch's backward, at the rate set on the optimizer
// before the step. Returns nothing to the host.
torch::Tensor TrainingRun::optimizer_step() {
  using metrics::StepPhase;
  phases_.begin(StepPhase::kCommunication);
  strategy_->finish_backward();
  target_->gradients_ready();
  phases_.end(StepPhase::kCommunication);
  phases_.begin(StepPhase::kOptimizer);
  std::vector<torch::Tensor> grads;
  for (const auto& p : optimizer_->params()) grads.push_back(p.grad());
  if (scaler_) {
    scaler_->unscale_(grads);
    target_->agree_found_inf(scaler_->found_inf());
  }
  torch::Tensor grad_norm;
  if (c_.optim.clip_grad_norm > 0) {
    // A rank may hold a shard of the gradients: the norm that clips is the one over all of them.
    grad_norm = target_->global_norm(global_grad_norm(grads));
    clip_grads_to_norm_(grads, grad_norm, c_.optim.clip_grad_norm);
  }
  optimizer_->step_at_set_rate(scaler_ ? &scaler_->found_inf() : nullptr);
  phases_.end(StepPhase::kOptimizer);
  phases_.begin(StepPhase::kCommunication);
  target_->parameters_updated();
  phases_.end(StepPhase::kCommunication);
  phases_.begin(StepPhase::kOptimizer);
  divergence_->end_step();
  if (scaler_) scaler_->update();
  optimizer_->zero_grad();
  phases_.end(StepPhase::kOptimizer);
  return grad_norm;
}

void TrainingRun::device_step(const std::vector<torch::Tensor>& images, const std::vector<torch::Tensor>& labels) {
  using metrics::StepPhase;
  const auto accum = static_cast<int64_t>(images.size());
  for (int64_t micro = 0; micro < accum; ++micro) {
    strategy_->set_gradient_sync(micro == accum - 1);
    phases_.begin(StepPhase::kForward);
    torch::Tensor logits;
    {
      precision::AutocastGuard autocast(device_.type(), policy_.autocast, policy_.autocast_dtype);
      logits = strategy_->forward(*model_, images[micro]);
    }
    const auto predictions = prediction_logits(logits);
    const auto targets = prediction_labels(labels[micro]);
    auto [loss, correct] =
        kernels::cross_entropy(predictions, targets, kernels::Reduction::kMean, c_.run.fused_kernels, classes_);
    divergence_->observe_loss(loss);
    if (hooks_.on_step) {
      torch::NoGradGuard no_grad;
      if (micro == 0) step_loss_.zero_();
      step_loss_.add_(loss.detach());
    }
    auto scaled = accum > 1 ? loss / static_cast<double>(accum) : loss;
    {
      // Loss and accuracy are per prediction: n of them, or n x T for tokens.
      torch::NoGradGuard no_grad;
      const auto predicted = static_cast<double>(targets.size(0));
      auto batch_loss = loss.detach().to(torch::kDouble) * predicted;
      totals_->loss_sum.add_(batch_loss);
      totals_->window_loss.add_(batch_loss);
      totals_->correct.add_(correct);
      totals_->samples.add_(predicted);
    }
    phases_.end(StepPhase::kForward);
    phases_.begin(StepPhase::kBackward);
    (scaler_ ? scaler_->scale(scaled) : scaled).backward();
    phases_.end(StepPhase::kBackward);
  }
  optimizer_step();
}

std::string TrainingRun::capture_obstacle() const {
  if (!c_.run.cuda_graphs) return "off (--no-cuda-graphs)";
  if (!device_.is_cuda()) return "off (CUDA graphs need a CUDA device)";
  const std::string strategy = strategy_->capture_obstacle();
  if (!strategy.empty()) return "off: " + strategy;
  if (!optimizer_->capturable()) {
    return "off: the " + c_.optim.name + " step runs LibTorch's foreach ops, which take the learning rate from the host (" +
           (c_.run.fused_kernels ? "this LibTorch has no fused optimizer kernels" : "--no-fused-kernels") + ")";
  }
  return "";
}

void TrainingRun::capture_step(const std::vector<torch::Tensor>& images, const std::vector<torch::Tensor>& labels) {
  // The graph reads its micro-batches from these tensors, filled before every replay.
  static_images_.clear();
  static_labels_.clear();
  for (size_t m = 0; m < images.size(); ++m) {
    static_images_.push_back(torch::empty_like(images[m]).copy_(images[m]));
    static_labels_.push_back(torch::empty_like(labels[m]).copy_(labels[m]));
  }
  // Autocast's cast cache would hold casts made inside the capture past its end.
  const bool cache = compat::autocast_cache_enabled();
  compat::set_autocast_cache_enabled(false);
  phases_.set_capturing(true);
  try {
    graph_->capture([&] { device_step(static_images_, static_labels_); });
  } catch (...) {
    phases_.set_capturing(false);
    compat::set_autocast_cache_enabled(cache);
    throw;
  }
  phases_.set_capturing(false);
  compat::set_autocast_cache_enabled(cache);
  captured_ = true;
  graph_->replay();  // the capture recorded the step; this runs it
  ++replays_since_collect_;
}

void TrainingRun::run_step(const std::vector<torch::Tensor>& images, const std::vector<torch::Tensor>& labels) {
  if (captured_) {
    for (size_t m = 0; m < images.size(); ++m) {
      static_images_[m].copy_(images[m]);
      static_labels_[m].copy_(labels[m]);
    }
    graph_->replay();
    ++replays_since_collect_;
    return;
  }
  if (graph_ && eager_steps_ >= kEagerStepsBeforeCapture) {
    capture_step(images, labels);
    return;
  }
  if (graph_) {
    graph_->run_on_capture_stream([&] { device_step(images, labels); });
    ++eager_steps_;
  } else {
    device_step(images, labels);
  }
  phases_.end_step();
}

void TrainingRun::collect_step_phases() {
  phases_.collect();
  phases_.add_replayed_steps(replays_since_collect_);
  replays_since_collect_ = 0;
}

// --profile-out: the trace starts before step A and ends after step B (global steps counted from 1).
void TrainingRun::start_or_stop_trace(bool before_step) {
  if (c_.run.profile_out.empty()) return;
  const int64_t step = before_step ? global_step_ + 1 : global_step_;
  if (before_step && !tracing_ && step == plan_.profile_first_step) {
    metrics::synchronize(device_);
    compat::start_profiler_trace(device_.is_cuda(), c_.run.profile_out);
    tracing_ = true;
  } else if (!before_step && tracing_ && step == plan_.profile_last_step) {
    metrics::synchronize(device_);
    compat::stop_profiler_trace();
    tracing_ = false;
    if (strategy_->is_main())
      std::cout << "trace of steps " << plan_.profile_first_step << "-" << plan_.profile_last_step << " written to "
                << c_.run.profile_out << std::endl;
  }
}

int64_t TrainingRun::train_epoch(int64_t epoch, int64_t first_micro_batch, Progress& progress) {
  const int64_t accum = c_.optim.grad_accum;
  train_loader_->start_epoch(epoch, first_micro_batch);
  progress.start_epoch(epoch);
  int64_t step_in_epoch = first_micro_batch / accum;
  metrics::Stopwatch window;
  int64_t window_images = 0, window_predictions = 0;
  totals_->window_loss.zero_();
  std::vector<torch::Tensor> images(accum), labels(accum);

  while (step_in_epoch < steps_per_epoch_ && global_step_ < total_steps_) {
    start_or_stop_trace(/*before_step=*/true);
    for (int64_t micro = 0; micro < accum; ++micro) {
      const metrics::Stopwatch waiting;
      auto batch = train_loader_->next();
      phases_.add_host_seconds(metrics::StepPhase::kData, waiting.elapsed_seconds());
      check(batch.has_value(), "data loader ended before the epoch's last step");
      images[micro] = batch->images;
      labels[micro] = batch->labels;
      window_predictions += prediction_labels(batch->labels).size(0);
      window_images += batch->labels.size(0) * strategy_->world_size();
    }
    optimizer_->set_learning_rate(schedule_->lr(global_step_));
    run_step(images, labels);
    ++global_step_;
    start_or_stop_trace(/*before_step=*/false);
    if (hooks_.on_step) hooks_.on_step({epoch, global_step_, step_loss_.item<double>() / static_cast<double>(accum)});
    if (global_step_ == steady_from_step_) {
      metrics::synchronize(device_);
      steady_start_ = std::chrono::steady_clock::now();
      phases_.start_counting();
      replays_since_collect_ = 0;
    }
    ++step_in_epoch;

    if (c_.run.checkpoint_every > 0 && global_step_ % c_.run.checkpoint_every == 0)
      save({epoch, step_in_epoch * accum, global_step_, 0, 0});
    if (step_in_epoch % c_.run.log_every == 0 || step_in_epoch == steps_per_epoch_) {
      const double mean_loss = totals_->window_loss.item<double>() / static_cast<double>(window_predictions);
      collect_step_phases();  // the read above waited for the device
      const double seconds = window.elapsed_seconds();
      check_divergence();
      progress.update(step_in_epoch, seconds > 0 ? window_images / seconds : 0, mean_loss);
      totals_->window_loss.zero_();
      window_images = 0;
      window_predictions = 0;
      window.restart();
    }
  }
  return step_in_epoch;
}

Evaluation TrainingRun::evaluate() {
  torch::NoGradGuard no_grad;
  model_->eval();
  test_loader_->start_epoch(0);
  auto options = torch::TensorOptions().dtype(torch::kDouble).device(device_);
  auto loss_sum = torch::zeros({}, options), correct = torch::zeros({}, options);
  int64_t seen = 0;
  while (auto batch = test_loader_->next()) {
    torch::Tensor logits;
    {
      precision::AutocastGuard autocast(device_.type(), policy_.autocast, policy_.autocast_dtype);
      logits = strategy_->forward(*model_, batch->images);
    }
    const auto predictions = prediction_logits(logits);
    const auto labels = prediction_labels(batch->labels);
    const auto [batch_loss, batch_correct] =
        kernels::cross_entropy(predictions, labels, kernels::Reduction::kSum, c_.run.fused_kernels, classes_);
    loss_sum.add_(batch_loss);
    correct.add_(batch_correct);
    seen += labels.size(0);
  }
  model_->train();
  strategy_->all_reduce_sum(loss_sum);
  strategy_->all_reduce_sum(correct);
  const double total = static_cast<double>(seen * strategy_->world_size());
  return {loss_sum.item<double>() / total, correct.item<double>() / total};
}

metrics::RunRecord TrainingRun::run() {
  const metrics::Stopwatch run_clock;
  torch::set_num_threads(c_.run.threads > 0 ? static_cast<int>(c_.run.threads)
                                             : static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  precision::apply_global_math_mode(policy_);
  if (device_.is_cuda()) {
    // cuDNN picks the fastest kernels for the fixed shapes of a training run, as the PyTorch reference does.
    at::globalContext().setBenchmarkCuDNN(true);
  }
  if (device_.is_cpu()) metrics::install_cpu_allocation_counter();
  load_data_or_explain();
  if (device_.is_cpu()) {
    metrics::reset_cpu_allocator_peak();
    cpu_bytes_before_model_ = metrics::cpu_allocated_bytes();
  }
  build_model();
  build_optimizer();
  resume();
  divergence_ = std::make_unique<DivergenceWatch>(device_, global_step_, scaler_ ? &*scaler_ : nullptr);
  if (!c_.run.checkpoint_dir.empty() && strategy_->is_main()) {
    // Nothing writes there yet: every other rank waits for this one at its first collective.
    const int64_t stale = remove_stale_temporaries(c_.run.checkpoint_dir);
    if (stale > 0)
      std::cout << "removed " << stale << " temporary file(s) of interrupted checkpoint writes in "
                << c_.run.checkpoint_dir << std::endl;
  }

  Progress progress(progress_style_, c_.run.epochs, steps_per_epoch_);
  progress.message(describe(plan_));
  if (plan_.profile_first_step > 0) {
    check(plan_.profile_first_step <= total_steps_,
          "--profile-steps " + c_.run.profile_steps + ": the run trains " + std::to_string(total_steps_) +
              " steps, so step " + std::to_string(plan_.profile_first_step) + " never comes");
  }
  record_.cuda_graphs_note = capture_obstacle();
  if (record_.cuda_graphs_note.empty()) {
    graph_ = make_captured_step(device_);
    if (!graph_) record_.cuda_graphs_note = "off: this ptrain was built without CUDA graphs";
  }
  if (device_.is_cuda()) {
    progress.message("CUDA graphs: " + (record_.cuda_graphs_note.empty()
                                            ? "the whole step is captured after " +
                                                  std::to_string(kEagerStepsBeforeCapture) + " eager steps"
                                            : record_.cuda_graphs_note));
  }
  progress.message("data " + train_set_.description + ": " + std::to_string(train_set_.size()) + " train, " +
                   std::to_string(test_set_.size()) + " test; " + std::to_string(steps_per_epoch_) +
                   " steps per epoch, " + std::to_string(total_steps_) + " in all");

  std::optional<metrics::GpuSampler> sampler;
  if (device_.is_cuda()) {
    std::vector<int> nvml_indices;
    for (const auto& device : local_devices()) {
      metrics::reset_cuda_allocator_peak(device.index());
      const int nvml_index = metrics::nvml_index_for_cuda_device(device.index());
      if (nvml_index >= 0) nvml_indices.push_back(nvml_index);
    }
    if (!nvml_indices.empty()) {
      sampler.emplace(nvml_indices);
      sampler->start();
    }
  }

  // Warm-up to leave out of the steady throughput: 10 steps, or a quarter of a run shorter than 40.
  const int64_t steps_to_train = total_steps_ - global_step_;
  if (steps_to_train >= 8) steady_from_step_ = global_step_ + std::min<int64_t>(10, steps_to_train / 4);

  Evaluation last_eval;
  bool evaluated = false;
  for (int64_t epoch = start_.epoch; epoch < c_.run.epochs && global_step_ < total_steps_; ++epoch) {
    const int64_t first = epoch == start_.epoch ? start_.micro_batch : 0;
    if (first == 0) totals_->reset();
    metrics::synchronize(device_);
    metrics::Stopwatch epoch_clock;
    const auto epoch_start = std::chrono::steady_clock::now();
    const int64_t step_before = global_step_;
    const int64_t steps_done = train_epoch(epoch, first, progress);
    const double epoch_seconds = epoch_clock.elapsed_seconds_after_sync(device_);
    collect_step_phases();
    check_divergence();
    if (steady_start_ && global_step_ > steady_from_step_) {
      steady_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                       std::max(*steady_start_, epoch_start)).count();
      steady_steps_ += global_step_ - std::max(step_before, steady_from_step_);
    }
    const int64_t images = (global_step_ - step_before) * c_.optim.grad_accum * c_.run.batch_size * devices();
    train_seconds_ += epoch_seconds;
    images_trained_ += images;

    metrics::EpochRecord epoch_record;
    epoch_record.epoch = epoch;
    epoch_record.wall_seconds = epoch_seconds;
    epoch_record.images = images;
    epoch_record.images_per_second = epoch_seconds > 0 ? images / epoch_seconds : 0;
    const RunningTotals epoch_totals = reduced_totals();
    const double samples = std::max(1.0, epoch_totals.samples.item<double>());
    epoch_record.train_loss = epoch_totals.loss_sum.item<double>() / samples;
    epoch_record.train_accuracy = epoch_totals.correct.item<double>() / samples;

    const bool last_epoch = epoch + 1 == c_.run.epochs || global_step_ >= total_steps_;
    if (c_.run.eval_each_epoch || last_epoch) {
      last_eval = evaluate();
      evaluated = true;
      epoch_record.test_loss = last_eval.loss;
      epoch_record.test_accuracy = last_eval.accuracy;
    }
    record_.epochs_detail.push_back(epoch_record);
    // A run stopped inside the epoch (--max-steps) saves where it stopped, so that a resume continues it.
    save(steps_done < steps_per_epoch_ ? TrainingPosition{epoch, steps_done * c_.optim.grad_accum, global_step_, 0, 0}
                                       : TrainingPosition{epoch + 1, 0, global_step_, 0, 0});

    char summary[256];
    std::snprintf(summary, sizeof(summary), "epoch %lld: %s, %.0f img/s, train loss %.4f acc %.4f",
                  static_cast<long long>(epoch + 1), format_duration(epoch_seconds).c_str(),
                  epoch_record.images_per_second, epoch_record.train_loss, *epoch_record.train_accuracy);
    std::string line = summary;
    if (epoch_record.test_accuracy) {
      std::snprintf(summary, sizeof(summary), ", test loss %.4f acc %.4f", *epoch_record.test_loss,
                    *epoch_record.test_accuracy);
      line += summary;
    }
    progress.end_epoch(line);
  }
  if (sampler) sampler->stop();
  if (tracing_) {
    // The run ended before the last step asked for: the trace holds what there was.
    metrics::synchronize(device_);
    compat::stop_profiler_trace();
    tracing_ = false;
    if (strategy_->is_main())
      std::cout << "trace of steps " << plan_.profile_first_step << "-" << global_step_ << " (the run's last) written to "
                << c_.run.profile_out << std::endl;
  }
  export_weights();

  record_.model = c_.model.name;
  record_.dataset = c_.data.dataset;
  record_.precision = precision::record_name(policy_);
  record_.strategy = strategy_->name();
  record_.device = device_.str();
  record_.world_size = strategy_->world_size();
  record_.devices = devices();
  record_.batch_size_per_device = c_.run.batch_size;
  record_.global_batch_size = c_.run.batch_size * c_.optim.grad_accum * devices();
  record_.epochs = c_.run.epochs;
  record_.steps = global_step_;
  record_.image_size = train_set_.is_tokens() ? 0 : c_.data.image_size > 0 ? c_.data.image_size : train_set_.height();
  record_.train_wall_seconds = train_seconds_;
  record_.total_wall_seconds = run_clock.elapsed_seconds();
  record_.images_per_second = train_seconds_ > 0 ? images_trained_ / train_seconds_ : 0;
  if (steady_steps_ > 0 && steady_seconds_ > 0) {
    record_.steady_from_step = steady_from_step_;
    record_.steady_images_per_second =
        static_cast<double>(steady_steps_ * c_.optim.grad_accum * c_.run.batch_size * devices()) / steady_seconds_;
  }
  record_.host_peak_rss_bytes = metrics::host_peak_rss_bytes();
  if (device_.is_cpu())
    record_.peak_allocated_bytes = metrics::cpu_peak_allocated_bytes() - cpu_bytes_before_model_;
  for (const auto& device : local_devices()) {
    if (!device.is_cuda()) break;
    // Per GPU: the highest of this process's devices (under dp the first one, which gathers the outputs).
    const auto peak = metrics::cuda_allocator_peak(device.index());
    if (peak.allocated_bytes && (!record_.peak_allocated_bytes || *peak.allocated_bytes > *record_.peak_allocated_bytes))
      record_.peak_allocated_bytes = peak.allocated_bytes;
    if (peak.reserved_bytes && (!record_.peak_reserved_bytes || *peak.reserved_bytes > *record_.peak_reserved_bytes))
      record_.peak_reserved_bytes = peak.reserved_bytes;
  }
  if (sampler) {
    const auto stats = sampler->stats();
    record_.gpu_util_mean = stats.util_mean;
    record_.gpu_util_peak = stats.util_peak;
    record_.peak_nvml_used_bytes = stats.memory_used_peak;
  }
  if (evaluated) {
    record_.final_test_accuracy = last_eval.accuracy;
    record_.final_test_loss = last_eval.loss;
  }
  if (train_set_.is_tokens()) {  // a sequence counts as an image above; these count its tokens
    record_.seq_len = train_set_.images.size(1);
    record_.tokens_per_second = record_.images_per_second * static_cast<double>(*record_.seq_len);
    if (record_.steady_images_per_second)
      record_.steady_tokens_per_second = *record_.steady_images_per_second * static_cast<double>(*record_.seq_len);
  }
  record_.channels_last = plan_.channels_last;
  record_.cuda_graphs = captured_;
  const bool fused_here = c_.run.fused_kernels && kernels::fused_kernels_available(device_);
  record_.kernels = {{"optimizer", optimizer_->implementation()},
                     {"cross_entropy", fused_here ? "fused" : "reference"}};
  record_.fused_optimizer = optimizer_->implementation() == "fused";
  if (!models::is_language_model(c_.model.name))
    record_.kernels["batch_norm_relu"] = fused_here && plan_.channels_last ? "fused" : "reference";
  record_.step_phase_seconds = phases_.means().to_json();
  record_.ptrain_version = PTRAIN_VERSION;
  record_.torch_version = compat::torch_version();
  record_.environment = metrics::describe_environment(device_);
  record_.extra["config"] = config::to_json(c_);
  record_.diverged_at_step = diverged_at_step_;
  // How long the training step waited for its batches (host time in the loader's next()): a loader that
  // cannot keep up shows here. Documented in docs/metrics.md.
  record_.extra["data_loader"] = {{"image_loading", train_set_.is_streamed() ? "stream" : "memory"},
                                  {"threads", c_.data.loader_threads},
                                  {"wait_seconds", train_loader_->wait_seconds()},
                                  {"wait_fraction", train_seconds_ > 0 ? train_loader_->wait_seconds() / train_seconds_ : 0.0}};
  return record_;
}

}  // namespace

namespace {

// What a device that ran out of memory held and how to make the run fit: the model states' bytes per
// parameter under this strategy, and the strategies and flags that shrink them or the activations.
std::string out_of_memory_advice(const Plan& plan, const std::string& what) {
  const auto& c = plan.config;
  const auto& p = plan.precision;
  // One parameter's model states on one device, by the arithmetic `ptrain estimate` uses.
  const int64_t per_param =
      strategies::predicted_model_states(strategies::StateLayout{}, 1, p, c.optim, !plan.device.is_cuda()).total();
  const bool sharded = plan.strategy.shards_optimizer_state();
  std::ostringstream out;
  const auto newline = what.find('\n');
  out << "out of memory on " << plan.device.str() << " under --strategy " << plan.strategy.name() << " ("
      << what.substr(0, newline) << ").\n"
      << "Model states take " << per_param << " bytes a parameter (" << p.name << ", " << c.optim.name << ")"
      << (sharded ? ", divided among the ranks as the strategy shards them" : " on every rank, whole") << ". ";
  if (plan.strategy.shards_parameters()) {
    out << "To fit: more ranks, --offload-optimizer (zero3) or --offload-params, --activation-checkpointing, or a "
           "smaller --batch-size.";
  } else {
    out << "To fit: --strategy zero3 (or fsdp) shards parameters, gradients and optimizer state over the ranks ("
        << per_param << "/N bytes a parameter on each of N); then --offload-optimizer; --activation-checkpointing "
           "and a smaller --batch-size shrink the activations.";
  }
  out << " `ptrain estimate --devices N` predicts which fits.";
  return out.str();
}

}  // namespace

models::ModelSpec model_spec(const config::TrainConfig& c, const data::Dataset& train, const data::Dataset& test) {
  // A model outside the zoo (a TorchScript file, a module of the library API's caller) takes what its data
  // holds; TorchScriptModel::load checks that the module fits it.
  const auto zoo = models::model_names();
  const bool from_zoo = std::find(zoo.begin(), zoo.end(), c.model.name) != zoo.end();
  const bool language_model = from_zoo ? models::is_language_model(c.model.name) : train.is_tokens();
  check(language_model == train.is_tokens(),
        language_model ? "--model " + c.model.name + " is a language model: it needs a token dataset "
                             "(--dataset synthetic-tokens or text), not " + c.data.dataset
                       : "--model " + c.model.name + " is an image model: it cannot train on the token dataset " +
                             c.data.dataset);
  models::ModelSpec spec{c.model.name, 0, 0, 0};
  spec.data = train.description;
  if (language_model) {
    check(c.model.vocab_size == 0 || c.model.vocab_size >= train.vocab_size,
          "--vocab-size " + std::to_string(c.model.vocab_size) + " is smaller than the " +
              std::to_string(train.vocab_size) + " tokens of " + train.description);
    spec.num_classes = c.model.vocab_size > 0 ? c.model.vocab_size : train.vocab_size;
    spec.seq_len = std::max(train.images.size(1), test.images.size(1));
    spec.layers = c.model.gpt_layers;
    spec.width = c.model.gpt_width;
    spec.heads = c.model.gpt_heads;
  } else {
    spec.num_classes = static_cast<int64_t>(train.classes.size());
    spec.in_channels = train.channels();
    spec.image_size = c.data.image_size > 0 ? c.data.image_size : train.height();
  }
  return spec;
}

metrics::RunRecord train(const Plan& plan, const std::string& command_line, const TrainHooks& hooks) {
  try {
    TrainingRun run(plan, command_line, hooks);
    return run.run();
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    if (!is_out_of_memory(what)) throw;
    throw Error(out_of_memory_advice(plan, what));
  }
}

}  // namespace ptrain::train
