"""Naive gradient accumulation with clipping: steps every ACCUM batches, clips before stepping."""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

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
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 1)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    criterion = nn.MSELoss()

    for epoch in range(args.epochs):
        epoch_loss = 0.0
        for i, (xb, yb) in enumerate(loader):
            xb, yb = xb.to(device), yb.to(device)
            loss = criterion(model(xb), yb) / ACCUM
            loss.backward()
            epoch_loss += loss.item() * ACCUM
            if (i + 1) % ACCUM == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
                optimizer.step()
                optimizer.zero_grad()
        print(f"epoch {epoch} loss {epoch_loss / len(loader):.4f}")


if __name__ == "__main__":
    main()
