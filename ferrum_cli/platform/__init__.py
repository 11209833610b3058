"""The machine: devices and dtypes, CPU features, and import-time care for start-up."""
