#!/usr/bin/env python3
"""PyTorch workloads for tracing and the performance model (issue 24): a small transformer's
training step and greedy text generation, both on random weights (what matters is the calls the
program makes, not what it learns).

    python3 tools/bench/torch_workloads.py train [--steps N] [--warmup N]
    python3 tools/bench/torch_workloads.py generate [--tokens N] [--warmup N]

`train`: a 4-layer transformer encoder (d_model 256, 4 heads, sequence 128, batch 16) with a
token embedding and an output projection, cross-entropy loss, AdamW; each step ends with
`loss.item()`, the program's one wait. `generate`: the same shape as a causal decoder, prompt of
16 tokens, one token per step by argmax without a cache; each step ends with `.item()` on the
new token. Run under `rgpu run` to go through rgpu. Prints one `RESULT` line with the timed
part's seconds and per-step time (warm-up steps excluded).
"""
import argparse
import sys
import time

import torch
from torch import nn

VOCAB, D_MODEL, HEADS, LAYERS, SEQ, BATCH = 1000, 256, 4, 4, 128, 16


class TinyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, 4 * D_MODEL, dropout=0.0,
                                           batch_first=True)
        self.body = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens, causal=False):
        mask = None
        if causal:
            mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1],
                                                                  device=tokens.device)
        return self.head(self.body(self.embed(tokens), mask=mask, is_causal=causal))


def train(steps, warmup):
    torch.manual_seed(0)
    model = TinyTransformer().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda")
    targets = torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda")
    loss_fn = nn.CrossEntropyLoss()
    start = None
    for step in range(warmup + steps):
        if step == warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(tokens).reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        opt.step()
        loss.item()
    return time.perf_counter() - start, steps


def generate(tokens_out, warmup):
    torch.manual_seed(0)
    model = TinyTransformer().cuda().eval()
    prompt = torch.randint(0, VOCAB, (1, 16), device="cuda")
    start = None
    with torch.no_grad():
        seq = prompt
        for step in range(warmup + tokens_out):
            if step == warmup:
                torch.cuda.synchronize()
                start = time.perf_counter()
                seq = prompt
            logits = model(seq, causal=True)
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            nxt.item()
            seq = torch.cat([seq, nxt], dim=1)
    return time.perf_counter() - start, tokens_out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workload", choices=["train", "generate"])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 1
    if args.workload == "train":
        seconds, n = train(args.steps, args.warmup)
    else:
        seconds, n = generate(args.tokens, args.warmup)
    print(f"RESULT {args.workload} steps {n} seconds {seconds:.6f} per_step_ms {1e3 * seconds / n:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
