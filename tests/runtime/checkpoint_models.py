"""Tiny block-stack models for the checkpoint and block-stack tests: a GPT whose layers live in an
`nn.ModuleList` (the parent calls each block, with an attention mask) and a ResNet-like model
whose stages are `nn.Sequential`s of residual blocks with BatchNorm."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and an MLP, both residual."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(dropout)
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token + position embeddings, `layers` blocks in an nn.ModuleList, a tied head."""

    def __init__(
        self,
        vocab: int = 32,
        width: int = 16,
        layers: int = 4,
        heads: int = 2,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(64, width)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.embed(idx) + self.pos(torch.arange(t, device=idx.device))
        mask = torch.ones(t, t, dtype=torch.bool, device=idx.device).tril()
        for block in self.blocks:
            x = block(x, mask=mask)
        return self.head(self.ln(x))


class ResBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class ResNet(nn.Module):
    """A stem, two stages of residual blocks (nn.Sequential), a pooled head."""

    def __init__(self, channels: int = 4, blocks: int = 3) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.stage1 = nn.Sequential(*(ResBlock(channels) for _ in range(blocks)))
        self.stage2 = nn.Sequential(*(ResBlock(channels) for _ in range(blocks)))
        self.head = nn.Linear(channels, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stage2(self.stage1(self.stem(x)))
        return self.head(x.mean((2, 3)))
