"""Naive CNN training script, written the way many tutorials do: it works, but leaves speed on
the table. `autoopt lint` reports what is missing; `autoopt rewrite` fixes it."""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
torch.backends.cudnn.benchmark = True


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        return self.fc(torch.flatten(x, 1))


def make_data(n, seed):
    x = torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    teacher = torch.randn(3, 10, generator=torch.Generator().manual_seed(42))
    y = (x.mean(dim=(2, 3)) @ teacher).argmax(1)
    return TensorDataset(x, y)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="batches per epoch")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_loader = DataLoader(make_data(64 * args.steps, 0), batch_size=64, shuffle=True, pin_memory=device.type == "cuda")
    val_loader = DataLoader(make_data(256, 1), batch_size=128, pin_memory=device.type == "cuda")

    model = Net().to(device)
    model = model.to(memory_format=torch.channels_last)
    if device.type == "cuda":
        model.compile()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, fused=True)

    amp_dtype = torch.bfloat16 if device.type == "cpu" or torch.cuda.is_bf16_supported() else torch.float16
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    for epoch in range(args.epochs):
        model.train()
        running_loss = 0.0
        for images, labels in train_loader:
            images = images.to(device, memory_format=torch.channels_last, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            optimizer.zero_grad()
            with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=device.type == "cuda"):
                outputs = model(images)
                loss = criterion(outputs, labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            running_loss += loss.detach()
        print(f"epoch {epoch} loss {running_loss / len(train_loader):.4f}")

        model.eval()
        correct = 0
        with torch.no_grad():
            for images, labels in val_loader:
                images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
                outputs = model(images)
                correct += (outputs.argmax(1) == labels).sum().item()
        print(f"epoch {epoch} val_acc {correct / len(val_loader.dataset):.3f}")


if __name__ == "__main__":
    main()
