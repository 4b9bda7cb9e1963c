"""Fixes too large to live beside their rule: one codemod per module."""
