"""The paged KV cache: spec tree and registry, layouts, block hashing and management."""
