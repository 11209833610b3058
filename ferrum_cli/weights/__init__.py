"""Weights: where a model is looked up (locations.py), how each format is read, and the cache."""
