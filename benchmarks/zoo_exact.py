"""Zoo exactness: does `optimize()` train as the user's own eager loop does, same seed, random
numbers included, on its first run (empty caches) and on the run after (warm caches)?

    python -m benchmarks.zoo_exact                      # every model, amp=False and deterministic=True
    python -m benchmarks.zoo_exact --models gpt2 cvae --configs amp=False
    python -m benchmarks.zoo_exact --configs compile=True   # compiled from the first step
    python -m benchmarks.zoo_exact --configs amp=bf16       # against the user's autocast loop

Each model trains STEPS steps of AdamW in a child process, twice in that process: as plain eager
(the reference: the loop a user writes without autoopt) and through `optimize(**config)`, from the
same weights, batches and torch seed (Dropout, drop-path and `randn_like` draw from it). The figure
is the largest relative difference of a parameter tensor, ||ours - eager|| / ||eager||, after the
last step. Each (model, config) gets fresh cache folders (`AUTOOPT_COMPILE_CACHE`, and with it
torch's local compile caches, and `AUTOOPT_CACHE_DIR`): the first child runs with them empty, the
second with what the first left (the compile cache's record of the measured decision and the
compiled artifacts). The models are `transformers` models in small configs with their dropout and
drop-path on (no torchvision or timm: their CPU wheels do not load beside this torch), the repo's
CNN workload and a conditional VAE (reparameterised with `randn_like`). Results: a Markdown table
on stdout.

bf16 configs (`amp=bf16`) have a second reference, the user's own loop under
`torch.autocast("cpu", dtype=torch.bfloat16)` (bf16 needs no GradScaler): the child reports
autocast's own distance from eager fp32, optimize()'s distance from eager fp32 and from the
autocast loop, and the table says whether optimize() is within FACTOR x autocast's own distance
(bf16 rounding, ~1e-2 relative, moves with every kernel choice; a different dropout mask or
autocast op list moves it further).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

STEPS = 12  # the measured choices and the optimizer-step timing are decided within 10 steps
LR = 1e-3
SEED = 0
CONFIGS: dict[str, dict[str, Any]] = {
    "amp=False": {"amp": False},
    "deterministic=True": {"deterministic": True},
    "compile=True": {"compile": True, "amp": False},
    "compile=False": {"compile": False, "amp": False},
    "amp=bf16": {"amp": "bf16"},
    # bf16 with no timed kernel choice (no compile, no fused step): the autocast loop exactly
    "amp=bf16,deterministic=True": {"amp": "bf16", "deterministic": True},
}
# Configs whose reference is the user's own loop under `torch.autocast("cpu", bfloat16)` (bf16
# needs no GradScaler); their child also reports autocast's own distance from eager fp32.
AUTOCAST_REFERENCE = {"amp=bf16": torch.bfloat16, "amp=bf16,deterministic=True": torch.bfloat16}
# "within torch.autocast's own difference": optimize()'s distance from eager fp32 is at most
# FACTOR times autocast's (bf16 rounding noise, ~1e-2 relative, differs with every kernel choice).
FACTOR = 2.0
Batch = dict[str, torch.Tensor]


class CVAE(nn.Module):
    """A conditional VAE on 3x8x8 images (the textbook one): reparameterised with `randn_like`."""

    def __init__(self, classes: int = 10, latent: int = 8) -> None:
        super().__init__()
        self.classes = classes
        self.encoder = nn.Sequential(nn.Linear(192 + classes, 128), nn.ReLU())
        self.mu, self.logvar = nn.Linear(128, latent), nn.Linear(128, latent)
        self.decoder = nn.Sequential(
            nn.Linear(latent + classes, 128), nn.ReLU(), nn.Linear(128, 192), nn.Sigmoid()
        )

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
        x = pixel_values.flatten(1).sigmoid()
        c = nn.functional.one_hot(labels, self.classes).float()
        h = self.encoder(torch.cat([x, c], 1))
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        recon = self.decoder(torch.cat([z, c], 1))
        bce = nn.functional.binary_cross_entropy(recon, x, reduction="sum")
        kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        return {"loss": (bce + kld) / len(x)}


class _Workload(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from benchmarks.workloads import SmallCNN

        self.net = SmallCNN()

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
        return {"loss": nn.functional.cross_entropy(self.net(pixel_values), labels)}


def _tokens(length: int = 32) -> Callable[[torch.Generator], Batch]:
    def make(g: torch.Generator) -> Batch:
        ids = torch.randint(0, 1000, (8, length), generator=g)
        return {"input_ids": ids, "labels": ids.clone()}

    return make


def _classify(g: torch.Generator) -> Batch:
    ids = torch.randint(0, 1000, (8, 32), generator=g)
    return {"input_ids": ids, "labels": torch.randint(0, 2, (8,), generator=g)}


def _seq2seq(g: torch.Generator) -> Batch:
    return {
        "input_ids": torch.randint(0, 1000, (8, 32), generator=g),
        "labels": torch.randint(0, 1000, (8, 16), generator=g),
    }


def _images(size: int, segment: bool = False, side: int = 8) -> Callable[[torch.Generator], Batch]:
    def make(g: torch.Generator) -> Batch:
        x = torch.randn(8, 3, size, size, generator=g)
        shape = (8, side, side) if segment else (8,)
        return {"pixel_values": x, "labels": torch.randint(0, 10, shape, generator=g)}

    return make


def _gpt2(checkpointing: bool = False) -> nn.Module:
    import transformers as tf

    model = tf.GPT2LMHeadModel(
        tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=64)
    )
    if checkpointing:
        model.gradient_checkpointing_enable()
    return model


def zoo() -> dict[str, tuple[Callable[[], nn.Module], Callable[[torch.Generator], Batch]]]:
    """name -> (build, batch): small configs, dropout and drop-path on."""
    import transformers as tf

    text = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    text |= {"intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 64}
    drop = {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}
    vision = {"hidden_sizes": [16, 32], "depths": [1, 1], "num_labels": 10, "num_stages": 2}
    vit = {**text, **drop, "image_size": 32, "patch_size": 4, "num_labels": 10}
    del vit["vocab_size"], vit["max_position_embeddings"]
    return {
        "gpt2": (_gpt2, _tokens()),
        "gpt2 checkpointed": (lambda: _gpt2(checkpointing=True), _tokens()),
        "bert": (lambda: tf.BertForSequenceClassification(tf.BertConfig(**text)), _classify),
        "roberta": (
            lambda: tf.RobertaForSequenceClassification(
                tf.RobertaConfig(**{**text, "max_position_embeddings": 66}, pad_token_id=1)
            ),
            _classify,
        ),
        "distilbert": (
            lambda: tf.DistilBertForSequenceClassification(
                tf.DistilBertConfig(
                    vocab_size=1000,
                    dim=64,
                    n_layers=2,
                    n_heads=4,
                    hidden_dim=128,
                    max_position_embeddings=64,
                )
            ),
            _classify,
        ),
        "llama": (
            lambda: tf.LlamaForCausalLM(
                tf.LlamaConfig(**text, num_key_value_heads=2, attention_dropout=0.1)
            ),
            _tokens(),
        ),
        "t5": (
            lambda: tf.T5ForConditionalGeneration(
                tf.T5Config(
                    vocab_size=1000,
                    d_model=64,
                    d_ff=128,
                    d_kv=16,
                    num_layers=2,
                    num_heads=4,
                    decoder_start_token_id=0,
                    pad_token_id=0,
                )
            ),
            _seq2seq,
        ),
        "bart": (
            lambda: tf.BartForConditionalGeneration(
                tf.BartConfig(
                    vocab_size=1000,
                    d_model=64,
                    encoder_layers=2,
                    decoder_layers=2,
                    encoder_attention_heads=4,
                    decoder_attention_heads=4,
                    encoder_ffn_dim=128,
                    decoder_ffn_dim=128,
                    max_position_embeddings=64,
                    dropout=0.1,
                )
            ),
            _seq2seq,
        ),
        "vit": (lambda: tf.ViTForImageClassification(tf.ViTConfig(**vit)), _images(32)),
        "swin": (
            lambda: tf.SwinForImageClassification(
                tf.SwinConfig(
                    image_size=32,
                    patch_size=4,
                    embed_dim=16,
                    depths=[1, 1],
                    num_heads=[2, 2],
                    window_size=4,
                    num_labels=10,
                    drop_path_rate=0.1,
                    hidden_dropout_prob=0.1,
                )
            ),
            _images(32),
        ),
        "resnet": (
            lambda: tf.ResNetForImageClassification(tf.ResNetConfig(embedding_size=16, **vision)),
            _images(64),
        ),
        "convnext": (
            lambda: tf.ConvNextForImageClassification(
                tf.ConvNextConfig(**vision, drop_path_rate=0.2)
            ),
            _images(64),
        ),
        "mobilenet_v2": (
            lambda: tf.MobileNetV2ForImageClassification(
                tf.MobileNetV2Config(image_size=64, depth_multiplier=0.35, num_labels=10)
            ),
            _images(64),
        ),
        "efficientnet": (
            lambda: tf.EfficientNetForImageClassification(
                tf.EfficientNetConfig(
                    image_size=64,
                    width_coefficient=0.25,
                    depth_coefficient=0.25,
                    hidden_dim=320,
                    num_labels=10,
                    drop_connect_rate=0.2,
                    dropout_rate=0.2,
                )
            ),
            _images(64),
        ),
        "segformer": (
            lambda: tf.SegformerForSemanticSegmentation(
                tf.SegformerConfig(
                    num_encoder_blocks=2,
                    depths=[1, 1],
                    sr_ratios=[2, 1],
                    hidden_sizes=[16, 32],
                    patch_sizes=[7, 3],
                    strides=[4, 2],
                    num_attention_heads=[1, 2],
                    decoder_hidden_size=32,
                    num_labels=10,
                    drop_path_rate=0.1,
                    hidden_dropout_prob=0.1,
                    classifier_dropout_prob=0.1,
                )
            ),
            _images(32, segment=True, side=32),
        ),
        "workload_cnn": (_Workload, _images(32)),
        "cvae": (CVAE, _images(8)),
    }


def _train(
    name: str, options: dict[str, Any] | None, autocast: torch.dtype | None = None
) -> list[torch.Tensor]:
    """The parameters after STEPS steps of the user's loop (optimize()d unless None; under the
    user's own `torch.autocast("cpu", autocast)` when given)."""
    build, batch = zoo()[name]
    g = torch.Generator().manual_seed(SEED + 1)
    data = [batch(g) for _ in range(4)]
    torch.manual_seed(SEED)
    model = build()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    if options is not None:
        import autoopt

        model, opt = autoopt.optimize(model, optimizer=opt, verbose=False, **options)
    torch.manual_seed(SEED + 2)  # what dropout, drop-path and randn_like draw from
    for step in range(STEPS):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            out = model(**data[step % len(data)])
        loss = out["loss"] if isinstance(out, dict) else out.loss
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _distance(ours: list[torch.Tensor], reference: list[torch.Tensor]) -> dict[str, float]:
    """The largest relative difference of a parameter tensor, and of all as one vector."""
    worst = max(
        float((a - b).norm() / b.norm().clamp_min(1e-12))
        for a, b in zip(ours, reference, strict=True)
    )
    flat, ref = (torch.cat([p.flatten().double() for p in ps]) for ps in (ours, reference))
    return {"max_rel": worst, "all_rel": float((flat - ref).norm() / ref.norm())}


def child(name: str, config: str) -> dict[str, Any]:
    """One run: eager, then optimize(); the largest relative parameter difference. For a config
    with an autocast reference, also the user's autocast loop: its distance from eager
    ("autocast"), optimize()'s from it ("vs_autocast"); "max_rel"/"all_rel" stay optimize()'s
    distance from eager fp32."""
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = _train(name, None)
        ours = _train(name, CONFIGS[config])
        dtype = AUTOCAST_REFERENCE.get(config)
        if dtype is None:
            return _distance(ours, eager)
        autocast = _train(name, None, autocast=dtype)
    return {
        **_distance(ours, eager),
        "autocast": _distance(autocast, eager),
        "vs_autocast": _distance(ours, autocast),
    }


def _decision(cache: Path) -> str:
    """What the compile cache recorded about compile (the measured outcome), if anything."""
    records = list((cache / "compile").glob("*.outcome.json"))
    if not records:
        return "-"
    return "; ".join(json.loads(r.read_text())["winner"] for r in records)


def run(name: str, config: str) -> dict[str, Any]:
    """The first and the second run of one (model, config), each in its own process."""
    with tempfile.TemporaryDirectory(prefix="zoo_exact_") as folder:
        cache = Path(folder)
        env = {
            **os.environ,
            "AUTOOPT_COMPILE_CACHE": str(cache / "compile"),
            "AUTOOPT_CACHE_DIR": str(cache / "tune"),
            "OMP_NUM_THREADS": "1",
        }
        env.pop("TORCHINDUCTOR_CACHE_DIR", None)  # autoopt puts torch's inside its own
        runs = []
        for _ in range(2):
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.zoo_exact", "--child", name, config],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                runs.append({"error": done.stderr.strip().splitlines()[-1:]})
            else:
                runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        return {"model": name, "config": config, "runs": runs, "compile": _decision(cache)}


def _cell(run: dict[str, Any], key: str | None = None) -> str:
    if "max_rel" not in run:
        return f"error: {run['error']}"
    d = run if key is None else run[key]
    return f"{d['max_rel']:.1e} ({d['all_rel']:.1e})"


def within(run: dict[str, Any]) -> bool:
    """optimize()'s distance from eager fp32 is within FACTOR x autocast's own, for the largest
    tensor and for all parameters as one vector."""
    return "max_rel" in run and all(
        run[k] <= FACTOR * run["autocast"][k] for k in ("max_rel", "all_rel")
    )


def table(results: list[dict[str, Any]]) -> str:
    """Markdown: one row per (model, config); autocast configs get their own columns."""
    if any(r["config"] in AUTOCAST_REFERENCE for r in results):
        return _autocast_table(results)
    lines = [
        "| model | config | first run (empty caches) | second run (warm) | compile recorded |",
        "|---|---|---:|---:|---|",
    ]
    for r in results:
        cells = [_cell(run) for run in r["runs"]]
        lines.append(f"| {r['model']} | {r['config']} | {cells[0]} | {cells[1]} | {r['compile']} |")
    return "\n".join(lines)


def _autocast_table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| model | config | autocast vs eager | first: optimize vs eager | first: vs autocast "
        f"| second: optimize vs eager | second: vs autocast | within {FACTOR:g}x (1st, 2nd) "
        "| compile recorded |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        first, second = r["runs"]
        ok = ", ".join(
            ("yes" if within(run) else "**no**") if "autocast" in run else "-"
            for run in (first, second)
        )
        reference = _cell(first, "autocast") if "autocast" in first else "-"
        vs = [_cell(run, "vs_autocast") if "autocast" in run else "-" for run in (first, second)]
        lines.append(
            f"| {r['model']} | {r['config']} | {reference} | {_cell(first)} | {vs[0]} "
            f"| {_cell(second)} | {vs[1]} | {ok} | {r['compile']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", help="a subset of the zoo")
    parser.add_argument(
        "--configs", nargs="*", default=["amp=False", "deterministic=True"], choices=list(CONFIGS)
    )
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    names = args.models or list(zoo())
    results = []
    for name in names:
        for config in args.configs:
            results.append(run(name, config))
            print(table(results[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(
        f"relative parameter difference from eager after {STEPS} AdamW steps: the largest of "
        "any parameter tensor (in parentheses: all parameters as one vector)"
    )
    print(table(results))


if __name__ == "__main__":
    main()
