"""CosyVoice: finding its runtime, the backend workers build, and the batched engines."""
