"""Activation checkpointing: the repeated block stacks, how one block runs, and the plan under a
memory budget."""
