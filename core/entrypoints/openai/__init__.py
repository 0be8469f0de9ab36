"""The OpenAI-compatible HTTP server: request/response models, errors, parameter mapping."""
