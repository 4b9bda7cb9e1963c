"""The repeated block stacks of a model: transformer layers, ResNet stages, any run of same-kind
blocks in an `nn.ModuleList` or `nn.Sequential`.

They are the units that trade memory for time: checkpointing recomputes one block at a time,
FSDP shards one block at a time. A stack is a ModuleList or Sequential of at least `MIN_BLOCKS`
(2) children of the same kind, each a composite module (it has child modules of its own):

* 2, not more: a ResNet-18 stage holds 2 blocks and a small GPT may hold 2 layers; whether
  checkpointing pays is decided from measured bytes under a budget, not from a count.
* Composite: a leaf layer (`Linear`, `Conv2d`) saves only its input for backward, and a
  checkpoint keeps that input anyway, so checkpointing it alone saves nothing (a ModuleList of
  per-head Linears is not a stack).
* Same kind: the same class; for plain containers (a Sequential of Sequentials) the same class
  recursively, child by child, so `Sequential(Linear, ReLU)` blocks repeat but a Sequential
  holding a stem and a head does not.

Sharding asks with `leaves=True`: there a run of same-class leaf layers (a Sequential of Linears)
is a stack too, since each layer sharded apart is a smaller all-gather than all of them at once.

Only the outermost stacks are returned: a stack nested inside a block is recomputed with that
block, and checkpointing or sharding both would do the work twice.
"""

from __future__ import annotations

from collections.abc import Hashable

from torch import nn

MIN_BLOCKS = 2
_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def find_block_stacks(
    model: nn.Module, leaves: bool = False
) -> list[tuple[str, nn.Module, list[nn.Module]]]:
    """The outermost block stacks of `model`, in module order: (qualified name of the container,
    the container, its blocks). The name is "" when the model itself is the stack. `leaves`:
    blocks may be leaf layers (see the module docstring)."""
    found: list[tuple[str, nn.Module, list[nn.Module]]] = []

    def visit(prefix: str, module: nn.Module) -> None:
        if is_block_stack(module, leaves):
            found.append((prefix, module, list(module.children())))
            return
        for name, child in module.named_children():
            visit(f"{prefix}.{name}" if prefix else name, child)

    visit("", model)
    return found


def is_block_stack(module: nn.Module, leaves: bool = False) -> bool:
    """Whether `module` is a ModuleList or Sequential of >= MIN_BLOCKS blocks of one kind, each
    composite unless `leaves`."""
    if not isinstance(module, nn.Sequential | nn.ModuleList):
        return False
    blocks = list(module.children())
    if len(blocks) < MIN_BLOCKS:
        return False
    if not leaves and any(next(b.children(), None) is None for b in blocks):
        return False
    first = _kind(blocks[0])
    return all(_kind(block) == first for block in blocks[1:])


def _kind(module: nn.Module) -> Hashable:
    """A user class stands for itself; a plain container for the kinds of its children."""
    if type(module) in _CONTAINERS:
        return (type(module), tuple(_kind(child) for child in module.children()))
    return type(module)
