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
#include "ptrain/distributed/cpu_threads.h"
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

RunCheckpoints::Options checkpoint_options(const Plan& plan, strategies::Strategy& strategy) {
  RunCheckpoints::Options options;
  options.dir = plan.checkpoints.dir;
  options.keep = plan.checkpoints.keep;
  options.overwrite = plan.checkpoints.overwrite;
  options.async = plan.checkpoints.async;
  options.sharded = plan.strategy_options.state_dict == strategies::StateDict::sharded;
  options.resume_path = plan.resume_path;
  options.save_weights = plan.model.save_weights;
  options.run_config = plan.settings;
  options.devices = strategy.world_size() * strategy.replicas();
  options.batch_size = plan.length.batch_size;
  options.device = plan.device;
  options.rank = strategy.rank();
  options.world_size = strategy.world_size();
  options.is_main = strategy.is_main();
  options.sum_over_ranks = [&strategy](torch::Tensor& t) { strategy.all_reduce_sum(t); };
  return options;
}

RunMonitor::Options monitor_options(const Plan& plan, const TrainHooks& hooks, bool is_main) {
  RunMonitor::Options options;
  options.device = plan.device;
  options.is_main = is_main;
  options.progress_style = Progress::style_from(plan.reporting.progress);
  options.tensorboard = plan.reporting.tensorboard;
  options.log_jsonl = plan.reporting.log_jsonl;
  options.profile_out = plan.reporting.profile_out;
  options.profile_first_step = plan.reporting.profile_first_step;
  options.profile_last_step = plan.reporting.profile_last_step;
  if (hooks.on_step) {
    options.on_step = [on_step = hooks.on_step](int64_t epoch, int64_t step, double loss) {
      on_step({epoch, step, loss});
    };
  }
  if (hooks.on_step_memory) {
    options.on_step_memory = [on_step_memory = hooks.on_step_memory](int64_t step, int64_t forward_backward_bytes,
                                                                      int64_t update_bytes) {
      on_step_memory({step, forward_backward_bytes, update_bytes});
    };
  }
  return options;
}

}  // namespace

TrainingRun::TrainingRun(const Plan& plan, const std::string& command_line, const TrainHooks& hooks)
    : plan_(plan), strategy_(make_strategy_on_device(plan)),
      stop_rules_({plan.on_divergence, plan.cadence.stop_at_step, hooks.stop_signal, strategy_->is_main()},
                  plan.device, strategy_->world_size(), [this](torch::Tensor& t) { strategy_->all_reduce_sum(t); }),
      checkpoints_(checkpoint_options(plan, *strategy_), *this, stop_rules_),
      monitor_(monitor_options(plan, hooks, strategy_->is_main())), recorder_(command_line) {
  check_ranks_agree(plan_, *strategy_);  // before any collective moves model data
}

metrics::RunRecord TrainingRun::run() {
  checkpoints_.open();
  const auto run_stream = use_run_stream(device());
  set_up_device();
  load_data_or_explain();
  if (device().is_cpu()) {
    recorder_.count_cpu_from_here();
  }
  monitor_.track_phase_memory(recorder_.cpu_bytes_before_model());
  build_step_engine();
  resume();
  checkpoints_.reserve_staging();
  open_scalar_log();
  engine_->watch_divergence(position_.global_step);
  Progress progress = monitor_.progress(data_->epochs(), data_->steps_per_epoch());
  progress.count_tokens(data_->sequence_length());
  announce(progress);
  monitor_.start_gpu_sampler(local_devices());
  std::optional<Evaluation> last_eval;
  try {
    last_eval = train_epochs(progress);
    checkpoints_.finish_writes();  // a paused run's checkpoint; the last epoch's waited already
    // A paused run's weights are not the trained ones: its resume writes them.
    if (!position_.trained && !stop_rules_.paused()) checkpoints_.export_weights(position_.global_step);
    position_.trained = true;
    monitor_.stop_gpu_sampler();
    monitor_.finish_trace(position_.global_step);
    fill_record(last_eval);
  } catch (const RunStopped&) {
    throw;
  } catch (const std::exception& e) {
    // A divergence ends the run on purpose: its record says so, and nothing diverged is saved.
    if (stop_rules_.stopping_on_divergence()) stop_diverged(e);
    // A failure in a step may leave the state half updated: only what was saved before it counts, and the
    // error passes on as it is. Once the state is written, the failure must not hide it.
    if (!position_.evaluating && !position_.trained) throw;
    fail_keeping_trained_state(e);
  }
  // Under --on-divergence warn the run trains to its end, and its record must not read as a good one.
  recorder_.note_run_end(
      run_end(stop_rules_.paused() ? "paused" : stop_rules_.diverged_at_step() ? "diverged" : "completed", ""));
  return recorder_.record();
}

void TrainingRun::set_up_device() {
  torch::set_num_threads(static_cast<int>(
      distributed::intra_op_threads(plan_.device_setup.threads, plan_.launch.local_world_size,
                             std::thread::hardware_concurrency())));
  if (!plan_.threads_warning.empty() && plan_.launch.rank == 0)
    std::cerr << "ptrain: warning: " << plan_.threads_warning << std::endl;
  precision::apply_global_math_mode(policy());
  if (device().is_cuda()) {
    // cuDNN picks the fastest kernels for the fixed shapes of a training run, as the PyTorch reference does,
    // unless --no-cudnn-benchmark trades that search (about 30 s of a ResNet-50 run in fp32) for its heuristics.
    at::globalContext().setBenchmarkCuDNN(plan_.device_setup.cudnn_benchmark);
  }
  if (device().is_cpu()) metrics::install_cpu_allocation_counter();
}

std::shared_ptr<models::Model> TrainingRun::build_model(const models::ModelSpec& spec) {
  std::shared_ptr<models::Model> model = plan_.make_model ? plan_.make_model(spec) : models::make_model(spec);
  if (!plan_.model.weights.empty()) models::load_weights(*model, plan_.model.weights);
  model->to(device());
  // As PyTorch's model.half(): floating-point tensors only. LibTorch's Module::to(dtype) casts every one, and a
  // bf16 num_batches_tracked stops counting at 256 (the momentum-less batch norms' 1/count with it).
  if (policy().param_dtype != torch::kFloat) models::to_floating_point(*model, c10::nullopt, policy().param_dtype);
  if (plan_.channels_last) convert_to_channels_last(*model);
  model->set_activation_checkpointing(plan_.model.activation_checkpointing);
  model->set_fused_kernels(plan_.model.fused_kernels);
  model->set_relu_recompute(plan_.model.relu_recompute);
  model->set_conv_bn_fusion(plan_.model.conv_bn_fusion);
  model->set_fusions(models::fusions_skipping(plan_.model.skip_fusions));
  const std::vector<std::string> has = model->fusions();
  for (const auto& fusion : plan_.model.skip_fusions) {
    check(std::find(has.begin(), has.end(), fusion) != has.end(),
          "--skip-fusions " + fusion + ": --model " + plan_.model.name +
              " has no such fusion in this run (its fusions: " +
              (has.empty() ? std::string("none") : join(has, ", ")) + ")");
  }
  if (policy().fp8_matmuls) {
    const models::Fp8Options& options = plan_.model.fp8;
    models::Fp8Layers fp8 = model->set_fp8_linear(true, options);
    const int64_t rows = plan_.length.batch_size * spec.seq_len;
    // cuBLASLt's FP8 GEMMs take rows in multiples of 16: a micro-batch of other rows runs every layer in bf16.
    if (fp8.fp8 > 0 && spec.seq_len > 0 && rows % 16 != 0)
      fp8.why += std::string(fp8.why.empty() ? "" : "; ") + "a micro-batch's " + std::to_string(rows) +
                 " rows (batch x tokens) are not a multiple of 16: every layer falls back to bf16";
    nlohmann::json layers = {{"fp8", fp8.fp8}, {"kept_in_bf16", fp8.kept}, {"why", fp8.why},
                             {"head_in_fp8", fp8.head_in_fp8},
                             {"scaling", options.delayed_scaling
                                             ? "delayed (amax history of " +
                                                   std::to_string(kernels::kFp8AmaxHistory) + ")"
                                             : "dynamic"},
                             {"casts", plan_.model.fused_kernels && kernels::fused_kernels_available(device())
                                           ? "fused"
                                           : "reference"}};
    recorder_.note_fp8("fp8: " + models::describe_fp8_layers(fp8), std::move(layers));
  }
  if (models::is_torchscript_path(plan_.model.name)) {
    const bool tokens = spec.image_size == 0 && spec.seq_len > 0;
    const auto probe = tokens ? torch::zeros({2, spec.seq_len},
                                             torch::TensorOptions().dtype(torch::kInt64).device(device()))
                              : torch::zeros({2, spec.in_channels, spec.image_size, spec.image_size},
                                             torch::TensorOptions().dtype(policy().compute_dtype).device(device()));
    probe_as_trained(*model, plan_.model.name,
                     plan_.channels_last && !tokens ? probe.contiguous(at::MemoryFormat::ChannelsLast) : probe,
                     policy(), device());
  }
  if (const auto* scripted = dynamic_cast<const models::TorchScriptModel*>(model.get())) {
    if (!scripted->recorded_mode_warning().empty() && strategy_->is_main())
      std::cerr << "ptrain: warning: " << scripted->recorded_mode_warning() << std::endl;
  }
  model->train();
  const auto summary = models::summarize_model(*model);
  nlohmann::json parts = nlohmann::json::array();
  for (const auto& part : summary.parts)
    parts.push_back({{"name", part.name}, {"parameters", part.parameters}, {"trainable", part.trainable}});
  nlohmann::json dtypes = nlohmann::json::object();
  for (const auto& [dtype, count] : summary.dtypes) dtypes[dtype] = count;
  recorder_.note_model("model " + model->name() + ": " + models::describe_model_summary(summary),
                       {{"parameters", summary.parameters},
                        {"trainable", summary.trainable},
                        {"parameter_bytes", summary.parameter_bytes},
                        {"buffers", summary.buffers},
                        {"buffer_bytes", summary.buffer_bytes},
                        {"dtypes", dtypes},
                        {"modules", parts}});
  strategy_->prepare(*model);
  return model;
}

std::vector<torch::Device> TrainingRun::local_devices() const {
  std::vector<torch::Device> devices{device()};
  for (int64_t i = 1; i < strategy_->replicas() && device().is_cuda(); ++i)
    devices.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(device().index() + i));
  return devices;
}

void TrainingRun::build_step_engine() {
  torch::manual_seed(plan_.cadence.seed);
  const models::ModelSpec spec = model_spec(plan_, data_->train_set(), data_->test_set());
  std::shared_ptr<models::Model> model = build_model(spec);
  auto target = strategy_->update_target(*model, policy().master_weights);
  auto optimizer =
      make_optimizer(plan_.optimization.optimizer, target->params(), target->names(), kOptimizerBatchElements,
                     plan_.model.fused_kernels);
  const auto state_bytes = target->model_state_bytes(optimizer->state());
  recorder_.note_model_states(state_bytes.params, state_bytes.grads, state_bytes.optimizer);
  auto schedule = std::make_unique<LrSchedule>(plan_.optimization.schedule, data_->steps_per_epoch(),
                                               std::max<int64_t>(data_->total_steps(), 1));
  StepEngine::Options options;
  options.device = device();
  options.policy = policy();
  options.grad_accum = plan_.length.grad_accum;
  options.clip_grad_norm = plan_.optimization.clip_grad_norm;
  options.optimizer = plan_.optimization.optimizer.kind;
  options.fused_kernels = plan_.model.fused_kernels;
  options.cuda_graphs = plan_.device_setup.cuda_graphs;
  options.classes = spec.num_classes;
  options.report_step_loss = monitor_.follows_steps();
  options.on_step_memory = monitor_.step_memory_hook();
  engine_ = std::make_unique<StepEngine>(std::move(options), *strategy_, monitor_.phases(), monitor_.phase_peaks(),
                                         std::move(model), std::move(target), std::move(optimizer),
                                         std::move(schedule));
}

void TrainingRun::announce(Progress& progress) {
  progress.message(describe(plan_));
  progress.message(recorder_.model_summary());
  const metrics::RunRecord& record = recorder_.record();
  if (record.model_state_param_bytes) {
    const int64_t params = *record.model_state_param_bytes, grads = record.model_state_grad_bytes.value_or(0),
                  optimizer = record.model_state_optimizer_bytes.value_or(0);
    progress.message("model state" + std::string(strategy_->world_size() > 1 ? " on this rank" : "") +
                     ": parameters " + models::byte_text(params) + ", gradients " + models::byte_text(grads) +
                     ", optimizer " + models::byte_text(optimizer) + " = " +
                     models::byte_text(params + grads + optimizer));
  }
  if (plan_.reporting.profile_first_step > 0) {
    check(plan_.reporting.profile_first_step <= data_->total_steps(),
          "--profile-steps " + plan_.reporting.profile_steps + ": the run trains " + std::to_string(data_->total_steps()) +
              " steps, so step " + std::to_string(plan_.reporting.profile_first_step) + " never comes");
  }
  std::string cuda_graphs_note = engine_->capture_obstacle();
  std::unique_ptr<CapturedStep> graph;
  if (cuda_graphs_note.empty()) {
    graph = make_captured_step(device());
    if (!graph) cuda_graphs_note = "off: this ptrain was built without CUDA graphs";
  }
  recorder_.note_cuda_graphs(cuda_graphs_note);
  engine_->make_runner(std::move(graph));
  if (device().is_cuda()) {
    progress.message("CUDA graphs: " + (cuda_graphs_note.empty()
                                            ? "the whole step is captured after " +
                                                  std::to_string(StepRunner::kEagerStepsBeforeCapture) + " eager steps"
                                            : cuda_graphs_note));
  }
  if (!recorder_.fp8_summary().empty()) progress.message(recorder_.fp8_summary());
  monitor_.set_flops(count_run_flops(engine_->model(), data_->sample_shape(), device(), policy().mode,
                                     plan_.length.batch_size * plan_.length.grad_accum * devices(), devices()));
  progress.message(monitor_.flops().describe());
  const data::Dataset& train_set = data_->train_set();
  progress.message("data " + train_set.description + ": " + std::to_string(train_set.size()) + " train, " +
                   std::to_string(data_->test_set().size()) + " test; " + std::to_string(data_->steps_per_epoch()) +
                   " steps per epoch, " + std::to_string(data_->total_steps()) + " in all");
  const auto& transforms = data_->transforms();
  progress.message("transforms: train " + transforms.at("train").get<std::string>() + "; test " +
                   transforms.at("test").get<std::string>());
}

std::optional<Evaluation> TrainingRun::train_epochs(Progress& progress) {
  monitor_.clock().plan_steady(position_.global_step, data_->total_steps());

  std::optional<Evaluation> last_eval;
  if (plan_.restart.count > 0 && !plan_.resume_path.empty() && position_.global_step == data_->total_steps()) {
    // Resumed at the run's end (resume_from allows it to a restarted job only): nothing to train, the
    // weights, evaluation and record of the run's end still to write.
    checkpoints_.export_weights(position_.global_step);
    position_.trained = true;
    position_.evaluating = true;
    last_eval = engine_->evaluate(data_->test_loader());
    position_.evaluating = false;
    return last_eval;
  }
  for (int64_t epoch = position_.start.epoch;
       epoch < data_->epochs() && position_.global_step < data_->total_steps() && !stop_rules_.paused(); ++epoch) {
    int64_t steps_done = 0;
    metrics::EpochRecord epoch_record = timed_epoch(epoch, progress, steps_done);
    if (stop_rules_.signal()) {
      recorder_.add_epoch(epoch_record);
      stop_at_signal({epoch, data_->micro_batches_of(steps_done), position_.global_step, 0, 0});
    }
    const bool last_epoch = epoch + 1 == data_->epochs() || position_.global_step >= data_->total_steps();
    if (stop_rules_.paused()) {
      // A pause evaluates nothing and saves its place in the epoch, even at the epoch's end: the resumed run
      // evaluates that epoch as the run never paused does.
      recorder_.add_epoch(epoch_record);
      checkpoints_.save({epoch, data_->micro_batches_of(steps_done), position_.global_step, 0, 0});
      progress.end_epoch(epoch_summary(epoch, epoch_record, data_->sequence_length()));
      if (strategy_->is_main())
        std::cout << "paused after step " << position_.global_step << " of " << data_->total_steps()
                  << " (--stop-at-step): continue with --resume latest --checkpoint-dir " << plan_.checkpoints.dir
                  << std::endl;
      break;
    }
    // Saved before the evaluation: an evaluation that fails (a model that cannot run in eval mode, memory
    // that runs out at the evaluation's batch size) must not take the trained state with it. A run stopped
    // inside the epoch (--max-steps) saves where it stopped, so that a resume continues it.
    checkpoints_.save(steps_done < data_->steps_per_epoch()
                          ? TrainingPosition{epoch, data_->micro_batches_of(steps_done), position_.global_step, 0, 0}
                          : TrainingPosition{epoch + 1, 0, position_.global_step, 0, 0});
    if (last_epoch) {
      // Trained only once the last checkpoint is on disk: its write failing fails the run as a synchronous
      // save's would, and --save-weights and the record come after it.
      checkpoints_.finish_writes();
      checkpoints_.export_weights(position_.global_step);
      position_.trained = true;
      // Nothing is replayed after the last step: the final evaluation's activations take the memory the graph's
      // pool held instead of adding to it (ResNet-50 amp-bf16 on one H200: 8.33 GiB on the device at the
      // evaluation against 7.27 while training, docs/results 2026-12-03 memory side by side).
      engine_->release_graph();
    }
    if (plan_.cadence.eval_each_epoch || last_epoch) {
      position_.evaluating = true;
      last_eval = engine_->evaluate(data_->test_loader());
      position_.evaluating = false;
      epoch_record.test_loss = last_eval->loss;
      epoch_record.test_accuracy = last_eval->accuracy;
    }
    recorder_.add_epoch(epoch_record);
    if (monitor_.logging()) monitor_.log_epoch(position_.global_step, epochs_done(), epoch_record);
    progress.end_epoch(epoch_summary(epoch, epoch_record, data_->sequence_length()));
  }
  return last_eval;
}

metrics::EpochRecord TrainingRun::timed_epoch(int64_t epoch, Progress& progress, int64_t& steps_done) {
  const int64_t first = epoch == position_.start.epoch ? position_.start.micro_batch : 0;
  if (first == 0) engine_->totals().reset();
  metrics::synchronize(device());
  metrics::Stopwatch epoch_clock;
  const auto epoch_start = std::chrono::steady_clock::now();
  const int64_t step_before = position_.global_step;
  monitor_.clock().begin_epoch(step_before);
  steps_done = train_epoch(epoch, first, progress);
  const double epoch_seconds = epoch_clock.elapsed_seconds_after_sync(device());
  monitor_.collect_step_phases(engine_->runner());
  check_divergence();
  const int64_t images = (data_->micro_batches_of(steps_done) - first) * plan_.length.batch_size * devices();
  monitor_.clock().add_epoch(epoch_start, epoch_seconds, step_before, position_.global_step, images);

  metrics::EpochRecord epoch_record;
  epoch_record.epoch = epoch;
  epoch_record.wall_seconds = epoch_seconds;
  epoch_record.images = images;
  epoch_record.images_per_second = epoch_seconds > 0 ? images / epoch_seconds : 0;
  const RunningTotals epoch_totals = engine_->reduced_totals();
  const double samples = std::max(1.0, epoch_totals.samples.item<double>());
  epoch_record.train_loss = epoch_totals.loss_sum.item<double>() / samples;
  epoch_record.train_accuracy = epoch_totals.correct.item<double>() / samples;
  return epoch_record;
}

int64_t TrainingRun::train_epoch(int64_t epoch, int64_t first_micro_batch, Progress& progress) {
  const int64_t accum = plan_.length.grad_accum;
  data_->train_loader().start_epoch(epoch, first_micro_batch);
  progress.start_epoch(epoch);
  // A position is at a window's end: a multiple of accum, or the epoch's end after a shorter last window.
  int64_t step_in_epoch = (first_micro_batch + accum - 1) / accum;
  ProgressWindow window;
  engine_->totals().window_loss.zero_();
  StepBatches batches;
  while (step_in_epoch < data_->steps_per_epoch() && position_.global_step < data_->total_steps()) {
    monitor_.trace_before_step(position_.global_step + 1);
    load_step_batches(step_in_epoch, batches, window);
    run_step(batches);
    monitor_.trace_after_step(position_.global_step);
    after_step(epoch, batches);
    ++step_in_epoch;
    save_on_cadence(epoch, step_in_epoch);
    const bool progress_read = step_in_epoch % plan_.cadence.log_every == 0 || step_in_epoch == data_->steps_per_epoch();
    if (progress_read) read_progress(step_in_epoch, window, progress);
    if (stop_rules_.stop_after(position_.global_step, data_->total_steps(), progress_read)) break;
  }
  return step_in_epoch;
}

void TrainingRun::load_step_batches(int64_t step_in_epoch, StepBatches& batches, ProgressWindow& window) {
  const int64_t step_micro_batches =
      data_->micro_batches_of(step_in_epoch + 1) - data_->micro_batches_of(step_in_epoch);
  batches.images.resize(static_cast<size_t>(step_micro_batches));
  batches.labels.resize(static_cast<size_t>(step_micro_batches));
  for (int64_t micro = 0; micro < step_micro_batches; ++micro) {
    const metrics::Stopwatch waiting;
    auto batch = data_->train_loader().next();
    monitor_.phases().add_host_seconds(metrics::StepPhase::kData, waiting.elapsed_seconds());
    check(batch.has_value(), "data loader ended before the epoch's last step");
    batches.images[micro] = batch->images;
    batches.labels[micro] = batch->labels;
    window.predictions += prediction_labels(batch->labels).size(0);
    window.images += batch->labels.size(0) * strategy_->world_size();
  }
}

void TrainingRun::run_step(const StepBatches& batches) {
  engine_->step(position_.global_step, batches.images, batches.labels);
  ++position_.global_step;
}

void TrainingRun::after_step(int64_t epoch, const StepBatches& batches) {
  if (monitor_.follows_steps()) {
    const double mean_loss = engine_->step_loss() / static_cast<double>(batches.micro_batches());
    monitor_.report_step(epoch, position_.global_step, mean_loss);
  }
  monitor_.after_step(position_.global_step, engine_->runner());
}

void TrainingRun::save_on_cadence(int64_t epoch, int64_t step_in_epoch) {
  // A step that ends the epoch (or the run) is saved once, by the epoch's closing save right after: saving it
  // here too would write the same state twice, the second write waiting for the first.
  const bool epoch_ends = step_in_epoch == data_->steps_per_epoch() || position_.global_step >= data_->total_steps();
  if (plan_.checkpoints.every > 0 && position_.global_step % plan_.checkpoints.every == 0 && !epoch_ends)
    checkpoints_.save({epoch, data_->micro_batches_of(step_in_epoch), position_.global_step, 0, 0});
}

void TrainingRun::read_progress(int64_t step_in_epoch, ProgressWindow& window, Progress& progress) {
  const double mean_loss = engine_->totals().window_loss.item<double>() / static_cast<double>(window.predictions);
  monitor_.collect_step_phases(engine_->runner());  // the read above waited for the device
  monitor_.clock().mark(position_.global_step);
  const double seconds = window.clock.elapsed_seconds();
  const double samples_per_second = seconds > 0 ? window.images / seconds : 0;
  // Before the divergence check, which may end the run: the log shows the window that diverged.
  if (monitor_.logging()) {
    const double predictions = static_cast<double>(window.predictions * strategy_->world_size());
    log_progress(mean_loss, samples_per_second, seconds > 0 ? predictions / seconds : 0);
  }
  check_divergence();
  const auto utilisation = monitor_.flops().at(samples_per_second);
  progress.update(step_in_epoch, samples_per_second, mean_loss, utilisation ? utilisation->mfu : std::nullopt);
  engine_->totals().window_loss.zero_();
  window = ProgressWindow{};
}

void TrainingRun::check_divergence() {
  if (const auto divergence = engine_->read_divergence(position_.global_step))
    stop_rules_.diverged(divergence->what, divergence->first_step);
}

namespace {

// What a device that ran out of memory held and how to make the run fit: the model states' bytes per
// parameter under this strategy, and the strategies and flags that shrink them or the activations.
std::string out_of_memory_advice(const Plan& plan, const std::string& what) {
  const auto& p = plan.precision;
  const OptimizerOptions& optimizer = plan.optimization.optimizer;
  // One parameter's model states on one device, by the arithmetic `ptrain estimate` uses.
  const int64_t per_param =
      strategies::predicted_model_states(strategies::StateLayout{}, 1, p, optimizer.slots(), !plan.device.is_cuda())
          .total();
  const bool sharded = plan.strategy.shards_optimizer_state();
  std::ostringstream out;
  const auto newline = what.find('\n');
  out << "out of memory on " << plan.device.str() << " under --strategy " << plan.strategy.name() << " ("
      << what.substr(0, newline) << ").\n"
      << "Model states take " << per_param << " bytes a parameter (" << p.name << ", " << optimizer_name(optimizer.kind) << ")"
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

models::ModelSpec model_spec(const Plan& plan, const data::Dataset& train, const data::Dataset& test) {
  // A model outside the zoo (a TorchScript file, a module of the library API's caller) takes what its data
  // holds; TorchScriptModel::load checks that the module fits it.
  const ModelSetup& m = plan.model;
  const auto zoo = models::model_names();
  const bool from_zoo = std::find(zoo.begin(), zoo.end(), m.name) != zoo.end();
  const bool language_model = from_zoo ? models::is_language_model(m.name) : train.is_tokens();
  check(language_model == train.is_tokens(),
        language_model ? "--model " + m.name + " is a language model: it needs a token dataset "
                             "(--dataset synthetic-tokens or text), not " + plan.data.name
                       : "--model " + m.name + " is an image model: it cannot train on the token dataset " +
                             plan.data.name);
  models::ModelSpec spec{m.name, 0, 0, 0};
  spec.data = train.description;
  if (language_model) {
    check(m.vocab_size == 0 || m.vocab_size >= train.vocab_size,
          "--vocab-size " + std::to_string(m.vocab_size) + " is smaller than the " +
              std::to_string(train.vocab_size) + " tokens of " + train.description);
    spec.num_classes = m.vocab_size > 0 ? m.vocab_size : train.vocab_size;
    spec.seq_len = std::max(train.images.size(1), test.images.size(1));
    spec.layers = m.gpt_layers;
    spec.width = m.gpt_width;
    spec.heads = m.gpt_heads;
  } else {
    spec.num_classes = static_cast<int64_t>(train.classes.size());
    spec.in_channels = train.channels();
    spec.image_size = plan.data.image_size > 0 ? plan.data.image_size : train.height();
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
