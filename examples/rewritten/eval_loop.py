"""Naive evaluation: a trained model scored over a validation loader, without no_grad."""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
torch.set_float32_matmul_precision("high")


def evaluate(model, loader, device):
    model.eval()
    correct, total_loss = 0, 0.0
    loss_fn = nn.CrossEntropyLoss()
    with torch.no_grad():
        for x, y in loader:
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            logits = model(x)
            total_loss += loss_fn(logits, y).item()
            correct += (logits.argmax(1) == y).sum().item()
    return total_loss / len(loader), correct / len(loader.dataset)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x = torch.randn(32 * args.steps, 20)
    y = (x[:, :5].sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True, pin_memory=device.type == "cuda")
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2)).to(device)
    if device.type == "cuda":
        model.compile()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
    loss_fn = nn.CrossEntropyLoss()
    amp_dtype = torch.bfloat16 if device.type == "cpu" or torch.cuda.is_bf16_supported() else torch.float16
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    for epoch in range(args.epochs):
        model.train()
        for xb, yb in loader:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            optimizer.zero_grad()
            with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=device.type == "cuda"):
                loss = loss_fn(model(xb), yb)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        val_loss, acc = evaluate(model, loader, device)
        print(f"epoch {epoch} loss {val_loss:.4f} acc {acc:.3f}")


if __name__ == "__main__":
    main()
