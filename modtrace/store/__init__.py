"""Persistence: engines, schema, version checks, batched writes and reads."""
