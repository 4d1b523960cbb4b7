#include "ptrain/train/trainer.h"

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#if PTRAIN_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "ptrain/core/error.h"
#include "ptrain/core/torch_compat.h"
#include "ptrain/data/loader.h"
#include "ptrain/data/registry.h"
#include "ptrain/metrics/cpu_allocator.h"
#include "ptrain/metrics/environment.h"
#include "ptrain/metrics/gpu_sampler.h"
#include "ptrain/metrics/memory.h"
#include "ptrain/metrics/timer.h"
#include "ptrain/models/state_dict.h"
#include "ptrain/models/zoo.h"
#include "ptrain/precision/autocast_guard.h"
#include "ptrain/precision/loss_scaler.h"
#include "ptrain/strategies/strategy.h"
#include "ptrain/train/checkpoint.h"
#include "ptrain/train/grad_clip.h"
#include "ptrain/train/optimizer.h"
#include "ptrain/train/progress.h"
#include "ptrain/train/schedule.h"

namespace ptrain::train {

namespace {

// NCCL and the caching allocator work on the current device: make it this process's one first.
std::unique_ptr<strategies::Strategy> make_strategy_on_device(const Plan& plan) {
  const torch::Device& device = plan.device;
#if PTRAIN_WITH_CUDA
  if (device.is_cuda()) c10::cuda::set_device(device.index());
#endif
  return strategies::make_strategy(plan.config, device, plan.launch);
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

// Sums kept on the device during an epoch; read back only when progress is shown.
struct RunningTotals {
  torch::Tensor loss_sum, correct, samples;

  explicit RunningTotals(const torch::Device& device) {
    auto options = torch::TensorOptions().dtype(torch::kDouble).device(device);
    loss_sum = torch::zeros({}, options);
    correct = torch::zeros({}, options);
    samples = torch::zeros({}, options);
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
        progress_style_(Progress::style_from(c_.run.progress)) {
    record_.command_line = command_line;
  }

  metrics::RunRecord run();

 private:
  void load_data();
  void build_model();
  void build_optimizer();
  void resume();
  void train_epoch(int64_t epoch, int64_t first_micro_batch, Progress& progress);
  torch::Tensor optimizer_step(int64_t global_step);
  Evaluation evaluate();
  void save(TrainingPosition position);
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
  int64_t cpu_bytes_before_model_ = 0;  // CPU runs: held by tensors once the data is loaded
  metrics::RunRecord record_;
};

void TrainingRun::load_data() {
  const int threads = static_cast<int>(c_.data.loader_threads);
  const data::DataSpec spec = plan_.open_data ? plan_.data : data::resolve_image_loading(plan_.data);
  const auto open = [&](bool train) {
    return plan_.open_data ? plan_.open_data(train) : data::open_dataset(spec, train, threads);
  };
  train_set_ = data::spread_subset(open(/*train=*/true), c_.data.train_limit);
  test_set_ = data::spread_subset(open(/*train=*/false), c_.data.test_limit);
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
  eval_augment.channels_last = c_.model.channels_last;
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
  total_steps_ = steps_per_epoch_ * c_.run.epochs;
  if (c_.run.max_steps > 0) total_steps_ = std::min(total_steps_, c_.run.max_steps);
}

void TrainingRun::build_model() {
  torch::manual_seed(c_.run.seed);
  const models::ModelSpec spec = model_spec(c_, train_set_, test_set_);
  model_ = plan_.make_model ? plan_.make_model(spec) : models::make_model(spec);
  if (!c_.model.weights.empty()) models::load_weights(*model_, c_.model.weights);
  model_->to(device_);
  if (policy_.param_dtype != torch::kFloat) model_->to(policy_.param_dtype);
  if (c_.model.channels_last) convert_to_channels_last(*model_);
  model_->set_activation_checkpointing(c_.model.activation_checkpointing);
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
  optimizer_ = make_optimizer(c_.optim, target_->params(), target_->names());
  const auto state_bytes = target_->model_state_bytes(optimizer_->state());
  record_.model_state_param_bytes = state_bytes.params;
  record_.model_state_grad_bytes = state_bytes.grads;
  record_.model_state_optimizer_bytes = state_bytes.optimizer;
  if (policy_.loss_scaling) scaler_.emplace(precision::loss_scaler_options(policy_), device_);
  schedule_ = std::make_unique<LrSchedule>(c_.optim, steps_per_epoch_, std::max<int64_t>(total_steps_, 1));
  totals_ = std::make_unique<RunningTotals>(device_);
}

void TrainingRun::resume() {
  if (plan_.resume_path.empty()) return;
  Checkpoint ckpt = load_checkpoint(plan_.resume_path);
  load_model_state(ckpt.model);
  optimizer_->load_state(target_->local_optimizer_state(ckpt.optimizer), plan_.resume_path);
  if (scaler_) scaler_->load_state(ckpt.scaler);
  totals_->load(ckpt.progress);
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
  ckpt.progress = totals_->named();
  ckpt.run = config::to_json(c_);
  save_checkpoint(path, ckpt);
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

// Unscale, clip, update: everything after the last micro-batch's backward. Returns nothing to the host.
torch::Tensor TrainingRun::optimizer_step(int64_t global_step) {
  strategy_->finish_backward();
  target_->gradients_ready();
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
  optimizer_->step(schedule_->lr(global_step), scaler_ ? &scaler_->found_inf() : nullptr);
  target_->parameters_updated();
  if (scaler_) scaler_->update();
  optimizer_->zero_grad();
  return grad_norm;
}

void TrainingRun::train_epoch(int64_t epoch, int64_t first_micro_batch, Progress& progress) {
  const int64_t accum = c_.optim.grad_accum;
  train_loader_->start_epoch(epoch, first_micro_batch);
  progress.start_epoch(epoch);
  int64_t step_in_epoch = first_micro_batch / accum;
  metrics::Stopwatch window;
  int64_t window_images = 0, window_predictions = 0;
  auto window_loss = torch::zeros({}, totals_->loss_sum.options());

  while (step_in_epoch < steps_per_epoch_ && global_step_ < total_steps_) {
    torch::Tensor step_loss;  // for hooks_.on_step only
    for (int64_t micro = 0; micro < accum; ++micro) {
      auto batch = train_loader_->next();
      check(batch.has_value(), "data loader ended before the epoch's last step");
      strategy_->set_gradient_sync(micro == accum - 1);
      torch::Tensor logits;
      {
        precision::AutocastGuard autocast(device_.type(), policy_.autocast, policy_.autocast_dtype);
        logits = strategy_->forward(*model_, batch->images);
      }
      const auto predictions = prediction_logits(logits);
      const auto labels = prediction_labels(batch->labels);
      auto loss = torch::nn::functional::cross_entropy(predictions.to(torch::kFloat), labels);
      auto scaled = accum > 1 ? loss / static_cast<double>(accum) : loss;
      if (hooks_.on_step) step_loss = step_loss.defined() ? step_loss + loss.detach() : loss.detach();
      (scaler_ ? scaler_->scale(scaled) : scaled).backward();

      torch::NoGradGuard no_grad;
      const auto n = batch->labels.size(0);
      const auto predicted = labels.size(0);  // n, or n x T for tokens: loss and accuracy are per prediction
      auto batch_loss = loss.detach().to(torch::kDouble) * static_cast<double>(predicted);
      totals_->loss_sum.add_(batch_loss);
      window_loss.add_(batch_loss);
      totals_->correct.add_(predictions.argmax(1).eq(labels).sum());
      totals_->samples.add_(static_cast<double>(predicted));
      window_predictions += predicted;
      window_images += n * strategy_->world_size();
    }
    optimizer_step(global_step_);
    ++global_step_;
    if (hooks_.on_step) hooks_.on_step({epoch, global_step_, step_loss.item<double>() / static_cast<double>(accum)});
    if (global_step_ == steady_from_step_) {
      metrics::synchronize(device_);
      steady_start_ = std::chrono::steady_clock::now();
    }
    ++step_in_epoch;

    if (c_.run.checkpoint_every > 0 && global_step_ % c_.run.checkpoint_every == 0)
      save({epoch, step_in_epoch * accum, global_step_, 0, 0});
    if (step_in_epoch % c_.run.log_every == 0 || step_in_epoch == steps_per_epoch_) {
      const double mean_loss = window_loss.item<double>() / static_cast<double>(window_predictions);
      const double seconds = window.elapsed_seconds();
      progress.update(step_in_epoch, seconds > 0 ? window_images / seconds : 0, mean_loss);
      window_loss.zero_();
      window_images = 0;
      window_predictions = 0;
      window.restart();
    }
  }
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
    loss_sum.add_(torch::nn::functional::cross_entropy(
        predictions.to(torch::kFloat), labels,
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)));
    correct.add_(predictions.argmax(1).eq(labels).sum());
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
#if PTRAIN_WITH_CUDA
  if (device_.is_cuda()) {
    // cuDNN picks the fastest kernels for the fixed shapes of a training run, as the PyTorch reference does.
    at::globalContext().setBenchmarkCuDNN(true);
  }
#endif
  if (device_.is_cpu()) metrics::install_cpu_allocation_counter();
  load_data();
  if (device_.is_cpu()) {
    metrics::reset_cpu_allocator_peak();
    cpu_bytes_before_model_ = metrics::cpu_allocated_bytes();
  }
  build_model();
  build_optimizer();
  resume();

  Progress progress(progress_style_, c_.run.epochs, steps_per_epoch_);
  progress.message(describe(plan_));
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
    if (first == 0) *totals_ = RunningTotals(device_);
    metrics::synchronize(device_);
    metrics::Stopwatch epoch_clock;
    const auto epoch_start = std::chrono::steady_clock::now();
    const int64_t step_before = global_step_;
    train_epoch(epoch, first, progress);
    const double epoch_seconds = epoch_clock.elapsed_seconds_after_sync(device_);
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
    strategy_->all_reduce_sum(totals_->loss_sum);
    strategy_->all_reduce_sum(totals_->correct);
    strategy_->all_reduce_sum(totals_->samples);
    const double samples = std::max(1.0, totals_->samples.item<double>());
    epoch_record.train_loss = totals_->loss_sum.item<double>() / samples;
    epoch_record.train_accuracy = totals_->correct.item<double>() / samples;

    const bool last_epoch = epoch + 1 == c_.run.epochs || global_step_ >= total_steps_;
    if (c_.run.eval_each_epoch || last_epoch) {
      last_eval = evaluate();
      evaluated = true;
      epoch_record.test_loss = last_eval.loss;
      epoch_record.test_accuracy = last_eval.accuracy;
    }
    record_.epochs_detail.push_back(epoch_record);
    save({epoch + 1, 0, global_step_, 0, 0});

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
  export_weights();

  record_.model = c_.model.name;
  record_.dataset = c_.data.dataset;
  record_.precision = policy_.name + (policy_.master_weights ? "+master" : "");
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
  record_.ptrain_version = PTRAIN_VERSION;
  record_.torch_version = compat::torch_version();
  record_.environment = metrics::describe_environment(device_);
  record_.extra["config"] = config::to_json(c_);
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
  const auto size = [](c10::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)); };
  const int64_t slots = c.optim.name == "adamw" ? 2 : (c.optim.momentum > 0 ? 1 : 0);
  const int64_t optimized = p.master_weights ? size(p.master_dtype) : size(p.param_dtype);
  const int64_t per_param = 2 * size(p.param_dtype) + slots * optimized + (p.master_weights ? 2 * optimized : 0);
  const bool sharded = c.run.strategy.rfind("zero", 0) == 0 || c.run.strategy == "fsdp";
  std::ostringstream out;
  const auto newline = what.find('\n');
  out << "out of memory on " << plan.device.str() << " under --strategy " << c.run.strategy << " ("
      << what.substr(0, newline) << ").\n"
      << "Model states take " << per_param << " bytes a parameter (" << p.name << ", " << c.optim.name << ")"
      << (sharded ? ", divided among the ranks as the strategy shards them" : " on every rank, whole") << ". ";
  if (c.run.strategy == "zero3" || c.run.strategy == "fsdp") {
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
    // CUDA's caching allocator says "out of memory", the CPU allocator "can't allocate memory".
    if (what.find("out of memory") == std::string::npos && what.find("can't allocate memory") == std::string::npos) throw;
    throw Error(out_of_memory_advice(plan, what));
  }
}

}  // namespace ptrain::train
