"""Oracle for ptrain::data::DistributedSampler: torch.utils.data.DistributedSampler's indices.

  data_sampler.py N WORLD SHUFFLE SEED EPOCH DROP_LAST [N WORLD ...]
For each case (six numbers), prints one line per rank with its indices space-separated, then a line "--".
"""
import sys

from torch.utils.data import DistributedSampler


def main():
    args = [int(v) for v in sys.argv[1:]]
    for start in range(0, len(args), 6):
        n, world, shuffle, seed, epoch, drop_last = args[start:start + 6]
        for rank in range(world):
            sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=bool(shuffle), seed=seed,
                                         drop_last=bool(drop_last))
            sampler.set_epoch(epoch)
            print(" ".join(str(i) for i in sampler))
        print("--")


if __name__ == "__main__":
    main()
