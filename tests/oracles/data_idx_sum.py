"""Oracle for ptrain::data IDX reading: the sum of all pixel bytes of a gzipped IDX image file, read with Python's
gzip module. data_idx_sum.py FILE.gz"""
import gzip
import sys

import numpy as np

with gzip.open(sys.argv[1], "rb") as f:
    data = f.read()
print(int(np.frombuffer(data, dtype=np.uint8, offset=16).astype(np.int64).sum()))
