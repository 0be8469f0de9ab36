"""Attention: backend interfaces, the selector and the reference backend."""
