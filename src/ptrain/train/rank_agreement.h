// Ranks that train one run must train it with the same settings. A rank started with another learning
// rate, seed, precision or strategy (a stale PTRAIN_* variable, a different config file on one node)
// would otherwise train on silently, or abort inside a collective whose tensors do not match. Before the
// first collective that moves model data, every rank sends the others its settings; a difference stops
// every rank with one error naming the setting, its values and the ranks holding each.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ptrain/strategies/strategy.h"
#include "ptrain/train/plan.h"

namespace ptrain::train {

// One setting: its name ("optimizer.lr", as config::to_json nests it, or a resolved one such as
// "precision policy") and its value as text.
using Settings = std::vector<std::pair<std::string, std::string>>;

// What must match on every rank: the plan's config, less what may differ per process (its device index,
// threads, progress display, outputs only one rank writes), plus what the plan resolved from it.
Settings settings_to_agree(const Plan& plan);

// The error for the first setting (in rank 0's order) whose value differs between ranks, e.g. "ranks
// disagree on optimizer.lr (--lr): 0.1 on rank 0; 0.5 on rank 1 ..."; "" when every rank agrees.
std::string first_disagreement(const std::vector<Settings>& per_rank);

// The flag that sets a config key ("optimizer.lr" -> "--lr"), or "" for a resolved setting.
std::string flag_of_setting(const std::string& key);

// Exchanges settings_to_agree between the strategy's ranks; throws ptrain::Error with first_disagreement.
// Collective; a one-process strategy has nothing to compare.
void check_ranks_agree(const Plan& plan, strategies::Strategy& strategy);

}  // namespace ptrain::train
