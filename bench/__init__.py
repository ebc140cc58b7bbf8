"""Benchmarks behind ``topicwire bench ...``: JSON out, baseline measured in the same run."""
