#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ptrain/config/cli_options.h"
#include "ptrain/config/near_names.h"
#include "ptrain/core/error.h"
#include "test_support.h"

namespace {

namespace fs = std::filesystem;
using ptrain::config::TrainConfig;

std::string write_yaml(const std::string& name, const std::string& text) {
  const fs::path path = fs::temp_directory_path() / ("ptrain_config_test_" + name + ".yaml");
  std::ofstream(path) << text;
  return path.string();
}

// Parses argv as `ptrain train` does, then the YAML file if one is named.
TrainConfig parse(std::vector<std::string> args) {
  TrainConfig config;
  CLI::App app;
  CLI::Option* file = ptrain::config::add_train_options(app, config);
  std::vector<const char*> argv{"train"};
  for (const auto& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), const_cast<char**>(argv.data()));
  if (file->count() > 0) ptrain::config::apply_yaml_config(app, file->as<std::string>());
  return config;
}

std::string error_of(const std::function<void()>& f) { return ptrain::testing::error_message<std::exception>(f); }

TEST(TrainOptions, DefaultsAreTheDocumentedOnes) {
  const TrainConfig c = parse({});
  EXPECT_EQ(c.model.name, "resnet18");
  EXPECT_EQ(c.precision.precision, "fp32");
  EXPECT_EQ(c.run.batch_size, 128);
  EXPECT_EQ(c.optim.grad_accum, 1);
}

TEST(TrainOptions, FlagsFillTheTree) {
  const TrainConfig c = parse({"--model", "resnet50", "--precision", "amp-bf16", "--batch-size", "64", "--lr", "0.05",
                               "--milestones", "30,60", "--channels-last", "--no-augment", "--grad-accum", "4"});
  EXPECT_EQ(c.model.name, "resnet50");
  EXPECT_EQ(c.precision.precision, "amp-bf16");
  EXPECT_EQ(c.run.batch_size, 64);
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.05);
  EXPECT_EQ(c.optim.milestones, (std::vector<int64_t>{30, 60}));
  EXPECT_EQ(c.model.channels_last, "true");
  EXPECT_FALSE(c.data.augment);
  EXPECT_EQ(c.optim.grad_accum, 4);
}

TEST(TrainOptions, YamlKeysApplyAndFlagsWin) {
  const auto path = write_yaml("apply",
                               "model: resnet34\nbatch_size: 32\nlr: 0.2\nchannels-last: true\n"
                               "milestones: [2, 4]\nprecision: bf16\nmaster_weights: true\n");
  const TrainConfig c = parse({"--config", path, "--batch-size", "16"});
  EXPECT_EQ(c.model.name, "resnet34");
  EXPECT_EQ(c.run.batch_size, 16);  // the flag wins over the file
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.2);
  EXPECT_EQ(c.model.channels_last, "true");
  EXPECT_EQ(c.optim.milestones, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(c.precision.precision, "bf16");
  EXPECT_TRUE(c.precision.master_weights);
}

// cuDNN's search is on unless a flag or a config file's key (the quick suite's workload) turns it off.
TEST(TrainOptions, CudnnBenchmarkIsOnUnlessTurnedOff) {
  EXPECT_TRUE(parse({}).run.cudnn_benchmark);
  EXPECT_FALSE(parse({"--no-cudnn-benchmark"}).run.cudnn_benchmark);
  EXPECT_FALSE(parse({"--config", write_yaml("cudnn", "cudnn-benchmark: false\n")}).run.cudnn_benchmark);
  EXPECT_TRUE(parse({"--config", write_yaml("cudnn_on", "cudnn-benchmark: false\n"), "--cudnn-benchmark"})
                  .run.cudnn_benchmark);
}

TEST(TrainOptions, UnknownYamlKeyIsNamedWithItsFile) {
  const auto path = write_yaml("unknown", "lr: 0.1\nlearning_rat: 0.2\n");
  const std::string message = error_of([&] { parse({"--config", path}); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("learning_rat"), std::string::npos) << message;
  // Far from every key: no guess, and not the list of all 140 of them either.
  EXPECT_EQ(message.find("did you mean"), std::string::npos) << message;
  EXPECT_EQ(message.find("batch-size"), std::string::npos) << message;
  EXPECT_NE(message.find("ptrain train --help"), std::string::npos) << message;
  EXPECT_LT(message.size(), 200u) << message;
}

TEST(TrainOptions, UnknownYamlKeyNearAKnownOneSaysWhichItMayMean) {
  const auto typo = write_yaml("typo", "batch_sze: 32\n");
  const std::string message = error_of([&] { parse({"--config", typo}); });
  EXPECT_NE(message.find(typo + ": key 'batch_sze' is not a ptrain train option (did you mean batch-size?)"),
            std::string::npos) << message;
  const auto prefix = write_yaml("prefix", "warmup: 2\n");
  const std::string both = error_of([&] { parse({"--config", prefix}); });
  EXPECT_NE(both.find("(did you mean warmup-epochs, warmup-min-lr or warmup-steps?)"), std::string::npos) << both;
}

TEST(NearNames, TyposOfAFewEditsFindTheirNameAndOthersNone) {
  using ptrain::config::did_you_mean;
  using ptrain::config::edit_distance;
  EXPECT_EQ(edit_distance("batch-size", "batch-size"), 0u);
  EXPECT_EQ(edit_distance("batch-sze", "batch-size"), 1u);   // a letter missing
  EXPECT_EQ(edit_distance("batch-szie", "batch-size"), 1u);  // two letters swapped
  EXPECT_EQ(edit_distance("lr", "epochs"), 6u);
  const std::vector<std::string> names{"lr", "epochs", "eps", "batch-size", "eval-batch-size", "seed"};
  EXPECT_EQ(did_you_mean("batch-szie", names, "--"), " (did you mean --batch-size?)");
  EXPECT_EQ(did_you_mean("epoch", names), " (did you mean epochs?)");
  EXPECT_EQ(did_you_mean("ep", names), " (did you mean eps?)");
  EXPECT_EQ(did_you_mean("learning-rate", names), "");
  EXPECT_EQ(did_you_mean("x", {"lr"}), "");
}

TEST(TrainOptions, BadYamlValueIsNamedWithItsKey) {
  const auto path = write_yaml("badvalue", "precision: fp9\n");
  const std::string message = error_of([&] { parse({"--config", path}); });
  EXPECT_NE(message.find("'precision'"), std::string::npos) << message;
  EXPECT_NE(message.find("fp9"), std::string::npos) << message;

  const auto path2 = write_yaml("notanumber", "batch-size: many\n");
  const std::string message2 = error_of([&] { parse({"--config", path2}); });
  EXPECT_NE(message2.find("batch-size"), std::string::npos) << message2;
}

// A number under a switch's key is refused by name (CLI11 alone counts it: 007 would turn CUDA graphs on);
// YAML's true/false spellings, and channels-last's values, are taken.
TEST(TrainOptions, ANumberUnderASwitchsYamlKeyIsRefusedByName) {
  for (const std::string value : {"007", "0", "1", "2", "-1", "1.5", "0x1"}) {
    const auto path = write_yaml("switchnumber", "augment: " + value + "\n");
    const std::string message = error_of([&] { parse({"--config", path}); });
    EXPECT_NE(message.find(path + ": key 'augment': a flag takes true or false, not the number " + value), std::string::npos)
        << message;
  }
  EXPECT_FALSE(parse({"--config", write_yaml("switchno", "augment: no\nnesterov: off\n")}).data.augment);
  EXPECT_TRUE(parse({"--config", write_yaml("switchyes", "augment: yes\nnesterov: on\n")}).optim.nesterov);
  EXPECT_TRUE(parse({"--config", write_yaml("switchtrue", "augment: True\n")}).data.augment);
  EXPECT_EQ(parse({"--config", write_yaml("channels", "channels-last: auto\n")}).model.channels_last, "auto");
  const std::string message = error_of([&] { parse({"--config", write_yaml("channels1", "channels-last: 1\n")}); });
  EXPECT_NE(message.find("'channels-last': a flag takes true or false, not the number 1"), std::string::npos) << message;
}

// What ptrain launch reads of a train command's --config before the ranks start: the device key, in either
// spelling of the flag; nothing for other commands, a file without the key, or one it cannot read.
TEST(TrainOptions, ALauncherFindsTheDeviceOfATrainCommandsConfig) {
  const auto path = write_yaml("launchdevice", "model: resnet20\ndevice: cpu\n");
  using ptrain::config::device_in_train_config;
  EXPECT_EQ(device_in_train_config({"ptrain", "train", "--config", path}), "cpu");
  EXPECT_EQ(device_in_train_config({"./build/ptrain", "train", "--epochs", "2", "--config=" + path}), "cpu");
  EXPECT_EQ(device_in_train_config({"python3", "script.py", "--config", path}), "");
  EXPECT_EQ(device_in_train_config({"ptrain", "train", "--config", write_yaml("launchnodevice", "model: resnet20\n")}), "");
  EXPECT_EQ(device_in_train_config({"ptrain", "train", "--config", "/nonexistent/ptrain.yaml"}), "");
  EXPECT_EQ(device_in_train_config({"ptrain", "train", "--config", write_yaml("launchbad", "device: [cpu\n")}), "");
  // A FIFO is not read (it would block here without a writer, or take what the ranks were to read).
  const fs::path fifo = fs::temp_directory_path() / "ptrain_config_test_launch.fifo";
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(device_in_train_config({"ptrain", "train", "--config", fifo.string()}), "");
  fs::remove(fifo);
}

TEST(TrainOptions, MalformedYamlAndMissingFileAreRefused) {
  const auto path = write_yaml("malformed", "lr: [0.1\n");
  EXPECT_NE(error_of([&] { parse({"--config", path}); }).find("not valid YAML"), std::string::npos);
  const auto list_path = write_yaml("notmap", "- lr\n- 0.1\n");
  EXPECT_NE(error_of([&] { parse({"--config", list_path}); }).find("mapping"), std::string::npos);
  EXPECT_NE(error_of([&] { parse({"--config", "/nonexistent/ptrain.yaml"}); }).find("/nonexistent/ptrain.yaml"),
            std::string::npos);
}

TEST(TrainOptions, BadFlagValuesNameTheFlag) {
  const std::string precision = error_of([] { parse({"--precision", "fp9"}); });
  EXPECT_NE(precision.find("--precision"), std::string::npos) << precision;
  const std::string batch = error_of([] { parse({"--batch-size", "0"}); });
  EXPECT_NE(batch.find("--batch-size"), std::string::npos) << batch;
  const std::string unknown = error_of([] { parse({"--learning-rate", "1"}); });
  EXPECT_NE(unknown.find("--learning-rate"), std::string::npos) << unknown;
}

// The GPT shape and token flags, as flags, YAML keys and PTRAIN_<FLAG> variables (which `ptrain launch`
// hands to the processes it starts); the flag wins over the variable.
// CLI11's own range checks let NaN through (every comparison with it is false) and print DBL_MAX in full.
TEST(TrainOptions, NonFiniteAndOutOfRangeNumbersAreRefusedReadably) {
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--momentum", "nan"}, {"--weight-decay", "nan"}, {"--lr", "nan"}, {"--lr", "inf"}, {"--lr", "1e400"},
           {"--clip-grad-norm", "-inf"}, {"--beta2", "NaN"}, {"--dist-timeout", "nan"}}) {
    const std::string message = error_of([&] { parse({flag, value}); });
    EXPECT_NE(message.find(flag), std::string::npos) << flag << " " << value << ": " << message;
    EXPECT_NE(message.find("not a finite number"), std::string::npos) << flag << " " << value << ": " << message;
  }
  const std::string range = error_of([&] { parse({"--lr", "-1"}); });
  EXPECT_NE(range.find("must be greater than 0, not -1"), std::string::npos) << range;
  EXPECT_LT(range.size(), 120u) << range;
  const std::string momentum = error_of([&] { parse({"--momentum", "1.5"}); });
  EXPECT_NE(momentum.find("must be between 0 and 1, not 1.5"), std::string::npos) << momentum;
  EXPECT_NE(error_of([&] { parse({"--seed", "-1"}); }).find("--seed"), std::string::npos);
  EXPECT_NE(error_of([&] { parse({"--epochs", "99999999999999999999"}); }).find("--epochs"), std::string::npos);
  EXPECT_EQ(parse({"--seed", "18446744073709551615"}).run.seed, 18446744073709551615ull);
}

// CLI11 and yaml-cpp read integers as C does: 010 was eight (octal), 09 no number, 0x20 thirty-two. Every
// numeric flag, --config key and PTRAIN_* variable is decimal: a leading zero is a zero, other bases are refused.
TEST(TrainOptions, ZeroPaddedNumbersAreDecimalAndOtherBasesAreRefusedByName) {
  EXPECT_EQ(parse({"--batch-size", "010"}).run.batch_size, 10);
  EXPECT_EQ(parse({"--batch-size", "09"}).run.batch_size, 9);
  EXPECT_EQ(parse({"--batch-size=0008"}).run.batch_size, 8);
  EXPECT_EQ(parse({"--seed", "010"}).run.seed, 10u);
  EXPECT_EQ(parse({"--epochs", "+010"}).run.epochs, 10);
  EXPECT_EQ(parse({"--train-limit", "000"}).data.train_limit, 0);
  EXPECT_EQ(parse({"--milestones", "010,020"}).optim.milestones, (std::vector<int64_t>{10, 20}));
  EXPECT_DOUBLE_EQ(parse({"--lr", "00.5"}).optim.lr, 0.5);
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--batch-size", "0x20"}, {"--seed", "0X10"}, {"--epochs", "0b11"}, {"--grad-accum", "0o7"},
           {"--lr", "0x1p-3"}}) {
    const std::string message = error_of([&] { parse({flag, value}); });
    EXPECT_NE(message.find(flag + ": '" + value + "' is not a decimal number"), std::string::npos) << message;
  }

  const auto path = write_yaml("zero_padded", "batch-size: 010\nseed: 09\n");
  const TrainConfig from_yaml = parse({"--config", path});
  EXPECT_EQ(from_yaml.run.batch_size, 10);
  EXPECT_EQ(from_yaml.run.seed, 9u);
  const std::string hex_key = error_of([&] { parse({"--config", write_yaml("hex", "epochs: 0x3\n")}); });
  EXPECT_NE(hex_key.find("key 'epochs'"), std::string::npos) << hex_key;
  EXPECT_NE(hex_key.find("not a decimal number"), std::string::npos) << hex_key;

  ::setenv("PTRAIN_BATCH_SIZE", "010", 1);
  const int64_t from_environment = parse({}).run.batch_size;
  ::setenv("PTRAIN_BATCH_SIZE", "0x20", 1);
  const std::string hex_variable = error_of([&] { parse({}); });
  ::unsetenv("PTRAIN_BATCH_SIZE");
  EXPECT_EQ(from_environment, 10);
  EXPECT_NE(hex_variable.find("--batch-size: '0x20' is not a decimal number"), std::string::npos) << hex_variable;
}

// CLI11 said "--batch-size: At Most 1 required but received 2" of a flag given twice.
TEST(TrainOptions, AFlagGivenTwiceIsSaidSo) {
  const auto usage_of = [](std::vector<std::string> args) -> std::string {
    try {
      parse(std::move(args));
    } catch (const CLI::ParseError& e) {
      return ptrain::config::usage_message(e);
    }
    return "no usage error";
  };
  EXPECT_EQ(usage_of({"--batch-size", "8", "--batch-size", "9"}), "--batch-size is given twice: keep one");
  EXPECT_EQ(usage_of({"--lr=0.1", "--lr", "0.2", "--lr", "0.3"}), "--lr is given 3 times: keep one");
  EXPECT_EQ(usage_of({"--precision", "fp9"}).find("is given"), std::string::npos);
}

// CLI11 drops a list's empty items: "--skip-fusions ," was short of a value and took the next flag as its list.
TEST(TrainOptions, AnEmptyListIsRefusedNamingItsFlagInsteadOfTakingTheNextFlag) {
  const std::string comma = error_of([] { parse({"--skip-fusions", ",", "--lr", "0.5"}); });
  EXPECT_NE(comma.find("--skip-fusions: the list is empty (such as ','), and the flag '--lr' after it"),
            std::string::npos) << comma;
  const std::string empty = error_of([] { parse({"--skip-fusions", "", "--lr", "0.5"}); });
  EXPECT_NE(empty.find("--skip-fusions: the list is empty"), std::string::npos) << empty;
  EXPECT_NE(error_of([] { parse({"--milestones", ",", "--epochs", "3"}); }).find("--milestones: the list is empty"),
            std::string::npos);
  EXPECT_EQ(parse({"--skip-fusions", "stem-pool,", "--lr", "0.5"}).run.skip_fusions,
            std::vector<std::string>{"stem-pool"});
}

// LibTorch holds these settings as floats: a larger value used to pass every check (--dry-run's too) and
// fail in the first step as "value cannot be converted to type float without overflow", naming no flag.
TEST(TrainOptions, FloatSettingsBeyondAFloatAreRefusedByNameAsFlagYamlKeyAndVariable) {
  for (const char* flag : {"--lr", "--weight-decay", "--eps", "--gamma", "--min-lr", "--clip-grad-norm",
                           "--initial-loss-scale", "--min-loss-scale"}) {
    const std::string message = error_of([&] { parse({flag, "1e39"}); });
    EXPECT_NE(message.find(flag), std::string::npos) << message;
    EXPECT_NE(message.find("at most 3.40282e+38 (the largest float), not 1e39"), std::string::npos) << message;
    EXPECT_LT(message.size(), 140u) << message;
  }
  EXPECT_DOUBLE_EQ(parse({"--initial-loss-scale", "3e38"}).precision.initial_loss_scale, 3e38);

  const auto path = write_yaml("float_overflow", "weight_decay: 1e39\n");
  const std::string from_yaml = error_of([&] { parse({"--config", path}); });
  EXPECT_NE(from_yaml.find(path + ": key 'weight_decay'"), std::string::npos) << from_yaml;
  EXPECT_NE(from_yaml.find("not 1e39"), std::string::npos) << from_yaml;

  ::setenv("PTRAIN_CLIP_GRAD_NORM", "5e38", 1);
  const std::string from_environment = error_of([&] { parse({}); });
  ::unsetenv("PTRAIN_CLIP_GRAD_NORM");
  EXPECT_NE(from_environment.find("--clip-grad-norm"), std::string::npos) << from_environment;
  EXPECT_NE(from_environment.find("not 5e38"), std::string::npos) << from_environment;
}

// yaml-cpp's LoadFile reads the first document only: settings after a "---" were dropped without a word.
TEST(TrainOptions, ASecondYamlDocumentIsRefusedNamingTheFileAndItsLine) {
  const auto path = write_yaml("two_documents", "epochs: 3\n---\nlr: 0.5\n");
  const std::string message = error_of([&] { parse({"--config", path}); });
  EXPECT_NE(message.find(path + ": holds a second YAML document (from line 3)"), std::string::npos) << message;
  // An explicit start and end of the one document are fine.
  EXPECT_EQ(parse({"--config", write_yaml("one_document", "---\nepochs: 3\n...\n")}).run.epochs, 3);
}

TEST(TrainOptions, ADirectoryAsConfigIsRefusedNamingIt) {
  const std::string directory = (fs::temp_directory_path() / "ptrain_config_test_directory").string();
  fs::create_directories(directory);
  const std::string message = error_of([&] { parse({"--config", directory}); });
  EXPECT_EQ(message, directory + ": is a directory, not a YAML config file");
}

TEST(TrainOptions, AKeyGivenTwiceInYamlIsRefusedNamingBothLines) {
  const auto path = write_yaml("twice", "epochs: 3\nlr: 0.1\nbatch_size: 16\nbatch-size: 64\n");
  const std::string message = error_of([&] { parse({"--config", path}); });
  EXPECT_NE(message.find(path + ": key 'batch-size' is given twice (line 3 as 'batch_size' and line 4)"),
            std::string::npos)
      << message;
  EXPECT_NE(error_of([&] { parse({"--config", write_yaml("twice2", "lr: 0.1\nlr: 0.2\n")}); }).find("'lr' is given twice"),
            std::string::npos);
}

TEST(TrainOptions, GptFlagsComeFromFlagsYamlAndEnvironment) {
  TrainConfig c = parse({"--model", "gpt-tiny", "--gpt-layers", "3", "--gpt-width", "96", "--gpt-heads", "6",
                         "--seq-len", "128", "--vocab-size", "512"});
  EXPECT_EQ(c.model.gpt_layers, 3);
  EXPECT_EQ(c.model.gpt_width, 96);
  EXPECT_EQ(c.model.gpt_heads, 6);
  EXPECT_EQ(c.data.seq_len, 128);
  EXPECT_EQ(c.model.vocab_size, 512);

  c = parse({"--config", write_yaml("gpt", "gpt_layers: 5\ngpt-width: 80\nseq_len: 33\nvocab-size: 300\n")});
  EXPECT_EQ(c.model.gpt_layers, 5);
  EXPECT_EQ(c.model.gpt_width, 80);
  EXPECT_EQ(c.data.seq_len, 33);
  EXPECT_EQ(c.model.vocab_size, 300);

  ::setenv("PTRAIN_GPT_LAYERS", "7", 1);
  ::setenv("PTRAIN_GPT_WIDTH", "112", 1);
  ::setenv("PTRAIN_GPT_HEADS", "8", 1);
  ::setenv("PTRAIN_SEQ_LEN", "48", 1);
  ::setenv("PTRAIN_VOCAB_SIZE", "1000", 1);
  c = parse({"--gpt-heads", "4"});
  for (const char* name : {"PTRAIN_GPT_LAYERS", "PTRAIN_GPT_WIDTH", "PTRAIN_GPT_HEADS", "PTRAIN_SEQ_LEN",
                           "PTRAIN_VOCAB_SIZE"}) {
    ::unsetenv(name);
  }
  EXPECT_EQ(c.model.gpt_layers, 7);
  EXPECT_EQ(c.model.gpt_width, 112);
  EXPECT_EQ(c.model.gpt_heads, 4);
  EXPECT_EQ(c.data.seq_len, 48);
  EXPECT_EQ(c.model.vocab_size, 1000);

  const std::string negative = error_of([] { parse({"--gpt-layers", "-1"}); });
  EXPECT_NE(negative.find("--gpt-layers"), std::string::npos) << negative;
}

}  // namespace
