"""The engine: EngineCore step loop, clients, LLMEngine, AsyncLLM and output processing."""
