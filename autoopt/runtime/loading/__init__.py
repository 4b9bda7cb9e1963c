"""Batches and loading: tensors in a batch of any nesting, and the loader that brings them to the
device."""
