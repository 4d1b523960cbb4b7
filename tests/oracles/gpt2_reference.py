"""A GPT-2 style language model in plain PyTorch, as the reference for ptrain's models/gpt.

  gpt2_reference.py export --layers 2 --width 32 --heads 4 --vocab 50 --seq-len 16 --out DIR [--dtype float64]
      builds the reference model (seed 0), runs one forward and backward on random tokens and writes into DIR:
        weights.pth  the model's weights under ptrain's names (wte.weight, h.0.attn.c_attn.weight, ...)
        names.txt    one "name<TAB>d0,d1,..." line per weight, in order
        io.pth       {"tokens": int64 [2, T], "targets": int64 [2, T], "logits": [2, T, vocab],
                      "loss": mean cross-entropy of logits against targets}
        grads.pth    the gradient of that loss for every weight, under the same names

The attention is torch.nn.MultiheadAttention with a boolean causal mask, not a transcription of ptrain's
code: its in_proj (q, k, v stacked on dim 0) is ptrain's c_attn and its out_proj ptrain's c_proj.
"""
import argparse
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(width)
        self.c_fc = nn.Linear(width, 4 * width)
        self.c_proj = nn.Linear(4 * width, width)

    def forward(self, x, mask):
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt2(nn.Module):
    def __init__(self, vocab, seq_len, layers, width, heads):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(seq_len, width)
        self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        # Random biases and LayerNorm affines, so that the comparison exercises every parameter.
        with torch.no_grad():
            for p in self.parameters():
                p.normal_(0.0, 0.1 if p.dim() == 1 else 0.05)

    def forward(self, tokens):
        t = tokens.shape[1]
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)  # True: may not attend (the future)
        x = self.wte(tokens) + self.wpe(torch.arange(t))
        for block in self.h:
            x = block(x, mask)
        return self.lm_head(self.ln_f(x))


def ptrain_names(model):
    """(ptrain name, tensor accessor) per parameter, in ptrain's registration order."""
    entries = [("wte.weight", lambda m: m.wte.weight), ("wpe.weight", lambda m: m.wpe.weight)]
    for i in range(len(model.h)):
        def get(path, i=i):
            def at(m):
                obj = m.h[i]
                for part in path.split("."):
                    obj = getattr(obj, part)
                return obj
            return at
        for ours, theirs in [("ln_1.weight", "ln_1.weight"), ("ln_1.bias", "ln_1.bias"),
                             ("attn.c_attn.weight", "attn.in_proj_weight"), ("attn.c_attn.bias", "attn.in_proj_bias"),
                             ("attn.c_proj.weight", "attn.out_proj.weight"), ("attn.c_proj.bias", "attn.out_proj.bias"),
                             ("ln_2.weight", "ln_2.weight"), ("ln_2.bias", "ln_2.bias"),
                             ("mlp.c_fc.weight", "c_fc.weight"), ("mlp.c_fc.bias", "c_fc.bias"),
                             ("mlp.c_proj.weight", "c_proj.weight"), ("mlp.c_proj.bias", "c_proj.bias")]:
            entries.append((f"h.{i}.{ours}", get(theirs)))
    entries += [("ln_f.weight", lambda m: m.ln_f.weight), ("ln_f.bias", lambda m: m.ln_f.bias),
                ("lm_head.weight", lambda m: m.lm_head.weight)]
    assert len(entries) == sum(1 for _ in model.parameters()), "every parameter is named once"
    return entries


def export(args):
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    model = Gpt2(args.vocab, args.seq_len, args.layers, args.width, args.heads).to(dtype)
    names = ptrain_names(model)
    os.makedirs(args.out, exist_ok=True)
    torch.save({name: get(model).detach().clone() for name, get in names}, os.path.join(args.out, "weights.pth"))
    with open(os.path.join(args.out, "names.txt"), "w") as f:
        for name, get in names:
            f.write(f"{name}\t{','.join(str(d) for d in get(model).shape)}\n")
    tokens = torch.randint(args.vocab, (2, args.seq_len))
    targets = torch.randint(args.vocab, (2, args.seq_len))
    logits = model(tokens)
    loss = F.cross_entropy(logits.reshape(-1, args.vocab), targets.reshape(-1))
    loss.backward()
    torch.save({"tokens": tokens, "targets": targets, "logits": logits.detach(), "loss": loss.detach()},
               os.path.join(args.out, "io.pth"))
    torch.save({name: get(model).grad.clone() for name, get in names}, os.path.join(args.out, "grads.pth"))
    print(f"loss {loss.item():.6f} (chance {math.log(args.vocab):.6f})")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["export"])
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--vocab", type=int, required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float64")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(2)
    export(args)


if __name__ == "__main__":
    main()
