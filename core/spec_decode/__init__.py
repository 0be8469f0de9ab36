"""Speculative decoding: the Proposer and RejectionSampler seams, the reference rejection
sampler, the acceptance gate, and choosing the configured method."""
