// A model of its own, not from ptrain's zoo: a small residual convnet with batch norm, whose two blocks are
// marked as units with ptrain::fully_shard, trained by ptrain::fit on images held in memory under the
// strategy and precision given on the command line; then one hand-written training step that uses
// ptrain's autocast guard and loss scaler on their own.
//
//   custom_model [--strategy single|dp|ddp|zero1|zero2|zero3|fsdp] [--precision fp32|bf16|amp-bf16|...]
//                [--steps N] [--device cpu|cuda]
// Multi-process strategies: ptrain launch --nproc-per-node 2 -- custom_model --strategy zero3
#include <ptrain/ptrain.h>

#include <cstdlib>
#include <iostream>
#include <string>

namespace nn = torch::nn;

struct ResidualBlock : nn::Module {
  explicit ResidualBlock(int64_t channels) {
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(channels, channels, 3).padding(1).bias(false)));
    bn1 = register_module("bn1", nn::BatchNorm2d(channels));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(channels, channels, 3).padding(1).bias(false)));
    bn2 = register_module("bn2", nn::BatchNorm2d(channels));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto y = torch::relu(bn1(conv1(x)));
    return torch::relu(x + bn2(conv2(y)));
  }
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
};

struct SmallNet : nn::Module {
  SmallNet() {
    stem = register_module("stem", nn::Conv2d(nn::Conv2dOptions(3, 16, 3).padding(1)));
    block1 = register_module("block1", ptrain::fully_shard(std::make_shared<ResidualBlock>(16)));
    block2 = register_module("block2", ptrain::fully_shard(std::make_shared<ResidualBlock>(16)));
    head = register_module("head", nn::Linear(16, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(stem(x));
    x = block2->forward(block1->forward(x));
    return head(x.mean({2, 3}));
  }
  nn::Conv2d stem{nullptr};
  std::shared_ptr<ptrain::Sharded<ResidualBlock>> block1, block2;
  nn::Linear head{nullptr};
};

// Four classes of 16x16 images; class c brightens channel c % 3.
std::pair<torch::Tensor, torch::Tensor> make_images(int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  auto labels = torch::randint(0, 4, {n}, torch::kInt64);
  auto images = torch::randint(0, 128, {n, 3, 16, 16}, torch::kInt64);
  for (int64_t i = 0; i < n; ++i) images[i][labels[i].item<int64_t>() % 3].add_(100);
  return {images.to(torch::kUInt8), labels};
}

int main(int argc, char** argv) {
  ptrain::TrainConfig config;
  config.run.strategy = "single";
  config.precision.precision = "fp32";
  config.run.max_steps = 20;
  config.run.device = "cpu";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--strategy") config.run.strategy = value;
    else if (flag == "--precision") config.precision.precision = value;
    else if (flag == "--steps") config.run.max_steps = std::atoll(value.c_str());
    else if (flag == "--device") config.run.device = value;
    else {
      std::cerr << "custom_model: unknown flag " << flag << "\n";
      return 2;
    }
  }
  config.run.batch_size = 32;
  config.run.epochs = 1;
  config.run.threads = 1;
  config.run.progress = "none";
  config.run.seed = 1;
  config.optim.lr = 0.05;
  config.optim.schedule = "constant";
  config.data.augment = false;
  if (config.run.strategy == "dp") config.dist.replicas = 2;

  const auto [train_x, train_y] = make_images(1024, 1);
  const auto [test_x, test_y] = make_images(128, 2);
  torch::manual_seed(0);
  auto model = ptrain::wrap(std::make_shared<SmallNet>(), "small-net", [] { return std::make_shared<SmallNet>(); });

  ptrain::TrainHooks hooks;
  double first_loss = 0, last_loss = 0;
  hooks.on_step = [&](const ptrain::StepReport& step) {
    if (step.global_step == 1) first_loss = step.loss;
    last_loss = step.loss;
  };
  try {
    const ptrain::RunRecord record =
        ptrain::fit(model, ptrain::tensor_data(train_x, train_y, test_x, test_y), config, hooks);
    std::cout << "custom_model: " << record.strategy << " " << record.precision << ", " << record.steps
              << " steps, loss " << first_loss << " -> " << last_loss << ", test accuracy "
              << record.final_test_accuracy.value_or(0.0) << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "custom_model: error: " << e.what() << std::endl;
    return 1;
  }

  // The autocast guard and loss scaler without the trainer: one step of SmallNet in bfloat16 autocast with
  // dynamic loss scaling, as torch.autocast and torch.amp.GradScaler would run it.
  auto net = std::make_shared<SmallNet>();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05));
  ptrain::precision::LossScaler scaler(ptrain::precision::LossScalerOptions{}, torch::kCPU);
  torch::Tensor logits;
  {
    ptrain::precision::AutocastGuard autocast(c10::DeviceType::CPU, /*enabled=*/true, torch::kBFloat16);
    logits = net->forward(train_x.narrow(0, 0, 32).to(torch::kFloat).div(255));
  }
  auto loss = torch::nn::functional::cross_entropy(logits.to(torch::kFloat), train_y.narrow(0, 0, 32));
  scaler.scale(loss).backward();
  std::vector<torch::Tensor> grads;
  for (const auto& p : net->parameters()) grads.push_back(p.grad());
  scaler.unscale_(grads);
  const bool overflow = scaler.found_inf().item<float>() > 0;
  if (!overflow) sgd.step();
  scaler.update();
  std::cout << "custom_model: hand-written step, autocast " << c10::toString(logits.scalar_type()) << " logits, loss "
            << loss.item<double>() << (overflow ? ", skipped (overflow)" : ", applied") << std::endl;
  return 0;
}
