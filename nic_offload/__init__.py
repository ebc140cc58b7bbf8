"""Offload pipeline: match-action tables (topic key, content ACLs) and their executors."""
