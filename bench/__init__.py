"""Benchmarks behind ``topicwire bench ...``: each prints JSON and measures its baseline in the same run."""
