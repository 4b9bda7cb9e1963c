"""Gradient accumulation's mechanism: the shared counter, the loader that splits batches into
micro-batches, and each micro-batch's share of the loss."""
