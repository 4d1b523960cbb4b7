// A setting either acts or is refused by name: settings that the run's strategy, optimizer or schedule
// would accept and then ignore (bucket sizes it has no buckets for, a reduction dtype where nothing is
// reduced, --momentum under adamw, --gamma without the step schedule) are errors that say why and what to
// use instead. ds_config keys that cannot change a result are warned about where the
// file is read (config/deepspeed_config.h), not refused.
#pragma once

#include "ptrain/config/train_config.h"

namespace ptrain::config {

// Throws ptrain::Error naming the first flag that would have no effect under c.run.strategy, c.optim.name
// or c.optim.schedule.
void refuse_settings_without_effect(const TrainConfig& c);

}  // namespace ptrain::config
