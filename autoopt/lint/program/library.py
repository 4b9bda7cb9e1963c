"""What the lint knows about libraries, as data: which calls build models, which classes are
models, which callables are not (losses, scalers, writers), which optimizers exist outside
`torch.optim`. Rules and the program model read these tables; none of them is a rule of its own.
"""

from __future__ import annotations

# Calls whose result is a model, by the callee's last name: model zoos and the factories
# training code calls its model builder by (`timm.create_model`, detectron2's `build_model`,
# `AutoModel.from_pretrained`, a project's `get_model(cfg)`).
MODEL_FACTORIES = frozenset(
    {
        "create_model", "build_model", "get_model", "generate_model", "load_model", "make_model",
        "build_detection_model", "build_segmentor", "build_detector", "build_backbone",
        "build_network", "get_network", "create_network", "define_G", "define_D",
        "from_pretrained", "from_config", "resnet18", "resnet34", "resnet50", "resnet101",
        "resnet152", "vgg16", "vgg19", "densenet121", "mobilenet_v2", "mobilenet_v3_large",
        "efficientnet_b0", "vit_b_16", "wide_resnet50_2", "resnext50_32x4d",
    }
)  # fmt: skip

# Wrappers whose result is the model they are given (`nn.DataParallel(model)`, `DDP(model)`).
MODEL_WRAPPERS = frozenset(
    {"DataParallel", "DistributedDataParallel", "DDP", "compile", "convert_sync_batchnorm",
     "FullyShardedDataParallel", "FSDP"}
)  # fmt: skip

# Base classes that make a class a model (`class Net(nn.Module)`), by their last name.
MODEL_BASES = frozenset(
    {"Module", "Sequential", "ModuleList", "PreTrainedModel", "LightningModule",
     "BertPreTrainedModel", "ModelMixin"}
)  # fmt: skip

# Callables a training function calls that are not the model being trained, by the last part
# of the class or factory that builds them (a loss, a loss scaler, a logger, a mixup).
NOT_MODEL_SUFFIXES = (
    "Loss", "loss", "Criterion", "criterion", "Scaler", "scaler", "Writer", "Logger", "Meter",
    "Mixup", "Metric", "Tokenizer", "Sampler", "Scheduler", "Optimizer", "Accelerator",
)  # fmt: skip

# Optimizer classes outside torch.optim that take parameters first (transformers' AdamW,
# apex's fused optimizers, timm's factories, bitsandbytes): by the last name.
OPTIMIZER_CLASSES = frozenset(
    {"SGD", "Adam", "AdamW", "Adamax", "Adagrad", "Adadelta", "RMSprop", "Rprop", "NAdam",
     "RAdam", "ASGD", "LBFGS", "SparseAdam", "Adafactor", "FusedAdam", "FusedLAMB", "FusedSGD",
     "BertAdam", "Lamb", "LAMB", "AdamW8bit", "Adam8bit", "Lion", "Adan", "LARS"}
)  # fmt: skip
OPTIMIZER_FACTORIES = frozenset(
    {"create_optimizer", "create_optimizer_v2", "build_optimizer", "make_optimizer",
     "get_optimizer", "configure_optimizers", "smart_optimizer", "load_optimizer"}
)  # fmt: skip


def not_a_model(name: str) -> bool:
    """The last part of a class or factory name says it builds no model (`CrossEntropyLoss`,
    `NativeScaler`, `SummaryWriter`)."""
    return name.endswith(NOT_MODEL_SUFFIXES)
