"""Data path: the native protocol codec, topic algebra and the per-message machinery below channels.

Everything else in topicwire stands on this package; it imports nothing from the others.
"""
