"""Distributed training's mechanisms: FSDP2 sharding and full state dicts."""
