#include "ptrain/config/train_config.h"

namespace ptrain::config {

nlohmann::json to_json(const TrainConfig& c) {
  return {
      {"model", {{"name", c.model.name}, {"weights", c.model.weights},
                 {"activation_checkpointing", c.model.activation_checkpointing},
                 {"channels_last", c.model.channels_last}}},
      {"data", {{"dataset", c.data.dataset}, {"path", c.data.path}, {"image_size", c.data.image_size},
                {"augment", c.data.augment}, {"loader_threads", c.data.loader_threads},
                {"prefetch", c.data.prefetch}, {"train_limit", c.data.train_limit},
                {"test_limit", c.data.test_limit}}},
      {"optimizer", {{"name", c.optim.name}, {"lr", c.optim.lr}, {"momentum", c.optim.momentum},
                     {"nesterov", c.optim.nesterov}, {"weight_decay", c.optim.weight_decay},
                     {"beta1", c.optim.beta1}, {"beta2", c.optim.beta2}, {"eps", c.optim.eps},
                     {"schedule", c.optim.schedule}, {"milestones", c.optim.milestones},
                     {"gamma", c.optim.gamma}, {"min_lr", c.optim.min_lr},
                     {"warmup_epochs", c.optim.warmup_epochs}, {"clip_grad_norm", c.optim.clip_grad_norm},
                     {"grad_accum", c.optim.grad_accum}}},
      {"precision", {{"precision", c.precision.precision}, {"master_weights", c.precision.master_weights},
                     {"loss_scale", c.precision.loss_scale}}},
      {"run", {{"epochs", c.run.epochs}, {"max_steps", c.run.max_steps}, {"batch_size", c.run.batch_size},
               {"eval_batch_size", c.run.eval_batch_size}, {"device", c.run.device}, {"seed", c.run.seed},
               {"strategy", c.run.strategy}, {"threads", c.run.threads},
               {"eval_each_epoch", c.run.eval_each_epoch}, {"checkpoint_dir", c.run.checkpoint_dir},
               {"checkpoint_every", c.run.checkpoint_every}, {"resume", c.run.resume},
               {"metrics_out", c.run.metrics_out}, {"log_every", c.run.log_every},
               {"progress", c.run.progress}, {"global_batch_size", c.run.global_batch_size}}},
      {"dist", {{"backend", c.dist.backend}, {"timeout_seconds", c.dist.timeout_seconds},
                {"bucket_cap_mb", c.dist.bucket_cap_mb}, {"sync_batchnorm", c.dist.sync_batchnorm},
                {"replicas", c.dist.replicas}}},
      {"sharding", {{"offload_optimizer", c.sharding.offload_optimizer},
                    {"offload_params", c.sharding.offload_params},
                    {"reduce_bucket_mb", c.sharding.reduce_bucket_mb},
                    {"allgather_bucket_mb", c.sharding.allgather_bucket_mb},
                    {"overlap_comm", c.sharding.overlap_comm},
                    {"contiguous_gradients", c.sharding.contiguous_gradients},
                    {"fsdp_sharding", c.sharding.fsdp_sharding}, {"auto_wrap", c.sharding.auto_wrap},
                    {"min_num_params", c.sharding.min_num_params}, {"wrap_types", c.sharding.wrap_types},
                    {"backward_prefetch", c.sharding.backward_prefetch},
                    {"forward_prefetch", c.sharding.forward_prefetch},
                    {"sync_module_states", c.sharding.sync_module_states},
                    {"param_dtype", c.sharding.param_dtype}, {"reduce_dtype", c.sharding.reduce_dtype},
                    {"buffer_dtype", c.sharding.buffer_dtype}, {"state_dict", c.sharding.state_dict},
                    {"hybrid_group_size", c.sharding.hybrid_group_size}}},
  };
}

}  // namespace ptrain::config
