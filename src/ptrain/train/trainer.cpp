#include "ptrain/train/trainer.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <thread>

#include "ptrain/core/cuda_runtime.h"
#include "ptrain/core/error.h"
#include "ptrain/core/text.h"
#include "ptrain/core/torch_compat.h"
#include "ptrain/dist/cpu_threads.h"
#include "ptrain/kernels/cross_entropy.h"
#include "ptrain/kernels/fp8_linear.h"
#include "ptrain/metrics/cpu_allocator.h"
#include "ptrain/metrics/environment.h"
#include "ptrain/metrics/memory.h"
#include "ptrain/models/model_summary.h"
#include "ptrain/models/state_dict.h"
#include "ptrain/models/torchscript_model.h"
#include "ptrain/models/zoo.h"
#include "ptrain/precision/autocast_guard.h"
#include "ptrain/strategies/model_state_arithmetic.h"
#include "ptrain/train/rank_agreement.h"
#include "ptrain/train/model_probe.h"
#include "ptrain/train/training_run.h"

namespace ptrain::train {

namespace {

// NCCL and the caching allocator work on the current device: make it this process's one first.
std::unique_ptr<strategies::Strategy> make_strategy_on_device(const Plan& plan) {
  const torch::Device& device = plan.device;
  if (device.is_cuda()) cuda_runtime::set_current_device(device.index());
  return strategies::make_strategy(plan.strategy, plan.strategy_options, plan.precision, device, plan.launch);
}

void convert_to_channels_last(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters()) {
    if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
  }
}

// "epoch 3: 1m 02s, 812 img/s, train loss 0.4210 acc 0.8472, test loss ...": what an epoch's end prints (tokens/s
// for a language model's sequences of seq_len tokens).
std::string epoch_summary(int64_t epoch, const metrics::EpochRecord& epoch_record, int64_t seq_len) {
  char summary[256];
  std::snprintf(summary, sizeof(summary), "epoch %lld: %s, %s, train loss %.4f acc %.4f",
                static_cast<long long>(epoch + 1), format_duration(epoch_record.wall_seconds).c_str(),
                throughput_text(epoch_record.images_per_second, seq_len).c_str(), epoch_record.train_loss,
                *epoch_record.train_accuracy);
  std::string line = summary;
  if (epoch_record.test_accuracy) {
    std::snprintf(summary, sizeof(summary), ", test loss %.4f acc %.4f", *epoch_record.test_loss,
                  *epoch_record.test_accuracy);
    line += summary;
  }
  return line;
}

}  // namespace

TrainingRun::TrainingRun(const Plan& plan, const std::string& command_line, const TrainHooks& hooks)
    : plan_(plan), c_(plan.config), device_(plan.device), policy_(plan.precision), hooks_(hooks),
      strategy_(make_strategy_on_device(plan)),
      stop_rules_({plan.on_divergence, c_.run.stop_at_step, hooks.stop_signal, strategy_->is_main()}, device_,
                  strategy_->world_size(), [this](torch::Tensor& t) { strategy_->all_reduce_sum(t); }),
      progress_style_(Progress::style_from(c_.run.progress)), phases_(device_),
      profiler_(c_.run.profile_out, plan.profile_first_step, plan.profile_last_step, device_, strategy_->is_main()) {
  check_ranks_agree(plan_, *strategy_);  // before any collective moves model data
  record_.command_line = command_line;
}

metrics::RunRecord TrainingRun::run() {
  open_checkpoint_dir();
  const auto run_stream = use_run_stream(device_);
  set_up_device();
  load_data_or_explain();
  if (device_.is_cpu()) {
    metrics::reset_cpu_allocator_peak();
    cpu_bytes_before_model_ = metrics::cpu_allocated_bytes();
  }
  if (hooks_.on_step_memory) phase_peaks_.emplace(device_.is_cuda() ? device_.index() : -1, cpu_bytes_before_model_);
  build_model();
  build_optimizer();
  resume();
  reserve_checkpoint_staging();
  open_scalar_log();
  divergence_ = std::make_unique<DivergenceWatch>(device_, global_step_, scaler_ ? &*scaler_ : nullptr);
  Progress progress(progress_style_, epochs_, steps_per_epoch_);
  progress.count_tokens(sequence_length());
  announce(progress);
  start_gpu_sampler();
  std::optional<Evaluation> last_eval;
  try {
    last_eval = train_epochs(progress);
    finish_checkpoint_writes();  // a paused run's checkpoint; the last epoch's waited already
    // A paused run's weights are not the trained ones: its resume writes them.
    if (!trained_ && !stop_rules_.paused()) export_weights();
    trained_ = true;
    if (sampler_) sampler_->stop();
    profiler_.finish(global_step_);
    fill_record(run_clock_, last_eval);
  } catch (const RunStopped&) {
    throw;
  } catch (const std::exception& e) {
    // A divergence ends the run on purpose: its record says so, and nothing diverged is saved.
    if (stop_rules_.stopping_on_divergence()) stop_diverged(e);
    // A failure in a step may leave the state half updated: only what was saved before it counts, and the
    // error passes on as it is. Once the state is written, the failure must not hide it.
    if (!evaluating_ && !trained_) throw;
    fail_keeping_trained_state(e);
  }
  // Under --on-divergence warn the run trains to its end, and its record must not read as a good one.
  record_.extra["run_end"] =
      run_end(stop_rules_.paused() ? "paused" : stop_rules_.diverged_at_step() ? "diverged" : "completed", "");
  return record_;
}

void TrainingRun::set_up_device() {
  torch::set_num_threads(static_cast<int>(
      dist::intra_op_threads(c_.run.threads, plan_.launch.local_world_size, std::thread::hardware_concurrency())));
  if (!plan_.threads_warning.empty() && plan_.launch.rank == 0)
    std::cerr << "ptrain: warning: " << plan_.threads_warning << std::endl;
  precision::apply_global_math_mode(policy_);
  if (device_.is_cuda()) {
    // cuDNN picks the fastest kernels for the fixed shapes of a training run, as the PyTorch reference does,
    // unless --no-cudnn-benchmark trades that search (about 30 s of a ResNet-50 run in fp32) for its heuristics.
    at::globalContext().setBenchmarkCuDNN(c_.run.cudnn_benchmark);
  }
  if (device_.is_cpu()) metrics::install_cpu_allocation_counter();
}

void TrainingRun::build_model() {
  torch::manual_seed(c_.run.seed);
  const models::ModelSpec spec = model_spec(c_, train_set_, test_set_);
  classes_ = spec.num_classes;
  model_ = plan_.make_model ? plan_.make_model(spec) : models::make_model(spec);
  if (!c_.model.weights.empty()) models::load_weights(*model_, c_.model.weights);
  model_->to(device_);
  // As PyTorch's model.half(): floating-point tensors only. LibTorch's Module::to(dtype) casts every one, and a
  // bf16 num_batches_tracked stops counting at 256 (the momentum-less batch norms' 1/count with it).
  if (policy_.param_dtype != torch::kFloat) models::to_floating_point(*model_, c10::nullopt, policy_.param_dtype);
  if (plan_.channels_last) convert_to_channels_last(*model_);
  model_->set_activation_checkpointing(c_.model.activation_checkpointing);
  model_->set_fused_kernels(c_.run.fused_kernels);
  model_->set_relu_recompute(c_.run.relu_recompute);
  model_->set_conv_bn_fusion(c_.run.conv_bn_fusion);
  model_->set_fusions(models::fusions_skipping(c_.run.skip_fusions));
  const std::vector<std::string> has = model_->fusions();
  for (const auto& fusion : c_.run.skip_fusions) {
    check(std::find(has.begin(), has.end(), fusion) != has.end(),
          "--skip-fusions " + fusion + ": --model " + c_.model.name + " has no such fusion in this run (its fusions: " +
              (has.empty() ? std::string("none") : join(has, ", ")) + ")");
  }
  if (policy_.fp8_matmuls) {
    const models::Fp8Options options = fp8_options(c_.precision);
    models::Fp8Layers fp8 = model_->set_fp8_linear(true, options);
    const int64_t rows = c_.run.batch_size * spec.seq_len;
    // cuBLASLt's FP8 GEMMs take rows in multiples of 16: a micro-batch of other rows runs every layer in bf16.
    if (fp8.fp8 > 0 && spec.seq_len > 0 && rows % 16 != 0)
      fp8.why += std::string(fp8.why.empty() ? "" : "; ") + "a micro-batch's " + std::to_string(rows) +
                 " rows (batch x tokens) are not a multiple of 16: every layer falls back to bf16";
    record_.extra["fp8_layers"] = {{"fp8", fp8.fp8}, {"kept_in_bf16", fp8.kept}, {"why", fp8.why},
                                   {"head_in_fp8", fp8.head_in_fp8},
                                   {"scaling", options.delayed_scaling
                                                   ? "delayed (amax history of " +
                                                         std::to_string(kernels::kFp8AmaxHistory) + ")"
                                                   : "dynamic"},
                                   {"casts", c_.run.fused_kernels && kernels::fused_kernels_available(device_)
                                                 ? "fused"
                                                 : "reference"}};
    fp8_summary_ = "fp8: " + models::describe_fp8_layers(fp8);
  }
  if (models::is_torchscript_path(c_.model.name)) {
    const bool tokens = spec.image_size == 0 && spec.seq_len > 0;
    const auto probe = tokens ? torch::zeros({2, spec.seq_len}, torch::TensorOptions().dtype(torch::kInt64).device(device_))
                              : torch::zeros({2, spec.in_channels, spec.image_size, spec.image_size},
                                             torch::TensorOptions().dtype(policy_.compute_dtype).device(device_));
    probe_as_trained(*model_, c_.model.name,
                     plan_.channels_last && !tokens ? probe.contiguous(at::MemoryFormat::ChannelsLast) : probe, policy_,
                     device_);
  }
  if (const auto* scripted = dynamic_cast<const models::TorchScriptModel*>(model_.get())) {
    if (!scripted->recorded_mode_warning().empty() && strategy_->is_main())
      std::cerr << "ptrain: warning: " << scripted->recorded_mode_warning() << std::endl;
  }
  model_->train();
  const auto summary = models::summarize_model(*model_);
  model_summary_ = "model " + model_->name() + ": " + models::describe_model_summary(summary);
  nlohmann::json parts = nlohmann::json::array();
  for (const auto& part : summary.parts)
    parts.push_back({{"name", part.name}, {"parameters", part.parameters}, {"trainable", part.trainable}});
  nlohmann::json dtypes = nlohmann::json::object();
  for (const auto& [dtype, count] : summary.dtypes) dtypes[dtype] = count;
  record_.extra["model_summary"] = {{"parameters", summary.parameters},       {"trainable", summary.trainable},
                                    {"parameter_bytes", summary.parameter_bytes}, {"buffers", summary.buffers},
                                    {"buffer_bytes", summary.buffer_bytes},     {"dtypes", dtypes},
                                    {"modules", parts}};
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

void TrainingRun::announce(Progress& progress) {
  progress.message(describe(plan_));
  progress.message(model_summary_);
  if (record_.model_state_param_bytes) {
    const int64_t params = *record_.model_state_param_bytes, grads = record_.model_state_grad_bytes.value_or(0),
                  optimizer = record_.model_state_optimizer_bytes.value_or(0);
    progress.message("model state" + std::string(strategy_->world_size() > 1 ? " on this rank" : "") +
                     ": parameters " + models::byte_text(params) + ", gradients " + models::byte_text(grads) +
                     ", optimizer " + models::byte_text(optimizer) + " = " +
                     models::byte_text(params + grads + optimizer));
  }
  if (plan_.profile_first_step > 0) {
    check(plan_.profile_first_step <= total_steps_,
          "--profile-steps " + c_.run.profile_steps + ": the run trains " + std::to_string(total_steps_) +
              " steps, so step " + std::to_string(plan_.profile_first_step) + " never comes");
  }
  record_.cuda_graphs_note = capture_obstacle();
  std::unique_ptr<CapturedStep> graph;
  if (record_.cuda_graphs_note.empty()) {
    graph = make_captured_step(device_);
    if (!graph) record_.cuda_graphs_note = "off: this ptrain was built without CUDA graphs";
  }
  steps_ = std::make_unique<StepRunner>(std::move(graph), phases_,
                                        [this](const StepRunner::Batches& images, const StepRunner::Batches& labels) {
                                          device_step(images, labels);
                                        });
  if (device_.is_cuda()) {
    progress.message("CUDA graphs: " + (record_.cuda_graphs_note.empty()
                                            ? "the whole step is captured after " +
                                                  std::to_string(StepRunner::kEagerStepsBeforeCapture) + " eager steps"
                                            : record_.cuda_graphs_note));
  }
  if (!fp8_summary_.empty()) progress.message(fp8_summary_);
  flops_ = count_run_flops(*model_, sample_shape(), device_, policy_.mode,
                           c_.run.batch_size * c_.optim.grad_accum * devices(), devices());
  progress.message(flops_.describe());
  progress.message("data " + train_set_.description + ": " + std::to_string(train_set_.size()) + " train, " +
                   std::to_string(test_set_.size()) + " test; " + std::to_string(steps_per_epoch_) +
                   " steps per epoch, " + std::to_string(total_steps_) + " in all");
  const auto& transforms = record_.extra["data_transforms"];
  progress.message("transforms: train " + transforms.at("train").get<std::string>() + "; test " +
                   transforms.at("test").get<std::string>());
}

std::vector<int64_t> TrainingRun::sample_shape() const {
  if (train_set_.is_tokens()) return {train_set_.images.size(1)};
  const int64_t size = c_.data.image_size;
  return {train_set_.channels(), size > 0 ? size : train_set_.height(), size > 0 ? size : train_set_.width()};
}

void TrainingRun::start_gpu_sampler() {
  if (device_.is_cuda()) {
    std::vector<int> nvml_indices;
    for (const auto& device : local_devices()) {
      metrics::reset_cuda_allocator_peak(device.index());
      const int nvml_index = metrics::nvml_index_for_cuda_device(device.index());
      if (nvml_index >= 0) nvml_indices.push_back(nvml_index);
    }
    if (!nvml_indices.empty()) {
      sampler_.emplace(nvml_indices);
      sampler_->start();
    }
  }
}

std::optional<Evaluation> TrainingRun::train_epochs(Progress& progress) {
  clock_.plan_steady(global_step_, total_steps_);

  std::optional<Evaluation> last_eval;
  if (plan_.restart.count > 0 && !plan_.resume_path.empty() && global_step_ == total_steps_) {
    // Resumed at the run's end (resume_from allows it to a restarted job only): nothing to train, the
    // weights, evaluation and record of the run's end still to write.
    export_weights();
    trained_ = true;
    evaluating_ = true;
    last_eval = evaluate();
    evaluating_ = false;
    return last_eval;
  }
  for (int64_t epoch = start_.epoch; epoch < epochs_ && global_step_ < total_steps_ && !stop_rules_.paused(); ++epoch) {
    int64_t steps_done = 0;
    metrics::EpochRecord epoch_record = timed_epoch(epoch, progress, steps_done);
    if (stop_rules_.signal()) {
      record_.epochs_detail.push_back(epoch_record);
      stop_at_signal({epoch, micro_batches_of(steps_done), global_step_, 0, 0});
    }
    const bool last_epoch = epoch + 1 == epochs_ || global_step_ >= total_steps_;
    if (stop_rules_.paused()) {
      // A pause evaluates nothing and saves its place in the epoch, even at the epoch's end: the resumed run
      // evaluates that epoch as the run never paused does.
      record_.epochs_detail.push_back(epoch_record);
      save({epoch, micro_batches_of(steps_done), global_step_, 0, 0});
      progress.end_epoch(epoch_summary(epoch, epoch_record, sequence_length()));
      if (strategy_->is_main())
        std::cout << "paused after step " << global_step_ << " of " << total_steps_
                  << " (--stop-at-step): continue with --resume latest --checkpoint-dir " << c_.run.checkpoint_dir
                  << std::endl;
      break;
    }
    // Saved before the evaluation: an evaluation that fails (a model that cannot run in eval mode, memory
    // that runs out at the evaluation's batch size) must not take the trained state with it. A run stopped
    // inside the epoch (--max-steps) saves where it stopped, so that a resume continues it.
    save(steps_done < steps_per_epoch_ ? TrainingPosition{epoch, micro_batches_of(steps_done), global_step_, 0, 0}
                                       : TrainingPosition{epoch + 1, 0, global_step_, 0, 0});
    if (last_epoch) {
      // Trained only once the last checkpoint is on disk: its write failing fails the run as a synchronous
      // save's would, and --save-weights and the record come after it.
      finish_checkpoint_writes();
      export_weights();
      trained_ = true;
      // Nothing is replayed after the last step: the final evaluation's activations take the memory the graph's
      // pool held instead of adding to it (ResNet-50 amp-bf16 on one H200: 8.33 GiB on the device at the
      // evaluation against 7.27 while training, docs/results 2026-12-03 memory side by side).
      if (steps_) steps_->release_graph();
    }
    if (c_.run.eval_each_epoch || last_epoch) {
      evaluating_ = true;
      last_eval = evaluate();
      evaluating_ = false;
      epoch_record.test_loss = last_eval->loss;
      epoch_record.test_accuracy = last_eval->accuracy;
    }
    record_.epochs_detail.push_back(epoch_record);
    if (scalar_log_) log_epoch(epoch_record);
    progress.end_epoch(epoch_summary(epoch, epoch_record, sequence_length()));
  }
  return last_eval;
}

metrics::EpochRecord TrainingRun::timed_epoch(int64_t epoch, Progress& progress, int64_t& steps_done) {
  const int64_t first = epoch == start_.epoch ? start_.micro_batch : 0;
  if (first == 0) totals_->reset();
  metrics::synchronize(device_);
  metrics::Stopwatch epoch_clock;
  const auto epoch_start = std::chrono::steady_clock::now();
  const int64_t step_before = global_step_;
  clock_.begin_epoch(step_before);
  steps_done = train_epoch(epoch, first, progress);
  const double epoch_seconds = epoch_clock.elapsed_seconds_after_sync(device_);
  collect_step_phases();
  check_divergence();
  const int64_t images = (micro_batches_of(steps_done) - first) * c_.run.batch_size * devices();
  clock_.add_epoch(epoch_start, epoch_seconds, step_before, global_step_, images);

  metrics::EpochRecord epoch_record;
  epoch_record.epoch = epoch;
  epoch_record.wall_seconds = epoch_seconds;
  epoch_record.images = images;
  epoch_record.images_per_second = epoch_seconds > 0 ? images / epoch_seconds : 0;
  const RunningTotals epoch_totals = reduced_totals();
  const double samples = std::max(1.0, epoch_totals.samples.item<double>());
  epoch_record.train_loss = epoch_totals.loss_sum.item<double>() / samples;
  epoch_record.train_accuracy = epoch_totals.correct.item<double>() / samples;
  return epoch_record;
}

int64_t TrainingRun::train_epoch(int64_t epoch, int64_t first_micro_batch, Progress& progress) {
  const int64_t accum = c_.optim.grad_accum;
  train_loader_->start_epoch(epoch, first_micro_batch);
  progress.start_epoch(epoch);
  // A position is at a window's end: a multiple of accum, or the epoch's end after a shorter last window.
  int64_t step_in_epoch = (first_micro_batch + accum - 1) / accum;
  ProgressWindow window;
  totals_->window_loss.zero_();
  StepBatches batches;
  while (step_in_epoch < steps_per_epoch_ && global_step_ < total_steps_) {
    profiler_.before_step(global_step_ + 1);
    load_step_batches(step_in_epoch, batches, window);
    run_step(batches);
    profiler_.after_step(global_step_);
    after_step(epoch, batches);
    ++step_in_epoch;
    save_on_cadence(epoch, step_in_epoch);
    const bool progress_read = step_in_epoch % c_.run.log_every == 0 || step_in_epoch == steps_per_epoch_;
    if (progress_read) read_progress(step_in_epoch, window, progress);
    if (stop_rules_.stop_after(global_step_, total_steps_, progress_read)) break;
  }
  return step_in_epoch;
}

void TrainingRun::load_step_batches(int64_t step_in_epoch, StepBatches& batches, ProgressWindow& window) {
  const int64_t step_micro_batches = micro_batches_of(step_in_epoch + 1) - micro_batches_of(step_in_epoch);
  batches.images.resize(static_cast<size_t>(step_micro_batches));
  batches.labels.resize(static_cast<size_t>(step_micro_batches));
  for (int64_t micro = 0; micro < step_micro_batches; ++micro) {
    const metrics::Stopwatch waiting;
    auto batch = train_loader_->next();
    phases_.add_host_seconds(metrics::StepPhase::kData, waiting.elapsed_seconds());
    check(batch.has_value(), "data loader ended before the epoch's last step");
    batches.images[micro] = batch->images;
    batches.labels[micro] = batch->labels;
    window.predictions += prediction_labels(batch->labels).size(0);
    window.images += batch->labels.size(0) * strategy_->world_size();
  }
}

void TrainingRun::run_step(const StepBatches& batches) {
  optimizer_->set_learning_rate(schedule_->lr(global_step_));
  // The shorter last window of an epoch runs eagerly: a captured step replays accum micro-batches.
  if (batches.micro_batches() < c_.optim.grad_accum) {
    steps_->run_eagerly(batches.images, batches.labels);
  } else {
    steps_->run(batches.images, batches.labels);
  }
  ++global_step_;
}

void TrainingRun::after_step(int64_t epoch, const StepBatches& batches) {
  if (hooks_.on_step)
    hooks_.on_step({epoch, global_step_, step_loss_.item<double>() / static_cast<double>(batches.micro_batches())});
  if (clock_.steady_starts_after(global_step_)) {
    metrics::synchronize(device_);
    clock_.start_steady();
    phases_.start_counting();
    steps_->take_replays();
  }
  // On the CPU the step's work is done when it returns, so the host's clock times each step; on CUDA only the
  // progress reads wait for the device, and a stretch of steps ends there.
  if (!device_.is_cuda()) clock_.mark(global_step_);
}

void TrainingRun::save_on_cadence(int64_t epoch, int64_t step_in_epoch) {
  // A step that ends the epoch (or the run) is saved once, by the epoch's closing save right after: saving it
  // here too would write the same state twice, the second write waiting for the first.
  const bool epoch_ends = step_in_epoch == steps_per_epoch_ || global_step_ >= total_steps_;
  if (c_.run.checkpoint_every > 0 && global_step_ % c_.run.checkpoint_every == 0 && !epoch_ends)
    save({epoch, micro_batches_of(step_in_epoch), global_step_, 0, 0});
}

void TrainingRun::read_progress(int64_t step_in_epoch, ProgressWindow& window, Progress& progress) {
  const double mean_loss = totals_->window_loss.item<double>() / static_cast<double>(window.predictions);
  collect_step_phases();  // the read above waited for the device
  clock_.mark(global_step_);
  const double seconds = window.clock.elapsed_seconds();
  const double samples_per_second = seconds > 0 ? window.images / seconds : 0;
  if (scalar_log_) {  // before the divergence check, which may end the run: the log shows the window that diverged
    const double predictions = static_cast<double>(window.predictions * strategy_->world_size());
    log_progress(mean_loss, samples_per_second, seconds > 0 ? predictions / seconds : 0);
  }
  check_divergence();
  const auto utilisation = flops_.at(samples_per_second);
  progress.update(step_in_epoch, samples_per_second, mean_loss, utilisation ? utilisation->mfu : std::nullopt);
  totals_->window_loss.zero_();
  window = ProgressWindow{};
}

int64_t TrainingRun::sequence_length() const { return train_set_.is_tokens() ? train_set_.images.size(1) : 0; }

int64_t TrainingRun::micro_batches_of(int64_t steps) const {
  return std::min(steps * c_.optim.grad_accum, micro_batches_per_epoch_);
}

Evaluation TrainingRun::evaluate() {
  torch::NoGradGuard no_grad;
  // Each rank evaluates its share of the test split: all with rank 0's statistics, which checkpoints keep.
  strategy_->sync_buffers();
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
  stop_rules_.diverged(divergence_->describe(status, global_step_), status.first_step.value_or(global_step_));
}

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
