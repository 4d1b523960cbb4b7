#include "ptrain/config/cli_options.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>

#include "ptrain/config/help_format.h"
#include "ptrain/config/near_names.h"
#include "ptrain/config/number_checks.h"
#include "ptrain/core/error.h"
#include "ptrain/precision/policy.h"
#include "ptrain/strategy_spec/strategy_spec.h"

namespace ptrain::config {

namespace {

// An item of a comma-separated list. CLI11 drops empty items: "--skip-fusions ," left the option short of a
// value, and it took the next argument, a flag ("--lr"), as its list.
CLI::Validator list_item() {
  return CLI::Validator(
      [](std::string& item) -> std::string {
        if (item.empty()) return "the list is empty (name at least one item, or leave the flag out)";
        if (item.rfind("--", 0) == 0)
          return "the list is empty (such as ','), and the flag '" + item +
                 "' after it would be taken as its items (name at least one item, or leave the flag out)";
        return {};
      },
      "", "LIST_ITEM");
}

// A true/false flag (and its --no- form where names give one); help says its default: the value bound now.
CLI::Option* add_switch(CLI::App& app, const std::string& names, bool& value, const std::string& description) {
  return app.add_flag(names, value, description)->default_function([&value] { return value ? "true" : "false"; });
}

}  // namespace

CLI::Option* add_train_options(CLI::App& app, TrainConfig& c) {
  const auto non_negative = non_negative_number();
  const auto positive = positive_number();
  const auto positive_float_value = positive_float();
  const auto non_negative_float_value = non_negative_float();

  app.add_option("--model", c.model.name, "Model: resnet18/34/50/101/152 (add -cifar or -imagenet to force a stem), resnet20/32/44/56, "
                 "gpt-tiny/small/medium/large/xl (token datasets), or a TorchScript file (.pt) of your own module")
      ->group("Model");
  app.add_option("--weights", c.model.weights, "Initial weights, a torchvision .pth or a .safetensors file")
      ->group("Model");
  app.add_option("--save-weights", c.model.save_weights,
                 "Write the trained weights here: a .pt/.pth state dict (torch.load) or a .safetensors file")
      ->group("Model");
  add_switch(app, "--activation-checkpointing,!--no-activation-checkpointing", c.model.activation_checkpointing,
                 "Recompute each residual block in backward instead of keeping its activations")
      ->group("Model");
  app.add_flag("--channels-last{true},!--no-channels-last", c.model.channels_last,
               "NHWC memory format: auto (on for convolutional models on CUDA), true or false (--channels-last=VALUE)")
      ->group("Model")->check(CLI::IsMember({"auto", "true", "false"}))
      ->default_function([&c] { return c.model.channels_last; });
  app.add_option("--gpt-layers", c.model.gpt_layers, "GPT models: transformer blocks; 0 keeps the named size's")
      ->group("Model")->check(non_negative);
  app.add_option("--gpt-width", c.model.gpt_width, "GPT models: embedding width; 0 keeps the named size's")
      ->group("Model")->check(non_negative);
  app.add_option("--gpt-heads", c.model.gpt_heads, "GPT models: attention heads; 0 keeps the named size's")
      ->group("Model")->check(non_negative);
  app.add_option("--vocab-size", c.model.vocab_size,
                 "GPT models: vocabulary size, at least the token dataset's; 0: the dataset's")
      ->group("Model")->check(non_negative);

  app.add_option("--dataset", c.data.dataset, "fashion-mnist | mnist | cifar10 | imagefolder | synthetic | synthetic-tokens | text")
      ->group("Data");
  app.add_option("--data-path", c.data.path, "Dataset location; unset: the dataset's usual place")->group("Data");
  app.add_option("--image-size", c.data.image_size, "Resize images to this square size; 0 keeps them")
      ->group("Data")->check(non_negative);
  app.add_option("--seq-len", c.data.seq_len, "Token datasets: tokens per sample; 0: the dataset's default")
      ->group("Data")->check(non_negative);
  add_switch(app, "--augment,!--no-augment", c.data.augment, "Random crop (padding 4) and horizontal flip")
      ->group("Data");
  app.add_option("--normalize", c.data.normalize,
                 "Subtract MEAN and divide by STD after scaling pixels to [0, 1]: MEAN,STD for every channel (0.5,0.5), "
                 "MEANS/STDS per channel (0.485,0.456,0.406/0.229,0.224,0.225) or none; default: the dataset's "
                 "(docs/your-model-and-data.md)")
      ->group("Data");
  app.add_option("--loader-threads", c.data.loader_threads,
                 "Threads decoding image folders: the whole folder at start, or each batch when streaming")
      ->group("Data")->check(positive);
  app.add_option("--image-loading", c.data.image_loading,
                 "Image folders: memory (decoded once, all images of one size), stream (decoded per batch, any "
                 "sizes, ImageNet-style crops) or auto (memory for folders up to 1 GiB of images of one size)")
      ->group("Data")->check(CLI::IsMember({"auto", "memory", "stream"}));
  app.add_option("--prefetch", c.data.prefetch, "Batches prepared ahead of the step")
      ->group("Data")->check(positive);
  app.add_option("--train-limit", c.data.train_limit, "Train on N samples spread evenly over the training set only; 0: all")
      ->group("Data")->check(non_negative);
  app.add_option("--test-limit", c.data.test_limit, "Evaluate on N test samples spread evenly over the test set; 0: all")
      ->group("Data")->check(non_negative);

  app.add_option("--optimizer", c.optim.name, "sgd | adamw")
      ->group("Optimizer")->check(CLI::IsMember({"sgd", "adamw"}));
  app.add_option("--lr", c.optim.lr, "Peak learning rate")->group("Optimizer")->check(positive_float_value);
  app.add_option("--momentum", c.optim.momentum, "SGD momentum")
      ->group("Optimizer")->check(number_in(0.0, 1.0));
  add_switch(app, "--nesterov,!--no-nesterov", c.optim.nesterov, "Nesterov momentum")->group("Optimizer");
  app.add_option("--weight-decay", c.optim.weight_decay, "Weight decay (decoupled for adamw)")
      ->group("Optimizer")->check(non_negative_float_value);
  app.add_option("--beta1", c.optim.beta1, "AdamW beta1")->group("Optimizer")->check(number_in(0.0, 1.0));
  app.add_option("--beta2", c.optim.beta2, "AdamW beta2")->group("Optimizer")->check(number_in(0.0, 1.0));
  app.add_option("--eps", c.optim.eps, "AdamW epsilon")->group("Optimizer")->check(positive_float_value);
  app.add_option("--schedule", c.optim.schedule,
                 "constant | step | cosine, or DeepSpeed's WarmupLR | WarmupDecayLR | WarmupCosineLR (its rates step "
                 "for step: --warmup-steps, --warmup-type, --warmup-min-lr, --min-lr, the run's steps)")
      ->group("Optimizer")
      ->check(CLI::IsMember({"constant", "step", "cosine", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}));
  app.add_option("--milestones", c.optim.milestones, "Step schedule: epochs where lr is multiplied by --gamma")
      ->group("Optimizer")->delimiter(',');
  app.add_option("--gamma", c.optim.gamma, "Step schedule factor")->group("Optimizer")->check(positive_float_value);
  app.add_option("--min-lr", c.optim.min_lr, "Cosine schedule floor")->group("Optimizer")->check(non_negative_float_value);
  app.add_option("--warmup-epochs", c.optim.warmup_epochs, "Linear warm-up length in epochs (fractions allowed)")
      ->group("Optimizer")->check(non_negative);
  app.add_option("--warmup-steps", c.optim.warmup_steps, "Linear warm-up length in optimizer steps (instead of --warmup-epochs)")
      ->group("Optimizer")->check(non_negative);
  app.add_option("--warmup-type", c.optim.warmup_type,
                 "Warm-up of the Warmup* schedules: linear | log (DeepSpeed's default)")
      ->group("Optimizer")->check(CLI::IsMember({"linear", "log"}));
  app.add_option("--warmup-min-lr", c.optim.warmup_min_lr,
                 "Rate the Warmup* schedules start from (and WarmupDecayLR decays to)")
      ->group("Optimizer")->check(non_negative_float_value);
  app.add_option("--clip-grad-norm", c.optim.clip_grad_norm, "Clip the global gradient L2 norm; 0: off")
      ->group("Optimizer")->check(non_negative_float_value);
  app.add_option("--grad-accum", c.optim.grad_accum, "Micro-batches accumulated per optimizer step")
      ->group("Optimizer")->check(positive);

  app.add_option("--precision", c.precision.precision, "fp32 | tf32 | fp16 | bf16 | amp-fp16 | amp-bf16 | fp8 (linear layers in FP8, amp-bf16 around them; GPUs of compute capability 8.9+)")
      ->group("Precision")
      ->check(CLI::IsMember(precision::precision_names()));
  add_switch(app, "--fp8-head,!--no-fp8-head", c.precision.fp8_head,
             "--precision fp8: GPT's head (lm_head) in FP8 too (default: bf16)")
      ->group("Precision");
  app.add_option("--fp8-scaling", c.precision.fp8_scaling,
                 "--precision fp8: dynamic (each tensor scaled by its own amax, an extra pass over it) | delayed (by "
                 "the largest amax of its last 16 casts, recorded in the cast's own pass; Transformer Engine's "
                 "recipe) (default: dynamic)")
      ->group("Precision")
      ->check(CLI::IsMember({"dynamic", "delayed"}));
  add_switch(app, "--master-weights,!--no-master-weights", c.precision.master_weights,
                 "Pure fp16/bf16: keep an fp32 copy of the weights for the optimizer step")
      ->group("Precision");
  app.add_option("--loss-scale", c.precision.loss_scale, "auto | dynamic | none | a static scale")
      ->group("Precision");
  app.add_option("--initial-loss-scale", c.precision.initial_loss_scale, "Dynamic loss scaling: the first scale")
      ->group("Precision")->check(positive_float_value);
  app.add_option("--loss-scale-window", c.precision.loss_scale_window,
                 "Dynamic loss scaling: clean steps before the scale doubles")
      ->group("Precision")->check(positive);
  app.add_option("--hysteresis", c.precision.hysteresis,
                 "Dynamic loss scaling: overflows tolerated before the scale halves (DeepSpeed; 1: GradScaler)")
      ->group("Precision")->check(positive);
  add_switch(app, "--consecutive-hysteresis,!--no-consecutive-hysteresis", c.precision.consecutive_hysteresis,
                 "The tolerated overflows refill after any clean step (--no-consecutive-hysteresis: only when the "
                 "scale grows, as DeepSpeed's default)")
      ->group("Precision");
  app.add_option("--min-loss-scale", c.precision.min_loss_scale, "Dynamic loss scaling: the scale's floor; 0: none")
      ->group("Precision")->check(non_negative_float_value);

  app.add_option("--epochs", c.run.epochs, "Epochs")->group("Run")->check(positive);
  app.add_option("--max-steps", c.run.max_steps,
                 "The run's length in optimizer steps, instead of --epochs: training goes on over as many epochs as "
                 "it takes, ends there, and the learning-rate schedule spans it (Hugging Face's max_steps); 0: --epochs")
      ->group("Run")->check(non_negative);
  app.add_option("--stop-at-step", c.run.stop_at_step,
                 "Pause after this optimizer step: save a checkpoint there (--checkpoint-dir) and exit 0; the schedule "
                 "keeps the run's length, so --resume latest ends on the weights of a run never paused")
      ->group("Run")->check(non_negative);
  app.add_option("--batch-size", c.run.batch_size, "Samples per device per micro-batch")
      ->group("Run")->check(positive);
  app.add_option("--eval-batch-size", c.run.eval_batch_size, "Evaluation batch; 0: --batch-size")
      ->group("Run")->check(non_negative);
  app.add_option("--device", c.run.device, "auto | cpu | cuda | cuda:N")
      ->group("Run");
  app.add_option("--seed", c.run.seed, "Seed of initialisation, shuffling and augmentation")
      ->group("Run")->check(seed_number());
  app.add_option("--strategy", c.run.strategy, "How devices share the work")
      ->group("Run")->check(CLI::IsMember(strategies::StrategySpec::names()));
  app.add_option("--global-batch-size", c.run.global_batch_size,
                 "Samples per optimizer step over all devices (instead of --batch-size)")
      ->group("Run")->check(non_negative);
  app.add_option("--backend", c.dist.backend, "Collectives: gloo or nccl; unset: nccl on CUDA, gloo on the CPU")
      ->group("Distributed")->check(CLI::IsMember({"gloo", "nccl"}));
  app.add_option("--dist-timeout", c.dist.timeout_seconds, "Seconds a collective or the rendezvous may take")
      ->group("Distributed")->check(positive);
  app.add_option("--bucket-cap-mb", c.dist.bucket_cap_mb, "DDP gradient bucket size in MiB")
      ->group("Distributed")->check(positive);
  add_switch(app, "--sync-batchnorm,!--no-sync-batchnorm", c.dist.sync_batchnorm,
                 "DDP: BatchNorm statistics over the global batch")
      ->group("Distributed");
  app.add_option("--replicas", c.dist.replicas,
                 "dp: devices this one process drives (cuda:0 ... cuda:N-1, or N replicas on the CPU); "
                 "0: every visible GPU")
      ->group("Distributed")->check(non_negative);
  add_switch(app, "--offload-optimizer,!--no-offload-optimizer", c.sharding.offload_optimizer,
                 "zero*: optimizer state and its update on the CPU")
      ->group("Sharding");
  add_switch(app, "--offload-params,!--no-offload-params", c.sharding.offload_params,
                 "zero3, fsdp: parameter shards on the CPU between uses")
      ->group("Sharding");
  app.add_option("--reduce-bucket-mb", c.sharding.reduce_bucket_mb, "zero1, zero2, fsdp no-shard: gradient group size in MiB")
      ->group("Sharding")->check(positive);
  app.add_option("--allgather-bucket-mb", c.sharding.allgather_bucket_mb,
                 "DeepSpeed's all-gather bucket: refused unless at its default (ptrain all-gathers each gradient "
                 "group in one collective)")
      ->group("Sharding")->check(positive);
  add_switch(app, "--overlap-comm,!--no-overlap-comm", c.sharding.overlap_comm,
                 "ddp, zero*, fsdp: reduce gradients while backward still runs (--no-overlap-comm: after it)")
      ->group("Sharding");
  add_switch(app, "--contiguous-gradients,!--no-contiguous-gradients", c.sharding.contiguous_gradients,
                 "Gradients in one flat buffer a bucket or group (always; --no-contiguous-gradients is refused)")
      ->group("Sharding");
  app.add_option("--fsdp-sharding", c.sharding.fsdp_sharding,
                 "full-shard | shard-grad-op | no-shard | hybrid-shard | hybrid-shard-zero2")
      ->group("Sharding")
      ->check(CLI::IsMember(strategies::StrategySpec::fsdp_sharding_names()));
  app.add_option("--auto-wrap", c.sharding.auto_wrap, "fsdp units: size | type | none")
      ->group("Sharding")->check(CLI::IsMember({"size", "type", "none"}));
  app.add_option("--min-num-params", c.sharding.min_num_params, "Size-based wrap: parameters a unit holds at least")
      ->group("Sharding")->check(positive);
  app.add_option("--wrap-types", c.sharding.wrap_types, "Type-based wrap: module type names, comma-separated")
      ->group("Sharding")->delimiter(',');
  app.add_option("--backward-prefetch", c.sharding.backward_prefetch, "fsdp: pre | post | none")
      ->group("Sharding")->check(CLI::IsMember({"pre", "post", "none"}));
  add_switch(app, "--forward-prefetch,!--no-forward-prefetch", c.sharding.forward_prefetch,
                 "fsdp: gather the next unit during this one's forward")
      ->group("Sharding");
  add_switch(app, "--sync-module-states,!--no-sync-module-states", c.sharding.sync_module_states,
                 "Broadcast rank 0's parameters and buffers at start")
      ->group("Sharding");
  const auto dtype_names = CLI::IsMember(precision::dtype_names());
  app.add_option("--param-dtype", c.sharding.param_dtype,
                 "fsdp mixed precision: parameter dtype (fp32 | fp16 | bf16); unset: the precision mode's")
      ->group("Sharding")->check(dtype_names);
  app.add_option("--reduce-dtype", c.sharding.reduce_dtype, "ddp: gradient compression (fp16 | bf16, as PyTorch's compress hooks); fsdp: the dtype "
                 "gradients are reduced in (fp32 | fp16 | bf16); unset: the parameters'")
      ->group("Sharding")->check(dtype_names);
  app.add_option("--buffer-dtype", c.sharding.buffer_dtype,
                 "fsdp mixed precision: buffer dtype (fp32 | fp16 | bf16); unset: the parameters'")
      ->group("Sharding")->check(dtype_names);
  app.add_option("--state-dict", c.sharding.state_dict, "Checkpoints of sharded strategies: full | sharded")
      ->group("Sharding")->check(CLI::IsMember({"full", "sharded"}));
  app.add_option("--hybrid-group-size", c.sharding.hybrid_group_size,
                 "hybrid-shard: ranks sharing one copy of the model; 0: the ranks of one node")
      ->group("Sharding")->check(non_negative);
  app.add_option("--threads", c.run.threads, "CPU intra-op threads; 0: OMP_NUM_THREADS if set, else the cores divided among this node's processes")
      ->group("Run")->check(non_negative);
  add_switch(app, "--eval-each-epoch,!--no-eval-each-epoch", c.run.eval_each_epoch,
                 "Evaluate on the test split after every epoch (else only after the last)")
      ->group("Run");
  app.add_option("--checkpoint-dir", c.run.checkpoint_dir, "Directory for checkpoints; unset: no checkpoints")->group("Run");
  app.add_option("--checkpoint-every", c.run.checkpoint_every, "Also checkpoint every N optimizer steps")
      ->group("Run")->check(non_negative);
  app.add_option("--keep-checkpoints", c.run.keep_checkpoints,
                 "Keep only the newest N checkpoints in --checkpoint-dir (and the one resumed from); 0: all")
      ->group("Run")->check(non_negative);
  add_switch(app, "--overwrite-checkpoints", c.run.overwrite_checkpoints,
                 "Start over in a --checkpoint-dir holding another run's checkpoints, removing them (without it such "
                 "a directory is refused unless the run resumes)")
      ->group("Run");
  add_switch(app, "--async-checkpoint", c.run.async_checkpoint,
                 "Copy each checkpoint to host memory at its step and write it in a background thread, so that "
                 "training goes on during the write (one write at a time; the run's end waits for it)")
      ->group("Run");
  app.add_option("--resume", c.run.resume, "Resume from a checkpoint file, or 'latest' in --checkpoint-dir")
      ->group("Run");
  app.add_option("--on-divergence", c.run.on_divergence,
                 "A non-finite loss, or a loss scale at its floor: stop (an error naming the step, "
                 "nothing non-finite saved) or warn (report it, train on, exit non-zero at the end)")
      ->group("Run")->check(CLI::IsMember({"stop", "warn"}));
  app.add_option("--metrics-out", c.run.metrics_out, "Write the run's metrics JSON here")->group("Run");
  app.add_option("--tensorboard", c.run.tensorboard,
                 "Write TensorBoard event files into this directory (tensorboard --logdir DIR): loss, learning rate, "
                 "loss scale, gradient norm, throughput and memory every --log-every steps, evaluation every epoch")
      ->group("Run");
  app.add_option("--log-jsonl", c.run.log_jsonl, "Write the same scalars to this file, one JSON object a line")
      ->group("Run");
  app.add_option("--log-every", c.run.log_every, "Optimizer steps between progress updates")
      ->group("Run")->check(positive);
  app.add_option("--progress", c.run.progress, "auto | bar | lines | none")
      ->group("Run")->check(CLI::IsMember({"auto", "bar", "lines", "none"}));
  add_switch(app, "--log-all-ranks,!--no-log-all-ranks", c.run.log_all_ranks,
             "Several processes: every rank prints its progress and results (else rank 0 alone; errors from any rank "
             "show either way)")
      ->group("Run");
  add_switch(app, "--dry-run", c.run.dry_run, "Print the validated plan and exit")->group("Run");
  app.add_option("--profile-out", c.run.profile_out,
                 "Write a Chrome trace (chrome://tracing, Perfetto) of the steps --profile-steps names")
      ->group("Run");
  app.add_option("--profile-steps", c.run.profile_steps, "A:B, the optimizer steps A to B (from 1) --profile-out traces")
      ->group("Run");
  add_switch(app, "--cuda-graphs,!--no-cuda-graphs", c.run.cuda_graphs,
                 "Capture the whole training step as a CUDA graph once shapes are fixed (where the run allows it; "
                 "otherwise it says why and runs eagerly)")
      ->group("Run");
  add_switch(app, "--cudnn-benchmark,!--no-cudnn-benchmark", c.run.cudnn_benchmark,
                 "CUDA: cuDNN times its algorithms for each convolution shape and keeps the fastest, as PyTorch's "
                 "torch.backends.cudnn.benchmark (off: its heuristics choose; in fp32 the search takes about 30 s a "
                 "ResNet-50 run)")
      ->group("Run");
  add_switch(app, "--fused-kernels,!--no-fused-kernels", c.run.fused_kernels,
                 "Fused CUDA kernels and optimizer steps where they exist; off: LibTorch's unfused ops")
      ->group("Run");
  add_switch(app, "--relu-recompute,!--no-relu-recompute", c.run.relu_recompute,
                 "With the fused kernels, a ResNet recomputes in the backward the output of each batch norm + ReLU "
                 "that feeds a convolution instead of keeping it: about a third less activation memory for one "
                 "elementwise pass")
      ->group("Run");
  add_switch(app, "--conv-bn-fusion,!--no-conv-bn-fusion", c.run.conv_bn_fusion,
                 "With the fused kernels and --relu-recompute, a ResNet's convolutions also return their output's "
                 "statistics for the batch norm after them, and a batch norm + ReLU runs in the next convolution's "
                 "prologue (MLPerf's fusion, cuDNN's fused graphs), where cuDNN has precompiled engines for them: "
                 "fp16 on Ampere and Hopper; the run record says where it ran")
      ->group("Run");
  app.add_option("--skip-fusions", c.run.skip_fusions,
                 "Fused paths to leave out, comma-separated, with the fused kernels on (to measure what each brings): "
                 "weight-casts, shortcut-norms, stem-pool, residual-twins, bias-gradients, residual-adds, fp8-amax")
      ->group("Run")->delimiter(',');
  app.add_option("--deepspeed-config", c.run.deepspeed_config,
                 "A DeepSpeed ds_config.json: ZeRO stage, offload, fp16/bf16 and loss scaling, batch sizes, "
                 "clipping, optimizer and scheduler become the keys above (flags and --config win)")
      ->group("Run")->check(CLI::ExistingFile);

  // Every option can also come from the environment (PTRAIN_<FLAG>, e.g. PTRAIN_STRATEGY): `ptrain launch
  // --config` hands an accelerate config's settings to the processes it starts this way. Flags win.
  // Help shows each option's default as the value it is bound to now, c's, TrainConfig's own defaults.
  for (CLI::Option* opt : app.get_options()) {
    const auto& names = opt->get_lnames();
    if (names.empty() || names.front() == "help") continue;
    opt->envname(env_name_of(names.front()));
    opt->capture_default_str();
    if (opt->get_delimiter() != '\0') opt->check(list_item());
  }
  read_numbers_as_decimal(app);
  app.formatter(std::make_shared<HelpFormatter>(/*every_default=*/true));
  app.footer("Every flag is also read from its environment variable, PTRAIN_ and the flag's name in capitals "
             "(--batch-size: PTRAIN_BATCH_SIZE), and from a --config YAML file as a key (batch-size or batch_size). "
             "The command line wins over the variables, and both over the file.");

  return app.add_option("--config", "YAML file with the same keys as the flags (flags win)")->group("Run");
}

std::string usage_message(const CLI::Error& error) {
  const std::string message = error.what();
  const std::string at_most = ": At Most 1 required but received ";
  const auto at = message.find(at_most);
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&error) == nullptr || at == std::string::npos) return message;
  const std::string times = message.substr(at + at_most.size());
  return message.substr(0, at) + " is given " + (times == "2" ? "twice" : times + " times") + ": keep one";
}

std::string env_name_of(const std::string& flag) {
  std::string name = "PTRAIN_";
  for (const char ch : flag) name += ch == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return name;
}

std::set<std::string> flags_given(const CLI::App& app) {
  std::set<std::string> given;
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->count() > 0 && !opt->get_lnames().empty()) given.insert(opt->get_lnames().front());
  }
  return given;
}

namespace {

std::string scalar_text(const YAML::Node& node) {
  return node.as<std::string>();
}

std::vector<std::string> values_of(const YAML::Node& node, const std::string& where) {
  std::vector<std::string> values;
  if (node.IsScalar()) {
    values.push_back(scalar_text(node));
  } else if (node.IsSequence()) {
    for (const auto& item : node) {
      check(item.IsScalar(), where + ": list items must be plain values");
      values.push_back(scalar_text(item));
    }
  } else if (node.IsNull()) {
    throw Error(where + ": has no value");
  } else {
    throw Error(where + ": expected a value or a list, found a mapping");
  }
  return values;
}

// A YAML scalar that reads as a number whole: 007, -2, 1.5, 1e3, 0x10.
bool is_number(const std::string& text) {
  if (text.empty()) return false;
  char* end = nullptr;
  std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size();
}

std::vector<std::string> known_keys(CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : app.get_options()) {
    for (const auto& name : opt->get_lnames()) {
      if (name != "help" && name != "config") names.push_back(name);
    }
  }
  return names;
}

}  // namespace

void apply_yaml_config(CLI::App& app, const std::string& yaml_path) {
  // A directory opens as a stream on Linux and fails at the first read, as "basic_filebuf::underflow".
  std::error_code error;
  check(!std::filesystem::is_directory(yaml_path, error), yaml_path + ": is a directory, not a YAML config file");
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAllFromFile(yaml_path);
  } catch (const YAML::BadFile&) {
    throw Error(yaml_path + ": cannot open the config file");
  } catch (const YAML::Exception& e) {
    throw Error(yaml_path + ": not valid YAML: " + e.what());
  }
  // Settings after a "---" are a second document, which a reader of the first alone would drop unseen.
  for (size_t i = 1; i < documents.size(); ++i) {
    if (documents[i].IsNull()) continue;  // a bare "---" or "..." at the end says nothing
    const int line = documents[i].Mark().line + 1;
    throw Error(yaml_path + ": holds a second YAML document" + (line > 0 ? " (from line " + std::to_string(line) + ")" : "") +
                "; a config is one mapping of keys to values: join the documents or keep one");
  }
  if (documents.empty()) return;
  const YAML::Node root = documents.front();
  if (root.IsNull()) return;
  check(root.IsMap(), yaml_path + ": the config must be a mapping of keys to values");

  // yaml-cpp keeps both entries of a key given twice and a lookup finds the first: refuse it instead of
  // training with a value the reader did not mean. batch_size and batch-size are one key.
  std::map<const CLI::Option*, std::pair<std::string, int>> seen;
  for (const auto& entry : root) {
    std::string key = entry.first.as<std::string>();
    std::replace(key.begin(), key.end(), '_', '-');
    const std::string where = yaml_path + ": key '" + entry.first.as<std::string>() + "'";
    CLI::Option* opt = (key == "config" || key == "help") ? nullptr : app.get_option_no_throw("--" + key);
    if (opt == nullptr) {
      throw Error(where + " is not a ptrain train option" + did_you_mean(key, known_keys(app)) +
                  "; keys are the flags of ptrain train --help without their dashes");
    }
    const int line = entry.first.Mark().line + 1;
    const auto [first, inserted] = seen.emplace(opt, std::make_pair(entry.first.as<std::string>(), line));
    check(inserted, where + " is given twice (line " + std::to_string(first->second.second) + " as '" +
                        first->second.first + "' and line " + std::to_string(line) + "): keep one");
  }
  for (const auto& entry : root) {
    std::string key = entry.first.as<std::string>();
    std::replace(key.begin(), key.end(), '_', '-');
    const std::string where = yaml_path + ": key '" + entry.first.as<std::string>() + "'";
    CLI::Option* opt = app.get_option_no_throw("--" + key);
    if (opt->count() > 0) continue;  // given on the command line: the flag wins

    std::vector<std::string> values = values_of(entry.second, where);
    try {
      if (opt->get_expected_min() == 0) {
        check(values.size() == 1, where + ": a flag takes one true/false value");
        // CLI11 reads a number as a flag's count (007 and 2 are true): in a YAML file that is a value meant for
        // another key, or a typo, never a way to say true.
        check(!is_number(values.front()), where + ": a flag takes true or false, not the number " + values.front());
        // Negated aliases (--no-x) share the option; a YAML key always names the positive form.
        opt->add_result(values.front());
      } else {
        opt->add_result(values);
      }
      opt->run_callback();
    } catch (const CLI::Error& e) {
      throw Error(where + ": " + e.what());
    }
  }
}

std::string device_in_train_config(const std::vector<std::string>& command) {
  if (command.size() < 2 || command[1] != "train") return "";
  std::string path;
  for (size_t i = 2; i < command.size(); ++i) {
    if (command[i] == "--config" && i + 1 < command.size()) path = command[i + 1];
    if (command[i].rfind("--config=", 0) == 0) path = command[i].substr(9);
  }
  // Only a regular file is read twice safely: a FIFO or a process's stream (--config <(...)) read here would
  // block, or leave nothing for the ranks.
  std::error_code error;
  if (path.empty() || !std::filesystem::is_regular_file(path, error)) return "";
  try {
    const YAML::Node root = YAML::LoadFile(path);
    if (!root.IsMap()) return "";
    for (const auto& entry : root)
      if (entry.first.as<std::string>() == "device" && entry.second.IsScalar()) return entry.second.as<std::string>();
  } catch (const YAML::Exception&) {
  }
  return "";
}

}  // namespace ptrain::config
