// The typed config tree of `ptrain train`. Every flag, every key of a --config YAML file, of an
// accelerate config (config/accelerate_config.h) and of a DeepSpeed ds_config.json
// (config/deepspeed_config.h) lands here; train/plan.h validates it once into a Plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ptrain::config {

struct ModelConfig {
  std::string name = "resnet18";           // a name of models/zoo.h, or a TorchScript file (.pt)
  std::string weights;                     // initial weights (.pth or .safetensors); empty: random init
  std::string save_weights;                // write the trained weights here (.pt/.pth state dict or .safetensors)
  bool activation_checkpointing = false;   // recompute each residual block in backward
  // NHWC memory format for inputs and 4-D weights: auto | true | false. auto: on for convolutional models
  // on CUDA, where cuDNN's NHWC kernels are the fast ones (train/plan.h resolves it).
  std::string channels_last = "auto";
  // GPT models: override the named size's shape; 0 keeps it.
  int64_t gpt_layers = 0;                  // transformer blocks
  int64_t gpt_width = 0;                   // embedding width (a multiple of the heads)
  int64_t gpt_heads = 0;                   // attention heads
  int64_t vocab_size = 0;                  // GPT models: vocabulary; 0: the token dataset's
};

struct DataConfig {
  std::string dataset = "fashion-mnist";   // a name of data/registry.h
  std::string path;                        // dataset location; empty: the dataset's default
  int64_t image_size = 0;                  // resize to this square size; 0: native size
  int64_t seq_len = 0;                     // token datasets: tokens per sample; 0: the dataset's default
  bool augment = true;                     // random crop with padding + horizontal flip on training batches
  // Per-channel normalisation after scaling pixels to [0, 1]: "MEAN,STD", "MEANS/STDS" per channel or "none";
  // empty: the dataset's default (data/registry.h's default_normalization).
  std::string normalize;
  int64_t loader_threads = 2;              // decoding threads of image folders (loaded whole, or streamed)
  std::string image_loading = "auto";      // image folders: memory (decoded once) | stream (per batch) | auto
  int64_t prefetch = 2;                    // batches the loader keeps ready ahead of the step
  int64_t train_limit = 0;                 // use only the first N training samples; 0: all
  int64_t test_limit = 0;                  // evaluate on the first N test samples; 0: all
};

struct OptimizerConfig {
  std::string name = "sgd";                // sgd | adamw
  double lr = 0.1;
  double momentum = 0.9;                   // sgd
  bool nesterov = false;                   // sgd
  double weight_decay = 5e-4;              // sgd: L2 added to the gradient; adamw: decoupled
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adamw
  // constant | step | cosine, or DeepSpeed's WarmupLR | WarmupDecayLR | WarmupCosineLR step for step
  std::string schedule = "cosine";
  std::vector<int64_t> milestones;         // step schedule: epochs at which lr *= gamma
  double gamma = 0.1;                      // step schedule factor
  double min_lr = 0.0;                     // cosine floor (WarmupCosineLR's too)
  double warmup_epochs = 0.0;              // linear warm-up from 0, in (fractional) epochs
  int64_t warmup_steps = 0;                // the same in optimizer steps (instead of warmup_epochs); 0: off
  std::string warmup_type = "linear";      // the Warmup* schedules' rise: linear | log
  double warmup_min_lr = 0.0;              // the Warmup* schedules' first rate (WarmupDecayLR's last)
  double clip_grad_norm = 0.0;             // global L2 norm bound; 0: off
  int64_t grad_accum = 1;                  // micro-batches per optimizer step
};

struct PrecisionConfig {
  std::string precision = "fp32";          // fp32 | tf32 | fp16 | bf16 | amp-fp16 | amp-bf16 | fp8
  bool master_weights = false;             // pure fp16/bf16: fp32 copy for the optimizer step
  std::string loss_scale = "auto";         // auto | dynamic | none | <static scale>
  bool fp8_head = false;                   // fp8: GPT's head (lm_head) in FP8 too
  std::string fp8_scaling = "dynamic";     // fp8: dynamic | delayed (amax history)
  // Dynamic loss scaling (defaults: torch.amp.GradScaler; DeepSpeed's fp16 block sets its own).
  double initial_loss_scale = 65536;       // the first scale (DeepSpeed: 2^initial_scale_power)
  int64_t loss_scale_window = 2000;        // clean steps before the scale doubles (GradScaler growth_interval)
  int64_t hysteresis = 1;                  // overflows tolerated before the scale halves (DeepSpeed)
  bool consecutive_hysteresis = true;      // tolerance refills after any clean step (false: only when the scale grows)
  double min_loss_scale = 0;               // the scale never halves below this; 0: no floor
};

struct RunConfig {
  int64_t epochs = 1;
  int64_t max_steps = 0;                   // the run's length in optimizer steps (the schedule spans it); 0: all epochs
  int64_t stop_at_step = 0;                // pause after this optimizer step (checkpoint, exit) on the same schedule; 0: none
  int64_t batch_size = 128;                // per device
  int64_t eval_batch_size = 0;             // 0: same as batch_size
  std::string device = "auto";             // auto | cpu | cuda | cuda:N
  uint64_t seed = 0;
  std::string strategy = "single";         // single | dp | ddp | zero1 | zero2 | zero3 | fsdp
  int64_t global_batch_size = 0;           // alternative to batch_size: per device = global / (world x accum)
  int64_t threads = 0;                     // intra-op CPU threads; 0: OMP_NUM_THREADS, else cores / processes of the node
  bool eval_each_epoch = true;
  std::string checkpoint_dir;              // where checkpoints go; empty: none
  int64_t checkpoint_every = 0;            // also save every N optimizer steps; 0: only at epoch ends
  int64_t keep_checkpoints = 0;            // keep only the newest N checkpoints in checkpoint_dir; 0: all
  bool overwrite_checkpoints = false;      // a fresh run may remove another run's checkpoints in checkpoint_dir
  bool async_checkpoint = false;           // stage checkpoints in host memory at the step, write them in the background
  std::string resume;                      // a checkpoint file, or "latest" in checkpoint_dir
  std::string metrics_out;                 // the run's metrics JSON
  std::string tensorboard;                 // a directory for TensorBoard event files; empty: none
  std::string log_jsonl;                   // the logged scalars as JSON lines; empty: none
  int64_t log_every = 50;                  // optimizer steps between progress reads of the loss
  std::string progress = "auto";           // auto | bar | lines | none
  bool log_all_ranks = false;              // several processes: every rank prints (else rank 0 alone; errors always)
  bool dry_run = false;                    // print the plan and exit
  std::string on_divergence = "stop";      // stop | warn: a non-finite loss (train/divergence.h) ends the run, or
                                           // is reported and the run goes on (and still exits non-zero)
  std::string deepspeed_config;            // a DeepSpeed ds_config.json mapped onto these keys (flags win)
  std::string profile_out;                 // a Chrome trace of the steps profile_steps names; empty: none
  std::string profile_steps = "11:15";     // A:B, optimizer steps A to B (1-based, inclusive) traced
  bool cuda_graphs = true;                 // capture the whole step as a CUDA graph where the run allows it
  bool cudnn_benchmark = true;             // cuDNN times its algorithms for each new convolution shape and keeps the
                                           // fastest (false: its heuristics choose, without the search)
  bool fused_kernels = true;               // fused CUDA kernels and optimizers where they exist (else LibTorch ops)
  bool relu_recompute = true;              // with them, a ResNet's batch norm + ReLU outputs recomputed in backward
  bool conv_bn_fusion = true;              // with both, a ResNet's convolutions hand their statistics to its batch norms
  std::vector<std::string> skip_fusions;   // fused paths left out with the fused kernels on (models::fusion_names)
};

struct DistributedConfig {
  std::string backend;                     // gloo | nccl; empty: nccl on CUDA, gloo on the CPU
  double timeout_seconds = 300;            // every collective and the rendezvous
  double bucket_cap_mb = 25;               // DDP gradient bucket size
  bool sync_batchnorm = false;             // BatchNorm statistics over the global batch (DDP)
  int64_t replicas = 0;                    // dp: devices one process drives; 0: every visible GPU
};

// ZeRO stages and FSDP: what is sharded, where shards live between uses, how a model is cut into units.
// DeepSpeed's zero_optimization block and accelerate's fsdp_config map onto these keys.
struct ShardingConfig {
  bool offload_optimizer = false;          // zero*: optimizer state and its update on the CPU
  bool offload_params = false;             // zero3, fsdp: parameter shards on the CPU between uses
  double reduce_bucket_mb = 25;            // zero2/3: gradients reduce-scattered in buckets of this size
  double allgather_bucket_mb = 25;         // zero1/2: updated parameters all-gathered in buckets of this size
  bool overlap_comm = true;                // reductions overlap backward compute
  bool contiguous_gradients = true;        // gradients copied into one flat buffer as they are produced
  std::string fsdp_sharding = "full-shard";  // full-shard | shard-grad-op | no-shard | hybrid-shard[-zero2]
  std::string auto_wrap = "size";          // size | type | none: how fsdp cuts the model into units
  int64_t min_num_params = 100000000;      // size-based wrap: a unit holds at least this many parameters
  std::vector<std::string> wrap_types;     // type-based wrap: module type names (e.g. Bottleneck)
  std::string backward_prefetch = "pre";   // pre | post | none
  bool forward_prefetch = false;           // gather the next unit while this one runs forward
  bool sync_module_states = true;          // broadcast rank 0's parameters and buffers at start
  std::string param_dtype;                 // fsdp mixed precision; empty: the precision mode's
  std::string reduce_dtype;                // dtype gradients are reduced in; empty: the parameters'
  std::string buffer_dtype;                // dtype of buffers (BatchNorm statistics); empty: the parameters'
  std::string state_dict = "full";         // full (gathered on rank 0) | sharded (a file a rank + manifest)
  int64_t hybrid_group_size = 0;           // hybrid-shard: ranks sharing one copy; 0: the ranks of one node
};

struct TrainConfig {
  ModelConfig model;
  DataConfig data;
  OptimizerConfig optim;
  PrecisionConfig precision;
  RunConfig run;
  DistributedConfig dist;
  ShardingConfig sharding;
};

nlohmann::json to_json(const TrainConfig& config);

}  // namespace ptrain::config
