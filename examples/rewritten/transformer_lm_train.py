"""Naive transformer language-model training on synthetic tokens."""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
torch.set_float32_matmul_precision("high")

VOCAB, SEQ = 128, 32


class LM(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        layer = nn.TransformerEncoderLayer(dim, 4, 4 * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.out = nn.Linear(dim, VOCAB)

    def forward(self, tokens):
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        return self.out(self.encoder(self.embed(tokens), mask=mask, is_causal=True))


def make_tokens(n):
    start = torch.randint(0, VOCAB, (n, 1), generator=torch.Generator().manual_seed(0))
    seq = [start]
    for _ in range(SEQ):
        seq.append((5 * seq[-1] + 3) % VOCAB)
    tokens = torch.cat(seq, 1)
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loader = DataLoader(make_tokens(32 * args.steps), batch_size=32, shuffle=True, pin_memory=torch.device(device).type == "cuda")
    model = LM().to(device)
    if torch.device(device).type == "cuda":
        model.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, fused=True)
    loss_fn = nn.CrossEntropyLoss()

    amp_dtype = torch.bfloat16 if torch.device(device).type == "cpu" or torch.cuda.is_bf16_supported() else torch.float16
    scaler = torch.amp.GradScaler(torch.device(device).type, enabled=amp_dtype == torch.float16)
    for epoch in range(args.epochs):
        total = 0.0
        for inputs, targets in loader:
            inputs = inputs.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            with torch.autocast(device_type=torch.device(device).type, dtype=amp_dtype, enabled=torch.device(device).type == "cuda"):
                logits = model(inputs)
                loss = loss_fn(logits.reshape(-1, VOCAB), targets.reshape(-1))
                optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            total += loss.detach()
        print(f"epoch {epoch} loss {total / len(loader):.4f}")


if __name__ == "__main__":
    main()
