"""A batch: inputs expanded into jobs, run through one executor, outputs written atomically."""
