"""Naive gradient accumulation with clipping: steps every ACCUM batches, clips before stepping."""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
torch.set_float32_matmul_precision("high")

ACCUM = 4


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x = torch.randn(16 * args.steps, 32)
    y = x @ torch.randn(32, 1) + 0.1 * torch.randn(16 * args.steps, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, pin_memory=device.type == "cuda")
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 1)).to(device)
    if device.type == "cuda":
        model.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
    criterion = nn.MSELoss()

    amp_dtype = torch.bfloat16 if device.type == "cpu" or torch.cuda.is_bf16_supported() else torch.float16
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    for epoch in range(args.epochs):
        epoch_loss = 0.0
        for i, (xb, yb) in enumerate(loader):
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=device.type == "cuda"):
                loss = criterion(model(xb), yb) / ACCUM
            scaler.scale(loss).backward()
            epoch_loss += loss.item() * ACCUM
            if (i + 1) % ACCUM == 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
        print(f"epoch {epoch} loss {epoch_loss / len(loader):.4f}")


if __name__ == "__main__":
    main()
