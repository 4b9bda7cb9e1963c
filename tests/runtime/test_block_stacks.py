"""Discovery of the repeated block stacks that checkpointing and FSDP work on."""

from __future__ import annotations

from torch import nn

from autoopt.runtime.checkpointing.block_stacks import find_block_stacks
from tests.runtime.checkpoint_models import GPT, Block, ResNet


def _names(model: nn.Module) -> list[str]:
    return [name for name, _container, _blocks in find_block_stacks(model)]


def test_gpt_layers_in_a_module_list_are_one_stack() -> None:
    model = GPT(layers=3)
    [(name, container, blocks)] = find_block_stacks(model)
    assert name == "blocks" and container is model.blocks
    assert blocks == list(model.blocks) and all(isinstance(b, Block) for b in blocks)


def test_resnet_stages_in_sequentials_are_stacks() -> None:
    assert _names(ResNet(blocks=2)) == ["stage1", "stage2"]


def test_only_the_outermost_stack_is_returned() -> None:
    # Blocks that each hold a stack of their own: the inner stacks are recomputed with their block.
    outer = nn.ModuleList(GPT(layers=2) for _ in range(3))
    assert _names(outer) == [""]
    # A stack nested in a container that is not a stack is found inside it.
    holder = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), GPT(layers=2)))
    assert _names(holder) == ["1.1.blocks"]


def test_sequentials_repeat_when_their_layers_do() -> None:
    same = nn.Sequential(*(nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(3)))
    assert _names(same) == [""]
    different = nn.Sequential(
        nn.Sequential(nn.Linear(4, 4), nn.ReLU()), nn.Sequential(nn.Linear(4, 4), nn.GELU())
    )
    assert _names(different) == []


def test_mixed_classes_leaf_layers_and_single_blocks_are_not_stacks() -> None:
    mixed = nn.ModuleList([Block(8, 2, 0.0), Block(8, 2, 0.0), ResNet()])
    assert _names(mixed) == ["2.stage1", "2.stage2"]  # not a stack itself; its member holds two
    leaves = nn.ModuleList(nn.Linear(4, 4) for _ in range(6))  # leaves: checkpointing saves nothing
    assert _names(leaves) == []
    assert _names(nn.ModuleList([Block(8, 2, 0.0)])) == []
    assert _names(nn.Sequential(*(nn.Linear(4, 4) for _ in range(12)))) == []


def test_leaf_layers_are_a_stack_when_sharding_asks() -> None:
    leaves = nn.Sequential(*(nn.Linear(4, 4) for _ in range(3)))
    [(name, container, blocks)] = find_block_stacks(leaves, leaves=True)
    assert (name, container, blocks) == ("", leaves, list(leaves))
    assert find_block_stacks(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), leaves=True) == []
