"""Flower server strategies for one-shot merging (plug into any ServerApp)."""
