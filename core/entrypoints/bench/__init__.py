"""`core bench`: offline throughput and latency through the LLM API, and an HTTP load
generator for any OpenAI-compatible server.

Modules: `datasets` (prompts), `results` (report types), `throughput`, `latency`,
`serve_client` and `cli`. Nothing is imported here, so `core --help` stays fast.
"""
