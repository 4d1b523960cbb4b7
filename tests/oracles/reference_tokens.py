"""The token datasets as bench/pytorch_reference.py builds them, for ptrain's to be compared with.

  reference_tokens.py synthetic-tokens SPEC SEQ_LEN ROWS
  reference_tokens.py text PATH SEQ_LEN ROWS
For the train and then the test split prints a line "SPLIT N T VOCAB", then the first ROWS input sequences
and the first ROWS label sequences, one per line, tokens space-separated.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
import pytorch_reference  # noqa: E402


def main():
    dataset, path, seq_len, rows = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    for train in (True, False):
        x, y, vocab = pytorch_reference.load_tokens(dataset, path, seq_len, train)
        print("train" if train else "test", x.shape[0], x.shape[1], vocab)
        for t in (x, y):
            for row in t[:rows].tolist():
                print(" ".join(map(str, row)))


if __name__ == "__main__":
    main()
