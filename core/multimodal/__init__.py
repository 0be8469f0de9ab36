"""Multimodal input: images from the request to the model's encoder.

The frontend decodes each item (media.py), runs the model's processor over the prompt
and the items (processing.py: placeholders expanded, tensors made) and hashes each item's
content (hashing.py); the engine core schedules encoder work and caches its outputs
(encoder_cache.py), and the worker runs the encoder and merges its embeddings into the
prompt's (core.worker.mm_inputs). The data crossing processes is in inputs.py.
"""
