"""Naive GAN on a 2-D toy distribution: two optimizers, two backward calls per iteration."""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
torch.set_float32_matmul_precision("high")


def make_real(n):
    g = torch.Generator().manual_seed(0)
    angle = torch.rand(n, generator=g) * 6.283
    return TensorDataset(torch.stack([angle.cos(), angle.sin()], 1) * 2.0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(make_real(64 * args.steps), batch_size=64, shuffle=True, pin_memory=device.type == "cuda")
    generator = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 2)).to(device)
    if device.type == "cuda":
        generator.compile()
    discriminator = nn.Sequential(nn.Linear(2, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1)).to(device)
    if device.type == "cuda":
        discriminator.compile()
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3, betas=(0.5, 0.999), fused=True)
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3, betas=(0.5, 0.999), fused=True)
    bce = nn.BCEWithLogitsLoss()

    amp_dtype = torch.bfloat16 if device.type == "cpu" or torch.cuda.is_bf16_supported() else torch.float16
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    for epoch in range(args.epochs):
        d_total = 0.0
        for (real,) in loader:
            real = real.to(device, non_blocking=True)
            with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=device.type == "cuda"):
                noise = torch.randn(real.shape[0], 8, device=device)
                fake = generator(noise)

                opt_d.zero_grad()
                d_real = discriminator(real)
                d_fake = discriminator(fake.detach())
                d_loss = bce(d_real, torch.ones_like(d_real)) + bce(d_fake, torch.zeros_like(d_fake))
            scaler.scale(d_loss).backward()
            scaler.step(opt_d)

            opt_g.zero_grad()
            with torch.autocast(device_type=device.type, dtype=amp_dtype, enabled=device.type == "cuda"):
                g_score = discriminator(fake)
                g_loss = bce(g_score, torch.ones_like(g_score))
            scaler.scale(g_loss).backward()
            scaler.step(opt_g)
            scaler.update()
            d_total += d_loss.item()
        print(f"epoch {epoch} loss {d_total / len(loader):.4f}")


if __name__ == "__main__":
    main()
