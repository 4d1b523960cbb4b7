#!/usr/bin/env python3
"""Oracle for ptrain's WarmupLR, WarmupDecayLR and WarmupCosineLR schedules: DeepSpeed's schedulers as
deepspeed/runtime/lr_schedules.py (github.com/deepspeedai/DeepSpeed, master at edaa722) computes them, rewritten
here because DeepSpeed is not installed, driven as deepspeed/runtime/engine.py drives them: the constructor sets
the rate of last_batch_iteration -1, and _take_model_step steps the scheduler after each optimizer step. Prints
the learning rate of a torch.optim.SGD param group at each optimizer step, one a line (repr: every digit)."""
import argparse
import math

import torch

WARMUP_LOG_RATE = "log"
WARMUP_LINEAR_RATE = "linear"


def update_lr(param_groups, lrs):
    for group, lr in zip(param_groups, lrs):
        group["lr"] = lr


class WarmupLR:
    def __init__(self, optimizer, warmup_min_lr=0.0, warmup_max_lr=None, warmup_num_steps=1000,
                 warmup_type=WARMUP_LOG_RATE, last_batch_iteration=-1):
        self.optimizer = optimizer
        if warmup_max_lr is None:
            warmup_max_lr = [group["lr"] for group in optimizer.param_groups]
        self.min_lrs = [warmup_min_lr] * len(optimizer.param_groups)
        self.max_lrs = warmup_max_lr if isinstance(warmup_max_lr, list) else [warmup_max_lr] * len(optimizer.param_groups)
        self.delta_lrs = [big - small for big, small in zip(self.max_lrs, self.min_lrs)]
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.warmup_type = warmup_type
        self.inverse_log_warm_up = 1.0 / math.log(self.warmup_num_steps)
        self.last_batch_iteration = last_batch_iteration
        if last_batch_iteration == -1:
            update_lr(optimizer.param_groups, self.get_lr())

    def get_lr(self):
        if self.last_batch_iteration < 0:
            return self.min_lrs
        gamma = self._get_gamma()
        return [min_lr + (delta_lr * gamma) for min_lr, delta_lr in zip(self.min_lrs, self.delta_lrs)]

    def step(self):
        self.last_batch_iteration += 1
        update_lr(self.optimizer.param_groups, self.get_lr())

    def _get_gamma(self):
        if self.last_batch_iteration < self.warmup_num_steps:
            if self.warmup_type == WARMUP_LOG_RATE:
                return self.inverse_log_warm_up * math.log(self.last_batch_iteration + 1)
            elif self.warmup_type == WARMUP_LINEAR_RATE:
                return self.last_batch_iteration / self.warmup_num_steps
        return 1.0


class WarmupDecayLR(WarmupLR):
    def __init__(self, optimizer, total_num_steps, warmup_min_lr=0.0, warmup_max_lr=0.001, warmup_num_steps=1000,
                 warmup_type=WARMUP_LOG_RATE, last_batch_iteration=-1):
        self.total_num_steps = total_num_steps
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type, last_batch_iteration)

    def _get_gamma(self):
        if self.last_batch_iteration < self.warmup_num_steps:
            if self.warmup_type == WARMUP_LOG_RATE:
                return self.inverse_log_warm_up * math.log(self.last_batch_iteration + 1)
            elif self.warmup_type == WARMUP_LINEAR_RATE:
                return self.last_batch_iteration / self.warmup_num_steps
        return max(0.0, float(self.total_num_steps - self.last_batch_iteration) /
                   float(max(1.0, self.total_num_steps - self.warmup_num_steps)))


class WarmupCosineLR:
    def __init__(self, optimizer, total_num_steps, warmup_min_ratio=0.0, warmup_num_steps=1000, cos_min_ratio=0.0001,
                 warmup_type=WARMUP_LOG_RATE, last_batch_iteration=-1):
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.last_batch_iteration = last_batch_iteration
        self.cos_min_ratio = cos_min_ratio
        self.warmup_type = warmup_type
        self.warmup_min_ratio = warmup_min_ratio
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.inverse_log_warm_up = 1.0 / math.log(self.warmup_num_steps)
        self.org_lrs = [group["lr"] for group in optimizer.param_groups]
        if last_batch_iteration == -1:
            update_lr(optimizer.param_groups, self.get_lr())

    def get_lr_ratio(self):
        if self.last_batch_iteration < 0:
            return 0.0
        if self.last_batch_iteration < self.warmup_num_steps:
            if self.warmup_type == WARMUP_LOG_RATE:
                ratio = self.inverse_log_warm_up * math.log(self.last_batch_iteration + 1)
            elif self.warmup_type == WARMUP_LINEAR_RATE:
                ratio = self.last_batch_iteration / self.warmup_num_steps
            ratio_delta = 1. - self.warmup_min_ratio
            return self.warmup_min_ratio + ratio * ratio_delta
        real_last_step = self.last_batch_iteration - self.warmup_num_steps + 1
        real_total_steps = max(1, self.total_num_steps - self.warmup_num_steps)
        cosine_progress = min(1.0, real_last_step / real_total_steps)
        ratio_delta = 1. - self.cos_min_ratio
        ratio = (1 + math.cos(math.pi * cosine_progress)) / 2
        return max(0.0, self.cos_min_ratio + ratio_delta * ratio)

    def get_lr(self):
        if self.last_batch_iteration < 0:
            return [0.0 for _ in self.org_lrs]
        return [org_lr * self.get_lr_ratio() for org_lr in self.org_lrs]

    def step(self):
        self.last_batch_iteration += 1
        update_lr(self.optimizer.param_groups, self.get_lr())


SCHEDULERS = {"WarmupLR": WarmupLR, "WarmupDecayLR": WarmupDecayLR, "WarmupCosineLR": WarmupCosineLR}

p = argparse.ArgumentParser()
p.add_argument("--type", choices=SCHEDULERS, help="one scheduler (or --case, for several)")
p.add_argument("--steps", type=int, required=True)
p.add_argument("--lr", type=float, required=True, help="the optimizer's lr (WarmupCosineLR's and WarmupLR's peak)")
p.add_argument("--params", default="", help="scheduler params as key=value,key=value (ds_config's scheduler.params)")
p.add_argument("--case", nargs=2, action="append", metavar=("TYPE", "PARAMS"),
               help="a scheduler and its params, repeatable: each case's rates in turn, an empty line between two "
                    "(one process for all, as importing torch costs more than the cases)")
a = p.parse_args()
if a.type is None and not a.case:
    p.error("--type or --case is required")
cases = a.case or [(a.type, a.params)]
for number, (kind, params) in enumerate(cases):
    if kind not in SCHEDULERS:
        p.error(f"--case: {kind} is not one of {', '.join(SCHEDULERS)}")
    if number > 0:
        print()
    kwargs = {}
    for item in filter(None, params.split(",")):
        key, value = item.split("=")
        kwargs[key] = value if key == "warmup_type" else (int(value) if key.endswith("_steps") else float(value))

    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=a.lr)
    scheduler = SCHEDULERS[kind](optimizer, **kwargs)
    for step in range(a.steps):
        print(repr(optimizer.param_groups[0]["lr"]))
        weight.grad = torch.ones(3)
        optimizer.step()
        scheduler.step()
