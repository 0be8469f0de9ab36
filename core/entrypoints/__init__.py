"""User entry points: the `core` CLI, the offline LLM API and the OpenAI server."""
